//! The selection pipeline in-process, with the real `fixed` component: how the breaker, weights
//! and the strategy combine over many draws.

use std::path::Path;
use std::time::Instant;

use switchyard::config::Config;
use switchyard::gateway::Routing;
use switchyard::routing::RoutingContext;
use switchyard::routing::health::{HealthRegistry, Outcome, Ticket};
use switchyard::routing::select::{self, RequestFacts, SelectionError};

async fn routing(yaml: &str) -> (Routing, RoutingContext) {
    let text = format!(
        "strategies:\n  builtin_dir: {}\n{yaml}",
        crate::harness::target_dir().join("strategies").display()
    );
    let config = Config::from_yaml(Path::new("pipeline.yaml"), &text, &|_| None).unwrap();
    let ctx = RoutingContext::new(&config);
    (
        Routing::build(&config, switchyard::gateway::DirLoad::Now)
            .await
            .unwrap(),
        ctx,
    )
}

fn open(health: &HealthRegistry, endpoint: &str) {
    for _ in 0..3 {
        health.record(endpoint, Ticket::Normal, Outcome::Failure, Some("HTTP 500"));
    }
    assert!(health.admits(endpoint, Instant::now()).is_none());
}

const THREE: &str = "models:\n  - id: m\n    route:\n      - kind: openai_compat\n        base_url: http://127.0.0.1:7001/v1\n      - kind: openai_compat\n        base_url: http://127.0.0.1:7002/v1\n      - kind: openai_compat\n        base_url: http://127.0.0.1:7003/v1\n";

#[tokio::test]
async fn an_open_breaker_splits_its_share_between_the_others() {
    let (r, ctx) = routing(THREE).await;
    let model = r.table.resolve("m").unwrap().clone();
    open(&ctx.health, "m:local-7002");
    let mut counts = [0u32; 3];
    let n = 10_000;
    for _ in 0..n {
        let plan = select::select(&model, &RequestFacts::default(), &ctx, None)
            .await
            .unwrap();
        assert_eq!(plan.order.len(), 2, "the open route is not a candidate");
        counts[plan.order[0]] += 1;
    }
    assert_eq!(counts[1], 0);
    for c in [counts[0], counts[2]] {
        let share = f64::from(c) / f64::from(n);
        assert!((share - 0.5).abs() < 0.03, "{counts:?}");
    }
}

#[tokio::test]
async fn with_every_positive_route_open_a_weight_zero_route_is_never_chosen() {
    let (r, ctx) = routing(&THREE.replace("7003/v1\n", "7003/v1\n        weight: 0\n")).await;
    let model = r.table.resolve("m").unwrap().clone();
    open(&ctx.health, "m:local-7001");
    open(&ctx.health, "m:local-7002");
    let err = select::select(&model, &RequestFacts::default(), &ctx, None)
        .await
        .unwrap_err();
    assert!(matches!(err, SelectionError::NoAdmissibleUpstream { .. }));
    assert_eq!(
        err.to_string(),
        "no upstream of model `m` can take this request: m:local-7001 (circuit open), m:local-7002 (circuit open), m:local-7003 (weight 0)"
    );
}
