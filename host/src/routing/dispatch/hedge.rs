//! Latency hedging: when the strategy asks for it, the primary attempt gets a head start; if it
//! has not answered (or sent its first event) by then, a backup is sent too and the first answer
//! wins. The other attempt is cancelled.

use std::time::Duration;

use crate::config::RouteConfig;

use super::super::health::Ticket;
use super::super::select::{Exclusion, Plan};
use super::FailedAttempt;
use super::attempts::{Call, Dispatch, Step};

/// A hedge the strategy asked for: send the upstream at `backup` too if the primary has not
/// answered `after`.
#[derive(Clone, Copy)]
pub(super) struct Hedge {
    after: Duration,
    /// Position of the backup in the model's list.
    backup: usize,
}

/// The strategy's hedge request, from the `;hedge=<ms>@<route index>` suffix of its metadata
/// (the host's convention; see `docs/routewise.md`). Never for pinned plans.
pub(super) fn planned(plan: &Plan, routes: &[RouteConfig]) -> Option<Hedge> {
    if plan.pinned || plan.max_attempts < 2 {
        return None;
    }
    let spec = plan
        .strategy_metadata
        .split(';')
        .find_map(|p| p.strip_prefix("hedge="))?;
    let (ms, index) = spec.split_once('@')?;
    let index: u32 = index.parse().ok()?;
    let backup = routes.iter().position(|r| r.index == index)?;
    let first = plan.order.first().and_then(|&p| routes.get(p))?;
    if first.index == index {
        return None;
    }
    Some(Hedge {
        after: Duration::from_millis(ms.parse().ok()?),
        backup,
    })
}

impl<C: Call> Dispatch<'_, C> {
    /// The primary attempt, hedged. A side that fails first is recorded and the other one
    /// awaited; the loser of a race is cancelled.
    pub(super) async fn hedged(
        &self,
        primary: usize,
        primary_ticket: Ticket,
        hedge: Hedge,
        excluded: &mut Vec<Exclusion>,
    ) -> Step<C::Answer> {
        let routes = self.ledger.model.routes();
        let first = self.attempt(primary, primary_ticket);
        tokio::pin!(first);
        let done = tokio::select! {
            done = &mut first => Some(done),
            () = tokio::time::sleep(hedge.after) => None,
        };
        let single = |result| Step {
            position: primary,
            result,
            failures: Vec::new(),
            hedged: None,
        };
        if let Some(result) = done {
            return single(result);
        }
        let Some(backup_ticket) = self.admit(&routes[hedge.backup], excluded) else {
            return single(first.await);
        };
        tracing::debug!(
            primary = %routes[primary].endpoint_id,
            backup = %routes[hedge.backup].endpoint_id,
            after_ms = hedge.after.as_millis() as u64,
            "hedging: the primary has not answered, sending the backup"
        );
        let second = self.attempt(hedge.backup, backup_ticket);
        tokio::pin!(second);
        let (winner, result, loser, loser_ticket) = tokio::select! {
            result = &mut first => (primary, result, hedge.backup, backup_ticket),
            result = &mut second => (hedge.backup, result, primary, primary_ticket),
        };
        let mut failures = Vec::new();
        let (position, result) = match result {
            Err(e) => {
                // The first to finish failed: the other one decides.
                failures.push(FailedAttempt::new(&routes[winner], &e));
                let result = if loser == primary {
                    first.await
                } else {
                    second.await
                };
                (loser, result)
            }
            ok => {
                self.ledger.cancelled(&routes[loser], loser_ticket);
                (winner, ok)
            }
        };
        Step {
            position,
            result,
            failures,
            hedged: Some(hedge.backup),
        }
    }
}
