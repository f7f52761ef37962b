//! Who may use the management API: the holder of the admin token, or a consumer with role `admin`
//! presenting one of its active keys.

use std::sync::Arc;

use axum::Json;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::entity::{Role, now};
use crate::gateway::Gateway;
use crate::server::admin::{AdminDenied, is_admin};

/// An authorised management caller. Use it as a handler argument to guard the handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminCaller {
    /// Presented the configured admin token.
    Token,
    /// Presented an active key of an enabled consumer whose role is `admin`.
    Consumer { consumer_id: String, key_id: String },
}

/// Why a caller may not use the management API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// No admin token is configured and no admin consumer key was presented.
    #[error("{}", AdminDenied::NotConfigured)]
    NotConfigured,
    #[error(
        "the management API needs `Authorization: Bearer <admin token>` or the API key of a consumer with role admin"
    )]
    Unauthorized,
}

impl IntoResponse for Denied {
    fn into_response(self) -> Response {
        let status = match self {
            Denied::NotConfigured => StatusCode::FORBIDDEN,
            Denied::Unauthorized => StatusCode::UNAUTHORIZED,
        };
        (
            status,
            Json(serde_json::json!({
                "error": { "message": self.to_string(), "type": "authentication_error", "param": null, "code": status.as_u16() }
            })),
        )
            .into_response()
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Decides whether the request may manage the gateway. Consumer keys are looked up in the database,
/// not the snapshot, so a key revoked a moment ago in another process is refused at once.
pub async fn authorize(gateway: &Gateway, headers: &HeaderMap) -> Result<AdminCaller, Denied> {
    if is_admin(gateway, headers) {
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
            Err(e) => tracing::warn!("management API: cannot check a consumer key: {e}"),
        }
    }
    if gateway.config.server.admin_token.is_none() {
        Err(Denied::NotConfigured)
    } else {
        Err(Denied::Unauthorized)
    }
}

impl FromRequestParts<Arc<Gateway>> for AdminCaller {
    type Rejection = Denied;

    async fn from_request_parts(
        parts: &mut Parts,
        gateway: &Arc<Gateway>,
    ) -> Result<Self, Self::Rejection> {
        authorize(gateway, &parts.headers).await
    }
}
