//! What routing tells the other replicas of a fleet, and what it asks them. Routing names no
//! transport: the fleet ([`crate::fleet`]) implements [`Peers`] on Redis, and `()` is a gateway
//! alone, whose state stays in its process.
//!
//! Outgoing changes are announcements (fire and forget: they never wait on the network). The two
//! questions, [`Peers::claim_probe`] and [`Peers::admit`], are asked only where the answer matters
//! (a half-open probe, a stateful route) and each is bounded by the fleet's deadline.

use std::time::Duration;

use futures::future::BoxFuture;

use crate::config::ModelUpstream;
use crate::entity::Role;

/// Permission to send an attempt to a stateful route, held until the attempt ends (a concurrency
/// slot is given back when it is dropped).
pub type AdmissionGuard = Box<dyn Send + Sync>;

/// The fleet's answer for a stateful route.
pub enum Admission {
    /// Send; keep the guard for as long as the attempt runs.
    Granted(Option<AdmissionGuard>),
    /// Skip this route: the reason is recorded as the route's exclusion.
    Refused(String),
}

/// The other replicas, as routing sees them.
pub trait Peers: std::fmt::Debug + Send + Sync + 'static {
    /// A breaker opened here and stays open for `cooldown`.
    fn breaker_opened(&self, _endpoint: &str, _cooldown: Duration) {}
    /// A breaker closed here (its probe was answered).
    fn breaker_closed(&self, _endpoint: &str) {}
    /// Claims `endpoint`'s half-open probe across the fleet, after this process claimed it
    /// locally. `None`: nobody else to ask, the local claim decides.
    fn claim_probe(&self, _endpoint: &str, _ttl: Duration) -> Option<BoxFuture<'static, bool>> {
        None
    }
    /// `caller` on `model` is pinned to `endpoint` for `ttl`.
    fn affinity_pinned(&self, _caller: &str, _model: &str, _endpoint: &str, _ttl: Duration) {}
    /// The pin of `caller` on `model` to `endpoint` was dropped (an error there).
    fn affinity_dropped(&self, _caller: &str, _model: &str, _endpoint: &str) {}
    /// A key (by fingerprint) is out of rotation for `period` after `status`.
    fn key_quieted(&self, _fingerprint: &str, _status: u16, _period: Duration) {}
    /// `caller` (of `role`) is bound to the key `fingerprint` of `pool` for `ttl`.
    fn key_bound(
        &self,
        _caller: &str,
        _pool: &str,
        _fingerprint: &str,
        _role: Option<Role>,
        _ttl: Duration,
    ) {
    }
    /// Asks whether an attempt may go to `upstream` of `model`, for routes whose capacity the
    /// fleet shares (quota pools, concurrency slots). `None`: the route needs no admission.
    fn admit(
        &self,
        _model: &str,
        _upstream: &ModelUpstream,
    ) -> Option<BoxFuture<'static, Admission>> {
        None
    }
}

/// A gateway alone.
impl Peers for () {}
