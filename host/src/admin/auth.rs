//! The one rule for admin endpoints — every path under `/admin/`, `GET /routing` unless
//! `routing.public_routing_endpoint` is set, and `GET /health/deep` unless
//! `routing.public_health_deep` is set:
//!
//! **the caller presents `Authorization: Bearer <admin token>` (`server.admin_token` or
//! `$SWITCHYARD_ADMIN_TOKEN`), or `Authorization: Bearer <key>` with an active key of an enabled
//! consumer whose role is `admin`.**
//!
//! Anything else is a 401; when no admin token is configured and no admin consumer key was
//! presented it is a 403 that says how to set a token. Handlers take an [`AdminCaller`] argument
//! (or call [`authorize`]) and never check credentials themselves.
//!
//! The inference routes have their own rules (`server/auth.rs`); `X-Route-Pin` is honoured for the
//! admin token there, or an admin consumer's key on a route that checks consumer keys.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use axum::http::request::Parts;

use super::error::ApiError;
use crate::entity::{Role, now};
use crate::gateway::Gateway;
use crate::server::auth::{bearer, presents_admin_token};

/// An authorised admin caller. Use it as a handler argument to guard the handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminCaller {
    /// Presented the configured admin token.
    Token,
    /// Presented an active key of an enabled consumer whose role is `admin`.
    Consumer { consumer_id: String, key_id: String },
}

/// Why a caller may not use an admin endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// No admin token is configured and no admin consumer key was presented (403).
    #[error(
        "admin endpoints are disabled: set server.admin_token in the config or the SWITCHYARD_ADMIN_TOKEN environment variable"
    )]
    NotConfigured,
    /// Neither the admin token nor an admin consumer's key was presented (401).
    #[error(
        "admin endpoints need `Authorization: Bearer <admin token>` or the API key of a consumer with role admin"
    )]
    Unauthorized,
}

/// Applies the rule of this module. Consumer keys are looked up in the database, not the snapshot,
/// so a key revoked a moment ago in another process is refused at once.
pub async fn authorize(gateway: &Gateway, headers: &HeaderMap) -> Result<AdminCaller, Denied> {
    let admin_token = gateway.config.server.admin_token.as_deref();
    if presents_admin_token(admin_token, headers) {
        return Ok(AdminCaller::Token);
    }
    // Only strings shaped like consumer keys cost a database lookup.
    if let (Some(secret), Some(store)) = (
        bearer(headers).filter(|s| s.starts_with("sk-sy-")),
        &gateway.store,
    ) {
        match store.config().find_consumer_key(secret).await {
            Ok(Some((consumer, key)))
                if key.is_active(now()) && !consumer.disabled && consumer.role == Role::Admin =>
            {
                return Ok(AdminCaller::Consumer {
                    consumer_id: consumer.id,
                    key_id: key.id,
                });
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("admin API: cannot check a consumer key: {e}"),
        }
    }
    if admin_token.is_none() {
        Err(Denied::NotConfigured)
    } else {
        Err(Denied::Unauthorized)
    }
}

impl FromRequestParts<Arc<Gateway>> for AdminCaller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        gateway: &Arc<Gateway>,
    ) -> Result<Self, Self::Rejection> {
        Ok(authorize(gateway, &parts.headers).await?)
    }
}
