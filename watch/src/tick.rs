//! What one sampling instant ("tick") holds for each GPU, and how each of its figures was
//! judged: shared by the rule against the job's median ([`crate::peers`]) and the rule against
//! the GPU's own usual ratio ([`crate::baseline`]), which depend on these and not on each other
//! for them.

/// One GPU's reading at one tick.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reading {
    pub key: usize,
    pub sm_mhz: Option<f64>,
    pub power_w: Option<f64>,
    pub util: Option<u8>,
}

/// Which of the two figures a finding is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Figure {
    Clock,
    Power,
}

/// One GPU's figure at one tick, as judged.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Judged {
    /// Low against the peers: below the floor under the tick's median.
    pub low: bool,
    pub value: f64,
    pub median: f64,
    /// The scaled median absolute deviation of the peers' values.
    pub spread: f64,
    /// Against the GPU's own usual ratio to the median, where that rule judged the tick.
    pub own: Option<Own>,
}

/// The rule against the GPU's own usual ratio at one tick (SM clock only).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Own {
    /// The GPU's usual ratio of its value to the tick's median.
    pub usual: f32,
    /// The scaled median absolute deviation of the residuals (`ratio / usual - 1`) of the GPUs
    /// judged so.
    pub spread: f32,
    pub low: bool,
}

impl Judged {
    /// Low by either rule.
    pub fn is_low(&self) -> bool {
        self.low || self.own.is_some_and(|o| o.low)
    }
}
