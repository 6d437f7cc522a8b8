//! Helpers for the notification tests: an HTTP receiver for webhooks (plain threads on a
//! loopback port: answers 200, fails its first N requests with 500, answers one fixed status,
//! or accepts and never answers), a real SMTP server (scripts/smtp_sink.py), the [notifier]
//! section of a world's configuration, and reading the service's delivery log.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{World, LOOPBACK_ALLOW, TOKEN};

#[derive(Debug, Clone, Copy)]
pub enum Mode {
    Ok,
    /// 500 for the first N requests, then 200.
    FailFirst(usize),
    /// Always this status.
    Status(u16),
    /// Reads the request and never answers.
    Hang,
    /// Always this status with this body.
    Body(u16, &'static str),
}

#[derive(Debug, Clone)]
pub struct Request {
    pub path: String,
    /// What followed `?` in the request target.
    pub query: String,
    /// Lower-case names.
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
    /// The status it was answered with (None: never answered).
    pub answered: Option<u16>,
    pub at: Instant,
}

impl Request {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("webhook body is not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> &str {
        self.headers.get(&name.to_ascii_lowercase()).map(String::as_str).unwrap_or("")
    }
}

/// A webhook receiver on 127.0.0.1; it runs until the test binary exits.
#[derive(Clone)]
pub struct Receiver {
    pub port: u16,
    log: Arc<Mutex<Vec<Request>>>,
}

impl Receiver {
    /// Listens on `port` (a free one when None).
    pub fn start(port: Option<u16>, mode: Mode) -> Receiver {
        let listener = TcpListener::bind(("127.0.0.1", port.unwrap_or(0))).expect("bind the receiver");
        let port = listener.local_addr().expect("addr").port();
        let log: Arc<Mutex<Vec<Request>>> = Arc::default();
        let l = log.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let l = l.clone();
                std::thread::spawn(move || serve(conn, mode, &l));
            }
        });
        Receiver { port, log }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn requests(&self) -> Vec<Request> {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    pub fn on(&self, path: &str) -> Vec<Request> {
        self.requests().into_iter().filter(|r| r.path == path).collect()
    }

    /// Waits until `n` requests came in and 2 s more (a late duplicate would come by then);
    /// asserts that they carry `n` idempotency keys, each once, and returns `n`.
    pub fn once_each(&self, n: usize, limit: Duration) -> usize {
        let got = self.wait_for(n, limit);
        std::thread::sleep(Duration::from_secs(2));
        let mut keys: HashMap<String, usize> = HashMap::new();
        for r in self.requests() {
            *keys.entry(r.header("idempotency-key").to_string()).or_default() += 1;
        }
        assert_eq!(keys.len(), n, "{got:#?}");
        assert!(keys.values().all(|&k| k == 1), "a notification arrived twice: {keys:?}");
        keys.len()
    }

    /// Waits until `n` requests came in; all of them.
    pub fn wait_for(&self, n: usize, limit: Duration) -> Vec<Request> {
        let deadline = Instant::now() + limit;
        loop {
            let r = self.requests();
            if r.len() >= n {
                return r;
            }
            assert!(
                Instant::now() < deadline,
                "receiver :{} got {} of {n} requests in {limit:?}: {r:#?}",
                self.port,
                r.len()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn serve(conn: TcpStream, mode: Mode, log: &Mutex<Vec<Request>>) {
    let Ok(mut writer) = conn.try_clone() else {
        return;
    };
    let mut r = BufReader::new(conn);
    let mut line = String::new();
    if r.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let target = line.split_whitespace().nth(1).unwrap_or("");
    let (path, query) = target
        .split_once('?')
        .map(|(p, q)| (p.to_string(), q.to_string()))
        .unwrap_or((target.to_string(), String::new()));
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let len: usize = headers.get("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut body = vec![0; len];
    if r.read_exact(&mut body).is_err() {
        return;
    }
    let mut l = log.lock().unwrap_or_else(|e| e.into_inner());
    let status = match mode {
        Mode::Ok => Some(200),
        Mode::FailFirst(n) => Some(if l.len() < n { 500 } else { 200 }),
        Mode::Status(s) => Some(s),
        Mode::Hang => None,
        Mode::Body(s, _) => Some(s),
    };
    l.push(Request { path, query, headers, body, answered: status, at: Instant::now() });
    drop(l);
    let answer = match mode {
        Mode::Body(_, b) => b,
        _ => "ok",
    };
    match status {
        Some(s) => {
            let _ = write!(
                writer,
                "HTTP/1.1 {s} X\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                answer.len()
            );
        }
        None => std::thread::sleep(Duration::from_secs(600)),
    }
}

/// A loopback port with nothing listening (connections are refused).
pub fn refused_port() -> u16 {
    super::common::free_port()
}

impl World {
    /// Adds TOML lines to the [notifier] section of the configuration (which allows loopback
    /// webhooks unless `toml` sets `webhook_allow` itself); call before `serve`.
    pub fn notifier(&self, toml: &str) {
        let mut text = std::fs::read_to_string(&self.config).expect("config");
        assert!(text.ends_with(&format!("[notifier]\n{LOOPBACK_ALLOW}\n")), "[notifier] is not last:\n{text}");
        if toml.contains("webhook_allow") {
            text = text.replace(&format!("{LOOPBACK_ALLOW}\n"), "");
        }
        // World::new writes [notifier] last: lines appended belong to it.
        text.push_str(&format!("{toml}\n"));
        std::fs::write(&self.config, text).expect("config");
    }

    /// Replaces `from` by `to` in the configuration file (between restarts).
    pub fn edit_config(&self, from: &str, to: &str) {
        let text = std::fs::read_to_string(&self.config).expect("config");
        assert!(text.contains(from), "`{from}` is not in the config:\n{text}");
        std::fs::write(&self.config, text.replace(from, to)).expect("config");
    }

    /// Creates a rule in `ws` through the API; its id.
    pub fn rule(&self, ws: &str, rule: Value) -> String {
        let (code, body) = self
            .http_call("POST", &format!("/v1/workspaces/{ws}/notification-rules"), Some(TOKEN), Some(&rule.to_string()))
            .expect("POST rule");
        assert_eq!(code, 201, "{body:#}");
        body["rule_id"].as_str().expect("rule_id").to_string()
    }

    /// The delivery log of `ws`.
    pub fn deliveries(&self, ws: &str) -> Vec<Value> {
        let (code, body) = self
            .http_call("GET", &format!("/v1/workspaces/{ws}/deliveries?limit=1000"), Some(TOKEN), None)
            .expect("GET deliveries");
        assert_eq!(code, 200, "{body:#}");
        body["deliveries"].as_array().cloned().unwrap_or_default()
    }

    /// Waits until `pred` holds for the delivery log of `ws`.
    pub fn wait_deliveries(
        &self,
        ws: &str,
        limit: Duration,
        what: &str,
        pred: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        let deadline = Instant::now() + limit;
        loop {
            let d = self.deliveries(ws);
            if pred(&d) {
                return d;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {limit:?}; deliveries: {d:#?}\nservice log:\n{}",
                self.log("serve")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A real SMTP server (aiosmtpd) on a free loopback port; stopped when dropped.
pub struct Smtp {
    pub port: u16,
    pub dir: PathBuf,
    child: Child,
}

impl Smtp {
    /// STARTTLS required, login `user`/`password`; messages land in `dir` as msg-N.json.
    pub fn start(dir: &Path, user: &str, password: &str) -> Smtp {
        Smtp::start_on(super::common::free_port(), dir, user, password)
    }

    /// On `port`; a second server on the same `dir` keeps the first one's certificate.
    pub fn start_on(port: u16, dir: &Path, user: &str, password: &str) -> Smtp {
        let script = crate::repo().join("scripts/smtp_sink.py");
        std::fs::create_dir_all(dir).expect("SMTP dir");
        let log = std::fs::File::create(dir.join("smtp.log")).expect("SMTP log");
        let mut child = Command::new("python3")
            .arg(script)
            .args(["--port", &port.to_string(), "--dir"])
            .arg(dir)
            .args(["--require-tls", "--user", user, "--password", password])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("python3 scripts/smtp_sink.py (python3 -m pip install aiosmtpd)");
        let out = child.stdout.take().expect("stdout");
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        if !line.starts_with("SMTP_READY") {
            let _ = child.kill();
            let _ = child.wait();
            let err = std::fs::read_to_string(dir.join("smtp.log")).unwrap_or_default();
            panic!("the SMTP server did not start (is aiosmtpd installed? python3 -m pip install aiosmtpd): {line:?} {err}");
        }
        Smtp { port, dir: dir.to_path_buf(), child }
    }

    pub fn cert(&self) -> PathBuf {
        self.dir.join("cert.pem")
    }

    /// The stored messages, in arrival order.
    pub fn messages(&self) -> Vec<Value> {
        let mut v = Vec::new();
        for n in 1.. {
            match std::fs::read_to_string(self.dir.join(format!("msg-{n}.json"))) {
                Ok(t) => v.push(serde_json::from_str(&t).expect("msg json")),
                Err(_) => break,
            }
        }
        v
    }

    pub fn wait_for(&self, n: usize, limit: Duration) -> Vec<Value> {
        let deadline = Instant::now() + limit;
        loop {
            let m = self.messages();
            if m.len() >= n {
                return m;
            }
            assert!(Instant::now() < deadline, "the SMTP server got {} of {n} messages in {limit:?}", m.len());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Smtp {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

/// A MIME message split into its header (unfolded, names lower-case) and its raw body.
pub fn mime(raw: &str) -> (HashMap<String, String>, String) {
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((raw, ""));
    let unfolded = head.replace("\r\n ", " ").replace("\r\n\t", " ");
    let headers = unfolded
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (headers, body.to_string())
}

/// The parts of a multipart body, each as (headers, decoded text).
pub fn parts(content_type: &str, body: &str) -> Vec<(HashMap<String, String>, String)> {
    let boundary = content_type.split("boundary=").nth(1).expect("boundary").trim_matches('"').to_string();
    body.split(&format!("--{boundary}"))
        .skip(1)
        .filter(|p| !p.starts_with("--"))
        .map(|p| {
            let (h, b) = mime(p.trim_start_matches("\r\n"));
            let text = match h.get("content-transfer-encoding").map(String::as_str) {
                Some("quoted-printable") => quoted_printable(&b),
                Some("base64") => panic!("an ASCII body came base64-encoded"),
                _ => b,
            };
            (h, text)
        })
        .collect()
}

/// Decodes quoted-printable (RFC 2045 §6.7).
pub fn quoted_printable(s: &str) -> String {
    let s = s.replace("=\r\n", "");
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'=' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
