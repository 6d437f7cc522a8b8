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
