//! A ResNet with bottleneck blocks (ResNet-50 is width 64, blocks 3-4-6-3 on 224x224 images):
//! a 7x7/2 stem convolution with batch norm, ReLU and 3x3/2 max pooling; four stages of
//! bottlenecks (1x1, 3x3 carrying the stage's stride, 1x1 with 4x expansion; a projection
//! shortcut where the shape changes); global average pooling and a linear classifier.
//!
//! Activations are channel-major `[c, n h w]`, so a convolution is one matrix product of its
//! weights `[c_out, c_in k k]` with the im2col matrix (a 1x1 stride-1 convolution uses its
//! input directly) and batch norm reduces contiguous rows.

use crate::comm::Comm;
use crate::data::{seed_of, uniform, ImageTask};
use crate::ops::{Conv, Mm, NormBwd, NormFwd, Ops};
use crate::train::{GradsReady, Model, Param};
use crate::{ModelError, Result};

#[derive(Debug, Clone, PartialEq)]
pub struct ResnetConfig {
    pub image: usize,
    /// Images per data-parallel rank and step.
    pub batch: usize,
    pub width: usize,
    /// Bottleneck blocks per stage (1 to 4 stages).
    pub blocks: Vec<usize>,
    pub classes: usize,
    pub seed: u64,
    pub data_seed: u64,
}

/// Distinct batches cycled through (uploaded once, so a step's time is the model's alone).
const POOL: usize = 4;

/// A convolution followed by batch norm, with what its backward needs.
struct ConvBn<B> {
    cv: Conv,
    co: usize,
    /// Index of the weights; gamma and beta follow.
    p: usize,
    cols: Option<B>,
    y: B,
    mean: B,
    rstd: B,
    out: B,
    dy: B,
    dcols: Option<B>,
    dx: B,
}

impl<B> ConvBn<B> {
    fn new<O: Ops<Buf = B>>(
        ops: &mut O,
        params: &mut Vec<Param<B>>,
        name: String,
        cv: Conv,
        co: usize,
        seed: u64,
    ) -> Result<ConvBn<B>> {
        let p = params.len();
        let fan_in = cv.col_rows();
        let a = (6.0 / fan_in as f32).sqrt();
        params.push(Param::new(ops, format!("{name}.w"), &uniform(co * fan_in, a, seed_of(seed, &name)), true)?);
        params.push(Param::new(ops, format!("{name}.g"), &vec![1.0; co], false)?);
        params.push(Param::new(ops, format!("{name}.b"), &vec![0.0; co], false)?);
        let direct = cv.k == 1 && cv.stride == 1 && cv.pad == 0;
        let (m, cols) = (cv.col_cols(), cv.col_rows() * cv.col_cols());
        let input = cv.c * cv.n * cv.h * cv.w;
        Ok(ConvBn {
            cv,
            co,
            p,
            cols: if direct { None } else { Some(ops.zeros(cols)?) },
            dcols: if direct { None } else { Some(ops.zeros(cols)?) },
            y: ops.zeros(co * m)?,
            mean: ops.zeros(co)?,
            rstd: ops.zeros(co)?,
            out: ops.zeros(co * m)?,
            dy: ops.zeros(co * m)?,
            dx: ops.zeros(input)?,
        })
    }

    fn forward<O: Ops<Buf = B>>(&mut self, ops: &mut O, ps: &[Param<B>], x: &B) -> Result<()> {
        let (m, k) = (self.cv.col_cols(), self.cv.col_rows());
        let cols = match &mut self.cols {
            Some(c) => {
                ops.im2col(x, c, self.cv)?;
                &*c
            }
            None => x,
        };
        ops.matmul(Mm::new(self.co, m, k), &ps[self.p].w, cols, &mut self.y)?;
        let norm = NormFwd {
            x: &self.y,
            g: &ps[self.p + 1].w,
            b: &ps[self.p + 2].w,
            out: &mut self.out,
            mean: &mut self.mean,
            rstd: &mut self.rstd,
        };
        ops.batchnorm_fwd(norm, m)
    }

    /// From `dout` (the gradient of `out`) into `self.dx` and the parameters' gradients.
    fn backward<O: Ops<Buf = B>>(&mut self, ops: &mut O, ps: &mut [Param<B>], x: &B, dout: &B) -> Result<()> {
        let (m, k) = (self.cv.col_cols(), self.cv.col_rows());
        let (w, rest) = ps[self.p..].split_at_mut(1);
        let (g, b) = rest.split_at_mut(1);
        let norm = NormBwd {
            x: &self.y,
            g: &g[0].w,
            mean: &self.mean,
            rstd: &self.rstd,
            dout,
            dx: &mut self.dy,
            dg: &mut g[0].g,
            db: &mut b[0].g,
        };
        ops.batchnorm_bwd(norm, m)?;
        let cols = self.cols.as_ref().unwrap_or(x);
        ops.matmul(Mm::new(self.co, k, m).tb(), &self.dy, cols, &mut w[0].g)?;
        match &mut self.dcols {
            Some(dc) => {
                ops.matmul(Mm::new(k, m, self.co).ta(), &w[0].w, &self.dy, dc)?;
                ops.col2im(dc, &mut self.dx, self.cv)
            }
            None => ops.matmul(Mm::new(k, m, self.co).ta(), &w[0].w, &self.dy, &mut self.dx),
        }
    }

    fn flops(&self) -> f64 {
        3.0 * Mm::new(self.co, self.cv.col_cols(), self.cv.col_rows()).flops()
    }

    /// The output's shape as the next layer's input.
    fn next(&self, k: usize, stride: usize, pad: usize, c: usize) -> Conv {
        Conv { c, n: self.cv.n, h: self.cv.oh(), w: self.cv.ow(), k, stride, pad }
    }
}

struct Block<B> {
    c1: ConvBn<B>,
    c2: ConvBn<B>,
    c3: ConvBn<B>,
    short: Option<ConvBn<B>>,
    a1: B,
    a2: B,
    /// ReLU(main + shortcut): the block's output.
    out: B,
    da1: B,
    da2: B,
    dsum: B,
    dx: B,
}

pub struct Resnet<B> {
    pub cfg: ResnetConfig,
    params: Vec<Param<B>>,
    stem: ConvBn<B>,
    stem_act: B,
    pool: Conv,
    pooled: B,
    arg: B,
    blocks: Vec<Block<B>>,
    feat: B,
    logits: B,
    dlogits: B,
    losses: B,
    dfeat: B,
    dlast: B,
    dpooled: B,
    dstem: B,
    batches: Vec<(B, B)>,
    cur: usize,
}

impl<B> Resnet<B> {
    pub fn new<O: Ops<Buf = B>>(ops: &mut O, cfg: ResnetConfig) -> Result<Resnet<B>> {
        if [cfg.image, cfg.batch, cfg.width, cfg.classes].contains(&0)
            || cfg.blocks.is_empty()
            || cfg.blocks.len() > 4
            || cfg.blocks.contains(&0)
        {
            return Err(ModelError::Config(format!("resnet: bad sizes {cfg:?}")));
        }
        let (n, seed) = (cfg.batch, cfg.seed);
        let mut params = Vec::new();
        let stem = ConvBn::new(
            ops,
            &mut params,
            "stem".into(),
            Conv { c: 3, n, h: cfg.image, w: cfg.image, k: 7, stride: 2, pad: 3 },
            cfg.width,
            seed,
        )?;
        let stem_act = ops.zeros(O::len(&stem.out))?;
        let pool = stem.next(3, 2, 1, cfg.width);
        let pooled_len = cfg.width * pool.col_cols();
        let (mut c_in, mut h) = (cfg.width, pool.oh());
        if h == 0 {
            return Err(ModelError::Config(format!("resnet: image {} is too small", cfg.image)));
        }
        let mut blocks = Vec::new();
        for (s, &count) in cfg.blocks.iter().enumerate() {
            let planes = cfg.width << s;
            for i in 0..count {
                let stride = if s > 0 && i == 0 { 2 } else { 1 };
                let name = |x: &str| format!("s{s}b{i}.{x}");
                let input = Conv { c: c_in, n, h, w: h, k: 1, stride: 1, pad: 0 };
                let c1 = ConvBn::new(ops, &mut params, name("c1"), input, planes, seed)?;
                let c2 = ConvBn::new(ops, &mut params, name("c2"), c1.next(3, stride, 1, planes), planes, seed)?;
                let c3 = ConvBn::new(ops, &mut params, name("c3"), c2.next(1, 1, 0, planes), 4 * planes, seed)?;
                let short = if stride != 1 || c_in != 4 * planes {
                    Some(ConvBn::new(ops, &mut params, name("sc"), Conv { stride, ..input }, 4 * planes, seed)?)
                } else {
                    None
                };
                let out_len = O::len(&c3.out);
                blocks.push(Block {
                    a1: ops.zeros(O::len(&c1.out))?,
                    a2: ops.zeros(O::len(&c2.out))?,
                    out: ops.zeros(out_len)?,
                    da1: ops.zeros(O::len(&c1.out))?,
                    da2: ops.zeros(O::len(&c2.out))?,
                    dsum: ops.zeros(out_len)?,
                    dx: ops.zeros(c_in * n * h * h)?,
                    c1,
                    c2,
                    c3,
                    short,
                });
                c_in = 4 * planes;
                h = h.div_ceil(stride);
            }
        }
        let fc = uniform(c_in * cfg.classes, 1.0 / (c_in as f32).sqrt(), seed_of(seed, "fc"));
        params.push(Param::new(ops, "fc.w".into(), &fc, true)?);
        params.push(Param::new(ops, "fc.b".into(), &vec![0.0; cfg.classes], false)?);
        let task = ImageTask::new(cfg.classes, cfg.image, seed_of(seed, "task"));
        let batches = (0..POOL)
            .map(|i| {
                let (x, y) = task.batch(n, seed_of(cfg.data_seed, &format!("batch{i}")));
                Ok((ops.upload(&x)?, ops.upload(&y)?))
            })
            .collect::<Result<Vec<_>>>()?;
        let last = blocks.last().map_or(pooled_len, |b| O::len(&b.out));
        Ok(Resnet {
            stem_act,
            pooled: ops.zeros(pooled_len)?,
            arg: ops.zeros(pooled_len)?,
            dpooled: ops.zeros(O::len(&stem.out))?,
            dstem: ops.zeros(O::len(&stem.out))?,
            feat: ops.zeros(n * c_in)?,
            dfeat: ops.zeros(n * c_in)?,
            dlast: ops.zeros(last)?,
            logits: ops.zeros(n * cfg.classes)?,
            dlogits: ops.zeros(n * cfg.classes)?,
            losses: ops.zeros(n)?,
            stem,
            pool,
            blocks,
            params,
            batches,
            cur: 0,
            cfg,
        })
    }
}

impl<B> Block<B> {
    /// The index of the block's first parameter: the block's parameters are those from it up
    /// to the next block's.
    fn first_param(&self) -> usize {
        let short = self.short.as_ref().map_or(usize::MAX, |s| s.p);
        self.c1.p.min(self.c2.p).min(self.c3.p).min(short)
    }

    fn forward<O: Ops<Buf = B>>(&mut self, ops: &mut O, ps: &[Param<B>], x: &B) -> Result<()> {
        self.c1.forward(ops, ps, x)?;
        ops.relu_fwd(&self.c1.out, &mut self.a1)?;
        self.c2.forward(ops, ps, &self.a1)?;
        ops.relu_fwd(&self.c2.out, &mut self.a2)?;
        self.c3.forward(ops, ps, &self.a2)?;
        // out = ReLU(main + shortcut), in one pass.
        match &mut self.short {
            Some(sc) => {
                sc.forward(ops, ps, x)?;
                ops.add_relu(&self.c3.out, &sc.out, &mut self.out)
            }
            None => ops.add_relu(&self.c3.out, x, &mut self.out),
        }
    }

    /// From `dout` (gradient of `out`) into `self.dx`.
    fn backward<O: Ops<Buf = B>>(&mut self, ops: &mut O, ps: &mut [Param<B>], x: &B, dout: &B) -> Result<()> {
        ops.relu_bwd(&self.out, dout, &mut self.dsum)?;
        self.c3.backward(ops, ps, &self.a2, &self.dsum)?;
        ops.relu_bwd(&self.a2, &self.c3.dx, &mut self.da2)?;
        self.c2.backward(ops, ps, &self.a1, &self.da2)?;
        ops.relu_bwd(&self.a1, &self.c2.dx, &mut self.da1)?;
        self.c1.backward(ops, ps, x, &self.da1)?;
        match &mut self.short {
            Some(sc) => {
                sc.backward(ops, ps, x, &self.dsum)?;
                ops.add(&self.c1.dx, &sc.dx, &mut self.dx)
            }
            None => ops.add(&self.c1.dx, &self.dsum, &mut self.dx),
        }
    }
}

impl<O: Ops> Model<O> for Resnet<O::Buf> {
    fn params_mut(&mut self) -> &mut [Param<O::Buf>] {
        &mut self.params
    }
    fn load_batch(&mut self, _ops: &mut O, step: usize) -> Result<()> {
        self.cur = step % POOL;
        Ok(())
    }

    fn forward_backward(
        &mut self,
        ops: &mut O,
        _tp: &mut dyn Comm<O::Buf>,
        grads: &mut dyn GradsReady<O::Buf>,
    ) -> Result<()> {
        let Resnet {
            cfg,
            params: ps,
            stem,
            stem_act,
            pool,
            pooled,
            arg,
            blocks,
            feat,
            logits,
            dlogits,
            losses,
            dfeat,
            dlast,
            dpooled,
            dstem,
            batches,
            cur,
        } = self;
        let (n, classes) = (cfg.batch, cfg.classes);
        let (x, labels) = &batches[*cur];
        stem.forward(ops, ps, x)?;
        ops.relu_fwd(&stem.out, stem_act)?;
        ops.maxpool_fwd(stem_act, pooled, arg, *pool)?;
        for i in 0..blocks.len() {
            let (before, rest) = blocks.split_at_mut(i);
            let input = before.last().map_or(&*pooled, |b| &b.out);
            rest[0].forward(ops, ps, input)?;
        }
        let last = blocks.last().map_or(&*pooled, |b| &b.out);
        let c = O::len(feat) / n;
        ops.avgpool_fwd(last, feat, c, n)?;
        let nfc = ps.len() - 2;
        ops.matmul(Mm::new(n, classes, c), feat, &ps[nfc].w, logits)?;
        ops.add_bias(logits, &ps[nfc + 1].w, n)?;
        ops.cross_entropy(logits, labels, dlogits, losses, classes)?;

        ops.matmul(Mm::new(c, classes, n).ta(), feat, dlogits, &mut ps[nfc].g)?;
        ops.col_sum(dlogits, &mut ps[nfc + 1].g, n)?;
        ops.matmul(Mm::new(n, c, classes).tb(), dlogits, &ps[nfc].w, dfeat)?;
        ops.avgpool_bwd(dfeat, dlast, c, n)?;
        grads.ready(ps, nfc)?;
        for i in (0..blocks.len()).rev() {
            let (before, rest) = blocks.split_at_mut(i);
            let (block, after) = rest.split_at_mut(1);
            let input = before.last().map_or(&*pooled, |b| &b.out);
            let dout = after.first().map_or(&*dlast, |b| &b.dx);
            block[0].backward(ops, ps, input, dout)?;
            grads.ready(ps, block[0].first_param())?;
        }
        let dfirst = blocks.first().map_or(&*dlast, |b| &b.dx);
        ops.maxpool_bwd(dfirst, arg, dpooled, *pool)?;
        ops.relu_bwd(stem_act, dpooled, dstem)?;
        stem.backward(ops, ps, x, dstem)?;
        grads.ready(ps, 0)
    }

    fn loss(&mut self, ops: &mut O) -> Result<f32> {
        let l = ops.download(&self.losses)?;
        Ok(l.iter().sum::<f32>() / l.len() as f32)
    }

    /// The batch: each of the pool's is its own buffer, so its own graph.
    fn graph_key(&self) -> usize {
        self.cur
    }

    fn flops_per_step(&self) -> f64 {
        let convs =
            self.blocks.iter().flat_map(|b| [Some(&b.c1), Some(&b.c2), Some(&b.c3), b.short.as_ref()]).flatten();
        let c = O::len(&self.feat) / self.cfg.batch;
        self.stem.flops()
            + convs.map(ConvBn::flops).sum::<f64>()
            + 3.0 * Mm::new(self.cfg.batch, self.cfg.classes, c).flops()
    }
}

#[cfg(test)]
mod tests;
