//! The fleet against the real Redis at 127.0.0.1:6379 (`xtask ci` starts it), each test under a
//! key prefix of its own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::routing::health::{Outcome, Ticket};

fn config(prefix: &str) -> FleetConfig {
    FleetConfig {
        redis_url: std::env::var("SWITCHYARD_TEST_REDIS_URL")
            .unwrap_or_else(|_| "redis://127.0.0.1:6379".into()),
        key_prefix: format!("sytest-{prefix}-{}", uuid::Uuid::now_v7()),
        deadline: Duration::from_millis(500),
        backlog_publish: Duration::from_millis(50),
    }
}

fn routing() -> RoutingContext {
    let config = crate::config::Config::from_yaml(
        std::path::Path::new("fleet-test.yaml"),
        "models: []\n",
        &|_| None,
    )
    .unwrap();
    RoutingContext::new(&config)
}

async fn until(what: &str, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{what}: not within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn replica(config: &FleetConfig) -> (Arc<Fleet>, RoutingContext) {
    let mut routing = routing();
    let fleet = Fleet::join(config.clone(), &mut routing).unwrap();
    let f = fleet.clone();
    until("the replica is connected", || f.is_connected()).await;
    (fleet, routing)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_opened_on_one_replica_is_skipped_by_the_other_and_by_a_late_joiner() {
    let config = config("breaker");
    let (_a, ra) = replica(&config).await;
    let (_b, rb) = replica(&config).await;
    for _ in 0..3 {
        ra.health
            .record("e", Ticket::Normal, Outcome::Failure, Some("HTTP 500"));
    }
    assert!(ra.health.admits("e", Instant::now()).is_none());
    until("replica b skips the endpoint", || {
        rb.health.admits("e", Instant::now()).is_none()
    })
    .await;
    // A replica that starts later reads the kept record.
    let (_c, rc) = replica(&config).await;
    until("a late joiner skips it too", || {
        rc.health.admits("e", Instant::now()).is_none()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_half_open_probe_is_claimed_once_across_replicas() {
    let config = config("probe");
    let (a, _) = replica(&config).await;
    let (b, _) = replica(&config).await;
    let ttl = Duration::from_secs(30);
    let first = a.claim_probe("e", ttl).unwrap().await;
    let second = b.claim_probe("e", ttl).unwrap().await;
    assert!(first);
    assert!(!second, "the other replica's claim holds");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn affinity_and_key_state_reach_the_other_replica() {
    let config = config("affinity");
    let (_a, ra) = replica(&config).await;
    let (_b, rb) = replica(&config).await;
    let caller: Arc<str> = "key:c1".into();
    ra.affinity.set(&caller, "m", "e2", Instant::now());
    until("the pin is shared", || {
        rb.affinity.get(&caller, "m", Instant::now()).as_deref() == Some("e2")
    })
    .await;
    let key = crate::config::PoolKey {
        pool: "p".into(),
        label: "k1".into(),
        fingerprint: "fp1".into(),
        slot: 0,
        weighted: false,
    };
    ra.keys
        .quiet(&key, 429, Some(Duration::from_secs(30)), Instant::now());
    until("the quiet key is shared", || {
        rb.keys.quiet_until("fp1", Instant::now()).is_some()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_and_slots_are_never_over_admitted_across_replicas() {
    let config = config("gate");
    let replicas = [replica(&config).await.0, replica(&config).await.0];
    let yaml = "models:\n  - id: m\n    route:\n      - kind: openai_compat\n        base_url: http://127.0.0.1:9/v1\n        metadata: {provider_type: quota, quota: {limit: 7}}\n      - kind: openai_compat\n        base_url: http://127.0.0.2:9/v1\n        metadata: {provider_type: concurrency, concurrency: {limit: 2}}\n";
    let cfg =
        crate::config::Config::from_yaml(std::path::Path::new("g.yaml"), yaml, &|_| None).unwrap();
    let (quota, slots) = (&cfg.models[0].upstreams[0], &cfg.models[0].upstreams[1]);
    let mut admitted = 0;
    let mut tasks = Vec::new();
    for i in 0..20 {
        let f = replicas[i % 2].clone();
        let q = quota.clone();
        tasks.push(tokio::spawn(async move {
            matches!(f.admit("m", &q).unwrap().await, Admission::Granted(_))
        }));
    }
    for t in tasks {
        admitted += usize::from(t.await.unwrap());
    }
    assert_eq!(admitted, 7, "exactly the quota, across both replicas");
    // Each replica's RouteWise quota counter reads the fleet's count, not its own half.
    use crate::routewise::quota::SharedQuotaCounts;
    let today = chrono::Local::now().date_naive();
    for r in &replicas {
        until("the replica knows the fleet's count", || {
            r.used("m:e1", today).is_some_and(|n| n == 7)
                || r.used(&format!("m:{}", quota.endpoint_id), today) == Some(7)
        })
        .await;
    }

    let mut held = Vec::new();
    for i in 0..4 {
        match replicas[i % 2].admit("m", slots).unwrap().await {
            Admission::Granted(guard) => held.push(guard),
            Admission::Refused(reason) => assert!(reason.contains("full"), "{reason}"),
        }
    }
    assert_eq!(held.len(), 2, "two slots fleet-wide");
    held.pop();
    // The released slot comes back (its ZREM runs in the background).
    let start = Instant::now();
    loop {
        if let Admission::Granted(g) = replicas[0].admit("m", slots).unwrap().await {
            held.push(g);
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the slot came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_replica_sees_the_others_prefill_backlog() {
    let config = config("backlog");
    let (_a, ra) = replica(&config).await;
    let (_b, rb) = replica(&config).await;
    let _lease = ra.prefill.acquire(None, "e", 120_000);
    until("b counts a's backlog", || {
        rb.prefill.load("e").backlog_tokens == 120_000
    })
    .await;
    assert_eq!(rb.prefill.local_load("e").backlog_tokens, 0);
    assert_eq!(
        ra.prefill.load("e").backlog_tokens,
        120_000,
        "its own is not counted twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_redis_leaves_the_replica_on_local_state() {
    let mut config = config("down");
    // Nothing listens on port 1.
    config.redis_url = "redis://127.0.0.1:1".into();
    let mut routing = routing();
    let fleet = Fleet::join(config, &mut routing).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!fleet.is_connected());
    assert_eq!(fleet.report()["state"], "local_fallback");
    // Probes stand locally; nothing waits.
    assert!(
        fleet
            .claim_probe("e", Duration::from_secs(1))
            .unwrap()
            .await
    );
    let yaml = "models:\n  - id: m\n    route:\n      - kind: openai_compat\n        base_url: http://127.0.0.1:9/v1\n        metadata: {provider_type: quota, quota: {limit: 1}}\n";
    let cfg =
        crate::config::Config::from_yaml(std::path::Path::new("g.yaml"), yaml, &|_| None).unwrap();
    assert!(matches!(
        fleet.admit("m", &cfg.models[0].upstreams[0]).unwrap().await,
        Admission::Granted(None)
    ));
    assert!(fleet.report()["local_fallbacks"].as_u64().unwrap() >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_are_one_limit_for_the_whole_fleet() {
    use crate::server::rate_limit::{Charge, LimitKind, LimitStore};
    let config = config("limits");
    let stores = [
        limits::FleetLimits::new(replica(&config).await.0),
        limits::FleetLimits::new(replica(&config).await.0),
    ];
    let rpm = Charge {
        key: "consumer:c1:rpm".into(),
        kind: LimitKind::Requests,
        limit: 5,
        amount: 1,
    };
    let mut admitted = 0;
    for i in 0..12 {
        if stores[i % 2]
            .check_and_reserve(std::slice::from_ref(&rpm))
            .await
            .is_ok()
        {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 5, "rpm 5 across both replicas");
    let refused = stores[0]
        .check_and_reserve(std::slice::from_ref(&rpm))
        .await
        .unwrap_err();
    assert!(refused.retry_after > Duration::ZERO && refused.retry_after <= Duration::from_secs(12));
    assert_eq!(refused.standings[0].remaining, 0);

    // All or nothing: a refused token charge takes nothing from the request charge beside it.
    let rpm2 = Charge {
        key: "consumer:c2:rpm".into(),
        ..rpm.clone()
    };
    let tpm = Charge {
        key: "consumer:c2:tpm".into(),
        kind: LimitKind::Tokens,
        limit: 100,
        amount: 80,
    };
    let ok = stores[0]
        .check_and_reserve(&[rpm2.clone(), tpm.clone()])
        .await
        .unwrap();
    assert_eq!((ok[0].remaining, ok[1].remaining), (4, 20));
    let refused = stores[1]
        .check_and_reserve(&[rpm2.clone(), tpm.clone()])
        .await
        .unwrap_err();
    assert_eq!(refused.index, 1);
    assert_eq!(
        refused.standings[0].remaining, 4,
        "the request charge was not taken"
    );
    // Reconciling gives tokens back, fleet-wide.
    stores[0].reconcile(&tpm, -80);
    until_async("the refund reaches Redis", || async {
        stores[1]
            .check_and_reserve(&[Charge {
                amount: 0,
                ..tpm.clone()
            }])
            .await
            .is_ok_and(|s| s[0].remaining >= 99)
    })
    .await;

    let slot = Charge {
        key: "route:r:concurrency".into(),
        kind: LimitKind::Concurrent,
        limit: 2,
        amount: 1,
    };
    let one = std::slice::from_ref(&slot);
    assert!(stores[0].check_and_reserve(one).await.is_ok());
    assert!(stores[1].check_and_reserve(one).await.is_ok());
    assert!(
        stores[0].check_and_reserve(one).await.is_err(),
        "two slots fleet-wide"
    );
    stores[1].release(&slot);
    until_async("the released slot is free", || async {
        stores[0].check_and_reserve(one).await.is_ok()
    })
    .await;
}

async fn until_async<F, Fut>(what: &str, mut ready: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !ready().await {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{what}: not within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_spend_is_one_counter_for_the_fleet_seeded_once() {
    use crate::server::budget::{BudgetLedger, LedgerKey};
    let config = config("budgets");
    let (a, _ra) = replica(&config).await;
    let (b, _rb) = replica(&config).await;
    let (la, lb) = (
        budgets::FleetLedger::start(a.clone()),
        budgets::FleetLedger::start(b.clone()),
    );
    let key = LedgerKey {
        budget_id: "bg_1".into(),
        period_start_ms: 1_000,
        period_end_ms: Some(i64::MAX / 2),
    };
    // The first seed sets the counter; a replica seeding later (or again) finds it.
    la.seed(&key, 2.0).await;
    lb.seed(&key, 2.0).await;
    assert!(la.is_seeded(&key) && lb.is_seeded(&key));
    assert_eq!((la.spent(&key), lb.spent(&key)), (2.0, 2.0));
    // Each replica sees its own charge at once, and the other's within a refresh.
    la.charge(&key, 0.5);
    lb.charge(&key, 0.25);
    assert_eq!(la.spent(&key), 2.5);
    until("both replicas see 2.75", || {
        la.spent(&key) == 2.75 && lb.spent(&key) == 2.75
    })
    .await;
    let mut conn = a.conn.clone();
    let stored: f64 = redis::cmd("GET")
        .arg(a.key("budget:bg_1:1000"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(stored, 2.75);
    // Another period is another counter.
    let next = LedgerKey {
        period_start_ms: 2_000,
        ..key.clone()
    };
    assert_eq!(lb.spent(&next), 0.0);
}
