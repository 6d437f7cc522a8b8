//! Slurm host lists (`gpu[01-04,07],cpu1`): expanded to host names in order, the order of
//! `SLURM_NODEID`. Written by hand: the grammar we need is small (a prefix, one bracketed list
//! of numbers and ranges with their zero padding, a suffix), and the input comes from the
//! environment, so it is bounded here ([`MAX_HOSTS`], [`MAX_LEN`]).

use thiserror::Error;

/// At most this many hosts in one list.
pub const MAX_HOSTS: usize = 100_000;
/// At most this many bytes in one list.
pub const MAX_LEN: usize = 1 << 20;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum HostListError {
    #[error("host list longer than {MAX_LEN} bytes")]
    TooLong,
    #[error("host list of more than {MAX_HOSTS} hosts")]
    TooMany,
    #[error("malformed host list near `{0}`")]
    Malformed(String),
}

/// The hosts of `list`, in order.
pub fn expand(list: &str) -> Result<Vec<String>, HostListError> {
    if list.len() > MAX_LEN {
        return Err(HostListError::TooLong);
    }
    let mut out = Vec::new();
    for item in split_top(list.trim())? {
        if item.is_empty() {
            continue;
        }
        match item.find('[') {
            None => push(&mut out, item.to_string())?,
            Some(open) => {
                let close = item[open..].find(']').map(|c| open + c).ok_or_else(|| bad(item))?;
                let (prefix, inner, suffix) = (&item[..open], &item[open + 1..close], &item[close + 1..]);
                if suffix.contains(['[', ']']) {
                    return Err(bad(item));
                }
                for part in inner.split(',') {
                    let (lo, hi) = part.split_once('-').unwrap_or((part, part));
                    let width = lo.len();
                    let (a, b) = (number(lo, item)?, number(hi, item)?);
                    if a > b || b - a >= MAX_HOSTS as u64 {
                        return Err(bad(item));
                    }
                    for k in a..=b {
                        push(&mut out, format!("{prefix}{k:0width$}{suffix}"))?;
                    }
                }
            }
        }
    }
    Ok(out)
}

fn bad(near: &str) -> HostListError {
    HostListError::Malformed(near.chars().take(40).collect())
}

fn number(s: &str, item: &str) -> Result<u64, HostListError> {
    if s.is_empty() || s.len() > 18 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad(item));
    }
    s.parse().map_err(|_| bad(item))
}

fn push(out: &mut Vec<String>, host: String) -> Result<(), HostListError> {
    if out.len() >= MAX_HOSTS {
        return Err(HostListError::TooMany);
    }
    out.push(host);
    Ok(())
}

/// The comma-separated items of `list`, commas inside brackets kept.
fn split_top(list: &str) -> Result<Vec<&str>, HostListError> {
    let (mut items, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(bad(&list[start..]));
        }
    }
    if depth != 0 {
        return Err(bad(&list[start..]));
    }
    items.push(&list[start..]);
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_lists_expand_in_order_with_their_padding() {
        assert_eq!(expand("gpu[07-10],cpu1").unwrap(), ["gpu07", "gpu08", "gpu09", "gpu10", "cpu1"]);
        assert_eq!(expand("n[1,3-4]x,m2").unwrap(), ["n1x", "n3x", "n4x", "m2"]);
        assert_eq!(expand("a[098-101]").unwrap(), ["a098", "a099", "a100", "a101"]);
        assert_eq!(expand(" host ").unwrap(), ["host"]);
        assert!(expand("").unwrap().is_empty());
    }

    #[test]
    fn hostile_lists_are_refused() {
        assert_eq!(expand("n[0-99999999999]"), Err(bad("n[0-99999999999]")));
        assert_eq!(expand("n[0-99999],m[0-1]"), Err(HostListError::TooMany));
        for l in ["n[1-", "n[2-1]", "n[a-b]", "n]1[", "n[[1]]", "n[1]x[2]", "n[-]"] {
            assert!(expand(l).is_err(), "{l}");
        }
        assert_eq!(expand(&"x".repeat(MAX_LEN + 1)), Err(HostListError::TooLong));
    }
}
