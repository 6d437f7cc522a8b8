//! The annotation recording what gpusanity added to a Node, read back when returning it.

use serde::{Deserialize, Serialize};

/// What gpusanity added when it isolated a node (JSON in the `gpusanity.io/isolation`
/// annotation). Only what is recorded here is removed when the node is returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The finding code the node was isolated for (as a label value).
    pub code: String,
    /// The node was cordoned before gpusanity came: returning it leaves it cordoned.
    pub was_unschedulable: bool,
    /// gpusanity added the `gpusanity.io/faulty` taint (it was not there before).
    pub taint_added: bool,
    /// gpusanity added the `gpusanity.io/isolated` label.
    pub label_added: bool,
    /// When (RFC 3339).
    pub at: String,
}
