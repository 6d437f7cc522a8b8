//! Between a node's agent and the launcher it starts (`gpusanity check`): the range node 0's
//! rendezvous port is taken from (`--master-port-range`), and what the launcher tells its
//! parent on stdout, one JSON object on a line of its own ([`LauncherNotice`]). The launcher
//! is the agent's own binary: these carry no wire version.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A launcher's message to the process that started it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "gpusanity_notice", rename_all = "snake_case", deny_unknown_fields)]
pub enum LauncherNotice {
    /// Node 0 listens for the rendezvous on `port` (and keeps listening until it ends).
    RendezvousBound { port: u16 },
}

impl LauncherNotice {
    /// The notice as the one line it travels as.
    pub fn line(&self) -> String {
        // A struct of one integer always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The notice on `line`, if the line is one (any other output of the launcher is not).
    pub fn parse(line: &str) -> Option<LauncherNotice> {
        let line = line.trim();
        if !line.starts_with("{\"gpusanity_notice\"") {
            return None;
        }
        serde_json::from_str(line).ok()
    }
}

/// Ports `first..=last` (a single port when both are the same), none of them 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    first: u16,
    last: u16,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum PortRangeError {
    #[error("`{0}` is not a port range: expected PORT or FIRST-LAST, e.g. 29500-29599")]
    Syntax(String),
    #[error("port range {0}-{1}: ports run from 1 to 65535, the first not above the last")]
    Bounds(u16, u16),
}

impl PortRange {
    pub fn new(first: u16, last: u16) -> Result<PortRange, PortRangeError> {
        if first == 0 || first > last {
            return Err(PortRangeError::Bounds(first, last));
        }
        Ok(PortRange { first, last })
    }

    pub fn ports(self) -> std::ops::RangeInclusive<u16> {
        self.first..=self.last
    }
}

impl FromStr for PortRange {
    type Err = PortRangeError;

    fn from_str(s: &str) -> Result<PortRange, PortRangeError> {
        let syntax = || PortRangeError::Syntax(s.chars().take(64).collect());
        let port = |p: &str| p.trim().parse::<u16>().map_err(|_| syntax());
        match s.split_once('-') {
            Some((a, b)) => PortRange::new(port(a)?, port(b)?),
            None => {
                let p = port(s)?;
                PortRange::new(p, p)
            }
        }
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_is_one_line_and_other_output_is_not_one() {
        let n = LauncherNotice::RendezvousBound { port: 29501 };
        assert_eq!(n.line(), r#"{"gpusanity_notice":"rendezvous_bound","port":29501}"#);
        assert_eq!(LauncherNotice::parse(&format!("{}\n", n.line())), Some(n));
        for other in ["", "gpusanity: checking", r#"{"port":1}"#, r#"{"gpusanity_notice":"rendezvous_bound"}"#] {
            assert_eq!(LauncherNotice::parse(other), None, "{other}");
        }
        assert_eq!(LauncherNotice::parse(r#"{"gpusanity_notice":"rendezvous_bound","port":70000}"#), None);
    }

    #[test]
    fn port_ranges_are_parsed_and_bounded() {
        assert_eq!("29500-29599".parse::<PortRange>().unwrap().ports(), 29500..=29599);
        assert_eq!("29500".parse::<PortRange>().unwrap().ports(), 29500..=29500);
        assert_eq!("29500-29599".parse::<PortRange>().unwrap().to_string(), "29500-29599");
        assert_eq!("0-10".parse::<PortRange>(), Err(PortRangeError::Bounds(0, 10)));
        assert_eq!("10-9".parse::<PortRange>(), Err(PortRangeError::Bounds(10, 9)));
        for bad in ["", "-", "a-b", "1-70000", "1-2-3", "29500-"] {
            assert!(matches!(bad.parse::<PortRange>(), Err(PortRangeError::Syntax(_))), "{bad}");
        }
    }
}
