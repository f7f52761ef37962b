//! Runtime routing changes: weight overrides per model (`/admin/routing/weights`) and disabling or
//! enabling an endpoint or a whole provider kind (`/admin/routing/providers/...`). They live in
//! memory, per process; every change rebuilds the effective route table and pushes it to the
//! affected strategies, without a restart.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use serde::de::{self, Deserializer, Unexpected, Visitor};
use serde::{Deserialize, Serialize};

use super::auth::AdminCaller;
use super::error::{ApiError, Body};
use crate::gateway::Gateway;
use crate::routing::policy::Overrides;

/// `GET /admin/routing/weights`: the runtime overrides and disables.
pub async fn get_weights(_: AdminCaller, State(gateway): State<Arc<Gateway>>) -> Json<Overrides> {
    Json(gateway.overrides())
}

/// `PUT /admin/routing/weights`: replaces one model's overrides. `{"model": id-or-alias,
/// "weights": {endpoint_id: weight}}`; an empty map clears them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightsUpdate {
    pub model: String,
    pub weights: BTreeMap<String, Weight>,
}

/// A weight override: a finite number ≥ 0 (0: never chosen and not pinnable). Checked while the
/// body is read, so a bad value is a 422 at its path (`weights.<endpoint_id>`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Weight(pub f64);

impl<'de> Deserialize<'de> for Weight {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Weight, D::Error> {
        struct WeightVisitor;

        impl Visitor<'_> for WeightVisitor {
            type Value = Weight;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number >= 0")
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Weight, E> {
                Ok(Weight(v as f64))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Weight, E> {
                if v < 0 {
                    return Err(E::invalid_value(Unexpected::Signed(v), &self));
                }
                Ok(Weight(v as f64))
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Weight, E> {
                if !v.is_finite() || v < 0.0 {
                    return Err(E::invalid_value(Unexpected::Float(v), &self));
                }
                Ok(Weight(v))
            }
        }

        deserializer.deserialize_f64(WeightVisitor)
    }
}

pub async fn put_weights(
    _: AdminCaller,
    State(gateway): State<Arc<Gateway>>,
    Body(update): Body<WeightsUpdate>,
) -> Result<Json<Overrides>, ApiError> {
    let table = gateway.table();
    let Some(model) = table.resolve(&update.model) else {
        return Err(invalid(
            "model".to_owned(),
            format!("unknown model `{}`", update.model),
        ));
    };
    for endpoint in update.weights.keys() {
        if !model.upstreams().iter().any(|r| &r.endpoint_id == endpoint) {
            let known: Vec<&str> = model
                .upstreams()
                .iter()
                .map(|r| r.endpoint_id.as_str())
                .collect();
            return Err(invalid(
                format!("weights.{endpoint}"),
                format!(
                    "not an endpoint of model `{}`; its endpoints: {}",
                    model.id(),
                    known.join(", ")
                ),
            ));
        }
    }
    // Aliases share the canonical model's overrides.
    let canonical = model.id().to_owned();
    drop(table);
    let weights: BTreeMap<String, f64> = update
        .weights
        .into_iter()
        .map(|(endpoint, Weight(w))| (endpoint, w))
        .collect();
    gateway
        .update_overrides(|o| {
            if weights.is_empty() {
                o.weights.remove(&canonical);
            } else {
                o.weights.insert(canonical, weights);
            }
        })
        .await;
    Ok(Json(gateway.overrides()))
}

/// A 422 for a value that parsed but does not fit the gateway, at `param`.
fn invalid(param: String, message: String) -> ApiError {
    ApiError::Body {
        message: format!("{param}: {message}"),
        param: Some(param),
    }
}

/// `POST /admin/routing/providers/{endpoint_or_provider}/disable|enable`.
pub async fn set_provider(
    _: AdminCaller,
    State(gateway): State<Arc<Gateway>>,
    Path((target, action)): Path<(String, String)>,
) -> Result<Json<Overrides>, ApiError> {
    let known = gateway.table().models().any(|m| {
        m.upstreams()
            .iter()
            .any(|r| r.endpoint_id == target || r.kind.as_str() == target)
    });
    if !known {
        return Err(ApiError::NotFound(format!(
            "no endpoint id or provider kind `{target}` is routed to"
        )));
    }
    let disable = match action.as_str() {
        "disable" => true,
        "enable" => false,
        _ => {
            return Err(ApiError::NotFound(format!(
                "no action `{action}` on a provider: `disable` or `enable`"
            )));
        }
    };
    gateway
        .update_overrides(|o| {
            if disable {
                o.disabled.insert(target);
            } else {
                o.disabled.remove(&target);
            }
        })
        .await;
    Ok(Json(gateway.overrides()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::error::parse;

    fn rejected(body: &str) -> (Option<String>, String) {
        match parse::<WeightsUpdate>(body.as_bytes()) {
            Err(ApiError::Body { param, message }) => (param, message),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn weights_accept_numbers_from_zero_up() {
        let update: WeightsUpdate =
            parse(br#"{"model": "m", "weights": {"a": 0, "b": 0.5, "c": 3}}"#).unwrap();
        let weights: Vec<f64> = update.weights.values().map(|w| w.0).collect();
        assert_eq!(weights, [0.0, 0.5, 3.0]);
    }

    #[test]
    fn a_bad_weight_is_named_by_its_path() {
        let (param, message) = rejected(r#"{"model": "m", "weights": {"m:local-1": -1}}"#);
        assert_eq!(param.as_deref(), Some("weights.m:local-1"));
        assert_eq!(
            message,
            "weights.m:local-1: invalid value: integer `-1`, expected a number >= 0"
        );
        let (param, message) = rejected(r#"{"model": "m", "weights": {"a": -0.5}}"#);
        assert_eq!(param.as_deref(), Some("weights.a"));
        assert!(message.ends_with("expected a number >= 0"), "{message}");
        let (param, message) = rejected(r#"{"model": "m", "weights": {"a": "heavy"}}"#);
        assert_eq!(param.as_deref(), Some("weights.a"));
        assert_eq!(
            message,
            r#"weights.a: invalid type: string "heavy", expected a number >= 0"#
        );
    }

    #[test]
    fn missing_and_unknown_fields_are_named() {
        assert_eq!(rejected(r#"{"model": "m"}"#).0.as_deref(), Some("weights"));
        assert_eq!(rejected(r#"{"weights": {}}"#).0.as_deref(), Some("model"));
        assert_eq!(
            rejected(r#"{"model": "m", "weights": {}, "extra": 1}"#)
                .0
                .as_deref(),
            Some("extra")
        );
        assert_eq!(
            rejected(r#"{"model": 7, "weights": {}}"#).0.as_deref(),
            Some("model")
        );
        assert_eq!(
            rejected(r#"{"model": "m", "weights": []}"#).0.as_deref(),
            Some("weights")
        );
    }
}
