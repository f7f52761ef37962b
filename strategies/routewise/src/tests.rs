//! Strategy-level tests: the public `Strategy` calls, checked through decisions and `status()`.

use serde_json::Value;
use switchyard_sdk::{
    Candidate, HedgeRequest, Observation, Pricing, Request, Rng, Strategy, Upstream, parse_params,
};

use crate::{DecisionTag, EXPLORATION_LEASE_MS, RouteWise, TagKey};

const M: &str = "m";

fn route(index: u32, pricing: Option<(f64, f64)>, metadata: &str) -> Upstream {
    Upstream {
        endpoint_id: format!("m:ep{index}"),
        pricing: pricing.map(|(prompt, completion)| Pricing {
            prompt,
            completion,
            input_cache_reads: prompt / 10.0,
            input_cache_writes: prompt,
        }),
        metadata_json: metadata.to_owned(),
        ..Upstream::new(index, 1.0)
    }
}

fn router(params: &str, routes: &[Upstream]) -> Result<RouteWise, String> {
    let mut rw = RouteWise::create(M, parse_params(params)?)?;
    rw.refresh_upstreams(routes);
    Ok(rw)
}

fn request(seed: u64, now_ms: u64, prompt_tokens: u32) -> Request {
    Request {
        prompt_tokens,
        now_ms,
        ..Request::with_seed(seed)
    }
}

fn candidates(indexes: &[u32]) -> Vec<Candidate> {
    indexes.iter().map(|&i| Candidate::new(i, 1.0)).collect()
}

fn observation(
    index: u32,
    success: bool,
    ttft_ms: f64,
    now_ms: u64,
    metadata: &str,
) -> Observation {
    Observation {
        index,
        success,
        ttft_ms: Some(ttft_ms),
        latency_ms: ttft_ms * 2.0,
        prompt_tokens: 1_000,
        completion_tokens: 100,
        cached_prompt_tokens: 0,
        status: if success { 200 } else { 500 },
        strategy_metadata: metadata.to_owned(),
        now_ms,
    }
}

fn status(rw: &RouteWise) -> Value {
    serde_json::from_str(&rw.status()).unwrap_or(Value::Null)
}

fn select(rw: &mut RouteWise, seed: u64, now: u64, indexes: &[u32]) -> (Vec<u32>, DecisionTag) {
    let decision = rw
        .select(&request(seed, now, 1_000), &candidates(indexes))
        .expect("select");
    let tag = DecisionTag::parse(&decision.strategy_metadata).expect("tag");
    (decision.order, tag)
}

/// Two on-demand routes: cost 1 USD (prompt 1 000 USD/M × 1 000 tokens) at 10 s, cost 3 USD at 1 s.
fn two_route_router(params: &str) -> Result<RouteWise, String> {
    let mut rw = router(
        params,
        &[
            route(0, Some((1_000.0, 0.0)), "{}"),
            route(1, Some((3_000.0, 0.0)), "{}"),
        ],
    )?;
    rw.observe(&observation(0, true, 10_000.0, 0, ""));
    rw.observe(&observation(1, true, 1_000.0, 0, ""));
    Ok(rw)
}

#[test]
fn info_names_the_strategy() {
    assert_eq!(RouteWise::info().name, "routewise");
}

#[test]
fn hand_solved_mixture_through_the_strategy() -> Result<(), String> {
    let mut rw = two_route_router(r#"{"budget_alpha": 0.5}"#)?;
    let mut first = [0u32; 2];
    for seed in 0..4_000 {
        let (order, tag) = select(&mut rw, seed, 1, &[0, 1]);
        assert_eq!(order.len(), 2);
        assert_eq!(tag.primary, order[0]);
        first[order[0] as usize] += 1;
    }
    let share = f64::from(first[0]) / 4_000.0;
    assert!((share - 0.5).abs() < 0.03, "{first:?}");
    let s = status(&rw);
    let last = &s["last_decision"];
    assert_eq!(last["lp_status"], "optimal");
    assert!((last["budget"].as_f64().unwrap_or(0.0) - 2.0).abs() < 1e-9);
    assert!((last["mixture"]["m:ep0"].as_f64().unwrap_or(0.0) - 0.5).abs() < 1e-9);
    assert!((last["mixture"]["m:ep1"].as_f64().unwrap_or(0.0) - 0.5).abs() < 1e-9);
    assert!((last["expected_cost"].as_f64().unwrap_or(0.0) - 2.0).abs() < 1e-9);
    Ok(())
}

#[test]
fn predicted_output_prices_the_completion() -> Result<(), String> {
    // Completion-only pricing: 500 default tokens (the reference's) × 2 USD/M. The route is
    // profiled by an empty answer first (no exploration lease), which teaches the predictor nothing.
    let mut rw = router(r#"{}"#, &[route(0, Some((0.0, 2.0)), "{}")])?;
    let mut empty = observation(0, true, 500.0, 0, "");
    empty.completion_tokens = 0;
    rw.observe(&empty);
    let (_, tag) = select(&mut rw, 1, 1, &[0]);
    assert!((tag.predicted_cost - 500.0 * 2.0 / 1e6).abs() < 1e-15);
    // max_tokens caps the prediction, the default too: a deliberate difference from the
    // reference (which predicts 500 whatever the request's max_tokens), because no answer can be
    // longer than max_tokens and a longer prediction only overprices the route.
    let decision = rw.select(
        &Request {
            max_tokens: Some(10),
            ..request(2, 2, 1_000)
        },
        &candidates(&[0]),
    )?;
    let tag = DecisionTag::parse(&decision.strategy_metadata).ok_or("tag")?;
    assert!((tag.predicted_cost - 10.0 * 2.0 / 1e6).abs() < 1e-15);
    assert_eq!(status(&rw)["last_decision"]["lp_status"], "single_provider");
    // Zero-token answers teach nothing (as in the reference): still the default.
    for i in 0..10 {
        let mut empty = observation(0, true, 500.0, 3 + i, "");
        empty.completion_tokens = 0;
        rw.observe(&empty);
    }
    select(&mut rw, 3, 10, &[0]);
    assert_eq!(status(&rw)["last_decision"]["output_source"], "default");
    assert_eq!(status(&rw)["output"]["model_samples"], 0);
    // Five observations of 100 completion tokens at 1 000 prompt tokens: the bucket mean wins.
    for i in 0..5 {
        rw.observe(&observation(0, true, 500.0, 3 + i, ""));
    }
    select(&mut rw, 3, 10, &[0]);
    let s = status(&rw);
    assert_eq!(s["last_decision"]["predicted_output_tokens"], 100);
    assert_eq!(s["last_decision"]["output_source"], "bucket");
    Ok(())
}

#[test]
fn prefix_cache_adjustment_uses_the_uncached_estimate() -> Result<(), String> {
    let routes = [route(0, Some((1.0, 0.0)), "{}")];
    let mut warm = Candidate::new(0, 1.0);
    warm.uncached_prompt_tokens = 200;
    for (params, expected) in [
        ("{}", 1_000.0 / 1e6),
        (
            r#"{"prefix_cache_cost_adjustment_enabled": true}"#,
            (200.0 + 800.0 * 0.1) / 1e6,
        ),
    ] {
        let mut rw = router(params, &routes)?;
        let decision = rw.select(&request(1, 1, 1_000), std::slice::from_ref(&warm))?;
        let tag = DecisionTag::parse(&decision.strategy_metadata).ok_or("tag")?;
        assert!((tag.predicted_cost - expected).abs() < 1e-15, "{params}");
    }
    Ok(())
}

#[test]
fn unpriced_routes_cost_nothing_and_say_so() -> Result<(), String> {
    let mut rw = router(
        "{}",
        &[route(0, None, "{}"), route(1, Some((1.0, 1.0)), "{}")],
    )?;
    rw.observe(&observation(0, true, 800.0, 0, ""));
    rw.observe(&observation(1, true, 800.0, 0, ""));
    let (order, _) = select(&mut rw, 1, 1, &[0, 1]);
    assert_eq!(order, vec![0, 1]);
    let s = status(&rw);
    let candidates = s["last_decision"]["candidates"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(candidates[0]["unpriced"], true);
    assert_eq!(candidates[0]["cost"], 0.0);
    assert_eq!(candidates[1]["unpriced"], false);
    Ok(())
}

#[test]
fn failures_count_as_sixty_seconds_and_the_window_forgets() -> Result<(), String> {
    let mut rw = router("{}", &[route(0, Some((1.0, 1.0)), "{}")])?;
    rw.observe(&observation(0, true, 1_000.0, 0, ""));
    rw.observe(&failed(0, 502, 1_000));
    let s = status(&rw);
    assert_eq!(s["latency"]["m:ep0"]["samples"], 2);
    assert_eq!(s["latency"]["m:ep0"]["mean_ttft_ms"], 30_500.0);
    assert_eq!(s["latency"]["m:ep0"]["slo_share"], 0.5);
    // 900 s after the first sample only the failure is left; after the second, nothing.
    rw.tick(900_001);
    assert_eq!(status(&rw)["latency"]["m:ep0"]["estimate_ms"], 60_000.0);
    rw.tick(901_001);
    let s = status(&rw);
    assert_eq!(s["latency"]["m:ep0"]["samples"], 0);
    assert_eq!(s["latency"]["m:ep0"]["estimate_ms"], 5_000.0);
    // A success without TTFT falls back to total latency.
    let mut obs = observation(0, true, 0.0, 901_002, "");
    obs.ttft_ms = None;
    obs.latency_ms = 1_234.0;
    rw.observe(&obs);
    assert_eq!(status(&rw)["latency"]["m:ep0"]["mean_ttft_ms"], 1_234.0);
    // A stream that broke after its first token (the host reports status 200, not a success):
    // the endpoint did answer that fast, so its TTFT is the sample (the reference records the
    // first token and no error), and the failure starts a new streak.
    let mut broken = observation(0, false, 766.0, 901_003, "");
    broken.status = 200;
    rw.observe(&broken);
    let s = status(&rw);
    assert_eq!(s["latency"]["m:ep0"]["mean_ttft_ms"], 1_000.0);
    assert_eq!(s["latency"]["m:ep0"]["failure_streak"], 1);
    Ok(())
}

#[test]
fn sample_cap_per_profile() -> Result<(), String> {
    let mut rw = router(
        r#"{"latency_max_samples_per_profile": 3}"#,
        &[route(0, Some((1.0, 1.0)), "{}")],
    )?;
    for (i, ttft) in [100.0, 200.0, 300.0, 400.0, 500.0].into_iter().enumerate() {
        rw.observe(&observation(0, true, ttft, i as u64, ""));
    }
    let s = status(&rw);
    assert_eq!(s["latency"]["m:ep0"]["samples"], 3);
    assert_eq!(s["latency"]["m:ep0"]["mean_ttft_ms"], 400.0);
    Ok(())
}

#[test]
fn an_unprofiled_endpoint_is_explored_by_exactly_one_request_per_lease() -> Result<(), String> {
    // ep0 is fast, cheap and profiled; ep1 (dear) and ep2 (dearer) have no samples. α = 1: both
    // fit the budget, so each is explored with probability 1.
    let mut rw = router(
        r#"{"budget_alpha": 1.0}"#,
        &[
            route(0, Some((1.0, 0.0)), "{}"),
            route(1, Some((2.0, 0.0)), "{}"),
            route(2, Some((3.0, 0.0)), "{}"),
        ],
    )?;
    rw.observe(&observation(0, true, 100.0, 0, ""));
    let mut explored = Vec::new();
    for seed in 0..50 {
        let (order, tag) = select(&mut rw, seed, 10, &[0, 1, 2]);
        if tag.explore {
            explored.push(order[0]);
        } else {
            assert_eq!(order[0], 0, "seed {seed}");
        }
    }
    // The cheaper unprofiled endpoint first, then the other; each exactly once.
    assert_eq!(explored, vec![1, 2]);
    let s = status(&rw);
    // While explored, both are out of the plan (last-resort fallbacks), as in the reference.
    let reasons: Vec<&Value> = s["last_decision"]["candidates"]
        .as_array()
        .map(|c| c.iter().map(|c| &c["excluded"]).collect())
        .unwrap_or_default();
    assert_eq!(
        reasons,
        [
            &Value::Null,
            &Value::from("exploration_lease"),
            &Value::from("exploration_lease")
        ]
    );
    assert_eq!(s["counters"]["explorations"], 2);
    assert_eq!(
        s["latency"]["m:ep1"]["exploration_lease_until_ms"],
        10 + EXPLORATION_LEASE_MS
    );
    // ep1 reports; ep2's observation is lost: after the lease ep2 alone is explored again.
    rw.observe(&observation(1, true, 700.0, 20, ""));
    let (order, tag) = select(&mut rw, 99, 10 + EXPLORATION_LEASE_MS, &[0, 1, 2]);
    assert!(tag.explore);
    assert_eq!(order[0], 2);
    let (order, tag) = select(&mut rw, 100, 11 + EXPLORATION_LEASE_MS, &[0, 1, 2]);
    assert!(!tag.explore);
    assert_eq!(order[0], 0);
    Ok(())
}

#[test]
fn fallback_order_mixture_first_then_within_budget_by_latency() -> Result<(), String> {
    // Costs 1, 2, 3, 4 USD; TTFT 4, 3, 2, 1 s. α 1/3 → B = 2: the optimum is pure ep1 (cost 2,
    // 3 s), beating mixtures of ep0 with ep2 or ep3 on the budget line.
    let routes: Vec<Upstream> = (0..4)
        .map(|i| route(i, Some((1_000.0 * f64::from(i + 1), 0.0)), "{}"))
        .collect();
    let mut rw = router(r#"{"budget_alpha": 0.3333333333333333}"#, &routes)?;
    for i in 0..4u32 {
        rw.observe(&observation(i, true, 1_000.0 * f64::from(4 - i), 0, ""));
    }
    let (order, _) = select(&mut rw, 5, 1, &[3, 2, 1, 0]);
    // Mass: ep1; then within budget: ep0; then over budget by latency: ep3 (1 s), ep2 (2 s).
    assert_eq!(order, vec![1, 0, 3, 2]);
    Ok(())
}

#[test]
fn strict_mode_returns_only_the_primary() -> Result<(), String> {
    let mut rw = two_route_router(r#"{"budget_alpha": 0.5, "fallback_mode": "strict"}"#)?;
    for seed in 0..100 {
        let (order, tag) = select(&mut rw, seed, 1, &[0, 1]);
        assert_eq!(order.len(), 1);
        assert_eq!(order[0], tag.primary);
    }
    Ok(())
}

#[test]
fn no_candidates_and_all_excluded() -> Result<(), String> {
    let mut rw = router(
        "{}",
        &[route(
            0,
            None,
            r#"{"provider_type":"quota","quota":{"limit":5}}"#,
        )],
    )?;
    let decision = rw.select(&request(1, 1, 10), &[])?;
    assert!(decision.order.is_empty());
    assert_eq!(
        status(&rw)["last_decision"]["lp_status"],
        "no_feasible_candidates"
    );
    // The only candidate is an excluded quota route (no snapshot): it is still returned, as a last
    // resort, so the model keeps answering.
    let (order, tag) = select(&mut rw, 1, 2, &[0]);
    assert_eq!(order, vec![0]);
    assert!(!tag.explore && !tag.slot);
    let s = status(&rw);
    assert_eq!(s["last_decision"]["lp_status"], "no_feasible_candidates");
    assert_eq!(
        s["last_decision"]["candidates"][0]["excluded"],
        "quota_no_snapshot"
    );
    // An index missing from the route table is excluded too.
    let (order, _) = select(&mut rw, 1, 3, &[7]);
    assert_eq!(order, vec![7]);
    assert_eq!(
        status(&rw)["last_decision"]["candidates"][0]["excluded"],
        "unknown_route"
    );
    Ok(())
}

#[test]
fn invalid_metadata_excludes_the_route() -> Result<(), String> {
    let mut rw = router(
        "{}",
        &[
            route(0, Some((1.0, 1.0)), r#"{"provider_type":"spot"}"#),
            route(1, Some((9.0, 9.0)), "{}"),
        ],
    )?;
    let (order, _) = select(&mut rw, 1, 1, &[0, 1]);
    assert_eq!(order, vec![1, 0]);
    let s = status(&rw);
    assert!(
        s["routes"][0]["metadata_error"]
            .as_str()
            .is_some_and(|e| e.contains("spot"))
    );
    Ok(())
}

const CONCURRENCY: &str = r#"{"provider_type":"concurrency","concurrency":{"limit":1}}"#;

#[test]
fn concurrency_slot_acquire_release_and_expiry() -> Result<(), String> {
    let mut rw = router(
        "{}",
        &[
            route(0, Some((1.0, 1.0)), "{}"),
            route(1, None, CONCURRENCY),
        ],
    )?;
    rw.observe(&observation(0, true, 2_000.0, 0, ""));
    rw.observe(&observation(1, true, 500.0, 0, ""));
    // Free, fast and cheap: the concurrency route takes the slot.
    let (order, first) = select(&mut rw, 1, 10, &[0, 1]);
    assert_eq!(order, vec![1, 0]);
    assert!(first.slot);
    assert_eq!(status(&rw)["concurrency"]["m:m:ep1"]["in_flight"], 1);
    // Full: excluded, but still the last resort.
    let (order, second) = select(&mut rw, 2, 11, &[0, 1]);
    assert_eq!(order, vec![0, 1]);
    assert!(!second.slot);
    assert_eq!(
        status(&rw)["last_decision"]["candidates"][1]["excluded"],
        "concurrency_full"
    );
    // The second request's observation releases nothing; the first's frees the slot.
    rw.observe(&observation(0, true, 2_000.0, 12, &second.encode()));
    assert_eq!(status(&rw)["concurrency"]["m:m:ep1"]["in_flight"], 1);
    rw.observe(&observation(1, true, 500.0, 13, &first.encode()));
    assert_eq!(status(&rw)["concurrency"]["m:m:ep1"]["in_flight"], 0);
    // A lost observation: the slot expires after the timeout (through `tick` or `select`).
    let (_, third) = select(&mut rw, 3, 20, &[0, 1]);
    assert!(third.slot);
    rw.tick(20 + crate::CONCURRENCY_ACQUIRE_TIMEOUT_MS - 1);
    assert_eq!(status(&rw)["concurrency"]["m:m:ep1"]["in_flight"], 1);
    rw.tick(20 + crate::CONCURRENCY_ACQUIRE_TIMEOUT_MS);
    let s = status(&rw);
    assert_eq!(s["concurrency"]["m:m:ep1"]["in_flight"], 0);
    assert_eq!(s["counters"]["slots_expired"], 1);
    // A re-created router ignores its predecessor's metadata.
    let mut other = router("{}", &[route(1, None, CONCURRENCY)])?;
    let (_, tag) = select(&mut other, 77, 30, &[1]);
    let foreign = DecisionTag {
        epoch: tag.epoch ^ 1,
        ..tag.clone()
    };
    other.observe(&observation(1, true, 500.0, 31, &foreign.encode()));
    assert_eq!(status(&other)["concurrency"]["m:m:ep1"]["in_flight"], 1);
    Ok(())
}

#[test]
fn concurrency_pools_are_shared() -> Result<(), String> {
    let shared =
        r#"{"provider_type":"concurrency","concurrency":{"limit":1},"concurrency_pool":"box"}"#;
    let mut rw = router("{}", &[route(0, None, shared), route(1, None, shared)])?;
    rw.observe(&observation(0, true, 100.0, 0, ""));
    rw.observe(&observation(1, true, 100.0, 0, ""));
    let (_, tag) = select(&mut rw, 1, 1, &[0, 1]);
    assert!(tag.slot);
    let s = {
        select(&mut rw, 2, 2, &[0, 1]);
        status(&rw)
    };
    assert_eq!(s["last_decision"]["lp_status"], "no_feasible_candidates");
    assert_eq!(s["concurrency"]["box"]["in_flight"], 1);
    Ok(())
}

fn quota_meta(limit: u64, snapshot: Option<(u64, u64)>) -> String {
    match snapshot {
        Some((used, at_ms)) => format!(
            r#"{{"provider_type":"quota","quota":{{"limit":{limit}}},
               "quota_snapshot":{{"used":{used},"limit":{limit},"at_ms":{at_ms}}}}}"#
        ),
        None => format!(r#"{{"provider_type":"quota","quota":{{"limit":{limit}}}}}"#),
    }
}

/// An on-demand route (ep0, 1 USD/M prompt and completion) and a quota route (ep1), both profiled,
/// the quota route faster; the envelope calibrated with `samples` successes.
fn quota_router(params: &str, quota: &str, samples: u32) -> Result<RouteWise, String> {
    let mut rw = router(
        params,
        &[route(0, Some((1.0, 1.0)), "{}"), route(1, None, quota)],
    )?;
    rw.observe(&observation(0, true, 3_000.0, 0, ""));
    rw.observe(&observation(1, true, 500.0, 0, ""));
    for i in 0..samples {
        let mut obs = observation(0, true, 3_000.0, 1, "");
        obs.prompt_tokens = 1_000 * (i + 1);
        obs.completion_tokens = 0;
        rw.observe(&obs);
    }
    Ok(rw)
}

#[test]
fn quota_is_excluded_until_calibrated_and_snapshotted() -> Result<(), String> {
    let params = r#"{"envelope_min_samples": 5, "budget_alpha": 1.0}"#;
    // Envelope samples so far: 2 (the profiling observations) + 2 = 4 < 5.
    let mut rw = quota_router(params, &quota_meta(10, Some((0, 0))), 2)?;
    select(&mut rw, 1, 10, &[0, 1]);
    let s = status(&rw);
    assert_eq!(
        s["last_decision"]["candidates"][1]["excluded"],
        "quota_envelope_uncalibrated"
    );
    assert_eq!(s["envelope"]["calibrated"], false);

    // Calibrated but no snapshot yet.
    let mut rw = quota_router(params, &quota_meta(10, None), 3)?;
    select(&mut rw, 1, 10, &[0, 1]);
    let s = status(&rw);
    assert_eq!(s["envelope"]["calibrated"], true);
    assert_eq!(
        s["last_decision"]["candidates"][1]["excluded"],
        "quota_no_snapshot"
    );
    assert_eq!(s["quota"]["m:m:ep1"]["state"], "no_snapshot");

    // The host's snapshot arrives: 5 of 10 used → z = 0.5, cost = sqrt(L·U).
    rw.refresh_upstreams(&[
        route(0, Some((1.0, 1.0)), "{}"),
        route(1, None, &quota_meta(10, Some((5, 5)))),
    ]);
    let (order, tag) = select(&mut rw, 1, 20, &[0, 1]);
    assert_eq!(order[0], 1);
    let s = status(&rw);
    let (lower, upper) = (
        s["envelope"]["lower"].as_f64().unwrap_or(0.0),
        s["envelope"]["upper"].as_f64().unwrap_or(0.0),
    );
    assert!(lower > 0.0 && upper > lower);
    let expected = lower * (upper / lower).powf(0.5);
    assert!(
        (tag.predicted_cost - expected).abs() < 1e-15,
        "{tag:?} vs {expected}"
    );
    // That pick counted locally: 6 used. Four more exhaust it.
    for seed in 0..4 {
        let (order, _) = select(&mut rw, seed, 30 + seed, &[0, 1]);
        assert_eq!(order[0], 1);
    }
    let (order, _) = select(&mut rw, 9, 40, &[0, 1]);
    assert_eq!(order, vec![0, 1]);
    let s = status(&rw);
    assert_eq!(
        s["last_decision"]["candidates"][1]["excluded"],
        "quota_exhausted"
    );
    assert_eq!(s["quota"]["m:m:ep1"]["used_estimate"], 10);
    assert_eq!(s["quota"]["m:m:ep1"]["remaining"], 0);
    Ok(())
}

#[test]
fn envelope_samples_fall_back_to_the_reference_price_and_fix_lower() -> Result<(), String> {
    // Only a quota route: samples are reference price × tokens; all equal → L ≥ U → L = U·1e-3.
    let mut rw = router(
        r#"{"envelope_min_samples": 3, "reference_api_price": 2.0}"#,
        &[route(0, None, &quota_meta(100, Some((0, 0))))],
    )?;
    for i in 0..3 {
        rw.observe(&observation(0, true, 500.0, i, ""));
    }
    select(&mut rw, 1, 10, &[0]);
    let s = status(&rw);
    let upper = 2.0 * 1_100.0 / 1e6;
    assert_eq!(s["envelope"]["calibrated"], true);
    assert!((s["envelope"]["upper"].as_f64().unwrap_or(0.0) - upper).abs() < 1e-15);
    assert!((s["envelope"]["lower"].as_f64().unwrap_or(0.0) - upper * 1e-3).abs() < 1e-18);
    assert_eq!(s["envelope"]["lower_fixed"], true);
    assert_eq!(s["last_decision"]["lp_status"], "single_provider");
    Ok(())
}

#[test]
fn removed_params_are_rejected_naming_the_replacement() {
    for (json, replacement) in [
        (r#"{"daily_quota": 500}"#, "route[].quota.limit"),
        (r#"{"concurrency_limit": 2}"#, "route[].concurrency.limit"),
    ] {
        let error = parse_params(json)
            .and_then(|p| RouteWise::create(M, p))
            .err()
            .unwrap_or_default();
        assert!(error.contains(replacement), "{error}");
    }
}

#[test]
fn deterministic_for_equal_inputs_and_seed() -> Result<(), String> {
    let run = |params: &str| -> Result<Vec<(Vec<u32>, String)>, String> {
        let mut rw = two_route_router(params)?;
        let mut out = Vec::new();
        for seed in 0..200 {
            let d = rw.select(&request(seed, 100 + seed, 900), &candidates(&[1, 0]))?;
            out.push((d.order, d.strategy_metadata));
        }
        Ok(out)
    };
    assert_eq!(
        run(r#"{"budget_alpha": 0.5}"#)?,
        run(r#"{"budget_alpha": 0.5}"#)?
    );
    // random_seed changes the draws, deterministically.
    let xored = run(r#"{"budget_alpha": 0.5, "random_seed": 12345}"#)?;
    assert_eq!(
        xored,
        run(r#"{"budget_alpha": 0.5, "random_seed": 12345}"#)?
    );
    assert_ne!(xored, run(r#"{"budget_alpha": 0.5}"#)?);
    Ok(())
}

#[test]
fn tags_round_trip_and_reject_foreign_text() {
    let tag = DecisionTag {
        epoch: 0xdead_beef,
        seq: 42,
        primary: 3,
        predicted_cost: 3.5e-4,
        explore: true,
        slot: true,
    };
    assert_eq!(tag.encode(), "rw1:deadbeef-42:3:0.00035:ec");
    assert_eq!(DecisionTag::parse(&tag.encode()), Some(tag.clone()));
    // Tags written before the cost was written as JSON writes it still read the same.
    assert_eq!(DecisionTag::parse("rw1:deadbeef-42:3:3.5e-4:ec"), Some(tag));
    // The hand-written encoding writes the integers as `format!` does, at every width, and a cost
    // that reads back as the same number.
    for (epoch, seq, primary, cost) in [
        (0, 0, 0, 0.0),
        (1, 9, 10, 1.0),
        (0x0abc_0def, 1_000_000, u32::MAX, 12.5e-9),
        (7, 3, 1, 0.1 * 9e-6 + 0.4 * 16e-6),
        (u32::MAX, u64::MAX, 7, f64::MAX),
        (2, 5, 0, f64::MIN_POSITIVE),
    ] {
        let tag = DecisionTag {
            epoch,
            seq,
            primary,
            predicted_cost: cost,
            explore: false,
            slot: seq % 2 == 1,
        };
        let flags = if tag.slot { "c" } else { "-" };
        let text = tag.encode();
        let (head, cost_text) = text
            .strip_suffix(&format!(":{flags}"))
            .and_then(|t| t.rsplit_once(':'))
            .expect("four fields");
        assert_eq!(head, format!("rw1:{epoch:08x}-{seq}:{primary}"));
        assert_eq!(cost_text.parse::<f64>(), Ok(cost), "{text}");
        assert!(cost_text.len() <= format!("{cost:e}").len() + 2, "{text}");
        assert_eq!(DecisionTag::parse(&text), Some(tag));
        assert_eq!(
            DecisionTag::parse(&format!("{text};hedge=2475@1")),
            DecisionTag::parse(&text)
        );
    }
    for text in [
        "",
        "rw1",
        "rw1:",
        "rw1:00000001-1:0:0e0",
        "rw2:00000001-1:0:0e0:-",
        "rw1:zz-1:0:0e0:-",
        "rw1:1-1:0:0e0:-:x",
        "rw1:1-1:0:0e0:-:x:y",
        "rw1:11:0:0e0:-",
        ":rw1:1-1:0:0e0:-",
        "rw1:00000001:1:0:0e0:-",
        "rw1:00000001-1:0:0e0;:-",
        "rw1:00000001-1-2:0:0e0:-",
        "rw1:00000001-1:0:zz:-",
        "rw1:00000001-1:0::-",
        "rw1:100000000-1:0:0e0:-",
        "rw1:00000001-18446744073709551616:0:0e0:-",
        "rw1:00000001-1:4294967296:0e0:-",
    ] {
        assert_eq!(DecisionTag::parse(text), None, "{text}");
        // What `observe` reads refuses the same texts.
        assert_eq!(TagKey::parse(text), None, "{text}");
    }
}

#[test]
fn status_shape() -> Result<(), String> {
    let mut rw = two_route_router("{}")?;
    select(&mut rw, 1, 1, &[0, 1]);
    let s = status(&rw);
    for key in [
        "strategy",
        "model",
        "budget_alpha",
        "last_decision",
        "envelope",
        "latency",
        "quota",
        "concurrency",
        "output",
        "routes",
        "host_side",
        "counters",
    ] {
        assert!(!s[key].is_null(), "{key} missing");
    }
    assert_eq!(s["strategy"], "routewise");
    assert_eq!(s["fallback_mode"], "policy");
    Ok(())
}

/// Random route tables, candidate subsets, observations and params: every decision is a valid
/// order (a permutation of the candidates in policy mode, one of them in strict mode), the
/// mixture is a distribution with at most two routes within budget, the primary has mass unless
/// it was explored or nothing was feasible.
#[test]
fn property_random_routers() -> Result<(), String> {
    let mut rng = Rng::new(0xfeed);
    for case in 0..300 {
        let n = 1 + rng.below(6) as u32;
        let routes: Vec<Upstream> = (0..n)
            .map(|i| match rng.below(5) {
                0 => route(i, None, "{}"),
                1 => route(i, None, CONCURRENCY),
                2 => route(
                    i,
                    None,
                    &quota_meta(5 + rng.below(5), Some((rng.below(6), 0))),
                ),
                _ => route(
                    i,
                    Some((rng.next_f64() * 10.0, rng.next_f64() * 30.0)),
                    "{}",
                ),
            })
            .collect();
        let strict = rng.below(4) == 0;
        let params = format!(
            r#"{{"budget_alpha": {}, "envelope_min_samples": 3, "fallback_mode": "{}"}}"#,
            rng.next_f64(),
            if strict { "strict" } else { "policy" }
        );
        let mut rw = router(&params, &routes)?;
        let mut now = 0;
        for step in 0..30 {
            now += rng.below(120_000);
            let mut indexes: Vec<u32> = (0..n).filter(|_| rng.below(4) != 0).collect();
            if indexes.is_empty() {
                indexes.push(rng.below(u64::from(n)) as u32);
            }
            // Half the callers have a budget, from overdrawn to plenty (costs here are ≤ ~0.1).
            let remaining = match rng.below(4) {
                0 => Some(rng.next_f64() * 0.2 - 0.02),
                1 => Some(rng.next_f64() * 1e-3),
                _ => None,
            };
            let d = rw.select(
                &Request {
                    max_tokens: (rng.below(2) == 0).then(|| rng.below(2_000) as u32),
                    remaining_budget_usd: remaining,
                    ..request(rng.next_u64(), now, rng.below(20_000) as u32)
                },
                &candidates(&indexes),
            )?;
            let mut sorted = d.order.clone();
            sorted.sort_unstable();
            if strict {
                assert_eq!(d.order.len(), 1, "case {case} step {step}");
                assert!(indexes.contains(&d.order[0]));
            } else {
                assert_eq!(sorted, indexes, "case {case} step {step}");
            }
            let s = status(&rw);
            let last = &s["last_decision"];
            let weights: Vec<f64> = last["candidates"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .filter_map(|c| c["weight"].as_f64())
                .collect();
            if !weights.is_empty() {
                let sum: f64 = weights.iter().sum();
                assert!(
                    (sum - 1.0).abs() < 1e-9,
                    "case {case} step {step}: {weights:?}"
                );
                assert!(weights.iter().filter(|w| **w > 0.0).count() <= 2);
                let expected = last["expected_cost"].as_f64().unwrap_or(f64::NAN);
                let budget = last["budget"].as_f64().unwrap_or(f64::NAN);
                assert!(expected <= budget + 1e-9, "case {case} step {step}");
                let primary = last["primary"].as_u64();
                let explored = !last["explored"].is_null();
                // A route the caller cannot afford is the primary only when no feasible one is
                // affordable.
                if let Some(r) = remaining {
                    let feasible: Vec<Value> = last["candidates"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|c| c["excluded"].is_null())
                        .collect();
                    let cost = |c: &Value| c["cost"].as_f64().unwrap_or(f64::NAN);
                    if let Some(p) = feasible.iter().find(|c| c["index"].as_u64() == primary)
                        && cost(p) > r
                    {
                        assert!(
                            feasible.iter().all(|c| cost(c) > r),
                            "case {case} step {step}: {last}"
                        );
                    }
                }
                let primary_weight = last["candidates"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .iter()
                    .find(|c| c["index"].as_u64() == primary)
                    .and_then(|c| c["weight"].as_f64())
                    .unwrap_or(0.0);
                // An exploration draw that did not explore went to the cheapest route instead.
                let declined = !explored && !last["exploration_probability"].is_null();
                if declined {
                    let cheapest = last["candidates"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|c| c["weight"].is_number())
                        .map(|c| c["cost"].as_f64().unwrap_or(f64::NAN))
                        .fold(f64::INFINITY, f64::min);
                    let primary_cost = last["candidates"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                        .iter()
                        .find(|c| c["index"].as_u64() == primary)
                        .and_then(|c| c["cost"].as_f64());
                    assert_eq!(
                        primary_cost,
                        Some(cheapest),
                        "case {case} step {step}: {last}"
                    );
                }
                assert!(
                    explored || declined || primary_weight > 0.0,
                    "case {case} step {step}"
                );
            }
            // Observe the primary (sometimes lost, sometimes failed).
            if rng.below(5) != 0 {
                let success = rng.below(4) != 0;
                let ttft = 100.0 + rng.next_f64() * 8_000.0;
                rw.observe(&observation(
                    d.order[0],
                    success,
                    ttft,
                    now + ttft as u64,
                    &d.strategy_metadata,
                ));
            }
            if rng.below(3) == 0 {
                rw.tick(now);
            }
        }
    }
    Ok(())
}

/// Hedging: a cheap primary with a heavy tail and a fast backup. The plan names the latest
/// checkpoint at which the backup still meets the SLO with probability ≥ 0.99.
#[test]
fn hedge_plan_picks_the_latest_checkpoint_a_backup_can_still_meet() -> Result<(), String> {
    let routes = [
        route(0, Some((0.1, 0.1)), "{}"),
        route(1, Some((10.0, 10.0)), "{}"),
    ];
    let params = r#"{"budget_alpha": 0.0, "latency_hedge_mode": "probability_target", "latency_slo_sec": 3}"#;
    let mut rw = router(params, &routes)?;
    // Route 1 answers in 500 ms, always; route 0 in 1 s.
    for i in 0..30 {
        rw.observe(&observation(1, true, 500.0, 1_000 + i, ""));
        rw.observe(&observation(0, true, 1_000.0, 1_000 + i, ""));
    }
    let decision = rw.select(&request(7, 2_000, 1_000), &candidates(&[0, 1]))?;
    assert_eq!(
        decision.order[0], 0,
        "α = 0: the cheap route is the primary"
    );
    // 3000 ms × 0.825 = 2475: 525 ms left, the last checkpoint where 500 ms still fits.
    assert_eq!(
        decision.hedge,
        Some(HedgeRequest {
            after_ms: 2475,
            backup: 1
        }),
        "{}",
        decision.strategy_metadata
    );
    // The hedge is typed (WIT 0.2.0): the metadata is the tag alone.
    assert!(!decision.strategy_metadata.contains("hedge"));
    let tag = DecisionTag::parse(&decision.strategy_metadata).ok_or("tag")?;
    assert!(!tag.explore);
    // A 0.1.0 build's suffix does not confuse the tag either.
    let legacy = format!("{};hedge=2475@1", decision.strategy_metadata);
    assert_eq!(DecisionTag::parse(&legacy), Some(tag));

    // Without enough samples of the backup, or with hedging off, no hedge.
    let mut cold = router(params, &routes)?;
    for i in 0..30 {
        cold.observe(&observation(0, true, 1_000.0, 1_000 + i, ""));
    }
    for i in 0..4 {
        cold.observe(&observation(1, true, 500.0, 1_000 + i, ""));
    }
    let decision = cold.select(&request(7, 2_000, 1_000), &candidates(&[0, 1]))?;
    assert_eq!(decision.hedge, None);
    assert!(!decision.strategy_metadata.contains("hedge"));
    let mut off = router(r#"{"budget_alpha": 0.0}"#, &routes)?;
    for i in 0..30 {
        off.observe(&observation(1, true, 500.0, 1_000 + i, ""));
        off.observe(&observation(0, true, 1_000.0, 1_000 + i, ""));
    }
    let decision = off.select(&request(7, 2_000, 1_000), &candidates(&[0, 1]))?;
    assert_eq!(decision.hedge, None);
    assert!(!decision.strategy_metadata.contains("hedge"));
    Ok(())
}

#[test]
fn affinity_is_a_tie_break_within_the_plan_only() -> Result<(), String> {
    let pinned_to = |index: u32| -> Vec<Candidate> {
        let mut c = candidates(&[0, 1]);
        c[index as usize].affinity_pinned = true;
        c
    };
    // budget_alpha 1: the plan puts everything on the fast route (1); a caller pinned to the slow
    // one (0) is moved.
    let mut rw = two_route_router(r#"{"budget_alpha": 1.0}"#)?;
    for seed in 0..200 {
        let order = rw.select(&request(seed, 1, 1_000), &pinned_to(0))?.order;
        assert_eq!(order[0], 1, "seed {seed}: {order:?}");
    }
    assert_eq!(status(&rw)["counters"]["affinity_kept"], 0);
    // budget_alpha 0.5: both routes are in the mixture, so the pin decides, every time.
    let mut rw = two_route_router(r#"{"budget_alpha": 0.5}"#)?;
    for seed in 0..200 {
        for pinned in [0, 1] {
            let order = rw
                .select(&request(seed, 1, 1_000), &pinned_to(pinned))?
                .order;
            assert_eq!(order[0], pinned, "seed {seed}: {order:?}");
        }
    }
    assert_eq!(status(&rw)["counters"]["affinity_kept"], 400);
    Ok(())
}

/// One decision over routes 0 and 1 of [`two_route_router`] for a caller with `remaining` USD.
fn select_with_budget(rw: &mut RouteWise, seed: u64, remaining: Option<f64>) -> Vec<u32> {
    let request = Request {
        remaining_budget_usd: remaining,
        ..request(seed, 1, 1_000)
    };
    rw.select(&request, &candidates(&[0, 1]))
        .expect("select")
        .order
}

/// Orders of 2 000 seeded decisions, and the share of them whose primary is the cheap route 0.
fn budget_run(params: &str, remaining: Option<f64>) -> Result<(Vec<Vec<u32>>, f64, Value), String> {
    let mut rw = two_route_router(params)?;
    let orders: Vec<Vec<u32>> = (0..2_000)
        .map(|seed| select_with_budget(&mut rw, seed, remaining))
        .collect();
    let cheap = orders.iter().filter(|o| o[0] == 0).count() as f64 / 2_000.0;
    Ok((orders, cheap, status(&rw)))
}

fn close(value: &Value, expected: f64) -> bool {
    value.as_f64().is_some_and(|v| (v - expected).abs() < 1e-9)
}

// Budget pressure on the two routes (cost 1 at 10 s, cost 3 at 1 s) at α 0.5: B = 2, and with the
// default N = 20 the remaining budget starts to matter below N · B = 40 USD.

#[test]
fn budget_pressure_leaves_callers_without_or_with_plenty_of_budget_alone() -> Result<(), String> {
    let params = r#"{"budget_alpha": 0.5}"#;
    let (unbudgeted, cheap, s) = budget_run(params, None)?;
    assert!((cheap - 0.5).abs() < 0.04, "{cheap}");
    assert_eq!(s["counters"]["budget_pressured"], 0);
    assert!(close(&s["last_decision"]["alpha"], 0.5));
    assert!(s["last_decision"]["remaining_budget_usd"].is_null());
    // Disabled: the same decisions whatever the caller has left.
    let (disabled, _, s) = budget_run(
        r#"{"budget_alpha": 0.5, "budget_pressure_requests": 0}"#,
        Some(0.5),
    )?;
    assert_eq!(disabled, unbudgeted);
    assert_eq!(s["counters"]["budget_pressured"], 0);
    assert_eq!(s["last_decision"]["remaining_budget_usd"], 0.5);
    // Plenty left: a million USD, and exactly N · B.
    for remaining in [1e6, 40.0, f64::INFINITY] {
        let (orders, _, s) = budget_run(params, Some(remaining))?;
        assert_eq!(orders, unbudgeted, "{remaining}");
        assert_eq!(s["counters"]["budget_pressured"], 0, "{remaining}");
        assert!(close(&s["last_decision"]["alpha"], 0.5), "{remaining}");
    }
    Ok(())
}

#[test]
fn budget_pressure_slides_alpha_with_the_remaining_budget() -> Result<(), String> {
    // 4 USD left is 10 % of N · B: α' = 0.05, B' = 1 + 0.05 · 2 = 1.1, so π_fast = 0.05.
    let (_, cheap, s) = budget_run(r#"{"budget_alpha": 0.5}"#, Some(4.0))?;
    let last = &s["last_decision"];
    assert!(close(&last["alpha"], 0.05), "{last}");
    assert!(close(&last["budget"], 1.1), "{last}");
    assert!(close(&last["mixture"]["m:ep0"], 0.95), "{last}");
    assert_eq!(last["remaining_budget_usd"], 4.0);
    assert_eq!(last["above_remaining_budget"], serde_json::json!([]));
    assert!((cheap - 0.95).abs() < 0.02, "{cheap}");
    assert_eq!(s["counters"]["budget_pressured"], 2_000);
    assert_eq!(s["budget_alpha"], 0.5);
    assert_eq!(s["budget_pressure_requests"], 20);
    // A larger N starts earlier: at N = 100, 4 USD is 2 % of N · B.
    let (_, _, s) = budget_run(
        r#"{"budget_alpha": 0.5, "budget_pressure_requests": 100}"#,
        Some(4.0),
    )?;
    assert!(close(&s["last_decision"]["alpha"], 0.01));
    Ok(())
}

#[test]
fn budget_pressure_spent_or_overdrawn_goes_to_the_cheapest() -> Result<(), String> {
    for remaining in [0.0, -0.25, -50.0] {
        let (orders, cheap, s) = budget_run(r#"{"budget_alpha": 1.0}"#, Some(remaining))?;
        assert_eq!(cheap, 1.0, "{remaining}");
        assert!(orders.iter().all(|o| *o == vec![0, 1]), "{remaining}");
        assert!(close(&s["last_decision"]["alpha"], 0.0), "{remaining}");
        assert_eq!(s["last_decision"]["lp_status"], "optimal");
        assert_eq!(s["counters"]["budget_pressured"], 2_000);
    }
    Ok(())
}

#[test]
fn routes_dearer_than_the_remaining_budget_are_never_the_primary() -> Result<(), String> {
    // 2 USD left: the fast route (3 USD) is left out of the plan, and stays a fallback.
    let (orders, cheap, s) = budget_run(r#"{"budget_alpha": 1.0}"#, Some(2.0))?;
    assert_eq!(cheap, 1.0);
    assert!(orders.iter().all(|o| *o == vec![0, 1]));
    let last = &s["last_decision"];
    assert_eq!(last["above_remaining_budget"], serde_json::json!(["m:ep1"]));
    assert_eq!(last["lp_status"], "single_provider");
    // Less than the cheapest route costs: nothing is affordable, so nothing is left out, and the
    // plan is α' = 1 · 0.5 / (20 · 3) of the way from the cheapest.
    let (_, cheap, s) = budget_run(r#"{"budget_alpha": 1.0}"#, Some(0.5))?;
    assert!(cheap > 0.98, "{cheap}");
    assert_eq!(
        s["last_decision"]["above_remaining_budget"],
        serde_json::json!([])
    );
    assert!(close(&s["last_decision"]["alpha"], 0.5 / 60.0));
    // An unmeasured route the caller cannot afford is not explored either.
    let mut rw = router(
        r#"{"budget_alpha": 1.0}"#,
        &[
            route(0, Some((1_000.0, 0.0)), "{}"),
            route(1, Some((3_000.0, 0.0)), "{}"),
        ],
    )?;
    rw.observe(&observation(0, true, 10_000.0, 0, ""));
    assert_eq!(select_with_budget(&mut rw, 1, Some(2.0))[0], 0);
    assert_eq!(status(&rw)["counters"]["explorations"], 0);
    assert_eq!(select_with_budget(&mut rw, 1, None)[0], 1);
    assert_eq!(status(&rw)["counters"]["explorations"], 1);
    Ok(())
}

/// A failed attempt with the given HTTP status (0: transport error or timeout).
fn failed(index: u32, status: u16, now_ms: u64) -> Observation {
    Observation {
        status,
        ttft_ms: None,
        ..observation(index, false, 0.0, now_ms, "")
    }
}

/// Cheap primary (ep0) and dear backup (ep1) at α = 0 with hedging on, SLO 3 s, after the given
/// TTFT samples of each.
fn hedge_router(primary: &[f64], backup: &[f64]) -> Result<RouteWise, String> {
    let mut rw = router(
        r#"{"budget_alpha": 0.0, "latency_hedge_mode": "probability_target", "latency_slo_sec": 3}"#,
        &[
            route(0, Some((0.1, 0.1)), "{}"),
            route(1, Some((10.0, 10.0)), "{}"),
        ],
    )?;
    for (index, samples) in [(0, primary), (1, backup)] {
        for (i, &ms) in samples.iter().enumerate() {
            // A failure every tenth sample at most: never three in a row, so never benched.
            let now = 1_000 + i as u64;
            if ms.is_nan() {
                rw.observe(&failed(index, 500, now));
            } else {
                rw.observe(&observation(index, true, ms, now, ""));
            }
        }
    }
    Ok(rw)
}

fn hedge_of(rw: &mut RouteWise) -> Result<Option<HedgeRequest>, String> {
    let decision = rw.select(&request(7, 2_000, 1_000), &candidates(&[0, 1]))?;
    assert_eq!(
        decision.order[0], 0,
        "α = 0: the cheap route is the primary"
    );
    Ok(decision.hedge)
}

/// The reference's rule conditions on the primary not having answered yet: a backup that alone
/// meets the SLO only 90 % of the time is still worth sending while the primary, silent so far,
/// would probably answer in time by itself.
#[test]
fn hedge_conditions_on_the_primary_not_having_answered_yet() -> Result<(), String> {
    // Primary: half at 0.5 s, 49 % at 2 s, 1 % at 10 s. Backup: 90 % at 0.4 s, 10 % failures.
    let mut primary = vec![500.0; 50];
    primary.extend([2_000.0; 49]);
    primary.push(10_000.0);
    let backup: Vec<f64> = (0..100)
        .map(|i| if i % 10 == 9 { f64::NAN } else { 400.0 })
        .collect();
    let mut rw = hedge_router(&primary, &backup)?;
    // Until 2 s a silent primary still answers in time with 0.49 / 0.5 = 98 %, and the backup
    // covers 90 % of the remaining 2 %: 99.8 %. From 2.025 s on it is the backup alone (90 %).
    // The latest checkpoint that meets 99 % is 65 % of the SLO. Requiring the backup alone to
    // reach 99 % (the rule before) planned no hedge here.
    assert_eq!(
        hedge_of(&mut rw)?,
        Some(HedgeRequest {
            after_ms: 1_950,
            backup: 1
        })
    );
    assert_eq!(status(&rw)["counters"]["hedges_planned"], 1);
    Ok(())
}

/// The backup has the time left to the SLO minus the 5 ms dispatch overhead.
#[test]
fn hedge_subtracts_the_dispatch_overhead() -> Result<(), String> {
    // Primary always 1 s: by any checkpoint past it, the backup alone decides. Backup 523 ms:
    // at 2 475 ms 525 ms are left but only 520 after the overhead; at 2 400 ms, 595.
    let mut rw = hedge_router(&[1_000.0; 30], &[523.0; 30])?;
    assert_eq!(
        hedge_of(&mut rw)?,
        Some(HedgeRequest {
            after_ms: 2_400,
            backup: 1
        })
    );
    let mut rw = hedge_router(&[1_000.0; 30], &[518.0; 30])?;
    assert_eq!(
        hedge_of(&mut rw)?,
        Some(HedgeRequest {
            after_ms: 2_475,
            backup: 1
        })
    );
    Ok(())
}

/// Five samples of each side are enough (the reference's 5); four of either are not.
#[test]
fn hedge_needs_five_samples_of_the_primary_and_the_backup() -> Result<(), String> {
    let planned = Some(HedgeRequest {
        after_ms: 2_475,
        backup: 1,
    });
    assert_eq!(
        hedge_of(&mut hedge_router(&[1_000.0; 5], &[500.0; 5])?)?,
        planned
    );
    assert_eq!(
        hedge_of(&mut hedge_router(&[1_000.0; 4], &[500.0; 30])?)?,
        None
    );
    assert_eq!(
        hedge_of(&mut hedge_router(&[1_000.0; 30], &[500.0; 4])?)?,
        None
    );
    Ok(())
}

/// Costs 1, 2, 3 (× 10⁻³ USD); ep0 and, when `profile_ep1`, ep1 have samples.
fn exploration_router(alpha: f64, profile_ep1: bool) -> Result<RouteWise, String> {
    let mut rw = router(
        &format!(r#"{{"budget_alpha": {alpha}}}"#),
        &[
            route(0, Some((1.0, 0.0)), "{}"),
            route(1, Some((2.0, 0.0)), "{}"),
            route(2, Some((3.0, 0.0)), "{}"),
        ],
    )?;
    rw.observe(&observation(0, true, 2_000.0, 0, ""));
    if profile_ep1 {
        rw.observe(&observation(1, true, 1_000.0, 0, ""));
    }
    Ok(rw)
}

/// At α = 0 the budget is the cheapest route's cost, so a dearer untested route is never explored
/// (the reference's rule); the probes are what measure it.
#[test]
fn alpha_zero_does_not_explore_a_dearer_route() -> Result<(), String> {
    let mut rw = exploration_router(0.0, false)?;
    for seed in 0..200 {
        let (order, tag) = select(&mut rw, seed, 10, &[0, 1, 2]);
        assert!(!tag.explore, "seed {seed}");
        assert_eq!(order[0], 0, "seed {seed}");
    }
    let s = status(&rw);
    assert_eq!(s["counters"]["explorations"], 0);
    assert_eq!(s["last_decision"]["exploration_probability"], Value::Null);
    // An untested route as cheap as the cheapest fits the budget and is explored.
    let mut rw = router(
        r#"{"budget_alpha": 0.0}"#,
        &[
            route(0, Some((1.0, 0.0)), "{}"),
            route(1, Some((1.0, 0.0)), "{}"),
        ],
    )?;
    rw.observe(&observation(0, true, 2_000.0, 0, ""));
    let (order, tag) = select(&mut rw, 1, 10, &[0, 1]);
    assert!(tag.explore);
    assert_eq!(order[0], 1);
    Ok(())
}

/// Between the bounds the target is explored with the probability that keeps the expected cost at
/// the budget, and the other draws go to the cheapest route.
#[test]
fn exploration_probability_keeps_the_expected_cost_within_budget() -> Result<(), String> {
    // α = 0.5: B = 2; the untested ep2 costs 3: q = (2 − 1) / (3 − 1) = 0.5.
    let mut explored = 0;
    for seed in 0..1_000 {
        let mut rw = exploration_router(0.5, true)?;
        let (order, tag) = select(&mut rw, seed, 10, &[0, 1, 2]);
        if tag.explore {
            explored += 1;
            assert_eq!(order[0], 2);
        } else {
            assert_eq!(
                order[0], 0,
                "seed {seed}: declined draws go to the cheapest"
            );
        }
        let q = status(&rw)["last_decision"]["exploration_probability"]
            .as_f64()
            .unwrap_or(f64::NAN);
        assert!((q - 0.5).abs() < 1e-9, "{q}");
    }
    assert!((400..=600).contains(&explored), "{explored}");
    assert_eq!(crate::exploration_probability(3.0, 1.0, 2.0), 0.5);
    assert_eq!(crate::exploration_probability(2.0, 1.0, 2.0), 1.0);
    assert_eq!(crate::exploration_probability(3.0, 1.0, 1.0), 0.0);
    // α = 1: every untested route fits the budget and is explored with probability 1.
    let mut rw = exploration_router(1.0, true)?;
    let (order, tag) = select(&mut rw, 3, 10, &[0, 1, 2]);
    assert!(tag.explore);
    assert_eq!(order[0], 2);
    Ok(())
}

/// Only server-side failures (transport, 408, 429, 5xx) are the endpoint's fault: they cost the
/// 60 s penalty, and three in a row bench it for 30 s; a 4xx about the request teaches nothing.
#[test]
fn request_failures_teach_nothing_and_three_server_failures_bench_for_thirty_seconds()
-> Result<(), String> {
    let mut rw = router(
        r#"{"budget_alpha": 0.0}"#,
        &[
            route(0, Some((1.0, 0.0)), "{}"),
            route(1, Some((5.0, 0.0)), "{}"),
        ],
    )?;
    rw.observe(&observation(0, true, 500.0, 0, ""));
    rw.observe(&observation(1, true, 500.0, 0, ""));
    for (i, status_code) in [400, 401, 403, 404, 413, 422].into_iter().enumerate() {
        rw.observe(&failed(0, status_code, 10 + i as u64));
    }
    let s = status(&rw);
    assert_eq!(s["latency"]["m:ep0"]["samples"], 1);
    assert_eq!(s["latency"]["m:ep0"]["failure_streak"], 0);
    assert_eq!(s["counters"]["request_failures"], 6);
    assert_eq!(select(&mut rw, 1, 20, &[0, 1]).0[0], 0);

    // A 429, a timeout (0) and a 503: each a 60 s sample; the third benches ep0 for 30 s.
    for (i, status_code) in [429, 0, 503].into_iter().enumerate() {
        assert_eq!(select(&mut rw, 2, 100, &[0, 1]).0[0], 0, "not benched yet");
        rw.observe(&failed(0, status_code, 100 + i as u64));
    }
    let s = status(&rw);
    assert_eq!(s["latency"]["m:ep0"]["samples"], 4);
    assert_eq!(s["latency"]["m:ep0"]["failure_streak"], 3);
    assert_eq!(s["latency"]["m:ep0"]["cooldown_until_ms"], 102 + 30_000);
    assert_eq!(s["counters"]["cooldowns"], 1);
    let (order, _) = select(&mut rw, 3, 200, &[0, 1]);
    assert_eq!(order, vec![1, 0], "benched: last resort only");
    let excluded = &status(&rw)["last_decision"]["candidates"][1];
    assert_eq!(excluded["excluded"], "cooldown");
    assert_eq!(select(&mut rw, 4, 102 + 29_999, &[0, 1]).0[0], 1);
    // 30 s later it is back (at α = 0 the cheapest is the plan).
    assert_eq!(select(&mut rw, 5, 102 + 30_000, &[0, 1]).0[0], 0);
    // The streak is still 3: one more failure benches it again at once; a success ends it.
    rw.observe(&failed(0, 502, 40_000));
    assert_eq!(select(&mut rw, 6, 40_001, &[0, 1]).0[0], 1);
    rw.observe(&observation(0, true, 500.0, 40_002, ""));
    assert_eq!(select(&mut rw, 7, 40_003, &[0, 1]).0[0], 0);
    let s = status(&rw);
    assert_eq!(s["latency"]["m:ep0"]["failure_streak"], 0);
    assert_eq!(s["latency"]["m:ep0"]["cooldown_until_ms"], Value::Null);
    assert_eq!(s["counters"]["cooldowns"], 2);
    // A failure after a success status (a broken stream) is the endpoint's too.
    assert!(crate::server_side_failure(200));
    assert!(crate::server_side_failure(408));
    assert!(!crate::server_side_failure(409));
    Ok(())
}

/// When every feasible route is being explored they stay in the plan (the reference refuses):
/// a cold concurrency-only model keeps counting its slots.
#[test]
fn routes_being_explored_stay_when_nothing_else_is_feasible() -> Result<(), String> {
    let mut rw = router(r#"{"budget_alpha": 1.0}"#, &[route(0, None, CONCURRENCY_2)])?;
    let (order, tag) = select(&mut rw, 1, 10, &[0]);
    assert!(tag.explore && tag.slot);
    assert_eq!(order, vec![0]);
    let (order, tag) = select(&mut rw, 2, 11, &[0]);
    assert!(!tag.explore && tag.slot, "in the plan, with a slot");
    assert_eq!(order, vec![0]);
    assert_eq!(status(&rw)["last_decision"]["lp_status"], "single_provider");
    // Both slots held: full.
    select(&mut rw, 3, 12, &[0]);
    let last = &status(&rw)["last_decision"];
    assert_eq!(
        last["candidates"][0]["excluded"], "concurrency_full",
        "{last}"
    );
    Ok(())
}

const CONCURRENCY_2: &str = r#"{"provider_type": "concurrency", "concurrency": {"limit": 2}}"#;
