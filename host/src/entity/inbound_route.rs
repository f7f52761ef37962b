//! Inbound routes (the `routes` table): path prefixes callers send requests to, with their auth
//! settings, and the plugin configs attached to each.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize, Serializer};
use utoipa::ToSchema;

use super::{
    InvalidField, default_max_attempts, default_tenant, default_true, empty_object, hash_secret,
    invalid, mask, require_list, require_name, require_text, set,
};

/// When a route translates between the caller's protocol and the upstream's. Stored and shown
/// only; the request path decides what it means.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ProtocolTransformation {
    #[default]
    IfDifferentProtocol,
    Always,
    Never,
}

/// A legacy bearer token a route accepts, kept as its hash and a masked hint. Serialises as the
/// hint alone.
#[derive(Clone, PartialEq, Eq, Deserialize)]
pub struct LegacyToken {
    pub sha256: String,
    pub hint: String,
}

impl LegacyToken {
    pub fn from_plaintext(token: &str) -> LegacyToken {
        LegacyToken {
            sha256: hash_secret(token),
            hint: mask(token),
        }
    }

    /// The stored form (hash and hint), as opposed to the API form (hint only).
    pub(crate) fn stored(&self) -> serde_json::Value {
        serde_json::json!({ "sha256": self.sha256, "hint": self.hint })
    }
}

impl fmt::Debug for LegacyToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hint)
    }
}

impl Serialize for LegacyToken {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.hint)
    }
}

/// A route: a path prefix callers send requests to, with its auth settings.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Route {
    pub id: String,
    pub tenant_id: String,
    pub name: String,
    pub path_prefix: String,
    /// When the route was disabled; `null` while it is enabled.
    pub disabled_at: Option<i64>,
    pub disable_auth: bool,
    pub passthrough_auth_token: bool,
    /// Masked hints of the accepted legacy tokens; the tokens themselves are not stored.
    #[schema(value_type = Vec<String>)]
    pub legacy_bearer_auth_tokens: Vec<LegacyToken>,
    pub protocol_transformation_type: ProtocolTransformation,
    pub groups: Vec<String>,
    pub labels: BTreeMap<String, String>,
    #[schema(value_type = Object)]
    pub metadata: serde_json::Value,
    pub max_attempts: i64,
    pub created_at: i64,
    pub updated_at: i64,
}

impl Route {
    pub fn enabled(&self) -> bool {
        self.disabled_at.is_none()
    }

    /// Whether `token` is one of the route's legacy bearer tokens.
    pub fn accepts_legacy_token(&self, token: &str) -> bool {
        let hash = hash_secret(token);
        self.legacy_bearer_auth_tokens
            .iter()
            .any(|t| t.sha256 == hash)
    }

    pub fn validate(&self) -> Result<(), InvalidField> {
        require_text("tenant_id", &self.tenant_id, 128)?;
        require_text("name", &self.name, 200)?;
        let p = &self.path_prefix;
        if !p.starts_with('/') {
            return Err(invalid("path_prefix", "must start with /"));
        }
        if p.len() > 512 {
            return Err(invalid("path_prefix", "must be at most 512 characters"));
        }
        if p.chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '?' || c == '#')
        {
            return Err(invalid(
                "path_prefix",
                "must be a plain path: no whitespace, `?` or `#`",
            ));
        }
        require_list("groups", &self.groups)?;
        for key in self.labels.keys() {
            require_text(&format!("labels.{key}"), key, 128)?;
        }
        if !self.metadata.is_object() {
            return Err(invalid("metadata", "must be a JSON object"));
        }
        if !(1..=10).contains(&self.max_attempts) {
            return Err(invalid("max_attempts", "must be between 1 and 10"));
        }
        Ok(())
    }
}

/// The body that creates a route.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewRoute {
    #[serde(default = "default_tenant")]
    #[schema(default = "default")]
    pub tenant_id: String,
    pub name: String,
    /// Must start with `/`; unique among enabled routes.
    pub path_prefix: String,
    #[serde(default)]
    pub disabled: bool,
    #[serde(default)]
    pub disable_auth: bool,
    #[serde(default)]
    pub passthrough_auth_token: bool,
    /// Write-only: stored as hashes, shown masked.
    #[serde(default)]
    pub legacy_bearer_auth_tokens: Vec<String>,
    #[serde(default)]
    pub protocol_transformation_type: ProtocolTransformation,
    #[serde(default)]
    pub groups: Vec<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default = "empty_object")]
    #[schema(value_type = Object)]
    pub metadata: serde_json::Value,
    #[serde(default = "default_max_attempts")]
    #[schema(default = 2)]
    pub max_attempts: i64,
    /// YAML only: the route's plugin configs by plugin name. The admin API keeps them as their own
    /// resource (`/admin/routes/{id}/plugins`) and refuses this field.
    #[serde(default)]
    #[schema(ignore)]
    pub plugins: super::RoutePlugins,
}

impl NewRoute {
    /// The route row. `plugins` must be empty (taken out first by the YAML loader): a route row
    /// does not hold plugin configs, so the admin API's body may not name any.
    pub fn into_route(self, id: String, now: i64) -> Result<Route, InvalidField> {
        if !self.plugins.is_empty() {
            return Err(invalid(
                "plugins",
                "a route's plugins are set through /admin/routes/{id}/plugins",
            ));
        }
        let route = Route {
            id,
            tenant_id: self.tenant_id,
            name: self.name,
            path_prefix: self.path_prefix,
            disabled_at: self.disabled.then_some(now),
            disable_auth: self.disable_auth,
            passthrough_auth_token: self.passthrough_auth_token,
            legacy_bearer_auth_tokens: legacy_tokens(&self.legacy_bearer_auth_tokens)?,
            protocol_transformation_type: self.protocol_transformation_type,
            groups: self.groups,
            labels: self.labels,
            metadata: self.metadata,
            max_attempts: self.max_attempts,
            created_at: now,
            updated_at: now,
        };
        route.validate()?;
        Ok(route)
    }
}

fn legacy_tokens(tokens: &[String]) -> Result<Vec<LegacyToken>, InvalidField> {
    tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let field = format!("legacy_bearer_auth_tokens[{i}]");
            if t.trim().is_empty() || t.chars().any(char::is_whitespace) {
                return Err(invalid(
                    field,
                    "must be a non-empty token without whitespace",
                ));
            }
            Ok(LegacyToken::from_plaintext(t))
        })
        .collect()
}

/// A partial update of a route: absent fields keep their value.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RoutePatch {
    pub tenant_id: Option<String>,
    pub name: Option<String>,
    pub path_prefix: Option<String>,
    /// `true` disables the route (keeping the first `disabled_at`), `false` enables it.
    pub disabled: Option<bool>,
    pub disable_auth: Option<bool>,
    pub passthrough_auth_token: Option<bool>,
    /// Replaces the whole list (tokens are write-only, so they cannot be edited one by one).
    pub legacy_bearer_auth_tokens: Option<Vec<String>>,
    pub protocol_transformation_type: Option<ProtocolTransformation>,
    pub groups: Option<Vec<String>>,
    pub labels: Option<BTreeMap<String, String>>,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<serde_json::Value>,
    pub max_attempts: Option<i64>,
}

impl RoutePatch {
    pub fn apply(self, route: &mut Route, now: i64) -> Result<(), InvalidField> {
        set(&mut route.tenant_id, self.tenant_id);
        set(&mut route.name, self.name);
        set(&mut route.path_prefix, self.path_prefix);
        match self.disabled {
            Some(true) if route.disabled_at.is_none() => route.disabled_at = Some(now),
            Some(false) => route.disabled_at = None,
            _ => {}
        }
        set(&mut route.disable_auth, self.disable_auth);
        set(
            &mut route.passthrough_auth_token,
            self.passthrough_auth_token,
        );
        if let Some(tokens) = self.legacy_bearer_auth_tokens {
            route.legacy_bearer_auth_tokens = legacy_tokens(&tokens)?;
        }
        set(
            &mut route.protocol_transformation_type,
            self.protocol_transformation_type,
        );
        set(&mut route.groups, self.groups);
        set(&mut route.labels, self.labels);
        set(&mut route.metadata, self.metadata);
        set(&mut route.max_attempts, self.max_attempts);
        route.updated_at = now;
        route.validate()
    }
}

// ---------------------------------------------------------------------------------------------
// Plugin configs
// ---------------------------------------------------------------------------------------------

/// The plugins this gateway runs, by the name a `plugin_configs` row gives. A row naming anything
/// else would be stored and shown while doing nothing (a `rate-limit` row that limits nothing), so
/// the admin API refuses it. A new plugin adds its name here, one line.
pub const KNOWN_PLUGINS: &[&str] = &[
    RATE_LIMIT_PLUGIN,
    // Only the unit tests' build knows this one: the admin API's CRUD needs a name it accepts.
    #[cfg(test)]
    "test-noop",
];

/// The `rate-limit` plugin's name (its config: [`super::RateLimitConfig`]).
pub const RATE_LIMIT_PLUGIN: &str = "rate-limit";

/// Refuses a plugin name this gateway does not run, naming those it does.
pub fn require_known_plugin(name: &str) -> Result<(), InvalidField> {
    if KNOWN_PLUGINS.contains(&name) {
        return Ok(());
    }
    let known = if KNOWN_PLUGINS.is_empty() {
        "none (this version runs no plugins)".to_owned()
    } else {
        KNOWN_PLUGINS.join(", ")
    };
    Err(invalid(
        "plugin",
        format!("unknown plugin `{name}`; known plugins: {known}"),
    ))
}

/// One plugin's configuration on one route.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct PluginConfig {
    pub id: String,
    pub route_id: String,
    /// The plugin's name; one config per plugin and route.
    pub plugin: String,
    #[schema(value_type = Object)]
    pub config: serde_json::Value,
    pub enabled: bool,
    pub created_at: i64,
    pub updated_at: i64,
}

impl PluginConfig {
    pub fn validate(&self) -> Result<(), InvalidField> {
        require_name("plugin", &self.plugin)?;
        if !self.config.is_object() {
            return Err(invalid("config", "must be a JSON object"));
        }
        // A plugin the gateway runs checks its config here, so a write the request path could not
        // use is refused (422 naming the field) instead of stored.
        if self.plugin == RATE_LIMIT_PLUGIN {
            super::RateLimitConfig::from_value(&self.config)?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewPluginConfig {
    pub plugin: String,
    #[serde(default = "empty_object")]
    #[schema(value_type = Object)]
    pub config: serde_json::Value,
    #[serde(default = "default_true")]
    #[schema(default = true)]
    pub enabled: bool,
}

impl NewPluginConfig {
    pub fn into_plugin_config(
        self,
        id: String,
        route_id: String,
        now: i64,
    ) -> Result<PluginConfig, InvalidField> {
        let p = PluginConfig {
            id,
            route_id,
            plugin: self.plugin,
            config: self.config,
            enabled: self.enabled,
            created_at: now,
            updated_at: now,
        };
        p.validate()?;
        Ok(p)
    }
}

#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PluginConfigPatch {
    pub plugin: Option<String>,
    /// Replaces the whole config.
    #[schema(value_type = Option<Object>)]
    pub config: Option<serde_json::Value>,
    pub enabled: Option<bool>,
}

impl PluginConfigPatch {
    pub fn apply(self, p: &mut PluginConfig, now: i64) -> Result<(), InvalidField> {
        set(&mut p.plugin, self.plugin);
        set(&mut p.config, self.config);
        set(&mut p.enabled, self.enabled);
        p.updated_at = now;
        p.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_validation_names_the_field() {
        let new: NewRoute =
            serde_json::from_value(serde_json::json!({"name": "r", "path_prefix": "v1"})).unwrap();
        let err = new.into_route("rt_1".into(), 1).unwrap_err();
        assert!(err.field == "path_prefix", "{err}");
        assert_eq!(err.to_string(), "path_prefix: must start with /");
    }
}
