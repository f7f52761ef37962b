//! Settings an environment variable may override (breaker, affinity, prefill, key pools, default
//! auth): the environment first, then the file, then the default.

use std::path::Path;
use std::time::Duration;

use super::{ConfigError, raw};

/// `1/0`, `true/false`, `yes/no`, `on/off`.
#[derive(Debug, Clone, Copy)]
struct Flag(bool);

impl std::str::FromStr for Flag {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(Flag(true)),
            "0" | "false" | "no" | "off" => Ok(Flag(false)),
            _ => Err(()),
        }
    }
}

/// An environment variable (when set), else the file's value, else the default.
pub(super) fn pick<T: std::str::FromStr + Copy>(
    path: &Path,
    env: &dyn Fn(&str) -> Option<String>,
    var: &str,
    file: Option<T>,
    default: T,
) -> Result<T, ConfigError> {
    match env(var).filter(|v| !v.trim().is_empty()) {
        Some(v) => v.trim().parse().map_err(|_| ConfigError::Invalid {
            file: path.to_owned(),
            location: String::new(),
            path: format!("environment variable {var}"),
            message: format!("`{v}` is not a valid value"),
        }),
        None => Ok(file.unwrap_or(default)),
    }
}

/// Key-pool knobs: environment first, then `routing.key_pools`.
pub(super) fn key_pool_config(
    path: &Path,
    raw: &raw::RawKeyPools,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<crate::routing::key_pools::KeyPoolConfig, ConfigError> {
    let d = crate::routing::key_pools::KeyPoolConfig::default();
    let seconds = |var: &str, file: Option<f64>, default: Duration| {
        pick(path, env, var, file, default.as_secs_f64())
            .map(|s| Duration::from_secs_f64(s.max(0.0)))
    };
    Ok(crate::routing::key_pools::KeyPoolConfig {
        affinity_enabled: pick(
            path,
            env,
            "ROUTING_KEY_AFFINITY_ENABLED",
            raw.affinity_enabled.map(Flag),
            Flag(d.affinity_enabled),
        )?
        .0,
        affinity_ttl: seconds(
            "KEY_AFFINITY_TTL_SECONDS",
            raw.affinity_ttl_seconds,
            d.affinity_ttl,
        )?,
        rate_limited_quiet: seconds(
            "KEY_QUIET_RATE_LIMITED_SECONDS",
            raw.rate_limited_quiet_seconds,
            d.rate_limited_quiet,
        )?,
        rejected_quiet: seconds(
            "KEY_QUIET_REJECTED_SECONDS",
            raw.rejected_quiet_seconds,
            d.rejected_quiet,
        )?,
    })
}

/// Affinity and prefill knobs: environment first, then `routing.affinity` / `routing.prefill`.
pub(super) fn affinity_and_prefill(
    path: &Path,
    raw: &raw::RawRouting,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<
    (
        crate::routing::affinity::AffinityConfig,
        crate::routing::prefill::PrefillConfig,
    ),
    ConfigError,
> {
    let a = crate::routing::affinity::AffinityConfig::default();
    let (ra, rp) = (&raw.affinity, &raw.prefill);
    let affinity = crate::routing::affinity::AffinityConfig {
        enabled: pick(
            path,
            env,
            "ROUTING_AFFINITY_ENABLED",
            ra.enabled.map(Flag),
            Flag(a.enabled),
        )?
        .0,
        ttl: Duration::from_secs_f64(
            pick(
                path,
                env,
                "AFFINITY_TTL_SECONDS",
                ra.ttl_seconds,
                a.ttl.as_secs_f64(),
            )?
            .max(0.0),
        ),
        sweep_threshold: pick(
            path,
            env,
            "AFFINITY_SWEEP_THRESHOLD",
            ra.sweep_threshold,
            a.sweep_threshold,
        )?,
    };
    let p = crate::routing::prefill::PrefillConfig::default();
    let prefill = crate::routing::prefill::PrefillConfig {
        enabled: pick(
            path,
            env,
            "ROUTING_PREFILL_AWARE_ENABLED",
            rp.enabled.map(Flag),
            Flag(p.enabled),
        )?
        .0,
        intervene_tokens: pick(
            path,
            env,
            "ROUTING_PREFILL_INTERVENE_TOKENS",
            rp.intervene_tokens,
            p.intervene_tokens,
        )?,
        elephant_tokens: pick(
            path,
            env,
            "ROUTING_PREFILL_ELEPHANT_TOKENS",
            rp.elephant_tokens,
            p.elephant_tokens,
        )?,
        elephant_limit: pick(
            path,
            env,
            "ROUTING_PREFILL_ELEPHANT_LIMIT",
            rp.elephant_limit,
            p.elephant_limit,
        )?,
        affinity_ceiling: pick(
            path,
            env,
            "ROUTING_PREFILL_AFFINITY_CEILING",
            rp.affinity_ceiling,
            p.affinity_ceiling,
        )?,
        hint_ttl: Duration::from_secs_f64(
            pick(
                path,
                env,
                "ROUTING_PREFILL_HINT_TTL_SEC",
                rp.hint_ttl_seconds,
                p.hint_ttl.as_secs_f64(),
            )?
            .max(0.0),
        ),
    };
    Ok((affinity, prefill))
}

/// Breaker knobs: environment first, then the config file, then defaults.
pub(super) fn health_config(
    path: &Path,
    raw: &raw::RawHealth,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<crate::routing::health::HealthConfig, ConfigError> {
    let d = crate::routing::health::HealthConfig::default();
    let threshold = pick(
        path,
        env,
        "CIRCUIT_FAILURE_THRESHOLD",
        raw.failure_threshold,
        d.failure_threshold,
    )?;
    let cooldown = pick(
        path,
        env,
        "CIRCUIT_COOLDOWN_SECONDS",
        raw.cooldown_seconds,
        d.cooldown.as_secs_f64(),
    )?;
    let min_availability = pick(
        path,
        env,
        "CIRCUIT_MIN_AVAILABILITY",
        raw.min_availability,
        d.min_availability,
    )?;
    let alpha = pick(
        path,
        env,
        "ROUTER_HEALTH_EWMA_ALPHA",
        raw.ewma_alpha,
        d.ewma_alpha,
    )?;
    let bad = |key: &str, message: String| ConfigError::Invalid {
        file: path.to_owned(),
        location: String::new(),
        path: format!("health.{key}"),
        message,
    };
    if threshold == 0 {
        return Err(bad("failure_threshold", "must be at least 1".into()));
    }
    if !cooldown.is_finite() || cooldown < 0.0 {
        return Err(bad(
            "cooldown_seconds",
            format!("must be >= 0, got {cooldown}"),
        ));
    }
    if !(0.0..=1.0).contains(&min_availability) {
        return Err(bad(
            "min_availability",
            format!("must be between 0 and 1, got {min_availability}"),
        ));
    }
    if !(alpha > 0.0 && alpha <= 1.0) {
        return Err(bad("ewma_alpha", format!("must be in (0, 1], got {alpha}")));
    }
    Ok(crate::routing::health::HealthConfig {
        failure_threshold: threshold,
        cooldown: Duration::from_secs_f64(cooldown),
        min_availability,
        ewma_alpha: alpha,
    })
}
