//! Upstream metadata (`upstream.metadata-json`) as RouteWise reads it.
//!
//! ```json
//! {"provider_type": "quota", "quota": {"limit": 1000}, "quota_pool": "acct-1",
//!  "quota_snapshot": {"used": 120, "limit": 1000, "at_ms": 1767225600000}}
//! {"provider_type": "concurrency", "concurrency": {"limit": 4}, "concurrency_pool": "gpu-box"}
//! ```
//!
//! Other keys are ignored (the object is shared with other strategies and the host).

use serde::Deserialize;

/// How a route is paid for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderKind {
    /// Pay per token (`route.pricing`).
    OnDemand,
    /// A daily request quota, priced by scarcity.
    Quota,
    /// A fixed number of concurrent slots, free while one is open.
    Concurrency,
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OnDemand => "on_demand",
            Self::Quota => "quota",
            Self::Concurrency => "concurrency",
        }
    }
}

/// The host's latest reading of a quota pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub struct QuotaSnapshot {
    /// Requests used in the current quota period.
    pub used: u64,
    /// The pool's limit as the provider reports it (0: use the route's `quota.limit`).
    pub limit: u64,
    /// When the host read it (ms since the epoch).
    pub at_ms: u64,
}

/// What RouteWise needs from one route's metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteMeta {
    pub kind: ProviderKind,
    /// Quota or concurrency pool (empty for on-demand).
    pub pool: String,
    /// `quota.limit` or `concurrency.limit`.
    pub limit: Option<u64>,
    pub snapshot: Option<QuotaSnapshot>,
}

#[derive(Deserialize)]
struct Limit {
    limit: u64,
}

#[derive(Deserialize)]
struct Raw {
    provider_type: Option<String>,
    quota: Option<Limit>,
    concurrency: Option<Limit>,
    quota_pool: Option<String>,
    concurrency_pool: Option<String>,
    quota_snapshot: Option<QuotaSnapshot>,
}

impl RouteMeta {
    /// An on-demand route.
    pub fn on_demand() -> Self {
        Self {
            kind: ProviderKind::OnDemand,
            pool: String::new(),
            limit: None,
            snapshot: None,
        }
    }

    /// Parses `metadata_json` of the route `endpoint_id` of `model`. Errors name the key; the caller
    /// excludes such a route rather than guess how it is paid for.
    pub fn parse(model: &str, endpoint_id: &str, metadata_json: &str) -> Result<Self, String> {
        let json = metadata_json.trim();
        if json.is_empty() {
            return Ok(Self::on_demand());
        }
        let raw: Raw = serde_json::from_str(json).map_err(|e| format!("metadata: {e}"))?;
        let default_pool = || format!("{model}:{endpoint_id}");
        match raw.provider_type.as_deref().unwrap_or("on_demand") {
            "on_demand" => Ok(Self::on_demand()),
            "quota" => {
                let limit = raw.quota.map(|q| q.limit).filter(|&l| l > 0);
                let snapshot_limit = raw.quota_snapshot.map_or(0, |s| s.limit);
                if limit.is_none() && snapshot_limit == 0 {
                    return Err("metadata: quota route needs quota.limit > 0".to_owned());
                }
                Ok(Self {
                    kind: ProviderKind::Quota,
                    pool: raw.quota_pool.unwrap_or_else(default_pool),
                    limit,
                    snapshot: raw.quota_snapshot,
                })
            }
            "concurrency" => {
                let limit = raw.concurrency.map(|c| c.limit).filter(|&l| l > 0);
                if limit.is_none() {
                    return Err(
                        "metadata: concurrency route needs concurrency.limit > 0".to_owned()
                    );
                }
                Ok(Self {
                    kind: ProviderKind::Concurrency,
                    pool: raw.concurrency_pool.unwrap_or_else(default_pool),
                    limit,
                    snapshot: None,
                })
            }
            other => Err(format!(
                "metadata: provider_type `{other}` is not one of on_demand, quota, concurrency"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_to_on_demand() -> Result<(), String> {
        assert_eq!(RouteMeta::parse("m", "m:a", "{}")?, RouteMeta::on_demand());
        assert_eq!(RouteMeta::parse("m", "m:a", "")?, RouteMeta::on_demand());
        assert_eq!(
            RouteMeta::parse("m", "m:a", r#"{"other": 1}"#)?,
            RouteMeta::on_demand()
        );
        Ok(())
    }

    #[test]
    fn quota_and_concurrency_with_default_and_named_pools() -> Result<(), String> {
        let meta = RouteMeta::parse(
            "m",
            "m:a",
            r#"{"provider_type":"quota","quota":{"limit":100},
                "quota_snapshot":{"used":5,"limit":100,"at_ms":7}}"#,
        )?;
        assert_eq!(meta.kind, ProviderKind::Quota);
        assert_eq!(meta.pool, "m:m:a");
        assert_eq!(meta.limit, Some(100));
        assert_eq!(
            meta.snapshot,
            Some(QuotaSnapshot {
                used: 5,
                limit: 100,
                at_ms: 7
            })
        );
        let meta = RouteMeta::parse(
            "m",
            "m:b",
            r#"{"provider_type":"concurrency","concurrency":{"limit":2},"concurrency_pool":"box"}"#,
        )?;
        assert_eq!(meta.kind, ProviderKind::Concurrency);
        assert_eq!(meta.pool, "box");
        assert_eq!(meta.limit, Some(2));
        Ok(())
    }

    #[test]
    fn bad_metadata_is_an_error() {
        for json in [
            r#"{"provider_type":"quota"}"#,
            r#"{"provider_type":"concurrency","concurrency":{"limit":0}}"#,
            r#"{"provider_type":"spot"}"#,
            r#"{"provider_type":"quota","quota":{"limit":-1}}"#,
            "[1]",
            "not json",
        ] {
            assert!(RouteMeta::parse("m", "m:a", json).is_err(), "{json}");
        }
    }
}
