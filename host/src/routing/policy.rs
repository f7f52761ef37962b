//! Effective upstream weights: the declared weights, rewritten by the deployment policy
//! (`local_fraction`), runtime overrides from the admin API, operator disables and failing health
//! checks. The result is what selection and strategies see.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde::{Deserialize, Serialize};

use crate::config::{ModelConfig, ModelUpstream};

/// Runtime changes made through the admin API. Per process, like all routing state.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Overrides {
    /// model id → endpoint id → weight. A weight of 0 means never chosen and not pinnable.
    pub weights: BTreeMap<String, BTreeMap<String, f64>>,
    /// Endpoint ids or provider kinds taken out of rotation.
    pub disabled: BTreeSet<String>,
}

/// Why a upstream ended up with weight 0, shown in exclusions and `/routing`.
pub fn zero_reason(upstream: &ModelUpstream) -> &'static str {
    upstream.weight_note.unwrap_or("weight 0")
}

/// `scheme://host:port` of a base URL: what the health-check loop probes.
pub fn origin(base_url: &str) -> Option<String> {
    let url = url::Url::parse(base_url).ok()?;
    let host = url.host_str()?;
    let port = url.port_or_known_default()?;
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    Some(format!("{}://{host}:{port}", url.scheme()))
}

/// Rewrites `model.upstreams[*].weight` (keeping `declared_weight`) from the policy inputs.
///
/// Order: a upstream that is disabled, failing its health check, declared 0 or overridden to 0 is 0.
/// Among the rest, when `local_fraction` applies (the model's router is `fixed`), each local upstream
/// gets `lf / locals` and each remote one `(1 - lf) / remotes` (one side empty: `1 / n` each).
/// A positive runtime override then replaces the upstream's weight.
pub fn apply(
    model: &mut ModelConfig,
    overrides: &Overrides,
    unhealthy_origins: &HashSet<String>,
    local_fraction: Option<f64>,
) {
    let model_overrides = overrides.weights.get(&model.id);
    let mut eligible = Vec::new();
    for (i, upstream) in model.upstreams.iter_mut().enumerate() {
        upstream.weight = upstream.declared_weight;
        upstream.weight_note = None;
        let overridden = model_overrides
            .and_then(|o| o.get(&upstream.endpoint_id))
            .copied();
        let note = if overrides.disabled.contains(&upstream.endpoint_id)
            || overrides.disabled.contains(upstream.kind.as_str())
        {
            Some("disabled by an operator")
        } else if origin(&upstream.base_url).is_some_and(|o| unhealthy_origins.contains(&o)) {
            Some("failing its health check")
        } else if overridden == Some(0.0) {
            Some("weight overridden to 0")
        } else if upstream.declared_weight <= 0.0 && overridden.is_none() {
            Some("weight 0")
        } else {
            None
        };
        if let Some(note) = note {
            upstream.weight = 0.0;
            upstream.weight_note = Some(note);
        } else {
            eligible.push(i);
        }
    }
    if let Some(lf) = local_fraction.filter(|_| model.router == "fixed") {
        let locals = eligible
            .iter()
            .filter(|&&i| model.upstreams[i].local_deployment)
            .count();
        let remotes = eligible.len() - locals;
        for &i in &eligible {
            let upstream = &mut model.upstreams[i];
            upstream.weight = match (locals, remotes, upstream.local_deployment) {
                (0, n, _) | (n, 0, _) => 1.0 / n as f64,
                (l, _, true) => lf / l as f64,
                (_, r, false) => (1.0 - lf) / r as f64,
            };
        }
    }
    if let Some(o) = model_overrides {
        for &i in &eligible {
            let upstream = &mut model.upstreams[i];
            if let Some(&w) = o.get(&upstream.endpoint_id) {
                upstream.weight = w;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use std::path::Path;

    fn model(router: &str) -> ModelConfig {
        let text = format!(
            "models:\n  - id: m\n    router: {router}\n    route:\n      - kind: openai_compat\n        base_url: http://127.0.0.1:8001/v1\n        weight: 5\n      - kind: openai_compat\n        base_url: http://127.0.0.1:8002/v1\n        weight: 1\n      - kind: openai_compat\n        base_url: https://api.example.com/v1\n        weight: 1\n"
        );
        Config::from_yaml(Path::new("t.yaml"), &text, &|_| None)
            .unwrap()
            .models
            .remove(0)
    }

    fn weights(m: &ModelConfig) -> Vec<f64> {
        m.upstreams
            .iter()
            .map(|r| (r.weight * 1000.0).round() / 1000.0)
            .collect()
    }

    #[test]
    fn local_fraction_worked_example() {
        // Two local replicas and one remote provider, local_fraction 0.6: each local gets 0.6 / 2,
        // the remote 0.4 / 1, whatever they declared.
        let mut m = model("fixed");
        apply(&mut m, &Overrides::default(), &HashSet::new(), Some(0.6));
        assert_eq!(weights(&m), [0.3, 0.3, 0.4]);
        // A local replica failing its health check drops out; the other local takes its share.
        let failing: HashSet<String> = ["http://127.0.0.1:8001".to_owned()].into();
        apply(&mut m, &Overrides::default(), &failing, Some(0.6));
        assert_eq!(weights(&m), [0.0, 0.6, 0.4]);
        assert_eq!(zero_reason(&m.upstreams[0]), "failing its health check");
    }

    #[test]
    fn one_sided_fleets_split_evenly_and_other_routers_keep_declared_weights() {
        let mut m = model("fixed");
        let disabled = Overrides {
            disabled: ["m:example-api".to_owned()].into(),
            ..Overrides::default()
        };
        apply(&mut m, &disabled, &HashSet::new(), Some(0.6));
        assert_eq!(weights(&m), [0.5, 0.5, 0.0]);
        let mut rr = model("round_robin");
        apply(&mut rr, &Overrides::default(), &HashSet::new(), Some(0.6));
        assert_eq!(weights(&rr), [5.0, 1.0, 1.0]);
    }

    #[test]
    fn overrides_replace_weights_and_zero_means_never() {
        let mut m = model("round_robin");
        let mut o = Overrides::default();
        o.weights.insert(
            "m".into(),
            [
                ("m:local-8001".to_owned(), 0.0),
                ("m:local-8002".to_owned(), 3.0),
            ]
            .into(),
        );
        apply(&mut m, &o, &HashSet::new(), None);
        assert_eq!(weights(&m), [0.0, 3.0, 1.0]);
        assert_eq!(zero_reason(&m.upstreams[0]), "weight overridden to 0");
        // Disabling a provider kind takes every upstream of that kind out.
        o.disabled.insert("openai_compat".into());
        apply(&mut m, &o, &HashSet::new(), None);
        assert_eq!(weights(&m), [0.0, 0.0, 0.0]);
    }

    #[test]
    fn origins_drop_the_path() {
        assert_eq!(
            origin("http://127.0.0.1:8001/v1").as_deref(),
            Some("http://127.0.0.1:8001")
        );
        assert_eq!(
            origin("https://api.example.com/v1").as_deref(),
            Some("https://api.example.com:443")
        );
    }
}
