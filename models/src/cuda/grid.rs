//! The launch shapes of the model kernels: the grids and blocks each kernel of kernels.cu
//! expects.

use cudarc::driver::LaunchConfig;

/// One thread per element.
pub(super) fn elems(n: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: ((n as u32).div_ceil(256).max(1), 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}
/// One thread per four elements (a grid-stride loop past 65,535 blocks).
pub(super) fn quads(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (((n / 4) as u32).div_ceil(256).clamp(1, 65_535), 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}
/// One warp per row, four rows per block.
pub(super) fn rows(n: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: ((n as u32).div_ceil(4).max(1), 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 }
}
/// Rows per block of the bias kernels (`BIAS_ROWS` in kernels.cu).
pub(super) const BIAS_ROWS: usize = 16;
/// Column blocks of 256 threads x row blocks of [`BIAS_ROWS`].
pub(super) fn bias_grid(rows: usize, cols: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((cols as u32).div_ceil(256).max(1), (rows as u32).div_ceil(BIAS_ROWS as u32).max(1), 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// How a two-pass reduction cuts `len` elements into chunks when `others` independent
/// reductions run beside it: enough blocks in all to fill the GPU (about 1,024), chunks of at
/// least `least` elements. Returns (chunks, elements per chunk).
pub(super) fn chunking(len: usize, others: usize, least: usize) -> (usize, usize) {
    let want = 1024usize.div_ceil(others.max(1));
    let chunks = want.min(len.div_ceil(least)).clamp(1, 64);
    (chunks, len.div_ceil(chunks).max(1))
}
/// Grid (column blocks of 32, chunks), block (32, 8): the column reductions' first pass.
pub(super) fn col_parts(cols: usize, chunks: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((cols as u32).div_ceil(32).max(1), chunks as u32, 1),
        block_dim: (32, 8, 1),
        shared_mem_bytes: 0,
    }
}
/// Grid (chunks, channels) of blocks of 256: batch norm's passes.
pub(super) fn channel_chunks(chunks: usize, channels: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (chunks as u32, channels.max(1) as u32, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}
