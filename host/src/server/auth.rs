//! Authentication on the inference routes and the upstream groups a caller may reach.
//!
//! The route decides the mode (see [`RouteAuth`]). Secrets are compared as SHA-256 digests in
//! constant time and never logged; a failure is a 401 in the client's own protocol.

use std::sync::Arc;

use axum::http::{HeaderMap, header};
use sha2::{Digest, Sha256};

use crate::config::DEFAULT_GROUP;
use crate::entity::Role;
use crate::store::Snapshot;

use super::caller::presented_key;
use crate::inbound_routes::{InboundRoute, RouteAuth};

/// Who passed authentication, as far as routing cares.
#[derive(Debug, Clone, Default)]
pub struct Principal {
    /// The consumer whose key was presented (consumer-key routes only).
    pub consumer_id: Option<String>,
    pub consumer_name: Option<String>,
    pub key_id: Option<String>,
    /// The caller's tier for reserved upstream keys; `None` (unrestricted) without a consumer.
    pub role: Option<Role>,
    /// The upstream groups this caller may reach, sorted; never empty unless the constraints
    /// exclude each other.
    pub groups: Arc<[String]>,
    /// The groups of the consumer whose key was presented (the `consumer_group` scope of
    /// rate limits); empty without a consumer.
    pub consumer_groups: Arc<[String]>,
    /// On pass-through routes, the client's own credential, sent upstream instead of the route's.
    pub upstream_credential: Option<String>,
    /// Presented the admin token, or a key of an admin consumer.
    pub admin: bool,
}

/// Why a request is not let in. The message never contains the presented secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error(
        "this route needs an API key: send `Authorization: Bearer <key>` or `x-api-key: <key>`"
    )]
    Missing,
    #[error("the API key is not valid for this route")]
    InvalidToken,
    #[error("{0}")]
    Key(crate::store::KeyRejection),
}

/// Equality of two secrets' digests that takes the same time wherever they differ.
pub fn digest_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The token of an `Authorization: Bearer <token>` header (scheme case-insensitive, token trimmed).
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Whether the request's bearer is `admin_token` (the configured one; `None`: never). Compared as
/// SHA-256 digests, so the time taken does not depend on how much of the token matched.
pub fn presents_admin_token(admin_token: Option<&str>, headers: &HeaderMap) -> bool {
    let (Some(expected), Some(given)) = (admin_token, bearer(headers)) else {
        return false;
    };
    digest_eq(
        &Sha256::digest(expected.as_bytes()),
        &Sha256::digest(given.as_bytes()),
    )
}

/// The groups left by intersecting every non-empty constraint; `[default]` when none is given.
pub fn allowed_groups(constraints: &[&[String]]) -> Arc<[String]> {
    let mut given = constraints.iter().filter(|c| !c.is_empty());
    let Some(first) = given.next() else {
        return Arc::from(vec![DEFAULT_GROUP.to_owned()]);
    };
    let mut groups: Vec<String> = first.to_vec();
    for c in given {
        groups.retain(|g| c.contains(g));
    }
    groups.sort();
    groups.dedup();
    Arc::from(groups)
}

/// Authenticates a request on `route`. `admin_token` is the configured admin token, which is
/// accepted on every route that checks credentials.
pub fn authenticate(
    route: &InboundRoute,
    headers: &HeaderMap,
    snapshot: &Snapshot,
    admin_token: Option<&str>,
    now_s: i64,
) -> Result<Principal, AuthError> {
    let route_only = || Principal {
        groups: allowed_groups(&[&route.groups]),
        ..Principal::default()
    };
    let presented = presented_key(headers);
    match &route.auth {
        RouteAuth::Disabled => return Ok(route_only()),
        RouteAuth::Passthrough => {
            let token = presented.ok_or(AuthError::Missing)?;
            return Ok(Principal {
                upstream_credential: Some(token.to_owned()),
                ..route_only()
            });
        }
        _ => {}
    }
    let token = presented.ok_or(AuthError::Missing)?;
    let digest = Sha256::digest(token.as_bytes());
    if let Some(admin) = admin_token
        && digest_eq(&digest, &Sha256::digest(admin.as_bytes()))
    {
        return Ok(Principal {
            admin: true,
            role: Some(Role::Admin),
            ..route_only()
        });
    }
    match &route.auth {
        RouteAuth::LegacyBearer(hashes) => {
            let hex = hex::encode(digest);
            // Compare against every token so the time does not say which one (or none) matched.
            let matched = hashes.iter().fold(false, |hit, h| {
                digest_eq(h.as_bytes(), hex.as_bytes()) | hit
            });
            if matched {
                Ok(route_only())
            } else {
                Err(AuthError::InvalidToken)
            }
        }
        _ => {
            let found = snapshot
                .authenticate(token, now_s)
                .map_err(AuthError::Key)?;
            Ok(Principal {
                consumer_id: Some(found.consumer.id.clone()),
                consumer_name: Some(found.consumer.name.clone()),
                key_id: Some(found.key.id.clone()),
                role: Some(found.consumer.role),
                groups: allowed_groups(&[&route.groups, &found.consumer.groups, &found.key.groups]),
                consumer_groups: Arc::from(found.consumer.groups.as_slice()),
                upstream_credential: None,
                admin: found.consumer.role == Role::Admin,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(groups: &[&str]) -> Vec<String> {
        groups.iter().map(|g| (*g).to_owned()).collect()
    }

    #[test]
    fn group_intersection_treats_empty_as_unrestricted() {
        let none: Vec<String> = vec![];
        assert_eq!(&*allowed_groups(&[&none, &none, &none]), ["default"]);
        assert_eq!(
            &*allowed_groups(&[&v(&["a", "b"]), &none, &none]),
            ["a", "b"]
        );
        assert_eq!(
            &*allowed_groups(&[&v(&["a", "b"]), &v(&["b", "c"]), &none]),
            ["b"]
        );
        assert_eq!(
            &*allowed_groups(&[&none, &v(&["c", "b"]), &v(&["b"])]),
            ["b"]
        );
        assert!(allowed_groups(&[&v(&["a"]), &v(&["b"]), &none]).is_empty());
    }

    #[test]
    fn digest_comparison() {
        assert!(digest_eq(b"abc", b"abc"));
        assert!(!digest_eq(b"abc", b"abd"));
        assert!(!digest_eq(b"abc", b"ab"));
    }
}
