//! Consumers: who calls the gateway, with which role, and their API keys.

use serde::{Deserialize, Deserializer, Serialize};
use utoipa::ToSchema;

use super::{
    InvalidField, double_option, generate_consumer_secret, hash_secret, invalid, require_list,
    require_text, set,
};

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
    pub fn validate(&self) -> Result<(), InvalidField> {
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
    pub fn into_consumer(self, id: String, now: i64) -> Result<Consumer, InvalidField> {
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
    pub fn apply(self, c: &mut Consumer, now: i64) -> Result<(), InvalidField> {
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

    pub fn validate(&self) -> Result<(), InvalidField> {
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
    ) -> Result<(ConsumerKey, String), InvalidField> {
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
    pub fn apply(self, k: &mut ConsumerKey, now: i64) -> Result<(), InvalidField> {
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
    fn patches_tell_null_from_absent() {
        let p: ConsumerKeyPatch = serde_json::from_str(r#"{"expires_at": null}"#).unwrap();
        assert_eq!(p.expires_at, Some(None));
        let p: ConsumerKeyPatch = serde_json::from_str("{}").unwrap();
        assert_eq!(p.expires_at, None);
    }
}
