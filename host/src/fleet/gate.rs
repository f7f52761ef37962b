//! Admission of the routes whose capacity every replica spends: quota pools (a daily request
//! count) and concurrency pools (slots in flight). One Lua script per kind, so the check and the
//! reservation are one atomic step in Redis: replicas never both take the last unit.
//!
//! - **Quota**: `{prefix}:quota:{pool}:{local date}` counts the attempts sent to the pool today,
//!   fleet-wide; an attempt that would exceed the pool's limit (the smallest `quota.limit` of its
//!   routes) is refused and not counted. The key expires two days later.
//! - **Concurrency**: `{prefix}:slots:{pool}` is a sorted set of held slots scored by their lease's
//!   expiry (Redis's own clock). A slot is leased for [`SLOT_LEASE`] and renewed by its replica
//!   while the attempt runs, so the slots of a replica that died come back within one lease.

use std::time::Duration;

use crate::config::ModelUpstream;

/// How long a concurrency slot lives without renewal.
pub const SLOT_LEASE: Duration = Duration::from_secs(15);

/// How often a replica renews the leases of the slots it holds.
pub const SLOT_RENEW: Duration = Duration::from_secs(3);

/// INCR the day's counter unless that passes the limit. KEYS[1] counter; ARGV[1] limit, ARGV[2]
/// expiry ms. Returns the count after the attempt, or -1 when refused.
pub const QUOTA_SCRIPT: &str = r"
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
if n > tonumber(ARGV[1]) then
  redis.call('DECR', KEYS[1])
  return -1
end
return n
";

/// Takes a slot unless the pool is full. KEYS[1] the pool's set; ARGV[1] limit, ARGV[2] lease ms,
/// ARGV[3] slot id. Expired leases are dropped first. Returns 1 when taken, 0 when full.
pub const SLOT_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 2)
return 1
";

/// Renews the leases of held slots. KEYS[1] the pool's set; ARGV[1] lease ms, ARGV[2..] slot ids.
pub const RENEW_SCRIPT: &str = r"
local t = redis.call('TIME')
local until = t[1] * 1000 + math.floor(t[2] / 1000) + tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', until, ARGV[i]) end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]) * 2)
return 1
";

/// A route's shared capacity, read from its metadata as RouteWise reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Capacity {
    /// `provider_type: quota` with `quota.limit`: requests per local day in `pool`.
    Quota { pool: String, limit: u64 },
    /// `provider_type: concurrency` with `concurrency.limit`: slots in `pool`.
    Concurrency { pool: String, limit: u64 },
}

impl Capacity {
    /// The route's capacity, if it has one the fleet can enforce. A quota route whose limit comes
    /// only from its provider's usage endpoint declares none here: RouteWise steers it from the
    /// snapshot, but the fleet has no number to hold it to.
    pub fn of(model: &str, upstream: &ModelUpstream) -> Option<Capacity> {
        let meta = &upstream.metadata;
        let kind = meta.get("provider_type")?.as_str()?;
        let (limit_key, pool_key) = match kind {
            "quota" => ("quota", "quota_pool"),
            "concurrency" => ("concurrency", "concurrency_pool"),
            _ => return None,
        };
        let limit = meta
            .get(limit_key)?
            .get("limit")?
            .as_u64()
            .filter(|&l| l > 0)?;
        let pool = meta
            .get(pool_key)
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| format!("{model}:{}", upstream.endpoint_id));
        Some(match kind {
            "quota" => Capacity::Quota { pool, limit },
            _ => Capacity::Concurrency { pool, limit },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(metadata: serde_json::Value) -> ModelUpstream {
        let yaml = format!(
            "models:\n  - id: m\n    route:\n      - kind: openai_compat\n        base_url: http://127.0.0.1:9/v1\n        metadata: {metadata}\n"
        );
        let config =
            crate::config::Config::from_yaml(std::path::Path::new("gate.yaml"), &yaml, &|_| None)
                .unwrap();
        let mut u = config.models[0].upstreams[0].clone();
        u.endpoint_id = "e1".into();
        u
    }

    #[test]
    fn capacity_is_read_like_routewise_reads_it() {
        assert_eq!(
            Capacity::of(
                "m",
                &upstream(serde_json::json!({"provider_type": "quota", "quota": {"limit": 5}}))
            ),
            Some(Capacity::Quota {
                pool: "m:e1".into(),
                limit: 5
            })
        );
        assert_eq!(
            Capacity::of(
                "m",
                &upstream(serde_json::json!({
                    "provider_type": "concurrency",
                    "concurrency": {"limit": 2},
                    "concurrency_pool": "gpu"
                }))
            ),
            Some(Capacity::Concurrency {
                pool: "gpu".into(),
                limit: 2
            })
        );
        assert_eq!(Capacity::of("m", &upstream(serde_json::json!({}))), None);
        assert_eq!(
            Capacity::of(
                "m",
                &upstream(serde_json::json!({"provider_type": "quota", "quota_source": {}}))
            ),
            None,
            "no declared limit: steered by RouteWise, not gated"
        );
    }
}
