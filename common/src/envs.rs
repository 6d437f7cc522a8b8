//! Which environment variables a job's `--sanity-check-envs` may set for the check's processes.
//!
//! The check's workers run as whoever runs the launcher: on a node agent that is usually root.
//! A job's settings must therefore not choose what those processes load or where they write:
//! every key goes through an allowlist the operator configures ([`DEFAULT_ALLOW`] when they do
//! not), and a fixed denylist ([`ALWAYS_DENIED`]) wins over any allowlist, however broad.
//! Test fault injection (`GPUSANITY_FAULT`) passes only where the operator enabled it on the
//! command line of `check` or `agent` (or in the service's configuration).

use thiserror::Error;

/// Tuning variables a job may set by default: NCCL's (less the denied ones below) and a few of
/// CUDA's, cuBLAS's and OpenMP's that change speed, not what is loaded.
pub const DEFAULT_ALLOW: &[&str] = &[
    "NCCL_*",
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "CUDA_LAUNCH_BLOCKING",
    "CUDA_MODULE_LOADING",
    "CUDA_AUTO_BOOST",
    "CUBLAS_WORKSPACE_CONFIG",
    "NVIDIA_TF32_OVERRIDE",
    "OMP_NUM_THREADS",
];

/// Never settable by a job: the dynamic loader's variables, anything naming a file, a
/// directory, a path, a plugin, a library or an injection (NCCL_NET_PLUGIN, NCCL_DEBUG_FILE,
/// CUDA_INJECTION64_PATH...), interpreters' start-up hooks, and gpusanity's own variables.
/// Matched without regard to case.
pub const ALWAYS_DENIED: &[&str] = &[
    "LD_*",
    "GPUSANITY_*",
    "*PLUGIN*",
    "*FILE*",
    "*PATH*",
    "*_DIR",
    "*DIR_*",
    "*LIBRARY*",
    "*PRELOAD*",
    "*INJECTION*",
    "*CONF*",
    "*SOCKET_PATH*",
    "NCCL_RAS_*",
    "PYTHON*",
    "PERL5*",
    "RUBY*",
    "NODE_OPTIONS",
    "BASH_ENV",
    "ENV",
    "IFS",
    "SHELL",
    "HOME",
    "TMPDIR",
    "MALLOC_*",
    "GCONV*",
];

/// The fault-injection variable of the test suite, let through only when enabled.
pub const FAULT_ENV: &str = "GPUSANITY_FAULT";

/// The test suite's fake /sys/class/infiniband for `rdma-ports`: the launcher passes it to its
/// workers only when test faults are enabled (and a job can never set it: `GPUSANITY_*` is
/// denied).
pub const IB_ROOT_ENV: &str = "GPUSANITY_TEST_IB_ROOT";

/// The test rigs' paced device: a CPU worker whose GEMM is paced to this many MFLOP/s (a
/// simulated device of known speed on a host whose own speed varies), passed to workers only
/// when test faults are enabled (a job can never set it: `GPUSANITY_*` is denied).
pub const PACE_ENV: &str = "GPUSANITY_TEST_PACE";

/// The most patterns an operator may configure.
const MAX_PATTERNS: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EnvRefused {
    #[error(
        "--sanity-check-envs may not set {0}: it is never allowed (loader, file, path, plugin and gpusanity variables)"
    )]
    Denied(String),
    #[error("--sanity-check-envs may not set {key}: not in the operator's allowlist ({allow})")]
    NotAllowed { key: String, allow: String },
    #[error(
        "--sanity-check-envs may not set {FAULT_ENV}: fault injection is off (the operator enables it with --test-faults)"
    )]
    FaultsOff,
    #[error("bad environment pattern `{0}`: letters, digits, `_` and `*` only")]
    BadPattern(String),
    #[error("too many environment patterns (at most {MAX_PATTERNS})")]
    TooMany,
}

/// The operator's policy for job-set environment variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvPolicy {
    allow: Vec<String>,
    /// Let `GPUSANITY_FAULT` through (test rigs only).
    pub test_faults: bool,
}

impl Default for EnvPolicy {
    fn default() -> Self {
        EnvPolicy { allow: DEFAULT_ALLOW.iter().map(|s| s.to_string()).collect(), test_faults: false }
    }
}

impl EnvPolicy {
    /// A policy allowing `patterns` (instead of the defaults; empty keeps the defaults).
    pub fn new(patterns: &[String], test_faults: bool) -> Result<Self, EnvRefused> {
        if patterns.len() > MAX_PATTERNS {
            return Err(EnvRefused::TooMany);
        }
        for p in patterns {
            let ok =
                !p.is_empty() && p.len() <= 128 && p.chars().all(|c| c.is_ascii_alphanumeric() || "_*".contains(c));
            if !ok {
                return Err(EnvRefused::BadPattern(p.clone()));
            }
        }
        let mut policy = EnvPolicy { test_faults, ..EnvPolicy::default() };
        if !patterns.is_empty() {
            policy.allow = patterns.to_vec();
        }
        Ok(policy)
    }

    pub fn allowed_patterns(&self) -> &[String] {
        &self.allow
    }

    /// Whether a job may set `key`.
    pub fn check_key(&self, key: &str) -> Result<(), EnvRefused> {
        let upper = key.to_ascii_uppercase();
        if upper == FAULT_ENV {
            return if self.test_faults { Ok(()) } else { Err(EnvRefused::FaultsOff) };
        }
        if ALWAYS_DENIED.iter().any(|p| glob(p, &upper)) {
            return Err(EnvRefused::Denied(key.to_string()));
        }
        if self.allow.iter().any(|p| glob(&p.to_ascii_uppercase(), &upper)) {
            Ok(())
        } else {
            Err(EnvRefused::NotAllowed { key: key.to_string(), allow: self.allow.join(",") })
        }
    }

    /// Checks every key of a job's `--sanity-check-envs`.
    pub fn check(&self, envs: &[(String, String)]) -> Result<(), EnvRefused> {
        envs.iter().try_for_each(|(k, _)| self.check_key(k))
    }
}

/// `*` matches any run of characters; everything else matches itself. Written here because the
/// patterns are environment-variable names with one wildcard kind; a glob crate's path rules
/// (separators, classes, escapes) would only add ways to misread them.
fn glob(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let [first, middle @ .., last] = parts.as_slice() else { return pattern == name };
    let Some(mut rest) = name.strip_prefix(first) else { return false };
    for m in middle {
        match rest.find(m) {
            Some(i) => rest = &rest[i + m.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_prefixes_infixes_and_exact_names() {
        assert!(glob("NCCL_*", "NCCL_ALGO"));
        assert!(!glob("NCCL_*", "XNCCL_ALGO"));
        assert!(glob("*PLUGIN*", "NCCL_NET_PLUGIN"));
        assert!(glob("*_DIR", "CACHE_DIR"));
        assert!(!glob("*_DIR", "CACHE_DIRECTION"));
        assert!(glob("ENV", "ENV"));
        assert!(!glob("ENV", "ENVX"));
        assert!(glob("A*B*C", "AxxBxxC"));
        assert!(!glob("A*B*C", "AxxCxxB"));
        assert!(!glob("AB*B", "AB"));
    }

    #[test]
    fn the_defaults_allow_tuning_and_refuse_loaders_files_and_our_own() {
        let p = EnvPolicy::default();
        for ok in ["NCCL_ALGO", "NCCL_IB_HCA", "NCCL_NVLS_ENABLE", "CUDA_DEVICE_MAX_CONNECTIONS", "OMP_NUM_THREADS"] {
            assert_eq!(p.check_key(ok), Ok(()), "{ok}");
        }
        for bad in [
            "LD_PRELOAD",
            "ld_library_path",
            "NCCL_NET_PLUGIN",
            "NCCL_DEBUG_FILE",
            "NCCL_TOPO_FILE",
            "NCCL_CONF_FILE",
            "CUDA_INJECTION64_PATH",
            "GPUSANITY_WORKER_SPEC",
            "PYTHONPATH",
            "NCCL_RAS_ADDR",
        ] {
            assert!(matches!(p.check_key(bad), Err(EnvRefused::Denied(_))), "{bad}");
        }
        assert!(matches!(p.check_key("HTTP_PROXY"), Err(EnvRefused::NotAllowed { .. })));
        assert_eq!(p.check_key("GPUSANITY_FAULT"), Err(EnvRefused::FaultsOff));
    }

    #[test]
    fn an_operator_allowlist_replaces_the_defaults_but_never_the_denylist() {
        let p = EnvPolicy::new(&["*".into()], false).unwrap();
        assert_eq!(p.check_key("HTTP_PROXY"), Ok(()));
        assert!(matches!(p.check_key("LD_PRELOAD"), Err(EnvRefused::Denied(_))));
        let p = EnvPolicy::new(&["UCX_TLS".into()], true).unwrap();
        assert!(p.check_key("NCCL_ALGO").is_err());
        assert_eq!(p.check_key("UCX_TLS"), Ok(()));
        assert_eq!(p.check_key("GPUSANITY_FAULT"), Ok(()));
        assert!(EnvPolicy::new(&["A=B".into()], false).is_err());
        assert!(p.check(&[("UCX_TLS".into(), "rc".into()), ("LD_AUDIT".into(), "x".into())]).is_err());
    }
}
