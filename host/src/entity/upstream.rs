//! The provider side: providers and the protocol they speak, their upstreams (deployments), the
//! upstreams' keys and model mappings, and reservations of keys configured outside the database.

use std::fmt;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{
    InvalidField, Role, Secret, default_group, default_true, default_weight, double_option,
    invalid, mask, require_name, require_text, require_weight, set,
};

/// The wire protocol an upstream speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    OpenaiCompat,
    OpenaiResponses,
    Anthropic,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::OpenaiCompat => "openai_compat",
            Protocol::OpenaiResponses => "openai_responses",
            Protocol::Anthropic => "anthropic",
        }
    }

    /// What a provider of this protocol serves when its capabilities are not given: every chat
    /// protocol (requests are translated through the IR), and embeddings for OpenAI-compatible
    /// servers. The same defaults as a YAML route of the matching kind.
    pub fn default_capabilities(self) -> Vec<Capability> {
        let mut caps = vec![
            Capability::ChatCompletions,
            Capability::Responses,
            Capability::Messages,
        ];
        if self == Protocol::OpenaiCompat {
            caps.push(Capability::Embeddings);
        }
        caps
    }
}

/// An inbound call an upstream (or a YAML route) can serve.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Capability {
    /// `/v1/chat/completions`
    #[default]
    ChatCompletions,
    /// `/v1/responses`
    Responses,
    /// `/v1/messages`
    Messages,
    /// `/v1/embeddings`
    Embeddings,
}

impl Capability {
    pub fn as_str(self) -> &'static str {
        match self {
            Capability::ChatCompletions => "chat_completions",
            Capability::Responses => "responses",
            Capability::Messages => "messages",
            Capability::Embeddings => "embeddings",
        }
    }
}

/// A kind of upstream service and the protocol it speaks.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Provider {
    pub id: String,
    /// Unique.
    pub name: String,
    pub protocol: Protocol,
    /// The inbound calls its upstreams serve unless an upstream says otherwise.
    pub default_capabilities: Vec<Capability>,
    pub created_at: i64,
    pub updated_at: i64,
}

impl Provider {
    pub fn validate(&self) -> Result<(), InvalidField> {
        require_name("name", &self.name)?;
        if self.default_capabilities.is_empty() {
            return Err(invalid(
                "default_capabilities",
                "must list at least one capability",
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewProvider {
    pub name: String,
    pub protocol: Protocol,
    /// Defaults to every chat protocol (chat_completions, responses, messages: translated
    /// through the IR), plus embeddings for `openai_compat`.
    #[serde(default)]
    pub default_capabilities: Option<Vec<Capability>>,
}

impl NewProvider {
    pub fn into_provider(self, id: String, now: i64) -> Result<Provider, InvalidField> {
        let p = Provider {
            id,
            name: self.name,
            default_capabilities: dedup(
                self.default_capabilities
                    .unwrap_or_else(|| self.protocol.default_capabilities()),
            ),
            protocol: self.protocol,
            created_at: now,
            updated_at: now,
        };
        p.validate()?;
        Ok(p)
    }
}

fn dedup(mut caps: Vec<Capability>) -> Vec<Capability> {
    let mut seen = std::collections::HashSet::new();
    caps.retain(|c| seen.insert(*c));
    caps
}

#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProviderPatch {
    pub name: Option<String>,
    pub protocol: Option<Protocol>,
    pub default_capabilities: Option<Vec<Capability>>,
}

impl ProviderPatch {
    pub fn apply(self, p: &mut Provider, now: i64) -> Result<(), InvalidField> {
        set(&mut p.name, self.name);
        set(&mut p.protocol, self.protocol);
        if let Some(caps) = self.default_capabilities {
            p.default_capabilities = dedup(caps);
        }
        p.updated_at = now;
        p.validate()
    }
}

/// One deployment of a provider: a base URL, its group and its share of traffic.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Upstream {
    pub id: String,
    pub provider_id: String,
    /// Shown with its password masked (`https://user:***@host/v1`).
    #[serde(serialize_with = "masked_url")]
    pub base_url: String,
    pub group: String,
    /// Higher is tried first.
    pub priority: i64,
    pub lb_weight: f64,
    /// Overrides the provider's default capabilities; `null` inherits them.
    pub capabilities: Option<Vec<Capability>>,
    pub enabled: bool,
    /// Seconds from dispatch to a stream's first content; `null` keeps the config's
    /// `upstream.first_token_timeout_seconds`.
    pub first_token_timeout_seconds: Option<f64>,
    /// Longest silence between a stream's events; `null` keeps `upstream.idle_timeout_seconds`.
    pub idle_timeout_seconds: Option<f64>,
    /// Longest a whole stream may take; `null` keeps `upstream.stream_timeout_seconds`.
    pub stream_timeout_seconds: Option<f64>,
    pub created_at: i64,
    pub updated_at: i64,
}

impl Upstream {
    pub fn validate(&self) -> Result<(), InvalidField> {
        match url::Url::parse(&self.base_url) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
            Ok(_) => return Err(invalid("base_url", "must be an http:// or https:// URL")),
            Err(e) => return Err(invalid("base_url", format!("not a URL: {e}"))),
        }
        require_text("group", &self.group, 128)?;
        require_weight("lb_weight", self.lb_weight)?;
        if self.capabilities.as_ref().is_some_and(Vec::is_empty) {
            return Err(invalid(
                "capabilities",
                "must list at least one capability, or be null to inherit the provider's",
            ));
        }
        for (field, value) in [
            (
                "first_token_timeout_seconds",
                self.first_token_timeout_seconds,
            ),
            ("idle_timeout_seconds", self.idle_timeout_seconds),
            ("stream_timeout_seconds", self.stream_timeout_seconds),
        ] {
            if value.is_some_and(|v| !(v.is_finite() && v > 0.0)) {
                return Err(invalid(
                    field,
                    "must be a number of seconds > 0, or null for the config's",
                ));
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewUpstream {
    pub provider_id: String,
    pub base_url: String,
    #[serde(default = "default_group")]
    #[schema(default = "default")]
    pub group: String,
    #[serde(default)]
    pub priority: i64,
    #[serde(default = "default_weight")]
    #[schema(default = 1.0)]
    pub lb_weight: f64,
    #[serde(default)]
    pub capabilities: Option<Vec<Capability>>,
    #[serde(default = "default_true")]
    #[schema(default = true)]
    pub enabled: bool,
    #[serde(default)]
    pub first_token_timeout_seconds: Option<f64>,
    #[serde(default)]
    pub idle_timeout_seconds: Option<f64>,
    #[serde(default)]
    pub stream_timeout_seconds: Option<f64>,
}

impl NewUpstream {
    pub fn into_upstream(self, id: String, now: i64) -> Result<Upstream, InvalidField> {
        let u = Upstream {
            id,
            provider_id: self.provider_id,
            base_url: self.base_url,
            group: self.group,
            priority: self.priority,
            lb_weight: self.lb_weight,
            capabilities: self.capabilities.map(dedup),
            enabled: self.enabled,
            first_token_timeout_seconds: self.first_token_timeout_seconds,
            idle_timeout_seconds: self.idle_timeout_seconds,
            stream_timeout_seconds: self.stream_timeout_seconds,
            created_at: now,
            updated_at: now,
        };
        u.validate()?;
        Ok(u)
    }
}

#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpstreamPatch {
    pub provider_id: Option<String>,
    pub base_url: Option<String>,
    pub group: Option<String>,
    pub priority: Option<i64>,
    pub lb_weight: Option<f64>,
    /// A list, or `null` to inherit the provider's.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<Vec<Capability>>)]
    pub capabilities: Option<Option<Vec<Capability>>>,
    pub enabled: Option<bool>,
    /// Seconds, or `null` to keep the config's.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<f64>)]
    pub first_token_timeout_seconds: Option<Option<f64>>,
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<f64>)]
    pub idle_timeout_seconds: Option<Option<f64>>,
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<f64>)]
    pub stream_timeout_seconds: Option<Option<f64>>,
}

impl UpstreamPatch {
    pub fn apply(self, u: &mut Upstream, now: i64) -> Result<(), InvalidField> {
        set(&mut u.provider_id, self.provider_id);
        set(&mut u.base_url, self.base_url);
        set(&mut u.group, self.group);
        set(&mut u.priority, self.priority);
        set(&mut u.lb_weight, self.lb_weight);
        if let Some(caps) = self.capabilities {
            u.capabilities = caps.map(dedup);
        }
        set(&mut u.enabled, self.enabled);
        set(
            &mut u.first_token_timeout_seconds,
            self.first_token_timeout_seconds,
        );
        set(&mut u.idle_timeout_seconds, self.idle_timeout_seconds);
        set(&mut u.stream_timeout_seconds, self.stream_timeout_seconds);
        u.updated_at = now;
        u.validate()
    }
}

/// A credential for one upstream. The secret is stored (it is sent upstream) and always masked.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct UpstreamKey {
    pub id: String,
    pub upstream_id: String,
    /// Masked, e.g. `sk-ab…yz`.
    #[schema(value_type = String)]
    pub secret: Secret,
    /// Share among the upstream's keys; `null` counts as 1.
    pub lb_weight: Option<f64>,
    /// The least role a consumer needs for this key to be used.
    pub min_role: Role,
    pub enabled: bool,
    pub created_at: i64,
    pub updated_at: i64,
}

impl UpstreamKey {
    pub fn validate(&self) -> Result<(), InvalidField> {
        let s = self.secret.expose();
        if s.trim().is_empty() || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(invalid(
                "secret",
                "must be a non-empty key without whitespace",
            ));
        }
        if let Some(w) = self.lb_weight {
            require_weight("lb_weight", w)?;
        }
        Ok(())
    }
}

#[derive(Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewUpstreamKey {
    /// Write-only.
    pub secret: String,
    #[serde(default)]
    pub lb_weight: Option<f64>,
    #[serde(default)]
    pub min_role: Role,
    #[serde(default = "default_true")]
    #[schema(default = true)]
    pub enabled: bool,
}

impl fmt::Debug for NewUpstreamKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewUpstreamKey")
            .field("secret", &mask(&self.secret))
            .field("lb_weight", &self.lb_weight)
            .field("min_role", &self.min_role)
            .field("enabled", &self.enabled)
            .finish()
    }
}

impl NewUpstreamKey {
    pub fn into_key(
        self,
        id: String,
        upstream_id: String,
        now: i64,
    ) -> Result<UpstreamKey, InvalidField> {
        let k = UpstreamKey {
            id,
            upstream_id,
            secret: Secret::new(self.secret),
            lb_weight: self.lb_weight,
            min_role: self.min_role,
            enabled: self.enabled,
            created_at: now,
            updated_at: now,
        };
        k.validate()?;
        Ok(k)
    }
}

#[derive(Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpstreamKeyPatch {
    /// Write-only: replaces the secret.
    pub secret: Option<String>,
    /// A weight, or `null` for the default.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<f64>)]
    pub lb_weight: Option<Option<f64>>,
    pub min_role: Option<Role>,
    pub enabled: Option<bool>,
}

impl fmt::Debug for UpstreamKeyPatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamKeyPatch")
            .field("secret", &self.secret.as_deref().map(mask))
            .field("lb_weight", &self.lb_weight)
            .field("min_role", &self.min_role)
            .field("enabled", &self.enabled)
            .finish()
    }
}

impl UpstreamKeyPatch {
    pub fn apply(self, k: &mut UpstreamKey, now: i64) -> Result<(), InvalidField> {
        if let Some(s) = self.secret {
            k.secret = Secret::new(s);
        }
        set(&mut k.lb_weight, self.lb_weight);
        set(&mut k.min_role, self.min_role);
        set(&mut k.enabled, self.enabled);
        k.updated_at = now;
        k.validate()
    }
}

/// A public model name served by an upstream under the provider's own model id.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct UpstreamModel {
    pub id: String,
    /// The public model name callers ask for.
    pub model: String,
    pub upstream_id: String,
    pub provider_model_id: String,
    pub created_at: i64,
    pub updated_at: i64,
}

impl UpstreamModel {
    pub fn validate(&self) -> Result<(), InvalidField> {
        require_text("model", &self.model, 256)?;
        require_text("upstream_id", &self.upstream_id, 128)?;
        require_text("provider_model_id", &self.provider_model_id, 256)
    }
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewUpstreamModel {
    pub model: String,
    pub upstream_id: String,
    /// Defaults to `model`.
    #[serde(default)]
    pub provider_model_id: Option<String>,
}

impl NewUpstreamModel {
    pub fn into_model(self, id: String, now: i64) -> Result<UpstreamModel, InvalidField> {
        let m = UpstreamModel {
            id,
            provider_model_id: self.provider_model_id.unwrap_or_else(|| self.model.clone()),
            model: self.model,
            upstream_id: self.upstream_id,
            created_at: now,
            updated_at: now,
        };
        m.validate()?;
        Ok(m)
    }
}

#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpstreamModelPatch {
    pub model: Option<String>,
    pub upstream_id: Option<String>,
    pub provider_model_id: Option<String>,
}

impl UpstreamModelPatch {
    pub fn apply(self, m: &mut UpstreamModel, now: i64) -> Result<(), InvalidField> {
        set(&mut m.model, self.model);
        set(&mut m.upstream_id, self.upstream_id);
        set(&mut m.provider_model_id, self.provider_model_id);
        m.updated_at = now;
        m.validate()
    }
}

// ---------------------------------------------------------------------------------------------
// Key reservations (keys configured outside the database)
// ---------------------------------------------------------------------------------------------

/// A reservation of an upstream key known only by its hash (a YAML or environment key).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct KeyReservation {
    /// SHA-256 (hex) of the key.
    pub key_hash: String,
    /// Masked, e.g. `sk-ab…yz`.
    pub hint: String,
    pub min_role: Role,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A URL serialised with its password masked.
fn masked_url<S: serde::Serializer>(url: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&super::mask_url_password(url))
}
