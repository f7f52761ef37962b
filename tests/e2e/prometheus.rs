//! The real consumer: Debian's `prometheus` scrapes a running gateway (its metrics listener
//! without a token, and the main listener's `/metrics` with the admin token), and its HTTP API
//! shows the gateway's series. This proves the exposition is accepted by Prometheus itself, not
//! only by a parser written for the test.
//!
//! Prometheus is installed with apt when missing (`cargo xtask ci` installs it up front); when it
//! cannot be installed the test fails rather than passing without having run.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::{Gateway, Mock, chat_body};

const ADMIN_TOKEN: &str = "prometheus-test-token";

/// The `prometheus` binary, installed from Debian's package when it is not on the machine.
fn prometheus_binary() -> &'static str {
    let works = || {
        Command::new("prometheus")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !works() {
        let install = |args: &[&str]| {
            Command::new("apt-get")
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status()
                .is_ok_and(|s| s.success())
        };
        if !install(&["install", "-y", "-qq", "prometheus"]) {
            install(&["update", "-qq"]);
            install(&["install", "-y", "-qq", "prometheus"]);
        }
        assert!(
            works(),
            "`prometheus` is not installed and `apt-get install -y prometheus` did not install it; this test needs Debian's prometheus package"
        );
    }
    "prometheus"
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

struct Prometheus {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(metrics_target: &str, main_target: &str) -> Prometheus {
        let binary = prometheus_binary();
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: switchyard\n    static_configs:\n      - targets: ['{metrics_target}']\n  - job_name: switchyard-admin\n    authorization:\n      credentials: {ADMIN_TOKEN}\n    static_configs:\n      - targets: ['{main_target}']\n"
            ),
        )
        .expect("write prometheus.yml");
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log file");
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        Prometheus { child, port, dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `/api/v1/query`'s result vector, empty while Prometheus is not up yet.
    async fn query(&self, promql: &str) -> Vec<serde_json::Value> {
        let response = reqwest::Client::new()
            .get(format!("http://127.0.0.1:{}/api/v1/query", self.port))
            .query(&[("query", promql)])
            .send()
            .await;
        let Ok(response) = response else {
            return Vec::new();
        };
        let Ok(body) = response.json::<serde_json::Value>().await else {
            return Vec::new();
        };
        body["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Polls `promql` until a series satisfies `ok`, or panics after `within`.
    async fn wait_for(
        &self,
        promql: &str,
        within: Duration,
        ok: impl Fn(&serde_json::Value, f64) -> bool,
    ) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + within;
        loop {
            let result = self.query(promql).await;
            if result.iter().any(|series| {
                let value = series["value"][1]
                    .as_str()
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(f64::NAN);
                ok(&series["metric"], value)
            }) {
                return result;
            }
            assert!(
                Instant::now() < deadline,
                "Prometheus never showed {promql} as expected; last result: {result:?}\n--- prometheus log ---\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_gateway_series() {
    let a = Mock::start(&[]);
    let b = Mock::start(&[]);
    a.behave(json!({ "fail_status": 500 })).await;
    let gw = Gateway::start(&format!(
        "server:\n  admin_token: {ADMIN_TOKEN}\n  metrics_listen: 127.0.0.1:0\nmodels:\n  - id: demo\n    router: fixed\n    route:\n      - kind: openai_compat\n        weight: 1.0\n        base_url: {}\n      - kind: openai_compat\n        weight: 1e-9\n        base_url: {}\n",
        a.base_url(),
        b.base_url()
    ));
    for _ in 0..3 {
        assert_eq!(gw.chat(chat_body("demo", false)).await.0, 200);
    }
    let metrics = crate::observe::metrics_url(&gw).await;
    let metrics_target = metrics
        .trim_start_matches("http://")
        .trim_end_matches("/metrics")
        .to_owned();
    let prometheus = Prometheus::start(&metrics_target, &format!("127.0.0.1:{}", gw.port));
    // A slow machine: Prometheus may take a while to start; the assertion is what it scraped.
    let within = Duration::from_secs(90);
    prometheus
        .wait_for("up", within, |m, v| m["job"] == "switchyard" && v == 1.0)
        .await;
    prometheus
        .wait_for("up", within, |m, v| {
            m["job"] == "switchyard-admin" && v == 1.0
        })
        .await;
    let b_id = format!("demo:local-{}", b.port);
    prometheus
        .wait_for(
            "gen_ai_server_request_duration_seconds_count{model=\"demo\"}",
            within,
            |m, v| m["endpoint"] == b_id.as_str() && m["status_class"] == "2xx" && v == 3.0,
        )
        .await;
    prometheus
        .wait_for("switchyard_fallbacks_total", within, |m, v| {
            m["model"] == "demo" && m["job"] == "switchyard-admin" && v == 3.0
        })
        .await;
    // Buckets arrive as buckets: B's three successful attempts are under `le="+Inf"`.
    prometheus
        .wait_for(
            "gen_ai_client_operation_duration_seconds_bucket{le=\"+Inf\",error_type=\"none\",job=\"switchyard\"}",
            within,
            |m, v| m["endpoint"] == b_id.as_str() && v == 3.0,
        )
        .await;
    prometheus
        .wait_for("switchyard_endpoint_availability", within, |m, v| {
            m["endpoint"] == format!("demo:local-{}", a.port).as_str() && v < 1.0
        })
        .await;
}
