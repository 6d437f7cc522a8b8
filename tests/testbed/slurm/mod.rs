//! A real Slurm cluster on one machine, for the Slurm scenarios: Debian's slurm-wlm with a
//! munged of its own (its own key and socket), slurmctld on the bridge's host address and three
//! slurmd, `node1`..`node3`, each in a network namespace of the test bed (entered with
//! `nsenter --net`, which, unlike `ip netns exec`, keeps /sys and its cgroup mounts that
//! slurmd reads). Everything lives in a temporary folder and is stopped, by process group, when
//! the cluster is dropped (also when a test fails). Skips, saying why, without root, iproute2,
//! nsenter or the Slurm and munge packages, or fails where GPUSANITY_REQUIRE lists `slurm`
//! (`.ci/run` installs them and lists it).

pub mod cluster;
mod scenarios;

/// The programs the cluster needs.
const PROGRAMS: [&str; 9] =
    ["munged", "slurmctld", "slurmd", "srun", "sbatch", "squeue", "scontrol", "sinfo", "nsenter"];

/// Why the cluster cannot run here, if it cannot.
pub fn missing_programs() -> Option<String> {
    let path = std::env::var("PATH").unwrap_or_default();
    let dirs: Vec<&str> = path.split(':').chain(["/usr/sbin", "/sbin"]).collect();
    let missing: Vec<&str> =
        PROGRAMS.into_iter().filter(|p| !dirs.iter().any(|d| std::path::Path::new(d).join(p).is_file())).collect();
    (!missing.is_empty()).then(|| format!("needs {} (apt-get install slurm-wlm munge)", missing.join(", ")))
}
