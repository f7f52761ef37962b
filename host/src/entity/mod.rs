//! The configuration entities: what the gateway is configured with at run time (inbound routes
//! and their plugin configs, consumers and their keys, providers and their upstreams, upstream
//! keys, model mappings and key reservations), their inputs (create bodies) and patches, and their
//! validation. The store keeps them ([`crate::store`]); the YAML config, the HTTP edge, routing,
//! the upstream stage and the admin API use them. The same types are the admin API's resources, so
//! a field's serde and schema attributes here are its public JSON shape.
//!
//! Timestamps are Unix seconds. Secrets never leave through `Serialize` or `Debug`: consumer keys are
//! kept as hashes, route legacy tokens as hashes with a masked hint, upstream keys as a [`Secret`]
//! that prints masked.
//!
//! One file per entity group, all re-exported here so each type has one path (`entity::Route`):
//! - `inbound_route.rs`: inbound path-prefix routes ([`Route`]) and their [`PluginConfig`]s;
//! - `rate_limit.rs`: the `rate-limit` plugin's config ([`RateLimitConfig`]);
//! - `consumer.rs`: [`Consumer`]s, their [`Role`] and their API keys ([`ConsumerKey`]);
//! - `budget.rs`: [`Budget`]s of consumers and consumer groups, and their periods;
//! - `upstream.rs`: [`Provider`]s, their [`Upstream`]s, [`UpstreamKey`]s, [`UpstreamModel`]
//!   mappings and [`KeyReservation`]s of keys configured outside the database;
//! - `secret.rs`: [`Secret`], masking and hashing of secrets.

mod budget;
mod consumer;
mod inbound_route;
mod rate_limit;
mod secret;
mod upstream;

use serde::{Deserialize, Deserializer};

pub use budget::*;
pub use consumer::*;
pub use inbound_route::*;
pub use rate_limit::*;
pub use secret::*;
pub use upstream::*;

/// Input that breaks an entity's rules. `field` is its path (`path_prefix`, `groups[2]`, ...);
/// the store reports it as `StoreError::Invalid`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct InvalidField {
    pub field: String,
    pub message: String,
}

/// Unix time in seconds.
pub fn now() -> i64 {
    i64::try_from(crate::clock::unix_secs()).unwrap_or(i64::MAX)
}

/// A new row id: a short type prefix and 16 random lowercase alphanumerics.
pub fn generate_id(prefix: &str) -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    let body: String = (0..16)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect();
    format!("{prefix}_{body}")
}

// ---------------------------------------------------------------------------------------------
// Patch helpers
// ---------------------------------------------------------------------------------------------

/// For nullable fields of a patch: absent → `None` (keep), `null` → `Some(None)` (clear),
/// a value → `Some(Some(v))`.
fn double_option<'de, T, D>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    T: Deserialize<'de>,
    D: Deserializer<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

fn default_tenant() -> String {
    "default".to_owned()
}

fn default_group() -> String {
    "default".to_owned()
}

fn default_max_attempts() -> i64 {
    2
}

fn default_true() -> bool {
    true
}

fn default_weight() -> f64 {
    1.0
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(Default::default())
}

fn set<T>(slot: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *slot = v;
    }
}

// ---------------------------------------------------------------------------------------------
// Validation helpers
// ---------------------------------------------------------------------------------------------

fn invalid(field: impl Into<String>, message: impl Into<String>) -> InvalidField {
    InvalidField {
        field: field.into(),
        message: message.into(),
    }
}

fn require_text(field: &str, value: &str, max: usize) -> Result<(), InvalidField> {
    if value.trim().is_empty() {
        return Err(invalid(field, "must not be empty"));
    }
    if value.chars().count() > max {
        return Err(invalid(field, format!("must be at most {max} characters")));
    }
    if value.chars().any(char::is_control) {
        return Err(invalid(field, "must not contain control characters"));
    }
    Ok(())
}

fn require_list(field: &str, values: &[String]) -> Result<(), InvalidField> {
    for (i, v) in values.iter().enumerate() {
        require_text(&format!("{field}[{i}]"), v, 128)?;
    }
    Ok(())
}

fn require_weight(field: &str, weight: f64) -> Result<(), InvalidField> {
    if !weight.is_finite() || weight < 0.0 {
        return Err(invalid(
            field,
            format!("must be a number >= 0, got {weight}"),
        ));
    }
    Ok(())
}

/// Plugin and provider names: identifiers people type in URLs and configs.
fn require_name(field: &str, value: &str) -> Result<(), InvalidField> {
    require_text(field, value, 64)?;
    if !value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return Err(invalid(
            field,
            "may contain only letters, digits, `_`, `-` and `.`",
        ));
    }
    Ok(())
}
