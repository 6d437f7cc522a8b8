//! Expected figures of healthy devices per model (common/data/expected.toml, embedded at build
//! time), each with its source, the warn and critical bands, and where a figure falls in them.

use serde::Deserialize;

use crate::kinds::{Link, Severity};
use crate::registry::CheckId;

const DATA: &str = include_str!("../data/expected.toml");

#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct Bands {
    /// Below `warn` x expected: a warning.
    pub warn: f64,
    /// Below `critical` x expected: a critical finding.
    pub critical: f64,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Entry {
    /// A substring of the device name, e.g. `H200`.
    pub device: String,
    /// Name parts of other variants of the model that this figure does not hold for.
    #[serde(default)]
    pub exclude: Vec<String>,
    pub check: CheckId,
    pub metric: String,
    pub value: f64,
    /// The GEMM size the figure holds for.
    #[serde(default)]
    pub size: Option<u64>,
    /// The largest all-reduce message the figure holds for.
    #[serde(default)]
    pub max_bytes: Option<u64>,
    /// Holds only when every rank sits on one node.
    #[serde(default)]
    pub single_node: bool,
    /// Holds only with this many ranks (GPUs) on every node: a collective's bus bandwidth
    /// depends on how many GPUs share the links.
    #[serde(default)]
    pub ranks_per_node: Option<usize>,
    /// Holds only when the node's GPUs are linked so (NVLink or PCIe, read from the device).
    #[serde(default)]
    pub link: Option<Link>,
    pub source: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Expected {
    pub bands: Bands,
    #[serde(rename = "entry")]
    pub entries: Vec<Entry>,
}

/// What a run's configuration and topology look like, to pick the entries that hold for it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Conditions {
    pub size: Option<u64>,
    pub max_bytes: Option<u64>,
    /// How many nodes the run has (0: unknown).
    pub nodes: usize,
    /// How many ranks every node has, when every node has the same number.
    pub ranks_per_node: Option<usize>,
    /// How the GPUs are linked, when every rank reported the same.
    pub link: Option<Link>,
}

impl Conditions {
    /// The facts an expected figure depends on: from a check's config as reported (`size`,
    /// `max_bytes`) and from the topology, `node_sizes[k]` being node k's number of ranks.
    pub fn from_config(config: &serde_json::Value, node_sizes: &[usize]) -> Conditions {
        let u = |k: &str| config.get(k).and_then(serde_json::Value::as_u64);
        let ranks_per_node = node_sizes.first().copied().filter(|n| node_sizes.iter().all(|m| m == n));
        Conditions { size: u("size"), max_bytes: u("max_bytes"), nodes: node_sizes.len(), ranks_per_node, link: None }
    }

    /// The same conditions with the GPUs' link known (or not).
    pub fn with_link(self, link: Option<Link>) -> Conditions {
        Conditions { link, ..self }
    }

    /// The topology in words, for the report: "1 node of 2 ranks".
    pub fn topology(&self) -> String {
        let nodes = if self.nodes == 1 { "1 node".to_string() } else { format!("{} nodes", self.nodes) };
        let shape = match self.ranks_per_node {
            Some(1) => format!("{nodes} of 1 rank"),
            Some(k) => format!("{nodes} of {k} ranks"),
            None => format!("{nodes} of unequal sizes"),
        };
        match self.link {
            Some(l) if self.ranks_per_node != Some(1) => format!("{shape} over {}", l.as_str()),
            _ => shape,
        }
    }
}

impl Expected {
    /// The embedded table. The file is part of the build, so a malformed one fails the tests.
    pub fn builtin() -> &'static Expected {
        static TABLE: std::sync::OnceLock<Expected> = std::sync::OnceLock::new();
        TABLE.get_or_init(|| {
            Expected::parse(DATA)
                .unwrap_or_else(|_| Expected { bands: Bands { warn: 0.9, critical: 0.75 }, entries: Vec::new() })
        })
    }

    pub fn parse(text: &str) -> Result<Expected, toml::de::Error> {
        toml::from_str(text)
    }

    /// The entry for `device`'s `check.metric` that holds under `when`, if any.
    pub fn lookup(&self, device: &str, check: CheckId, metric: &str, when: Conditions) -> Option<&Entry> {
        self.entries.iter().find(|e| {
            device.contains(&e.device)
                && !e.exclude.iter().any(|x| device.contains(x.as_str()))
                && e.check == check
                && e.metric == metric
                && (e.size.is_none() || e.size == when.size)
                && (e.max_bytes.is_none() || e.max_bytes == when.max_bytes)
                && (!e.single_node || when.nodes == 1)
                && (e.ranks_per_node.is_none() || e.ranks_per_node == when.ranks_per_node)
                && (e.link.is_none() || e.link == when.link)
        })
    }
}

/// The expected figure for `device`'s `check.metric` under `when`, and where `value` (higher
/// is better) falls: below `critical` x expected critical, below `warn` x expected a warning.
/// None when the table has no figure for this device and configuration (CPUs never do).
pub fn judge(
    device: &str,
    check: CheckId,
    metric: &str,
    when: Conditions,
    value: f64,
) -> Option<(f64, Option<Severity>)> {
    let table = Expected::builtin();
    let e = table.lookup(device, check, metric, when)?.value;
    let sev = if value < table.bands.critical * e {
        Some(Severity::Critical)
    } else if value < table.bands.warn * e {
        Some(Severity::Warning)
    } else {
        None
    };
    Some((e, sev))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_table_parses_and_names_its_sources() {
        let t = Expected::parse(DATA).expect("expected.toml parses");
        assert!(t.bands.critical < t.bands.warn && t.bands.warn < 1.0);
        for model in ["H100", "H200", "A100"] {
            for check in [CheckId::Gemm, CheckId::AllReduce] {
                assert!(t.entries.iter().any(|e| e.device == model && e.check == check), "{model} {check}");
            }
        }
        assert!(t.entries.iter().all(|e| e.value > 0.0 && !e.source.is_empty()));
    }

    #[test]
    fn entries_hold_only_for_their_configuration() {
        let t = Expected::builtin();
        let gemm = Conditions { size: Some(8192), ..Default::default() };
        assert_eq!(t.lookup("NVIDIA H200", CheckId::Gemm, "tflops", gemm).map(|e| e.value), Some(690.0));
        assert!(t
            .lookup("NVIDIA H200", CheckId::Gemm, "tflops", Conditions { size: Some(4096), ..Default::default() })
            .is_none());
        assert!(t.lookup("AMD EPYC 7B13", CheckId::Gemm, "tflops", gemm).is_none());
        assert!(t.lookup("NVIDIA H100 PCIe", CheckId::Gemm, "tflops", gemm).is_none(), "PCIe reaches less");
        assert!(t.lookup("NVIDIA H100 80GB HBM3", CheckId::Gemm, "tflops", gemm).is_some());
        let ar = Conditions { max_bytes: Some(1 << 30), ..Default::default() };
        assert!(
            t.lookup("NVIDIA H200", CheckId::AllReduce, "busbw_gbps", ar).is_none(),
            "multi-node: no NVLink figure"
        );
        let ar = Conditions { nodes: 1, ranks_per_node: Some(2), link: Some(Link::Nvlink), ..ar };
        assert_eq!(
            t.lookup("NVIDIA A100-SXM4-80GB", CheckId::AllReduce, "busbw_gbps", ar).map(|e| e.value),
            Some(220.0)
        );
        // A two-GPU NVLink figure holds neither for one GPU nor for eight.
        for k in [1, 8] {
            let other = Conditions { ranks_per_node: Some(k), ..ar };
            assert!(t.lookup("NVIDIA H200", CheckId::AllReduce, "busbw_gbps", other).is_none(), "{k} GPUs");
        }
        let one = Conditions::from_config(&serde_json::json!({"max_bytes": 1u64 << 30}), &[1]);
        assert_eq!((one.nodes, one.ranks_per_node, one.topology().as_str()), (1, Some(1), "1 node of 1 rank"));
        assert_eq!(Conditions::from_config(&serde_json::Value::Null, &[2, 1]).ranks_per_node, None);
        assert!(Expected::parse("[bands]\nwarn = 0.9\n").is_err());
        // Memory: only the H200 it was measured on, at the size it was measured with.
        let mem = Conditions { size: Some(4 << 30), ..Default::default() };
        assert_eq!(t.lookup("NVIDIA H200", CheckId::MemoryBandwidth, "gbps", mem).map(|e| e.value), Some(4200.0));
        for other in ["NVIDIA H100 80GB HBM3", "NVIDIA H200 NVL", "NVIDIA GH200 480GB"] {
            assert!(t.lookup(other, CheckId::MemoryBandwidth, "gbps", mem).is_none(), "{other}");
        }
        let small = Conditions { size: Some(1 << 20), ..Default::default() };
        assert!(t.lookup("NVIDIA H200", CheckId::MemoryBandwidth, "gbps", small).is_none());
        let host = Conditions { size: Some(256 << 20), ..Default::default() };
        for model in ["NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"] {
            assert_eq!(t.lookup(model, CheckId::HostBandwidth, "gbps", host).map(|e| e.value), Some(55.0), "{model}");
        }
        assert!(t.lookup("NVIDIA GH200 480GB", CheckId::HostBandwidth, "gbps", host).is_none());
    }

    #[test]
    fn bands_of_the_expected_figure() {
        let when = Conditions { size: Some(8192), ..Default::default() };
        assert_eq!(judge("NVIDIA H200", CheckId::Gemm, "tflops", when, 770.0), Some((690.0, None)));
        assert_eq!(judge("NVIDIA H200", CheckId::Gemm, "tflops", when, 600.0), Some((690.0, Some(Severity::Warning))));
        assert_eq!(judge("NVIDIA H200", CheckId::Gemm, "tflops", when, 400.0), Some((690.0, Some(Severity::Critical))));
        assert_eq!(judge("Intel(R) Xeon(R)", CheckId::Gemm, "tflops", when, 0.1), None);
    }

    #[test]
    fn a_collective_figure_holds_only_over_the_link_it_was_measured_on() {
        let t = Expected::builtin();
        let two = Conditions { max_bytes: Some(1 << 30), nodes: 1, ranks_per_node: Some(2), ..Default::default() };
        assert!(t.lookup("NVIDIA H200", CheckId::AllReduce, "busbw_gbps", two.with_link(Some(Link::Nvlink))).is_some());
        assert!(t.lookup("NVIDIA H200", CheckId::AllReduce, "busbw_gbps", two.with_link(Some(Link::Pcie))).is_none());
        assert!(t.lookup("NVIDIA H200", CheckId::AllReduce, "busbw_gbps", two).is_none(), "link unknown: peers only");
        assert_eq!(two.with_link(Some(Link::Nvlink)).topology(), "1 node of 2 ranks over NVLink");
    }
}
