//! A broker or a database server of one test's own, which the test can halt and resume (an
//! outage) without touching the ones the other tests share. Stopped and removed on drop.

use std::path::PathBuf;
use std::process::Command;

pub struct Private {
    script: PathBuf,
    state_var: &'static str,
    state: PathBuf,
    dir: tempfile::TempDir,
    /// The value of the script's `KEY=` line (the bootstrap address or the database URL).
    pub value: String,
}

impl Private {
    /// A private broker (scripts/kafka.sh).
    pub fn kafka() -> Private {
        Private::start("kafka.sh", "KAFKA_STATE", "KAFKA_BOOTSTRAP=")
    }

    /// A private PostgreSQL server (scripts/postgres.sh); `value` is its admin URL.
    pub fn postgres() -> Private {
        Private::start("postgres.sh", "PG_STATE", "DATABASE_URL=")
    }

    fn start(script: &str, state_var: &'static str, key: &str) -> Private {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
        let script = crate::repo().join("scripts").join(script);
        let state = dir.path().join("state");
        let mut p = Private { script, state_var, state, dir, value: String::new() };
        let out = p.run("start");
        p.value = out.lines().find_map(|l| l.strip_prefix(key)).unwrap_or_else(|| panic!("no {key} in {out}")).into();
        p
    }

    fn run(&self, verb: &str) -> String {
        let out = Command::new("bash")
            .arg(&self.script)
            .arg(verb)
            .env(self.state_var, &self.state)
            .env("TMPDIR", self.dir.path())
            .output()
            .expect("running a script");
        assert!(
            out.status.success(),
            "{} {verb}: {}{}",
            self.script.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Stops the server, keeping its data.
    pub fn halt(&self) {
        self.run("halt");
    }

    /// Starts the halted server again on the same port.
    pub fn resume(&self) {
        self.run("resume");
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(&self.script)
            .arg("stop")
            .env(self.state_var, &self.state)
            .env("TMPDIR", self.dir.path())
            .output();
    }
}
