//! The decisions of `rdma-ports`: from the ports at the start and at the end of the span, what
//! is wrong with each port. Pure functions of the two snapshots and the expected rate.

use gpusanity_common::checks::rdma_ports::{ERRORS, FLAPPED, PORT_DOWN, RATE_LOW};
use gpusanity_common::report::{Code, Severity};

use super::sysfs::{Port, ERROR_COUNTERS, FLAP_COUNTERS};

/// One thing wrong with one port (the type the report carries).
pub use gpusanity_common::detail::PortIssue as Issue;

/// What the rate of `port` is compared with: `configured` Gb/s, or else the fastest active
/// port of the same link layer among `ports`.
pub fn expected_rate(port: &Port, ports: &[Port], configured: Option<u64>) -> Option<(f64, String)> {
    if let Some(r) = configured {
        return Some((r as f64, "the configured rate".into()));
    }
    let best = ports
        .iter()
        .filter(|p| p.is_up() && p.link_layer == port.link_layer)
        .filter_map(|p| p.rate_gbps)
        .fold(None, |m: Option<f64>, r| Some(m.map_or(r, |m| m.max(r))))?;
    let layer = if port.link_layer.is_empty() { "RDMA" } else { port.link_layer.as_str() };
    Some((best, format!("the fastest {layer} port of this node")))
}

/// How much each counter of `names` grew from `start` to `end` (counters that shrank were
/// reset and are left out).
fn deltas(start: &Port, end: &Port, names: &[&str]) -> Vec<(String, u64)> {
    names
        .iter()
        .filter_map(|c| {
            let (a, b) = (start.counters.get(*c)?, end.counters.get(*c)?);
            b.checked_sub(*a).filter(|d| *d > 0).map(|d| (c.to_string(), d))
        })
        .collect()
}

fn list(d: &[(String, u64)]) -> String {
    d.iter().map(|(c, v)| format!("{c} +{v}")).collect::<Vec<_>>().join(", ")
}

/// Everything wrong with the ports: `start` at the start of the span, `end` at its end,
/// `span` the span in words ("since the worker started, 12.3 s").
pub fn judge(start: &[Port], end: &[Port], configured_rate: Option<u64>, span: &str) -> Vec<Issue> {
    let mut out = Vec::new();
    let issue = |code: Code, severity, port: &Port, message: String, deltas| Issue {
        code,
        severity,
        port: port.name(),
        message,
        deltas,
    };
    for p in end {
        if !p.is_up() {
            let msg = format!(
                "{}: state {}, physical state {} (expected ACTIVE and LinkUp)",
                p.name(),
                or_unknown(&p.state),
                or_unknown(&p.phys_state)
            );
            out.push(issue(PORT_DOWN, Severity::Critical, p, msg, Vec::new()));
        } else if let (Some(rate), Some((want, why))) = (p.rate_gbps, expected_rate(p, end, configured_rate)) {
            if rate < want {
                let msg = format!("{}: {} ({rate} Gb/s), below {why}: {want} Gb/s", p.name(), p.rate);
                out.push(issue(RATE_LOW, Severity::Critical, p, msg, Vec::new()));
            }
        }
        let Some(s) = start.iter().find(|s| s.device == p.device && s.port == p.port) else { continue };
        let flaps = deltas(s, p, &FLAP_COUNTERS);
        if !flaps.is_empty() {
            let msg = format!("{} flapped {span}: {}", p.name(), list(&flaps));
            out.push(issue(FLAPPED, Severity::Critical, p, msg, flaps));
        }
        let errors = deltas(s, p, &ERROR_COUNTERS);
        if !errors.is_empty() {
            let msg = format!("{} counted errors {span}: {}", p.name(), list(&errors));
            out.push(issue(ERRORS, Severity::Warning, p, msg, errors));
        }
    }
    for s in start.iter().filter(|s| !end.iter().any(|p| p.device == s.device && p.port == s.port)) {
        out.push(issue(PORT_DOWN, Severity::Critical, s, format!("{} disappeared {span}", s.name()), Vec::new()));
    }
    out
}

fn or_unknown(s: &str) -> &str {
    if s.is_empty() {
        "unknown"
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn port(dev: &str, state: &str, rate: f64, counters: &[(&str, u64)]) -> Port {
        Port {
            device: dev.into(),
            port: "1".into(),
            state: state.into(),
            phys_state: if state == "ACTIVE" { "LinkUp".into() } else { "Polling".into() },
            rate: format!("{rate} Gb/sec"),
            rate_gbps: Some(rate),
            link_layer: "InfiniBand".into(),
            counters: counters.iter().map(|(c, v)| (c.to_string(), *v)).collect::<BTreeMap<_, _>>(),
        }
    }

    fn codes(v: &[Issue]) -> Vec<(Code, &str)> {
        v.iter().map(|i| (i.code, i.port.as_str())).collect()
    }

    #[test]
    fn healthy_ports_pass_and_each_fault_is_named_on_its_port() {
        let zero = [("link_downed", 0), ("symbol_error", 5)];
        let healthy = vec![port("mlx5_0", "ACTIVE", 400.0, &zero), port("mlx5_1", "ACTIVE", 400.0, &zero)];
        assert!(judge(&healthy, &healthy, None, "").is_empty());

        // Down, slow against the fastest sibling, flapped, errors: each named.
        let end = vec![
            port("mlx5_0", "DOWN", 400.0, &zero),
            port("mlx5_1", "ACTIVE", 200.0, &zero),
            port("mlx5_2", "ACTIVE", 400.0, &[("link_downed", 2), ("symbol_error", 5)]),
            port("mlx5_3", "ACTIVE", 400.0, &[("link_downed", 0), ("symbol_error", 9)]),
        ];
        let mut start = end.clone();
        for p in &mut start {
            p.counters = zero.iter().map(|(c, v)| (c.to_string(), *v)).collect();
        }
        let got = judge(&start, &end, None, "during the check");
        assert_eq!(
            codes(&got),
            [
                (PORT_DOWN, "mlx5_0 port 1"),
                (RATE_LOW, "mlx5_1 port 1"),
                (FLAPPED, "mlx5_2 port 1"),
                (ERRORS, "mlx5_3 port 1")
            ]
        );
        assert_eq!(got[2].deltas, [("link_downed".to_string(), 2)]);
        assert_eq!(got[2].severity, Severity::Critical);
        assert_eq!(got[3].severity, Severity::Warning);
        assert!(got[1].message.contains("the fastest InfiniBand port"), "{}", got[1].message);

        // A configured rate judges even the fastest port; a counter reset is no delta.
        let one = vec![port("mlx5_0", "ACTIVE", 200.0, &[("link_downed", 0)])];
        assert_eq!(codes(&judge(&one, &one, Some(400), "")), [(RATE_LOW, "mlx5_0 port 1")]);
        let reset = vec![port("mlx5_0", "ACTIVE", 200.0, &[("link_downed", 7)])];
        assert!(judge(&reset, &one, None, "").is_empty());
        // A port that vanished is down.
        assert_eq!(codes(&judge(&healthy, &healthy[..1], None, "")), [(PORT_DOWN, "mlx5_1 port 1")]);
        // Ethernet ports are compared with Ethernet ports only.
        let mut eth = port("mlx5_9", "ACTIVE", 100.0, &[]);
        eth.link_layer = "Ethernet".into();
        let mixed = vec![healthy[0].clone(), eth];
        assert!(judge(&mixed, &mixed, None, "").is_empty());
    }
}
