//! Strategies in Rust, Python and JavaScript: the `least_backlog` example built with each SDK
//! (`cargo xtask build-strategies` builds all three into `<target>/strategies-examples/`) passes
//! the router contract suite, routes real traffic, shows its stamped API version, and decides
//! exactly like the other two; and `switchyard strategies new` scaffolds a project in each
//! language that builds and passes the contract suite as written.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};

use crate::harness::{Gateway, Mock, binary, chat_body, component, repo, target_dir};

const LANGS: [&str; 3] = ["rs", "py", "js"];

fn example(lang: &str) -> PathBuf {
    component("strategies-examples", &format!("least_backlog_{lang}"))
}

fn switchyard(args: &[&str]) -> Output {
    Command::new(binary())
        .args(args)
        .env("SWITCHYARD_CACHE_DIR", target_dir().join("wasmtime-cache"))
        .env_remove("SWITCHYARD_CONFIG")
        .output()
        .expect("run switchyard")
}

/// `switchyard strategies test FILE`; panics with its output unless every check passed.
fn contract_suite(file: &Path) {
    let out = switchyard(&["strategies", "test", file.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("checks passed"),
        "{}: {stdout}{}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_example_in_each_language_passes_the_contract_suite() {
    for lang in LANGS {
        contract_suite(&example(lang));
    }
}

/// One decision through `strategies run FILE.wasm`; returns the order.
fn decide(dir: &Path, file: &Path, params: &str, input: &Value) -> Vec<u64> {
    let path = dir.join("input.json");
    std::fs::write(&path, input.to_string()).unwrap();
    let out = switchyard(&[
        "strategies",
        "run",
        file.to_str().unwrap(),
        "--params",
        params,
        "--input",
        path.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let decided: Value = serde_json::from_slice(&out.stdout).unwrap();
    decided["order"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

#[test]
fn the_three_languages_make_the_same_decisions() {
    // The SDKs share the helpers (SplitMix64, weighted draw, tiers) bit for bit, so the same
    // strategy decides the same in each language for the same inputs.
    let dir = tempfile::tempdir().unwrap();
    let routes = json!([
        {"endpoint_id": "m:a", "weight": 1.0, "priority": 0},
        {"endpoint_id": "m:b", "weight": 3.0, "priority": 1},
        {"endpoint_id": "m:c", "weight": 2.0, "priority": 1},
        {"endpoint_id": "m:d", "weight": 0.5, "priority": 1},
    ]);
    let mut primaries_seen = std::collections::HashSet::new();
    for (seed, backlogs) in [
        (1, [0, 0, 0, 0]),
        (2, [0, 0, 0, 0]),
        (3, [0, 5_000, 4_000, 9_000]),
        (4, [0, 5_000, 5_000, 5_000]),
        (5, [7, 100, 120, 100]),
        (6, [0, 0, 0, 0]),
        (7, [0, 9_000, 9_000, 0]),
    ] {
        let input = json!({
            "model": "m",
            "routes": routes,
            "request": {"prompt_tokens": 10, "seed": seed},
            "candidates": (0..4).map(|i| json!({"index": i, "prefill_backlog_tokens": backlogs[i]}))
                .collect::<Vec<_>>(),
        });
        let params = r#"{"tolerance_tokens": 50}"#;
        let rust = decide(dir.path(), &example("rs"), params, &input);
        for lang in ["py", "js"] {
            assert_eq!(
                decide(dir.path(), &example(lang), params, &input),
                rust,
                "{lang} and rs disagree on seed {seed}, backlogs {backlogs:?}"
            );
        }
        // Priority 1 leads; the lowest tier (a) comes last in declared order.
        assert_ne!(rust[0], 0, "seed {seed}: {rust:?}");
        primaries_seen.insert(rust[0]);
    }
    assert!(
        primaries_seen.len() == 3,
        "every priority-1 upstream should lead once (draws and backlogs): {primaries_seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_and_javascript_strategies_route_real_traffic_and_show_their_api_version() {
    let dir = tempfile::tempdir().unwrap();
    for lang in LANGS {
        std::fs::copy(
            example(lang),
            dir.path().join(format!("least_backlog_{lang}.wasm")),
        )
        .unwrap();
    }
    // Upstream `heavy` has weight 0: with no backlog anywhere the tie is broken by weight, so
    // every request of every model goes to `light`.
    let (light, heavy) = (Mock::start(&[]), Mock::start(&[]));
    let models: String = LANGS
        .iter()
        .map(|lang| {
            format!(
                "  - id: m-{lang}\n    router: least_backlog_{lang}\n    router_params: {{tolerance_tokens: 10}}\n    route:\n      - kind: openai_compat\n        base_url: {}\n        weight: 0\n      - kind: openai_compat\n        base_url: {}\n",
                heavy.base_url(),
                light.base_url()
            )
        })
        .collect();
    // `call_timeout_ms` far above any call's cost, so a busy machine cannot fail the test (the
    // costs per language are measured by `cargo bench --bench select`). `load_wait_ms` likewise:
    // the folder's files are swapped in together, after the slowest compile, and the Python and
    // JavaScript components compiling from a cold cache took more than the default 30 s on a
    // 2-core machine busy with a release build.
    let gateway = Gateway::start(&format!(
        "server:\n  admin_token: sdk-admin\nstrategies:\n  dir: {}\n  call_timeout_ms: 1000\n  load_wait_ms: 600000\nmodels:\n{models}",
        dir.path().display()
    ));
    for lang in LANGS {
        for _ in 0..3 {
            let (status, body) = gateway.chat(chat_body(&format!("m-{lang}"), false)).await;
            assert_eq!(status, 200, "m-{lang}: {body}");
        }
    }
    assert_eq!(light.chat_requests().await, 9);
    assert_eq!(heavy.chat_requests().await, 0);

    let health = gateway.deep("sdk-admin").await;
    for lang in LANGS {
        let name = format!("least_backlog_{lang}");
        let entry = health["strategies"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["name"] == name.as_str())
            .cloned()
            .unwrap_or_default();
        assert_eq!(entry["state"], "loaded", "{name}: {health}");
        assert_eq!(entry["api_version"], "0.2.0", "{name}: {health}");
    }
    // Each strategy's own status JSON (its select count, kept in the guest) reaches `/routing`.
    let routing: Value = reqwest::Client::new()
        .get(gateway.url("/routing"))
        .bearer_auth("sdk-admin")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for lang in LANGS {
        let model = routing["models"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["id"] == format!("m-{lang}").as_str())
            .cloned()
            .unwrap_or_default();
        assert_eq!(model["strategy_status"]["selects"], 3, "m-{lang}: {model}");
    }
}

/// Scaffolds `name` in `lang` into a fresh folder, runs its build script, and returns the
/// component it wrote.
fn scaffold_and_build(lang: &str, name: &str, dir: &Path, env: &[(&str, PathBuf)]) -> PathBuf {
    let project = dir.join(name);
    let out = switchyard(&[
        "strategies",
        "new",
        name,
        "--lang",
        lang,
        "--dir",
        project.to_str().unwrap(),
        "--sdk",
        repo().join("sdk").to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "strategies new --lang {lang}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut build = Command::new(project.join("build.sh"));
    for (key, value) in env {
        build.env(key, value);
    }
    let built = build.output().expect("run build.sh");
    assert!(
        built.status.success(),
        "{lang} scaffold's build.sh failed:\n{}\n{}",
        String::from_utf8_lossy(&built.stdout),
        String::from_utf8_lossy(&built.stderr)
    );
    let wasm = project.join(format!("{name}.wasm"));
    assert!(
        wasm.is_file(),
        "{lang}: build.sh wrote no {}",
        wasm.display()
    );
    wasm
}

#[test]
fn strategies_new_scaffolds_a_python_and_a_javascript_strategy_that_pass_the_contract_suite() {
    let dir = tempfile::tempdir().unwrap();
    for (lang, name) in [("python", "scaffold_py"), ("js", "scaffold_js")] {
        let wasm = scaffold_and_build(lang, name, dir.path(), &[]);
        contract_suite(&wasm);
    }
    // Their own unit tests pass as written, in the language's runner.
    let py = dir.path().join("scaffold_py");
    let unit = Command::new(py.join(".venv/bin/python"))
        .args(["-m", "unittest"])
        .current_dir(&py)
        .output()
        .unwrap();
    assert!(
        unit.status.success(),
        "{}",
        String::from_utf8_lossy(&unit.stderr)
    );
    let js = dir.path().join("scaffold_js");
    let unit = Command::new("npm")
        .args(["test", "--silent"])
        .current_dir(&js)
        .output()
        .unwrap();
    assert!(
        unit.status.success(),
        "{}{}",
        String::from_utf8_lossy(&unit.stdout),
        String::from_utf8_lossy(&unit.stderr)
    );
}

#[test]
fn strategies_new_scaffolds_a_rust_strategy_that_passes_the_contract_suite() {
    let dir = tempfile::tempdir().unwrap();
    // A target folder that outlives the test, so later runs compile only the scaffold itself.
    let cargo_target = target_dir().join("scaffold-rust");
    let wasm = scaffold_and_build(
        "rust",
        "scaffold_rs",
        dir.path(),
        &[("CARGO_TARGET_DIR", cargo_target.clone())],
    );
    contract_suite(&wasm);
    let unit = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(["test", "--quiet"])
        .current_dir(dir.path().join("scaffold_rs"))
        .env("CARGO_TARGET_DIR", cargo_target)
        .output()
        .unwrap();
    assert!(
        unit.status.success(),
        "{}",
        String::from_utf8_lossy(&unit.stderr)
    );
}
