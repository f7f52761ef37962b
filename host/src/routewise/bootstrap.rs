//! The DB bootstrap (`db_bootstrap_enabled`): a new RouteWise router starts from the request log
//! instead of from nothing.
//!
//! When a RouteWise router is created — at startup, or when its params change — and its params
//! enable the bootstrap, the newest `api_logs` rows of its model from the last
//! `latency_history_prior_window_sec` (at most `db_bootstrap_max_rows`) are replayed into it,
//! oldest first, through `observe`: one observation per row, at the row's time, for the endpoint
//! that served it. The component treats them as observations of no decision of its own (no
//! strategy metadata), so they feed the latency profiles, the output predictor and the cost
//! envelope and touch no concurrency slot.
//!
//! A row holds the request's final attempt only (earlier failed attempts are counted, not
//! described), so only serving endpoints get samples. Rows of requests that failed everywhere name
//! no endpoint and are not read; rows whose endpoint the model no longer routes to, and streams
//! the client abandoned (which the live path does not report either), are skipped.

use serde::Serialize;
use serde_json::Value;

use crate::config::ModelUpstream;
use crate::store::Pool;
use crate::strategy::Observation;

/// `api_logs.error` of a stream the client abandoned; the live path does not tell the strategy.
const CLIENT_DISCONNECTED: &str = "client disconnected";

/// The bootstrap knobs of one router, read from its params with the schema's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BootstrapSettings {
    pub enabled: bool,
    pub max_rows: u64,
    pub window_sec: u64,
}

impl BootstrapSettings {
    /// `params` as the router got them; missing keys take the `default` of `schema`.
    pub fn from_params(params: &Value, schema: &Value) -> Self {
        let get = |key: &str| super::param(params, schema, key);
        BootstrapSettings {
            enabled: get("db_bootstrap_enabled").as_bool().unwrap_or(false),
            max_rows: get("db_bootstrap_max_rows").as_u64().unwrap_or(10_000),
            window_sec: get("latency_history_prior_window_sec")
                .as_u64()
                .unwrap_or(3_600),
        }
    }
}

/// The columns of `api_logs` a replay needs.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct LogRow {
    pub created_at_ms: i64,
    pub endpoint_id: Option<String>,
    pub status: i32,
    pub ttft_ms: Option<f64>,
    pub latency_ms: f64,
    pub prompt_tokens: Option<i32>,
    pub completion_tokens: Option<i32>,
    pub error: Option<String>,
}

const SELECT: &str = "SELECT created_at_ms, endpoint_id, status, ttft_ms, latency_ms, prompt_tokens, completion_tokens, error \
     FROM api_logs WHERE model = $1 AND created_at_ms >= $2 AND endpoint_id IS NOT NULL \
     ORDER BY created_at_ms DESC, id DESC LIMIT $3";

/// The newest rows of `model` since `since_ms`, at most `limit`, returned oldest first.
pub async fn read_rows(
    pool: &Pool,
    model: &str,
    since_ms: i64,
    limit: i64,
) -> Result<Vec<LogRow>, sqlx::Error> {
    let mut rows = match pool {
        Pool::Sqlite(p) => {
            sqlx::query_as::<sqlx::Sqlite, LogRow>(SELECT)
                .bind(model)
                .bind(since_ms)
                .bind(limit)
                .fetch_all(p)
                .await?
        }
        Pool::Postgres(p) => {
            sqlx::query_as::<sqlx::Postgres, LogRow>(SELECT)
                .bind(model)
                .bind(since_ms)
                .bind(limit)
                .fetch_all(p)
                .await?
        }
    };
    rows.reverse();
    Ok(rows)
}

/// The observations of `rows` for a model with `routes`, and how many rows were skipped.
pub fn observations(rows: &[LogRow], routes: &[ModelUpstream]) -> (Vec<Observation>, usize) {
    let clamp = |n: Option<i32>| n.map_or(0, |n| u32::try_from(n).unwrap_or(0));
    let mut skipped = 0;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let route = row
            .endpoint_id
            .as_deref()
            .and_then(|id| routes.iter().find(|r| r.endpoint_id == id));
        let Some(route) = route else {
            skipped += 1;
            continue;
        };
        if row.error.as_deref() == Some(CLIENT_DISCONNECTED) {
            skipped += 1;
            continue;
        }
        out.push(Observation {
            index: route.index,
            success: (200..300).contains(&row.status) && row.error.is_none(),
            ttft_ms: row.ttft_ms,
            latency_ms: row.latency_ms,
            prompt_tokens: clamp(row.prompt_tokens),
            completion_tokens: clamp(row.completion_tokens),
            cached_prompt_tokens: 0,
            status: u16::try_from(row.status).unwrap_or(0),
            strategy_metadata: String::new(),
            now_ms: u64::try_from(row.created_at_ms).unwrap_or(0),
        });
    }
    (out, skipped)
}

/// What one bootstrap did, for `/health/deep`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BootstrapReport {
    /// When it ran, ms since the Unix epoch.
    pub at_ms: u64,
    pub settings: BootstrapSettings,
    /// Rows read from `api_logs`.
    pub rows: usize,
    /// Observations replayed into the router.
    pub replayed: usize,
    /// Rows of endpoints the model no longer has, or of abandoned streams.
    pub skipped: usize,
    /// Why nothing (or not everything) was replayed.
    pub error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn route(index: u32, id: &str) -> ModelUpstream {
        let config = crate::config::Config::from_yaml(
            std::path::Path::new("t.yaml"),
            "models:\n  - id: m\n    route:\n      - kind: openai_compat\n        base_url: http://127.0.0.1:1/v1\n",
            &|_| None,
        )
        .unwrap();
        let mut r = config.models[0].upstreams[0].clone();
        r.index = index;
        r.endpoint_id = id.to_owned();
        r
    }

    fn row(at: i64, endpoint: Option<&str>, status: i32, error: Option<&str>) -> LogRow {
        LogRow {
            created_at_ms: at,
            endpoint_id: endpoint.map(str::to_owned),
            status,
            ttft_ms: Some(120.0),
            latency_ms: 900.0,
            prompt_tokens: Some(2_000),
            completion_tokens: Some(-3),
            error: error.map(str::to_owned),
        }
    }

    #[test]
    fn rows_become_observations_of_the_serving_route() {
        let routes = [route(0, "m:a"), route(1, "m:b")];
        let rows = [
            row(1_000, Some("m:b"), 200, None),
            row(2_000, Some("m:gone"), 200, None),
            row(
                3_000,
                Some("m:a"),
                200,
                Some("upstream stream failed: reset"),
            ),
            row(4_000, Some("m:a"), 200, Some("client disconnected")),
            row(5_000, None, 502, Some("all attempts failed")),
        ];
        let (obs, skipped) = observations(&rows, &routes);
        assert_eq!(skipped, 3);
        assert_eq!(obs.len(), 2);
        assert_eq!(
            (obs[0].index, obs[0].success, obs[0].now_ms, obs[0].status),
            (1, true, 1_000, 200)
        );
        assert_eq!(obs[0].ttft_ms, Some(120.0));
        assert_eq!((obs[0].prompt_tokens, obs[0].completion_tokens), (2_000, 0));
        assert!(obs[0].strategy_metadata.is_empty());
        assert_eq!((obs[1].index, obs[1].success), (0, false));
    }

    #[test]
    fn settings_fall_back_to_the_schema_defaults() {
        let schema = json!({"properties": {
            "db_bootstrap_enabled": {"default": false},
            "db_bootstrap_max_rows": {"default": 10000},
            "latency_history_prior_window_sec": {"default": 3600},
        }});
        assert_eq!(
            BootstrapSettings::from_params(&json!({}), &schema),
            BootstrapSettings {
                enabled: false,
                max_rows: 10_000,
                window_sec: 3_600
            }
        );
        let on = json!({"db_bootstrap_enabled": true, "db_bootstrap_max_rows": 5});
        assert_eq!(
            BootstrapSettings::from_params(&on, &schema),
            BootstrapSettings {
                enabled: true,
                max_rows: 5,
                window_sec: 3_600
            }
        );
    }
}
