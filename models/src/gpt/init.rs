//! A GPT's initial weights on the host, in the order of the parameter indices (`lp`): the
//! embeddings, then each block's, then the final norm and the LM head. Every matrix is drawn
//! from its own seed (from the model's seed and the parameter's name), so the blocks are drawn
//! on threads of their own (a 400 M parameter model took seconds on one) and the values do not
//! depend on how many there are. A tensor-parallel rank draws the whole matrix and keeps its
//! columns or rows of it, so that every layout trains the same model.

use crate::data::{columns, seed_of, uniform};

use super::GptConfig;

/// One parameter's name, initial values and whether weight decay applies to it.
pub(super) struct Init {
    pub name: String,
    pub values: Vec<f32>,
    pub decay: bool,
}

fn init(name: String, values: Vec<f32>, decay: bool) -> Init {
    Init { name, values, decay }
}

/// Every parameter of the model `cfg` describes, for this tensor-parallel rank, in order.
pub(super) fn weights(cfg: &GptConfig) -> Vec<Init> {
    let (v, t, c, l) = (cfg.shape.vocab, cfg.shape.ctx, cfg.shape.dim, cfg.shape.layers);
    let std = 0.02 * 3f32.sqrt();
    let full = |name: &str, len: usize, a: f32| uniform(len, a, seed_of(cfg.seed, name));
    std::thread::scope(|s| {
        let wte = s.spawn(|| full("wte", v * c, std));
        let lm = s.spawn(|| full("lm.w", c * v, std));
        let blocks: Vec<_> = (0..l).map(|i| s.spawn(move || block(cfg, i))).collect();
        let mut out = vec![init("wte".into(), joined(wte), true), init("wpe".into(), full("wpe", t * c, std), true)];
        for b in blocks {
            out.extend(joined(b));
        }
        out.push(init("lnf.g".into(), vec![1.0; c], false));
        out.push(init("lnf.b".into(), vec![0.0; c], false));
        out.push(init("lm.w".into(), joined(lm), true));
        out
    })
}

/// A drawing thread's result. Drawing cannot fail; a panic in it is a bug, passed on as one.
fn joined<T>(h: std::thread::ScopedJoinHandle<'_, T>) -> T {
    h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// Block `i`'s twelve parameters.
fn block(cfg: &GptConfig, i: usize) -> Vec<Init> {
    let (c, l) = (cfg.shape.dim, cfg.shape.layers);
    let (cl, r) = (cfg.cl(), cfg.tp_rank);
    let std = 0.02 * 3f32.sqrt();
    let proj_std = std / (2.0 * l as f32).sqrt();
    let name = |s: &str| format!("h{i}.{s}");
    let full = |s: &str, len: usize, a: f32| uniform(len, a, seed_of(cfg.seed, &name(s)));
    let mut out = Vec::with_capacity(12);
    out.push(init(name("ln1.g"), vec![1.0; c], false));
    out.push(init(name("ln1.b"), vec![0.0; c], false));
    // QKV columns are [q | k | v], each [heads, head_dim]: this rank takes its heads' columns
    // of each of the three.
    let qkv = full("qkv.w", c * 3 * c, std);
    let qkv_b = full("qkv.b", 3 * c, std);
    let mut w = vec![Vec::new(); c];
    let mut b = Vec::new();
    for part in 0..3 {
        let cols = columns(&qkv, 3 * c, part * c + r * cl, cl);
        for (row, chunk) in w.iter_mut().zip(cols.chunks(cl)) {
            row.extend_from_slice(chunk);
        }
        b.extend_from_slice(&qkv_b[part * c + r * cl..part * c + (r + 1) * cl]);
    }
    out.push(init(name("qkv.w"), w.concat(), true));
    out.push(init(name("qkv.b"), b, false));
    // Row-parallel: this rank's rows.
    let o = full("o.w", c * c, proj_std);
    out.push(init(name("o.w"), o[r * cl * c..(r + 1) * cl * c].to_vec(), true));
    out.push(init(name("o.b"), full("o.b", c, std), false));
    out.push(init(name("ln2.g"), vec![1.0; c], false));
    out.push(init(name("ln2.b"), vec![0.0; c], false));
    let fc = full("fc.w", c * 4 * c, std);
    out.push(init(name("fc.w"), columns(&fc, 4 * c, r * 4 * cl, 4 * cl), true));
    let fc_b = full("fc.b", 4 * c, std);
    out.push(init(name("fc.b"), fc_b[r * 4 * cl..(r + 1) * 4 * cl].to_vec(), false));
    let proj = full("proj.w", 4 * c * c, proj_std);
    out.push(init(name("proj.w"), proj[r * 4 * cl * c..(r + 1) * 4 * cl * c].to_vec(), true));
    out.push(init(name("proj.b"), full("proj.b", c, std), false));
    out
}
