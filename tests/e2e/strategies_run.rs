//! `switchyard strategies run`: one decision offline, from the committed example input and from
//! inputs written here, on `routewise` and on `fixed`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};

use crate::harness::{binary, component, target_dir, write_config};

fn examples() -> PathBuf {
    crate::harness::repo().join("docs/examples")
}

/// A config whose catalog holds the freshly built strategies (`strategies run NAME` looks names up
/// in the config's catalog).
fn config(dir: &Path) -> PathBuf {
    write_config(
        dir,
        &format!(
            "strategies:\n  builtin_dir: \"{}\"\n",
            target_dir().join("strategies").display()
        ),
    )
}

fn run(dir: &Path, args: &[&str]) -> Output {
    Command::new(binary())
        .args(["strategies", "run"])
        .args(args)
        .arg("--config")
        .arg(config(dir))
        .env("SWITCHYARD_CACHE_DIR", target_dir().join("wasmtime-cache"))
        .env_remove("SWITCHYARD_CONFIG")
        .output()
        .expect("run switchyard strategies run")
}

fn decided(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "strategies run failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

#[test]
fn routewise_decides_the_documented_example_from_replayed_observations() {
    let dir = tempfile::tempdir().unwrap();
    let params = examples().join("routewise-params.json");
    let input = examples().join("routewise-decision.json");
    let args = [
        "routewise",
        "--params",
        params.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ];
    let out = decided(&run(dir.path(), &args));

    // docs/routewise.md's worked example: A 30.5 %, B 69.5 %, C within budget but without mass.
    let last = &out["status"]["last_decision"];
    assert_eq!(last["lp_status"], "optimal", "{out}");
    let mixture = last["mixture"].as_object().unwrap();
    assert_eq!(mixture.len(), 2, "{out}");
    assert!((mixture["chat:cheap-llm-api"].as_f64().unwrap() - 0.3049).abs() < 1e-3);
    assert!((mixture["chat:fast-llm-api"].as_f64().unwrap() - 0.6951).abs() < 1e-3);
    assert!((last["budget"].as_f64().unwrap() - 0.009).abs() < 1e-12);
    assert_eq!(
        last["predicted_output_tokens"], 400,
        "bucket mean of the replay"
    );
    assert_eq!(out["status"]["counters"]["observations"], 9);
    assert_eq!(out["status"]["latency"]["chat:local-9003"]["samples"], 3);

    // The order holds every candidate once, the mixture routes first, and names its endpoints.
    let order: Vec<u64> = out["order"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, [0, 1, 2]);
    assert_eq!(order[2], 2, "C has no mass: {out}");
    let ids = ["chat:cheap-llm-api", "chat:fast-llm-api", "chat:local-9003"];
    let endpoints: Vec<&str> = out["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let expected: Vec<&str> = order.iter().map(|&i| ids[i as usize]).collect();
    assert_eq!(endpoints, expected);
    let metadata = out["strategy_metadata"].as_str().unwrap();
    assert!(
        metadata.starts_with("rw1:") && metadata.contains(&format!(":{}:", order[0])),
        "{metadata}"
    );

    // Same inputs, same seed: the same decision.
    let again = decided(&run(dir.path(), &args));
    assert_eq!(again["order"], out["order"]);
    assert_eq!(
        again["status"]["last_decision"],
        out["status"]["last_decision"]
    );
}

#[test]
fn fixed_runs_by_name_and_by_path_on_wit_routes() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("decision.json");
    std::fs::write(
        &input,
        json!({
            "model": "m",
            "routes": [
                {"endpoint_id": "m:a", "weight": 0.0},
                {"endpoint_id": "m:b", "weight": 1.0, "priority": 0},
                {"endpoint_id": "m:c", "weight": 1.0, "priority": 5},
            ],
            "request": {"prompt_tokens": 10, "seed": 3},
            "candidates": [{"index": 0}, {"index": 1}, {"index": 2}],
        })
        .to_string(),
    )
    .unwrap();
    let input = input.to_str().unwrap();
    let by_name = decided(&run(dir.path(), &["fixed", "--input", input]));
    // The higher tier first, then the lower one in declared order (`fallback_order: declared`).
    assert_eq!(by_name["order"], json!([2, 0, 1]), "{by_name}");
    assert_eq!(by_name["endpoints"], json!(["m:c", "m:a", "m:b"]));
    assert!(
        by_name["strategy"].as_str().unwrap().starts_with("fixed "),
        "{by_name}"
    );

    let wasm = component("strategies", "fixed");
    let by_path = decided(&run(
        dir.path(),
        &[
            wasm.to_str().unwrap(),
            "--params",
            r#"{"fallback_order": "weighted"}"#,
            "--input",
            input,
        ],
    ));
    // `weighted` draws the lower tier by weight: the weight-0 route comes last.
    assert_eq!(by_path["order"], json!([2, 1, 0]), "{by_path}");
}

#[test]
fn bad_params_and_bad_routes_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let input = examples().join("routewise-decision.json");
    let out = run(
        dir.path(),
        &[
            "routewise",
            "--params",
            r#"{"budget_alfa": 0.5}"#,
            "--input",
            input.to_str().unwrap(),
        ],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("budget_alfa"), "{stderr}");

    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        json!({"routes": [
            {"kind": "openai_compat", "base_url": "http://127.0.0.1:1/v1"},
            {"kind": "openai_compat", "base_url": "http://127.0.0.1:2/v1", "weight": -1},
        ]})
        .to_string(),
    )
    .unwrap();
    let out = run(dir.path(), &["routewise", "--input", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("routes[1].weight"), "{stderr}");

    let out = run(
        dir.path(),
        &["no_such_strategy", "--input", bad.to_str().unwrap()],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("unknown strategy `no_such_strategy`"),
        "{stderr}"
    );
}
