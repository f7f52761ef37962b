//! The official `openai` and `anthropic` Python SDKs against the running gateway, with upstreams of
//! each protocol behind it (tests/sdk/test_clients.py). The test builds its own virtualenv with the
//! pinned packages (tests/sdk/requirements.txt) under the cargo target dir, once
//! ([`python_venv`]).

use std::process::Command;

use crate::harness::{Gateway, Mock, python_venv, repo};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_sdks_parse_every_protocol_pair() {
    let python =
        tokio::task::spawn_blocking(|| python_venv("sdk-venv", "tests/sdk/requirements.txt"))
            .await
            .unwrap();
    let openai = Mock::start(&["--protocol", "openai", "--tool-call"]);
    let responses = Mock::start(&["--protocol", "openai_responses", "--tool-call"]);
    let anthropic = Mock::start(&["--protocol", "anthropic", "--tool-call"]);
    let embed = Mock::start(&[]);
    let gw = Gateway::start(&format!(
        "models:
  - id: via-openai
    route:
      - kind: openai_compat
        base_url: http://127.0.0.1:{}/v1
        provider_model_id: sim-openai
  - id: via-responses
    route:
      - kind: openai_responses
        base_url: http://127.0.0.1:{}/v1
        provider_model_id: sim-responses
  - id: via-anthropic
    route:
      - kind: anthropic
        base_url: http://127.0.0.1:{}
        provider_model_id: sim-anthropic
  - id: embed
    route:
      - kind: openai_compat
        base_url: http://127.0.0.1:{}/v1
",
        openai.port, responses.port, anthropic.port, embed.port
    ));
    let url = gw.url("");
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/sdk"])
            .current_dir(repo())
            .env("SWITCHYARD_URL", url)
            .env("SWITCHYARD_KEY", "sk-sdk-test")
            .output()
            .expect("run pytest")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("{stdout}");
    assert!(
        output.status.success(),
        "SDK client tests failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Each upstream really received its own protocol.
    for (mock, path) in [
        (&openai, "/v1/chat/completions"),
        (&responses, "/v1/responses"),
        (&anthropic, "/v1/messages"),
    ] {
        let stats = mock.stats().await;
        assert!(stats["chat_requests"].as_u64().unwrap() >= 11, "{stats}");
        assert_eq!(stats["last_path"], path, "{stats}");
    }
}
