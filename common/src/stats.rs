//! Small statistics shared by the diagnosis and the reports.

/// The median of the finite values of `v` (0 when there are none).
pub fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return 0.0;
    }
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_skips_non_finite_values() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0, f64::NAN, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, f64::INFINITY, 2.0, 3.0]), 2.5);
    }
}
