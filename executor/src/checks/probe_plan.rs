//! Which pairs a connectivity test probes, and in which rounds.
//!
//! Up to a configurable size every pair is probed (the whole matrix). Beyond it each member is
//! paired with the members at distances 1, 2, 4, 8, ... around a ring: about 2·log2(n)
//! partners each, n·log2(n) pairs in all, and O(log n) rounds. A member that is dead or cut
//! off fails with every partner (at least two), a broken pair with one; the diagnosis compares
//! each member's failures with the partners it was probed with, not with every other member.

use std::collections::BTreeSet;

/// The unordered pairs (a < b) of `n` members to probe: all of them when `n <= full_up_to`.
pub fn pairs(n: usize, full_up_to: usize) -> Vec<(usize, usize)> {
    if n <= full_up_to {
        return (0..n).flat_map(|a| (a + 1..n).map(move |b| (a, b))).collect();
    }
    let mut set = BTreeSet::new();
    let mut d = 1;
    while d < n {
        for a in 0..n {
            let b = (a + d) % n;
            set.insert((a.min(b), a.max(b)));
        }
        d = d.saturating_mul(2);
    }
    set.into_iter().collect()
}

/// The partners of `member` among `pairs`.
pub fn partners_of(pairs: &[(usize, usize)], member: usize) -> Vec<usize> {
    pairs
        .iter()
        .filter_map(|&(a, b)| {
            if a == member {
                Some(b)
            } else if b == member {
                Some(a)
            } else {
                None
            }
        })
        .collect()
}

/// Rounds in which every member takes part in at most one pair: the circle method for the whole
/// matrix of `n` members (n-1 rounds), a greedy colouring otherwise (at most twice the largest
/// partner count, so O(log n) rounds for [`pairs`]).
pub fn rounds(n: usize, pairs: &[(usize, usize)]) -> Vec<Vec<(usize, usize)>> {
    if n >= 2 && pairs.len() == n * (n - 1) / 2 {
        return circle(n);
    }
    /// A round's busy members and its pairs.
    type Round = (BTreeSet<usize>, Vec<(usize, usize)>);
    let mut rounds: Vec<Round> = Vec::new();
    for &(a, b) in pairs {
        match rounds.iter_mut().find(|(busy, _)| !busy.contains(&a) && !busy.contains(&b)) {
            Some((busy, round)) => {
                busy.insert(a);
                busy.insert(b);
                round.push((a, b));
            }
            None => rounds.push((BTreeSet::from([a, b]), vec![(a, b)])),
        }
    }
    rounds.into_iter().map(|(_, r)| r).collect()
}

/// The circle method: every pair of `n` members exactly once, each member in at most one pair
/// per round.
fn circle(n: usize) -> Vec<Vec<(usize, usize)>> {
    let m = n + n % 2; // with a "bye" when n is odd
    (0..m - 1)
        .map(|r| {
            let mut pairs = vec![(m - 1, r)];
            for k in 1..m / 2 {
                pairs.push(((r + k) % (m - 1), (r + m - 1 - k) % (m - 1)));
            }
            pairs.into_iter().filter(|&(a, b)| a < n && b < n).map(|(a, b)| (a.min(b), a.max(b))).collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_rounds(n: usize, pairs: &[(usize, usize)], rs: &[Vec<(usize, usize)>]) {
        let mut seen = BTreeSet::new();
        for round in rs {
            let mut used = BTreeSet::new();
            for &(a, b) in round {
                assert!(a < b && b < n);
                assert!(used.insert(a) && used.insert(b), "member twice in a round: n {n}");
                assert!(seen.insert((a, b)), "pair twice: n {n}");
            }
        }
        assert_eq!(seen, pairs.iter().copied().collect::<BTreeSet<_>>(), "n {n}");
    }

    #[test]
    fn the_whole_matrix_up_to_the_limit_in_n_minus_one_rounds() {
        for n in 1..12 {
            let p = pairs(n, 16);
            assert_eq!(p.len(), n * n.saturating_sub(1) / 2);
            let rs = rounds(n, &p);
            check_rounds(n, &p, &rs);
            assert!(rs.len() <= n.max(1) - 1 + n % 2, "n {n}: {} rounds", rs.len());
        }
    }

    #[test]
    fn beyond_it_n_log_n_pairs_in_log_n_rounds_with_two_partners_at_least() {
        for n in [17, 32, 33, 64, 100, 1000, 4096] {
            let p = pairs(n, 16);
            let log = (n as f64).log2().ceil() as usize;
            assert!(p.len() <= n * log, "n {n}: {} pairs", p.len());
            let rs = rounds(n, &p);
            check_rounds(n, &p, &rs);
            assert!(rs.len() <= 4 * log, "n {n}: {} rounds", rs.len());
            for m in 0..n {
                let k = partners_of(&p, m).len();
                assert!(k >= 2 && k <= 2 * log, "n {n} member {m}: {k} partners");
            }
        }
    }
}
