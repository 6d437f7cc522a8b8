//! What gpusanity writes on a Node, and the bounds on what it copies from outside into it.

/// Taint key; its value is the finding code (a valid label value).
pub const TAINT_KEY: &str = "gpusanity.io/faulty";
/// Label key; its value is the finding code, sanitised to a label value.
pub const LABEL_KEY: &str = "gpusanity.io/isolated";
/// Annotation holding the JSON [`crate::Record`] of exactly what gpusanity added.
pub const ANNOTATION_KEY: &str = "gpusanity.io/isolation";
/// The Node condition type of gpusanity's own (True while isolated).
pub const CONDITION_TYPE: &str = "GpusanityFaulty";
/// Reason of the core/v1 Event written when a node is isolated.
pub const EVENT_ISOLATED: &str = "GpusanityIsolated";
/// Reason of the core/v1 Event written when a node is returned to service.
pub const EVENT_RETURNED: &str = "GpusanityReturned";
/// Reason of the core/v1 Event written when the circuit breaker refuses to isolate a node.
pub const EVENT_REFUSED: &str = "GpusanityIsolationRefused";
/// Reason of the condition once the node is returned (status False).
pub const REASON_PASSED: &str = "CheckPassed";
/// Field manager named on every write.
pub const FIELD_MANAGER: &str = "gpusanity";
/// Longest label (and taint) value Kubernetes takes.
pub const MAX_LABEL_VALUE: usize = 63;
/// Longest condition or event message gpusanity writes, in characters.
pub const MAX_MESSAGE: usize = 1024;

/// `s` as a label value: characters outside `[A-Za-z0-9._-]` become `_`, at most 63, starting
/// and ending alphanumeric; `unknown` when nothing is left.
pub fn label_value(s: &str) -> String {
    let mapped: String = s
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' })
        .take(4 * MAX_LABEL_VALUE)
        .collect();
    let trimmed = mapped.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    let mut out: String = trimmed.chars().take(MAX_LABEL_VALUE).collect();
    while out.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        out.pop();
    }
    if out.is_empty() {
        "unknown".into()
    } else {
        out
    }
}

/// A message from outside as one printable line: control characters (newlines included)
/// become spaces, runs of spaces collapse, at most [`MAX_MESSAGE`] characters (`…` marks a cut).
pub fn message(s: &str) -> String {
    let mut out = String::new();
    let mut count = 0usize;
    let mut last_space = true;
    for c in s.chars() {
        let c = if c.is_control() { ' ' } else { c };
        if c == ' ' && last_space {
            continue;
        }
        if count == MAX_MESSAGE - 1 {
            out.push('…');
            return out;
        }
        last_space = c == ' ';
        out.push(c);
        count += 1;
    }
    out.trim_end().to_string()
}

/// A Node name as Kubernetes takes it (a DNS subdomain: lower-case alphanumerics, `-` and
/// `.`, at most 253, starting and ending alphanumeric).
pub fn is_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.".contains(&b))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_label_value(v: &str) -> bool {
        v.len() <= MAX_LABEL_VALUE
            && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            && v.starts_with(|c: char| c.is_ascii_alphanumeric())
            && v.ends_with(|c: char| c.is_ascii_alphanumeric())
    }

    #[test]
    fn label_values_from_hostile_text_are_valid() {
        let long = "x".repeat(10_000);
        for s in ["NCCL_WRONG", "", "\n\"'", "-a-", "é日本", &long, "a b\nc", "_.-x-._", "A\u{0}B"] {
            let v = label_value(s);
            assert!(is_label_value(&v), "{s:?} -> {v:?}");
        }
        assert_eq!(label_value("GEMM_WRONG_RESULT"), "GEMM_WRONG_RESULT");
        assert_eq!(label_value("a\"b\nc"), "a_b_c");
    }

    #[test]
    fn messages_are_one_bounded_line() {
        let m = message(&format!("first\nsecond\r\n\t\"q\" {}", "é".repeat(20_000)));
        assert!(!m.contains(['\n', '\r', '\t']));
        assert!(m.starts_with("first second \"q\" é"));
        assert_eq!(m.chars().count(), MAX_MESSAGE);
        assert!(m.ends_with('…'));
        assert_eq!(message("ok"), "ok");
    }

    #[test]
    fn node_names_are_dns_subdomains() {
        for ok in ["node2", "gpu-a01.cluster", "a"] {
            assert!(is_node_name(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "Node", "a b", "a/b", "a\nb", &"a".repeat(254)] {
            assert!(!is_node_name(bad), "{bad:?}");
        }
    }
}
