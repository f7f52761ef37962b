//! `router_params` of `routewise`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Hedging policy. The component plans the hedge (which backup, after how long) and returns it as
/// the decision's typed `hedge`; the host dispatches it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum HedgeMode {
    /// No hedging.
    #[default]
    Disabled,
    /// Hedge at the latest checkpoint (25 %, 27.5 % … 90 % of `latency_slo_sec`) from which the
    /// request still meets the SLO with probability ≥ 0.99, the primary given its survival so far
    /// or the backup.
    ProbabilityTarget,
}

/// What the decision's order contains.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FallbackMode {
    /// The full order: mixture routes, then the rest (the host falls back along it).
    #[default]
    Policy,
    /// Only the primary: the host never falls back.
    Strict,
}

/// `router_params` of `routewise`. Every key is optional; unknown keys are rejected.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RouteWiseParams {
    /// Budget position between the cheapest (0) and the dearest (1) feasible route:
    /// `B = c_min + α (c_max − c_min)`. Clamped to [0, 1].
    pub budget_alpha: f64,
    /// Budget pressure: when the request's caller has a remaining budget `r` (USD) that covers
    /// fewer than this many requests at the plan's budget `B`, `α` slides linearly towards 0:
    /// `α' = α · clamp(r / (N · B), 0, 1)`, and routes costing more than `r` leave the plan while a
    /// cheaper one is feasible. 0 disables it.
    pub budget_pressure_requests: u32,
    /// XORed into every request's seed when set.
    pub random_seed: Option<u64>,
    /// USD per million tokens (prompt + completion) used for cost-envelope samples when the model has
    /// no priced on-demand route.
    #[schemars(range(min = 0))]
    pub reference_api_price: f64,
    /// Host-side: pre-load latency profiles from the request log at start (not done by the component).
    pub db_bootstrap_enabled: bool,
    /// Host-side: row cap of that bootstrap.
    pub db_bootstrap_max_rows: u32,
    /// Host-side: only use quota/concurrency routes when one gateway process serves the model (their
    /// accounting is per process). The component cannot see the process count; it reports the flag.
    pub stateful_providers_single_worker_only: bool,
    /// Predicted completion tokens when nothing was learned yet (the reference's 500), capped by the
    /// request's `max_tokens`.
    #[schemars(range(min = 1))]
    pub output_default_tokens: u32,
    /// Samples a (model, ⌊log2 prompt tokens⌋) bucket needs before its mean is used.
    pub output_min_bucket_samples: u32,
    /// Samples the model needs before its mean is used.
    pub output_min_model_samples: u32,
    /// Samples overall before the global mean is used.
    pub output_min_global_samples: u32,
    /// Host-side: how often the host refreshes `quota_snapshot`s; the component flags a snapshot
    /// older than twice this as stale in `status`.
    #[schemars(range(min = 1))]
    pub quota_snapshot_refresh_interval_sec: u32,
    /// Window of the cost envelope, in hours.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub envelope_window_hours: f64,
    /// Percentile of the envelope samples that gives the lower shadow price L.
    #[schemars(range(min = 0, max = 100))]
    pub envelope_lower_percentile: f64,
    /// Percentile of the envelope samples that gives the upper shadow price U.
    #[schemars(range(min = 0, max = 100))]
    pub envelope_upper_percentile: f64,
    /// Samples in the window before the envelope counts as calibrated (quota routes are excluded
    /// until then).
    #[schemars(range(min = 1))]
    pub envelope_min_samples: u32,
    /// TTFT objective in seconds: the hedge's target, and reported per endpoint in `status` as the
    /// share of samples within it.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub latency_slo_sec: f64,
    /// Window of the latency profiles, in seconds.
    #[schemars(range(min = 1))]
    pub latency_window_sec: u32,
    /// Host-side: how far back a DB bootstrap reads latency history.
    pub latency_history_prior_window_sec: u32,
    /// Most samples one endpoint's profile keeps (oldest dropped first).
    #[schemars(range(min = 1))]
    pub latency_max_samples_per_profile: u32,
    /// TTFT estimate of an endpoint with no samples in the window, in milliseconds.
    #[schemars(range(min = 0))]
    pub latency_unprofiled_ttft_ms: f64,
    /// Hedging policy: planned by the component, dispatched by the host.
    pub latency_hedge_mode: HedgeMode,
    /// `policy`: full fallback order; `strict`: only the primary.
    pub fallback_mode: FallbackMode,
    /// Host-side: send synthetic probes to idle endpoints.
    pub routewise_probe_enabled: bool,
    /// Host-side: seconds between probes.
    pub routewise_probe_interval_sec: u32,
    /// Host-side: an endpoint idle this long is probed.
    pub routewise_probe_idle_threshold_sec: u32,
    /// Price the request's cached prompt prefix at `input_cache_reads` (per endpoint, from the host's
    /// uncached-token estimate) instead of assuming a cold cache.
    pub prefix_cache_cost_adjustment_enabled: bool,
    /// Removed: set `route[].quota.limit` (with `provider_type: quota`) in the route's metadata.
    #[schemars(extend("deprecated" = true))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub daily_quota: Option<Value>,
    /// Removed: set `route[].concurrency.limit` (with `provider_type: concurrency`) in the route's
    /// metadata.
    #[schemars(extend("deprecated" = true))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency_limit: Option<Value>,
}

impl Default for RouteWiseParams {
    fn default() -> Self {
        Self {
            budget_alpha: 0.75,
            budget_pressure_requests: 20,
            random_seed: None,
            reference_api_price: 1.0,
            db_bootstrap_enabled: false,
            db_bootstrap_max_rows: 10_000,
            stateful_providers_single_worker_only: true,
            output_default_tokens: 500,
            output_min_bucket_samples: 5,
            output_min_model_samples: 20,
            output_min_global_samples: 20,
            quota_snapshot_refresh_interval_sec: 60,
            envelope_window_hours: 24.0,
            envelope_lower_percentile: 10.0,
            envelope_upper_percentile: 90.0,
            envelope_min_samples: 20,
            latency_slo_sec: 3.0,
            latency_window_sec: 900,
            latency_history_prior_window_sec: 3_600,
            latency_max_samples_per_profile: 5_000,
            latency_unprofiled_ttft_ms: 5_000.0,
            latency_hedge_mode: HedgeMode::Disabled,
            fallback_mode: FallbackMode::Policy,
            routewise_probe_enabled: false,
            routewise_probe_interval_sec: 300,
            routewise_probe_idle_threshold_sec: 900,
            prefix_cache_cost_adjustment_enabled: false,
            daily_quota: None,
            concurrency_limit: None,
        }
    }
}

/// `create`'s error for the removed `daily_quota`.
const REMOVED_DAILY_QUOTA: &str = "invalid router_params: daily_quota was removed; set \
     route[].quota.limit (requests per day) on each quota route instead, in the route's metadata: \
     `metadata: {provider_type: quota, quota: {limit: N}}`";

/// `create`'s error for the removed `concurrency_limit`.
const REMOVED_CONCURRENCY_LIMIT: &str = "invalid router_params: concurrency_limit was removed; \
     set route[].concurrency.limit on each concurrency route instead, in the route's metadata: \
     `metadata: {provider_type: concurrency, concurrency: {limit: N}}`";

impl RouteWiseParams {
    /// Checks what the schema cannot express and normalises `budget_alpha`. The messages name the
    /// key, and for removed keys the route-level replacement.
    pub fn validate(mut self) -> Result<Self, String> {
        if self.daily_quota.is_some() {
            return Err(REMOVED_DAILY_QUOTA.to_owned());
        }
        if self.concurrency_limit.is_some() {
            return Err(REMOVED_CONCURRENCY_LIMIT.to_owned());
        }
        let bad = |key: &str, why: &str| Err(format!("invalid router_params: {key}: {why}"));
        self.budget_alpha = if self.budget_alpha.is_nan() {
            Self::default().budget_alpha
        } else {
            self.budget_alpha.clamp(0.0, 1.0)
        };
        if !(self.reference_api_price.is_finite() && self.reference_api_price >= 0.0) {
            return bad("reference_api_price", "must be a finite number >= 0");
        }
        if self.output_default_tokens == 0 {
            return bad("output_default_tokens", "must be >= 1");
        }
        if self.quota_snapshot_refresh_interval_sec == 0 {
            return bad("quota_snapshot_refresh_interval_sec", "must be >= 1");
        }
        if !(self.envelope_window_hours.is_finite() && self.envelope_window_hours > 0.0) {
            return bad("envelope_window_hours", "must be a finite number > 0");
        }
        for (key, p) in [
            ("envelope_lower_percentile", self.envelope_lower_percentile),
            ("envelope_upper_percentile", self.envelope_upper_percentile),
        ] {
            if !(0.0..=100.0).contains(&p) {
                return bad(key, "must be within [0, 100]");
            }
        }
        if self.envelope_lower_percentile >= self.envelope_upper_percentile {
            return bad(
                "envelope_lower_percentile",
                "must be below envelope_upper_percentile",
            );
        }
        if self.envelope_min_samples == 0 {
            return bad("envelope_min_samples", "must be >= 1");
        }
        if !(self.latency_slo_sec.is_finite() && self.latency_slo_sec > 0.0) {
            return bad("latency_slo_sec", "must be a finite number > 0");
        }
        if self.latency_window_sec == 0 {
            return bad("latency_window_sec", "must be >= 1");
        }
        if self.latency_max_samples_per_profile == 0 {
            return bad("latency_max_samples_per_profile", "must be >= 1");
        }
        if !(self.latency_unprofiled_ttft_ms.is_finite() && self.latency_unprofiled_ttft_ms >= 0.0)
        {
            return bad("latency_unprofiled_ttft_ms", "must be a finite number >= 0");
        }
        Ok(self)
    }

    /// The envelope window in milliseconds.
    pub fn envelope_window_ms(&self) -> u64 {
        (self.envelope_window_hours * 3_600_000.0).min(u64::MAX as f64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_sdk::{params_schema, parse_params};

    fn parse(json: &str) -> Result<RouteWiseParams, String> {
        parse_params::<RouteWiseParams>(json)?.validate()
    }

    #[test]
    fn defaults() -> Result<(), String> {
        let params = parse("{}")?;
        assert_eq!(params, RouteWiseParams::default());
        assert_eq!(params.budget_alpha, 0.75);
        assert_eq!(params.fallback_mode, FallbackMode::Policy);
        assert_eq!(params.envelope_window_ms(), 86_400_000);
        Ok(())
    }

    #[test]
    fn schema_is_closed_lists_every_default_and_marks_removed_keys() {
        let schema = params_schema::<RouteWiseParams>();
        assert_eq!(schema["additionalProperties"], false);
        let properties = schema["properties"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        assert_eq!(properties.len(), 29);
        for (key, property) in &properties {
            if key == "daily_quota" || key == "concurrency_limit" {
                assert_eq!(property["deprecated"], true, "{key}");
            } else if key != "random_seed" {
                assert!(!property["default"].is_null(), "{key} has no default");
            }
        }
        assert_eq!(schema["properties"]["budget_alpha"]["default"], 0.75);
        assert_eq!(
            schema["properties"]["budget_pressure_requests"]["default"],
            20
        );
        assert_eq!(
            schema["properties"]["budget_pressure_requests"]["minimum"],
            0
        );
        assert_eq!(schema["properties"]["fallback_mode"]["default"], "policy");
        assert_eq!(schema["properties"]["envelope_min_samples"]["default"], 20);
        // The reference's output predictor: 500 tokens, a bucket after 5 answers, overall after 20.
        assert_eq!(
            schema["properties"]["output_default_tokens"]["default"],
            500
        );
        assert_eq!(
            schema["properties"]["output_min_bucket_samples"]["default"],
            5
        );
        assert_eq!(
            schema["properties"]["output_min_model_samples"]["default"],
            20
        );
        assert_eq!(
            schema["properties"]["output_min_global_samples"]["default"],
            20
        );
    }

    #[test]
    fn removed_keys_name_their_replacement() {
        let error = parse(r#"{"daily_quota": 1000}"#).err().unwrap_or_default();
        assert!(error.contains("route[].quota.limit"), "{error}");
        let error = parse(r#"{"concurrency_limit": 4}"#)
            .err()
            .unwrap_or_default();
        assert!(error.contains("route[].concurrency.limit"), "{error}");
    }

    #[test]
    fn alpha_is_clamped_and_bad_values_rejected() -> Result<(), String> {
        assert_eq!(parse(r#"{"budget_alpha": 3}"#)?.budget_alpha, 1.0);
        assert_eq!(parse(r#"{"budget_alpha": -1}"#)?.budget_alpha, 0.0);
        let error = parse(r#"{"envelope_lower_percentile": 95}"#)
            .err()
            .unwrap_or_default();
        assert!(error.contains("envelope_lower_percentile"), "{error}");
        assert!(parse(r#"{"latency_window_sec": 0}"#).is_err());
        assert!(parse(r#"{"fallback_mode": "sometimes"}"#).is_err());
        assert!(parse(r#"{"budget_alfa": 0.5}"#).is_err());
        assert!(parse(r#"{"budget_pressure_requests": -1}"#).is_err());
        assert_eq!(
            parse(r#"{"budget_pressure_requests": 0}"#)?.budget_pressure_requests,
            0
        );
        assert_eq!(
            parse(r#"{"fallback_mode": "strict", "latency_hedge_mode": "probability_target"}"#)?
                .fallback_mode,
            FallbackMode::Strict
        );
        Ok(())
    }
}
