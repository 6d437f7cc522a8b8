//! Reading the kernel log: `/dev/kmsg` (every record since boot the ring buffer still holds),
//! else the journal of this boot (`journalctl -k -b`), else a rig's file
//! (`GPUSANITY_TEST_KMSG`, honoured only with `--test-faults`). Bounded in bytes and time.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpusanity_common::host::{kernel_log, KernelLog};

/// The most bytes of the log read (the kernel's ring buffer is a few MiB at most).
pub const MAX_BYTES: u64 = 16 << 20;
/// The longest the read may take.
pub const MAX_TIME: Duration = Duration::from_secs(2);
/// The longest record `/dev/kmsg` hands out (the kernel's own limit is about 8 KiB).
const RECORD: usize = 16 << 10;

/// Where the log comes from.
#[derive(Debug, Clone)]
pub enum Source {
    /// This node's kernel: `/dev/kmsg`, else the journal.
    Kernel,
    /// A rig's file of log lines.
    File(PathBuf),
}

/// Reads and scans the log.
pub fn read(source: &Source) -> KernelLog {
    match source {
        Source::File(path) => match read_file(path) {
            Ok((text, truncated)) => done(format!("{} (test rig)", path.display()), &text, truncated),
            Err(e) => KernelLog::Unreadable { why: format!("{}: {e}", path.display()) },
        },
        Source::Kernel => match read_kmsg(Path::new("/dev/kmsg")) {
            Ok((text, truncated)) => done("/dev/kmsg".into(), &text, truncated),
            Err(kmsg) => match read_journal() {
                Ok((text, truncated)) => done("journalctl -k -b".into(), &text, truncated),
                Err(journal) => KernelLog::Unreadable { why: format!("/dev/kmsg: {kmsg}; journal: {journal}") },
            },
        },
    }
}

fn done(source: String, text: &str, truncated: bool) -> KernelLog {
    KernelLog::Read { source, bytes: text.len() as u64, truncated, scan: kernel_log::scan(text) }
}

fn read_file(path: &Path) -> std::io::Result<(String, bool)> {
    let mut buf = Vec::new();
    std::fs::File::open(path)?.take(MAX_BYTES + 1).read_to_end(&mut buf)?;
    let truncated = buf.len() as u64 > MAX_BYTES;
    buf.truncate(MAX_BYTES as usize);
    Ok((String::from_utf8_lossy(&buf).into_owned(), truncated))
}

/// Every record `/dev/kmsg` holds, oldest first. Opened non-blocking: a read returns one record,
/// and `EAGAIN` once the buffer's end is reached; `EPIPE` says records were overwritten while
/// reading (the next read goes on from the oldest one left).
fn read_kmsg(path: &Path) -> std::io::Result<(String, bool)> {
    let mut f = std::fs::OpenOptions::new().read(true).custom_flags(nix::libc::O_NONBLOCK).open(path)?;
    let started = Instant::now();
    let mut out: Vec<u8> = Vec::new();
    let mut rec = vec![0u8; RECORD];
    loop {
        if out.len() as u64 >= MAX_BYTES || started.elapsed() >= MAX_TIME {
            return Ok((String::from_utf8_lossy(&out).into_owned(), true));
        }
        match f.read(&mut rec) {
            Ok(0) => break,
            Ok(n) => {
                out.extend_from_slice(&rec[..n]);
                if !out.ends_with(b"\n") {
                    out.push(b'\n');
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.raw_os_error() == Some(nix::libc::EPIPE) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok((String::from_utf8_lossy(&out).into_owned(), false))
}

/// This boot's kernel messages from the journal, within [`MAX_TIME`] and [`MAX_BYTES`].
fn read_journal() -> Result<(String, bool), String> {
    let mut child = Command::new("journalctl")
        .args(["-k", "-b", "-o", "short-monotonic", "--no-pager", "-q"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("journalctl: {e}"))?;
    let stdout = child.stdout.take().ok_or("journalctl: no output")?;
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stdout.take(MAX_BYTES + 1).read_to_end(&mut buf);
        buf
    });
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() < MAX_TIME => std::thread::sleep(Duration::from_millis(5)),
            // Over time (or unreadable): end the child this function started, and keep what it wrote.
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let mut buf = reader.join().unwrap_or_default();
    let truncated = status.is_none() || buf.len() as u64 > MAX_BYTES;
    buf.truncate(MAX_BYTES as usize);
    let text = String::from_utf8_lossy(&buf).into_owned();
    match status {
        Some(s) if s.success() && !text.trim().is_empty() => Ok((text, truncated)),
        Some(s) if s.success() => Err("journalctl printed nothing (no journal of this boot readable here)".into()),
        Some(s) => Err(format!("journalctl exited {s}")),
        None if !text.is_empty() => Ok((text, true)),
        None => Err(format!("journalctl gave nothing within {} s", MAX_TIME.as_secs())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rig_file_is_read_and_scanned_and_a_missing_one_is_unreadable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kmsg");
        std::fs::write(&path, "3,1,5000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n")
            .unwrap();
        match read(&Source::File(path)) {
            KernelLog::Read { scan, truncated, .. } => {
                assert!(!truncated);
                assert_eq!(scan.outstanding.len(), 1);
                assert_eq!(scan.outstanding[0].xid, 79);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(read(&Source::File(dir.path().join("none"))), KernelLog::Unreadable { .. }));
    }

    #[test]
    fn the_kernel_source_reads_or_says_why_not() {
        // Either outcome is this machine's truth; what matters is an answer within the bound.
        let started = Instant::now();
        match read(&Source::Kernel) {
            KernelLog::Read { source, .. } => assert!(source == "/dev/kmsg" || source.starts_with("journalctl")),
            KernelLog::Unreadable { why } => assert!(why.contains("/dev/kmsg"), "{why}"),
            KernelLog::Off => panic!("never off here"),
        }
        assert!(started.elapsed() < MAX_TIME * 3);
    }
}
