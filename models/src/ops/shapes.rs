//! The descriptors of [`Ops`](super::Ops)' calls: a product's shapes and layout, an AdamW
//! update, a convolution, a GPT attention's heads, and how a step graph ran.

/// Whether `len` is a whole number of `unit`s.
pub(crate) fn whole(len: usize, unit: usize) -> bool {
    unit != 0 && len / unit * unit == len
}

/// A (batched) product: for each batch `i`, `C_i = alpha op(A_i) op(B_i) + beta C_i`, with
/// `op(A)` `m x k`, `op(B)` `k x n` and `C` `m x n`. `ta` means A is stored `k x m` (and `tb`
/// that B is stored `n x k`). Strides are in elements between consecutive batches (0 shares
/// one matrix among all batches). Each stored matrix is row-major with its own row stride
/// (`lda`, `ldb`, `ldc`; by default its column count: dense) and starts `off_*` elements into
/// its buffer, so a product can read and write matrices inside a larger packed tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub ta: bool,
    pub tb: bool,
    pub batch: usize,
    pub stride_a: usize,
    pub stride_b: usize,
    pub stride_c: usize,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
    pub off_a: usize,
    pub off_b: usize,
    pub off_c: usize,
    pub alpha: f32,
    pub beta: f32,
}

impl Mm {
    /// `C = A B` with A `m x k` and B `k x n`.
    pub fn new(m: usize, n: usize, k: usize) -> Mm {
        Mm {
            m,
            n,
            k,
            ta: false,
            tb: false,
            batch: 1,
            stride_a: m * k,
            stride_b: k * n,
            stride_c: m * n,
            lda: k,
            ldb: n,
            ldc: n,
            off_a: 0,
            off_b: 0,
            off_c: 0,
            alpha: 1.0,
            beta: 0.0,
        }
    }
    /// A is stored transposed (`k x m`).
    pub fn ta(mut self) -> Mm {
        self.ta = true;
        self.lda = self.m;
        self
    }
    /// B is stored transposed (`n x k`).
    pub fn tb(mut self) -> Mm {
        self.tb = true;
        self.ldb = self.k;
        self
    }
    /// Adds the product to C.
    pub fn acc(mut self) -> Mm {
        self.beta = 1.0;
        self
    }
    pub fn alpha(mut self, alpha: f32) -> Mm {
        self.alpha = alpha;
        self
    }
    /// `batch` independent products of densely packed matrices.
    pub fn batched(mut self, batch: usize) -> Mm {
        self.batch = batch;
        self
    }
    /// The elements between consecutive batches' matrices.
    pub fn strides(mut self, a: usize, b: usize, c: usize) -> Mm {
        (self.stride_a, self.stride_b, self.stride_c) = (a, b, c);
        self
    }
    /// The row strides of the stored matrices (after [`Mm::ta`] / [`Mm::tb`]).
    pub fn ld(mut self, a: usize, b: usize, c: usize) -> Mm {
        (self.lda, self.ldb, self.ldc) = (a, b, c);
        self
    }
    /// Where the first batch's matrices start in their buffers.
    pub fn at(mut self, a: usize, b: usize, c: usize) -> Mm {
        (self.off_a, self.off_b, self.off_c) = (a, b, c);
        self
    }
    /// Where batch `i`'s matrices of each operand start.
    pub fn offsets(&self, i: usize) -> (usize, usize, usize) {
        (self.off_a + i * self.stride_a, self.off_b + i * self.stride_b, self.off_c + i * self.stride_c)
    }
    /// The stored shapes (rows, columns) of A, B and C.
    fn stored(&self) -> [(usize, usize); 3] {
        let a = if self.ta { (self.k, self.m) } else { (self.m, self.k) };
        let b = if self.tb { (self.n, self.k) } else { (self.k, self.n) };
        [a, b, (self.m, self.n)]
    }
    /// Whether every row stride holds its matrix's row (a leading dimension below the column
    /// count would make rows overlap).
    pub fn rows_fit(&self) -> bool {
        let [a, b, c] = self.stored();
        self.lda >= a.1.max(1) && self.ldb >= b.1.max(1) && self.ldc >= c.1.max(1)
    }
    /// The number of elements each operand's buffer must hold (saturating: a size that
    /// overflows fits no buffer).
    pub fn extents(&self) -> (usize, usize, usize) {
        let last = self.batch.saturating_sub(1);
        let [a, b, c] = self.stored();
        let need = |off: usize, stride: usize, ld: usize, (r, cols): (usize, usize)| {
            if r == 0 || cols == 0 {
                return off;
            }
            off.saturating_add(last.saturating_mul(stride))
                .saturating_add((r - 1).saturating_mul(ld))
                .saturating_add(cols)
        };
        (
            need(self.off_a, self.stride_a, self.lda, a),
            need(self.off_b, self.stride_b, self.ldb, b),
            need(self.off_c, self.stride_c, self.ldc, c),
        )
    }
    /// Floating-point operations of the product (2 m n k per batch).
    pub fn flops(&self) -> f64 {
        2.0 * (self.m * self.n * self.k * self.batch) as f64
    }
}

/// One AdamW update: `p -= lr (m_hat / (sqrt(v_hat) + eps) + wd p)` with the gradient scaled
/// by `grad_scale` first (1 / data-parallel size).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Adam {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// 1-based step number, for the bias corrections.
    pub step: u32,
    pub grad_scale: f32,
}

/// A 2-D convolution over a channel-major batch `[c, n * h * w]` with a square kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv {
    pub c: usize,
    pub n: usize,
    pub h: usize,
    pub w: usize,
    pub k: usize,
    pub stride: usize,
    pub pad: usize,
}

impl Conv {
    pub fn oh(&self) -> usize {
        (self.h + 2 * self.pad - self.k) / self.stride + 1
    }
    pub fn ow(&self) -> usize {
        (self.w + 2 * self.pad - self.k) / self.stride + 1
    }
    /// Rows of the im2col matrix (`c k k`).
    pub fn col_rows(&self) -> usize {
        self.c * self.k * self.k
    }
    /// Columns of the im2col matrix and of the output (`n oh ow`).
    pub fn col_cols(&self) -> usize {
        self.n * self.oh() * self.ow()
    }
}

/// Shapes of a GPT attention's head tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heads {
    pub b: usize,
    pub t: usize,
    pub h: usize,
    pub d: usize,
}

/// How [`Ops::graph_step`] ran a step.
#[derive(Debug, Clone, PartialEq)]
pub enum GraphRun {
    /// As it is, op by op (a backend without graphs).
    Eager,
    /// Recorded into a graph, which then ran it.
    Recorded,
    /// From the graph recorded earlier.
    Replayed,
    /// Op by op: the backend's state (its operand copies and scratch) differs from the one the
    /// graph was recorded in, and the graph has been recorded too often already.
    Stale,
    /// Op by op: recording failed, for this reason; the key is not recorded again.
    Failed(String),
}
