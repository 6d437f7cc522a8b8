//! A GPU as a job event names it on a node (`gpu_ids`): a UUID as NVML and
//! `CUDA_VISIBLE_DEVICES` write it (`GPU-` and 32 hex digits in the 8-4-4-4-12 groups), a PCI
//! address (`0000:3b:00.0`), or an index in the node's PCI order (`3`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::config::health::MAX_GPUS_PER_NODE;

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GpuId {
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, lower case.
    Uuid(String),
    /// `0000:3b:00.0`: domain, bus, device and function, lower case.
    Pci(String),
    /// The GPU's place in the node's PCI order (`CUDA_DEVICE_ORDER=PCI_BUS_ID`).
    Index(u32),
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("`{shown}` is not a GPU: expected a UUID (GPU-8-4-4-4-12 hex digits), a PCI address (0000:3b:00.0) or an index below {MAX_GPUS_PER_NODE}")]
pub struct BadGpuId {
    /// The value, cut at 64 characters and escaped.
    pub shown: String,
}

impl GpuId {
    /// Which of the three forms, for "one form per node".
    pub fn form(&self) -> &'static str {
        match self {
            GpuId::Uuid(_) => "uuid",
            GpuId::Pci(_) => "pci",
            GpuId::Index(_) => "index",
        }
    }
}

/// Whether two runs' GPUs on one node may be the same GPUs: an empty list is the whole node;
/// lists of different forms cannot be compared without the node's device table, so they are
/// taken to overlap (the later run waits rather than risk two runs on one GPU).
pub fn may_share(a: &[GpuId], b: &[GpuId]) -> bool {
    match (a.first(), b.first()) {
        (None, _) | (_, None) => true,
        (Some(x), Some(y)) if x.form() != y.form() => true,
        _ => a.iter().any(|g| b.contains(g)),
    }
}

impl FromStr for GpuId {
    type Err = BadGpuId;

    fn from_str(s: &str) -> Result<GpuId, BadGpuId> {
        let bad = || BadGpuId { shown: s.chars().take(64).collect::<String>().escape_debug().to_string() };
        if s.is_empty() || s.len() > 64 {
            return Err(bad());
        }
        if let Some(hex) = s.strip_prefix("GPU-") {
            let groups: Vec<&str> = hex.split('-').collect();
            let sizes: Vec<usize> = groups.iter().map(|g| g.len()).collect();
            let ok = sizes == [8, 4, 4, 4, 12] && groups.iter().all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()));
            return if ok { Ok(GpuId::Uuid(format!("GPU-{}", hex.to_ascii_lowercase()))) } else { Err(bad()) };
        }
        if s.bytes().all(|b| b.is_ascii_digit()) {
            return match s.parse::<u32>() {
                Ok(i) if u64::from(i) < MAX_GPUS_PER_NODE && (s == "0" || !s.starts_with('0')) => Ok(GpuId::Index(i)),
                _ => Err(bad()),
            };
        }
        let (addr, function) = s.rsplit_once('.').ok_or_else(bad)?;
        let parts: Vec<&str> = addr.split(':').collect();
        let hex = |p: &str, n: usize| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit());
        let ok = matches!(parts.as_slice(), [d, b, v] if (hex(d, 4) || hex(d, 8)) && hex(b, 2) && hex(v, 2))
            && function.len() == 1
            && matches!(function.as_bytes()[0], b'0'..=b'7');
        if !ok {
            return Err(bad());
        }
        let domain = u32::from_str_radix(parts[0], 16).map_err(|_| bad())? & 0xffff;
        Ok(GpuId::Pci(format!("{domain:04x}:{}:{}.{function}", parts[1], parts[2]).to_ascii_lowercase()))
    }
}

impl fmt::Display for GpuId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuId::Uuid(u) => f.write_str(u),
            GpuId::Pci(p) => f.write_str(p),
            GpuId::Index(i) => write!(f, "{i}"),
        }
    }
}

impl Serialize for GpuId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GpuId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<GpuId, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_share_gpus_when_their_lists_meet_cover_the_node_or_cannot_be_compared() {
        let ids = |v: &[&str]| v.iter().map(|s| s.parse::<GpuId>().unwrap()).collect::<Vec<_>>();
        assert!(!may_share(&ids(&["0", "1", "2", "3"]), &ids(&["4", "5", "6", "7"])));
        assert!(may_share(&ids(&["0", "1"]), &ids(&["1", "2"])));
        assert!(may_share(&[], &ids(&["4"])));
        assert!(may_share(&ids(&["4"]), &[]));
        assert!(may_share(&ids(&["0"]), &ids(&["0000:3b:00.0"])));
        assert!(!may_share(&ids(&["0000:3b:00.0"]), &ids(&["0000:5d:00.0"])));
    }

    #[test]
    fn the_three_forms_parse_to_one_spelling_and_anything_else_is_refused() {
        let u: GpuId = "GPU-5CD893C3-E5FE-0DF3-682B-A88F611DAD99".parse().unwrap();
        assert_eq!(u.to_string(), "GPU-5cd893c3-e5fe-0df3-682b-a88f611dad99");
        assert_eq!("00000000:3B:00.0".parse::<GpuId>().unwrap(), GpuId::Pci("0000:3b:00.0".into()));
        assert_eq!("0000:3b:00.0".parse::<GpuId>().unwrap().form(), "pci");
        assert_eq!("7".parse::<GpuId>().unwrap(), GpuId::Index(7));
        assert_eq!("0".parse::<GpuId>().unwrap(), GpuId::Index(0));
        for bad in [
            "",
            "-1",
            "07",
            "1024",
            "99999999999",
            "GPU-",
            "GPU-5cd893c3",
            "GPU-zzd893c3-e5fe-0df3-682b-a88f611dad99",
            "0000:3b:00",
            "0000:3b:00.8",
            "3b:00.0",
            "0000:3b:000.0",
            "gpu0",
            "0,1",
            "MIG-abc",
            "../etc",
        ] {
            assert!(bad.parse::<GpuId>().is_err(), "{bad}");
        }
        let long = "9".repeat(10_000);
        assert!(long.parse::<GpuId>().unwrap_err().shown.len() <= 64 * 4);
        let json: Vec<GpuId> = serde_json::from_str(r#"["GPU-5cd893c3-e5fe-0df3-682b-a88f611dad99","3"]"#).unwrap();
        assert_eq!(serde_json::to_string(&json).unwrap(), r#"["GPU-5cd893c3-e5fe-0df3-682b-a88f611dad99","3"]"#);
        assert!(serde_json::from_str::<Vec<GpuId>>(r#"["nope"]"#).is_err());
    }
}
