//! Data-parallel gradient sums in buckets that start while the backward still runs.

use super::Param;
use crate::comm::Comm;
use crate::Result;

/// The most gradient bytes summed in one data-parallel collective: PyTorch DDP's default
/// bucket. Fewer, larger collectives than one per parameter: a GPT of 12 layers has 150
/// parameters, most of them small (biases, norms), each a collective's latency.
pub const BUCKET_BYTES: usize = 25 << 20;

/// The data-parallel buckets of parameters of `lens` elements of f32: consecutive index ranges,
/// taken from the last parameter back (the backward's order, in which their gradients become
/// final), each closed before it would pass `cap` bytes; a parameter larger than `cap` is a
/// bucket of its own. Returned in that order: the last parameters' bucket first.
pub fn buckets(lens: &[usize], cap: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut end, mut bytes) = (lens.len(), 0usize);
    for i in (0..lens.len()).rev() {
        let b = lens[i].saturating_mul(4);
        if i + 1 < end && bytes.saturating_add(b) > cap {
            out.push(i + 1..end);
            (end, bytes) = (i + 1, 0);
        }
        bytes = bytes.saturating_add(b);
    }
    if end > 0 {
        out.push(0..end);
    }
    out
}

/// Told by a model's backward which gradients are final.
pub trait GradsReady<B> {
    /// The gradients of `params[from..]` are final for this step: the backward neither reads
    /// nor writes them again. `from` only falls during one backward.
    fn ready(&mut self, params: &mut [Param<B>], from: usize) -> Result<()>;
}

/// Nobody listens: a backward recorded as a graph (a replay calls nothing back), a repeated
/// pass of the slow-compute fault, a test.
pub struct NotWatching;

impl<B> GradsReady<B> for NotWatching {
    fn ready(&mut self, _params: &mut [Param<B>], _from: usize) -> Result<()> {
        Ok(())
    }
}

/// Starts the data-parallel sum of each bucket as soon as the backward has finished its
/// gradients: the buckets run from the last parameter back, as the backward does, so the
/// sums overlap the rest of the backward.
pub(super) struct Overlap<'a, B> {
    pub(super) dp: &'a mut dyn Comm<B>,
    pub(super) buckets: &'a [std::ops::Range<usize>],
    /// Buckets started so far, from the first.
    pub(super) started: usize,
}

/// The gradients of the parameters of bucket `r`.
fn grads<'p, B>(params: &'p mut [Param<B>], r: &std::ops::Range<usize>) -> Vec<&'p mut B> {
    params[r.clone()].iter_mut().map(|p| &mut p.g).collect()
}

impl<B> Overlap<'_, B> {
    /// Starts every bucket not yet started whose parameters all lie at or after `from`.
    fn start_from(&mut self, params: &mut [Param<B>], from: usize) -> Result<()> {
        while let Some(r) = self.buckets.get(self.started).filter(|r| r.start >= from) {
            self.dp.start_bucket(&mut grads(params, r))?;
            self.started += 1;
        }
        Ok(())
    }

    /// Starts the buckets the backward did not (all of them after a graph), then completes
    /// every one: afterwards the update may read the sums.
    pub(super) fn finish(&mut self, params: &mut [Param<B>]) -> Result<()> {
        self.start_from(params, 0)?;
        for r in self.buckets {
            self.dp.finish_bucket(&mut grads(params, r))?;
        }
        Ok(())
    }
}

impl<B> GradsReady<B> for Overlap<'_, B> {
    fn ready(&mut self, params: &mut [Param<B>], from: usize) -> Result<()> {
        self.start_from(params, from)
    }
}
