//! Latency hedging: when the strategy asks for it, the primary attempt gets a head start; if it
//! has not answered (or, streaming, sent its first content) by then, a backup is sent too and the
//! first answer wins. The other attempt is cancelled.

use std::time::Duration;

use crate::config::ModelUpstream;

use super::super::select::{Exclusion, Plan};
use super::FailedAttempt;
use super::attempts::{Admitted, Call, Dispatch, Step};

/// A hedge the strategy asked for: send the upstream at `backup` too if the primary has not
/// answered `after`.
#[derive(Clone, Copy)]
pub(super) struct Hedge {
    after: Duration,
    /// Position of the backup in the model's list.
    backup: usize,
}

/// The strategy's hedge request (typed since WIT 0.2.0; a 0.1.0 strategy's `;hedge=<ms>@<index>`
/// metadata suffix is turned into one by the strategy host). Never for pinned plans.
pub(super) fn planned(plan: &Plan, routes: &[ModelUpstream]) -> Option<Hedge> {
    if plan.pinned || plan.max_attempts < 2 {
        return None;
    }
    let hedge = plan.hedge?;
    let backup = routes.iter().position(|r| r.index == hedge.backup)?;
    let first = plan.order.first().and_then(|&p| routes.get(p))?;
    if first.index == hedge.backup {
        return None;
    }
    Some(Hedge {
        after: Duration::from_millis(u64::from(hedge.after_ms)),
        backup,
    })
}

impl<C: Call> Dispatch<'_, C> {
    /// The primary attempt, hedged. A side that fails first is recorded and the other one
    /// awaited; the loser of a race is cancelled.
    pub(super) async fn hedged(
        &self,
        primary: usize,
        admitted: Admitted,
        hedge: Hedge,
        excluded: &mut Vec<Exclusion>,
    ) -> Step<C::Answer> {
        let routes = self.ledger.model.upstreams();
        let primary_ticket = admitted.ticket;
        let first = self.attempt(primary, admitted, false);
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
        let Some(backup) = self.admit(&routes[hedge.backup], excluded).await else {
            return single(first.await);
        };
        let backup_ticket = backup.ticket;
        tracing::debug!(
            primary = %routes[primary].endpoint_id,
            backup = %routes[hedge.backup].endpoint_id,
            after_ms = hedge.after.as_millis() as u64,
            "hedging: the primary has not answered, sending the backup"
        );
        crate::telemetry::metrics::hedge_sent(self.ledger.model.id());
        let second = self.attempt(hedge.backup, backup, true);
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
        // Won: the backup's answer is the one the client gets.
        if position == hedge.backup && result.is_ok() {
            crate::telemetry::metrics::hedge_won(self.ledger.model.id());
        }
        Step {
            position,
            result,
            failures,
            hedged: Some(hedge.backup),
        }
    }
}
