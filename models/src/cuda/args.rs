//! What every kernel launch shares: the int arguments (a convolution's sizes among them,
//! [`ConvArgs`]), the size check, the [`launch!`] macro and its check of each buffer argument
//! ([`KernelArg`]), and the bf16 conversion.

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::grid::quads;
use super::{twins, CudaOps};
use crate::ops::Conv;
use crate::{ModelError, Result};

type Buf = CudaSlice<f32>;

/// `n` as a kernel's int argument.
pub(super) fn int(n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| ModelError::Config(format!("size {n} exceeds the kernels' int range")))
}

/// A convolution's sizes as kernel ints.
pub(super) struct ConvArgs {
    pub c: i32,
    pub n: i32,
    pub h: i32,
    pub w: i32,
    pub k: i32,
    pub stride: i32,
    pub pad: i32,
    pub oh: i32,
    pub ow: i32,
}

impl ConvArgs {
    pub fn new(cv: Conv) -> Result<ConvArgs> {
        Ok(ConvArgs {
            c: int(cv.c)?,
            n: int(cv.n)?,
            h: int(cv.h)?,
            w: int(cv.w)?,
            k: int(cv.k)?,
            stride: int(cv.stride)?,
            pad: int(cv.pad)?,
            oh: int(cv.oh())?,
            ow: int(cv.ow())?,
        })
    }
}

pub(super) fn check(what: &str, ok: bool) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(ModelError::Config(format!("{what}: buffer sizes do not match")))
    }
}

/// Launches kernel `$name` with `$cfg` and the arguments (references to buffers or to named
/// scalar locals, which outlive the launch call).
macro_rules! launch {
    ($self:ident, $name:literal, $cfg:expr; $($arg:expr),+ $(,)?) => {{
        let cfg = $cfg;
        $( $crate::cuda::args::KernelArg::readable(&$arg, &$self.twins)?; )+
        let f = $self.func($name)?;
        let mut b = $self.stream().launch_builder(f);
        $( b.arg($arg); )+
        // SAFETY: every argument matches the kernel's parameter list in kernels.cu in order and
        // type (device pointers to f32 buffers, or u16 for bf16, int, long and float scalars);
        // the caller checked that
        // the buffers hold every element the kernel indexes for these sizes; all buffers live
        // on this stream.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(|e| $crate::cuda::dev(concat!("kernel ", $name), e))
    }};
}
pub(super) use launch;

/// A kernel argument as [`launch!`] checks it: an f32 buffer must hold its value (not only a
/// bf16 twin, [`twins::Twins::readable`]); scalars and bf16 buffers need nothing.
pub(super) trait KernelArg {
    fn readable(&self, _twins: &twins::Twins) -> Result<()> {
        Ok(())
    }
}
impl KernelArg for &Buf {
    fn readable(&self, twins: &twins::Twins) -> Result<()> {
        twins.readable(self)
    }
}
impl KernelArg for &mut Buf {
    fn readable(&self, twins: &twins::Twins) -> Result<()> {
        twins.readable(self)
    }
}
// A view into an f32 buffer (the convolutions' per-image slices): only whole buffers are ever
// held in bf16 alone, and none of those is sliced.
impl KernelArg for &cudarc::driver::CudaView<'_, f32> {}
impl KernelArg for &CudaSlice<u16> {}
impl KernelArg for &mut CudaSlice<u16> {}
impl KernelArg for &i32 {}
impl KernelArg for &i64 {}
impl KernelArg for &f32 {}

impl CudaOps {
    /// `y[..x.len()]` = bf16 of `x` (the products' operand copies).
    pub(super) fn convert(&mut self, x: &Buf, y: &mut CudaSlice<u16>) -> Result<()> {
        check("to_bf16", y.len() >= x.len())?;
        // Whole buffers from their allocation: 16-byte aligned for the kernel's float4 loads.
        let n = x.len() as i64;
        launch!(self, "to_bf16", quads(x.len()); x, y, &n)
    }
}
