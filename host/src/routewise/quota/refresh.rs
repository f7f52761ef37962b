//! The refresh loop: read every due pool's source, store the snapshots on the board, push the
//! affected models' routes (snapshots applied) to their routers.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use super::QuotaSnapshot;
use super::board::QuotaBoard;
use super::fetch::{self, FetchError, UsageRecord};
use super::plan::{FetchTarget, QuotaPlan, Resolution, Unresolved};
use crate::config::ModelConfig;
use crate::routing::table::ModelTable;
use crate::strategy::upstream_table;

/// How often a push is retried when the table was swapped under it.
const PUSH_ATTEMPTS: usize = 3;

impl QuotaBoard {
    /// One refresh pass over `models`: re-plans (so routes added at run time are picked up), reads
    /// the source of every due pool — one fetch per distinct (provider, base URL, key), in parallel
    /// — stores the snapshots and logs what changed. Returns the models whose routes got a new
    /// snapshot, in config order.
    pub async fn refresh<'a, F, Fut>(
        &self,
        models: impl IntoIterator<Item = &'a ModelConfig>,
        env: &(dyn Fn(&str) -> Option<String> + Sync),
        fetch: F,
    ) -> Vec<String>
    where
        F: Fn(FetchTarget) -> Fut,
        Fut: Future<Output = Result<Vec<UsageRecord>, FetchError>>,
    {
        self.set_plan(QuotaPlan::build(models, env));
        // A snapshot says when it was read; taking the time before the fetch errs towards
        // counting a dispatch twice (RouteWise adds those after `at_ms`) rather than not at all.
        let now = self.clock.now_ms();
        let due = self.take_due(now);
        let mut targets: Vec<FetchTarget> = Vec::new();
        for pool in &due {
            if let Resolution::Fetch { target, .. } = &pool.resolution
                && !targets.iter().any(|t| t.id() == target.id())
            {
                targets.push(target.clone());
            }
        }
        let answers = futures::future::join_all(targets.iter().cloned().map(&fetch)).await;
        let answers: HashMap<_, _> = targets.iter().map(FetchTarget::id).zip(answers).collect();
        let mut changed: Vec<String> = Vec::new();
        for pool in &due {
            let outcome = match &pool.resolution {
                Resolution::Fetch { selector, target } => match answers.get(&target.id()) {
                    Some(Ok(records)) => records
                        .iter()
                        .find(|r| {
                            r.provider == target.provider
                                && r.label == selector.usage_label
                                && r.unit == selector.unit
                        })
                        .map(|r| QuotaSnapshot {
                            used: r.used,
                            limit: r.limit,
                            at_ms: now,
                        })
                        .ok_or_else(|| Unresolved::NoRecord {
                            provider: target.provider,
                            label: selector.usage_label.clone(),
                            unit: selector.unit.clone(),
                            found: found(records),
                        }),
                    Some(Err(e)) => Err(Unresolved::FetchFailed {
                        provider: target.provider,
                        error: e.to_string(),
                    }),
                    None => continue,
                },
                Resolution::Local { limit, .. } => Ok(QuotaSnapshot {
                    used: self.local_used(&pool.name, now),
                    limit: *limit,
                    at_ms: now,
                }),
                Resolution::Unresolved(_) => continue,
            };
            if outcome.is_ok() {
                changed.extend(pool.models.iter().cloned());
            }
            self.store(&pool.name, outcome, now);
        }
        self.log_changes();
        let plan_order = self.state.lock().plan.routes.clone();
        let mut ordered: Vec<String> = Vec::new();
        for r in plan_order {
            if changed.contains(&r.model) && !ordered.contains(&r.model) {
                ordered.push(r.model);
            }
        }
        ordered
    }
}

fn found(records: &[UsageRecord]) -> String {
    if records.is_empty() {
        return "no records".to_owned();
    }
    records
        .iter()
        .map(|r| format!("`{}` ({})", r.label, r.unit))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Pushes `models`' current routes, with the board's snapshots applied, to their routers. If the
/// table was swapped meanwhile (an admin change, whose own push may have come first), it pushes the
/// new table again, so the last push always carries the newest weights.
pub async fn push_snapshots(
    board: &QuotaBoard,
    table: &(dyn Fn() -> Option<Arc<ModelTable>> + Send + Sync),
    models: &[String],
) {
    if models.is_empty() {
        return;
    }
    for _ in 0..PUSH_ATTEMPTS {
        let Some(current) = table() else { return };
        for entry in current.models().filter(|m| models.contains(&m.config.id)) {
            let routes = upstream_table(&board.with_snapshots(entry.upstreams()));
            if let Err(e) = entry.router.refresh_upstreams(routes).await {
                tracing::warn!(model = %entry.id(), "pushing quota snapshots failed: {e}");
            }
        }
        match table() {
            Some(now) if !Arc::ptr_eq(&now, &current) => continue,
            _ => return,
        }
    }
}

/// Starts the refresh loop: the first pass now, then whenever a pool is due (each pool every
/// `quota_snapshot_refresh_interval_sec` of its models, the smallest when they differ). `table`
/// gives the current route table, or None once the gateway is gone (the loop ends). Keys and base
/// URLs come from the process environment.
pub fn spawn_refresh<F>(board: Arc<QuotaBoard>, table: F)
where
    F: Fn() -> Option<Arc<ModelTable>> + Send + Sync + 'static,
{
    let client = match reqwest::Client::builder()
        .connect_timeout(fetch::FETCH_TIMEOUT)
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("quota snapshot refresh disabled: cannot build an HTTP client: {e}");
            return;
        }
    };
    tokio::spawn(async move {
        let env = |name: &str| std::env::var(name).ok();
        loop {
            let Some(current) = table() else { return };
            let changed = board
                .refresh(current.models().map(|m| &m.config), &env, |target| {
                    let client = client.clone();
                    async move {
                        fetch::fetch(&client, target.provider, &target.base, &target.key).await
                    }
                })
                .await;
            drop(current);
            push_snapshots(&board, &table, &changed).await;
            tokio::time::sleep(board.next_wake()).await;
        }
    });
}
