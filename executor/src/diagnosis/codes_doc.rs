//! The finding codes' documentation: every code the diagnosis, the check descriptors, the micro
//! and model checks and the launcher can emit is listed in docs/findings.md (the service checks
//! its own codes).

/// Every code the diagnosis can emit is listed in docs/findings.md.
#[test]
fn every_finding_code_is_documented() {
    let docs = include_str!("../../../docs/findings.md");
    let sources = [
        include_str!("mod.rs"),
        include_str!("crash.rs"),
        include_str!("hang.rs"),
        include_str!("links.rs"),
        include_str!("results.rs"),
        include_str!("../launcher/gather.rs"),
        include_str!("../launcher/readiness.rs"),
        include_str!("micro.rs"),
        include_str!("hostlink.rs"),
        include_str!("models.rs"),
        include_str!("health.rs"),
        include_str!("../../../common/src/health/decide.rs"),
        include_str!("../../../common/src/health/readiness.rs"),
        include_str!("../../../common/src/checks/gemm.rs"),
        include_str!("../../../common/src/checks/kernel_launch.rs"),
        include_str!("../../../common/src/checks/memory_bandwidth.rs"),
        include_str!("../../../common/src/checks/host_bandwidth.rs"),
        include_str!("../../../common/src/checks/rdma_ports.rs"),
        include_str!("../../../common/src/checks/all_reduce.rs"),
        include_str!("../../../common/src/checks/all_to_all.rs"),
        include_str!("../../../common/src/checks/all_gather.rs"),
        include_str!("../../../common/src/checks/multi_all_reduce.rs"),
        include_str!("../../../common/src/checks/network_connectivity.rs"),
        include_str!("../../../common/src/checks/overlap.rs"),
        include_str!("../../../common/src/checks/pair_bandwidth.rs"),
        include_str!("../checks/models/mod.rs"),
    ];
    let mut codes = Vec::new();
    for src in sources {
        for quoted in src.split('"').skip(1).step_by(2) {
            let is_code = quoted.contains('_')
                && quoted.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                && !quoted.starts_with("CARGO");
            if is_code && !codes.contains(&quoted) {
                codes.push(quoted);
            }
        }
    }
    assert!(codes.len() >= 15, "{codes:?}");
    for code in codes {
        assert!(docs.contains(&format!("`{code}`")), "{code} is not in docs/findings.md");
    }
}
