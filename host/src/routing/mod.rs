//! From a parsed request to an answered one: the route table, the selection pipeline, and dispatch
//! with fallback.

pub mod affinity;
pub mod db_models;
pub mod dispatch;
pub mod health;
pub mod inflight;
pub mod key_pools;
pub mod peers;
pub mod policy;
pub mod prefill;
pub mod select;
pub mod table;

use std::sync::Arc;

/// The process-wide routing state every request consults: endpoint health, prefill load and
/// session affinity. Cheap to clone. With a fleet, [`RoutingContext::join`] shares it with the
/// other replicas.
#[derive(Debug, Clone)]
pub struct RoutingContext {
    pub health: Arc<health::HealthRegistry>,
    pub prefill: Arc<prefill::PrefillTracker>,
    pub affinity: Arc<affinity::AffinityTable>,
    /// Upstream key reservations, quieting and key affinity.
    pub keys: Arc<crate::routing::key_pools::KeyPools>,
    /// Told of every attempt the ledger opens; `()` until the gateway installs its extension.
    pub attempts: Arc<dyn AttemptObserver>,
    /// Attempts in flight per endpoint (a candidate's `inflight-requests`).
    pub inflight: Arc<inflight::InFlight>,
    /// The fleet's other replicas; `()` for a gateway alone.
    pub peers: Arc<dyn peers::Peers>,
    /// Samples strategy decisions for `strategies replay` (`strategies.record`); `None`: off.
    pub recorder: Option<Arc<crate::strategy::record::Recorder>>,
}

/// What routing tells the stage above about each attempt it sends (RouteWise's local quota counter
/// listens). Defined here, so routing names nothing above it; the gateway's extension implements it.
pub trait AttemptObserver: std::fmt::Debug + Send + Sync + 'static {
    /// An attempt is being sent to the upstream `endpoint_id`.
    fn on_attempt(&self, _endpoint_id: &str) {}
}

/// Nobody listens.
impl AttemptObserver for () {}

impl RoutingContext {
    pub fn new(config: &crate::config::Config) -> Self {
        Self {
            health: Arc::new(health::HealthRegistry::new(config.health)),
            prefill: Arc::new(prefill::PrefillTracker::new(config.routing.prefill)),
            affinity: Arc::new(affinity::AffinityTable::new(config.routing.affinity)),
            keys: Arc::new(crate::routing::key_pools::KeyPools::new(
                config.routing.key_pools,
            )),
            attempts: Arc::new(()),
            inflight: Arc::new(inflight::InFlight::new()),
            peers: Arc::new(()),
            recorder: None,
        }
    }
}

impl RoutingContext {
    /// Shares this state with the fleet's other replicas from now on: the registries announce
    /// their changes to `peers`, and dispatch asks it for probes and stateful routes.
    pub fn join(&mut self, peers: Arc<dyn peers::Peers>) {
        self.health.set_peers(peers.clone());
        self.affinity.set_peers(peers.clone());
        self.keys.set_peers(peers.clone());
        self.peers = peers;
    }
}
