//! The operator dashboard at `GET /ui/`: one HTML page, its script, its style sheet and an icon,
//! compiled into the binary (no CDN, nothing fetched at run time).
//!
//! The files are public and hold no data. The page asks for the admin token, keeps it in the
//! tab's `sessionStorage` and sends it as `Authorization: Bearer` on its own calls to the admin
//! room's views (`/routing`, `/health/deep`, `/admin/routing/weights`, `/admin/logs`) and to
//! `/metrics`; those answer as they always do, under the one rule of [`super::auth`]. So the
//! dashboard adds no second way in: no cookie (which a browser would attach to requests another
//! site makes), no session store, nothing the gateway must expire.

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

/// One embedded file: its name under `/ui/`, its content type and its bytes.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

/// `index.html` is served at `/ui/`; the others at `/ui/<name>`.
const INDEX: Asset = Asset {
    name: "index.html",
    content_type: "text/html; charset=utf-8",
    body: include_str!("assets/index.html"),
};

const ASSETS: &[Asset] = &[
    INDEX,
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("assets/app.js"),
    },
    Asset {
        name: "app.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("assets/app.css"),
    },
    Asset {
        name: "favicon.svg",
        content_type: "image/svg+xml",
        body: include_str!("assets/favicon.svg"),
    },
];

/// The page runs only its own script and style and talks only to its own origin; no other site
/// may frame it (the token field must not be overlaid).
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self'; connect-src 'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'";

/// `/ui` (redirected to `/ui/`), `/ui/` and `/ui/<asset>`. No handler reads the state, so any
/// state type fits (the server mounts it with the [`crate::gateway::Gateway`]).
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        // Relative, so the redirect also holds behind a proxy that mounts the gateway on a prefix.
        .route("/ui", get(|| async { Redirect::temporary("ui/") }))
        .route("/ui/", get(|| async { serve(&INDEX) }))
        .route("/ui/{name}", get(asset))
}

async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|a| a.name == name) {
        Some(asset) => serve(asset),
        None => (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("no dashboard file `{name}`"),
        )
            .into_response(),
    }
}

fn serve(asset: &Asset) -> Response {
    let mut response = asset.body.into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    // Revalidate on every load: after an upgrade the page and its script must come from one build.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower_service::Service;

    /// The dashboard's routes alone, without a gateway.
    async fn get(path: &str) -> Response {
        let mut app: Router = router();
        let request = Request::get(path).body(Body::empty()).unwrap();
        app.call(request).await.unwrap()
    }

    fn header(response: &Response, name: header::HeaderName) -> &str {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }

    #[tokio::test]
    async fn each_file_has_its_content_type() {
        for (path, content_type) in [
            ("/ui/", "text/html; charset=utf-8"),
            ("/ui/index.html", "text/html; charset=utf-8"),
            ("/ui/app.js", "text/javascript; charset=utf-8"),
            ("/ui/app.css", "text/css; charset=utf-8"),
            ("/ui/favicon.svg", "image/svg+xml"),
        ] {
            let response = get(path).await;
            assert_eq!(response.status(), StatusCode::OK, "{path}");
            assert_eq!(
                header(&response, header::CONTENT_TYPE),
                content_type,
                "{path}"
            );
            assert_eq!(header(&response, header::X_CONTENT_TYPE_OPTIONS), "nosniff");
            assert!(
                header(&response, header::CONTENT_SECURITY_POLICY).contains("script-src 'self'"),
                "{path}"
            );
        }
    }

    #[tokio::test]
    async fn unknown_files_are_404_and_the_bare_path_redirects() {
        let response = get("/ui/secrets.json").await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        let response = get("/ui").await;
        assert_eq!(response.status(), StatusCode::TEMPORARY_REDIRECT);
        assert_eq!(header(&response, header::LOCATION), "ui/");
    }

    /// The page loads only its own files: no CDN, nothing from another origin.
    #[test]
    fn the_assets_reference_no_other_origin() {
        for asset in ASSETS {
            for needle in ["http://", "https://", "//cdn", "@import"] {
                let hits: Vec<&str> = asset
                    .body
                    .lines()
                    .filter(|l| l.contains(needle))
                    // The SVG namespace is an identifier, not a fetch.
                    .filter(|l| !l.contains("http://www.w3.org/2000/svg"))
                    .collect();
                assert!(
                    hits.is_empty(),
                    "{} references {needle}: {hits:?}",
                    asset.name
                );
            }
        }
    }
}
