//! A fleet: several `switchyard serve` processes that route as one gateway, sharing what routing
//! learns on Redis (`fleet: {redis_url}`). Without it, every process keeps its own state, exactly
//! as before.
//!
//! What is shared, and how (the README's "Running a fleet" says the same for operators):
//!
//! | state | how | consistency |
//! |---|---|---|
//! | breaker opened / closed | pub/sub message + a key with the cooldown as TTL | every replica skips an endpoint within one message delivery (milliseconds; the test bounds it at 1 s) |
//! | half-open probe | `SET NX PX` on a claim key | one probe fleet-wide while Redis answers within the deadline |
//! | session affinity | pub/sub + a key per pin with the sliding TTL | eventual; reads are local |
//! | key quieting, key bindings | pub/sub + a key each with its period as TTL | eventual; reads are local |
//! | prefill backlog | each replica writes its own every `backlog_publish_ms`, reads the others' | stale by at most two periods |
//! | quota and concurrency | a Lua script per attempt ([`gate`]) | exact: the check and the reservation are one atomic step |
//! | budgets' spend | `INCRBYFLOAT` per request in the background, read back every second ([`budgets`]) | a second behind, plus the requests in flight |
//!
//! What stays per process: availability EWMAs (each replica judges an endpoint by its own
//! traffic; averaging them would need a round trip per attempt and buys little), in-flight
//! counts, warm-continuation hints and strategy instances (their learned state).
//!
//! Nothing on the request path waits on Redis except a half-open probe's claim and a stateful
//! route's admission, each bounded by `deadline_ms`. Announcements go through a bounded queue
//! (full: the change is dropped and counted) to one publishing task, which holds them while Redis
//! is unreachable. Meanwhile the gateway keeps serving on local state: probe claims stand
//! locally, stateful routes are admitted by each replica's own accounting, and `/health/deep`
//! and `switchyard_fleet_connected` say so. A stateful route whose admission times out while
//! Redis is connected is skipped for that attempt instead (a quota must not be overspent because
//! Redis was slow).

pub mod budgets;
pub mod events;
pub mod gate;
pub mod limits;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use redis::aio::ConnectionManager;
use tokio::sync::mpsc;

use crate::config::{FleetConfig, ModelUpstream};
use crate::entity::{Role, mask_url_password};
use crate::routing::RoutingContext;
use crate::routing::peers::{Admission, Peers};
use crate::routing::prefill::Load;
use events::{Change, Message, Record};
use gate::Capacity;

/// Announcements waiting for the publishing task; more are dropped (and counted).
const OUTBOX: usize = 4096;

/// Kept records a (re)joining replica loads at most.
const MAX_RECORDS_LOADED: usize = 200_000;

/// How long a replica's backlog publication counts after it was written.
fn backlog_freshness(period: Duration) -> Duration {
    (period * 3).max(Duration::from_secs(2))
}

/// Whether Redis is answering, as the fleet last saw it.
#[derive(Debug, Default)]
struct Link {
    connected: bool,
    /// Unix ms of the last change of `connected`.
    since_ms: u64,
    last_error: Option<String>,
}

/// Counters for `/health/deep` and the metrics.
#[derive(Debug, Default)]
struct Counters {
    published: AtomicU64,
    received: AtomicU64,
    dropped: AtomicU64,
    /// Probe claims and admissions decided locally because Redis could not answer.
    fallbacks: AtomicU64,
    /// Admissions refused because Redis (connected) did not answer within the deadline.
    timeouts: AtomicU64,
}

/// This replica's membership in the fleet.
pub struct Fleet {
    config: FleetConfig,
    /// This process's id in messages and backlog publications.
    replica: String,
    client: redis::Client,
    conn: ConnectionManager,
    outbox: mpsc::Sender<Change>,
    connected: AtomicBool,
    /// The kept records have been read since the last (re)connection.
    joined: AtomicBool,
    link: Mutex<Link>,
    counters: Counters,
    /// Concurrency slots this replica holds: slot id → the pool's set.
    held_slots: Mutex<HashMap<String, String>>,
    /// The fleet's request count of each quota pool this replica has admitted to, for its local
    /// day: learnt from every admission and re-read with each backlog exchange.
    quota_counts: Mutex<HashMap<String, (chrono::NaiveDate, u64)>>,
    next_slot: AtomicU64,
    /// Replicas whose backlog publication is fresh (this one included).
    replicas_seen: AtomicU64,
    quota_script: redis::Script,
    slot_script: redis::Script,
    renew_script: redis::Script,
    /// Itself, for the futures of [`Peers::claim_probe`] and [`Peers::admit`].
    this: Weak<Fleet>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("replica", &self.replica)
            .field("redis_url", &mask_url_password(&self.config.redis_url))
            .finish_non_exhaustive()
    }
}

/// Why the fleet could not be set up (a config problem: Redis being down is not one).
#[derive(Debug, thiserror::Error)]
#[error("fleet.redis_url: {0}")]
pub struct FleetError(#[from] redis::RedisError);

impl Fleet {
    /// Joins the fleet: `routing` announces its changes from now on and applies the others'.
    /// Connects lazily and in the background; a Redis that is down at startup is reported, not
    /// fatal.
    pub fn join(
        config: FleetConfig,
        routing: &mut RoutingContext,
    ) -> Result<Arc<Fleet>, FleetError> {
        let client = redis::Client::open(config.redis_url.as_str())?;
        let conn = ConnectionManager::new_lazy_with_config(
            client.clone(),
            redis::aio::ConnectionManagerConfig::new()
                .set_connection_timeout(Some(Duration::from_secs(2)))
                .set_response_timeout(Some(Duration::from_secs(2)))
                .set_number_of_retries(2)
                .set_max_delay(Duration::from_secs(2)),
        )?;
        let (outbox, inbox) = mpsc::channel(OUTBOX);
        let fleet = Arc::new_cyclic(|this| Fleet {
            this: this.clone(),
            replica: uuid::Uuid::now_v7().to_string(),
            client,
            conn,
            outbox,
            connected: AtomicBool::new(false),
            joined: AtomicBool::new(false),
            link: Mutex::new(Link::default()),
            counters: Counters::default(),
            held_slots: Mutex::new(HashMap::new()),
            quota_counts: Mutex::new(HashMap::new()),
            next_slot: AtomicU64::new(1),
            replicas_seen: AtomicU64::new(0),
            quota_script: redis::Script::new(gate::QUOTA_SCRIPT),
            slot_script: redis::Script::new(gate::SLOT_SCRIPT),
            renew_script: redis::Script::new(gate::RENEW_SCRIPT),
            config,
        });
        routing.join(fleet.clone());
        tokio::spawn(publish(Arc::downgrade(&fleet), inbox));
        tokio::spawn(subscribe(Arc::downgrade(&fleet), routing.clone()));
        tokio::spawn(exchange_backlog(Arc::downgrade(&fleet), routing.clone()));
        tracing::info!(
            replica = %fleet.replica,
            redis = %mask_url_password(&fleet.config.redis_url),
            prefix = %fleet.config.key_prefix,
            "joining the fleet: breakers, affinity, key pools, prefill backlog, quota and \
             concurrency are shared through Redis"
        );
        Ok(fleet)
    }

    pub fn replica(&self) -> &str {
        &self.replica
    }

    fn key(&self, rest: &str) -> String {
        format!("{}:{rest}", self.config.key_prefix)
    }

    fn channel(&self) -> String {
        self.key("events")
    }

    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    fn set_link(&self, connected: bool, error: Option<String>) {
        let was = self.connected.swap(connected, Ordering::AcqRel);
        if !connected {
            self.joined.store(false, Ordering::Release);
        }
        let mut link = self.link.lock();
        if was != connected || link.since_ms == 0 {
            link.since_ms = crate::clock::unix_ms();
            if connected {
                tracing::info!("fleet: Redis answers; routing state is shared again");
            } else {
                tracing::warn!(
                    "fleet: Redis is unreachable ({}); serving on this replica's own state",
                    error.as_deref().unwrap_or("no answer")
                );
            }
        }
        link.connected = connected;
        if error.is_some() {
            link.last_error = error;
        }
    }

    /// Queues a change for the publishing task, which sends it once Redis answers (at startup,
    /// or after an outage: it is still kept as a record for replicas that join later).
    fn announce(&self, change: Change) {
        if self.outbox.try_send(change).is_err() {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `GET /health/deep`'s `fleet` section.
    pub fn report(&self) -> serde_json::Value {
        let link = self.link.lock();
        let c = &self.counters;
        serde_json::json!({
            "replica": self.replica,
            "redis": mask_url_password(&self.config.redis_url),
            "key_prefix": self.config.key_prefix,
            "connected": link.connected,
            // `joining`: Redis answers, the kept records are still being read.
            "state": match (link.connected, self.joined.load(Ordering::Acquire)) {
                (true, true) => "shared",
                (true, false) => "joining",
                (false, _) => "local_fallback",
            },
            "since_ms": link.since_ms,
            "last_error": link.last_error,
            "deadline_ms": self.config.deadline.as_millis() as u64,
            "replicas_seen": self.replicas_seen.load(Ordering::Relaxed),
            "concurrency_slots_held": self.held_slots.lock().len(),
            "events": {
                "published": c.published.load(Ordering::Relaxed),
                "received": c.received.load(Ordering::Relaxed),
                "dropped": c.dropped.load(Ordering::Relaxed),
            },
            "local_fallbacks": c.fallbacks.load(Ordering::Relaxed),
            "admission_timeouts": c.timeouts.load(Ordering::Relaxed),
        })
    }

    /// Sets the fleet's gauges before a scrape.
    pub fn refresh_metrics(&self) {
        use crate::telemetry::metrics::state;
        let c = &self.counters;
        state::fleet(&state::FleetState {
            connected: self.is_connected(),
            replicas: self.replicas_seen.load(Ordering::Relaxed),
            published: c.published.load(Ordering::Relaxed),
            received: c.received.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
            fallbacks: c.fallbacks.load(Ordering::Relaxed),
            timeouts: c.timeouts.load(Ordering::Relaxed),
        });
    }

    /// Runs `op` against Redis within the request deadline. `Err(true)`: no answer in time
    /// (Redis is slow); `Err(false)`: Redis failed or is known down.
    async fn within_deadline<T>(
        &self,
        op: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, bool> {
        if !self.is_connected() {
            return Err(false);
        }
        match tokio::time::timeout(self.config.deadline, op).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                self.set_link(false, Some(e.to_string()));
                Err(false)
            }
            Err(_) => Err(true),
        }
    }

    async fn claim_probe_now(self: Arc<Self>, endpoint: String, ttl: Duration) -> bool {
        let mut conn = self.conn.clone();
        let key = self.key(&format!("probe:{endpoint}"));
        let mut set = redis::cmd("SET");
        set.arg(&key)
            .arg(&self.replica)
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis().max(1) as u64);
        match self
            .within_deadline(set.query_async::<Option<String>>(&mut conn))
            .await
        {
            Ok(reply) => reply.is_some(),
            Err(_) => {
                // Two probes at worst: the local claim stands.
                self.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
                true
            }
        }
    }

    async fn admit_now(self: Arc<Self>, capacity: Capacity) -> Admission {
        let mut conn = self.conn.clone();
        let deadline_ms = self.config.deadline.as_millis() as u64;
        let answer = match &capacity {
            Capacity::Quota { pool, limit } => {
                let day = chrono::Local::now().date_naive();
                let key = self.key(&format!("quota:{pool}:{day}"));
                let mut call = self.quota_script.key(&key);
                call.arg(*limit).arg(2 * 24 * 3600 * 1000_u64);
                self.within_deadline(call.invoke_async::<i64>(&mut conn))
                    .await
                    .map(|n| {
                        // Refused: the pool is at its limit.
                        let count = u64::try_from(n).unwrap_or(*limit);
                        self.quota_counts.lock().insert(pool.clone(), (day, count));
                        (n < 0).then(|| {
                            format!("fleet quota of pool {pool} spent ({limit} requests today)")
                        })
                    })
                    .map(|refused| (refused, None))
            }
            Capacity::Concurrency { pool, limit } => {
                let key = self.key(&format!("slots:{pool}"));
                let slot = format!(
                    "{}:{}",
                    self.replica,
                    self.next_slot.fetch_add(1, Ordering::Relaxed)
                );
                let mut call = self.slot_script.key(&key);
                call.arg(*limit)
                    .arg(gate::SLOT_LEASE.as_millis() as u64)
                    .arg(&slot);
                self.within_deadline(call.invoke_async::<i64>(&mut conn))
                    .await
                    .map(|taken| {
                        if taken == 1 {
                            self.held_slots.lock().insert(slot.clone(), key.clone());
                            (None, Some((slot, key)))
                        } else {
                            (
                                Some(format!(
                                    "fleet concurrency pool {pool} full ({limit} slots in flight)"
                                )),
                                None,
                            )
                        }
                    })
            }
        };
        match answer {
            Ok((Some(reason), _)) => Admission::Refused(reason),
            Ok((None, slot)) => Admission::Granted(slot.map(|(slot, key)| {
                Box::new(SlotGuard {
                    fleet: Arc::downgrade(&self),
                    slot,
                    key,
                }) as crate::routing::peers::AdmissionGuard
            })),
            Err(true) => {
                self.counters.timeouts.fetch_add(1, Ordering::Relaxed);
                Admission::Refused(format!(
                    "fleet admission: Redis did not answer within {deadline_ms} ms"
                ))
            }
            Err(false) => {
                // Redis is down: each replica's own accounting (the strategy's) decides.
                self.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
                Admission::Granted(None)
            }
        }
    }
}

impl crate::routewise::quota::SharedQuotaCounts for Fleet {
    fn used(&self, pool: &str, day: chrono::NaiveDate) -> Option<u64> {
        self.quota_counts
            .lock()
            .get(pool)
            .filter(|(d, _)| *d == day)
            .map(|(_, n)| *n)
    }
}

/// A concurrency slot held for one attempt; dropping it gives the slot back.
struct SlotGuard {
    fleet: Weak<Fleet>,
    slot: String,
    key: String,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let Some(fleet) = self.fleet.upgrade() else {
            return;
        };
        fleet.held_slots.lock().remove(&self.slot);
        fleet.free_slots_later(
            std::mem::take(&mut self.key),
            vec![std::mem::take(&mut self.slot)],
        );
    }
}

impl Fleet {
    /// Gives `slots` of the set `key` back in the background (a drop cannot wait). Unanswered,
    /// their leases run out within [`gate::SLOT_LEASE`].
    fn free_slots_later(&self, key: String, slots: Vec<String>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut conn = self.conn.clone();
        runtime.spawn(async move {
            let mut release = redis::cmd("ZREM");
            release.arg(&key).arg(&slots);
            let _ = tokio::time::timeout(
                Duration::from_secs(2),
                release.query_async::<i64>(&mut conn),
            )
            .await;
        });
    }
}

impl Peers for Fleet {
    fn breaker_opened(&self, endpoint: &str, cooldown: Duration) {
        self.announce(Change::BreakerOpened {
            endpoint: endpoint.to_owned(),
            until_ms: crate::clock::unix_ms() + cooldown.as_millis() as u64,
        });
    }

    fn breaker_closed(&self, endpoint: &str) {
        self.announce(Change::BreakerClosed {
            endpoint: endpoint.to_owned(),
        });
    }

    fn claim_probe(&self, endpoint: &str, ttl: Duration) -> Option<BoxFuture<'static, bool>> {
        let fleet = self.this()?;
        Some(Box::pin(fleet.claim_probe_now(endpoint.to_owned(), ttl)))
    }

    fn affinity_pinned(&self, caller: &str, model: &str, endpoint: &str, ttl: Duration) {
        self.announce(Change::Pinned {
            caller: caller.to_owned(),
            model: model.to_owned(),
            endpoint: endpoint.to_owned(),
            until_ms: crate::clock::unix_ms() + ttl.as_millis() as u64,
        });
    }

    fn affinity_dropped(&self, caller: &str, model: &str, endpoint: &str) {
        self.announce(Change::Unpinned {
            caller: caller.to_owned(),
            model: model.to_owned(),
            endpoint: endpoint.to_owned(),
        });
    }

    fn key_quieted(&self, fingerprint: &str, status: u16, period: Duration) {
        self.announce(Change::Quieted {
            fingerprint: fingerprint.to_owned(),
            status,
            until_ms: crate::clock::unix_ms() + period.as_millis() as u64,
        });
    }

    fn key_bound(
        &self,
        caller: &str,
        pool: &str,
        fingerprint: &str,
        role: Option<Role>,
        ttl: Duration,
    ) {
        self.announce(Change::Bound {
            caller: caller.to_owned(),
            pool: pool.to_owned(),
            fingerprint: fingerprint.to_owned(),
            role,
            until_ms: crate::clock::unix_ms() + ttl.as_millis() as u64,
        });
    }

    fn admit(
        &self,
        model: &str,
        upstream: &ModelUpstream,
    ) -> Option<BoxFuture<'static, Admission>> {
        let capacity = Capacity::of(model, upstream)?;
        let fleet = self.this()?;
        Some(Box::pin(fleet.admit_now(capacity)))
    }
}

impl Fleet {
    /// An owning handle to this fleet, for futures that outlive the borrow. The routing context
    /// holds the fleet as an `Arc`, so there always is one while requests run.
    fn this(&self) -> Option<Arc<Fleet>> {
        self.this.upgrade()
    }
}

/// Publishes announcements in order, each with its kept record, one pipeline per change.
async fn publish(fleet: Weak<Fleet>, mut inbox: mpsc::Receiver<Change>) {
    while let Some(change) = inbox.recv().await {
        let Some(mut fleet) = fleet.upgrade() else {
            return;
        };
        // While Redis is down, hold the queue (it drops what overflows) instead of timing out
        // one change at a time; the changes still in force go out when it is back.
        while !fleet.is_connected() {
            let weak = Arc::downgrade(&fleet);
            drop(fleet);
            tokio::time::sleep(Duration::from_millis(100)).await;
            let Some(again) = weak.upgrade() else { return };
            fleet = again;
        }
        let message = Message {
            from: fleet.replica.clone(),
            change,
        };
        let Ok(json) = serde_json::to_string(&message) else {
            continue;
        };
        let mut pipe = redis::pipe();
        match message.change.record(&fleet.config.key_prefix) {
            Record::Keep { key, until_ms } => {
                let ttl = until_ms.saturating_sub(crate::clock::unix_ms()).max(1);
                pipe.cmd("SET")
                    .arg(&key)
                    .arg(&json)
                    .arg("PX")
                    .arg(ttl)
                    .ignore();
            }
            Record::Delete { key } => {
                pipe.cmd("DEL").arg(&key).ignore();
            }
        }
        pipe.cmd("PUBLISH").arg(fleet.channel()).arg(&json).ignore();
        let mut conn = fleet.conn.clone();
        match tokio::time::timeout(Duration::from_secs(2), pipe.exec_async(&mut conn)).await {
            Ok(Ok(())) => {
                fleet.counters.published.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Err(e)) => {
                fleet.counters.dropped.fetch_add(1, Ordering::Relaxed);
                fleet.set_link(false, Some(e.to_string()));
            }
            Err(_) => {
                fleet.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Listens to the other replicas, reconnecting with backoff. Each (re)connection subscribes
/// first and then loads the kept records, so no change falls between the two.
async fn subscribe(fleet: Weak<Fleet>, routing: RoutingContext) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let Some(strong) = fleet.upgrade() else {
            return;
        };
        let client = strong.client.clone();
        let channel = strong.channel();
        drop(strong);
        let connected = tokio::time::timeout(Duration::from_secs(2), async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        })
        .await;
        let mut pubsub = match connected {
            Ok(Ok(pubsub)) => pubsub,
            Ok(Err(e)) => {
                if let Some(f) = fleet.upgrade() {
                    f.set_link(false, Some(e.to_string()));
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
            Err(_) => {
                if let Some(f) = fleet.upgrade() {
                    f.set_link(false, Some("connecting timed out".into()));
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        {
            let Some(f) = fleet.upgrade() else { return };
            f.set_link(true, None);
            match load_records(&f, &routing).await {
                Ok(n) => {
                    f.joined.store(true, Ordering::Release);
                    tracing::info!(records = n, "fleet: loaded the shared routing state");
                }
                Err(e) => tracing::warn!("fleet: loading the shared routing state failed: {e}"),
            }
        }
        let mut messages = pubsub.on_message();
        while let Some(msg) = messages.next().await {
            let Some(f) = fleet.upgrade() else { return };
            let Ok(message) = serde_json::from_slice::<Message>(msg.get_payload_bytes()) else {
                continue;
            };
            if message.from == f.replica {
                continue;
            }
            f.counters.received.fetch_add(1, Ordering::Relaxed);
            message.change.apply(&routing, crate::clock::unix_ms());
        }
        if let Some(f) = fleet.upgrade() {
            f.set_link(false, Some("the subscription ended".into()));
        }
        tokio::time::sleep(backoff).await;
    }
}

/// Reads every kept record (breakers, pins, quiet keys, bindings) into this process's state.
async fn load_records(fleet: &Fleet, routing: &RoutingContext) -> redis::RedisResult<usize> {
    let mut conn = fleet.conn.clone();
    let mut loaded = 0;
    for pattern in events::record_patterns(&fleet.config.key_prefix) {
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await?;
            if !keys.is_empty() {
                let values: Vec<Option<String>> =
                    redis::cmd("MGET").arg(&keys).query_async(&mut conn).await?;
                let now = crate::clock::unix_ms();
                for value in values.into_iter().flatten() {
                    if let Ok(message) = serde_json::from_str::<Message>(&value) {
                        message.change.apply(routing, now);
                        loaded += 1;
                    }
                }
            }
            cursor = next;
            if cursor == 0 || loaded >= MAX_RECORDS_LOADED {
                break;
            }
        }
    }
    Ok(loaded)
}

/// This replica's backlog as published: endpoint → load, and when.
#[derive(serde::Serialize, serde::Deserialize)]
struct BacklogPublication {
    at_ms: u64,
    endpoints: HashMap<String, Load>,
}

/// Every `backlog_publish_ms`: writes this replica's prefill backlog, reads the others' (fresh
/// ones summed into the prefill tracker), and now and then renews held concurrency slots. Also
/// the fleet's liveness check: a failed round marks Redis unreachable and the others' backlog
/// is forgotten (selection falls back to the local view).
async fn exchange_backlog(fleet: Weak<Fleet>, routing: RoutingContext) {
    let Some(period) = fleet.upgrade().map(|f| f.config.backlog_publish) else {
        return;
    };
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_renewal = tokio::time::Instant::now();
    loop {
        tick.tick().await;
        let Some(fleet) = fleet.upgrade() else { return };
        let now = crate::clock::unix_ms();
        let mine = BacklogPublication {
            at_ms: now,
            endpoints: routing
                .prefill
                .report()
                .into_iter()
                .filter(|(_, l)| l.backlog_tokens > 0 || l.elephants > 0)
                .collect(),
        };
        let Ok(json) = serde_json::to_string(&mine) else {
            continue;
        };
        let key = fleet.key("backlog");
        let mut conn = fleet.conn.clone();
        let mut round = redis::pipe();
        round
            .cmd("HSET")
            .arg(&key)
            .arg(&fleet.replica)
            .arg(&json)
            .ignore()
            .cmd("HGETALL")
            .arg(&key);
        let answer = round.query_async::<(HashMap<String, String>,)>(&mut conn);
        match tokio::time::timeout(Duration::from_secs(2), answer).await {
            Ok(Ok((all,))) => {
                fleet.set_link(true, None);
                let fresh = backlog_freshness(period).as_millis() as u64;
                let mut sum: crate::id_map::IdMap<String, Load> = Default::default();
                let mut seen = 0;
                let mut stale = Vec::new();
                for (replica, json) in &all {
                    let Ok(p) = serde_json::from_str::<BacklogPublication>(json) else {
                        stale.push(replica.clone());
                        continue;
                    };
                    let age = now.saturating_sub(p.at_ms);
                    if age > 60_000 {
                        stale.push(replica.clone());
                    }
                    if age > fresh {
                        continue;
                    }
                    seen += 1;
                    if *replica == fleet.replica {
                        continue;
                    }
                    for (endpoint, load) in p.endpoints {
                        let s = sum.entry(endpoint).or_default();
                        s.backlog_tokens += load.backlog_tokens;
                        s.elephants += load.elephants;
                    }
                }
                fleet.replicas_seen.store(seen, Ordering::Relaxed);
                routing.prefill.set_remote(sum);
                if !stale.is_empty() {
                    let _ = redis::cmd("HDEL")
                        .arg(&key)
                        .arg(&stale)
                        .query_async::<i64>(&mut conn)
                        .await;
                }
            }
            Ok(Err(e)) => {
                fleet.set_link(false, Some(e.to_string()));
                routing.prefill.set_remote(Default::default());
            }
            Err(_) => {
                fleet.set_link(false, Some("no answer within 2 s".into()));
                routing.prefill.set_remote(Default::default());
            }
        }
        refresh_quota_counts(&fleet).await;
        if last_renewal.elapsed() >= gate::SLOT_RENEW {
            last_renewal = tokio::time::Instant::now();
            renew_slots(&fleet).await;
        }
    }
}

/// Re-reads the fleet's count of every quota pool this replica knows, for today.
async fn refresh_quota_counts(fleet: &Fleet) {
    let day = chrono::Local::now().date_naive();
    let pools: Vec<String> = fleet.quota_counts.lock().keys().cloned().collect();
    if pools.is_empty() {
        return;
    }
    let keys: Vec<String> = pools
        .iter()
        .map(|pool| fleet.key(&format!("quota:{pool}:{day}")))
        .collect();
    let mut conn = fleet.conn.clone();
    let mut read = redis::cmd("MGET");
    read.arg(&keys);
    let Ok(Ok(counts)) = tokio::time::timeout(
        Duration::from_secs(2),
        read.query_async::<Vec<Option<u64>>>(&mut conn),
    )
    .await
    else {
        return;
    };
    let mut known = fleet.quota_counts.lock();
    for (pool, count) in pools.into_iter().zip(counts) {
        known.insert(pool, (day, count.unwrap_or(0)));
    }
}

/// Renews the leases of every concurrency slot this replica holds.
async fn renew_slots(fleet: &Fleet) {
    let mut by_pool: HashMap<String, Vec<String>> = HashMap::new();
    for (slot, key) in fleet.held_slots.lock().iter() {
        by_pool.entry(key.clone()).or_default().push(slot.clone());
    }
    let mut conn = fleet.conn.clone();
    for (key, slots) in by_pool {
        let mut call = fleet.renew_script.key(&key);
        call.arg(gate::SLOT_LEASE.as_millis() as u64);
        for slot in &slots {
            call.arg(slot);
        }
        let _ =
            tokio::time::timeout(Duration::from_secs(2), call.invoke_async::<i64>(&mut conn)).await;
    }
}
