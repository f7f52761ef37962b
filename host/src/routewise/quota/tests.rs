#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use chrono::NaiveDate;

use super::fetch::{self, Provider, UsageRecord};
use super::guard::{declared_processes, replica_guard};
use super::plan::{QuotaPlan, Resolution, Unresolved};
use super::{Clock, FetchError, FetchTarget, LocalCounter, QuotaBoard, QuotaSnapshot};
use crate::config::{Config, ModelConfig};

fn models(yaml: &str) -> Vec<ModelConfig> {
    Config::from_yaml(Path::new("t.yaml"), yaml, &|_| None)
        .unwrap()
        .models
}

fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
    move |name| {
        pairs
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| (*v).to_owned())
    }
}

/// A quota route at `base_url` with extra metadata (YAML flow mapping entries).
fn quota_route(base_url: &str, metadata: &str) -> String {
    let extra = if metadata.is_empty() {
        String::new()
    } else {
        format!(", {metadata}")
    };
    format!(
        "      - kind: openai_compat\n        base_url: {base_url}\n        api_key: route-key\n        metadata: {{provider_type: quota, quota: {{limit: 100}}{extra}}}\n"
    )
}

fn model(id: &str, routes: &[String]) -> String {
    format!(
        "  - id: {id}\n    router: routewise\n    router_params: {{quota_snapshot_refresh_interval_sec: 5}}\n    route:\n{}",
        routes.concat()
    )
}

const CHUTES: &str =
    "quota_source: {provider: chutes, usage_label: Daily requests, unit: requests}";

fn reason_of(plan: &QuotaPlan, endpoint: &str) -> Option<Unresolved> {
    match &plan.pool_of(endpoint)?.resolution {
        Resolution::Unresolved(r) => Some(r.clone()),
        _ => None,
    }
}

#[test]
fn selectors_resolve_only_to_what_a_fetcher_emits() {
    let yaml = format!(
        "models:\n{}",
        model(
            "m",
            &[
                quota_route("http://127.0.0.1:9001/v1", CHUTES),
                quota_route(
                    "http://127.0.0.1:9002/v1",
                    "quota_source: {provider: chutes, usage_label: Daily request, unit: requests}"
                ),
                quota_route(
                    "http://127.0.0.1:9003/v1",
                    "quota_source: {provider: local, usage_label: Daily requests, unit: requests}"
                ),
                quota_route(
                    "http://127.0.0.1:9004/v1",
                    "quota_source: {provider: minimax, usage_label: \"5-hour requests: MiniMax-M*\", unit: requests}"
                ),
                quota_route("http://127.0.0.1:9005/v1", ""),
                quota_route(
                    "http://127.0.0.1:9006/v1",
                    "quota_source: {provider: chutes, label: Daily requests}"
                ),
                quota_route(
                    "http://127.0.0.1:9007/v1",
                    "quota_source: {provider: chutes, usage_label: Daily requests, unit: tokens}"
                ),
            ]
        )
    );
    let models = models(&yaml);
    let plan = QuotaPlan::build(&models, &env_of(&[("CHUTES_API_KEY", "env-key")]));
    match &plan.pool_of("m:local-9001").unwrap().resolution {
        Resolution::Fetch { selector, target } => {
            assert_eq!(selector.usage_label, "Daily requests");
            assert_eq!(target.provider, Provider::Chutes);
            assert_eq!(target.key, "env-key");
            assert_eq!(target.key_from, "env CHUTES_API_KEY");
            assert_eq!(target.base, "https://api.chutes.ai");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        reason_of(&plan, "m:local-9002"),
        Some(Unresolved::UnknownLabel { .. })
    ));
    let local = reason_of(&plan, "m:local-9003").unwrap();
    assert_eq!(local.kind(), "unknown_provider");
    assert!(
        local.to_string().contains("local_quota_fallback: true"),
        "{local}"
    );
    // A MiniMax label is well formed, but no key is known for it.
    assert_eq!(
        reason_of(&plan, "m:local-9004"),
        Some(Unresolved::NoKey {
            provider: Provider::Minimax
        })
    );
    assert_eq!(reason_of(&plan, "m:local-9005"), Some(Unresolved::NoSource));
    assert_eq!(
        reason_of(&plan, "m:local-9006").map(|r| r.kind()),
        Some("malformed_selector")
    );
    assert_eq!(
        reason_of(&plan, "m:local-9007").map(|r| r.kind()),
        Some("unknown_label")
    );
    let diagnostics = plan.diagnostics();
    assert_eq!(diagnostics.len(), 6);
    let text = diagnostics[0].to_string();
    assert!(
        text.starts_with("model `m`, endpoint `m:local-9002` (quota pool `m:m:local-9002`)"),
        "{text}"
    );
    assert!(
        text.contains("`Daily requests` in unit `requests`"),
        "{text}"
    );
}

#[test]
fn keys_come_from_env_then_the_providers_own_routes() {
    let minimax = "quota_source: {provider: minimax, usage_label: \"Weekly requests: MiniMax-M*\", unit: requests}";
    let yaml = format!(
        "models:\n{}{}",
        model("m", &[quota_route("http://127.0.0.1:9001/v1", minimax)]),
        // An on-demand route on MiniMax's host in another model carries the key.
        "  - id: other\n    route:\n      - kind: openai_compat\n        base_url: https://api.minimax.io/v1\n        api_key: mm-key\n",
    );
    let models = models(&yaml);
    let plan = QuotaPlan::build(&models, &|_| None);
    match &plan.pool_of("m:local-9001").unwrap().resolution {
        Resolution::Fetch { target, .. } => {
            assert_eq!(target.key, "mm-key");
            assert_eq!(target.key_from, "upstream other:minimax-api");
        }
        other => panic!("{other:?}"),
    }
    let plan = QuotaPlan::build(
        &models,
        &env_of(&[
            ("MINIMAX_API_KEY", "env-key"),
            ("MINIMAX_API_BASE", "http://127.0.0.1:1/"),
        ]),
    );
    match &plan.pool_of("m:local-9001").unwrap().resolution {
        Resolution::Fetch { target, .. } => {
            assert_eq!(target.key, "env-key");
            assert_eq!(target.base, "http://127.0.0.1:1");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn fetchers_parse_their_answers() {
    let records = fetch::parse_chutes(br#"{"quota": 5000, "used": 122.4}"#).unwrap();
    assert_eq!(
        records,
        vec![UsageRecord {
            provider: Provider::Chutes,
            label: "Daily requests".into(),
            unit: "requests".into(),
            used: 123,
            limit: 5000,
        }]
    );
    assert!(fetch::parse_chutes(br#"{"detail": "unauthorized"}"#).is_err());

    // `*_usage_count` is what remains; a weekly total of 0 means no weekly cap.
    let body = br#"{"model_remains": [
        {"model_name": "MiniMax-M*", "current_interval_total_count": 1500,
         "current_interval_usage_count": 1444, "current_weekly_total_count": 15000,
         "current_weekly_usage_count": 14000, "start_time": 0, "end_time": 0},
        {"model_name": "speech-hd", "current_interval_total_count": 0,
         "current_interval_usage_count": 0, "current_weekly_total_count": 0,
         "current_weekly_usage_count": 0}],
        "base_resp": {"status_code": 0, "status_msg": "success"}}"#;
    let records = fetch::parse_minimax(body).unwrap();
    let summary: Vec<(&str, u64, u64)> = records
        .iter()
        .map(|r| (r.label.as_str(), r.used, r.limit))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("5-hour requests: MiniMax-M*", 56, 1500),
            ("Weekly requests: MiniMax-M*", 1000, 15000)
        ]
    );
    assert!(
        records
            .iter()
            .all(|r| Provider::Minimax.may_emit(&r.label, &r.unit))
    );
    let error = fetch::parse_minimax(
        br#"{"model_remains": [], "base_resp": {"status_code": 1004, "status_msg": "invalid api key"}}"#,
    )
    .unwrap_err();
    assert!(error.contains("1004: invalid api key"), "{error}");
}

#[test]
fn provider_hosts() {
    assert!(Provider::Chutes.serves_host("llm.chutes.ai"));
    assert!(!Provider::Chutes.serves_host("notchutes.ai"));
    assert!(Provider::Minimax.serves_host("api.minimaxi.com"));
    assert!(Provider::Minimax.serves_host("API.MINIMAX.IO"));
    assert!(!Provider::Minimax.serves_host("127.0.0.1"));
}

/// A clock at a settable instant in a fixed UTC offset.
struct TestClock {
    ms: AtomicU64,
    offset_hours: i64,
}

impl Clock for TestClock {
    fn now_ms(&self) -> u64 {
        self.ms.load(Ordering::Relaxed)
    }

    fn local_date(&self, ms: u64) -> NaiveDate {
        let local = ms as i64 + self.offset_hours * 3_600_000;
        chrono::DateTime::from_timestamp_millis(local)
            .unwrap()
            .date_naive()
    }
}

const HOUR: u64 = 3_600_000;
/// 2026-01-01T00:00:00Z.
const NEW_YEAR_UTC: u64 = 1_767_225_600_000;

#[test]
fn local_counter_resets_at_local_midnight() {
    let mut counter = LocalCounter::default();
    let day = NaiveDate::from_ymd_opt(2026, 1, 1).unwrap();
    counter.count("p", day);
    counter.count("p", day);
    counter.count("q", day);
    assert_eq!(counter.used("p", day), 2);
    assert_eq!(counter.used("p", day.succ_opt().unwrap()), 0);
    assert_eq!(counter.used("q", day.succ_opt().unwrap()), 0);

    // Through the board, in UTC+8: local midnight is 16:00 UTC.
    let clock = Arc::new(TestClock {
        ms: AtomicU64::new(NEW_YEAR_UTC + 15 * HOUR),
        offset_hours: 8,
    });
    let board = QuotaBoard::with_clock(clock.clone());
    let yaml = format!(
        "models:\n{}",
        model(
            "m",
            &[
                quota_route(
                    "http://127.0.0.1:9001/v1",
                    "local_quota_fallback: true, quota_pool: plan"
                ),
                quota_route("http://127.0.0.1:9002/v1", "quota_pool: plan"),
            ]
        )
    );
    let models = models(&yaml);
    board.set_plan(QuotaPlan::build(&models, &|_| None));
    board.count_request("m:local-9001");
    board.count_request("m:local-9002");
    board.count_request("m:unknown");
    clock
        .ms
        .store(NEW_YEAR_UTC + 15 * HOUR + 59 * 60_000, Ordering::Relaxed);
    assert_eq!(board.local_used("plan", clock.now_ms()), 2);
    clock.ms.store(NEW_YEAR_UTC + 16 * HOUR, Ordering::Relaxed);
    assert_eq!(board.local_used("plan", clock.now_ms()), 0);
    board.count_request("m:local-9002");
    assert_eq!(board.local_used("plan", clock.now_ms()), 1);
}

async fn no_fetch(_: FetchTarget) -> Result<Vec<UsageRecord>, FetchError> {
    Err(FetchError::Transport {
        url: "-".into(),
        message: "unreachable".into(),
    })
}

#[tokio::test]
async fn refresh_matches_records_shares_pools_and_reports_failures() {
    let clock = Arc::new(TestClock {
        ms: AtomicU64::new(NEW_YEAR_UTC),
        offset_hours: 0,
    });
    let board = QuotaBoard::with_clock(clock.clone());
    let minimax = "quota_source: {provider: minimax, usage_label: \"5-hour requests: MiniMax-M*\", unit: requests}";
    let yaml = format!(
        "models:\n{}{}",
        model(
            "a",
            &[
                quota_route(
                    "http://127.0.0.1:9001/v1",
                    &format!("{CHUTES}, quota_pool: acct")
                ),
                quota_route("http://127.0.0.1:9002/v1", minimax),
                "      - kind: openai_compat\n        base_url: http://127.0.0.1:9009/v1\n"
                    .to_owned(),
            ]
        ),
        // Shares the pool without declaring a source: the pool's first declaration decides.
        model(
            "b",
            &[quota_route("http://127.0.0.1:9003/v1", "quota_pool: acct")]
        ),
    );
    let models = models(&yaml);
    let env = env_of(&[("CHUTES_API_KEY", "c"), ("MINIMAX_API_KEY", "m")]);
    let calls = AtomicU64::new(0);
    let changed = board
        .refresh(&models, &env, |target| {
            calls.fetch_add(1, Ordering::Relaxed);
            async move {
                Ok(match target.provider {
                    Provider::Chutes => {
                        fetch::parse_chutes(br#"{"quota": 300, "used": 42}"#).unwrap()
                    }
                    Provider::Minimax => vec![],
                })
            }
        })
        .await;
    assert_eq!(calls.load(Ordering::Relaxed), 2, "one fetch per provider");
    assert_eq!(changed, vec!["a".to_owned(), "b".to_owned()]);
    let expected = QuotaSnapshot {
        used: 42,
        limit: 300,
        at_ms: NEW_YEAR_UTC,
    };
    assert_eq!(board.snapshot("acct"), Some(expected));
    let mut routes = models[1].upstreams.clone();
    board.apply_snapshots(&mut routes);
    assert_eq!(
        routes[0].metadata["quota_snapshot"],
        serde_json::json!({"used": 42, "limit": 300, "at_ms": NEW_YEAR_UTC})
    );
    let routes = board.with_snapshots(&models[0].upstreams);
    assert!(routes[1].metadata.get("quota_snapshot").is_none());
    assert!(routes[2].metadata.get("quota_snapshot").is_none());

    let diagnostics = board.diagnostics();
    assert_eq!(diagnostics.len(), 1);
    assert_eq!(diagnostics[0].endpoint_id, "a:local-9002");
    assert_eq!(diagnostics[0].reason.kind(), "no_matching_record");
    assert!(diagnostics[0].to_string().contains("it had: no records"));

    // Nothing is due before the interval; then a failed fetch keeps the old snapshot.
    assert!(board.refresh(&models, &env, no_fetch).await.is_empty());
    clock.ms.store(NEW_YEAR_UTC + 5_000, Ordering::Relaxed);
    assert!(board.refresh(&models, &env, no_fetch).await.is_empty());
    assert_eq!(board.snapshot("acct"), Some(expected));
    let report = board.report();
    assert_eq!(report["unresolved"], 3, "{report}");
    let route = &report["routes"][0];
    assert_eq!(route["state"], "unresolved", "{report}");
    assert_eq!(route["reason_kind"], "fetch_failed", "{report}");
    assert_eq!(route["snapshot"]["used"], 42, "{report}");
    assert_eq!(route["key_from"], "env CHUTES_API_KEY", "{report}");
}

#[test]
fn replica_guard_counts_declared_processes() {
    let yaml = format!(
        "models:\n{}  - id: plain\n    router: routewise\n    route:\n      - kind: openai_compat\n        base_url: http://127.0.0.1:9009/v1\n",
        model("m", &[quota_route("http://127.0.0.1:9001/v1", CHUTES)])
    );
    let models = models(&yaml);
    assert_eq!(declared_processes(&|_| None), None);
    assert_eq!(
        declared_processes(&env_of(&[
            ("WEB_CONCURRENCY", "4"),
            ("SWITCHYARD_REPLICAS", "2")
        ])),
        Some(("WEB_CONCURRENCY", 4))
    );
    assert_eq!(
        declared_processes(&env_of(&[("WEB_CONCURRENCY", "many")])),
        None
    );
    // The worker counts a Python-style deployment sets count too (the seed's guard reads them).
    for var in ["UVICORN_WORKERS", "GUNICORN_WORKERS"] {
        let env = move |name: &str| (name == var).then(|| "2".to_owned());
        assert_eq!(declared_processes(&env), Some((var, 2)));
        let error = replica_guard(&models, &env).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with(&format!("SingleWorkerGuardError: {var}=2")),
            "{error}"
        );
    }
    assert_eq!(
        declared_processes(&env_of(&[
            ("GUNICORN_WORKERS", "3"),
            ("UVICORN_WORKERS", "5"),
            ("SWITCHYARD_REPLICAS", "1")
        ])),
        Some(("UVICORN_WORKERS", 5))
    );
    assert!(replica_guard(&models, &env_of(&[("WEB_CONCURRENCY", "1")])).is_ok());
    let error = replica_guard(&models, &env_of(&[("SWITCHYARD_REPLICAS", "3")])).unwrap_err();
    assert_eq!(error.models.len(), 1, "on-demand models are not refused");
    let text = error.to_string();
    assert!(
        text.starts_with("SingleWorkerGuardError: SWITCHYARD_REPLICAS=3"),
        "{text}"
    );
    assert!(text.contains("model `m` (m:local-9001 quota)"), "{text}");
    let opted_out = models
        .iter()
        .cloned()
        .map(|mut m| {
            m.router_params["stateful_providers_single_worker_only"] = false.into();
            m
        })
        .collect::<Vec<_>>();
    assert!(replica_guard(&opted_out, &env_of(&[("SWITCHYARD_REPLICAS", "3")])).is_ok());
}

/// The local counter's second trigger: a `quota_source` naming one registered provider on a route
/// whose upstream is another registered provider's host. Loopback or unknown hosts keep the
/// fetcher (nothing says the requests go elsewhere).
#[test]
fn a_quota_source_of_another_provider_than_the_upstream_counts_locally() {
    let yaml = format!(
        "models:\n{}",
        model(
            "m",
            &[
                // chutes usage, but the upstream is MiniMax's API: counted by the gateway.
                quota_route("https://api.minimax.io/v1", CHUTES),
                // chutes usage on chutes' own host: the fetcher.
                quota_route("https://llm.chutes.ai/v1", CHUTES),
                // chutes usage through a proxy on loopback: the fetcher.
                quota_route("http://127.0.0.1:9003/v1", CHUTES),
            ]
        )
    );
    let plan = QuotaPlan::build(&models(&yaml), &env_of(&[("CHUTES_API_KEY", "env-key")]));
    match &plan.pool_of("m:minimax-api").unwrap().resolution {
        Resolution::Local { limit, why } => {
            assert_eq!(*limit, 100);
            assert_eq!(
                *why,
                super::LocalWhy::OtherProvider {
                    named: Provider::Chutes,
                    upstream: Provider::Minimax
                }
            );
            assert!(why.to_string().contains("minimax host"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    for endpoint in ["m:chutes-llm", "m:local-9003"] {
        assert!(
            matches!(
                plan.pool_of(endpoint).unwrap().resolution,
                Resolution::Fetch { .. }
            ),
            "{endpoint}: {:?}",
            plan.pool_of(endpoint)
        );
    }
    assert!(plan.diagnostics().is_empty(), "{:?}", plan.diagnostics());
    // The counter needs a limit, whichever trigger chose it.
    let no_limit = yaml.replace("quota: {limit: 100}, ", "");
    let plan = QuotaPlan::build(
        &models(&no_limit),
        &env_of(&[("CHUTES_API_KEY", "env-key")]),
    );
    assert_eq!(
        plan.pool_of("m:minimax-api").map(|p| p.resolution.clone()),
        Some(Resolution::Unresolved(Unresolved::LocalNeedsLimit))
    );
}
