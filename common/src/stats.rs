//! Small statistics shared by the diagnosis and the reports, and how a figure is written in a
//! message.

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

/// A measured figure for a message: one decimal from 10 up (690.0, 12.5), three significant
/// digits below (0.314, 0.00812), so the small figures of CPU workers do not print as 0.0.
pub fn figure(x: f64) -> String {
    if !x.is_finite() || x == 0.0 || x.abs() >= 10.0 {
        return format!("{x:.1}");
    }
    let digits = (2 - x.abs().log10().floor() as i32).clamp(1, 9) as usize;
    format!("{x:.digits$}")
}

#[cfg(test)]
mod tests {
    use super::{figure, median};

    #[test]
    fn figures_keep_their_significant_digits() {
        let shown: Vec<String> =
            [690.04, 12.46, 4.56789, 0.3141, 0.008123, 0.0, f64::NAN].into_iter().map(figure).collect();
        assert_eq!(shown, ["690.0", "12.5", "4.57", "0.314", "0.00812", "0.0", "NaN"]);
    }

    #[test]
    fn median_skips_non_finite_values() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0, f64::NAN, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, f64::INFINITY, 2.0, 3.0]), 2.5);
    }
}
