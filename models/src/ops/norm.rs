//! The buffers of a norm layer's forward and backward, one set for layer norm and batch norm
//! alike (the two normalize rows of a row-major tensor: layer norm each row of features, batch
//! norm each channel's row of a channel-major tensor), on every backend.

/// What [`Ops::layernorm_fwd`](super::Ops::layernorm_fwd) and
/// [`Ops::batchnorm_fwd`](super::Ops::batchnorm_fwd) read and write: `out` (overwritten) is
/// `x` normalized with scale `g` and shift `b`; `mean` and `rstd` (overwritten) get each
/// normalized row's mean and 1/std, which the backward reads.
pub struct NormFwd<'a, B> {
    pub x: &'a B,
    pub g: &'a B,
    pub b: &'a B,
    pub out: &'a mut B,
    pub mean: &'a mut B,
    pub rstd: &'a mut B,
}

/// What [`Ops::layernorm_bwd`](super::Ops::layernorm_bwd) and
/// [`Ops::batchnorm_bwd`](super::Ops::batchnorm_bwd) read and write: from the forward's input
/// `x`, scale `g` and saved `mean` and `rstd`, and the output's gradient `dout`, the gradients
/// of the input (`dx`), the scale (`dg`) and the shift (`db`).
pub struct NormBwd<'a, B> {
    pub x: &'a B,
    pub g: &'a B,
    pub mean: &'a B,
    pub rstd: &'a B,
    pub dout: &'a B,
    pub dx: &'a mut B,
    pub dg: &'a mut B,
    pub db: &'a mut B,
}
