//! The configuration entities kept in the database, their inputs (create bodies) and patches, and
//! their validation. The same types are the management API's resources, so a field's serde and
//! schema attributes here are its public JSON shape.
//!
//! Timestamps are Unix seconds. Secrets never leave through `Serialize` or `Debug`: consumer keys are
//! kept as hashes, route legacy tokens as hashes with a masked hint, upstream keys as a [`Secret`]
//! that prints masked.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use utoipa::ToSchema;

use super::StoreError;

/// Unix time in seconds.
pub fn now() -> i64 {
    i64::try_from(crate::clock::unix_secs()).unwrap_or(i64::MAX)
}

// ---------------------------------------------------------------------------------------------
// Enumerations
// ---------------------------------------------------------------------------------------------

/// A consumer's role. Anything unknown reads as `free`, so a typo never grants more.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    #[default]
    Free,
    Pro,
    Internal,
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Free => "free",
            Role::Pro => "pro",
            Role::Internal => "internal",
            Role::Admin => "admin",
        }
    }

    /// Normalising parse: unknown or differently spelled roles are `free`.
    pub fn parse(s: &str) -> Role {
        match s.trim().to_ascii_lowercase().as_str() {
            "pro" => Role::Pro,
            "internal" => Role::Internal,
            "admin" => Role::Admin,
            _ => Role::Free,
        }
    }
}

impl<'de> Deserialize<'de> for Role {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Role, D::Error> {
        Ok(Role::parse(&String::deserialize(d)?))
    }
}

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

// ---------------------------------------------------------------------------------------------
// Secrets
// ---------------------------------------------------------------------------------------------

/// A secret that must be stored as is (it is sent upstream). `Debug` and `Serialize` show it
/// masked; only [`Secret::expose`] gives it out.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(secret: impl Into<String>) -> Secret {
        Secret(secret.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn masked(&self) -> String {
        mask(&self.0)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.masked())
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.masked())
    }
}

/// `sk-ab…yz`: enough to tell keys apart, too little to use one. Short secrets show nothing, as
/// seven of their characters would be most of them.
pub fn mask(secret: &str) -> String {
    let chars: Vec<char> = secret.chars().collect();
    if chars.len() < 12 {
        return "…".to_owned();
    }
    let head: String = chars[..5].iter().collect();
    let tail: String = chars[chars.len() - 2..].iter().collect();
    format!("{head}…{tail}")
}

/// SHA-256, hex. Keys are long random strings, so a fast hash is enough: there is nothing to
/// brute-force that is easier than the key itself.
pub fn hash_secret(secret: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// A new consumer API key: `sk-sy-` and 40 random alphanumerics (~238 bits).
pub fn generate_consumer_secret() -> String {
    use rand::Rng;
    let body: String = rand::rng()
        .sample_iter(rand::distr::Alphanumeric)
        .take(40)
        .map(char::from)
        .collect();
    format!("sk-sy-{body}")
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

// ---------------------------------------------------------------------------------------------
// Validation helpers
// ---------------------------------------------------------------------------------------------

fn invalid(field: impl Into<String>, message: impl Into<String>) -> StoreError {
    StoreError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

fn require_text(field: &str, value: &str, max: usize) -> Result<(), StoreError> {
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

fn require_list(field: &str, values: &[String]) -> Result<(), StoreError> {
    for (i, v) in values.iter().enumerate() {
        require_text(&format!("{field}[{i}]"), v, 128)?;
    }
    Ok(())
}

fn require_weight(field: &str, weight: f64) -> Result<(), StoreError> {
    if !weight.is_finite() || weight < 0.0 {
        return Err(invalid(
            field,
            format!("must be a number >= 0, got {weight}"),
        ));
    }
    Ok(())
}

/// Plugin and provider names: identifiers people type in URLs and configs.
fn require_name(field: &str, value: &str) -> Result<(), StoreError> {
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

// ---------------------------------------------------------------------------------------------
// Routes
// ---------------------------------------------------------------------------------------------

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

    pub fn validate(&self) -> Result<(), StoreError> {
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
}

impl NewRoute {
    pub fn into_route(self, id: String, now: i64) -> Result<Route, StoreError> {
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

fn legacy_tokens(tokens: &[String]) -> Result<Vec<LegacyToken>, StoreError> {
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
    pub fn apply(self, route: &mut Route, now: i64) -> Result<(), StoreError> {
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

fn set<T>(slot: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *slot = v;
    }
}

// ---------------------------------------------------------------------------------------------
// Plugin configs
// ---------------------------------------------------------------------------------------------

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
    pub fn validate(&self) -> Result<(), StoreError> {
        require_name("plugin", &self.plugin)?;
        if !self.config.is_object() {
            return Err(invalid("config", "must be a JSON object"));
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
    ) -> Result<PluginConfig, StoreError> {
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
    pub fn apply(self, p: &mut PluginConfig, now: i64) -> Result<(), StoreError> {
        set(&mut p.plugin, self.plugin);
        set(&mut p.config, self.config);
        set(&mut p.enabled, self.enabled);
        p.updated_at = now;
        p.validate()
    }
}

// ---------------------------------------------------------------------------------------------
// Consumers and their keys
// ---------------------------------------------------------------------------------------------

/// Someone who calls the gateway with an API key.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Consumer {
    pub id: String,
    pub name: String,
    pub groups: Vec<String>,
    pub role: Role,
    pub disabled: bool,
    pub created_at: i64,
    pub updated_at: i64,
}

impl Consumer {
    pub fn validate(&self) -> Result<(), StoreError> {
        require_text("name", &self.name, 200)?;
        require_list("groups", &self.groups)
    }
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewConsumer {
    /// Unique.
    pub name: String,
    #[serde(default)]
    pub groups: Vec<String>,
    /// `free`, `pro`, `internal` or `admin`; anything else is `free`.
    #[serde(default)]
    pub role: Role,
    #[serde(default)]
    pub disabled: bool,
}

impl NewConsumer {
    pub fn into_consumer(self, id: String, now: i64) -> Result<Consumer, StoreError> {
        let c = Consumer {
            id,
            name: self.name,
            groups: self.groups,
            role: self.role,
            disabled: self.disabled,
            created_at: now,
            updated_at: now,
        };
        c.validate()?;
        Ok(c)
    }
}

#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConsumerPatch {
    pub name: Option<String>,
    pub groups: Option<Vec<String>>,
    pub role: Option<Role>,
    pub disabled: Option<bool>,
}

impl ConsumerPatch {
    pub fn apply(self, c: &mut Consumer, now: i64) -> Result<(), StoreError> {
        set(&mut c.name, self.name);
        set(&mut c.groups, self.groups);
        set(&mut c.role, self.role);
        set(&mut c.disabled, self.disabled);
        c.updated_at = now;
        c.validate()
    }
}

/// A consumer's API key. Only its hash is stored; the secret is returned once, at creation.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ConsumerKey {
    pub id: String,
    pub consumer_id: String,
    /// SHA-256 (hex) of the secret; never serialised.
    #[serde(skip)]
    pub key_hash: String,
    /// The secret's first 8 characters, to recognise it.
    pub prefix: String,
    pub groups: Vec<String>,
    pub expires_at: Option<i64>,
    pub revoked_at: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
}

impl ConsumerKey {
    /// Neither revoked nor expired at `now` (Unix seconds).
    pub fn is_active(&self, now: i64) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|at| at > now)
    }

    pub fn validate(&self) -> Result<(), StoreError> {
        require_list("groups", &self.groups)?;
        if self.expires_at.is_some_and(|at| at <= 0) {
            return Err(invalid("expires_at", "must be a Unix time in seconds"));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewConsumerKey {
    #[serde(default)]
    pub groups: Vec<String>,
    /// Unix seconds; must be in the future.
    #[serde(default)]
    pub expires_at: Option<i64>,
}

impl NewConsumerKey {
    /// The key row and its secret (to be shown once).
    pub fn into_key(
        self,
        id: String,
        consumer_id: String,
        now: i64,
    ) -> Result<(ConsumerKey, String), StoreError> {
        if self.expires_at.is_some_and(|at| at <= now) {
            return Err(invalid("expires_at", "must be in the future"));
        }
        let secret = generate_consumer_secret();
        let key = ConsumerKey {
            id,
            consumer_id,
            key_hash: hash_secret(&secret),
            prefix: secret.chars().take(8).collect(),
            groups: self.groups,
            expires_at: self.expires_at,
            revoked_at: None,
            created_at: now,
            updated_at: now,
        };
        key.validate()?;
        Ok((key, secret))
    }
}

#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConsumerKeyPatch {
    pub groups: Option<Vec<String>>,
    /// Unix seconds, or `null` for no expiry.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<i64>)]
    pub expires_at: Option<Option<i64>>,
    /// `true` revokes the key for good; a revoked key cannot be restored.
    pub revoked: Option<bool>,
}

impl ConsumerKeyPatch {
    pub fn apply(self, k: &mut ConsumerKey, now: i64) -> Result<(), StoreError> {
        set(&mut k.groups, self.groups);
        set(&mut k.expires_at, self.expires_at);
        match self.revoked {
            Some(true) if k.revoked_at.is_none() => k.revoked_at = Some(now),
            Some(false) if k.revoked_at.is_some() => {
                return Err(invalid("revoked", "a revoked key cannot be restored"));
            }
            _ => {}
        }
        k.updated_at = now;
        k.validate()
    }
}

/// A key and the secret it was made from: the only time the secret is shown.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CreatedConsumerKey {
    #[serde(flatten)]
    pub key: ConsumerKey,
    /// The API key itself. Store it now: it is not shown again.
    pub secret: String,
}

// ---------------------------------------------------------------------------------------------
// Providers, upstreams, upstream keys, upstream models
// ---------------------------------------------------------------------------------------------

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
    pub fn validate(&self) -> Result<(), StoreError> {
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
    pub fn into_provider(self, id: String, now: i64) -> Result<Provider, StoreError> {
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
    pub fn apply(self, p: &mut Provider, now: i64) -> Result<(), StoreError> {
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
    pub base_url: String,
    pub group: String,
    /// Higher is tried first.
    pub priority: i64,
    pub lb_weight: f64,
    /// Overrides the provider's default capabilities; `null` inherits them.
    pub capabilities: Option<Vec<Capability>>,
    pub enabled: bool,
    pub created_at: i64,
    pub updated_at: i64,
}

impl Upstream {
    pub fn validate(&self) -> Result<(), StoreError> {
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
}

impl NewUpstream {
    pub fn into_upstream(self, id: String, now: i64) -> Result<Upstream, StoreError> {
        let u = Upstream {
            id,
            provider_id: self.provider_id,
            base_url: self.base_url,
            group: self.group,
            priority: self.priority,
            lb_weight: self.lb_weight,
            capabilities: self.capabilities.map(dedup),
            enabled: self.enabled,
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
}

impl UpstreamPatch {
    pub fn apply(self, u: &mut Upstream, now: i64) -> Result<(), StoreError> {
        set(&mut u.provider_id, self.provider_id);
        set(&mut u.base_url, self.base_url);
        set(&mut u.group, self.group);
        set(&mut u.priority, self.priority);
        set(&mut u.lb_weight, self.lb_weight);
        if let Some(caps) = self.capabilities {
            u.capabilities = caps.map(dedup);
        }
        set(&mut u.enabled, self.enabled);
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
    pub fn validate(&self) -> Result<(), StoreError> {
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
    ) -> Result<UpstreamKey, StoreError> {
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
    pub fn apply(self, k: &mut UpstreamKey, now: i64) -> Result<(), StoreError> {
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
    pub fn validate(&self) -> Result<(), StoreError> {
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
    pub fn into_model(self, id: String, now: i64) -> Result<UpstreamModel, StoreError> {
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
    pub fn apply(self, m: &mut UpstreamModel, now: i64) -> Result<(), StoreError> {
        set(&mut m.model, self.model);
        set(&mut m.upstream_id, self.upstream_id);
        set(&mut m.provider_model_id, self.provider_model_id);
        m.updated_at = now;
        m.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_roles_are_free() {
        for (raw, role) in [
            ("admin", Role::Admin),
            ("ADMIN ", Role::Admin),
            ("pro", Role::Pro),
            ("internal", Role::Internal),
            ("root", Role::Free),
            ("", Role::Free),
        ] {
            let parsed: Role = serde_json::from_value(serde_json::json!(raw)).unwrap();
            assert_eq!(parsed, role, "{raw:?}");
        }
    }

    #[test]
    fn secrets_are_masked_in_json_and_debug() {
        let s = Secret::new("sk-abcdefghijklmnopqrstuvwxyz");
        assert_eq!(s.masked(), "sk-ab…yz");
        assert_eq!(serde_json::to_value(&s).unwrap(), "sk-ab…yz");
        assert_eq!(format!("{s:?}"), "sk-ab…yz");
        assert_eq!(mask("short"), "…");
    }

    #[test]
    fn consumer_secrets_are_random_and_prefixed() {
        let a = generate_consumer_secret();
        let b = generate_consumer_secret();
        assert!(a.starts_with("sk-sy-") && a.len() == 46, "{a}");
        assert_ne!(a, b);
        assert_eq!(hash_secret(&a).len(), 64);
    }

    #[test]
    fn patches_tell_null_from_absent() {
        let p: ConsumerKeyPatch = serde_json::from_str(r#"{"expires_at": null}"#).unwrap();
        assert_eq!(p.expires_at, Some(None));
        let p: ConsumerKeyPatch = serde_json::from_str("{}").unwrap();
        assert_eq!(p.expires_at, None);
    }

    #[test]
    fn route_validation_names_the_field() {
        let new: NewRoute =
            serde_json::from_value(serde_json::json!({"name": "r", "path_prefix": "v1"})).unwrap();
        let err = new.into_route("rt_1".into(), 1).unwrap_err();
        assert!(
            matches!(&err, StoreError::Invalid { field, .. } if field == "path_prefix"),
            "{err}"
        );
        assert_eq!(err.to_string(), "path_prefix: must start with /");
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
