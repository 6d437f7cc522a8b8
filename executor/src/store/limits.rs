//! The store's bounds, which grow with the run: node 0 sizes them for its nodes when it starts
//! hosting, and for the world once every node has said how many ranks it brings. Every peer
//! holds connections for the whole run (each launcher three, its node store's relay one, and
//! each rank of a node of one rank one; the bound still counts one per rank), and every rank
//! writes keys per check, so no fixed ceiling fits both a laptop and 2,048 nodes of 8 GPUs.
//! The bounds stay finite: a run of n ranks can keep at most [`Limits::for_run`] of them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

/// Connections every run may hold beyond its launchers' and ranks' (tools, retries whose
/// old connection has not closed yet, peers refused at the handshake).
const BASE_CONNECTIONS: usize = 4096;
/// Connections each launcher holds: its own, the abort watch, the abort handle.
const LAUNCHER_CONNECTIONS: usize = 3;
/// Keys of any run, whatever its size.
const BASE_KEYS: usize = 100_000;
/// Keys per rank: barriers, figures and probe rows of every check, and their re-measures.
const KEYS_PER_RANK: usize = 256;
/// Bytes of keys and values of any run.
const BASE_BYTES: usize = 256 << 20;
/// Bytes per rank: its share of its node's outcome (about 15 KB per rank for the whole suite)
/// and its keys.
const BYTES_PER_RANK: usize = 64 << 10;
/// What one key costs beyond its bytes (the map's entry, the strings' headers), counted in the
/// bytes bound so that it bounds memory, many small keys included.
pub(crate) const KEY_OVERHEAD: usize = 64;
/// Ranks per node assumed before the nodes have said (8 GPUs each).
pub const ASSUMED_RANKS_PER_NODE: usize = 8;

/// The most connections, keys and bytes the store holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub connections: usize,
    pub keys: usize,
    pub bytes: usize,
}

impl Limits {
    /// The bounds of a run of `nnodes` nodes and `world` ranks.
    pub fn for_run(nnodes: usize, world: usize) -> Limits {
        Limits {
            connections: BASE_CONNECTIONS
                .saturating_add(nnodes.saturating_mul(LAUNCHER_CONNECTIONS))
                .saturating_add(world),
            keys: BASE_KEYS.saturating_add(world.saturating_mul(KEYS_PER_RANK)),
            bytes: BASE_BYTES.saturating_add(world.saturating_mul(BYTES_PER_RANK)),
        }
    }
}

impl Default for Limits {
    /// A run of one node.
    fn default() -> Limits {
        Limits::for_run(1, ASSUMED_RANKS_PER_NODE)
    }
}

/// The live bounds of a served store: shared with its server, grown by node 0.
#[derive(Clone)]
pub struct Bounds(Arc<Inner>);

struct Inner {
    slots: Arc<Semaphore>,
    limits: Mutex<Limits>,
    /// The most connections held at once so far.
    peak: AtomicUsize,
}

impl Bounds {
    pub fn new(limits: Limits) -> Bounds {
        let slots = Arc::new(Semaphore::new(limits.connections.min(Semaphore::MAX_PERMITS)));
        Bounds(Arc::new(Inner { slots, limits: Mutex::new(limits), peak: AtomicUsize::new(0) }))
    }

    /// Grows every bound to at least `to`'s (never shrinks one).
    pub fn grow(&self, to: Limits) {
        let Ok(mut l) = self.0.limits.lock() else { return };
        let more = to.connections.min(Semaphore::MAX_PERMITS).saturating_sub(l.connections);
        if more > 0 {
            self.0.slots.add_permits(more);
        }
        *l = Limits {
            connections: l.connections.max(to.connections),
            keys: l.keys.max(to.keys),
            bytes: l.bytes.max(to.bytes),
        };
    }

    pub fn limits(&self) -> Limits {
        self.0.limits.lock().map(|l| *l).unwrap_or_else(|e| *e.into_inner())
    }

    /// The connection slots, one taken before each accept.
    pub(crate) fn slots(&self) -> Arc<Semaphore> {
        self.0.slots.clone()
    }

    /// Notes the connections held now (after an accept), for [`Bounds::peak_connections`].
    pub(crate) fn note_connections(&self) {
        let total = self.limits().connections.min(Semaphore::MAX_PERMITS);
        let held = total.saturating_sub(self.0.slots.available_permits());
        self.0.peak.fetch_max(held, Ordering::Relaxed);
    }

    /// The most connections the store has held at once.
    pub fn peak_connections(&self) -> usize {
        self.0.peak.load(Ordering::Relaxed)
    }
}

impl Default for Bounds {
    fn default() -> Bounds {
        Bounds::new(Limits::default())
    }
}

/// Raises this process's open-file limit to its hard limit (node 0 holds a connection per
/// rank and three per node) and returns the soft limit now in force.
pub fn raise_nofile() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(e) => {
                tracing::warn!("cannot raise the open-file limit from {soft} to {hard}: {e}");
                soft
            }
        },
        Ok((soft, _)) => soft,
        Err(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_grow_with_the_run_and_never_shrink() {
        let b = Bounds::default();
        let small = b.limits();
        assert!(small.connections >= 4096 && small.keys >= 100_000);
        let big = Limits::for_run(2048, 16_384);
        assert!(big.connections >= 16_384 + 3 * 2048, "{big:?}");
        assert!(big.keys >= 16_384 * KEYS_PER_RANK);
        b.grow(big);
        assert_eq!(b.limits(), big);
        assert_eq!(b.slots().available_permits(), big.connections);
        b.grow(small);
        assert_eq!(b.limits(), big, "a smaller run does not shrink the bounds");
        assert_eq!(b.slots().available_permits(), big.connections);
        // Sizes from outside never overflow.
        let huge = Limits::for_run(usize::MAX, usize::MAX);
        assert_eq!((huge.connections, huge.keys, huge.bytes), (usize::MAX, usize::MAX, usize::MAX));
    }
}
