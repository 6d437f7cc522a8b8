//! Reading the RDMA ports under /sys/class/infiniband: `DEV/ports/N/{state, phys_state, rate,
//! link_layer}` and the error counters of `DEV/ports/N/counters/`.

use std::io::Read;
use std::path::Path;
use std::time::Instant;

/// Where the kernel lists RDMA devices.
pub const SYSFS_ROOT: &str = "/sys/class/infiniband";

/// The counters read at both ends of the span. `link_downed` and `link_error_recovery` count
/// the link going down and retraining: the port flapped.
pub const FLAP_COUNTERS: [&str; 2] = ["link_downed", "link_error_recovery"];
/// Counters of errors on a link that stayed up.
pub const ERROR_COUNTERS: [&str; 3] = ["symbol_error", "port_rcv_errors", "excessive_buffer_overrun_errors"];

/// At most this many devices and ports per device are read (a node has a few dozen at most).
const MAX_ENTRIES: usize = 256;
/// At most this many bytes of one attribute file are read.
const MAX_FILE: u64 = 256;

/// One RDMA port (the type the report carries).
pub use gpusanity_common::detail::RdmaPort as Port;

/// Every port at one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub at: Instant,
    pub ports: Vec<Port>,
}

impl Snapshot {
    pub fn take(root: &Path) -> Snapshot {
        Snapshot { at: Instant::now(), ports: read(root) }
    }
}

/// The trimmed text of `path` (its first [`MAX_FILE`] bytes); empty where it cannot be read.
fn attr(path: &Path) -> String {
    let mut text = String::new();
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.take(MAX_FILE).read_to_string(&mut text);
    }
    text.trim().to_string()
}

/// `4: ACTIVE` -> `ACTIVE`.
fn after_colon(s: &str) -> String {
    s.split_once(':').map_or(s, |(_, v)| v.trim()).to_string()
}

/// `400 Gb/sec (4X NDR)` -> 400.
pub fn parse_rate(s: &str) -> Option<f64> {
    let first = s.split_whitespace().next()?;
    first.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0)
}

fn names(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut v: Vec<String> = entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v.truncate(MAX_ENTRIES);
    v
}

/// Every port under `root`, sorted by device and port; empty where there is none.
pub fn read(root: &Path) -> Vec<Port> {
    let mut out = Vec::new();
    for device in names(root) {
        let ports = root.join(&device).join("ports");
        for port in names(&ports) {
            let dir = ports.join(&port);
            let rate = attr(&dir.join("rate"));
            let counters = FLAP_COUNTERS
                .iter()
                .chain(ERROR_COUNTERS.iter())
                .filter_map(|c| attr(&dir.join("counters").join(c)).parse::<u64>().ok().map(|v| (c.to_string(), v)))
                .collect();
            out.push(Port {
                device: device.clone(),
                port,
                state: after_colon(&attr(&dir.join("state"))),
                phys_state: after_colon(&attr(&dir.join("phys_state"))),
                rate_gbps: parse_rate(&rate),
                rate,
                link_layer: attr(&dir.join("link_layer")),
                counters,
            });
        }
    }
    out
}

/// Writes a fake port under `root` (tests).
#[cfg(test)]
pub fn fake_port(root: &Path, device: &str, port: &str, state: &str, phys: &str, rate: &str, counters: &[(&str, u64)]) {
    let d = root.join(device).join("ports").join(port);
    std::fs::create_dir_all(d.join("counters")).unwrap();
    std::fs::write(d.join("state"), format!("{state}\n")).unwrap();
    std::fs::write(d.join("phys_state"), format!("{phys}\n")).unwrap();
    std::fs::write(d.join("rate"), format!("{rate}\n")).unwrap();
    std::fs::write(d.join("link_layer"), "InfiniBand\n").unwrap();
    for (c, v) in counters {
        std::fs::write(d.join("counters").join(c), format!("{v}\n")).unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_read_with_their_states_rates_and_counters() {
        let root = tempfile::tempdir().unwrap();
        fake_port(root.path(), "mlx5_1", "1", "1: DOWN", "2: Polling", "10 Gb/sec (4X SDR)", &[("link_downed", 3)]);
        fake_port(root.path(), "mlx5_0", "1", "4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)", &[("symbol_error", 0)]);
        std::fs::write(root.path().join("mlx5_0/ports/1/counters/port_rcv_errors"), "N/A\n").unwrap();
        let ports = read(root.path());
        assert_eq!(ports.len(), 2);
        assert_eq!((ports[0].name().as_str(), ports[0].is_up()), ("mlx5_0 port 1", true));
        assert_eq!(ports[0].rate_gbps, Some(400.0));
        assert_eq!(ports[0].link_layer, "InfiniBand");
        assert_eq!(ports[0].counters.len(), 1, "an unreadable counter is left out");
        assert_eq!((ports[1].state.as_str(), ports[1].phys_state.as_str()), ("DOWN", "Polling"));
        assert_eq!(ports[1].counters["link_downed"], 3);
        assert!(read(&root.path().join("absent")).is_empty());
        assert_eq!(parse_rate("garbage"), None);
        assert_eq!(parse_rate("2.5 Gb/sec (1X SDR)"), Some(2.5));
    }
}
