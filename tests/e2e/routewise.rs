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
