//! One decision, offline: `switchyard strategies run NAME --params P --input decision.json`.
//!
//! The input file holds a route table, the facts of one request, the candidates the host would
//! admit (optional: every route by default) and observations to replay first (optional). The
//! strategy is instantiated exactly as the gateway does it (`create`, `refresh-route-table`), the
//! observations are fed through `observe` in file order, then `select` runs once and `status` is
//! read. Nothing touches the network or a database, and with a fixed `seed` the output is
//! reproducible.
//!
//! Routes come in either of two forms, decided by the first entry:
//!
//! - as in a model's YAML `route:` list (`kind`, `base_url`, `pricing`, `metadata`, ...): validated
//!   like the config file, endpoint ids derived the same way;
//! - as the WIT `route` record (`index`, `endpoint_id`, `provider`, `weight`, `pricing`,
//!   `metadata` or `metadata_json`, ...), passed through as written.

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::catalog::LoadedStrategy;
use super::engine::StrategyEngine;
use super::router::ModelRouter;
use super::types::{
    Candidate, CircuitState, HedgeRequest, Modalities, Observation, PrefillPolicy, Pricing,
    Request, UpstreamInfo as Route,
};
use crate::config::raw::RawPricing;

/// Why an offline decision could not be made.
#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    /// The input file is not valid JSON of the expected shape; `path` is the field at fault.
    #[error("{file}: {path}{message}")]
    Input {
        file: String,
        path: String,
        message: String,
    },
    /// The params do not satisfy the strategy's schema (one message per problem, naming the key).
    #[error("params: strategy `{strategy}` rejects them: {}", problems.join("; "))]
    Params {
        strategy: String,
        problems: Vec<String>,
    },
    /// The strategy failed: `create`, an `observe`, `select` (an error or an invalid order).
    #[error(transparent)]
    Strategy(#[from] super::StrategyError),
}

/// The input file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionInput {
    /// The model id the router is created for (default `offline`); YAML routes derive their
    /// endpoint ids from it.
    #[serde(default = "default_model")]
    pub model: String,
    /// The route table: YAML `route:` entries or WIT `route` records.
    pub routes: Vec<Value>,
    #[serde(default)]
    pub request: RequestInput,
    /// The admitted candidates; every route (with its weight and priority) when absent.
    pub candidates: Option<Vec<CandidateInput>>,
    /// Replayed through `observe`, in order, before `select`.
    #[serde(default)]
    pub observations: Vec<ObservationInput>,
}

fn default_model() -> String {
    "offline".to_owned()
}

/// The facts of the request (`request` in the WIT).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestInput {
    #[serde(default)]
    pub prompt_tokens: u32,
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub stream: bool,
    /// The request's randomness; fix it for a reproducible decision.
    #[serde(default)]
    pub seed: u64,
    /// Milliseconds since the Unix epoch (default 0).
    #[serde(default)]
    pub now_ms: u64,
    #[serde(default)]
    pub caller_hash: u64,
    /// `image`, `audio`, `video`.
    #[serde(default)]
    pub modalities: Vec<ModalityInput>,
    /// The host's prefill knobs; the gateway's defaults when absent.
    pub prefill: Option<PrefillInput>,
    /// The caller's remaining budget in USD (`remaining-budget-usd`); none by default.
    pub remaining_budget_usd: Option<f64>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModalityInput {
    Image,
    Audio,
    Video,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefillInput {
    pub enabled: bool,
    pub intervene_tokens: u64,
    pub elephant_tokens: u64,
    pub elephant_limit: u32,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CircuitInput {
    #[default]
    Closed,
    Open,
    HalfOpen,
}

/// One admitted candidate (`candidate` in the WIT); unset fields come from its route or are
/// neutral (availability 1, circuit closed, no backlog, the whole prompt uncached).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CandidateInput {
    pub index: u32,
    pub weight: Option<f64>,
    pub priority: Option<i32>,
    pub availability: Option<f64>,
    #[serde(default)]
    pub circuit: CircuitInput,
    #[serde(default)]
    pub prefill_backlog_tokens: u64,
    #[serde(default)]
    pub inflight_elephants: u32,
    pub uncached_prompt_tokens: Option<u64>,
    pub ttft_ms: Option<f64>,
    pub latency_ms: Option<f64>,
    #[serde(default)]
    pub inflight_requests: u32,
    #[serde(default)]
    pub affinity_pinned: bool,
}

/// One finished attempt to replay (`observation` in the WIT). The route is named by `index` or by
/// `endpoint_id`; `strategy_metadata` is usually empty (a replayed observation belongs to no
/// decision of this instance, as after a restart).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObservationInput {
    pub index: Option<u32>,
    pub endpoint_id: Option<String>,
    #[serde(default = "yes")]
    pub success: bool,
    pub ttft_ms: Option<f64>,
    /// Defaults to `ttft_ms`, else 0.
    pub latency_ms: Option<f64>,
    /// Defaults to the request's.
    pub prompt_tokens: Option<u32>,
    #[serde(default)]
    pub completion_tokens: u32,
    #[serde(default)]
    pub cached_prompt_tokens: u32,
    /// Defaults to 200 on success, 500 on failure.
    pub status: Option<u16>,
    #[serde(default)]
    pub strategy_metadata: String,
    /// Defaults to the request's `now_ms`.
    pub now_ms: Option<u64>,
}

fn yes() -> bool {
    true
}

/// A route as its WIT record, with `metadata` accepted as an object.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WitRouteInput {
    index: Option<u32>,
    endpoint_id: String,
    #[serde(default = "default_provider")]
    provider: String,
    #[serde(default)]
    base_url: String,
    #[serde(default)]
    provider_model_id: String,
    #[serde(default = "default_weight")]
    weight: f64,
    #[serde(default)]
    priority: i32,
    input_modalities: Option<Vec<String>>,
    pricing: Option<RawPricing>,
    metadata: Option<serde_json::Map<String, Value>>,
    metadata_json: Option<String>,
}

fn default_provider() -> String {
    "openai_compat".to_owned()
}

fn default_weight() -> f64 {
    1.0
}

/// What `strategies run` prints.
#[derive(Debug, Serialize)]
pub struct DecisionOutput {
    /// `name version` of the strategy that decided.
    pub strategy: String,
    /// Declared indexes, primary first.
    pub order: Vec<u32>,
    /// The endpoint ids of `order`.
    pub endpoints: Vec<String>,
    pub strategy_metadata: String,
    /// The hedge the strategy asked for, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hedge: Option<HedgeRequest>,
    /// The strategy's `status()` after the decision (JSON when it is JSON).
    pub status: Value,
}

/// Reads the input file's JSON, naming the field at fault.
pub fn parse_input(file: &Path, text: &str) -> Result<DecisionInput, OfflineError> {
    let mut de = serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(&mut de).map_err(|err| {
        let path = err.path().to_string();
        OfflineError::Input {
            file: file.display().to_string(),
            path: if path == "." {
                String::new()
            } else {
                format!("{path}: ")
            },
            message: err.into_inner().to_string(),
        }
    })
}

fn input_error(file: &Path, path: String, message: String) -> OfflineError {
    OfflineError::Input {
        file: file.display().to_string(),
        path: if path.is_empty() {
            path
        } else {
            format!("{path}: ")
        },
        message,
    }
}

/// The route table in its WIT form. `file` names the input in errors.
pub fn routes(file: &Path, input: &DecisionInput) -> Result<Vec<Route>, OfflineError> {
    let wit_form = input
        .routes
        .first()
        .and_then(Value::as_object)
        .is_some_and(|o| o.contains_key("endpoint_id"));
    if wit_form {
        wit_routes(file, &input.routes)
    } else {
        yaml_routes(file, &input.model, &input.routes)
    }
}

fn wit_routes(file: &Path, entries: &[Value]) -> Result<Vec<Route>, OfflineError> {
    let mut routes = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let at = |field: &str| {
            if field.is_empty() {
                format!("routes[{i}]")
            } else {
                format!("routes[{i}].{field}")
            }
        };
        let r: WitRouteInput = serde_path_to_error::deserialize(entry).map_err(|err| {
            let field = err.path().to_string();
            let field = if field == "." { String::new() } else { field };
            input_error(file, at(&field), err.into_inner().to_string())
        })?;
        let metadata_json = match (r.metadata, r.metadata_json) {
            (Some(_), Some(_)) => {
                return Err(input_error(
                    file,
                    at("metadata"),
                    "give `metadata` or `metadata_json`, not both".into(),
                ));
            }
            (Some(map), None) => Value::Object(map).to_string(),
            (None, Some(text)) => text,
            (None, None) => "{}".to_owned(),
        };
        routes.push(Route {
            index: r.index.unwrap_or(i as u32),
            endpoint_id: r.endpoint_id,
            provider: r.provider,
            base_url: r.base_url,
            provider_model_id: r.provider_model_id,
            weight: r.weight,
            priority: r.priority,
            input_modalities: r.input_modalities.unwrap_or_else(|| vec!["text".into()]),
            pricing: r.pricing.map(|p| Pricing {
                prompt: p.prompt,
                completion: p.completion,
                input_cache_reads: p.input_cache_reads.unwrap_or(0.0),
                input_cache_writes: p.input_cache_writes.unwrap_or(0.0),
            }),
            metadata_json,
        });
    }
    Ok(routes)
}

/// YAML-form routes go through the config loader, so they are validated, and get their endpoint
/// ids, exactly as in a config file. Its messages are rewritten to name `routes[i]`.
fn yaml_routes(file: &Path, model: &str, entries: &[Value]) -> Result<Vec<Route>, OfflineError> {
    let document = serde_json::json!({
        "models": [{ "id": model, "route": entries }],
    });
    // JSON is YAML; `${` in a value would be read as interpolation, with nothing to interpolate.
    let config =
        crate::config::Config::from_yaml(file, &document.to_string(), &|_| None).map_err(|e| {
            let (path, message) = match e {
                crate::config::ConfigError::Parse { path, message, .. } => (path, message),
                crate::config::ConfigError::Invalid { path, message, .. } => (path, message),
                other => (String::new(), other.to_string()),
            };
            let path = path
                .replace(&format!("models[0] ({model}).route"), "routes")
                .replace("models[0].route", "routes");
            let path = path.trim_end_matches(": ").to_owned();
            input_error(file, path, message)
        })?;
    Ok(config
        .models
        .first()
        .map(|m| super::types::upstream_table(&m.upstreams))
        .unwrap_or_default())
}

/// Runs the decision: create, replay, select, status.
pub async fn run(
    engine: &StrategyEngine,
    strategy: Arc<LoadedStrategy>,
    params: &Value,
    file: &Path,
    input: &DecisionInput,
) -> Result<DecisionOutput, OfflineError> {
    if let Err(problems) = strategy.validate_params(params) {
        return Err(OfflineError::Params {
            strategy: strategy.label(),
            problems,
        });
    }
    let routes = routes(file, input)?;
    let endpoint_of = |index: u32| {
        routes
            .iter()
            .find(|r| r.index == index)
            .map(|r| r.endpoint_id.clone())
    };
    let r = &input.request;
    let request = request(input);
    let candidates = candidates(file, input, &routes)?;
    let mut observations = Vec::with_capacity(input.observations.len());
    for (i, o) in input.observations.iter().enumerate() {
        let index = match (o.index, &o.endpoint_id) {
            (Some(index), _) => index,
            (None, Some(id)) => routes
                .iter()
                .find(|r| &r.endpoint_id == id)
                .map(|r| r.index)
                .ok_or_else(|| {
                    input_error(
                        file,
                        format!("observations[{i}].endpoint_id"),
                        format!("no upstream has endpoint id `{id}`"),
                    )
                })?,
            (None, None) => {
                return Err(input_error(
                    file,
                    format!("observations[{i}]"),
                    "name the upstream with `index` or `endpoint_id`".into(),
                ));
            }
        };
        observations.push(Observation {
            index,
            success: o.success,
            ttft_ms: o.ttft_ms,
            latency_ms: o.latency_ms.or(o.ttft_ms).unwrap_or(0.0),
            prompt_tokens: o.prompt_tokens.unwrap_or(r.prompt_tokens),
            completion_tokens: o.completion_tokens,
            cached_prompt_tokens: o.cached_prompt_tokens,
            status: o.status.unwrap_or(if o.success { 200 } else { 500 }),
            strategy_metadata: o.strategy_metadata.clone(),
            now_ms: o.now_ms.unwrap_or(r.now_ms),
        });
    }

    let router = ModelRouter::new(
        engine,
        strategy.clone(),
        &input.model,
        params,
        routes.clone(),
    )
    .await?;
    for o in &observations {
        router.observe(o).await;
    }
    // `observe` reports failures to the router's stats rather than to the caller; offline, a
    // failed replay must not pass silently.
    if let Some(failure) = router.stats.last_failure.lock().clone() {
        return Err(OfflineError::Strategy(super::StrategyError::Engine(
            format!("replaying the observations failed: {failure}"),
        )));
    }
    let decision = router.select(&request, &candidates).await?;
    let status = router.status().await;
    Ok(DecisionOutput {
        strategy: strategy.label(),
        endpoints: decision
            .order
            .iter()
            .map(|&i| endpoint_of(i).unwrap_or_else(|| format!("#{i}")))
            .collect(),
        order: decision.order,
        strategy_metadata: decision.strategy_metadata,
        hedge: decision.hedge,
        status,
    })
}

/// The request's facts as the strategy is told them.
pub fn request(input: &DecisionInput) -> Request {
    let r = &input.request;
    let prefill = r.prefill.unwrap_or_else(|| {
        let d = crate::routing::prefill::PrefillConfig::default();
        PrefillInput {
            enabled: d.enabled,
            intervene_tokens: d.intervene_tokens,
            elephant_tokens: d.elephant_tokens,
            elephant_limit: d.elephant_limit,
        }
    });
    let mut modalities = Modalities::empty();
    for m in &r.modalities {
        modalities |= match m {
            ModalityInput::Image => Modalities::IMAGE,
            ModalityInput::Audio => Modalities::AUDIO,
            ModalityInput::Video => Modalities::VIDEO,
        };
    }
    Request {
        caller_hash: r.caller_hash,
        prompt_tokens: r.prompt_tokens,
        max_tokens: r.max_tokens,
        stream: r.stream,
        modalities,
        seed: r.seed,
        now_ms: r.now_ms,
        prefill: PrefillPolicy {
            enabled: prefill.enabled,
            intervene_tokens: prefill.intervene_tokens,
            elephant_tokens: prefill.elephant_tokens,
            elephant_limit: prefill.elephant_limit,
        },
        remaining_budget_usd: r.remaining_budget_usd,
    }
}

/// The admitted candidates: as given, with unset fields from their route, else every route.
pub fn candidates(
    file: &Path,
    input: &DecisionInput,
    routes: &[Route],
) -> Result<Vec<Candidate>, OfflineError> {
    let prompt = u64::from(input.request.prompt_tokens);
    let Some(given) = &input.candidates else {
        return Ok(routes
            .iter()
            .map(|r| Candidate {
                index: r.index,
                weight: r.weight,
                priority: r.priority,
                availability: 1.0,
                circuit: CircuitState::Closed,
                prefill_backlog_tokens: 0,
                inflight_elephants: 0,
                uncached_prompt_tokens: prompt,
                ttft_ms: None,
                latency_ms: None,
                inflight_requests: 0,
                affinity_pinned: false,
            })
            .collect());
    };
    given
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let route = routes.iter().find(|r| r.index == c.index).ok_or_else(|| {
                input_error(
                    file,
                    format!("candidates[{i}].index"),
                    format!("no upstream has index {}", c.index),
                )
            })?;
            Ok(Candidate {
                index: c.index,
                weight: c.weight.unwrap_or(route.weight),
                priority: c.priority.unwrap_or(route.priority),
                availability: c.availability.unwrap_or(1.0),
                circuit: match c.circuit {
                    CircuitInput::Closed => CircuitState::Closed,
                    CircuitInput::Open => CircuitState::Open,
                    CircuitInput::HalfOpen => CircuitState::HalfOpen,
                },
                prefill_backlog_tokens: c.prefill_backlog_tokens,
                inflight_elephants: c.inflight_elephants,
                uncached_prompt_tokens: c.uncached_prompt_tokens.unwrap_or(prompt),
                ttft_ms: c.ttft_ms,
                latency_ms: c.latency_ms,
                inflight_requests: c.inflight_requests,
                affinity_pinned: c.affinity_pinned,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> DecisionInput {
        parse_input(Path::new("d.json"), text).unwrap()
    }

    #[test]
    fn yaml_routes_get_config_endpoint_ids_and_validation() {
        let input = parse(
            r#"{"model": "chat", "routes": [
                {"kind": "openai_compat", "base_url": "http://127.0.0.1:9001/v1",
                 "pricing": {"prompt": 0.6, "completion": 2.4}},
                {"kind": "anthropic", "base_url": "https://api.anthropic.com", "weight": 2,
                 "metadata": {"provider_type": "concurrency", "concurrency": {"limit": 4}}}
            ]}"#,
        );
        let table = routes(Path::new("d.json"), &input).unwrap();
        let ids: Vec<&str> = table.iter().map(|r| r.endpoint_id.as_str()).collect();
        assert_eq!(ids, ["chat:local-9001", "chat:anthropic-api"]);
        assert_eq!(table[1].weight, 2.0);
        assert!(table[1].metadata_json.contains("concurrency"));
        assert_eq!(table[0].pricing.map(|p| p.completion), Some(2.4));

        let bad = parse(
            r#"{"routes": [{"kind": "openai_compat", "base_url": "http://a/v1"},
                           {"kind": "openai_compat", "base_url": "http://b/v1", "weight": -1}]}"#,
        );
        let error = routes(Path::new("d.json"), &bad).unwrap_err().to_string();
        assert!(error.starts_with("d.json: routes[1].weight: "), "{error}");
        let typo = parse(
            r#"{"routes": [{"kind": "openai_compat", "base_url": "http://a/v1", "wieght": 1}]}"#,
        );
        let error = routes(Path::new("d.json"), &typo).unwrap_err().to_string();
        assert!(
            error.contains("routes[0]") && error.contains("wieght"),
            "{error}"
        );
    }

    #[test]
    fn wit_routes_pass_through_and_name_bad_fields() {
        let input = parse(
            r#"{"routes": [{"endpoint_id": "m:a", "metadata": {"provider_type": "quota"}},
                           {"endpoint_id": "m:b", "index": 7, "weight": 0.5}]}"#,
        );
        let table = routes(Path::new("d.json"), &input).unwrap();
        assert_eq!(table[0].index, 0);
        assert_eq!(table[1].index, 7);
        assert_eq!(table[0].metadata_json, r#"{"provider_type":"quota"}"#);
        assert_eq!(table[1].metadata_json, "{}");
        let bad =
            parse(r#"{"routes": [{"endpoint_id": "m:a"}, {"endpoint_id": "m:b", "weight": "x"}]}"#);
        let error = routes(Path::new("d.json"), &bad).unwrap_err().to_string();
        assert!(error.contains("routes[1].weight"), "{error}");
    }

    #[test]
    fn unknown_input_fields_are_named() {
        let error = parse_input(
            Path::new("d.json"),
            r#"{"routes": [], "request": {"sead": 1}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("request.sead") || error.contains("sead"),
            "{error}"
        );
    }
}
