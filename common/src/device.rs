//! The device a node checks on, as `gpusanity check --device` and `gpusanity agent --device`
//! take it: `auto` (CUDA when a GPU is usable, else the CPU), `cuda` or `cpu`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Which backend a node's checks run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceChoice {
    /// CUDA when a GPU is usable, else the CPU.
    #[default]
    Auto,
    Cuda,
    Cpu,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("unknown device `{0}`: expected auto, cuda or cpu")]
pub struct UnknownDevice(pub String);

impl DeviceChoice {
    /// The names, as the flags take them.
    pub const NAMES: [&'static str; 3] = ["auto", "cuda", "cpu"];

    pub fn as_str(self) -> &'static str {
        match self {
            DeviceChoice::Auto => "auto",
            DeviceChoice::Cuda => "cuda",
            DeviceChoice::Cpu => "cpu",
        }
    }
}

impl FromStr for DeviceChoice {
    type Err = UnknownDevice;

    fn from_str(s: &str) -> Result<DeviceChoice, UnknownDevice> {
        match s {
            "auto" => Ok(DeviceChoice::Auto),
            "cuda" => Ok(DeviceChoice::Cuda),
            "cpu" => Ok(DeviceChoice::Cpu),
            _ => Err(UnknownDevice(s.to_string())),
        }
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for name in DeviceChoice::NAMES {
            let d: DeviceChoice = name.parse().unwrap();
            assert_eq!(d.to_string(), name);
            assert_eq!(serde_json::to_string(&d).unwrap(), format!("\"{name}\""));
        }
        assert!("gpu".parse::<DeviceChoice>().is_err());
    }
}
