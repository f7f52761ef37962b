//! The effective `router_params` of a RouteWise model, from four layers, and the checks a set of
//! params must pass before a router is (re)built with it.
//!
//! Per key, the first layer that has it wins:
//!
//! 1. `model`: an override set with `PATCH /admin/routewise/model-settings/{key}`;
//! 2. `config`: the model's `router_params:` in the YAML (or `routing.database_models` for a model
//!    only the database knows);
//! 3. `global`: the fallback layer of `PATCH /admin/routewise/settings`, for models that set the
//!    key in neither place;
//! 4. `default`: the strategy's own default (its params schema's `default`).
//!
//! Only layers 1–3 are written into the params handed to the strategy; defaults stay the
//! strategy's business.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::strategy::{LoadedStrategy, ModelRouter, StrategyEngine, StrategyError};

/// Where a key's effective value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// A per-model override from the admin API.
    Model,
    /// The model's `router_params` in the config (or `routing.database_models`).
    Config,
    /// The global fallback layer from the admin API.
    Global,
    /// The strategy's default.
    Default,
}

/// One key's effective value and its origin.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Explained {
    /// `null` for a key without a default that nothing sets.
    #[schema(value_type = Object)]
    pub value: Value,
    pub source: Source,
}

/// The params handed to the strategy: `config`, with `global` filling keys it lacks, then `model`
/// over both.
pub fn layered(
    config: &Value,
    global: &BTreeMap<&str, &Value>,
    model: &BTreeMap<&str, &Value>,
) -> Value {
    let mut params: Map<String, Value> = config.as_object().cloned().unwrap_or_default();
    for (key, value) in global {
        params
            .entry((*key).to_owned())
            .or_insert_with(|| (*value).clone());
    }
    for (key, value) in model {
        params.insert((*key).to_owned(), (*value).clone());
    }
    Value::Object(params)
}

/// Every key of the schema (and any stray key a layer holds), with its effective value and source.
pub fn explain(
    schema: &Value,
    config: &Value,
    global: &BTreeMap<&str, &Value>,
    model: &BTreeMap<&str, &Value>,
) -> BTreeMap<String, Explained> {
    let properties = schema["properties"].as_object();
    let config = config.as_object();
    let mut keys: Vec<&str> = properties
        .map(|p| p.keys().map(String::as_str).collect())
        .unwrap_or_default();
    keys.extend(
        config
            .into_iter()
            .flat_map(|c| c.keys().map(String::as_str)),
    );
    keys.extend(global.keys().copied());
    keys.extend(model.keys().copied());
    keys.sort_unstable();
    keys.dedup();
    keys.into_iter()
        .map(|key| {
            let explained = if let Some(v) = model.get(key) {
                Explained {
                    value: (*v).clone(),
                    source: Source::Model,
                }
            } else if let Some(v) = config.and_then(|c| c.get(key)) {
                Explained {
                    value: v.clone(),
                    source: Source::Config,
                }
            } else if let Some(v) = global.get(key) {
                Explained {
                    value: (*v).clone(),
                    source: Source::Global,
                }
            } else {
                Explained {
                    value: properties
                        .and_then(|p| p.get(key))
                        .and_then(|p| p.get("default"))
                        .cloned()
                        .unwrap_or(Value::Null),
                    source: Source::Default,
                }
            };
            (key.to_owned(), explained)
        })
        .collect()
}

/// Whether `key` is a key of the strategy's params.
pub fn is_known_key(strategy: &LoadedStrategy, key: &str) -> bool {
    strategy.params_schema["properties"]
        .as_object()
        .is_some_and(|p| p.contains_key(key))
}

/// Checks one value on its own against the schema; the messages name the key.
pub fn check_value(strategy: &LoadedStrategy, key: &str, value: &Value) -> Result<(), String> {
    let mut one = Map::new();
    one.insert(key.to_owned(), value.clone());
    strategy
        .validate_params(&Value::Object(one))
        .map_err(|errors| errors.join("; "))
}

/// Checks a whole set of params as a router would get it: the schema, then the strategy's own
/// `create` in a throwaway instance (which also checks combinations, such as percentiles in
/// order, that a schema cannot express).
pub async fn check_params(
    engine: &StrategyEngine,
    strategy: &std::sync::Arc<LoadedStrategy>,
    model_id: &str,
    params: &Value,
) -> Result<(), String> {
    strategy
        .validate_params(params)
        .map_err(|errors| errors.join("; "))?;
    match ModelRouter::new(engine, strategy.clone(), model_id, params, Vec::new()).await {
        Ok(_) => Ok(()),
        Err(StrategyError::Rejected { message, .. }) => Err(message),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn model_beats_config_beats_global_beats_default() {
        let schema = json!({"properties": {
            "budget_alpha": {"default": 0.75},
            "fallback_mode": {"default": "policy"},
            "latency_slo_sec": {"default": 3.0},
            "random_seed": {},
            "envelope_min_samples": {"default": 20},
        }});
        let config = json!({"budget_alpha": 0.5, "latency_slo_sec": 2});
        let (g1, g2, g3) = (json!(0.1), json!("strict"), json!(9));
        let global = BTreeMap::from([
            ("budget_alpha", &g1),
            ("fallback_mode", &g2),
            ("latency_slo_sec", &g3),
        ]);
        let m1 = json!(0.9);
        let model = BTreeMap::from([("budget_alpha", &m1)]);

        assert_eq!(
            layered(&config, &global, &model),
            json!({"budget_alpha": 0.9, "latency_slo_sec": 2, "fallback_mode": "strict"})
        );
        let view = explain(&schema, &config, &global, &model);
        let summary: Vec<(&str, &Value, Source)> = view
            .iter()
            .map(|(k, e)| (k.as_str(), &e.value, e.source))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("budget_alpha", &json!(0.9), Source::Model),
                ("envelope_min_samples", &json!(20), Source::Default),
                ("fallback_mode", &json!("strict"), Source::Global),
                ("latency_slo_sec", &json!(2), Source::Config),
                ("random_seed", &Value::Null, Source::Default),
            ]
        );
        // Without overrides the params are the config's, untouched.
        assert_eq!(layered(&config, &BTreeMap::new(), &BTreeMap::new()), config);
    }
}
