//! The one error type of the admin API ([`ApiError`]), answered in OpenAI's error shape, and the
//! JSON body extractor that turns malformed bodies into 422s naming the field's path.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;
use utoipa::ToSchema;

use super::auth::Denied;
use crate::store::StoreError;

/// `{"error": {...}}`, as every error of the API is shaped.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    pub message: String,
    /// `invalid_request_error`, `authentication_error` or `api_error`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The offending field's path, when there is one.
    pub param: Option<String>,
    /// `validation_failed`, `not_found`, `conflict`, `store_unavailable`, ...; 401 or 403 for
    /// authentication errors.
    pub code: ErrorCode,
}

/// The `code` of an error: a word, except that authentication errors have always carried their
/// HTTP status as a number, and clients may rely on that.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum ErrorCode {
    Word(String),
    Status(u16),
}

/// Why an admin request failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The caller may not use admin endpoints (401, or 403 when they are off).
    #[error(transparent)]
    Denied(#[from] Denied),
    /// A store operation failed; its variant decides the status (422, 404, 409, 503, 500).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The body is not valid JSON for the resource; `param` is the field's path.
    #[error("{message}")]
    Body {
        param: Option<String>,
        message: String,
    },
    /// Something the path names does not exist (404).
    #[error("{0}")]
    NotFound(String),
    /// The gateway runs without a database.
    #[error("the management API needs a database (database.url)")]
    NoStore,
}

fn error(
    status: StatusCode,
    kind: &str,
    param: Option<String>,
    code: &str,
    message: String,
) -> Response {
    respond(
        status,
        kind,
        param,
        ErrorCode::Word(code.to_owned()),
        message,
    )
}

fn respond(
    status: StatusCode,
    kind: &str,
    param: Option<String>,
    code: ErrorCode,
    message: String,
) -> Response {
    let body = ErrorBody {
        error: ErrorDetail {
            message,
            kind: kind.to_owned(),
            param,
            code,
        },
    };
    (status, Json(body)).into_response()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let message = self.to_string();
        match self {
            ApiError::Denied(denied) => {
                let status = match denied {
                    Denied::NotConfigured => StatusCode::FORBIDDEN,
                    Denied::Unauthorized => StatusCode::UNAUTHORIZED,
                };
                respond(
                    status,
                    "authentication_error",
                    None,
                    ErrorCode::Status(status.as_u16()),
                    message,
                )
            }
            ApiError::NotFound(_) => error(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                None,
                "not_found",
                message,
            ),
            ApiError::Body { param, .. } => error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request_error",
                param,
                "validation_failed",
                message,
            ),
            ApiError::NoStore => error(
                StatusCode::SERVICE_UNAVAILABLE,
                "api_error",
                None,
                "store_unavailable",
                message,
            ),
            ApiError::Store(e) => match e {
                StoreError::Invalid { field, .. } => error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_request_error",
                    Some(field),
                    "validation_failed",
                    message,
                ),
                StoreError::NotFound { .. } => error(
                    StatusCode::NOT_FOUND,
                    "invalid_request_error",
                    None,
                    "not_found",
                    message,
                ),
                StoreError::Conflict { field, .. } => error(
                    StatusCode::CONFLICT,
                    "invalid_request_error",
                    field,
                    "conflict",
                    message,
                ),
                StoreError::Connect { .. } | StoreError::Database { .. } => {
                    tracing::warn!("management API: {message}");
                    error(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "api_error",
                        None,
                        "store_unavailable",
                        message,
                    )
                }
                StoreError::UnsupportedUrl(_)
                | StoreError::Migrate { .. }
                | StoreError::Corrupt { .. } => {
                    tracing::warn!("management API: {message}");
                    error(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "api_error",
                        None,
                        "store_error",
                        message,
                    )
                }
            },
        }
    }
}

/// A JSON body. Unlike `axum::Json` it ignores the content type (like the rest of the gateway) and
/// rejects bad input with a 422 whose `param` is the path of the field at fault.
#[derive(Debug)]
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(IntoResponse::into_response)?;
        parse(&bytes).map(Body).map_err(IntoResponse::into_response)
    }
}

/// Deserialises `bytes`, naming the field at fault: a wrong type at `groups[1]`, or the unknown or
/// missing field itself (serde reports those at the enclosing object).
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(&mut de).map_err(|err| {
        let path = err.path().to_string();
        let mut message = err.into_inner().to_string();
        // serde_json appends " at line L column C"; the field path says more.
        if let Some(cut) = message.find(" at line ") {
            message.truncate(cut);
        }
        let named = ["unknown field `", "missing field `"]
            .iter()
            .find_map(|lead| message.strip_prefix(lead))
            .and_then(|rest| rest.split('`').next())
            .map(str::to_owned);
        // The path already ends at an unknown field, but stops at the parent of a missing one.
        let param = match (path.as_str(), named) {
            (".", Some(field)) => Some(field),
            (".", None) => None,
            (p, Some(field)) if p != field && !p.ends_with(&format!(".{field}")) => {
                Some(format!("{p}.{field}"))
            }
            (p, _) => Some(p.to_owned()),
        };
        let message = match &param {
            Some(p) => format!("{p}: {message}"),
            None => format!("invalid JSON body: {message}"),
        };
        ApiError::Body { param, message }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entity::{NewRoute, NewUpstream};

    fn param_of<T: DeserializeOwned + std::fmt::Debug>(body: &str) -> (Option<String>, String) {
        match parse::<T>(body.as_bytes()).unwrap_err() {
            ApiError::Body { param, message } => (param, message),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn body_errors_name_the_field() {
        let (param, message) = param_of::<NewRoute>(r#"{"path_prefix": "/x"}"#);
        assert_eq!(param.as_deref(), Some("name"));
        assert_eq!(message, "name: missing field `name`");
        let (param, _) = param_of::<NewRoute>(r#"{"name": "x", "path_prefix": "/x", "nope": 1}"#);
        assert_eq!(param.as_deref(), Some("nope"));
        let (param, message) =
            param_of::<NewRoute>(r#"{"name": "x", "path_prefix": "/x", "groups": ["a", 2]}"#);
        assert_eq!(param.as_deref(), Some("groups[1]"), "{message}");
        let (param, message) = param_of::<NewUpstream>(
            r#"{"provider_id": "p", "base_url": "http://x", "capabilities": ["teleport"]}"#,
        );
        assert_eq!(param.as_deref(), Some("capabilities[0]"), "{message}");
        let (param, message) = param_of::<NewRoute>("not json");
        assert_eq!(param, None);
        assert!(message.starts_with("invalid JSON body: "), "{message}");
    }
}
