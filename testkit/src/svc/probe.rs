//! Looking at a running world from outside: whether its service is alive, `/ready`, plain-text
//! HTTP answers (`/metrics`).

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::World;

impl World {
    /// Whether the process `name` of this world is still running.
    pub fn alive(&mut self, name: &str) -> bool {
        self.children.iter_mut().find(|(n, _)| n == name).is_some_and(|(_, c)| matches!(c.try_wait(), Ok(None)))
    }

    /// Waits until `GET /ready` answers `status`; its body.
    pub fn wait_ready(&self, status: u16, limit: Duration) -> Value {
        let start = Instant::now();
        loop {
            if let Ok((s, body)) = self.http_call("GET", "/ready", None, None) {
                if s == status {
                    return body;
                }
            }
            assert!(start.elapsed() < limit, "/ready never answered {status}; the log:\n{}", self.log("serve"));
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until the log of process `name` satisfies `pred`; the log.
    pub fn wait_log(&self, name: &str, limit: Duration, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let log = self.log(name);
            if pred(&log) {
                return log;
            }
            assert!(start.elapsed() < limit, "the log of {name} never showed {what} within {limit:?}:\n{log}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `GET path` with the admin token: (status, body as text).
    pub fn http_text(&self, path: &str, token: Option<&str>) -> std::io::Result<(u16, String)> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.http))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
        write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{auth}\r\n")?;
        let mut resp = String::new();
        s.read_to_string(&mut resp)?;
        let status = resp.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        Ok((status, resp.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()))
    }
}
