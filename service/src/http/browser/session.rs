//! The browser's server-side state: one session per login (a random id, the scope of the
//! token that logged in, a CSRF token, an absolute and an idle expiry; logout deletes it), and
//! the limit on failed logins per client address. Both live in memory, bounded: a restart logs
//! everyone out.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::RngCore;

use crate::http::scope::Scope;

/// `n` random bytes from the thread's CSPRNG (ChaCha, seeded from the OS), as hex.
pub fn random_hex(n: usize) -> String {
    let mut buf = vec![0u8; n];
    rand::rng().fill_bytes(&mut buf);
    buf.iter().fold(String::with_capacity(n * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Session ids and CSRF tokens: 256 random bits.
const ID_BYTES: usize = 32;

#[derive(Debug, Clone, PartialEq)]
pub struct SessionConfig {
    /// A session ends this long after its login.
    pub ttl: Duration,
    /// And this long after its last request (None: no idle expiry).
    pub idle: Option<Duration>,
    /// At most this many sessions; a login beyond it ends the least recently used one.
    pub max: usize,
}

/// What a page learns of its session.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionView {
    pub scope: Scope,
    /// The token that the session's forms carry.
    pub csrf: String,
}

struct Session {
    view: SessionView,
    created: Instant,
    last: Instant,
}

pub struct Sessions {
    config: SessionConfig,
    map: Mutex<HashMap<String, Session>>,
}

impl Sessions {
    pub fn new(config: SessionConfig) -> Sessions {
        Sessions { config, map: Mutex::new(HashMap::new()) }
    }

    fn live(&self, s: &Session, now: Instant) -> bool {
        now.duration_since(s.created) < self.config.ttl
            && self.config.idle.is_none_or(|idle| now.duration_since(s.last) < idle)
    }

    /// A new session for `scope`: its id (the cookie's value).
    pub fn create(&self, scope: Scope) -> String {
        let id = random_hex(ID_BYTES);
        let now = Instant::now();
        let session = Session { view: SessionView { scope, csrf: random_hex(ID_BYTES) }, created: now, last: now };
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= self.config.max {
            map.retain(|_, s| self.live(s, now));
        }
        while map.len() >= self.config.max.max(1) {
            let Some(oldest) = map.iter().min_by_key(|(_, s)| s.last).map(|(k, _)| k.clone()) else { break };
            map.remove(&oldest);
        }
        map.insert(id.clone(), session);
        id
    }

    /// The live session `id` (its idle clock restarted), or None; an expired one is removed.
    pub fn get(&self, id: &str) -> Option<SessionView> {
        let now = Instant::now();
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let live = map.get(id).map(|s| self.live(s, now))?;
        if !live {
            map.remove(id);
            return None;
        }
        let s = map.get_mut(id)?;
        s.last = now;
        Some(s.view.clone())
    }

    /// Ends session `id`.
    pub fn remove(&self, id: &str) {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    }
}

/// Failed logins: at most `per_client` per client address and `global` in all per `window`;
/// beyond that every login (right or wrong) is answered 429 until the window ends.
pub struct LoginLimiter {
    per_client: u32,
    global: u32,
    window: Duration,
    max_clients: usize,
    state: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    clients: HashMap<IpAddr, (Instant, u32)>,
    global: Option<(Instant, u32)>,
}

/// An IPv6 client is counted by its /64 (one host usually has the whole prefix).
fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        v4 => v4,
    }
}

impl LoginLimiter {
    pub fn new(per_client: u32, global: u32, window: Duration) -> LoginLimiter {
        LoginLimiter { per_client, global, window, max_clients: 10_000, state: Mutex::default() }
    }

    /// Ok, or how long until a login may be tried again.
    pub fn check(&self, ip: IpAddr) -> Result<(), Duration> {
        let now = Instant::now();
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let over = |entry: Option<&(Instant, u32)>, limit: u32| match entry {
            Some((start, n)) if *n >= limit => self.window.checked_sub(now.duration_since(*start)),
            _ => None,
        };
        match over(st.clients.get(&client_key(ip)), self.per_client).or(over(st.global.as_ref(), self.global)) {
            Some(wait) if !wait.is_zero() => Err(wait),
            _ => Ok(()),
        }
    }

    /// Counts a failed login from `ip`.
    pub fn failed(&self, ip: IpAddr) {
        let now = Instant::now();
        let window = self.window;
        let bump = |e: &mut (Instant, u32)| {
            if now.duration_since(e.0) >= window {
                *e = (now, 0);
            }
            e.1 = e.1.saturating_add(1);
        };
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        bump(st.global.get_or_insert((now, 0)));
        let key = client_key(ip);
        if !st.clients.contains_key(&key) && st.clients.len() >= self.max_clients {
            st.clients.retain(|_, (start, _)| now.duration_since(*start) < window);
            if st.clients.len() >= self.max_clients {
                // Full of live entries: this client is held by the global count alone.
                return;
            }
        }
        bump(st.clients.entry(key).or_insert((now, 0)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_expire_end_and_stay_bounded() {
        let s = Sessions::new(SessionConfig { ttl: Duration::from_millis(200), idle: None, max: 2 });
        let a = s.create(Scope::Admin);
        assert_eq!(a.len(), 64);
        let v = s.get(&a).expect("live");
        assert_eq!((v.scope, v.csrf.len()), (Scope::Admin, 64));
        let b = s.create(Scope::Workspace("w".into()));
        assert_ne!(a, b);
        s.remove(&b);
        assert!(s.get(&b).is_none(), "removed");
        let _ = s.create(Scope::Admin);
        let _ = s.create(Scope::Admin);
        assert!(s.get(&a).is_none(), "the least recently used one made room");
        let c = s.create(Scope::Admin);
        std::thread::sleep(Duration::from_millis(250));
        assert!(s.get(&c).is_none(), "expired");
        let idle = Sessions::new(SessionConfig {
            ttl: Duration::from_secs(60),
            idle: Some(Duration::from_millis(100)),
            max: 9,
        });
        let d = idle.create(Scope::Admin);
        std::thread::sleep(Duration::from_millis(150));
        assert!(idle.get(&d).is_none(), "idle too long");
    }

    #[test]
    fn failed_logins_are_limited_per_client_and_in_all() {
        let l = LoginLimiter::new(2, 3, Duration::from_millis(300));
        let (a, b, c): (IpAddr, IpAddr, IpAddr) =
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap(), "2001:db8::1".parse().unwrap());
        assert!(l.check(a).is_ok());
        l.failed(a);
        l.failed(a);
        assert!(l.check(a).is_err(), "a is over its limit");
        assert!(l.check(b).is_ok(), "b is not");
        l.failed(b);
        assert!(l.check(c).is_err(), "the global cap holds everyone");
        std::thread::sleep(Duration::from_millis(350));
        assert!(l.check(a).is_ok() && l.check(c).is_ok(), "the window ended");
        assert_eq!(client_key("2001:db8::1:2".parse().unwrap()), client_key(c));
    }
}
