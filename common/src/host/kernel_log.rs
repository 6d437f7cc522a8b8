//! NVIDIA's XID lines in the kernel log, and what cleared them since.
//!
//! The driver writes one line per XID: `NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen
//! off the bus.` The log reaches us as `/dev/kmsg` records (`6,1234,5678901,-;MESSAGE`, the
//! third field microseconds since boot), as `journalctl -k -o short-monotonic` lines
//! (`[   12.345678] host kernel: MESSAGE`), as `dmesg` lines (`[   12.345678] MESSAGE`), or as
//! bare messages. What clears an XID of a GPU, in the order the log has it:
//! - a boot: `Linux version ...`, the kernel's first line (the live log holds the current boot
//!   only; a saved log may hold several);
//! - the driver loaded again (`NVRM: loading NVIDIA UNIX ...`): every GPU was re-initialised,
//!   as a reset procedure that unloads the modules does;
//! - a reset acknowledged in the log: `gpusanity: GPU 0000:3b:00.0 reset`, the line a reset
//!   procedure writes to `/dev/kmsg` after `nvidia-smi -r` (which the driver does not log).

use serde::{Deserialize, Serialize};

use crate::health::xid::MAX_XID;

/// The longest message kept as evidence, characters.
pub const MAX_LINE_CHARS: usize = 512;
/// The most outstanding XID events kept per GPU and XID (the count goes on).
const MAX_KEPT_PER_KEY: usize = 4;

/// One XID line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct XidEvent {
    /// The GPU, as the line names it: `0000:3b:00` (domain, bus, device; lower case).
    pub pci: String,
    pub xid: u32,
    /// Seconds since boot, where the line carries it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_s: Option<f64>,
    /// The message, cut at [`MAX_LINE_CHARS`].
    pub line: String,
}

/// The XIDs no reset, driver reload or boot cleared, grouped by GPU and XID.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Outstanding {
    pub pci: String,
    pub xid: u32,
    /// Lines of this GPU and XID since the last clearing.
    pub count: u64,
    /// The first and last few of them.
    pub events: Vec<XidEvent>,
}

/// What a scan of the log found.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Scan {
    /// Lines read.
    pub lines: u64,
    /// XID lines read, cleared or not.
    pub xid_lines: u64,
    /// Boots seen (`Linux version`): more than one only in a saved log.
    pub boots: u64,
    /// XID lines a later reset, driver load or boot cleared.
    pub cleared: u64,
    pub outstanding: Vec<Outstanding>,
}

/// `0000:3b:00` from a PCI address as the driver, NVML or sysfs write it (`PCI:0000:3B:00`,
/// `00000000:3b:00.0`, `0000:3b:00.0`): the domain's last four hex digits, bus and device, no
/// function. None for anything else.
pub fn pci_key(s: &str) -> Option<String> {
    let s = s.trim().trim_start_matches("PCI:").trim_start_matches("pci:");
    let s = s.split('.').next()?;
    let parts: Vec<&str> = s.split(':').collect();
    let [domain, bus, dev] = parts.as_slice() else { return None };
    let hex = |p: &str, max: usize| !p.is_empty() && p.len() <= max && p.bytes().all(|b| b.is_ascii_hexdigit());
    if !(hex(domain, 8) && hex(bus, 2) && hex(dev, 2)) {
        return None;
    }
    let domain = u32::from_str_radix(domain, 16).ok()? & 0xffff;
    let bus = u8::from_str_radix(bus, 16).ok()?;
    let dev = u8::from_str_radix(dev, 16).ok()?;
    Some(format!("{domain:04x}:{bus:02x}:{dev:02x}"))
}

/// A line's message and its time since boot, whatever of the formats above it is in.
fn message(line: &str) -> (&str, Option<f64>) {
    // /dev/kmsg: PRIORITY,SEQUENCE,MICROSECONDS,FLAGS[,...];MESSAGE
    if let Some((head, msg)) = line.split_once(';') {
        let fields: Vec<&str> = head.split(',').collect();
        if fields.len() >= 4 && fields[..3].iter().all(|f| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit())) {
            return (msg, fields[2].parse::<u64>().ok().map(|us| us as f64 / 1e6));
        }
    }
    // dmesg and journalctl's short-monotonic: [SECONDS] [HOST kernel: ]MESSAGE
    if let Some(rest) = line.trim_start().strip_prefix('[') {
        if let Some((secs, msg)) = rest.split_once(']') {
            if let Ok(at) = secs.trim().parse::<f64>() {
                let msg = msg.trim_start();
                let msg = match msg.split_once(" kernel: ") {
                    Some((host, m)) if !host.contains(' ') => m,
                    _ => msg,
                };
                return (msg, at.is_finite().then_some(at));
            }
        }
    }
    (line, None)
}

/// What one message says.
#[derive(Debug, PartialEq)]
enum Line {
    Xid { pci: String, xid: u32 },
    Boot,
    DriverLoaded,
    Reset { pci: String },
    Other,
}

fn classify(msg: &str) -> Line {
    let msg = msg.trim();
    if msg.starts_with("Linux version ") {
        return Line::Boot;
    }
    if let Some(rest) = msg.strip_prefix("NVRM: ") {
        if rest.starts_with("loading NVIDIA UNIX") {
            return Line::DriverLoaded;
        }
        // Xid (PCI:0000:3b:00): 79, pid=...
        if let Some(rest) = rest.strip_prefix("Xid (") {
            if let Some((addr, tail)) = rest.split_once("):") {
                let num: String = tail.trim_start().chars().take_while(char::is_ascii_digit).take(7).collect();
                let xid = num.parse::<u32>().ok().filter(|x| (1..=MAX_XID).contains(x));
                if let (Some(pci), Some(xid)) = (pci_key(addr), xid) {
                    return Line::Xid { pci, xid };
                }
            }
        }
        return Line::Other;
    }
    if let Some(rest) = msg.strip_prefix("gpusanity: GPU ") {
        if let Some(addr) = rest.strip_suffix(" reset") {
            if let Some(pci) = pci_key(addr) {
                return Line::Reset { pci };
            }
        }
    }
    Line::Other
}

/// Scans the log's text, oldest line first.
pub fn scan(text: &str) -> Scan {
    let mut s = Scan::default();
    for raw in text.lines() {
        // /dev/kmsg's continuation lines (` SUBSYSTEM=pci`) carry no message of their own.
        if raw.starts_with(' ') && raw.contains('=') && !raw.contains(']') {
            continue;
        }
        s.lines += 1;
        let (msg, at_s) = message(raw);
        match classify(msg) {
            Line::Xid { pci, xid } => {
                s.xid_lines += 1;
                let line: String = msg.trim().chars().filter(|c| !c.is_control()).take(MAX_LINE_CHARS).collect();
                let event = XidEvent { pci: pci.clone(), xid, at_s, line };
                match s.outstanding.iter_mut().find(|o| o.pci == pci && o.xid == xid) {
                    Some(o) => {
                        o.count += 1;
                        if o.events.len() >= MAX_KEPT_PER_KEY {
                            o.events.remove(1);
                        }
                        o.events.push(event);
                    }
                    None => s.outstanding.push(Outstanding { pci, xid, count: 1, events: vec![event] }),
                }
            }
            Line::Boot => {
                s.boots += 1;
                s.cleared += s.outstanding.drain(..).map(|o| o.count).sum::<u64>();
            }
            Line::DriverLoaded => s.cleared += s.outstanding.drain(..).map(|o| o.count).sum::<u64>(),
            Line::Reset { pci } => {
                s.cleared += s.outstanding.iter().filter(|o| o.pci == pci).map(|o| o.count).sum::<u64>();
                s.outstanding.retain(|o| o.pci != pci);
            }
            Line::Other => {}
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_of_every_writer_become_one_key() {
        for a in ["PCI:0000:3b:00", "0000:3B:00.0", "00000000:3b:00.0", "0000:3b:00"] {
            assert_eq!(pci_key(a).as_deref(), Some("0000:3b:00"), "{a}");
        }
        for bad in ["", "3b:00", "0000:3b", "zz:3b:00", "0000:3b:00:00", "0000:123:00"] {
            assert_eq!(pci_key(bad), None, "{bad}");
        }
    }

    #[test]
    fn every_format_gives_the_message_and_its_time() {
        let (m, t) = message("3,812,94571234,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.");
        assert!(m.starts_with("NVRM: Xid"));
        assert_eq!(t, Some(94.571234));
        let (m, t) = message("[  123.500000] gpu-node-7 kernel: NVRM: Xid (PCI:0000:3b:00): 13, pid=2, x");
        assert!(m.starts_with("NVRM: Xid"), "{m}");
        assert_eq!(t, Some(123.5));
        let (m, t) = message("[    5.250000] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.95.05");
        assert!(m.starts_with("NVRM: loading"));
        assert_eq!(t, Some(5.25));
        assert_eq!(message("plain text; with a semicolon"), ("plain text; with a semicolon", None));
    }

    #[test]
    fn an_xid_stays_until_a_reset_a_reload_or_a_boot_clears_it() {
        let log = "\
6,1,1000,-;Linux version 6.8.0 (builder@host)
6,2,2000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.95.05
3,3,90000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus.
 SUBSYSTEM=pci
3,4,91000000,-;NVRM: Xid (PCI:0000:5d:00): 13, pid=77, Graphics SM Warp Exception
3,5,92000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus.
";
        let s = scan(log);
        assert_eq!((s.lines, s.xid_lines, s.boots, s.cleared), (5, 3, 1, 0));
        assert_eq!(s.outstanding.len(), 2);
        assert_eq!(
            (s.outstanding[0].pci.as_str(), s.outstanding[0].xid, s.outstanding[0].count),
            ("0000:3b:00", 79, 2)
        );
        assert_eq!(s.outstanding[0].events[1].at_s, Some(92.0));

        let reset = format!("{log}6,6,93000000,-;gpusanity: GPU 0000:3b:00.0 reset\n");
        let s = scan(&reset);
        assert_eq!(s.cleared, 2);
        assert_eq!(s.outstanding.iter().map(|o| o.xid).collect::<Vec<_>>(), [13]);

        let reload = format!("{log}6,6,93000000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.95.05\n");
        assert!(scan(&reload).outstanding.is_empty());
        let reboot = format!("{log}6,1,1000,-;Linux version 6.8.0 (builder@host)\n");
        let s = scan(&reboot);
        assert!(s.outstanding.is_empty());
        assert_eq!(s.boots, 2);
    }

    #[test]
    fn forged_or_odd_lines_are_read_as_text_and_kept_short() {
        let long = format!("NVRM: Xid (PCI:0000:3b:00): 48, {}", "x".repeat(10_000));
        let odd = "NVRM: Xid (PCI:nonsense): 79, x\nNVRM: Xid (PCI:0000:3b:00): 99999999999, x\n\u{0}\u{1}\n";
        let s = scan(&format!("{long}\n{odd}"));
        assert_eq!(s.outstanding.len(), 1);
        assert_eq!(s.outstanding[0].events[0].line.chars().count(), MAX_LINE_CHARS);
        let many: String = (0..100).map(|i| format!("NVRM: Xid (PCI:0000:3b:00): 94, n{i}\n")).collect();
        let s = scan(&many);
        assert_eq!(s.outstanding[0].count, 100);
        assert_eq!(s.outstanding[0].events.len(), MAX_KEPT_PER_KEY);
        assert!(s.outstanding[0].events[0].line.ends_with("n0"));
        assert!(s.outstanding[0].events[3].line.ends_with("n99"));
    }
}
