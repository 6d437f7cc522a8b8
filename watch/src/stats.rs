//! Median and median absolute deviation of a small slice, in place.

/// The median of `v` (reordered); None when empty.
pub(crate) fn median(v: &mut [f64]) -> Option<f64> {
    let n = v.len();
    if n == 0 {
        return None;
    }
    let mid = n / 2;
    let (_, m, _) = v.select_nth_unstable_by(mid, f64::total_cmp);
    let hi = *m;
    if n % 2 == 1 {
        return Some(hi);
    }
    let lo = v[..mid].iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some((lo + hi) / 2.0)
}

/// The median of `v` and its median absolute deviation scaled to a normal's sigma (x 1.4826).
pub(crate) fn median_mad(v: &[f64]) -> Option<(f64, f64)> {
    median_mad_mut(&mut v.to_vec())
}

/// [`median_mad`] without a copy: `v` is left holding the absolute deviations, reordered.
pub(crate) fn median_mad_mut(v: &mut [f64]) -> Option<(f64, f64)> {
    let m = median(v)?;
    for x in v.iter_mut() {
        *x = (*x - m).abs();
    }
    Some((m, median(v)? * 1.4826))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_mad_of_odd_and_even_slices() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(2.5));
        let (m, mad) = median_mad(&[1.0, 1.0, 2.0, 2.0, 4.0, 6.0, 9.0]).expect("values");
        assert_eq!(m, 2.0);
        assert!((mad - 1.4826).abs() < 1e-9);
        let mut w = [9.0, 1.0, 2.0, 6.0, 2.0, 1.0, 4.0];
        assert_eq!(median_mad_mut(&mut w), Some((m, mad)));
    }
}
