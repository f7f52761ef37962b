//! Usage fetchers: one per provider whose usage endpoint the gateway can read.
//!
//! | provider | request | records (`usage_label` / `unit`) |
//! | --- | --- | --- |
//! | `chutes` | `GET {CHUTES_API_BASE}/users/me/quota_usage/me` → `{"quota": N, "used": F}` | `Daily requests` / `requests` (`used` rounded up; the day is Chutes', 00:00 UTC) |
//! | `minimax` | `GET {MINIMAX_API_BASE}/v1/api/openplatform/coding_plan/remains` → `{"model_remains": [...], "base_resp": {...}}` | per `model_remains[]` entry: `5-hour requests: {model_name}` / `requests`, and `Weekly requests: {model_name}` / `requests` when the plan has a weekly cap |
//!
//! Both send `Authorization: Bearer <key>`. MiniMax's `current_interval_usage_count` and
//! `current_weekly_usage_count` are the *remaining* counts despite their names, so
//! `used = total − remaining`. MiniMax's older coding plans counted "prompts" (several model calls
//! each); the records still say `requests`, the unit RouteWise counts locally between snapshots.

use std::time::Duration;

use serde::Deserialize;

/// How long one usage request may take.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes of an error answer kept in the error message.
const ERROR_BODY_LIMIT: usize = 300;

/// A provider with a registered usage fetcher.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Provider {
    Chutes,
    Minimax,
}

/// Chutes' only record.
pub const CHUTES_DAILY_LABEL: &str = "Daily requests";
/// Prefix of MiniMax's rolling five-hour window records; the model name follows.
pub const MINIMAX_INTERVAL_PREFIX: &str = "5-hour requests: ";
/// Prefix of MiniMax's weekly window records; the model name follows.
pub const MINIMAX_WEEKLY_PREFIX: &str = "Weekly requests: ";
/// The unit of every record.
pub const REQUESTS: &str = "requests";

impl Provider {
    pub const ALL: [Provider; 2] = [Provider::Chutes, Provider::Minimax];

    /// The name written in `quota_source.provider`.
    pub fn name(self) -> &'static str {
        match self {
            Provider::Chutes => "chutes",
            Provider::Minimax => "minimax",
        }
    }

    pub fn from_name(name: &str) -> Option<Provider> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The environment variable holding the key (it wins over keys found on routes).
    pub fn key_env(self) -> &'static str {
        match self {
            Provider::Chutes => "CHUTES_API_KEY",
            Provider::Minimax => "MINIMAX_API_KEY",
        }
    }

    /// The environment variable overriding the usage API's base URL.
    pub fn base_env(self) -> &'static str {
        match self {
            Provider::Chutes => "CHUTES_API_BASE",
            Provider::Minimax => "MINIMAX_API_BASE",
        }
    }

    pub fn default_base(self) -> &'static str {
        match self {
            Provider::Chutes => "https://api.chutes.ai",
            Provider::Minimax => "https://api.minimax.io",
        }
    }

    /// The usage endpoint, appended to the base URL.
    pub fn usage_path(self) -> &'static str {
        match self {
            Provider::Chutes => "/users/me/quota_usage/me",
            Provider::Minimax => "/v1/api/openplatform/coding_plan/remains",
        }
    }

    /// Whether a route's host belongs to this provider, so that its `api_key` is this provider's
    /// key: `*.chutes.ai`; `*.minimax.io`, `*.minimaxi.com`, `*.minimax.chat`.
    pub fn serves_host(self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        let under = |domain: &str| host == domain || host.ends_with(&format!(".{domain}"));
        match self {
            Provider::Chutes => under("chutes.ai"),
            Provider::Minimax => {
                under("minimax.io") || under("minimaxi.com") || under("minimax.chat")
            }
        }
    }

    /// Whether a record with this label and unit can come from this fetcher (MiniMax's labels
    /// also name a model, which only a fetch confirms).
    pub fn may_emit(self, label: &str, unit: &str) -> bool {
        if unit != REQUESTS {
            return false;
        }
        match self {
            Provider::Chutes => label == CHUTES_DAILY_LABEL,
            Provider::Minimax => [MINIMAX_INTERVAL_PREFIX, MINIMAX_WEEKLY_PREFIX]
                .iter()
                .any(|p| label.strip_prefix(p).is_some_and(|m| !m.trim().is_empty())),
        }
    }

    /// The records this fetcher emits, for diagnostics.
    pub fn emits(self) -> &'static str {
        match self {
            Provider::Chutes => "`Daily requests` in unit `requests`",
            Provider::Minimax => {
                "`5-hour requests: <model_name>` and `Weekly requests: <model_name>` in unit \
                 `requests`, one per entry of the plan's model_remains (e.g. `5-hour requests: \
                 MiniMax-M*`)"
            }
        }
    }

    /// Parses a 2xx answer of the usage endpoint into records.
    pub fn parse(self, body: &[u8]) -> Result<Vec<UsageRecord>, String> {
        match self {
            Provider::Chutes => parse_chutes(body),
            Provider::Minimax => parse_minimax(body),
        }
    }
}

impl std::fmt::Display for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One usage record of a fetcher, matched against selectors on (provider, label, unit).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageRecord {
    pub provider: Provider,
    pub label: String,
    pub unit: String,
    pub used: u64,
    pub limit: u64,
}

impl UsageRecord {
    fn requests(provider: Provider, label: String, used: u64, limit: u64) -> Self {
        Self {
            provider,
            label,
            unit: REQUESTS.to_owned(),
            used,
            limit,
        }
    }
}

/// Why a usage fetch failed. The key is never part of the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// The endpoint could not be reached or did not answer in time.
    #[error("GET {url}: {message}")]
    Transport { url: String, message: String },
    /// The endpoint answered with a non-2xx status.
    #[error("GET {url}: HTTP {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    /// The answer is not in the shape the fetcher expects.
    #[error("GET {url}: unexpected answer: {message}")]
    Parse { url: String, message: String },
}

/// A JSON number that may be written as an integer or a float; negative counts as 0.
fn count(v: f64) -> u64 {
    if v.is_finite() && v > 0.0 {
        v.ceil().min(u64::MAX as f64) as u64
    } else {
        0
    }
}

#[derive(Deserialize)]
struct ChutesUsage {
    quota: f64,
    used: f64,
}

/// `{"quota": 5000, "used": 123.0}`: the account's requests today against its daily quota.
pub fn parse_chutes(body: &[u8]) -> Result<Vec<UsageRecord>, String> {
    let usage: ChutesUsage = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    Ok(vec![UsageRecord::requests(
        Provider::Chutes,
        CHUTES_DAILY_LABEL.to_owned(),
        count(usage.used),
        count(usage.quota),
    )])
}

#[derive(Deserialize)]
struct MinimaxRemains {
    #[serde(default)]
    model_remains: Vec<MinimaxModel>,
    base_resp: Option<MinimaxStatus>,
}

#[derive(Deserialize)]
struct MinimaxStatus {
    #[serde(default)]
    status_code: i64,
    #[serde(default)]
    status_msg: String,
}

#[derive(Deserialize)]
struct MinimaxModel {
    model_name: String,
    #[serde(default)]
    current_interval_total_count: f64,
    /// The remaining count, whatever the name says.
    #[serde(default)]
    current_interval_usage_count: f64,
    #[serde(default)]
    current_weekly_total_count: f64,
    /// The remaining count, whatever the name says.
    #[serde(default)]
    current_weekly_usage_count: f64,
}

/// MiniMax's coding-plan remains: one entry per model family, each with a rolling five-hour window
/// and, on newer plans, a weekly one (a total of 0 means the plan has no such cap).
pub fn parse_minimax(body: &[u8]) -> Result<Vec<UsageRecord>, String> {
    let remains: MinimaxRemains = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    if let Some(status) = &remains.base_resp
        && status.status_code != 0
    {
        return Err(format!(
            "base_resp.status_code {}: {}",
            status.status_code, status.status_msg
        ));
    }
    let mut records = Vec::new();
    for m in &remains.model_remains {
        for (prefix, total, remaining) in [
            (
                MINIMAX_INTERVAL_PREFIX,
                m.current_interval_total_count,
                m.current_interval_usage_count,
            ),
            (
                MINIMAX_WEEKLY_PREFIX,
                m.current_weekly_total_count,
                m.current_weekly_usage_count,
            ),
        ] {
            let (total, remaining) = (count(total), count(remaining));
            if total == 0 {
                continue;
            }
            records.push(UsageRecord::requests(
                Provider::Minimax,
                format!("{prefix}{}", m.model_name),
                total.saturating_sub(remaining),
                total,
            ));
        }
    }
    Ok(records)
}

/// Reads `provider`'s usage endpoint under `base` with `key`.
pub async fn fetch(
    client: &reqwest::Client,
    provider: Provider,
    base: &str,
    key: &str,
) -> Result<Vec<UsageRecord>, FetchError> {
    let url = format!("{}{}", base.trim_end_matches('/'), provider.usage_path());
    let transport = |e: reqwest::Error| FetchError::Transport {
        url: url.clone(),
        message: if e.is_timeout() {
            format!("timed out after {FETCH_TIMEOUT:?}")
        } else {
            // Without the URL, which the error repeats.
            e.without_url().to_string()
        },
    };
    let response = client
        .get(&url)
        .bearer_auth(key)
        .header(reqwest::header::ACCEPT, "application/json")
        .timeout(FETCH_TIMEOUT)
        .send()
        .await
        .map_err(transport)?;
    let status = response.status();
    let body = response.bytes().await.map_err(transport)?;
    if !status.is_success() {
        let text = String::from_utf8_lossy(&body);
        let mut end = text.len().min(ERROR_BODY_LIMIT);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        return Err(FetchError::Status {
            url,
            status: status.as_u16(),
            body: text[..end].trim().to_owned(),
        });
    }
    provider
        .parse(&body)
        .map_err(|message| FetchError::Parse { url, message })
}
