//! Replicas of `gpusanity serve` for the service benchmarks (bench/replicas_bench.rs,
//! bench/kube_isolation.rs): a configuration each on shared topics and a shared database,
//! started and waited for until ready, stopped when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The status of one GET without a token on `port` of loopback (None: no answer).
pub fn status(port: u16, method: &str, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    resp.split(' ').nth(1).and_then(|c| c.parse().ok())
}

/// `n` replicas of `gpusanity serve` under a temp folder named by `tag` (their logs stay there
/// while they run), ended by SIGTERM (then SIGKILL) when dropped.
pub struct Replicas {
    pub dir: PathBuf,
    children: Vec<Child>,
}

impl Replicas {
    /// Starts `n` replicas of `bin` on broker `boot` (topics `TAG.*` of `partitions`
    /// partitions) and database `db`, `extra` appended to each configuration, and waits until
    /// each answers /ready.
    pub fn start(bin: &str, boot: &str, db: &str, tag: &str, n: usize, partitions: i32, extra: &str) -> Res<Replicas> {
        let dir = std::env::temp_dir().join(format!("gpusanity-{tag}"));
        std::fs::create_dir_all(&dir)?;
        let keys = dir.join("agent-keys.toml");
        super::write_agent_keys(&keys);
        let mut r = Replicas { dir: dir.clone(), children: Vec::new() };
        let mut ports = Vec::new();
        for i in 0..n {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            let config = dir.join(format!("replica-{i}.toml"));
            std::fs::write(&config, config_text(boot, db, tag, i, port, partitions, &keys) + extra)?;
            let log = std::fs::File::create(dir.join(format!("replica-{i}.log")))?;
            r.children.push(
                Command::new(bin)
                    .args(["serve", "--config"])
                    .arg(&config)
                    .stdin(Stdio::null())
                    .stdout(log.try_clone()?)
                    .stderr(log)
                    .spawn()?,
            );
            ports.push(port);
        }
        let start = Instant::now();
        for port in ports {
            while status(port, "GET", "/ready") != Some(200) {
                if start.elapsed() > Duration::from_secs(120) {
                    return Err(format!("a replica never became ready (logs in {})", dir.display()).into());
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        Ok(r)
    }
}

fn config_text(boot: &str, db: &str, tag: &str, i: usize, port: u16, partitions: i32, keys: &Path) -> String {
    let p = format!("{tag}.");
    format!(
        "[kafka]\nbootstrap = \"{boot}\"\ngroup = \"{p}service\"\npartitions = {partitions}\n[topics]\njob_events = \"{p}job-events\"\n\
         output = \"{p}check-events\"\ndead_letter = \"{p}dead-letter\"\nagent_tasks = \"{p}agent-tasks\"\nagent_reports = \"{p}agent-reports\"\ntelemetry = \"{p}telemetry\"\n\
         [database]\nurl = \"{db}\"\n[http]\nlisten = \"127.0.0.1:{port}\"\ntoken = \"bench-token-0123456789\"\n\
         [agent_auth]\nkeys_file = \"{}\"\n[replica]\nid = \"{tag}-r{i}\"\n",
        keys.display()
    )
}

impl Drop for Replicas {
    fn drop(&mut self) {
        for c in &self.children {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), nix::sys::signal::Signal::SIGTERM);
        }
        let end = Instant::now() + Duration::from_secs(10);
        for c in &mut self.children {
            while Instant::now() < end && !matches!(c.try_wait(), Ok(Some(_))) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
