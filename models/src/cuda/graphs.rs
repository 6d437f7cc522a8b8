//! CUDA graphs of the training step ([`Ops::graph_step`](crate::ops::Ops::graph_step)). A
//! step of ResNet-50 is about 1,500 kernels and products, many of them a few microseconds long
//! in the last stages: launched one by one from the host, the device waits for the host between
//! them. A step recorded once into a graph (stream capture) is replayed by one launch.
//!
//! A graph repeats exactly the work recorded, on the same addresses, with the arguments of the
//! recording; the host-side choices the ops made while it was recorded (which operands already
//! had a valid bf16 twin and skipped their conversion, which twin and scratch buffers they used)
//! are baked in. So a graph is replayed only while that host-side state is what it was at the
//! recording ([`State`]: every twin's address, buffer and validity, and the scratch buffer);
//! otherwise the step is recorded anew (a few times at most) or runs op by op. A write from
//! outside the step (a fault injected into a weight, which makes its twin stale) therefore
//! never meets a graph that would skip the conversion.
//!
//! While a step is recorded nothing may allocate, free, synchronize or read back (none of it
//! would be recorded, or it would break the capture): the ops that would refuse
//! ([`Graphs::refuse`]), the recording fails, and the step runs op by op. The twins' bookkeeping
//! done during a failed recording claims conversions that never ran, so every twin is then
//! marked stale.

use std::collections::HashMap;

use cudarc::driver::sys::{CUgraphInstantiate_flags_enum, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;

use super::{twins, CudaOps};
use crate::ops::GraphRun;
use crate::{ModelError, Result};

/// How often one key may be recorded: a state that keeps changing runs op by op after that.
const MAX_RECORDINGS: usize = 3;

/// The host-side state a graph depends on: the twins (f32 address, bf16 address and length,
/// valid) in address order, and the scratch buffer (address and length).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct State {
    twins: Vec<(u64, u64, usize, bool, bool)>,
    scratch: Option<(u64, usize)>,
}

struct Recorded {
    graph: CudaGraph,
    state: State,
}

/// The step graphs of one [`CudaOps`].
#[derive(Default)]
pub(super) struct Graphs {
    by_key: HashMap<usize, Recorded>,
    /// Recordings per key (failed ones included).
    recordings: HashMap<usize, usize>,
    /// The first failure per key: such a key runs op by op from then on.
    failed: HashMap<usize, String>,
    /// A step is being recorded.
    capturing: bool,
}

impl Graphs {
    /// An error if a step is being recorded: `what` (an allocation, a read-back, a
    /// synchronization) cannot be part of a graph.
    pub(super) fn refuse(&self, what: &str) -> Result<()> {
        if self.capturing {
            return Err(ModelError::Device(format!("{what} while a step graph is recorded")));
        }
        Ok(())
    }
}

impl CudaOps {
    fn graph_state(&self) -> State {
        let scratch = self.scratch.as_ref().map(|s| (twins::address(s), s.len()));
        State { twins: self.twins.state(), scratch }
    }

    /// [`Ops::graph_step`](crate::ops::Ops::graph_step) on CUDA graphs.
    pub(super) fn run_graph(&mut self, key: usize, body: &mut dyn FnMut(&mut Self) -> Result<()>) -> Result<GraphRun> {
        if self.graphs.failed.contains_key(&key) {
            body(self)?;
            return Ok(GraphRun::Eager);
        }
        let state = self.graph_state();
        if let Some(r) = self.graphs.by_key.get(&key) {
            if r.state == state {
                r.graph.launch().map_err(|e| super::dev("launching a step graph", e))?;
                return Ok(GraphRun::Replayed);
            }
        }
        // No graph yet, or one of another state: drop it before recording (its buffers are
        // the same, it is just no longer valid).
        self.graphs.by_key.remove(&key);
        let n = self.graphs.recordings.entry(key).or_default();
        if *n >= MAX_RECORDINGS {
            body(self)?;
            return Ok(GraphRun::Stale);
        }
        *n += 1;
        match self.record(body) {
            Ok(graph) => {
                graph.launch().map_err(|e| super::dev("launching a step graph", e))?;
                self.graphs.by_key.insert(key, Recorded { graph, state });
                Ok(GraphRun::Recorded)
            }
            Err(why) => {
                // Nothing of the step ran, but the twins' bookkeeping thinks it did. A buffer
                // held only in bf16 loses its value here: a step writes those (the fused
                // products' results) before it reads them.
                self.twins.invalidate_all();
                self.graphs.failed.insert(key, why.clone());
                body(self)?;
                Ok(GraphRun::Failed(why))
            }
        }
    }

    /// Records `body` into a graph (nothing runs yet); the reason if it cannot.
    fn record(&mut self, body: &mut dyn FnMut(&mut Self) -> Result<()>) -> std::result::Result<CudaGraph, String> {
        let stream = self.stream().clone();
        // Thread-local: only this thread's own unsafe calls (a synchronization, an allocation
        // outside the stream) would break the capture; the ops refuse those anyway.
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| format!("cuStreamBeginCapture: {e:?}"))?;
        self.graphs.capturing = true;
        let done = body(self);
        self.graphs.capturing = false;
        let ended = stream.end_capture(CUgraphInstantiate_flags_enum(0));
        match (done, ended) {
            (Ok(()), Ok(Some(graph))) => Ok(graph),
            (Ok(()), Ok(None)) => Err("the step recorded no work".into()),
            (Ok(()), Err(e)) => Err(format!("cuStreamEndCapture or cuGraphInstantiate: {e:?}")),
            (Err(e), _) => Err(e.to_string()),
        }
    }

    /// [`Ops::drop_graphs`](crate::ops::Ops::drop_graphs).
    pub(super) fn forget_graphs(&mut self) {
        self.graphs = Graphs::default();
    }
}

#[cfg(test)]
mod tests;
