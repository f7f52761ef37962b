//! `switchyard check` fails on bad configs with messages that name the file, model, strategy and key.

use crate::harness::check;

const ROUTE: &str =
    "    route:\n      - kind: openai_compat\n        base_url: http://127.0.0.1:9001/v1\n";

fn stderr_of(body: &str) -> String {
    let out = check(body);
    assert!(!out.status.success(), "check should fail for:\n{body}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn unknown_strategy_lists_the_known_ones() {
    let err = stderr_of(&format!("models:\n  - id: m1\n    router: nope\n{ROUTE}"));
    assert!(
        err.contains("config.yaml: models[0] (m1).router: unknown strategy `nope`"),
        "{err}"
    );
    assert!(
        err.contains("known strategies: fixed, round_robin, routewise"),
        "{err}"
    );
}

#[test]
fn bad_router_params_key_names_model_strategy_and_key() {
    let err = stderr_of(&format!(
        "models:\n  - id: m1\n    router: round_robin\n    router_params:\n      skip_open_circuit: true\n{ROUTE}"
    ));
    assert!(
        err.contains("models[0] (m1).router_params: strategy `round_robin` rejects the params"),
        "{err}"
    );
    assert!(err.contains("skip_open_circuit"), "{err}");
}

#[test]
fn wrong_params_type_is_rejected() {
    let err = stderr_of(&format!(
        "models:\n  - id: m1\n    router: round_robin\n    router_params:\n      skip_open_circuits: sometimes\n{ROUTE}"
    ));
    assert!(err.contains("skip_open_circuits"), "{err}");
}

#[test]
fn unknown_yaml_key_names_file_and_line() {
    let err = stderr_of(
        "models:\n  - id: m1\n    route:\n      - kind: openai_compat\n        base_url: http://127.0.0.1:9001/v1\n        wieght: 3\n",
    );
    // Lines 1-2 of the written file are the database section.
    assert!(err.contains("config.yaml:8:"), "{err}");
    assert!(
        err.contains("models[0].route[0]: unknown field `wieght`"),
        "{err}"
    );
}

#[test]
fn a_valid_config_prints_each_models_router_and_routes() {
    let out = check(&format!(
        "models:\n  - id: m1\n    aliases: [one]\n{ROUTE}  - id: m2\n    router: round_robin\n{ROUTE}"
    ));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("model m1 (aliases: one): router fixed"),
        "{stdout}"
    );
    assert!(stdout.contains("model m2: router round_robin"), "{stdout}");
    assert!(
        stdout.contains("[0] m1:local-9001 openai_compat http://127.0.0.1:9001/v1"),
        "{stdout}"
    );
}

#[test]
fn the_demo_config_checks() {
    let demo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/switchyard.yaml");
    let out = std::process::Command::new(crate::harness::binary())
        .args(["check", "--config"])
        .arg(&demo)
        .env(
            "SWITCHYARD_BUILTIN_STRATEGIES",
            crate::harness::target_dir().join("strategies"),
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn bad_yaml_routes_name_the_route_and_field() {
    let err = stderr_of("routes:\n  - name: team\n    path_prefix: /team\n    max_attempts: 0\n");
    assert!(
        err.contains("config.yaml: routes[0] (team).max_attempts: must be between 1 and 10"),
        "{err}"
    );
    let err = stderr_of("routes:\n  - name: team\n    path_prefix: team\n");
    assert!(
        err.contains("routes[0] (team).path_prefix: must start with /"),
        "{err}"
    );
    let err =
        stderr_of("routes:\n  - name: a\n    path_prefix: /x\n  - name: b\n    path_prefix: /x\n");
    assert!(
        err.contains("routes[1] (b).path_prefix: `/x` is already used by another route"),
        "{err}"
    );
    let err = stderr_of("routes:\n  - name: a\n    path_prefix: /x\n    disable_auht: true\n");
    assert!(
        err.contains("routes[0]: unknown field `disable_auht`"),
        "{err}"
    );
    let err = stderr_of("server:\n  default_auth: none\n");
    assert!(err.contains("server.default_auth"), "{err}");
}
