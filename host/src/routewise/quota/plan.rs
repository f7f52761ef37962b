//! From the routes' metadata to where each quota pool's snapshot comes from, and why it cannot
//! come from anywhere: computed from the config (and environment) alone, so `switchyard check`
//! can say it without touching the network.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::fetch::Provider;
use crate::config::{ModelConfig, ModelUpstream};

/// The refresh period when `router_params.quota_snapshot_refresh_interval_sec` is absent.
pub const DEFAULT_REFRESH_SEC: u64 = 60;

/// `metadata.quota_source`: which usage record of which fetcher is this route's quota. All three
/// fields must equal the record's exactly.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Selector {
    pub provider: String,
    pub usage_label: String,
    pub unit: String,
}

/// What a fetch needs; fetches with equal (provider, base, key) are made once per refresh.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchTarget {
    pub provider: Provider,
    /// The usage API's base URL (`{PROVIDER}_API_BASE`, else the provider's).
    pub base: String,
    pub key: String,
    /// Where the key came from (`env CHUTES_API_KEY`, `route m:chutes-llm`), for reports; the key
    /// itself is never shown.
    pub key_from: String,
}

impl FetchTarget {
    /// The identity of one fetch.
    pub fn id(&self) -> (Provider, &str, &str) {
        (self.provider, &self.base, &self.key)
    }
}

/// Where a pool's snapshot comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// A fetcher's record, matched by the selector.
    Fetch {
        selector: Selector,
        target: FetchTarget,
    },
    /// The gateway-side request counter, against this daily limit.
    Local { limit: u64, why: LocalWhy },
    /// Nowhere: the pool's routes get no snapshot.
    Unresolved(Unresolved),
}

/// Why a pool is counted by the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalWhy {
    /// `local_quota_fallback: true` on a route of the pool.
    Declared,
    /// The route's `quota_source` names one provider's usage, but its upstream is another
    /// provider's (its `base_url` host): the named provider's record would not count these
    /// requests, so the gateway counts them.
    OtherProvider { named: Provider, upstream: Provider },
}

impl std::fmt::Display for LocalWhy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LocalWhy::Declared => f.write_str("local_quota_fallback: true"),
            LocalWhy::OtherProvider { named, upstream } => write!(
                f,
                "quota_source names {named}, but the upstream is a {upstream} host, so {named}'s \
                 usage would not count its requests"
            ),
        }
    }
}

/// Why a quota route gets no snapshot.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unresolved {
    /// Neither `quota_source` nor `local_quota_fallback: true` on any upstream of the pool.
    #[error(
        "no `quota_source` and no `local_quota_fallback: true` on the route or its pool, so \
         nothing fills its quota_snapshot"
    )]
    NoSource,
    /// `quota_source` is not `{provider, usage_label, unit}`.
    #[error("`quota_source` must be {{provider, usage_label, unit}}: {0}")]
    Malformed(String),
    /// `quota_source.provider` has no registered fetcher.
    #[error(
        "unknown quota_source provider `{provider}`: the registered fetchers are chutes and \
         minimax{hint}"
    )]
    UnknownProvider {
        provider: String,
        hint: &'static str,
    },
    /// The fetcher never emits a record with this label and unit.
    #[error(
        "the {provider} fetcher emits no record labelled `{label}` in unit `{unit}`; it emits {}",
        .provider.emits()
    )]
    UnknownLabel {
        provider: Provider,
        label: String,
        unit: String,
    },
    /// No key for the fetcher in the environment or on a route of the provider's host.
    #[error(
        "no API key for the {provider} fetcher: set {} or put the provider's own key on a route \
         whose base_url is on a {provider} host",
        .provider.key_env()
    )]
    NoKey { provider: Provider },
    /// A local counter without a limit to count against.
    #[error(
        "local_quota_fallback needs `quota.limit` (requests per local day) on an upstream of the pool"
    )]
    LocalNeedsLimit,
    /// The last fetch failed; the previous snapshot, if any, is kept and ages.
    #[error("the last {provider} usage fetch failed: {error}")]
    FetchFailed { provider: Provider, error: String },
    /// The fetch worked but no record matched the selector.
    #[error(
        "the {provider} usage answer has no record labelled `{label}` in unit `{unit}`; it had: \
         {found}"
    )]
    NoRecord {
        provider: Provider,
        label: String,
        unit: String,
        found: String,
    },
}

impl Unresolved {
    /// A short machine-readable name of the reason.
    pub fn kind(&self) -> &'static str {
        match self {
            Unresolved::NoSource => "no_source",
            Unresolved::Malformed(_) => "malformed_selector",
            Unresolved::UnknownProvider { .. } => "unknown_provider",
            Unresolved::UnknownLabel { .. } => "unknown_label",
            Unresolved::NoKey { .. } => "no_key",
            Unresolved::LocalNeedsLimit => "no_limit",
            Unresolved::FetchFailed { .. } => "fetch_failed",
            Unresolved::NoRecord { .. } => "no_matching_record",
        }
    }
}

/// One quota route whose snapshot does not resolve.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "model `{model}`, endpoint `{endpoint_id}` (quota pool `{pool}`): no quota snapshot: {reason}"
)]
pub struct Diagnostic {
    pub model: String,
    pub endpoint_id: String,
    pub pool: String,
    pub reason: Unresolved,
}

/// One quota route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutePlan {
    pub model: String,
    pub endpoint_id: String,
    pub pool: String,
}

/// One quota pool: its routes and where its snapshot comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolPlan {
    pub name: String,
    pub resolution: Resolution,
    /// The route whose declaration decides the source; None when no route declares one.
    pub owner: Option<String>,
    /// Models with a route in the pool, in config order.
    pub models: Vec<String>,
    /// The smallest `quota.limit` of the pool's routes.
    pub limit: Option<u64>,
    /// The smallest refresh period of the pool's models.
    pub refresh_ms: u64,
}

/// Every quota route and pool of a set of models.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuotaPlan {
    /// Quota routes in config order.
    pub routes: Vec<RoutePlan>,
    pub pools: BTreeMap<String, PoolPlan>,
}

/// What a route declares as its pool's source.
enum Declared {
    Nothing,
    Local(LocalWhy),
    Selector(Selector),
    Malformed(String),
}

/// The registered provider whose host the route's `base_url` is on, if any.
fn upstream_provider(route: &ModelUpstream) -> Option<Provider> {
    let host = host_of(route)?;
    Provider::ALL.into_iter().find(|p| p.serves_host(&host))
}

/// The local counter has two triggers (as in the seed): `local_quota_fallback: true`, or a route
/// whose provider (the one its `quota_source` names) is not its upstream's provider.
fn declared(route: &ModelUpstream) -> Declared {
    if route
        .metadata
        .get("local_quota_fallback")
        .and_then(serde_json::Value::as_bool)
        == Some(true)
    {
        return Declared::Local(LocalWhy::Declared);
    }
    match route.metadata.get("quota_source") {
        None | Some(serde_json::Value::Null) => Declared::Nothing,
        Some(v) => match Selector::deserialize(v) {
            Ok(s) => match (Provider::from_name(&s.provider), upstream_provider(route)) {
                (Some(named), Some(upstream)) if named != upstream => {
                    Declared::Local(LocalWhy::OtherProvider { named, upstream })
                }
                _ => Declared::Selector(s),
            },
            Err(e) => Declared::Malformed(e.to_string()),
        },
    }
}

/// `metadata.quota.limit`, when positive.
fn declared_limit(route: &ModelUpstream) -> Option<u64> {
    route
        .metadata
        .get("quota")
        .and_then(|q| q.get("limit"))
        .and_then(serde_json::Value::as_u64)
        .filter(|&l| l > 0)
}

/// `metadata.quota_pool`, else RouteWise's default `{model}:{endpoint_id}`.
pub fn pool_name(model: &str, route: &ModelUpstream) -> String {
    route
        .metadata
        .get("quota_pool")
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned)
        .unwrap_or_else(|| format!("{model}:{}", route.endpoint_id))
}

fn refresh_ms(model: &ModelConfig) -> u64 {
    model
        .router_params
        .get("quota_snapshot_refresh_interval_sec")
        .and_then(serde_json::Value::as_u64)
        .filter(|&s| s > 0)
        .unwrap_or(DEFAULT_REFRESH_SEC)
        .saturating_mul(1000)
}

fn host_of(route: &ModelUpstream) -> Option<String> {
    url::Url::parse(&route.base_url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_owned))
}

/// The key for `provider`: the environment, else the owner route's key when its host is the
/// provider's, else the first route of the provider's host that has a key.
fn find_key(
    provider: Provider,
    owner: Option<&ModelUpstream>,
    all: &[&ModelUpstream],
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<(String, String)> {
    if let Some(key) = env(provider.key_env()).filter(|k| !k.trim().is_empty()) {
        return Some((key.trim().to_owned(), format!("env {}", provider.key_env())));
    }
    let serves = |r: &&ModelUpstream| host_of(r).is_some_and(|h| provider.serves_host(&h));
    owner
        .into_iter()
        .chain(all.iter().copied())
        .filter(serves)
        .find_map(|r| {
            r.api_key
                .clone()
                .map(|k| (k, format!("upstream {}", r.endpoint_id)))
        })
}

fn resolve(
    declared: Declared,
    owner: Option<&ModelUpstream>,
    limit: Option<u64>,
    all: &[&ModelUpstream],
    env: &dyn Fn(&str) -> Option<String>,
) -> Resolution {
    let unresolved = Resolution::Unresolved;
    match declared {
        Declared::Nothing => unresolved(Unresolved::NoSource),
        Declared::Malformed(e) => unresolved(Unresolved::Malformed(e)),
        Declared::Local(why) => match limit {
            Some(limit) => Resolution::Local { limit, why },
            None => unresolved(Unresolved::LocalNeedsLimit),
        },
        Declared::Selector(selector) => {
            let Some(provider) = Provider::from_name(&selector.provider) else {
                let hint = if selector.provider == "local" {
                    " (`local` is not a fetcher: set `local_quota_fallback: true` for the \
                     gateway-side request counter)"
                } else {
                    ""
                };
                return unresolved(Unresolved::UnknownProvider {
                    provider: selector.provider,
                    hint,
                });
            };
            if !provider.may_emit(&selector.usage_label, &selector.unit) {
                return unresolved(Unresolved::UnknownLabel {
                    provider,
                    label: selector.usage_label,
                    unit: selector.unit,
                });
            }
            let Some((key, key_from)) = find_key(provider, owner, all, env) else {
                return unresolved(Unresolved::NoKey { provider });
            };
            let base = env(provider.base_env())
                .map(|b| b.trim().trim_end_matches('/').to_owned())
                .filter(|b| !b.is_empty())
                .unwrap_or_else(|| provider.default_base().to_owned());
            Resolution::Fetch {
                selector,
                target: FetchTarget {
                    provider,
                    base,
                    key,
                    key_from,
                },
            }
        }
    }
}

impl QuotaPlan {
    /// The plan of `models`' quota routes; `env` looks up keys and base URLs.
    pub fn build<'a>(
        models: impl IntoIterator<Item = &'a ModelConfig>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> QuotaPlan {
        let models: Vec<&ModelConfig> = models.into_iter().collect();
        let all: Vec<&ModelUpstream> = models.iter().flat_map(|m| m.upstreams.iter()).collect();
        let mut plan = QuotaPlan::default();
        // Per pool: (owner route, its declaration).
        let mut owners: BTreeMap<String, (&ModelUpstream, Declared)> = BTreeMap::new();
        for model in &models {
            for route in model.upstreams.iter().filter(|r| super::is_quota_route(r)) {
                let pool = pool_name(&model.id, route);
                plan.routes.push(RoutePlan {
                    model: model.id.clone(),
                    endpoint_id: route.endpoint_id.clone(),
                    pool: pool.clone(),
                });
                let entry = plan.pools.entry(pool.clone()).or_insert_with(|| PoolPlan {
                    name: pool.clone(),
                    resolution: Resolution::Unresolved(Unresolved::NoSource),
                    owner: None,
                    models: Vec::new(),
                    limit: None,
                    refresh_ms: u64::MAX,
                });
                if !entry.models.contains(&model.id) {
                    entry.models.push(model.id.clone());
                }
                entry.refresh_ms = entry.refresh_ms.min(refresh_ms(model));
                if let Some(limit) = declared_limit(route) {
                    entry.limit = Some(entry.limit.map_or(limit, |l| l.min(limit)));
                }
                if let std::collections::btree_map::Entry::Vacant(slot) = owners.entry(pool) {
                    match declared(route) {
                        Declared::Nothing => {}
                        d => {
                            entry.owner = Some(route.endpoint_id.clone());
                            slot.insert((route, d));
                        }
                    }
                }
            }
        }
        for (name, pool) in &mut plan.pools {
            let (owner, declared) = match owners.remove(name) {
                Some((route, d)) => (Some(route), d),
                None => (None, Declared::Nothing),
            };
            pool.resolution = resolve(declared, owner, pool.limit, &all, env);
        }
        plan
    }

    /// The pool of a quota route.
    pub fn pool_of(&self, endpoint_id: &str) -> Option<&PoolPlan> {
        self.routes
            .iter()
            .find(|r| r.endpoint_id == endpoint_id)
            .and_then(|r| self.pools.get(&r.pool))
    }

    /// One diagnostic per quota route whose pool does not resolve, in config order; known from the
    /// config alone (fetch failures come from [`super::QuotaBoard::diagnostics`]).
    pub fn diagnostics(&self) -> Vec<Diagnostic> {
        self.routes
            .iter()
            .filter_map(|r| {
                let pool = self.pools.get(&r.pool)?;
                match &pool.resolution {
                    Resolution::Unresolved(reason) => Some(Diagnostic {
                        model: r.model.clone(),
                        endpoint_id: r.endpoint_id.clone(),
                        pool: r.pool.clone(),
                        reason: reason.clone(),
                    }),
                    _ => None,
                }
            })
            .collect()
    }
}
