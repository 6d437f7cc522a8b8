//! The collective the models need, implemented by the caller over its transport (TCP ring on
//! CPU, NCCL on GPU).

use crate::Result;

/// A group of ranks that sums buffers.
pub trait Comm<B> {
    /// The number of ranks in the group.
    fn size(&self) -> usize;
    /// This rank's index in the group.
    fn rank(&self) -> usize;
    /// `buf = sum over the group of buf`, element-wise, in place.
    fn all_reduce_sum(&mut self, buf: &mut B) -> Result<()>;
    /// [`Comm::all_reduce_sum`] on every buffer of `bufs` (a bucket of gradients), in as few
    /// collectives as the transport allows: one pass of the ring over their concatenation, one
    /// NCCL group. Every rank passes buffers of the same lengths in the same order. By default,
    /// one collective per buffer.
    fn all_reduce_sum_bucket(&mut self, bufs: &mut [&mut B]) -> Result<()> {
        for b in bufs.iter_mut() {
            self.all_reduce_sum(b)?;
        }
        Ok(())
    }
    /// Starts [`Comm::all_reduce_sum_bucket`] on `bufs` and returns while it may still run
    /// (beside the work the caller goes on to issue); [`Comm::finish_bucket`] completes it.
    /// Between the two the caller neither reads nor writes the buffers. By default the sum is
    /// complete on return.
    fn start_bucket(&mut self, bufs: &mut [&mut B]) -> Result<()> {
        self.all_reduce_sum_bucket(bufs)
    }
    /// Completes the oldest started bucket, whose buffers `bufs` are again (the same, in the
    /// same order): afterwards each holds its sum, and work issued after it sees the sums.
    fn finish_bucket(&mut self, _bufs: &mut [&mut B]) -> Result<()> {
        Ok(())
    }
}

/// The group of one rank: all-reduce is the identity.
pub struct Solo;

impl<B> Comm<B> for Solo {
    fn size(&self) -> usize {
        1
    }
    fn rank(&self) -> usize {
        0
    }
    fn all_reduce_sum(&mut self, _buf: &mut B) -> Result<()> {
        Ok(())
    }
}
