//! The pages of docs/ against the repository, without building or running anything:
//! every path docs/architecture.md names exists.
//!
//! A path is a backticked span without spaces that contains `/` and ends in `.rs`, `.toml`,
//! `.md`, `.sh`, `.sql` or `/`. It is looked up from the repository's root first; else from
//! the folders that its section (the text under one heading) names as paths from the root, and
//! every folder above them; else, in a table row, from the crate the row is about (its first
//! cell: `CRATE/` and `CRATE/src/`). A span with an upper-case placeholder
//! (`common/src/checks/NAME.rs`) stands for the files of its folder: the folder must exist.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Spans of docs/architecture.md that look like paths and are not: the rendezvous store's
/// key prefix under which a rank asks its node store to relay.
const NOT_PATHS: &[&str] = &["relay/"];

const PATH_ENDINGS: &[&str] = &[".rs", ".toml", ".md", ".sh", ".sql", "/"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The sections of a Markdown page (the text under each heading), as their lines.
fn sections(text: &str) -> Vec<Vec<&str>> {
    let mut out: Vec<Vec<&str>> = vec![Vec::new()];
    for line in text.lines() {
        if line.starts_with('#') {
            out.push(Vec::new());
        }
        out.last_mut().expect("one section at least").push(line);
    }
    out
}

/// The backticked spans of `text`.
fn spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

fn looks_like_path(span: &str) -> bool {
    !span.is_empty()
        && !span.contains(char::is_whitespace)
        && span.contains('/')
        && PATH_ENDINGS.iter().any(|e| span.ends_with(e))
        && !NOT_PATHS.contains(&span)
}

/// `common/src/checks/NAME.rs` -> `common/src/checks/`: the folder a placeholder stands in.
fn placeholder_folder(span: &str) -> Option<&str> {
    let (folder, last) = span.trim_end_matches('/').rsplit_once('/').unwrap_or(("", span));
    let stem = last.split('.').next().unwrap_or(last);
    let placeholder = stem.len() > 1 && stem.chars().all(|c| c.is_ascii_uppercase() || c == '_');
    placeholder.then_some(folder)
}

/// The folders a section's relative paths may be read from: those that its paths name from the
/// root (a placeholder's folder included) and every folder above them.
fn section_folders(root: &Path, section: &[&str]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for span in spans(&section.join("\n")).into_iter().filter(|s| looks_like_path(s)) {
        let named = placeholder_folder(span).unwrap_or(span).trim_end_matches('/');
        if root.join(named).exists() {
            let mut p = Path::new(named);
            while let Some(parent) = p.parent() {
                out.insert(root.join(p));
                p = parent;
            }
        }
    }
    out
}

/// The folders of the crate a table row is about (its first cell names it): `CRATE/`,
/// `CRATE/src/`.
fn row_crate(root: &Path, line: &str) -> Vec<PathBuf> {
    let Some(row) = line.trim_start().strip_prefix('|') else { return Vec::new() };
    let first_cell = row.split('|').next().unwrap_or("");
    spans(first_cell)
        .into_iter()
        .filter(|name| !name.is_empty() && !name.contains('/') && root.join(name).join("Cargo.toml").is_file())
        .flat_map(|name| [root.join(name), root.join(name).join("src")])
        .collect()
}

/// The paths of `page` that exist neither from the root nor from their section's folders nor
/// from their table row's crate.
fn missing_paths(root: &Path, page: &str) -> Vec<String> {
    let text = std::fs::read_to_string(root.join(page)).unwrap_or_else(|e| panic!("reading {page}: {e}"));
    let mut missing = Vec::new();
    for section in sections(&text) {
        let folders = section_folders(root, &section);
        for line in &section {
            let crate_dirs = row_crate(root, line);
            for span in spans(line).into_iter().filter(|s| looks_like_path(s)) {
                let wanted = placeholder_folder(span).unwrap_or(span);
                let found =
                    root.join(wanted).exists() || folders.iter().chain(&crate_dirs).any(|f| f.join(wanted).exists());
                if !found {
                    missing.push(format!("{page}: `{span}` (in: {})", line.trim()));
                }
            }
        }
    }
    missing
}

#[test]
fn every_path_of_the_architecture_page_exists() {
    let missing = missing_paths(&root(), "docs/architecture.md");
    assert!(missing.is_empty(), "{} path(s) that do not exist:\n{}", missing.len(), missing.join("\n"));
}

#[test]
fn the_path_rule_reads_blocks_rows_and_placeholders() {
    assert!(looks_like_path("common/src/checks/"));
    assert!(looks_like_path("store/relay.rs"));
    assert!(!looks_like_path("relay/"));
    assert!(!looks_like_path("gpusanity check"));
    assert!(!looks_like_path("POST /v1/runs/{run_id}/resolve"));
    assert_eq!(placeholder_folder("common/src/checks/NAME.rs"), Some("common/src/checks"));
    assert_eq!(placeholder_folder("common/src/checks/gemm.rs"), None);
    let text = "# A\n`a/b.rs`\n## B\nline\n| `db` | row |\n";
    assert_eq!(sections(text).len(), 3);
    let root = root();
    assert_eq!(row_crate(&root, "| `db` | `lease.rs` and `rows.rs` |"), [root.join("db"), root.join("db/src")]);
    assert!(row_crate(&root, "the `db` crate").is_empty());
    let section = ["the launcher (`executor/src/launcher/`)", "and then `store/relay.rs`"];
    assert!(section_folders(&root, &section).contains(&root.join("executor/src")));
    let template = ["`common/src/checks/NAME.rs`"];
    assert!(section_folders(&root, &template).contains(&root.join("common/src/checks")));
}
