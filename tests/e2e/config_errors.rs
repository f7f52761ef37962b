//! `switchyard check` fails on bad configs with messages that name the file, line, model, strategy
//! and key. Lines 1-2 of every written file are the database section, so a body's first line is 3.

use crate::harness::{check, check_with_env};

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
        err.contains("config.yaml:5: models[0] (m1).router: unknown strategy `nope`"),
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
        err.contains(
            "config.yaml:6: models[0] (m1).router_params: strategy `round_robin` rejects the params"
        ),
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
    let demo = crate::harness::repo().join("config/switchyard.yaml");
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
        err.contains("config.yaml:6: routes[0] (team).max_attempts: must be between 1 and 10"),
        "{err}"
    );
    let err = stderr_of("routes:\n  - name: team\n    path_prefix: team\n");
    assert!(
        err.contains("config.yaml:5: routes[0] (team).path_prefix: must start with /"),
        "{err}"
    );
    let err =
        stderr_of("routes:\n  - name: a\n    path_prefix: /x\n  - name: b\n    path_prefix: /x\n");
    assert!(
        err.contains(
            "config.yaml:7: routes[1] (b).path_prefix: `/x` is already used by another route"
        ),
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

#[test]
fn validation_errors_give_the_line_of_their_key() {
    let err = stderr_of(
        "models:\n  - id: m1\n    route:\n      - kind: openai_compat\n        base_url: http://127.0.0.1:9001/v1\n        weight: -1\n",
    );
    assert!(
        err.contains(
            "config.yaml:8: models[0] (m1).route[0].weight: must be a finite number >= 0, got -1"
        ),
        "{err}"
    );
    let err = stderr_of(
        "models:\n  - id: m1\n    route:\n      - kind: openai_compat\n        base_url: \"not a url\"\n",
    );
    assert!(
        err.contains("config.yaml:7: models[0] (m1).route[0].base_url: `not a url`"),
        "{err}"
    );
    let err = stderr_of(&format!("models:\n  - id: m1\n{ROUTE}  - id: m1\n{ROUTE}"));
    assert!(
        err.contains("config.yaml:8: models[1] (m1).id: `m1` is already used"),
        "{err}"
    );
    let err = stderr_of(&format!(
        "models:\n  - id: m1\n    router: round_robin\n    router_params: {{ nope: 1 }}\n{ROUTE}"
    ));
    assert!(
        err.contains("config.yaml:6: models[0] (m1).router_params: strategy `round_robin` rejects"),
        "{err}"
    );
    let err = stderr_of(&format!(
        "models:\n  - id: m1\n    router: round_robin\n    router_params:\n      skip_open_circuits: sometimes\n{ROUTE}"
    ));
    assert!(
        err.contains("config.yaml:6: models[0] (m1).router_params"),
        "{err}"
    );
}

#[test]
fn timeouts_of_zero_are_refused() {
    for (key, body) in [
        (
            "upstream.first_byte_timeout_seconds",
            "upstream:\n  first_byte_timeout_seconds: 0\n",
        ),
        (
            "upstream.request_timeout_seconds",
            "upstream:\n  request_timeout_seconds: 0\n",
        ),
        (
            "upstream.connect_timeout_ms",
            "upstream:\n  connect_timeout_ms: 0\n",
        ),
        (
            "routing.health_check.timeout_ms",
            "routing:\n  health_check: { interval_seconds: 5, timeout_ms: 0 }\n",
        ),
    ] {
        let err = stderr_of(body);
        assert!(
            err.contains(&format!("{key}: must be greater than 0")),
            "{key}: {err}"
        );
        assert!(err.contains("config.yaml:4: "), "{key}: {err}");
    }
}

#[test]
fn listen_must_be_a_socket_address() {
    let err = stderr_of("server:\n  listen: nowhere\n");
    assert!(
        err.contains("config.yaml:4: server.listen: `nowhere` is not a socket address"),
        "{err}"
    );
    for ok in [
        "127.0.0.1:8080",
        "[::1]:8080",
        "localhost:8080",
        "0.0.0.0:0",
    ] {
        let out = check(&format!("server:\n  listen: \"{ok}\"\n"));
        assert!(
            out.status.success(),
            "{ok}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn keys_and_tokens_with_control_characters_are_refused() {
    let route_with = |key: &str| {
        format!(
            "models:\n  - id: m1\n    route:\n      - kind: openai_compat\n        base_url: http://127.0.0.1:9001/v1\n        {key}\n"
        )
    };
    let err = stderr_of(&route_with("api_key: \"sk-abc\\r\\nX-Evil: 1\""));
    assert!(
        err.contains(
            "config.yaml:8: models[0] (m1).route[0].api_key: contains the control character '\\r'"
        ),
        "{err}"
    );
    let err = stderr_of(&route_with("api_keys: [ok-key, \"bad\\u0000key\"]"));
    assert!(
        err.contains("models[0] (m1).route[0].api_keys[1]: contains the control character '\\0'"),
        "{err}"
    );
    // From the environment, the way a CR LF usually arrives (a file read with its line end).
    let out = check_with_env(
        &route_with("api_key: ${SAFETY_KEY}"),
        &[("SAFETY_KEY", "sk-abc\r\n  x")],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(
            "config.yaml:8: models[0] (m1).route[0].api_key: contains the control character"
        ),
        "{err}"
    );
    let err = stderr_of("server:\n  admin_token: \"tok\\nen\"\n");
    assert!(
        err.contains("config.yaml:4: server.admin_token: contains the control character '\\n'"),
        "{err}"
    );
}

/// `check` prints each route's provider model, which shows exactly what a variable became.
fn checked_with(var: &str, value: &str, route_extra: &str) -> String {
    let body = format!(
        "models:\n  - id: m1\n    route:\n      - kind: openai_compat\n        base_url: http://127.0.0.1:9001/v1\n        provider_model_id: ${{{var}}}\n{route_extra}"
    );
    let out = check_with_env(&body, &[(var, value)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_variable_is_one_scalar_value_whatever_it_holds() {
    // Pasted into the text, `#def` became a comment.
    let out = checked_with("SAFETY_PM", "abc #def", "");
    assert!(out.contains("model=abc #def weight=1"), "{out}");
    // Pasted into the text, the newline added a key that unpublished the model.
    let out = checked_with("SAFETY_PM", "sim\n    published: false", "");
    assert!(
        out.contains("model=sim\n    published: false weight=1"),
        "{out}"
    );
    assert!(!out.contains("[unpublished]"), "{out}");
    // Quotes and braces stay too.
    let out = checked_with("SAFETY_PM", "a\"b: {c", "");
    assert!(out.contains("model=a\"b: {c weight"), "{out}");
}

#[test]
fn variables_in_numbers_defaults_and_comments() {
    let out = checked_with(
        "SAFETY_PM",
        "pm",
        "        weight: ${SAFETY_UNSET_WEIGHT:-0.25}   # ${SAFETY_NOT_NEEDED}\n        priority: ${SAFETY_PRIORITY:-2}\n",
    );
    assert!(out.contains("model=pm weight=0.25 priority=2"), "{out}");
    let out = check_with_env(
        "# needs ${SAFETY_NOT_NEEDED}\nmodels:\n  - id: m1\n    route:\n      - kind: openai_compat\n        base_url: http://127.0.0.1:9001/v1\n        weight: ${SAFETY_W}\n",
        &[("SAFETY_W", "3")],
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("weight=3"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_missing_variable_names_itself_and_its_line() {
    let err = stderr_of(
        "models:\n  - id: m1\n    route:\n      - kind: openai_compat\n        base_url: http://127.0.0.1:9001/v1\n        api_key: ${SAFETY_NOPE}\n",
    );
    assert!(
        err.contains("config.yaml:8: environment variable SAFETY_NOPE is not set (write ${SAFETY_NOPE:-} to make it optional)"),
        "{err}"
    );
}
