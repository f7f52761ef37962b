//! The whole configuration in memory, indexed for the request path, and the cache that keeps the
//! latest good one while reloading on every change.
//!
//! The request path never queries the database: it holds an `Arc<Snapshot>` from
//! [`SnapshotCache::current`]. A failed reload keeps the previous snapshot and is reported by
//! [`SnapshotCache::status`], so an unreachable database degrades to "configuration frozen", not
//! to an outage.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;
use tokio::sync::watch;
use utoipa::ToSchema;

use super::StoreError;
use super::config_store::ConfigStore;
use crate::entity::*;

/// The rows of every configuration table, as read in one transaction.
#[derive(Debug, Default)]
pub struct SnapshotRows {
    pub version: i64,
    pub routes: Vec<Route>,
    pub plugin_configs: Vec<PluginConfig>,
    pub consumers: Vec<Consumer>,
    pub consumer_keys: Vec<ConsumerKey>,
    pub providers: Vec<Provider>,
    pub upstreams: Vec<Upstream>,
    pub upstream_keys: Vec<UpstreamKey>,
    pub upstream_models: Vec<UpstreamModel>,
    pub key_reservations: Vec<KeyReservation>,
    pub budgets: Vec<Budget>,
    /// RouteWise settings, both layers ([`crate::routewise::store`]).
    pub routewise_settings: Vec<crate::routewise::store::RouteWiseSetting>,
}

/// The configuration at one version, with indexes for lookups in O(1).
#[derive(Debug, Default)]
pub struct Snapshot {
    /// The `config_version` it was read at; `-1` for the empty snapshot before the first load.
    pub version: i64,
    /// When it was read, Unix milliseconds.
    pub loaded_at_ms: i64,
    pub rows: SnapshotRows,
    routes_by_id: HashMap<String, usize>,
    /// Enabled plugin configs per route id, ordered by plugin name.
    plugins_by_route: HashMap<String, Vec<usize>>,
    consumers_by_id: HashMap<String, usize>,
    /// Consumer keys by the SHA-256 (hex) of their secret.
    keys_by_hash: HashMap<String, usize>,
    providers_by_id: HashMap<String, usize>,
    upstreams_by_id: HashMap<String, usize>,
    keys_by_upstream: HashMap<String, Vec<usize>>,
    models_by_name: HashMap<String, Vec<usize>>,
    /// Budgets by `(scope, subject)`.
    budgets_by_subject: HashMap<(BudgetScope, String), usize>,
}

/// A consumer key that authenticates: the key and its consumer.
#[derive(Debug, Clone, Copy)]
pub struct Authenticated<'a> {
    pub consumer: &'a Consumer,
    pub key: &'a ConsumerKey,
}

/// Why a presented consumer key does not authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyRejection {
    #[error("unknown API key")]
    Unknown,
    #[error("this API key has been revoked")]
    Revoked,
    #[error("this API key has expired")]
    Expired,
    #[error("this API key's consumer is disabled")]
    ConsumerDisabled,
}

/// Where a public model can be served: the mapping, its upstream and the upstream's provider.
#[derive(Debug, Clone, Copy)]
pub struct ModelTarget<'a> {
    pub mapping: &'a UpstreamModel,
    pub upstream: &'a Upstream,
    pub provider: &'a Provider,
}

fn index_by<T>(items: &[T], key: impl Fn(&T) -> &str) -> HashMap<String, usize> {
    items
        .iter()
        .enumerate()
        .map(|(i, item)| (key(item).to_owned(), i))
        .collect()
}

fn group_by<T>(items: &[T], key: impl Fn(&T) -> Option<&str>) -> HashMap<String, Vec<usize>> {
    let mut map: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, item) in items.iter().enumerate() {
        if let Some(k) = key(item) {
            map.entry(k.to_owned()).or_default().push(i);
        }
    }
    map
}

impl Snapshot {
    /// The empty configuration, before anything was loaded.
    pub fn empty() -> Snapshot {
        Snapshot {
            version: -1,
            ..Snapshot::default()
        }
    }

    /// Indexes `rows`.
    pub fn build(mut rows: SnapshotRows, loaded_at_ms: i64) -> Snapshot {
        rows.plugin_configs
            .sort_by(|a, b| (&a.route_id, &a.plugin).cmp(&(&b.route_id, &b.plugin)));
        let plugins_by_route = group_by(&rows.plugin_configs, |p| {
            p.enabled.then_some(p.route_id.as_str())
        });
        Snapshot {
            version: rows.version,
            loaded_at_ms,
            routes_by_id: index_by(&rows.routes, |r| &r.id),
            plugins_by_route,
            consumers_by_id: index_by(&rows.consumers, |c| &c.id),
            keys_by_hash: index_by(&rows.consumer_keys, |k| &k.key_hash),
            providers_by_id: index_by(&rows.providers, |p| &p.id),
            upstreams_by_id: index_by(&rows.upstreams, |u| &u.id),
            keys_by_upstream: group_by(&rows.upstream_keys, |k| Some(&k.upstream_id)),
            models_by_name: group_by(&rows.upstream_models, |m| Some(&m.model)),
            budgets_by_subject: rows
                .budgets
                .iter()
                .enumerate()
                .map(|(i, b)| ((b.scope, b.subject.clone()), i))
                .collect(),
            rows,
        }
    }

    /// The consumer whose key is `secret`, if the key is neither revoked nor expired at `now`
    /// (Unix seconds) and the consumer is not disabled. Hashes the secret and looks the hash up:
    /// O(1), and the time taken says nothing about how close a guess was.
    pub fn authenticate(&self, secret: &str, now: i64) -> Result<Authenticated<'_>, KeyRejection> {
        let key = self
            .keys_by_hash
            .get(&hash_secret(secret))
            .map(|&i| &self.rows.consumer_keys[i])
            .ok_or(KeyRejection::Unknown)?;
        if key.revoked_at.is_some() {
            return Err(KeyRejection::Revoked);
        }
        if key.expires_at.is_some_and(|at| at <= now) {
            return Err(KeyRejection::Expired);
        }
        let consumer = self
            .consumer(&key.consumer_id)
            .ok_or(KeyRejection::Unknown)?;
        if consumer.disabled {
            return Err(KeyRejection::ConsumerDisabled);
        }
        Ok(Authenticated { consumer, key })
    }

    pub fn route(&self, id: &str) -> Option<&Route> {
        self.routes_by_id.get(id).map(|&i| &self.rows.routes[i])
    }

    pub fn routes(&self) -> &[Route] {
        &self.rows.routes
    }

    /// The route's enabled plugin configs, ordered by plugin name.
    pub fn route_plugins(&self, route_id: &str) -> impl Iterator<Item = &PluginConfig> {
        self.plugins_by_route
            .get(route_id)
            .into_iter()
            .flatten()
            .map(|&i| &self.rows.plugin_configs[i])
    }

    /// The route's enabled plugin configs as `plugin name → config`.
    pub fn route_plugin_map(&self, route_id: &str) -> BTreeMap<&str, &serde_json::Value> {
        self.route_plugins(route_id)
            .map(|p| (p.plugin.as_str(), &p.config))
            .collect()
    }

    pub fn consumer(&self, id: &str) -> Option<&Consumer> {
        self.consumers_by_id
            .get(id)
            .map(|&i| &self.rows.consumers[i])
    }

    pub fn provider(&self, id: &str) -> Option<&Provider> {
        self.providers_by_id
            .get(id)
            .map(|&i| &self.rows.providers[i])
    }

    pub fn upstream(&self, id: &str) -> Option<&Upstream> {
        self.upstreams_by_id
            .get(id)
            .map(|&i| &self.rows.upstreams[i])
    }

    /// The upstream's keys, enabled or not.
    pub fn upstream_keys(&self, upstream_id: &str) -> impl Iterator<Item = &UpstreamKey> {
        self.keys_by_upstream
            .get(upstream_id)
            .into_iter()
            .flatten()
            .map(|&i| &self.rows.upstream_keys[i])
    }

    /// What the upstream serves: its own list, else its provider's defaults.
    pub fn capabilities<'a>(&'a self, upstream: &'a Upstream) -> &'a [Capability] {
        match &upstream.capabilities {
            Some(caps) => caps,
            None => self
                .provider(&upstream.provider_id)
                .map(|p| p.default_capabilities.as_slice())
                .unwrap_or_default(),
        }
    }

    /// Every upstream mapped to the public model `model`, enabled or not, highest priority first.
    pub fn model_targets(&self, model: &str) -> Vec<ModelTarget<'_>> {
        let mut targets: Vec<ModelTarget<'_>> = self
            .models_by_name
            .get(model)
            .into_iter()
            .flatten()
            .filter_map(|&i| {
                let mapping = &self.rows.upstream_models[i];
                let upstream = self.upstream(&mapping.upstream_id)?;
                let provider = self.provider(&upstream.provider_id)?;
                Some(ModelTarget {
                    mapping,
                    upstream,
                    provider,
                })
            })
            .collect();
        targets.sort_by(|a, b| {
            b.upstream
                .priority
                .cmp(&a.upstream.priority)
                .then_with(|| a.upstream.id.cmp(&b.upstream.id))
        });
        targets
    }

    pub fn budgets(&self) -> &[Budget] {
        &self.rows.budgets
    }

    /// The budgets that apply to a consumer with these groups: its own, then each group's
    /// (`default` for a consumer without groups, as for rate limits).
    pub fn budgets_of<'a>(
        &'a self,
        consumer_id: &str,
        groups: &[String],
    ) -> impl Iterator<Item = &'a Budget> + 'a {
        let default = [crate::config::DEFAULT_GROUP.to_owned()];
        let groups = if groups.is_empty() {
            &default[..]
        } else {
            groups
        };
        let own = self
            .budgets_by_subject
            .get(&(BudgetScope::Consumer, consumer_id.to_owned()))
            .copied();
        let mut of_groups: Vec<usize> = groups
            .iter()
            .filter_map(|g| {
                self.budgets_by_subject
                    .get(&(BudgetScope::Group, g.clone()))
                    .copied()
            })
            .collect();
        of_groups.sort_unstable();
        of_groups.dedup();
        own.into_iter()
            .chain(of_groups)
            .map(|i| &self.rows.budgets[i])
    }

    /// How many rows of each kind, for status pages.
    pub fn counts(&self) -> SnapshotCounts {
        let r = &self.rows;
        SnapshotCounts {
            routes: r.routes.len(),
            plugin_configs: r.plugin_configs.len(),
            consumers: r.consumers.len(),
            consumer_keys: r.consumer_keys.len(),
            providers: r.providers.len(),
            upstreams: r.upstreams.len(),
            upstream_keys: r.upstream_keys.len(),
            upstream_models: r.upstream_models.len(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct SnapshotCounts {
    pub routes: usize,
    pub plugin_configs: usize,
    pub consumers: usize,
    pub consumer_keys: usize,
    pub providers: usize,
    pub upstreams: usize,
    pub upstream_keys: usize,
    pub upstream_models: usize,
}

/// How the in-memory snapshot stands against the database.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct SyncStatus {
    /// The version of the snapshot in use; `null` before the first successful load.
    pub snapshot_version: Option<i64>,
    /// The newest version the change feed reported.
    pub store_version: Option<i64>,
    /// When the snapshot in use was loaded, Unix milliseconds.
    pub last_loaded_at_ms: Option<i64>,
    /// The last failed load, if it failed after the last success.
    pub last_error: Option<String>,
    pub last_error_at_ms: Option<i64>,
    /// Failed loads since the last success.
    pub consecutive_failures: u32,
    /// The change feed (SQLite: polling the version; PostgreSQL: LISTEN and its safety poll). A
    /// failing feed means changes made elsewhere are not seen, though no reload failed.
    pub change_feed: super::health::TaskHealth,
}

/// The current snapshot and how its loading goes. Cheap to read from any thread.
pub struct SnapshotCache {
    current: watch::Sender<Arc<Snapshot>>,
    status: Mutex<SyncStatus>,
    /// One load at a time: a reload started by a change must not be overtaken by an older one.
    loading: tokio::sync::Mutex<()>,
}

impl Default for SnapshotCache {
    fn default() -> Self {
        SnapshotCache {
            current: watch::Sender::new(Arc::new(Snapshot::empty())),
            status: Mutex::new(SyncStatus::default()),
            loading: tokio::sync::Mutex::new(()),
        }
    }
}

impl std::fmt::Debug for SnapshotCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotCache")
            .field("status", &*self.status.lock())
            .finish_non_exhaustive()
    }
}

impl SnapshotCache {
    /// The last successfully loaded snapshot (empty before the first).
    pub fn current(&self) -> Arc<Snapshot> {
        self.current.borrow().clone()
    }

    /// A receiver that sees every new snapshot, for whoever rebuilds derived state on change.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.current.subscribe()
    }

    pub fn status(&self) -> SyncStatus {
        self.status.lock().clone()
    }

    /// Loads a snapshot from `store` and makes it current, unless one at least as new is already
    /// current. On failure the current snapshot stays and the error is recorded.
    pub async fn reload(&self, store: &dyn ConfigStore) -> Result<Arc<Snapshot>, StoreError> {
        let _one_at_a_time = self.loading.lock().await;
        match store.load_snapshot().await {
            Ok(snapshot) => {
                let loaded_at = snapshot.loaded_at_ms;
                let version = snapshot.version;
                let snapshot = Arc::new(snapshot);
                self.current.send_if_modified(|current| {
                    if current.version < version {
                        *current = snapshot.clone();
                        true
                    } else {
                        false
                    }
                });
                let mut status = self.status.lock();
                status.snapshot_version = Some(self.current.borrow().version);
                status.store_version = Some(status.store_version.unwrap_or(version).max(version));
                status.last_loaded_at_ms = Some(loaded_at);
                status.last_error = None;
                status.last_error_at_ms = None;
                status.consecutive_failures = 0;
                Ok(self.current())
            }
            Err(e) => {
                let mut status = self.status.lock();
                status.last_error = Some(e.to_string());
                status.last_error_at_ms =
                    Some(i64::try_from(crate::clock::unix_ms()).unwrap_or(i64::MAX));
                status.consecutive_failures += 1;
                Err(e)
            }
        }
    }

    fn saw_version(&self, version: i64) {
        let mut status = self.status.lock();
        status.store_version = Some(status.store_version.unwrap_or(version).max(version));
    }

    /// Keeps the snapshot current until `cache` or `store` is dropped: loads now, then again
    /// whenever the change feed moves past the loaded version. A failed load is retried with
    /// backoff (0.5 s doubling to 10 s) even without a new change.
    pub(crate) async fn run(
        cache: std::sync::Weak<SnapshotCache>,
        store: std::sync::Weak<dyn ConfigStore>,
    ) {
        const FIRST_RETRY: Duration = Duration::from_millis(500);
        const MAX_RETRY: Duration = Duration::from_secs(10);
        let mut versions = match store.upgrade() {
            Some(store) => store.watch(),
            None => return,
        };
        let mut retry = FIRST_RETRY;
        loop {
            let (Some(cache_ref), Some(store_ref)) = (cache.upgrade(), store.upgrade()) else {
                return;
            };
            let wanted = *versions.borrow_and_update();
            cache_ref.saw_version(wanted);
            let loaded = cache_ref.current.borrow().version;
            let failed = if loaded == -1 || wanted > loaded {
                match cache_ref.reload(&*store_ref).await {
                    Ok(_) => false,
                    Err(e) => {
                        tracing::warn!(
                            "reloading the configuration failed; still serving version {loaded}: {e}"
                        );
                        true
                    }
                }
            } else {
                false
            };
            drop((cache_ref, store_ref));
            if failed {
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(MAX_RETRY);
                continue;
            }
            retry = FIRST_RETRY;
            // Wake up now and then even without a change, to notice that the store is gone.
            if let Ok(Err(_closed)) =
                tokio::time::timeout(Duration::from_secs(5), versions.changed()).await
            {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str, consumer: &str, secret: &str) -> ConsumerKey {
        ConsumerKey {
            id: id.into(),
            consumer_id: consumer.into(),
            key_hash: hash_secret(secret),
            prefix: secret.chars().take(8).collect(),
            groups: vec![],
            expires_at: None,
            revoked_at: None,
            created_at: 1,
            updated_at: 1,
        }
    }

    fn consumer(id: &str, disabled: bool) -> Consumer {
        Consumer {
            id: id.into(),
            name: id.into(),
            groups: vec![],
            role: Role::Pro,
            disabled,
            created_at: 1,
            updated_at: 1,
        }
    }

    #[test]
    fn authenticate_honours_revocation_expiry_and_disabled_consumers() {
        let mut expired = key("k2", "c1", "sk-sy-expired");
        expired.expires_at = Some(100);
        let mut revoked = key("k3", "c1", "sk-sy-revoked");
        revoked.revoked_at = Some(50);
        let snapshot = Snapshot::build(
            SnapshotRows {
                version: 3,
                consumers: vec![consumer("c1", false), consumer("c2", true)],
                consumer_keys: vec![
                    key("k1", "c1", "sk-sy-good"),
                    expired,
                    revoked,
                    key("k4", "c2", "sk-sy-disabled"),
                ],
                ..SnapshotRows::default()
            },
            0,
        );
        let ok = snapshot.authenticate("sk-sy-good", 200).unwrap();
        assert_eq!((ok.consumer.id.as_str(), ok.key.id.as_str()), ("c1", "k1"));
        assert_eq!(
            snapshot.authenticate("sk-sy-expired", 99).unwrap().key.id,
            "k2"
        );
        assert_eq!(
            snapshot.authenticate("sk-sy-expired", 100).unwrap_err(),
            KeyRejection::Expired
        );
        assert_eq!(
            snapshot.authenticate("sk-sy-revoked", 0).unwrap_err(),
            KeyRejection::Revoked
        );
        assert_eq!(
            snapshot.authenticate("sk-sy-disabled", 0).unwrap_err(),
            KeyRejection::ConsumerDisabled
        );
        assert_eq!(
            snapshot.authenticate("sk-sy-nope", 0).unwrap_err(),
            KeyRejection::Unknown
        );
    }
}
