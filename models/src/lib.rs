//! The model checks' small tensor-op layer and the models written once over it.
//!
//! - [`ops::Ops`]: the operations the three models need, forward and backward, on f32 buffers;
//!   two backends: [`cpu::CpuOps`] (the `gemm` crate and plain loops, one thread) and
//!   [`cuda::CudaOps`] (cuBLAS with bf16 tensor-core math, our own kernels compiled at run time
//!   by NVRTC), built on a [`gpusanity_cuda::CudaDevice`] that the caller opened once and shares
//!   (the executor passes its backend's: one context, stream and cuBLAS handle per worker).
//! - [`comm::Comm`]: the one collective the models need (sum all-reduce in place over a group),
//!   implemented by the caller over its transport.
//! - [`gpt`]: a GPT-2-style decoder with optional Megatron tensor parallelism; [`resnet`]: a
//!   ResNet with bottleneck blocks; [`train`]: the training loop shared by both, with loss
//!   bookkeeping, data-parallel gradient averaging, AdamW and parameter checksums.
//!
//! Not a general framework: shapes are checked where a mistake would be silent, nothing more.

pub mod comm;
pub mod cpu;
pub mod cuda;

pub mod data;
pub mod gpt;
pub mod ops;
pub mod resnet;

pub mod train;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum ModelError {
    #[error("device error: {0}")]
    Device(String),
    #[error("communication error: {0}")]
    Comm(String),
    #[error("bad model configuration: {0}")]
    Config(String),
}

pub type Result<T> = std::result::Result<T, ModelError>;
