//! The table of inbound routes: the path prefix a request arrives on decides how its caller
//! authenticates, which upstream groups it may reach and how many upstreams it may try; the rest of
//! the path names the [`Endpoint`].
//!
//! Routes come from the YAML (`routes:`) and the database, and become the same runtime type. When
//! neither declares one, a single implicit route with prefix `/` applies, authenticated as
//! `server.default_auth` says. The gateway builds the table from its config and database snapshot
//! ([`RouteSet::build`]); the HTTP edge (`server/`) looks requests up in it. It sits below both, so
//! neither has to import the other for it.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::config::{Config, DefaultAuth};
use crate::entity::{
    ProtocolTransformation, RATE_LIMIT_PLUGIN, RateLimitConfig, Route, RoutePlugins,
};
use crate::store::Snapshot;

/// How a route authenticates callers, resolved once from its fields in their fixed priority:
/// `disable_auth`, then `passthrough_auth_token`, then non-empty `legacy_bearer_auth_tokens`,
/// then consumer API keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteAuth {
    /// Anyone may call.
    Disabled,
    /// The caller's bearer is not checked here; it is sent upstream as the credential.
    Passthrough,
    /// One of these tokens (SHA-256, hex) must be presented.
    LegacyBearer(Vec<String>),
    /// A consumer API key from the database.
    ConsumerKeys,
}

impl RouteAuth {
    fn of(route: &Route) -> RouteAuth {
        if route.disable_auth {
            RouteAuth::Disabled
        } else if route.passthrough_auth_token {
            RouteAuth::Passthrough
        } else if !route.legacy_bearer_auth_tokens.is_empty() {
            RouteAuth::LegacyBearer(
                route
                    .legacy_bearer_auth_tokens
                    .iter()
                    .map(|t| t.sha256.clone())
                    .collect(),
            )
        } else {
            RouteAuth::ConsumerKeys
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            RouteAuth::Disabled => "disabled",
            RouteAuth::Passthrough => "passthrough",
            RouteAuth::LegacyBearer(_) => "legacy_bearer",
            RouteAuth::ConsumerKeys => "consumer_keys",
        }
    }
}

/// Where a route was declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteSource {
    Config,
    Database,
    /// No route is declared anywhere: `/` with `server.default_auth`.
    Implicit,
}

/// A route as the request path uses it.
#[derive(Debug, Clone)]
pub struct InboundRoute {
    pub id: String,
    pub name: String,
    pub tenant_id: String,
    pub path_prefix: String,
    pub enabled: bool,
    pub auth: RouteAuth,
    /// `[]`: the route does not restrict groups.
    pub groups: Vec<String>,
    pub max_attempts: usize,
    pub protocol_transformation: ProtocolTransformation,
    /// The route's enabled plugin configs, by plugin name (from `plugin_configs`, or the YAML
    /// route's `plugins`).
    pub plugins: BTreeMap<String, serde_json::Value>,
    /// The `rate-limit` plugin's config, read once here. `Err` when a stored row does not read
    /// (one written around the admin API, which checks it): the route then refuses requests
    /// rather than serve them unlimited.
    pub rate_limit: Option<Result<Arc<RateLimitConfig>, String>>,
    pub source: RouteSource,
}

impl InboundRoute {
    fn from_route(
        route: &Route,
        source: RouteSource,
        plugins: BTreeMap<String, serde_json::Value>,
    ) -> InboundRoute {
        let rate_limit = plugins.get(RATE_LIMIT_PLUGIN).map(|config| {
            RateLimitConfig::from_value(config)
                .map(Arc::new)
                .map_err(|e| {
                    tracing::error!(
                        route = %route.name,
                        "the route's rate-limit config does not read ({e}); its requests are refused until it is fixed"
                    );
                    e.to_string()
                })
        });
        InboundRoute {
            id: route.id.clone(),
            name: route.name.clone(),
            tenant_id: route.tenant_id.clone(),
            path_prefix: route.path_prefix.clone(),
            enabled: route.enabled(),
            auth: RouteAuth::of(route),
            groups: route.groups.clone(),
            max_attempts: usize::try_from(route.max_attempts).unwrap_or(1).max(1),
            protocol_transformation: route.protocol_transformation_type,
            plugins,
            rate_limit,
            source,
        }
    }

    /// Whether `path` is under this route's prefix, on a segment boundary (`/team` takes
    /// `/team/v1/...` but not `/teams/...`).
    fn takes<'p>(&self, path: &'p str) -> Option<&'p str> {
        let rest = path.strip_prefix(self.path_prefix.as_str())?;
        if self.path_prefix.ends_with('/') {
            // The prefix's own slash starts the trimmed path.
            return Some(&path[self.path_prefix.len() - 1..]);
        }
        (rest.is_empty() || rest.starts_with('/')).then_some(rest)
    }
}

/// Every inbound route, longest prefix first.
#[derive(Debug, Clone)]
pub struct RouteSet {
    routes: Vec<InboundRoute>,
}

/// The result of matching a request path.
#[derive(Debug)]
pub enum RouteMatch<'a> {
    /// An enabled route took the path; `path` is what follows its prefix (always starting with `/`
    /// or empty).
    Route {
        route: &'a InboundRoute,
        path: &'a str,
    },
    /// The longest matching prefix belongs to a disabled route: 404, never a shorter prefix.
    Disabled(&'a InboundRoute),
    /// No prefix matches.
    None,
}

impl RouteSet {
    /// The routes of the config file and the database snapshot. A database route whose prefix a
    /// config route already uses is left out (the file wins) with a warning.
    pub fn build(config: &Config, snapshot: &Snapshot) -> RouteSet {
        let mut routes: Vec<InboundRoute> = config
            .routes
            .iter()
            .map(|r| {
                let plugins = config
                    .route_plugins
                    .get(&r.id)
                    .map(RoutePlugins::to_map)
                    .unwrap_or_default();
                InboundRoute::from_route(r, RouteSource::Config, plugins)
            })
            .collect();
        for r in snapshot.routes() {
            if config.routes.iter().any(|c| c.path_prefix == r.path_prefix) {
                tracing::warn!(
                    route = %r.name,
                    path_prefix = %r.path_prefix,
                    "a route in the config file has this prefix; the database route is ignored"
                );
                continue;
            }
            let plugins = snapshot
                .route_plugin_map(&r.id)
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.clone()))
                .collect();
            routes.push(InboundRoute::from_route(r, RouteSource::Database, plugins));
        }
        if routes.is_empty() {
            routes.push(InboundRoute {
                id: "implicit".into(),
                name: "implicit".into(),
                tenant_id: "default".into(),
                path_prefix: "/".into(),
                enabled: true,
                auth: match config.server.default_auth {
                    DefaultAuth::ConsumerKeys => RouteAuth::ConsumerKeys,
                    DefaultAuth::Disabled => RouteAuth::Disabled,
                },
                groups: Vec::new(),
                max_attempts: config.server.default_max_attempts,
                protocol_transformation: ProtocolTransformation::default(),
                plugins: BTreeMap::new(),
                rate_limit: None,
                source: RouteSource::Implicit,
            });
        }
        // Longest prefix first; an enabled route before a disabled one with the same prefix.
        routes.sort_by(|a, b| {
            b.path_prefix
                .len()
                .cmp(&a.path_prefix.len())
                .then_with(|| b.enabled.cmp(&a.enabled))
                .then_with(|| a.path_prefix.cmp(&b.path_prefix))
        });
        RouteSet { routes }
    }

    /// The route with the longest prefix that takes `path`.
    pub fn lookup<'a>(&'a self, path: &'a str) -> RouteMatch<'a> {
        for route in &self.routes {
            if let Some(rest) = route.takes(path) {
                return if route.enabled {
                    RouteMatch::Route { route, path: rest }
                } else {
                    RouteMatch::Disabled(route)
                };
            }
        }
        RouteMatch::None
    }

    pub fn routes(&self) -> &[InboundRoute] {
        &self.routes
    }

    /// The enabled routes that let callers in without any credential check.
    pub fn unauthenticated(&self) -> impl Iterator<Item = &InboundRoute> {
        self.routes
            .iter()
            .filter(|r| r.enabled && r.auth == RouteAuth::Disabled)
    }
}

/// What a trimmed path asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    ChatCompletions,
    Responses,
    Messages,
    CountTokens,
    Embeddings,
    Models,
}

impl Endpoint {
    /// The endpoint of a path after its route's prefix; `/v1` in front is optional, so a route
    /// `/team` serves `/team/v1/chat/completions` and a route `/team/v1` serves
    /// `/team/v1/chat/completions` too.
    pub fn of(path: &str) -> Option<Endpoint> {
        let path = path.trim_end_matches('/');
        let path = path.strip_prefix("/v1").unwrap_or(path);
        Some(match path {
            "/chat/completions" => Endpoint::ChatCompletions,
            "/responses" => Endpoint::Responses,
            "/messages" => Endpoint::Messages,
            "/messages/count_tokens" => Endpoint::CountTokens,
            "/embeddings" => Endpoint::Embeddings,
            "/models" => Endpoint::Models,
            _ => return None,
        })
    }

    /// The one method the endpoint answers.
    pub fn method(self) -> &'static str {
        match self {
            Endpoint::Models => "GET",
            _ => "POST",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entity::NewRoute;

    fn route(name: &str, prefix: &str, extra: serde_json::Value) -> Route {
        let mut body = serde_json::json!({ "name": name, "path_prefix": prefix });
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        let new: NewRoute = serde_json::from_value(body).unwrap();
        new.into_route(format!("id-{name}"), 1).unwrap()
    }

    fn config(routes: Vec<Route>, default_auth: DefaultAuth) -> Config {
        let mut c = Config::from_yaml(std::path::Path::new("t.yaml"), "", &|_| None).unwrap();
        c.routes = routes;
        c.server.default_auth = default_auth;
        c
    }

    fn name_of(set: &RouteSet, path: &'static str) -> Option<(String, String)> {
        match set.lookup(path) {
            RouteMatch::Route { route, path } => Some((route.name.clone(), path.to_owned())),
            RouteMatch::Disabled(r) => Some((format!("disabled:{}", r.name), String::new())),
            RouteMatch::None => None,
        }
    }

    #[test]
    fn longest_prefix_wins_on_segment_boundaries() {
        let set = RouteSet::build(
            &config(
                vec![
                    route("root", "/", serde_json::json!({})),
                    route("team", "/team", serde_json::json!({})),
                    route("team-v1", "/team/v1", serde_json::json!({})),
                    route("slash", "/slash/", serde_json::json!({})),
                ],
                DefaultAuth::ConsumerKeys,
            ),
            &Snapshot::empty(),
        );
        let at = |p| name_of(&set, p);
        assert_eq!(
            at("/team/v1/chat/completions"),
            Some(("team-v1".into(), "/chat/completions".into()))
        );
        assert_eq!(
            at("/team/messages"),
            Some(("team".into(), "/messages".into()))
        );
        assert_eq!(
            at("/teams/v1/chat/completions"),
            Some(("root".into(), "/teams/v1/chat/completions".into()))
        );
        assert_eq!(
            at("/slash/v1/models"),
            Some(("slash".into(), "/v1/models".into()))
        );
        assert_eq!(at("/v1/models"), Some(("root".into(), "/v1/models".into())));
    }

    #[test]
    fn a_disabled_longest_match_is_not_served_by_a_shorter_prefix() {
        let set = RouteSet::build(
            &config(
                vec![
                    route("root", "/", serde_json::json!({})),
                    route("off", "/off", serde_json::json!({"disabled": true})),
                ],
                DefaultAuth::ConsumerKeys,
            ),
            &Snapshot::empty(),
        );
        assert_eq!(
            name_of(&set, "/off/v1/chat/completions"),
            Some(("disabled:off".into(), String::new()))
        );
        assert!(matches!(set.lookup("/other"), RouteMatch::Route { .. }));
    }

    #[test]
    fn no_route_anywhere_means_one_implicit_root_route_with_the_default_auth() {
        let set = RouteSet::build(&config(vec![], DefaultAuth::Disabled), &Snapshot::empty());
        assert_eq!(set.routes().len(), 1);
        assert_eq!(set.routes()[0].source, RouteSource::Implicit);
        assert_eq!(set.routes()[0].auth, RouteAuth::Disabled);
        assert_eq!(set.unauthenticated().count(), 1);
        let secure = RouteSet::build(
            &config(vec![], DefaultAuth::ConsumerKeys),
            &Snapshot::empty(),
        );
        assert_eq!(secure.routes()[0].auth, RouteAuth::ConsumerKeys);
        assert_eq!(secure.routes()[0].max_attempts, 2);
        assert_eq!(secure.unauthenticated().count(), 0);
    }

    #[test]
    fn auth_mode_follows_the_fixed_priority() {
        let all = route(
            "a",
            "/a",
            serde_json::json!({"disable_auth": true, "passthrough_auth_token": true, "legacy_bearer_auth_tokens": ["t"]}),
        );
        assert_eq!(RouteAuth::of(&all), RouteAuth::Disabled);
        let pass = route(
            "b",
            "/b",
            serde_json::json!({"passthrough_auth_token": true, "legacy_bearer_auth_tokens": ["t"]}),
        );
        assert_eq!(RouteAuth::of(&pass), RouteAuth::Passthrough);
        let legacy = route(
            "c",
            "/c",
            serde_json::json!({"legacy_bearer_auth_tokens": ["t"]}),
        );
        assert!(matches!(RouteAuth::of(&legacy), RouteAuth::LegacyBearer(h) if h.len() == 1));
        assert_eq!(
            RouteAuth::of(&route("d", "/d", serde_json::json!({}))),
            RouteAuth::ConsumerKeys
        );
    }

    #[test]
    fn endpoints_with_and_without_v1() {
        assert_eq!(
            Endpoint::of("/v1/chat/completions"),
            Some(Endpoint::ChatCompletions)
        );
        assert_eq!(
            Endpoint::of("/chat/completions"),
            Some(Endpoint::ChatCompletions)
        );
        assert_eq!(
            Endpoint::of("/v1/messages/count_tokens"),
            Some(Endpoint::CountTokens)
        );
        assert_eq!(Endpoint::of("/models/"), Some(Endpoint::Models));
        assert_eq!(Endpoint::of("/v2/chat/completions"), None);
        assert_eq!(Endpoint::of(""), None);
    }
}
