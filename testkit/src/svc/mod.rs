//! Helpers for the service tests: one real Kafka broker per test binary (or the one named by
//! GPUSANITY_TEST_KAFKA), real `gpusanity serve` and `gpusanity agent` processes, topics of
//! their own per test, a reader of the output topics, raw HTTP and SQL on the service's
//! database.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub use crate::common;
pub(crate) mod backends;
pub mod bench;
pub mod kube;
pub mod notify;
pub mod outage;
mod probe;
mod reader;
mod replicas;
mod scenario;
pub mod secure;

pub use backends::{broker, broker_listening_on, postgres_database, with_database};
pub use reader::Reader;
pub use scenario::{allocated, crash_restart, restarted, skip_event, stopped, two_node_pass, verdicts};
use secure::{client_config, publish_with};

/// The test receivers listen on loopback, which webhooks may not reach by default.
pub const LOOPBACK_ALLOW: &str = "webhook_allow = [\"127.0.0.0/8\", \"::1/128\"]";

pub const TOKEN: &str = "test-token-0123456789";

/// One test's world: its own topics, database, HTTP port and processes.
pub struct World {
    pub dir: tempfile::TempDir,
    pub tag: String,
    pub prefix: String,
    pub db_url: String,
    pub http: u16,
    pub config: PathBuf,
    /// The nodes that have an agent.
    pub nodes: Vec<String>,
    children: Vec<(String, Child)>,
    /// The Kafka client properties of the test's own clients (publish, read); empty: the
    /// plaintext test broker ([`broker`]).
    client: Vec<(String, String)>,
    /// The image whose containers run serve and the agents ([`World::in_image`]); None: the
    /// binary cargo built, on the host.
    image: Option<String>,
    /// The containers started, removed when the world is dropped.
    containers: Vec<String>,
    /// Environment variables of the next process started ([`World::agent_with_env`]).
    next_env: Vec<(String, String)>,
}

/// Publishes raw bytes on `topic` of the test broker.
pub fn publish_to(topic: &str, payload: &[u8]) {
    publish_with(&[], topic, payload);
}

/// Writes an agent key file (one cluster key, random, mode 0600) at `path`.
pub fn write_agent_keys(path: &std::path::Path) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let secret: String = (0..32).map(|_| format!("{:02x}", rand::random::<u8>())).collect();
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).expect("key file");
    writeln!(f, "[[key]]\nid = \"test\"\nsecret = \"{secret}\"").expect("key file");
}

impl World {
    /// The agent key file of this world.
    pub fn agent_keys(&self) -> PathBuf {
        self.dir.path().join("agent-keys.toml")
    }

    /// `db_url`: None for a SQLite file in the test's folder. `coordinator`: extra TOML lines
    /// for the [coordinator] table.
    pub fn new(db_url: Option<String>, coordinator: &str) -> World {
        World::new_on(broker(), db_url, coordinator)
    }

    /// [`World::new`] on the broker at `bootstrap` (a private one, see [`outage::Private`]).
    pub fn new_on(bootstrap: &str, db_url: Option<String>, coordinator: &str) -> World {
        let dir = tempfile::tempdir().expect("tempdir");
        let tag = format!("svc{}", dir.path().file_name().unwrap().to_string_lossy().replace('.', ""));
        let prefix = format!("t.{tag}.");
        let db_url = db_url.unwrap_or_else(|| format!("sqlite://{}", dir.path().join("gpusanity.db").display()));
        let http = common::free_port();
        let config = dir.path().join("gpusanity.toml");
        let keys = dir.path().join("agent-keys.toml");
        write_agent_keys(&keys);
        let p = &prefix;
        let text = format!(
            "[kafka]\nbootstrap = \"{b}\"\ngroup = \"{p}service\"\n\n[topics]\njob_events = \"{p}job-events\"\noutput = \"{p}check-events\"\n\
             dead_letter = \"{p}dead-letter\"\nagent_tasks = \"{p}agent-tasks\"\nagent_reports = \"{p}agent-reports\"\ntelemetry = \"{p}telemetry\"\n\n\
             [database]\nurl = \"{db_url}\"\n\n[http]\nlisten = \"127.0.0.1:{http}\"\n\n[coordinator]\nreport_url = \"http://127.0.0.1:{http}/v1/runs/{{run_id}}/report\"\n{coordinator}\n\n\
             [agent_auth]\nkeys_file = \"{keys}\"\n\n[jobs]\ntest_faults = true\n\n[notifier]\n{LOOPBACK_ALLOW}\n",
            b = bootstrap,
            keys = keys.display()
        );
        std::fs::write(&config, text).expect("config");
        let client = vec![("bootstrap.servers".to_string(), bootstrap.to_string())];
        World {
            dir,
            tag,
            prefix,
            db_url,
            http,
            config,
            nodes: Vec::new(),
            children: Vec::new(),
            client,
            image: None,
            containers: Vec::new(),
            next_env: Vec::new(),
        }
    }

    /// From now on serve and the agents run in containers of `image` (crate::image::run_args:
    /// user 65532, read-only root file system, the host's network), the world's folder bound
    /// at its own path and given to the image's user.
    pub fn in_image(&mut self, image: &str) {
        crate::image::give_to_image_user(self.dir.path());
        self.image = Some(image.to_string());
    }

    /// A world on SQLite with the service running, an agent per node in `nodes`, and a reader
    /// of the output topic.
    pub fn running(coordinator: &str, nodes: &[&str]) -> (World, Reader) {
        let mut w = World::new(None, coordinator);
        let out = w.start(nodes);
        (w, out)
    }

    /// Starts the service and an agent per node; returns a reader of the output topic.
    pub fn start(&mut self, nodes: &[&str]) -> Reader {
        self.serve();
        for n in nodes {
            self.agent(n);
        }
        self.reader("check-events")
    }

    pub fn topic(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    fn spawn(&mut self, name: &str, args: &[&str]) {
        self.spawn_via(name, &[], args);
    }

    /// Spawns the binary under `wrap` (a command that ends by exec'ing the binary, e.g.
    /// `ip netns exec NS`, so that the child's pid is the binary's), or directly if it is empty.
    fn spawn_via(&mut self, name: &str, wrap: &[String], args: &[&str]) {
        let config = self.config.clone();
        self.spawn_with(name, &config, wrap, args);
    }

    /// [`World::spawn_via`] with the configuration file `config`.
    fn spawn_with(&mut self, name: &str, config: &Path, wrap: &[String], args: &[&str]) {
        // Appended to: a restarted process's log follows its earlier one.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{name}.log")))
            .expect("log");
        let mut c = match (self.image.clone(), wrap.split_first()) {
            (Some(image), _) => self.container(&image, name),
            (None, Some((program, rest))) => {
                let mut c = Command::new(program);
                c.args(rest).arg(common::bin());
                c
            }
            (None, None) => Command::new(common::bin()),
        };
        c.args(args)
            .arg("--config")
            .arg(config)
            .env("GPUSANITY_TEST_TAG", &self.tag)
            .env("GPUSANITY_API_TOKEN", TOKEN)
            .env("GPUSANITY_LOG", "info")
            .env_remove("GPUSANITY_KAFKA_BOOTSTRAP")
            .env_remove("GPUSANITY_DATABASE_URL")
            .envs(std::mem::take(&mut self.next_env))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        self.children.push((name.to_string(), c.spawn().expect("spawn gpusanity")));
    }

    /// `podman run` of a container named after the world and `name`, ending with the image: the
    /// caller appends gpusanity's arguments (the image's entrypoint is `gpusanity`).
    fn container(&mut self, image: &str, name: &str) -> Command {
        let container = format!("{}-{name}", self.tag);
        let env =
            [("GPUSANITY_TEST_TAG", self.tag.as_str()), ("GPUSANITY_API_TOKEN", TOKEN), ("GPUSANITY_LOG", "info")];
        let mut c = crate::image::podman();
        c.args(crate::image::run_args(image, &container, &[self.dir.path()], &env));
        self.containers.push(container);
        c
    }

    pub fn serve(&mut self) {
        self.spawn("serve", &["serve"]);
        self.wait_health(Duration::from_secs(60));
    }

    /// An agent for `node`: CPU, one worker.
    pub fn agent(&mut self, node: &str) {
        self.agent_via(node, &[], &[]);
    }

    /// An agent for `node` (CPU, one worker) with `env` in its environment.
    pub fn agent_with_env(&mut self, node: &str, env: &[(&str, &str)]) {
        self.env_for_next(env);
        self.agent(node);
    }

    /// `env` in the environment of the next process started.
    pub fn env_for_next(&mut self, env: &[(&str, &str)]) {
        self.next_env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    }

    /// An agent for `node` run under `wrap` (see `spawn_via`), with `extra` arguments.
    pub fn agent_via(&mut self, node: &str, wrap: &[String], extra: &[&str]) {
        self.nodes.push(node.to_string());
        let work = self.dir.path().join(format!("agent-{node}"));
        let work = work.to_string_lossy().into_owned();
        let mut args = vec![
            "agent",
            "--node",
            node,
            "--device",
            "cpu",
            "--nproc-per-node",
            "1",
            "--heartbeat-s",
            "0.3",
            "--work-dir",
            &work,
            "--test-faults",
        ];
        args.extend_from_slice(extra);
        self.spawn_via(node, wrap, &args);
    }

    /// Waits until `n` worker processes of this world run (the data plane is under way).
    pub fn wait_for_workers(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while common::tagged_processes(&self.tag).iter().filter(|(_, rank)| rank.is_some()).count() < n {
            assert!(Instant::now() < deadline, "the workers never started");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self, name: &str) -> i32 {
        self.children.iter().find(|(n, _)| n == name).map(|(_, c)| c.id() as i32).expect("no such process")
    }

    /// SIGKILLs the process `name` and reaps it.
    pub fn kill(&mut self, name: &str) {
        let i = self.children.iter().position(|(n, _)| n == name).expect("no such process");
        let (_, mut c) = self.children.remove(i);
        let _ = c.kill();
        let _ = c.wait();
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default()
    }

    pub fn wait_health(&self, limit: Duration) {
        let start = Instant::now();
        loop {
            if let Ok((200, _)) = self.http_call("GET", "/health", None, None) {
                return;
            }
            assert!(start.elapsed() < limit, "the service never became healthy; its log:\n{}", self.log("serve"));
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// One HTTP/1.1 request to the service; (status, JSON body).
    pub fn http_call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> std::io::Result<(u16, Value)> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.http))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
        let body = body.unwrap_or("");
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
        let mut resp = String::new();
        s.read_to_string(&mut resp)?;
        let status = resp.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let json = resp.split("\r\n\r\n").nth(1).and_then(|b| serde_json::from_str(b).ok()).unwrap_or(Value::Null);
        Ok((status, json))
    }

    /// Publishes a JobResourcesAllocated for a job on every node that has an agent.
    pub fn allocate(&self, event_id: &str, job: &str, args: &str) {
        let nodes: Vec<&str> = self.nodes.iter().map(String::as_str).collect();
        self.publish(allocated(event_id, job, &nodes, args).as_bytes());
    }

    /// Publishes raw bytes on the job-events topic.
    pub fn publish(&self, payload: &[u8]) {
        self.publish_on("job-events", payload);
    }

    /// Publishes raw bytes on this world's topic `name` (as anyone who can reach the broker can).
    pub fn publish_on(&self, name: &str, payload: &[u8]) {
        publish_with(&self.client, &self.topic(name), payload);
    }

    pub fn reader(&self, topic: &str) -> Reader {
        Reader::with_config(client_config(&self.client), &self.topic(topic))
    }

    /// Runs SQL on the service's database and returns the first column of every row as text.
    pub fn sql(&self, query: &str) -> Vec<String> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            use sqlx::Row;
            sqlx::any::install_default_drivers();
            let pool = sqlx::AnyPool::connect(&self.db_url).await.expect("connect to the service's database");
            let rows = sqlx::query(query).fetch_all(&pool).await.expect("query");
            rows.iter()
                .map(|r| {
                    r.try_get::<String, _>(0)
                        .or_else(|_| r.try_get::<i64, _>(0).map(|v| v.to_string()))
                        .unwrap_or_default()
                })
                .collect()
        })
    }

    /// SIGTERMs everything this world started and checks that nothing carrying its tag is left.
    pub fn shutdown(&mut self) {
        for (_, c) in &self.children {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), nix::sys::signal::Signal::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        for (name, c) in &mut self.children {
            loop {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                if Instant::now() > deadline {
                    let _ = c.kill();
                    let _ = c.wait();
                    panic!("{name} did not stop on SIGTERM");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        self.children.clear();
        let run = common::Run { dir: tempfile::tempdir().expect("tempdir"), tag: self.tag.clone() };
        run.assert_nothing_left();
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for (_, c) in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        // A killed `podman run` leaves its container running.
        crate::image::remove(&self.containers);
    }
}
