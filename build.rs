//! The binary's build script: the commit it was built from (for `gpusanity --version`), and where
//! the dynamic loader looks first for the CUDA libraries the binary opens at run time.

use std::process::Command;

fn main() {
    // The commit: GPUSANITY_GIT_COMMIT when the builder passes it (an image build has no .git),
    // else git's own answer, else "unknown".
    println!("cargo:rerun-if-env-changed=GPUSANITY_GIT_COMMIT");
    println!("cargo:rerun-if-changed=.git/HEAD");
    if let Ok(head) = std::fs::read_to_string(".git/HEAD") {
        if let Some(reference) = head.strip_prefix("ref: ") {
            println!("cargo:rerun-if-changed=.git/{}", reference.trim());
        }
    }
    let commit = std::env::var("GPUSANITY_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| {
            let out = Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).output().ok()?;
            out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        })
        .filter(|c| c.len() <= 64 && c.chars().all(|ch| ch.is_ascii_alphanumeric()))
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=GPUSANITY_GIT_COMMIT={commit}");

    // The bundled CUDA libraries sit in ../lib/gpusanity beside the binary (the image's
    // /usr/local/lib/gpusanity, the tarball's lib/gpusanity): a DT_RUNPATH entry (zig's linker
    // writes no other kind; the system linker is told the same), which the dynamic loader
    // searches for the names the binary opens with dlopen after LD_LIBRARY_PATH and before its
    // cache and the system folders. The bundle holds every name the binary tries first
    // (libcublas.so, libnccl.so, ...: docs/cuda.md), so a toolkit in the loader's cache cannot
    // shadow it; the bundled libraries find each other through their own $ORIGIN run path. A
    // folder that does not exist costs one failed lookup.
    println!("cargo:rustc-link-arg-bins=-Wl,--enable-new-dtags");
    println!("cargo:rustc-link-arg-bins=-Wl,-rpath,$ORIGIN/../lib/gpusanity");
}
