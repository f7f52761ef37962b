//! The `rate-limit` plugin's configuration: what a route's `plugin_configs` row (or its YAML
//! `plugins: {rate-limit: …}`) holds, and the rules it must follow. The limiter itself is
//! `server::rate_limit`; this is only the shape, so the admin API, the YAML loader and the
//! request path read one type.

use serde::{Deserialize, Serialize};

use super::{InvalidField, invalid};

/// The largest rate a limit may name. Above it a GCRA step (a minute over the limit) is below a
/// nanosecond, and no gateway serves that much anyway.
pub const MAX_PER_MINUTE: u64 = 1_000_000_000;

/// `rate-limit`: every limit applies to every request on the route, and a request is admitted only
/// when all of them admit it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    pub limits: Vec<RateLimit>,
}

/// One limit: up to three numbers that share a scope (and `per_model`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// Whose requests are counted together.
    pub scope: LimitScope,
    /// Counts each model (canonical id; an alias counts as its model) on its own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub per_model: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u64>,
    /// Prompt tokens (estimated at admission, corrected by the upstream's usage) plus completion
    /// tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<u64>,
    /// Requests in flight at once, a stream until its last event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent_requests: Option<u64>,
}

/// Whose requests one limit counts together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitScope {
    /// Each consumer (by id); a caller without a consumer by its caller identity (key hash, grant
    /// or address).
    Consumer,
    /// Each consumer API key; a caller without one by its caller identity.
    ApiKey,
    /// Each group of the caller's consumer (`default` for none): a request is counted in every
    /// group its consumer belongs to.
    ConsumerGroup,
    /// Every request on the route together.
    Route,
}

impl LimitScope {
    pub fn as_str(self) -> &'static str {
        match self {
            LimitScope::Consumer => "consumer",
            LimitScope::ApiKey => "api_key",
            LimitScope::ConsumerGroup => "consumer_group",
            LimitScope::Route => "route",
        }
    }
}

impl RateLimitConfig {
    /// Reads and checks a stored config; a field at fault is named by its path below `config`
    /// (`config.limits[0].requests_per_minute`), as the admin API reports it.
    pub fn from_value(value: &serde_json::Value) -> Result<RateLimitConfig, InvalidField> {
        let config: RateLimitConfig = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            let field = if path == "." || path.is_empty() {
                "config".to_owned()
            } else {
                format!("config.{path}")
            };
            invalid(field, e.into_inner().to_string())
        })?;
        config
            .validate()
            .map_err(|e| invalid(format!("config.{}", e.field), e.message))?;
        Ok(config)
    }

    /// The rules serde cannot say; `field` is relative to the config (`limits[1].scope`).
    pub fn validate(&self) -> Result<(), InvalidField> {
        if self.limits.is_empty() {
            return Err(invalid("limits", "must name at least one limit"));
        }
        for (i, limit) in self.limits.iter().enumerate() {
            let at = |field: &str| format!("limits[{i}].{field}");
            if limit.requests_per_minute.is_none()
                && limit.tokens_per_minute.is_none()
                && limit.concurrent_requests.is_none()
            {
                return Err(invalid(
                    format!("limits[{i}]"),
                    "set at least one of requests_per_minute, tokens_per_minute, \
                     concurrent_requests",
                ));
            }
            for (field, value) in [
                ("requests_per_minute", limit.requests_per_minute),
                ("tokens_per_minute", limit.tokens_per_minute),
                ("concurrent_requests", limit.concurrent_requests),
            ] {
                if let Some(v) = value
                    && !(1..=MAX_PER_MINUTE).contains(&v)
                {
                    return Err(invalid(
                        at(field),
                        format!("must be between 1 and {MAX_PER_MINUTE}, got {v}"),
                    ));
                }
            }
            // Two entries of one scope would count the same requests twice under two names; one
            // entry holds all three numbers.
            if let Some(j) = self.limits[..i]
                .iter()
                .position(|l| l.scope == limit.scope && l.per_model == limit.per_model)
            {
                return Err(invalid(
                    at("scope"),
                    format!(
                        "limits[{j}] already has scope {} with per_model {}; put the numbers in \
                         one entry",
                        limit.scope.as_str(),
                        limit.per_model
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Plugin configs of a YAML route (`routes[].plugins`), by plugin name: the same shapes as the
/// database's `plugin_configs` rows. A name no plugin has is an unknown key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutePlugins {
    #[serde(
        rename = "rate-limit",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub rate_limit: Option<RateLimitConfig>,
}

impl RoutePlugins {
    pub fn is_empty(&self) -> bool {
        self.rate_limit.is_none()
    }

    /// The rules serde cannot say; `field` is relative to `plugins` (`rate-limit.limits[0]`).
    pub fn validate(&self) -> Result<(), InvalidField> {
        if let Some(r) = &self.rate_limit {
            r.validate()
                .map_err(|e| invalid(format!("rate-limit.{}", e.field), e.message))?;
        }
        Ok(())
    }

    /// `plugin name → config`, as `/routing` shows a route's plugins.
    pub fn to_map(&self) -> std::collections::BTreeMap<String, serde_json::Value> {
        let mut map = std::collections::BTreeMap::new();
        if let Some(r) = &self.rate_limit {
            map.insert(
                super::RATE_LIMIT_PLUGIN.to_owned(),
                serde_json::to_value(r).unwrap_or_default(),
            );
        }
        map
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_config_reads_and_its_faults_are_named_by_path() {
        let ok = RateLimitConfig::from_value(&json!({"limits": [
            {"scope": "consumer", "requests_per_minute": 60, "tokens_per_minute": 1000},
            {"scope": "consumer", "per_model": true, "concurrent_requests": 2},
            {"scope": "route", "concurrent_requests": 100},
        ]}))
        .unwrap();
        assert_eq!(ok.limits.len(), 3);
        assert!(ok.limits[1].per_model);

        let field = |v: serde_json::Value| RateLimitConfig::from_value(&v).unwrap_err();
        // An unknown key is named by its own path.
        let e = field(json!({"rpm": 60}));
        assert_eq!(e.field, "config.rpm", "{e}");
        assert!(e.message.contains("unknown field `rpm`"), "{e}");
        let e = field(json!({"limits": [{"scope": "consumer", "requests_per_minut": 1}]}));
        assert_eq!(e.field, "config.limits[0].requests_per_minut", "{e}");
        assert!(
            e.message.contains("unknown field `requests_per_minut`"),
            "{e}"
        );
        let e = field(json!({"limits": [{"scope": "team", "requests_per_minute": 1}]}));
        assert_eq!(e.field, "config.limits[0].scope", "{e}");
        let e = field(json!({"limits": [{"scope": "route", "requests_per_minute": 0}]}));
        assert_eq!(e.field, "config.limits[0].requests_per_minute", "{e}");
        let e = field(json!({"limits": [{"scope": "route", "requests_per_minute": -1}]}));
        assert_eq!(e.field, "config.limits[0].requests_per_minute", "{e}");
        let e = field(json!({"limits": [{"scope": "route"}]}));
        assert_eq!(e.field, "config.limits[0]", "{e}");
        let e = field(json!({"limits": []}));
        assert_eq!(e.field, "config.limits", "{e}");
        let e = field(json!({"limits": [
            {"scope": "api_key", "requests_per_minute": 1},
            {"scope": "api_key", "tokens_per_minute": 1},
        ]}));
        assert_eq!(e.field, "config.limits[1].scope", "{e}");
    }
}
