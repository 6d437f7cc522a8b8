//! The IPv4 addresses an IPv6 address carries, for the forms that deliver its packets to that
//! IPv4 host: a translator (NAT64, RFC 6052 and RFC 8215), a tunnel's far end (6to4, RFC 3056;
//! Teredo, RFC 4380) or the host itself (IPv4-mapped and the deprecated IPv4-compatible
//! `::a.b.c.d`). A DNS64 resolver turns any internal IPv4 name into such an address, so the
//! guard judges these addresses as the IPv4 inside them. `std` decodes only the mapped form.

use std::net::{Ipv4Addr, Ipv6Addr};

/// The IPv4 addresses `ip` may stand for (none for a plain IPv6 address). For the local-use
/// NAT64 prefix, whose length the operator chooses, the address of every length RFC 6052
/// allows within it (48, 56, 64 and 96 bits).
pub fn embedded_v4(ip: Ipv6Addr) -> Vec<Ipv4Addr> {
    let o = ip.octets();
    let s = ip.segments();
    let last32 = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    match s {
        // ::ffff:a.b.c.d (mapped)
        [0, 0, 0, 0, 0, 0xffff, _, _] => vec![last32],
        // ::a.b.c.d (IPv4-compatible); `::` and `::1` are IPv6's own.
        [0, 0, 0, 0, 0, 0, _, _] if u128::from(ip) > 1 => vec![last32],
        // 64:ff9b::/96, the well-known NAT64 prefix.
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => vec![last32],
        // 64:ff9b:1::/48, the local-use NAT64 prefix: RFC 6052's layouts skip bits 64..72.
        [0x64, 0xff9b, 1, ..] => vec![
            last32,
            Ipv4Addr::new(o[6], o[7], o[9], o[10]),
            Ipv4Addr::new(o[7], o[9], o[10], o[11]),
            Ipv4Addr::new(o[9], o[10], o[11], o[12]),
        ],
        // 2002:AABB:CCDD::/48, 6to4: the relay at AA.BB.CC.DD receives the packets.
        [0x2002, hi, lo, ..] => vec![v4_of(hi, lo)],
        // 2001:0::/32, Teredo: the client's address is the last 32 bits inverted; the server's
        // sits in bits 32..64.
        [0x2001, 0, server_hi, server_lo, _, _, hi, lo] => {
            vec![Ipv4Addr::from(!u32::from(v4_of(hi, lo))), v4_of(server_hi, server_lo)]
        }
        _ => Vec::new(),
    }
}

fn v4_of(hi: u16, lo: u16) -> Ipv4Addr {
    Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4s(s: &str) -> Vec<Ipv4Addr> {
        embedded_v4(s.parse().unwrap())
    }

    #[test]
    fn each_form_yields_its_ipv4() {
        let md = Ipv4Addr::new(169, 254, 169, 254);
        assert_eq!(v4s("::ffff:127.0.0.1"), [Ipv4Addr::LOCALHOST]);
        assert_eq!(v4s("::127.0.0.1"), [Ipv4Addr::LOCALHOST]);
        assert!(v4s("::1").is_empty(), "IPv6 loopback, not 0.0.0.1");
        assert!(v4s("::").is_empty());
        assert_eq!(v4s("64:ff9b::a9fe:a9fe"), [md]);
        assert_eq!(v4s("64:ff9b::10.0.0.1"), [Ipv4Addr::new(10, 0, 0, 1)]);
        assert!(v4s("64:ff9b:1::a9fe:a9fe").contains(&md), "the /96 layout in the local-use prefix");
        // /48 layout: 10.1 in octets 6-7, u octet 8 zero, 2.3 in octets 9-10.
        assert!(v4s("64:ff9b:1:a01:2:300::").contains(&Ipv4Addr::new(10, 1, 2, 3)));
        assert_eq!(v4s("2002:a9fe:a9fe::1"), [md]);
        // Teredo: server 65.54.227.120, client 127.0.0.1 stored inverted (0x80ff:0xfffe).
        assert_eq!(v4s("2001:0:4136:e378:8000:63bf:80ff:fffe"), [Ipv4Addr::LOCALHOST, Ipv4Addr::new(65, 54, 227, 120)]);
        assert!(v4s("2001:db8::1").is_empty(), "documentation prefix, not Teredo");
        assert!(v4s("2606:4700::1").is_empty());
    }
}
