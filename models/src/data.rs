//! Synthetic learnable tasks and deterministic initial weights.
//!
//! Everything here depends only on seeds, so every rank builds the same initial model and a
//! tensor-parallel shard is cut from the same full matrix a single rank would use.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// A seed for `name` derived from `seed` (FNV-1a of the name).
pub fn seed_of(seed: u64, name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325 ^ seed, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// `n` values uniform in `[-a, a)` from `seed`.
pub fn uniform(n: usize, a: f32, seed: u64) -> Vec<f32> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-a..a)).collect()
}

/// Columns `[c0, c0 + w)` of a row-major `rows x cols` matrix.
pub fn columns(x: &[f32], cols: usize, c0: usize, w: usize) -> Vec<f32> {
    x.chunks(cols).flat_map(|row| row[c0..c0 + w].iter().copied()).collect()
}

/// The next-token task: sequences over an alphabet of the first `min(vocab, 64)` token ids that
/// follow a fixed random permutation of it (`next = perm[token]`) from random first tokens.
/// A healthy model learns it in a few dozen steps at any depth: first that only the alphabet
/// occurs (the loss falls from about ln(vocab) to ln(alphabet)), then the permutation (towards
/// 0).
pub struct TokenTask {
    perm: Vec<u32>,
}

/// Distinct tokens of [`TokenTask`]'s sequences (at most).
pub const ALPHABET: usize = 64;

impl TokenTask {
    pub fn new(vocab: usize, seed: u64) -> TokenTask {
        let mut perm: Vec<u32> = (0..vocab.min(ALPHABET) as u32).collect();
        let mut rng = SmallRng::seed_from_u64(seed);
        for i in (1..perm.len()).rev() {
            perm.swap(i, rng.random_range(0..=i));
        }
        TokenTask { perm }
    }

    /// Inputs and targets, `batch x t` each, as f32 token ids.
    pub fn batch(&self, batch: usize, t: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let (mut x, mut y) = (Vec::with_capacity(batch * t), Vec::with_capacity(batch * t));
        for _ in 0..batch {
            let mut tok = rng.random_range(0..self.perm.len() as u32);
            for _ in 0..t {
                x.push(tok as f32);
                tok = self.perm[tok as usize];
                y.push(tok as f32);
            }
        }
        (x, y)
    }
}

/// The image task: `classes` fixed random templates; an image is its class's template plus
/// noise of the same scale. Channel-major batch `[3, n h w]` and labels.
pub struct ImageTask {
    templates: Vec<Vec<f32>>,
    pub hw: usize,
}

impl ImageTask {
    pub fn new(classes: usize, hw: usize, seed: u64) -> ImageTask {
        let templates = (0..classes).map(|c| uniform(3 * hw * hw, 1.0, seed_of(seed, &format!("class{c}")))).collect();
        ImageTask { templates, hw }
    }

    pub fn batch(&self, n: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let pix = self.hw * self.hw;
        let labels: Vec<usize> = (0..n).map(|_| rng.random_range(0..self.templates.len())).collect();
        let mut x = vec![0f32; 3 * n * pix];
        for c in 0..3 {
            for (b, &l) in labels.iter().enumerate() {
                let dst = &mut x[(c * n + b) * pix..(c * n + b + 1) * pix];
                let src = &self.templates[l][c * pix..(c + 1) * pix];
                for (d, s) in dst.iter_mut().zip(src) {
                    *d = s + rng.random_range(-1.0f32..1.0);
                }
            }
        }
        (x, labels.iter().map(|l| *l as f32).collect())
    }
}

/// A batch's rows grouped by token, for an embedding backward that sums each token's rows in a
/// fixed order (no atomic adds): `rows` lists the row indices (as f32) token by token, each
/// token's in row order, and token `v`'s are `rows[starts[v]..starts[v + 1]]`.
pub struct TokenRows<B> {
    pub rows: B,
    pub starts: B,
}

/// The host side of [`TokenRows`] for token ids `tok` of a vocabulary of `vocab`: (rows,
/// starts), a stable counting sort. A token that is not a whole number below `vocab` is refused.
pub fn group_by_token(tok: &[f32], vocab: usize) -> crate::Result<(Vec<f32>, Vec<f32>)> {
    // f32 holds every index exactly below 2^24.
    if tok.len() >= 1 << 24 || vocab >= 1 << 24 {
        return Err(crate::ModelError::Config(format!("{} tokens of a vocabulary of {vocab}: too many", tok.len())));
    }
    let ids = tok
        .iter()
        .map(|&x| {
            let ok = x >= 0.0 && x.fract() == 0.0 && (x as usize) < vocab;
            ok.then_some(x as usize).ok_or_else(|| crate::ModelError::Config(format!("token {x} outside 0..{vocab}")))
        })
        .collect::<crate::Result<Vec<usize>>>()?;
    let mut starts = vec![0usize; vocab + 1];
    for &v in &ids {
        starts[v + 1] += 1;
    }
    for v in 0..vocab {
        starts[v + 1] += starts[v];
    }
    let mut next = starts.clone();
    let mut rows = vec![0f32; ids.len()];
    for (r, &v) in ids.iter().enumerate() {
        rows[next[v]] = r as f32;
        next[v] += 1;
    }
    Ok((rows, starts.into_iter().map(|s| s as f32).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_group_stably_and_bad_ids_are_refused() {
        let (rows, starts) = group_by_token(&[2.0, 0.0, 2.0, 1.0, 0.0], 4).unwrap();
        assert_eq!(rows, [1.0, 4.0, 3.0, 0.0, 2.0]);
        assert_eq!(starts, [0.0, 2.0, 3.0, 5.0, 5.0]);
        for bad in [4.0, -1.0, 1.5, f32::NAN, f32::INFINITY] {
            assert!(group_by_token(&[0.0, bad], 4).is_err(), "{bad}");
        }
    }
}
