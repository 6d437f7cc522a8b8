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
