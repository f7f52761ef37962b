//! RouteWise as a built-in strategy behind the real gateway: it explores, learns latencies from
//! observations, and trades cost against latency as `budget_alpha` says.

use crate::harness::{Gateway, Mock, chat_body};

async fn run(alpha: f64) -> (u64, u64) {
    let cheap_slow = Mock::start(&["--ttft-ms", "150"]);
    let dear_fast = Mock::start(&[]);
    let gw = Gateway::start(&format!(
        "server: {{ admin_token: deep-admin }}
models:
  - id: m
    router: routewise
    router_params: {{ budget_alpha: {alpha} }}
    route:
      - kind: openai_compat
        base_url: {}
        pricing: {{ prompt: 0.1, completion: 0.4 }}
      - kind: openai_compat
        base_url: {}
        pricing: {{ prompt: 5.0, completion: 20.0 }}
",
        cheap_slow.base_url(),
        dear_fast.base_url()
    ));
    // Exploration measures both endpoints first; then the LP decides.
    for _ in 0..30 {
        let (status, body) = gw.chat(chat_body("m", false)).await;
        assert_eq!(status, 200, "{body}");
    }
    let routing: serde_json::Value = gw.deep("deep-admin").await;
    assert_eq!(routing["routers"][0]["failures"], 0, "{routing}");
    (
        cheap_slow.chat_requests().await,
        dear_fast.chat_requests().await,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alpha_zero_buys_the_cheapest_and_alpha_one_the_fastest() {
    let (cheap, dear) = run(0.0).await;
    assert!(
        cheap >= 25,
        "α=0 puts the mass on the cheaper route: {cheap} vs {dear}"
    );
    let (cheap, dear) = run(1.0).await;
    assert!(dear >= 25, "α=1 buys latency: {cheap} vs {dear}");
}

/// Observations that find the model's strategy instance busy are queued and delivered first by
/// its next call: after requests from many clients at once, the strategy has learned from every
/// one of them (its counter of observations), none lost or counted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_answer_of_concurrent_clients_reaches_the_strategy_once() {
    const CLIENTS: usize = 16;
    const EACH: usize = 25;
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&format!(
        "server: {{ admin_token: busy-admin }}
models:
  - id: m
    router: routewise
    route:
      - kind: openai_compat
        base_url: {}
        pricing: {{ prompt: 0.1, completion: 0.4 }}
",
        mock.base_url()
    ));
    let client = reqwest::Client::new();
    let clients = (0..CLIENTS).map(|_| {
        let (client, url) = (client.clone(), gw.url("/v1/chat/completions"));
        tokio::spawn(async move {
            for _ in 0..EACH {
                let response = client
                    .post(&url)
                    .json(&chat_body("m", false))
                    .send()
                    .await
                    .expect("gateway reachable");
                assert_eq!(response.status(), 200);
                response.bytes().await.expect("answer read");
            }
        })
    });
    for client in futures::future::join_all(clients).await {
        client.expect("client task");
    }
    // An attempt is observed as it ends, which may be just after its answer was read: wait for
    // the last ones (a generous deadline; the count must then be exact).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let observed = loop {
        let routing: serde_json::Value = client
            .get(gw.url("/routing"))
            .bearer_auth("busy-admin")
            .send()
            .await
            .expect("gateway reachable")
            .json()
            .await
            .expect("routing is JSON");
        let observed = routing["models"][0]["strategy_status"]["counters"]["observations"]
            .as_u64()
            .unwrap_or_else(|| panic!("no count of observations: {routing}"));
        if observed as usize >= CLIENTS * EACH || std::time::Instant::now() > deadline {
            break observed;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(observed as usize, CLIENTS * EACH);
}
