//! Endpoint identity: `{model_id}:{location}`.
//!
//! The id keys health, latency profiles and logs, so it is derived only from what locates the upstream:
//! moving a local replica to another port or a remote route to another vendor renames it (its history
//! restarts); moving between loopback hosts on one port keeps it.

use super::ProviderKind;
use url::{Host, Url};

/// Derives the endpoint id of a route: `local-{port}` for loopback, a host-derived name for the generic
/// OpenAI-compatible adapter (`api.minimax.io` → `minimax-api`), else `{kind}-api`.
pub fn endpoint_id(model_id: &str, kind: ProviderKind, url: &Url) -> String {
    let location = if is_loopback(url) {
        format!("local-{}", url.port_or_known_default().unwrap_or(80))
    } else if kind == ProviderKind::OpenaiCompat {
        host_location(url).unwrap_or_else(|| format!("{}-api", kind.as_str()))
    } else {
        format!("{}-api", kind.as_str())
    };
    format!("{model_id}:{location}")
}

/// Loopback addresses and `localhost`.
pub fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(Host::Ipv4(ip)) => ip.is_loopback(),
        Some(Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// `api.minimax.io` → `minimax-api`; `openrouter.ai` → `openrouter`; `10.0.0.5` → `10-0-0-5`.
fn host_location(url: &Url) -> Option<String> {
    match url.host()? {
        Host::Domain(d) => {
            let labels: Vec<&str> = d.split('.').filter(|l| !l.is_empty()).collect();
            match labels.as_slice() {
                [] => None,
                [only] => Some(only.to_ascii_lowercase()),
                // Drop the top-level domain; the registrable name leads, the first subdomain follows.
                [subdomains @ .., name, _tld] => {
                    let mut loc = name.to_ascii_lowercase();
                    if let Some(first) = subdomains.first() {
                        loc.push('-');
                        loc.push_str(&first.to_ascii_lowercase());
                    }
                    Some(loc)
                }
            }
        }
        Host::Ipv4(ip) => Some(ip.to_string().replace('.', "-")),
        Host::Ipv6(ip) => Some(ip.to_string().replace(':', "-")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(kind: ProviderKind, url: &str) -> String {
        endpoint_id("m", kind, &Url::parse(url).unwrap())
    }

    #[test]
    fn derives_ids_as_documented() {
        use ProviderKind::*;
        assert_eq!(id(OpenaiCompat, "http://127.0.0.1:9001/v1"), "m:local-9001");
        assert_eq!(id(OpenaiCompat, "http://localhost:8000/v1"), "m:local-8000");
        assert_eq!(id(Anthropic, "http://[::1]:7000"), "m:local-7000");
        assert_eq!(
            id(OpenaiCompat, "https://api.minimax.io/v1"),
            "m:minimax-api"
        );
        assert_eq!(
            id(OpenaiCompat, "https://openrouter.ai/api/v1"),
            "m:openrouter"
        );
        assert_eq!(
            id(Anthropic, "https://api.anthropic.com"),
            "m:anthropic-api"
        );
        assert_eq!(
            id(OpenaiResponses, "https://api.openai.com/v1"),
            "m:openai_responses-api"
        );
        assert_eq!(id(OpenaiCompat, "http://10.0.0.5:8000/v1"), "m:10-0-0-5");
    }
}
