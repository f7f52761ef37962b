//! The quota board: the latest snapshot of every quota pool, the local request counter, and what
//! is wrong with the pools that have none. One per process, shared by the refresh loop, the
//! dispatch path (counting), table rebuilds (re-applying snapshots) and `/health/deep`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::json;

use super::counter::{Clock, LocalCounter, SystemClock};
use super::plan::{Diagnostic, PoolPlan, QuotaPlan, Resolution, Unresolved};
use super::{QuotaSnapshot, is_quota_route};
use crate::config::ModelUpstream;

/// The longest the refresh loop sleeps, so routes added at run time are planned within a minute.
pub const MAX_WAKE: Duration = Duration::from_secs(60);
/// The shortest it sleeps.
const MIN_WAKE: Duration = Duration::from_millis(250);

/// What the board knows about one pool between refreshes.
#[derive(Debug, Clone, Default)]
pub(super) struct PoolLive {
    pub snapshot: Option<QuotaSnapshot>,
    /// Why the last refresh gave no snapshot (failed fetch, no matching record).
    pub error: Option<Unresolved>,
    pub last_refresh_ms: Option<u64>,
    pub next_due_ms: u64,
}

#[derive(Debug, Default)]
pub(super) struct BoardState {
    pub plan: QuotaPlan,
    /// Endpoint id → pool, for the pools counted locally.
    pub local_pools: HashMap<String, String>,
    pub counter: LocalCounter,
    pub pools: HashMap<String, PoolLive>,
    /// The diagnostic last logged per endpoint, so each change is logged once.
    pub logged: HashMap<String, String>,
}

/// The latest quota snapshots and the local counter. See the [module docs](super).
pub struct QuotaBoard {
    pub(super) clock: Arc<dyn Clock>,
    pub(super) state: Mutex<BoardState>,
    /// The fleet's count of each pool's requests today, when a fleet shares them.
    shared: std::sync::OnceLock<Arc<dyn SharedQuotaCounts>>,
}

/// Requests sent to a quota pool on a local day by every replica of a fleet
/// ([`crate::fleet::Fleet`] counts them as it admits them).
pub trait SharedQuotaCounts: Send + Sync {
    /// The fleet's count, if it has one for that pool and day.
    fn used(&self, pool: &str, day: chrono::NaiveDate) -> Option<u64>;
}

impl std::fmt::Debug for QuotaBoard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuotaBoard").finish_non_exhaustive()
    }
}

impl Default for QuotaBoard {
    fn default() -> Self {
        Self::new()
    }
}

impl QuotaBoard {
    /// An empty board on the system clock and time zone.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// An empty board reading time from `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            state: Mutex::new(BoardState::default()),
            shared: std::sync::OnceLock::new(),
        }
    }

    /// Installs a new plan: pools that disappeared are forgotten, the others keep their snapshot.
    pub fn set_plan(&self, plan: QuotaPlan) {
        let mut state = self.state.lock();
        state.local_pools = plan
            .routes
            .iter()
            .filter(|r| {
                plan.pools
                    .get(&r.pool)
                    .is_some_and(|p| matches!(p.resolution, Resolution::Local { .. }))
            })
            .map(|r| (r.endpoint_id.clone(), r.pool.clone()))
            .collect();
        state.pools.retain(|name, _| plan.pools.contains_key(name));
        state.plan = plan;
    }

    /// Counts one request dispatched to `endpoint_id` against its pool's local counter; nothing
    /// for routes that are not counted locally. Called once per attempt sent upstream.
    pub fn count_request(&self, endpoint_id: &str) {
        let mut state = self.state.lock();
        let BoardState {
            local_pools,
            counter,
            ..
        } = &mut *state;
        if let Some(pool) = local_pools.get(endpoint_id) {
            let today = self.clock.local_date(self.clock.now_ms());
            counter.count(pool, today);
        }
    }

    /// Writes the latest snapshot of each quota route's pool into its `metadata.quota_snapshot`
    /// (routes without one are left as they are).
    pub fn apply_snapshots(&self, routes: &mut [ModelUpstream]) {
        let state = self.state.lock();
        for route in routes.iter_mut().filter(|r| is_quota_route(r)) {
            let snapshot = state
                .plan
                .pool_of(&route.endpoint_id)
                .and_then(|p| state.pools.get(&p.name))
                .and_then(|live| live.snapshot);
            if let Some(s) = snapshot {
                route.metadata.insert(
                    "quota_snapshot".to_owned(),
                    json!({ "used": s.used, "limit": s.limit, "at_ms": s.at_ms }),
                );
            }
        }
    }

    /// A copy of `routes` with the latest snapshots applied: what is pushed to a router.
    pub fn with_snapshots(&self, routes: &[ModelUpstream]) -> Vec<ModelUpstream> {
        let mut routes = routes.to_vec();
        self.apply_snapshots(&mut routes);
        routes
    }

    /// The latest snapshot of a pool.
    pub fn snapshot(&self, pool: &str) -> Option<QuotaSnapshot> {
        self.state.lock().pools.get(pool).and_then(|p| p.snapshot)
    }

    /// Every quota route without a usable snapshot source, in config order: the plan's reasons,
    /// then the last refresh's (a failed fetch, no matching record).
    pub fn diagnostics(&self) -> Vec<Diagnostic> {
        let state = self.state.lock();
        diagnostics(&state)
    }

    /// How long the refresh loop may sleep: until the earliest pool is due, within bounds.
    pub fn next_wake(&self) -> Duration {
        let state = self.state.lock();
        let now = self.clock.now_ms();
        state
            .plan
            .pools
            .values()
            .filter(|p| !matches!(p.resolution, Resolution::Unresolved(_)))
            .map(|p| {
                let due = state.pools.get(&p.name).map_or(0, |l| l.next_due_ms);
                Duration::from_millis(due.saturating_sub(now))
            })
            .min()
            .unwrap_or(MAX_WAKE)
            .clamp(MIN_WAKE, MAX_WAKE)
    }

    /// (model, endpoint id, limit − used) of each quota route whose snapshot states a limit.
    pub fn headroom(&self) -> Vec<(String, String, u64)> {
        let state = self.state.lock();
        state
            .plan
            .routes
            .iter()
            .filter_map(|r| {
                let snapshot = state.pools.get(&r.pool)?.snapshot?;
                (snapshot.limit > 0).then(|| {
                    (
                        r.model.clone(),
                        r.endpoint_id.clone(),
                        snapshot.limit.saturating_sub(snapshot.used),
                    )
                })
            })
            .collect()
    }

    /// `/health/deep`'s view: every quota route, where its snapshot comes from, the snapshot and
    /// what is wrong, if anything.
    pub fn report(&self) -> serde_json::Value {
        let state = self.state.lock();
        let problems: HashMap<String, Diagnostic> = diagnostics(&state)
            .into_iter()
            .map(|d| (d.endpoint_id.clone(), d))
            .collect();
        let routes: Vec<serde_json::Value> = state
            .plan
            .routes
            .iter()
            .map(|r| {
                let pool = state.plan.pools.get(&r.pool);
                let live = state.pools.get(&r.pool);
                let snapshot = live.and_then(|l| l.snapshot);
                let local_why = match pool.map(|p| &p.resolution) {
                    Some(Resolution::Local { why, .. }) => Some(why.to_string()),
                    _ => None,
                };
                let (source, selector, key_from) = match pool.map(|p| &p.resolution) {
                    Some(Resolution::Fetch { selector, target }) => (
                        Some(target.provider.name()),
                        Some(json!(selector)),
                        Some(target.key_from.clone()),
                    ),
                    Some(Resolution::Local { .. }) => (Some("local"), None, None),
                    _ => (None, None, None),
                };
                let problem = problems.get(&r.endpoint_id);
                let state_name = match (problem, snapshot) {
                    (Some(_), _) => "unresolved",
                    (None, None) => "pending",
                    (None, Some(_)) => "ok",
                };
                json!({
                    "model": r.model,
                    "endpoint_id": r.endpoint_id,
                    "pool": r.pool,
                    "source": source,
                    "selector": selector,
                    "key_from": key_from,
                    "local_because": local_why,
                    "state": state_name,
                    "reason": problem.map(|d| d.reason.to_string()),
                    "reason_kind": problem.map(|d| d.reason.kind()),
                    "snapshot": snapshot,
                    "owner": pool.and_then(|p| p.owner.clone()),
                    "last_refresh_ms": live.and_then(|l| l.last_refresh_ms),
                    "refresh_interval_sec": pool.map(|p| p.refresh_ms / 1000),
                })
            })
            .collect();
        json!({
            "note": "quota snapshots and the local request counter are per process",
            "unresolved": problems.len(),
            "routes": routes,
        })
    }

    /// The pools due at `now`, marked as refreshed (their next due time is set).
    pub(super) fn take_due(&self, now: u64) -> Vec<PoolPlan> {
        let mut state = self.state.lock();
        let BoardState { plan, pools, .. } = &mut *state;
        plan.pools
            .values()
            .filter(|p| !matches!(p.resolution, Resolution::Unresolved(_)))
            .filter(|p| {
                let live = pools.entry(p.name.clone()).or_default();
                if live.next_due_ms > now {
                    return false;
                }
                live.next_due_ms = now.saturating_add(p.refresh_ms);
                true
            })
            .cloned()
            .collect()
    }

    /// Stores a refresh's outcome for `pool`: a new snapshot, or why there is none (the previous
    /// snapshot is kept, so it ages and RouteWise shows it stale).
    pub(super) fn store(&self, pool: &str, outcome: Result<QuotaSnapshot, Unresolved>, now: u64) {
        let mut state = self.state.lock();
        let live = state.pools.entry(pool.to_owned()).or_default();
        live.last_refresh_ms = Some(now);
        match outcome {
            Ok(snapshot) => {
                live.snapshot = Some(snapshot);
                live.error = None;
            }
            Err(reason) => live.error = Some(reason),
        }
    }

    /// Counts local-counter pools across the fleet from now on.
    pub fn share_counts(&self, shared: Arc<dyn SharedQuotaCounts>) {
        let _ = self.shared.set(shared);
    }

    /// The local counter's reading of `pool` now: this process's count, or the fleet's when a
    /// fleet shares it (the fleet's includes this process's, so the larger is the truer).
    pub(super) fn local_used(&self, pool: &str, now: u64) -> u64 {
        let today = self.clock.local_date(now);
        let own = self.state.lock().counter.used(pool, today);
        let fleet = self
            .shared
            .get()
            .and_then(|s| s.used(pool, today))
            .unwrap_or(0);
        own.max(fleet)
    }

    /// Logs each diagnostic that is new or changed since the last call (one warning per route),
    /// and each route that resolves again.
    pub(super) fn log_changes(&self) {
        let mut state = self.state.lock();
        let current = diagnostics(&state);
        let mut seen = HashMap::new();
        for d in current {
            let text = d.to_string();
            if state.logged.get(&d.endpoint_id) != Some(&text) {
                tracing::warn!(
                    model = %d.model,
                    endpoint = %d.endpoint_id,
                    reason = d.reason.kind(),
                    "{text}"
                );
            }
            seen.insert(d.endpoint_id, text);
        }
        for endpoint in state.logged.keys() {
            if !seen.contains_key(endpoint) {
                tracing::info!(endpoint = %endpoint, "quota snapshot source resolves again");
            }
        }
        state.logged = seen;
    }
}

fn diagnostics(state: &BoardState) -> Vec<Diagnostic> {
    state
        .plan
        .routes
        .iter()
        .filter_map(|r| {
            let pool = state.plan.pools.get(&r.pool)?;
            let reason = match &pool.resolution {
                Resolution::Unresolved(reason) => reason.clone(),
                _ => state.pools.get(&r.pool)?.error.clone()?,
            };
            Some(Diagnostic {
                model: r.model.clone(),
                endpoint_id: r.endpoint_id.clone(),
                pool: r.pool.clone(),
                reason,
            })
        })
        .collect()
}
