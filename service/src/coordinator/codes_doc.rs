//! The service's own finding codes are listed in docs/findings.md.

#[test]
fn every_service_finding_code_is_documented() {
    let docs = include_str!("../../../docs/findings.md");
    let mut codes = Vec::new();
    let sources =
        [include_str!("mod.rs"), include_str!("tick.rs"), include_str!("finish.rs"), include_str!("overrun.rs")];
    for quoted in sources.iter().flat_map(|s| s.split('"').skip(1).step_by(2)) {
        let is_code = quoted.contains('_') && quoted.chars().all(|c| c.is_ascii_uppercase() || c == '_');
        if is_code && !codes.contains(&quoted) {
            codes.push(quoted);
        }
    }
    assert!(codes.len() >= 5, "{codes:?}");
    for code in codes {
        assert!(docs.contains(&format!("`{code}`")), "{code} is not in docs/findings.md");
    }
}
