//! The CUDA libraries shipped beside the binary: the image's `/usr/local/lib/gpusanity`, the
//! tarball's `lib/gpusanity`. The binary's DT_RUNPATH (`$ORIGIN/../lib/gpusanity`, set by the
//! binary's build script) makes the dynamic loader search that folder before its cache and the
//! system folders (LD_LIBRARY_PATH still comes first); its manifest, written by
//! `scripts/cuda-libs.sh`, says which pinned packages they came from.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use thiserror::Error;

/// The manifest's file name in the folder.
pub const MANIFEST: &str = "cuda-libs.toml";
/// The folder, relative to the folder of the binary.
pub const RELATIVE_DIR: &str = "../lib/gpusanity";
/// A manifest lists a few packages; anything longer is not one.
const MAX_MANIFEST_BYTES: u64 = 64 * 1024;

/// What `cuda-libs.toml` says.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    #[serde(rename = "library", default)]
    pub libraries: Vec<Library>,
}

/// One pinned package and the files it gave.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Library {
    pub package: String,
    pub version: String,
    pub wheel_sha256: String,
    pub files: Vec<String>,
}

/// Why the bundled folder's manifest cannot be used.
#[derive(Debug, Error)]
pub enum BundledError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is larger than {MAX_MANIFEST_BYTES} bytes")]
    TooLarge { path: PathBuf },
    #[error("{path} is malformed: {source}")]
    Malformed { path: PathBuf, source: Box<toml::de::Error> },
    #[error("{path} lists {file}, which is not in the folder")]
    MissingFile { path: PathBuf, file: String },
}

/// The bundled folder of the running binary (whether or not it exists).
pub fn bundled_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?.canonicalize().ok()?;
    Some(exe.parent()?.join(RELATIVE_DIR))
}

/// The manifest of the folder `dir`: `Ok(None)` when the folder has none (nothing bundled).
pub fn read_manifest(dir: &Path) -> Result<Option<Manifest>, BundledError> {
    let path = dir.join(MANIFEST);
    let meta = match std::fs::metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(BundledError::Read { path, source }),
    };
    if meta.len() > MAX_MANIFEST_BYTES {
        return Err(BundledError::TooLarge { path });
    }
    let text = std::fs::read_to_string(&path).map_err(|source| BundledError::Read { path: path.clone(), source })?;
    let manifest: Manifest =
        toml::from_str(&text).map_err(|e| BundledError::Malformed { path: path.clone(), source: Box::new(e) })?;
    for file in manifest.libraries.iter().flat_map(|l| &l.files) {
        let listed = Path::new(file);
        if listed.components().count() != 1 || !dir.join(listed).is_file() {
            return Err(BundledError::MissingFile { path, file: file.clone() });
        }
    }
    Ok(Some(manifest))
}

/// One line for `--version`: which libraries are bundled, from where.
pub fn describe() -> String {
    let Some(dir) = bundled_dir() else {
        return "bundled CUDA libraries: unknown (the binary's own path cannot be read)".to_string();
    };
    let shown = dir.canonicalize().unwrap_or_else(|_| dir.clone());
    match read_manifest(&dir) {
        Ok(Some(m)) => {
            let list: Vec<String> = m.libraries.iter().map(|l| format!("{} {}", l.package, l.version)).collect();
            format!("bundled CUDA libraries ({}): {}", shown.display(), list.join(", "))
        }
        Ok(None) => format!(
            "bundled CUDA libraries: none ({} has no {MANIFEST}; the loader's search path is used, docs/cuda.md)",
            shown.display()
        ),
        Err(e) => format!("bundled CUDA libraries: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh folder of this test's own under the system's temp folder.
    fn folder(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("gpusanity-bundled-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp folder");
        dir
    }

    const GOOD: &str = "[[library]]\npackage = \"nvidia-nccl-cu13\"\nversion = \"2.28.9\"\n\
                        wheel_sha256 = \"00\"\nfiles = [\"libnccl.so.2\"]\n";

    #[test]
    fn a_folder_without_a_manifest_bundles_nothing() {
        let dir = folder("none");
        assert!(read_manifest(&dir).expect("no manifest is no error").is_none());
    }

    #[test]
    fn a_manifest_is_read_when_every_file_it_lists_is_there() {
        let dir = folder("good");
        std::fs::write(dir.join(MANIFEST), GOOD).unwrap();
        std::fs::write(dir.join("libnccl.so.2"), b"").unwrap();
        let m = read_manifest(&dir).expect("readable").expect("a manifest");
        assert_eq!(m.libraries.len(), 1);
        assert_eq!((m.libraries[0].package.as_str(), m.libraries[0].version.as_str()), ("nvidia-nccl-cu13", "2.28.9"));
    }

    #[test]
    fn a_bad_manifest_is_an_error_naming_what_is_wrong() {
        let dir = folder("missing");
        std::fs::write(dir.join(MANIFEST), GOOD).unwrap();
        assert!(matches!(read_manifest(&dir), Err(BundledError::MissingFile { file, .. }) if file == "libnccl.so.2"));

        let dir = folder("escape");
        std::fs::write(dir.join(MANIFEST), GOOD.replace("libnccl.so.2", "../etc/passwd")).unwrap();
        assert!(matches!(read_manifest(&dir), Err(BundledError::MissingFile { .. })));

        let dir = folder("malformed");
        std::fs::write(dir.join(MANIFEST), "[[library]]\npackage = 3\n").unwrap();
        assert!(matches!(read_manifest(&dir), Err(BundledError::Malformed { .. })));
        std::fs::write(dir.join(MANIFEST), format!("{GOOD}extra = 1\n")).unwrap();
        assert!(matches!(read_manifest(&dir), Err(BundledError::Malformed { .. })), "unknown keys are refused");

        let dir = folder("large");
        std::fs::write(dir.join(MANIFEST), "#".repeat(MAX_MANIFEST_BYTES as usize + 1)).unwrap();
        assert!(matches!(read_manifest(&dir), Err(BundledError::TooLarge { .. })));
    }

    #[test]
    fn the_version_line_never_fails() {
        let line = describe();
        assert!(line.starts_with("bundled CUDA libraries"), "{line}");
        assert!(!line.contains('\n'), "{line}");
    }
}
