//! Caller identity: the one key every dispatching endpoint publishes so session affinity and key
//! pools see the same caller.
//!
//! First match wins: an authenticated caller is the hash of its API key; a caller using an
//! inference grant is `grant:<id>`; an anonymous caller is `ip:<bucket>`, where IPv6 collapses to
//! its /64 (rotating privacy addresses stay on one backend) and IPv4 is the address. The client IP
//! is the socket's peer, or comes from `X-Forwarded-For` only when the peer is a trusted proxy.
//!
//! The key leaves the process (fleet affinity announcements, key-pool stickiness), so an API key
//! appears in it only as SHA-256, computed once per request. The 64-bit hash strategies get is
//! XXH3 of the key with a fixed seed: a specified algorithm, so every replica and version computes
//! the same value, at a fraction of a second SHA-256's cost; it is never stored or compared with a
//! secret.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use axum::http::{HeaderMap, HeaderName};
use ipnet::IpNet;
use sha2::{Digest, Sha256};

/// Who is calling, for routing purposes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    /// The affinity key; `None` for internal traffic (probes, warm-up).
    pub key: Option<Arc<str>>,
    /// A stable 64-bit hash of the key for strategies; 0 without one.
    pub hash: u64,
}

// Looked up on every request: a name given as `&str` is parsed and checked on each lookup.
const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");
const X_INFERENCE_GRANT: HeaderName = HeaderName::from_static("x-inference-grant");
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Seed of the callers' 64-bit hash: fixed, so the hash is the same on every replica.
const CALLER_HASH_SEED: u64 = 0x5377_6974_6368_7964;

impl Caller {
    fn from_key(key: String) -> Caller {
        Caller {
            hash: xxhash_rust::xxh3::xxh3_64_with_seed(key.as_bytes(), CALLER_HASH_SEED),
            key: Some(key.into()),
        }
    }
}

/// The credential a client presented: `Authorization: Bearer` or Anthropic's `x-api-key`.
pub fn presented_key(headers: &HeaderMap) -> Option<&str> {
    super::auth::bearer(headers)
        .or_else(|| headers.get(&X_API_KEY).and_then(|v| v.to_str().ok()))
        .filter(|k| !k.is_empty())
}

/// Derives the caller of a request.
pub fn identify(headers: &HeaderMap, peer: Option<SocketAddr>, trusted: &[IpNet]) -> Caller {
    if let Some(key) = presented_key(headers) {
        let digest = Sha256::digest(key.as_bytes());
        return Caller::from_key(format!("key:{}", hex::encode(&digest[..16])));
    }
    if let Some(grant) = headers
        .get(&X_INFERENCE_GRANT)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|g| !g.is_empty())
    {
        return Caller::from_key(format!("grant:{grant}"));
    }
    match peer.map(|p| client_ip(headers, p.ip(), trusted)) {
        Some(ip) => {
            let mut key = String::with_capacity("ip:".len() + 48);
            key.push_str("ip:");
            push_bucket(&mut key, ip);
            Caller::from_key(key)
        }
        None => Caller::default(),
    }
}

/// The client address: the peer, unless the peer is a trusted proxy, in which case the rightmost
/// `X-Forwarded-For` entry that is not itself a trusted proxy.
pub fn client_ip(headers: &HeaderMap, peer: IpAddr, trusted: &[IpNet]) -> IpAddr {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(&canonical(*ip)));
    if !is_trusted(&peer) {
        return peer;
    }
    let forwarded: Vec<IpAddr> = headers
        .get_all(&X_FORWARDED_FOR)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|part| part.trim().parse::<IpAddr>().ok())
        .collect();
    forwarded
        .iter()
        .rev()
        .find(|ip| !is_trusted(ip))
        .or_else(|| forwarded.first())
        .copied()
        .unwrap_or(peer)
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

/// Appends the bucket of `ip` to `key`: IPv4, the address; IPv6, its /64. Written in place: the
/// key of an anonymous caller is built on every request.
fn push_bucket(key: &mut String, ip: IpAddr) {
    use std::fmt::Write as _;
    match canonical(ip) {
        // By hand: `Ipv4Addr`'s `Display` formats each octet through `fmt` (about 1,000
        // instructions a request).
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    key.push('.');
                }
                if octet >= 100 {
                    key.push(char::from(b'0' + octet / 100));
                }
                if octet >= 10 {
                    key.push(char::from(b'0' + octet / 10 % 10));
                }
                key.push(char::from(b'0' + octet % 10));
            }
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            let prefix = Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0);
            // Writing to a `String` does not fail.
            let _ = write!(key, "{prefix}/64");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderValue, header};

    fn peer(ip: &str) -> Option<SocketAddr> {
        Some(SocketAddr::new(ip.parse().unwrap(), 40000))
    }

    #[test]
    fn api_keys_win_over_addresses() {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer sk-abc"),
        );
        let a = identify(&h, peer("10.0.0.1"), &[]);
        let mut h2 = HeaderMap::new();
        h2.insert("x-api-key", HeaderValue::from_static("sk-abc"));
        let b = identify(&h2, peer("10.0.0.2"), &[]);
        assert_eq!(a, b, "the same key from two addresses is one caller");
        assert!(a.key.as_deref().unwrap().starts_with("key:"));
        assert!(
            !a.key.as_deref().unwrap().contains("sk-abc"),
            "keys are hashed"
        );
    }

    #[test]
    fn the_caller_hash_is_the_same_on_every_replica_and_version() {
        // Strategies hash callers onto upstreams; replicas of a fleet, and a gateway after an
        // upgrade, must agree. Pinned values: a change here remaps every caller.
        let v4 = identify(&HeaderMap::new(), peer("192.0.2.7"), &[]);
        assert_eq!(v4.hash, 0x9e84_bb71_4da6_066a);
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer sk-abc"),
        );
        let keyed = identify(&h, peer("10.0.0.1"), &[]);
        // The key is SHA-256 of the API key (it leaves the process); the hash is XXH3 of the key.
        assert_eq!(
            keyed.key.as_deref(),
            Some("key:1460db1b6902f8b1fc2a40d9381a24d0")
        );
        assert_eq!(keyed.hash, 0xbe8d_8357_b9cd_e087);
    }

    #[test]
    fn an_ipv4_key_is_the_address_as_displayed() {
        for ip in [
            "0.0.0.0",
            "255.255.255.255",
            "10.0.100.9",
            "192.0.2.7",
            "1.20.199.250",
        ] {
            let caller = identify(&HeaderMap::new(), peer(ip), &[]);
            assert_eq!(caller.key.as_deref(), Some(format!("ip:{ip}").as_str()));
        }
    }

    #[test]
    fn ipv6_collapses_to_its_64() {
        let a = identify(&HeaderMap::new(), peer("2001:db8:1:2:aaaa::1"), &[]);
        let b = identify(&HeaderMap::new(), peer("2001:db8:1:2:bbbb::9"), &[]);
        let c = identify(&HeaderMap::new(), peer("2001:db8:1:3::1"), &[]);
        assert_eq!(a.key.as_deref(), Some("ip:2001:db8:1:2::/64"));
        assert_eq!(a, b);
        assert_ne!(a, c);
        let v4 = identify(&HeaderMap::new(), peer("::ffff:192.0.2.7"), &[]);
        assert_eq!(v4.key.as_deref(), Some("ip:192.0.2.7"));
    }

    #[test]
    fn forwarded_for_is_believed_only_from_trusted_proxies() {
        let mut h = HeaderMap::new();
        h.insert(
            "x-forwarded-for",
            HeaderValue::from_static("198.51.100.9, 10.0.0.5"),
        );
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        assert_eq!(
            client_ip(&h, "10.0.0.1".parse().unwrap(), &trusted).to_string(),
            "198.51.100.9"
        );
        assert_eq!(
            client_ip(&h, "203.0.113.1".parse().unwrap(), &trusted).to_string(),
            "203.0.113.1"
        );
        assert_eq!(
            client_ip(&h, "10.0.0.1".parse().unwrap(), &[]).to_string(),
            "10.0.0.1"
        );
    }
}
