//! Where a webhook may go. A rule's URL is the workspace's input, and the service usually sits
//! inside a network that the workspace cannot reach: loopback, private and link-local
//! addresses (the cloud metadata service at 169.254.169.254 among them) are refused unless the
//! operator lists them in `notifier.webhook_allow`, and so are reserved ones. An IPv6 address
//! that carries an IPv4 one (NAT64, 6to4, Teredo, IPv4-mapped or -compatible; [`embedded_v4`])
//! is judged as that IPv4 address too.
//!
//! The check runs where the connection is made: [`GuardedResolver`] drops every resolved
//! address that is not allowed (a name that resolves to 127.0.0.1 is caught, and the
//! connection goes to an address that was checked, so a second lookup cannot swap it), and a
//! URL with a literal IP address, which reqwest connects to without a lookup, is checked by
//! [`Policy::check_url`] before the request. Redirects are not followed, and the client uses no
//! proxy (a proxy would resolve the name itself).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use thiserror::Error;

mod embed;
pub use embed::embedded_v4;

/// Why an address is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Loopback,
    Private,
    LinkLocal,
    Metadata,
    Unspecified,
    Multicast,
    SharedNat,
    Broadcast,
    Reserved,
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Class::Loopback => "loopback address",
            Class::Private => "private address",
            Class::LinkLocal => "link-local address",
            Class::Metadata => "cloud metadata address",
            Class::Unspecified => "unspecified address",
            Class::Multicast => "multicast address",
            Class::SharedNat => "shared (CGNAT) address",
            Class::Broadcast => "broadcast address",
            Class::Reserved => "reserved address",
        })
    }
}

/// A webhook target that is not allowed; its message is what the delivery log keeps.
#[derive(Debug, Clone, Copy, Error, PartialEq, Eq)]
#[error("blocked: {0} (not in notifier.webhook_allow)")]
pub struct Blocked(pub Class);

/// The class of an address that is refused by default, or None for a public one.
pub fn classify(ip: IpAddr) -> Option<Class> {
    Policy::default().check(ip).err().map(|b| b.0)
}

fn classify_v4(ip: Ipv4Addr) -> Option<Class> {
    let [a, b, ..] = ip.octets();
    if ip == Ipv4Addr::new(169, 254, 169, 254) {
        Some(Class::Metadata)
    } else if ip.is_loopback() {
        Some(Class::Loopback)
    } else if ip.is_unspecified() || a == 0 {
        Some(Class::Unspecified)
    } else if ip.is_private() {
        Some(Class::Private)
    } else if ip.is_link_local() {
        Some(Class::LinkLocal)
    } else if a == 100 && (64..128).contains(&b) {
        Some(Class::SharedNat)
    } else if ip.is_multicast() {
        Some(Class::Multicast)
    } else if ip.is_broadcast() {
        Some(Class::Broadcast)
    } else if a >= 240 || (a == 198 && (b & 0xfe) == 18) || (a == 192 && b == 0 && ip.octets()[2] == 0) {
        // 240.0.0.0/4 (future use), 198.18.0.0/15 (benchmarking), 192.0.0.0/24 (protocol
        // assignments).
        Some(Class::Reserved)
    } else {
        None
    }
}

fn classify_v6(ip: Ipv6Addr) -> Option<Class> {
    let first = ip.segments()[0];
    if ip == Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254) {
        Some(Class::Metadata)
    } else if ip.is_loopback() {
        Some(Class::Loopback)
    } else if ip.is_unspecified() {
        Some(Class::Unspecified)
    } else if first & 0xfe00 == 0xfc00 {
        Some(Class::Private)
    } else if first & 0xffc0 == 0xfe80 {
        Some(Class::LinkLocal)
    } else if ip.is_multicast() {
        Some(Class::Multicast)
    } else {
        None
    }
}

/// The operator's allowlist: addresses in these networks pass whatever their class.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    pub allow: Vec<IpNet>,
}

impl Policy {
    pub fn new(allow: Vec<IpNet>) -> Policy {
        Policy { allow }
    }

    fn allowed(&self, ip: IpAddr) -> bool {
        self.allow.iter().any(|n| n.contains(&ip))
    }

    /// Ok for an address a webhook may connect to: listed, or neither it nor an IPv4 address it
    /// carries is refused (a carried address may be listed itself).
    pub fn check(&self, ip: IpAddr) -> Result<(), Blocked> {
        if self.allowed(ip) {
            return Ok(());
        }
        let v6 = match ip {
            IpAddr::V4(v4) => return classify_v4(v4).map_or(Ok(()), |c| Err(Blocked(c))),
            IpAddr::V6(v6) => v6,
        };
        if let Some(c) = classify_v6(v6) {
            return Err(Blocked(c));
        }
        let refused = embedded_v4(v6).into_iter().filter(|v4| !self.allowed(IpAddr::V4(*v4))).find_map(classify_v4);
        refused.map_or(Ok(()), |c| Err(Blocked(c)))
    }

    /// The check of a URL whose host is a literal address; a name (`localhost` too) is
    /// checked after its lookup, by [`GuardedResolver`]. A URL that does not parse passes
    /// here (the request fails on it and says so).
    pub fn check_url(&self, url: &str) -> Result<(), Blocked> {
        let Ok(u) = reqwest::Url::parse(url) else { return Ok(()) };
        let Some(host) = u.host_str() else { return Ok(()) };
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        match bare.parse::<IpAddr>() {
            Ok(ip) => self.check(ip),
            Err(_) => Ok(()),
        }
    }
}

/// A resolver that returns only the allowed addresses of a name, or [`Blocked`] when none is.
#[derive(Debug, Clone)]
pub struct GuardedResolver {
    pub policy: Arc<Policy>,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.policy.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut first_refusal = None;
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .filter(|a| match policy.check(a.ip()) {
                    Ok(()) => true,
                    Err(b) => {
                        first_refusal.get_or_insert(b);
                        false
                    }
                })
                .collect();
            match (allowed.is_empty(), first_refusal) {
                (true, Some(b)) => Err(Box::new(b) as Box<dyn std::error::Error + Send + Sync>),
                _ => Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs),
            }
        })
    }
}

/// The [`Blocked`] somewhere in an error's chain of causes.
pub fn blocked_in(e: &(dyn std::error::Error + 'static)) -> Option<Blocked> {
    let mut cur = Some(e);
    while let Some(c) = cur {
        if let Some(b) = c.downcast_ref::<Blocked>() {
            return Some(*b);
        }
        cur = c.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn internal_addresses_are_refused_unless_allowed() {
        let p = Policy::default();
        for (a, c) in [
            ("127.0.0.1", Class::Loopback),
            ("127.9.9.9", Class::Loopback),
            ("::1", Class::Loopback),
            ("::ffff:127.0.0.1", Class::Loopback),
            ("10.1.2.3", Class::Private),
            ("172.16.0.1", Class::Private),
            ("192.168.1.1", Class::Private),
            ("fd00::1", Class::Private),
            ("169.254.169.254", Class::Metadata),
            ("fd00:ec2::254", Class::Metadata),
            ("169.254.1.1", Class::LinkLocal),
            ("fe80::1", Class::LinkLocal),
            ("0.0.0.0", Class::Unspecified),
            ("::", Class::Unspecified),
            ("224.0.0.1", Class::Multicast),
            ("ff02::1", Class::Multicast),
            ("100.64.0.1", Class::SharedNat),
            ("255.255.255.255", Class::Broadcast),
            ("198.18.0.1", Class::Reserved),
            ("198.19.255.255", Class::Reserved),
            ("240.0.0.1", Class::Reserved),
            ("192.0.0.8", Class::Reserved),
            ("100.127.255.255", Class::SharedNat),
            ("239.255.255.250", Class::Multicast),
            // IPv4 inside IPv6: NAT64 (well-known and local-use), IPv4-compatible, 6to4, Teredo.
            ("64:ff9b::a9fe:a9fe", Class::Metadata),
            ("64:ff9b::7f00:1", Class::Loopback),
            ("64:ff9b::198.18.0.1", Class::Reserved),
            ("64:ff9b:1::a9fe:a9fe", Class::Metadata),
            ("::127.0.0.1", Class::Loopback),
            ("::10.0.0.1", Class::Private),
            ("2002:a9fe:a9fe::1", Class::Metadata),
            ("2002:c0a8:101::1", Class::Private),
            ("2001:0:4136:e378:8000:63bf:80ff:fffe", Class::Loopback),
            ("::ffff:240.0.0.1", Class::Reserved),
        ] {
            assert_eq!(p.check(ip(a)), Err(Blocked(c)), "{a}");
        }
        for a in [
            "8.8.8.8",
            "100.128.0.1",
            "172.32.0.1",
            "198.20.0.1",
            "192.0.1.1",
            "2001:db8::1",
            "2606:4700::1",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert_eq!(p.check(ip(a)), Ok(()), "{a}");
        }
        let allow = Policy::new(vec!["127.0.0.1/32".parse().unwrap(), "10.0.0.0/8".parse().unwrap()]);
        assert_eq!(allow.check(ip("127.0.0.1")), Ok(()));
        assert_eq!(allow.check(ip("::ffff:127.0.0.1")), Ok(()));
        assert_eq!(allow.check(ip("10.200.0.1")), Ok(()));
        assert!(p.check(ip("64:ff9b:1:a00:1:100::")).is_err(), "10.0.1.1 in the /48 layout");
        assert_eq!(allow.check(ip("127.0.0.2")), Err(Blocked(Class::Loopback)));
        assert_eq!(allow.check(ip("64:ff9b::10.1.2.3")), Ok(()), "the IPv4 inside is listed");
        assert_eq!(allow.check(ip("2002:a9fe:a9fe::1")), Err(Blocked(Class::Metadata)));
        assert_eq!(allow.check(ip("169.254.169.254")), Err(Blocked(Class::Metadata)));
        assert_eq!(Blocked(Class::Loopback).to_string(), "blocked: loopback address (not in notifier.webhook_allow)");
    }

    #[test]
    fn literal_urls_are_checked_and_names_wait_for_their_lookup() {
        let p = Policy::default();
        assert_eq!(p.check_url("http://127.0.0.1:8080/x"), Err(Blocked(Class::Loopback)));
        assert_eq!(p.check_url("http://[::1]/x"), Err(Blocked(Class::Loopback)));
        assert_eq!(p.check_url("http://169.254.169.254/latest/meta-data"), Err(Blocked(Class::Metadata)));
        assert_eq!(p.check_url("http://[64:ff9b::a9fe:a9fe]/"), Err(Blocked(Class::Metadata)));
        assert_eq!(p.check_url("http://[::127.0.0.1]/"), Err(Blocked(Class::Loopback)));
        assert_eq!(p.check_url("http://[2002:a9fe:a9fe::1]/"), Err(Blocked(Class::Metadata)));
        assert_eq!(p.check_url("http://198.18.0.1/"), Err(Blocked(Class::Reserved)));
        assert_eq!(p.check_url("http://240.0.0.1/"), Err(Blocked(Class::Reserved)));
        assert_eq!(p.check_url("http://localhost/x"), Ok(()), "checked after the lookup");
        assert_eq!(p.check_url("https://hooks.example.org/x"), Ok(()));
        assert_eq!(p.check_url("not a url"), Ok(()));
    }

    #[tokio::test]
    async fn the_resolver_drops_refused_addresses() {
        use reqwest::dns::Resolve;
        let r = GuardedResolver { policy: Arc::new(Policy::default()) };
        let name: reqwest::dns::Name = "localhost".parse().unwrap();
        let err = r.resolve(name).await.err().expect("localhost refused");
        assert!(blocked_in(err.as_ref()).is_some(), "{err}");
        let allowed = GuardedResolver {
            policy: Arc::new(Policy::new(vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()])),
        };
        let name: reqwest::dns::Name = "localhost".parse().unwrap();
        assert!(allowed.resolve(name).await.map(|a| a.count()).unwrap_or(0) >= 1);
        // What a DNS64 resolver answers for an internal name: the IPv4 inside is judged.
        for (answer, class) in [("64:ff9b::a9fe:a9fe", Class::Metadata), ("64:ff9b::a00:1", Class::Private)] {
            let name: reqwest::dns::Name = answer.parse().unwrap();
            let err = r.resolve(name).await.err().expect("refused");
            assert_eq!(blocked_in(err.as_ref()), Some(Blocked(class)), "{answer}");
        }
    }
}
