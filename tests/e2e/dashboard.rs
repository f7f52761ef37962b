//! The operator dashboard (`/ui/`) in a real browser: Debian's `chromium`, driven by
//! `chromedriver` over the W3C WebDriver protocol (plain JSON over HTTP, a few calls below).
//! The gateway is real, with real mock upstreams; the test sends traffic (a fallback and a
//! breaker that opens), signs in with the admin token like an operator, and reads what the page
//! shows. It also proves the page shows nothing without the token, and changes a weight through
//! the page's form.
//!
//! Chromium and its driver are installed with apt when missing (`cargo xtask ci` installs them
//! up front); when they cannot be installed the test fails rather than passing without having run.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{Gateway, Mock, chat_body, target_dir};

const ADMIN_TOKEN: &str = "dashboard-test-token";
/// How long the page may take to show something after the gateway has it: the page polls every
/// 3 s and the request log writes in batches; a loaded 2-core machine gets a wide margin.
const SHOWS_WITHIN: Duration = Duration::from_secs(60);

/// Installs Debian's `chromium` and `chromium-driver` when either is missing.
fn ensure_chromium() {
    let works = |program: &str| {
        Command::new(program)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let installed = || works("chromium") && works("chromedriver");
    if installed() {
        return;
    }
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    let install = [
        "install",
        "-y",
        "-qq",
        "--no-install-recommends",
        "chromium",
        "chromium-driver",
    ];
    if !apt(&install) {
        apt(&["update", "-qq"]);
        apt(&install);
    }
    assert!(
        installed(),
        "`chromium` and `chromedriver` are not installed and `apt-get install chromium chromium-driver` did not install them; this test needs Debian's chromium and chromium-driver packages"
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The WebDriver key that holds an element's reference in the protocol's answers.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A headless Chromium session behind its own `chromedriver`. The driver runs in a process group
/// of its own, so dropping the session ends the driver and every browser process it started.
struct Browser {
    driver: Child,
    http: reqwest::Client,
    session: String,
    log: tempfile::NamedTempFile,
}

impl Browser {
    async fn start() -> Browser {
        use std::os::unix::process::CommandExt;
        ensure_chromium();
        let port = free_port();
        let log = tempfile::NamedTempFile::new().expect("driver log file");
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .arg(format!("--log-path={}", log.path().display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("start chromedriver");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("HTTP client");
        let root = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = match http.get(format!("{root}/status")).send().await {
                Ok(r) => r.json::<Value>().await.ok(),
                Err(_) => None,
            };
            if ready.is_some_and(|s| s["value"]["ready"] == true) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not become ready on port {port} within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Root in a container: Chromium's sandbox needs namespaces it may not get.
        let capabilities = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1480,1000", "--force-device-scale-factor=1",
                         "--lang=en-US", "--no-first-run"],
            },
        }}});
        let answer = http
            .post(format!("{root}/session"))
            .json(&capabilities)
            .send()
            .await
            .expect("chromedriver reachable");
        let status = answer.status();
        let body: Value = answer.json().await.expect("new session JSON");
        let id = body["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("chromedriver refused a session ({status}): {body}"));
        Browser {
            session: format!("{root}/session/{id}"),
            driver,
            http,
            log,
        }
    }

    /// One WebDriver command; panics with the driver's error when it fails.
    async fn command(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self.http.request(method, format!("{}{path}", self.session));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer = request.send().await.expect("chromedriver reachable");
        let status = answer.status();
        let body: Value = answer.json().await.expect("WebDriver answers JSON");
        assert!(
            status.is_success(),
            "WebDriver {path} failed ({status}): {body}"
        );
        body["value"].clone()
    }

    async fn goto(&self, url: &str) {
        self.command(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await;
    }

    async fn find(&self, css: &str) -> String {
        let found = self
            .command(
                reqwest::Method::POST,
                "/element",
                Some(json!({ "using": "css selector", "value": css })),
            )
            .await;
        found[ELEMENT]
            .as_str()
            .expect("an element reference")
            .to_owned()
    }

    /// Types into the element as a user would (key events, not a value assignment).
    async fn type_into(&self, css: &str, text: &str) {
        let element = self.find(css).await;
        self.command(
            reqwest::Method::POST,
            &format!("/element/{element}/clear"),
            Some(json!({})),
        )
        .await;
        self.command(
            reqwest::Method::POST,
            &format!("/element/{element}/value"),
            Some(json!({ "text": text })),
        )
        .await;
    }

    /// Clicks the element as a user would, after scrolling it to the middle of the window (an
    /// element half off the top, under a long page, is "not interactable" to the driver).
    async fn click(&self, css: &str) {
        let selector = serde_json::to_string(css).expect("a JSON string");
        self.eval(&format!(
            "document.querySelector({selector}).scrollIntoView({{block: 'center'}}); return true"
        ))
        .await;
        let element = self.find(css).await;
        self.command(
            reqwest::Method::POST,
            &format!("/element/{element}/click"),
            Some(json!({})),
        )
        .await;
    }

    /// Runs `script` (a function body: `return …`) in the page.
    async fn eval(&self, script: &str) -> Value {
        self.command(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({ "script": script, "args": [] })),
        )
        .await
    }

    /// The page's visible text.
    async fn text(&self) -> String {
        self.eval("return document.body.innerText")
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Polls `script` until it returns something other than `null`/`false`, and returns that;
    /// panics with `what` and the page's text after [`SHOWS_WITHIN`].
    async fn wait_for(&self, what: &str, script: &str) -> Value {
        let deadline = Instant::now() + SHOWS_WITHIN;
        loop {
            let value = self.eval(script).await;
            if !value.is_null() && value != false {
                return value;
            }
            if Instant::now() > deadline {
                let shot = target_dir().join("dashboard-failure.png");
                std::fs::write(&shot, self.screenshot().await).ok();
                panic!(
                    "the dashboard never showed {what} (screenshot: {}); its text:\n{}",
                    shot.display(),
                    self.text().await
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// A PNG of the whole page: the window is first made as tall as the page.
    async fn screenshot(&self) -> Vec<u8> {
        use base64::Engine;
        let height = self
            .eval("return document.documentElement.scrollHeight")
            .await
            .as_u64()
            .unwrap_or(1000)
            .clamp(600, 6000);
        self.command(
            reqwest::Method::POST,
            "/window/rect",
            Some(json!({ "width": 1480, "height": height })),
        )
        .await;
        let png = self
            .command(reqwest::Method::GET, "/screenshot", None)
            .await;
        base64::engine::general_purpose::STANDARD
            .decode(png.as_str().expect("base64 PNG"))
            .expect("valid base64")
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Ends the driver and the browser it started (same process group; see `start`).
        let group = i32::try_from(self.driver.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw);
        if let Some(group) = group {
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
        let _ = self.driver.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.log.path()).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!(
                "--- chromedriver log (last lines, newest first) ---\n{}",
                tail.join("\n")
            );
        }
    }
}

fn config(a: &Mock, b: &Mock, c: &Mock) -> String {
    format!(
        r#"server:
  admin_token: "{ADMIN_TOKEN}"
health:
  failure_threshold: 2
  cooldown_seconds: 600
models:
  - id: ui-chat
    router: fixed
    route:
      - {{ kind: openai_compat, base_url: "{a}", provider_model_id: sim-a, priority: 1, weight: 1 }}
      - {{ kind: openai_compat, base_url: "{b}", provider_model_id: sim-b, priority: 0, weight: 1 }}
  - id: ui-rr
    router: round_robin
    route:
      - {{ kind: openai_compat, base_url: "{c}", provider_model_id: sim-c }}
      - {{ kind: openai_compat, base_url: "{b}", provider_model_id: sim-b }}
"#,
        a = a.base_url(),
        b = b.base_url(),
        c = c.base_url(),
    )
}

/// A chat request with the caller's own request id, which the request log keeps.
async fn chat(gw: &Gateway, model: &str, request_id: &str) {
    let answer = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .header("x-request-id", request_id)
        .json(&chat_body(model, false))
        .send()
        .await
        .expect("gateway reachable");
    let status = answer.status();
    let text = answer.text().await.unwrap_or_default();
    assert_eq!(status, 200, "{model} {request_id}: {text}");
}

#[tokio::test]
async fn the_dashboard_shows_models_endpoints_and_requests_to_an_admin_only() {
    let (a, b, c) = (Mock::start(&[]), Mock::start(&[]), Mock::start(&[]));
    let gw = Gateway::start(&config(&a, &b, &c));
    let endpoint = |model: &str, mock: &Mock| format!("{model}:local-{}", mock.port);
    let (a_id, b_id, c_id) = (
        endpoint("ui-chat", &a),
        endpoint("ui-chat", &b),
        endpoint("ui-rr", &c),
    );

    // Traffic: ui-chat's primary fails once (the request falls back to its backup), then serves;
    // ui-rr's first upstream always fails, so its breaker opens after two failures.
    a.behave(json!({ "fail_status": 500, "fail_count": 1 }))
        .await;
    c.behave(json!({ "fail_status": 500 })).await;
    chat(&gw, "ui-chat", "ui-fallback-1").await;
    for i in 0..4 {
        chat(&gw, "ui-chat", &format!("ui-chat-{i}")).await;
    }
    for i in 0..6 {
        chat(&gw, "ui-rr", &format!("ui-rr-{i}")).await;
    }

    // The files are public and carry no data; everything with data wants the token.
    let http = reqwest::Client::new();
    for (path, content_type) in [
        ("/ui/", "text/html; charset=utf-8"),
        ("/ui/app.js", "text/javascript; charset=utf-8"),
        ("/ui/app.css", "text/css; charset=utf-8"),
    ] {
        let answer = http.get(gw.url(path)).send().await.expect("gateway");
        assert_eq!(answer.status(), 200, "{path}");
        assert_eq!(answer.headers()["content-type"], content_type, "{path}");
        let body = answer.text().await.expect("body");
        for secret in ["ui-chat", "local-", ADMIN_TOKEN] {
            assert!(!body.contains(secret), "{path} shows {secret}");
        }
    }
    // `GET /admin/logs` comes from the request-log API's own change; until the gateway has it the
    // page must say the log is not available and still show everything else.
    let has_request_log = http
        .get(gw.url("/admin/logs"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("gateway")
        .status()
        == 200;
    eprintln!("GET /admin/logs exists: {has_request_log}");
    let mut data_paths = vec![
        "/routing",
        "/health/deep",
        "/admin/routing/weights",
        "/metrics",
    ];
    if has_request_log {
        data_paths.push("/admin/logs");
    }
    for path in data_paths {
        let status = http
            .get(gw.url(path))
            .send()
            .await
            .expect("gateway")
            .status();
        assert_eq!(status, 401, "{path} without the token");
        let status = http
            .get(gw.url(path))
            .bearer_auth("not-the-token")
            .send()
            .await
            .expect("gateway")
            .status();
        assert_eq!(status, 401, "{path} with a wrong token");
    }

    let browser = Browser::start().await;
    browser.goto(&gw.url("/ui/")).await;
    browser
        .wait_for(
            "the sign-in form",
            "return !document.getElementById('login').hidden",
        )
        .await;

    // A wrong token: refused, and nothing is shown.
    browser.type_into("#token", "not-the-token").await;
    browser.click("#login-button").await;
    let refused = browser
        .wait_for(
            "that the token was refused",
            "const t = document.getElementById('login-error').innerText; return t.includes('refused') && t",
        )
        .await;
    assert!(
        refused.as_str().unwrap_or_default().contains("401"),
        "{refused}"
    );
    let text = browser.text().await;
    for secret in ["ui-chat", "ui-rr", "local-"] {
        assert!(
            !text.contains(secret),
            "without the token the page shows {secret}:\n{text}"
        );
    }
    assert_eq!(
        browser
            .eval("return document.getElementById('dashboard').hidden")
            .await,
        true
    );

    // The admin token: models with their strategies.
    browser.type_into("#token", ADMIN_TOKEN).await;
    browser.click("#login-button").await;
    let models = browser
        .wait_for(
            "both models",
            "const t = document.getElementById('models').innerText; return t.includes('ui-chat') && t.includes('ui-rr') && t",
        )
        .await;
    let strategy = |model: &str| {
        format!(
            "return document.querySelector('#models tr[data-model=\"{model}\"] td:nth-child(2)').innerText"
        )
    };
    assert!(
        browser
            .eval(&strategy("ui-chat"))
            .await
            .as_str()
            .unwrap_or_default()
            .contains("fixed"),
        "{models}"
    );
    assert!(
        browser
            .eval(&strategy("ui-rr"))
            .await
            .as_str()
            .unwrap_or_default()
            .contains("round_robin"),
        "{models}"
    );

    // Endpoints with their breakers: ui-rr's failing upstream is open, the others closed.
    let circuit = |id: &str| {
        format!(
            "const r = document.querySelector('#endpoints tr[data-endpoint=\"{id}\"] .circuit'); return r && r.innerText"
        )
    };
    browser
        .wait_for(
            &format!("{c_id}'s open breaker"),
            &format!(
                "const r = document.querySelector('#endpoints tr[data-endpoint=\"{c_id}\"] .circuit .pill'); return r && r.innerText === 'open'"
            ),
        )
        .await;
    for id in [&a_id, &b_id] {
        let state = browser.eval(&circuit(id)).await;
        assert!(
            state.as_str().unwrap_or_default().contains("closed"),
            "{id}: {state}"
        );
    }
    // Live rates come from two /metrics polls; the row has its columns either way.
    let availability = browser
        .eval(&format!(
            "return document.querySelector('#endpoints tr[data-endpoint=\"{c_id}\"] td:nth-child(4)').innerText"
        ))
        .await;
    assert!(
        availability.as_str().unwrap_or_default().ends_with('%'),
        "{availability}"
    );

    if has_request_log {
        recent_requests_are_shown(&browser, &a_id, &b_id).await;
    } else {
        for id in ["logs-note", "chart-ttft", "chart-latency"] {
            browser
                .wait_for(
                    "that the request log is not available",
                    &format!(
                        "return document.getElementById('{id}').innerText.includes('Request log not available')"
                    ),
                )
                .await;
        }
    }

    // After a reload the tab still holds the token: no second sign-in.
    browser.goto(&gw.url("/ui/")).await;
    browser
        .wait_for(
            "the dashboard after a reload",
            "return document.getElementById('models').innerText.includes('ui-chat')",
        )
        .await;
    if has_request_log {
        browser
            .wait_for(
                "the request log after a reload",
                &format!("return {FALLBACK_ROW} !== null"),
            )
            .await;
    }
    // A budget shows with its spend against its limit.
    let created = http
        .post(gw.url("/admin/budgets"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"scope": "group", "subject": "gold", "period": "day", "mode": "soft", "limit_usd": 5}))
        .send()
        .await
        .expect("gateway");
    assert_eq!(created.status(), 201, "{:?}", created.text().await);
    browser
        .wait_for(
            "the budget in the Budgets card",
            "const t = document.getElementById('budgets').innerText; \
             return t.includes('group:gold') && t.includes('$5.0000') && t.includes('soft')",
        )
        .await;
    // Rates need two /metrics polls: wait for the second, so the picture shows them.
    browser
        .wait_for(
            "live attempt rates",
            &format!(
                "const c = document.querySelector('#endpoints tr[data-endpoint=\"{a_id}\"] td:nth-child(7)'); return c && /^[0-9]/.test(c.innerText)"
            ),
        )
        .await;
    browser.eval("window.scrollTo(0, 0); return true").await;
    let shot = browser.screenshot().await;
    assert!(shot.starts_with(b"\x89PNG"), "a PNG screenshot");
    std::fs::write(target_dir().join("dashboard.png"), &shot).expect("write the screenshot");

    // A weight changed in the page goes through the admin API.
    let form = "form[data-model=\"ui-chat\"]";
    browser
        .type_into(&format!("{form} input[data-endpoint=\"{a_id}\"]"), "0")
        .await;
    browser.click(&format!("{form} button.apply")).await;
    let overrides = wait_for_overrides(&gw, |o| o["weights"]["ui-chat"][&a_id] == 0.0).await;
    assert_eq!(
        overrides["weights"]["ui-chat"],
        json!({ (a_id.as_str()): 0.0 })
    );
    browser
        .wait_for(
            "the effective weight 0",
            &format!(
                "const r = document.querySelector('{form} input[data-endpoint=\"{a_id}\"]').closest('tr'); return r.querySelector('.effective').innerText === '0'"
            ),
        )
        .await;
    // The request now goes to the backup: the page's change reached routing.
    let served_before = b.chat_requests().await;
    chat(&gw, "ui-chat", "ui-after-weight").await;
    assert_eq!(b.chat_requests().await, served_before + 1);
    browser.click(&format!("{form} button.clear")).await;
    wait_for_overrides(&gw, |o| o["weights"].get("ui-chat").is_none()).await;

    // Signing out forgets the token and the data, also across a reload.
    browser.click("#logout").await;
    browser
        .wait_for(
            "the sign-in form after signing out",
            "return !document.getElementById('login').hidden && document.getElementById('models').childElementCount === 0",
        )
        .await;
    browser.goto(&gw.url("/ui/")).await;
    browser
        .wait_for(
            "the sign-in form after a reload",
            "return !document.getElementById('login').hidden",
        )
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let text = browser.text().await;
    for secret in ["ui-chat", "ui-rr", "local-"] {
        assert!(
            !text.contains(secret),
            "signed out, the page shows {secret}:\n{text}"
        );
    }
}

/// The request that fell back, in the page's recent requests.
const FALLBACK_ROW: &str =
    "document.querySelector('#requests tr[data-request-id=\"ui-fallback-1\"]')";

/// The recent requests: the fallback with both attempts in order, every request, and the charts.
async fn recent_requests_are_shown(browser: &Browser, a_id: &str, b_id: &str) {
    browser
        .wait_for(
            "the request that fell back",
            &format!("return {FALLBACK_ROW} !== null"),
        )
        .await;
    let attempts = browser
        .eval(&format!(
            "return [...{FALLBACK_ROW}.querySelectorAll('li.attempt')].map(li => [li.dataset.endpoint, li.innerText, li.className])"
        ))
        .await;
    let attempts = attempts.as_array().expect("attempt list");
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(attempts[0][0], a_id, "{attempts:?}");
    assert!(
        attempts[0][1].as_str().unwrap_or_default().contains("500"),
        "{attempts:?}"
    );
    assert!(
        attempts[0][2]
            .as_str()
            .unwrap_or_default()
            .contains("failed"),
        "{attempts:?}"
    );
    assert_eq!(attempts[1][0], b_id, "{attempts:?}");
    assert!(
        attempts[1][1].as_str().unwrap_or_default().contains("200"),
        "{attempts:?}"
    );
    let row = browser
        .eval(&format!("return {FALLBACK_ROW}.innerText"))
        .await;
    let row = row.as_str().unwrap_or_default();
    assert!(row.contains("fell back") && row.contains(b_id), "{row}");
    let decision = browser
        .eval(&format!(
            "return {FALLBACK_ROW}.querySelector('td.decision').innerText"
        ))
        .await;
    let decision = decision.as_str().unwrap_or_default();
    assert!(
        decision.contains("fixed") && decision.contains(a_id),
        "the routing decision (strategy and order): {decision}"
    );
    browser
        .wait_for(
            "the other requests",
            "return document.querySelectorAll('#requests tbody tr').length >= 11",
        )
        .await;
    // The charts draw one point per logged request.
    let points = browser
        .wait_for(
            "latency points",
            "const n = document.querySelectorAll('#chart-latency svg circle').length; return n >= 11 && n",
        )
        .await;
    assert!(points.as_u64().unwrap_or(0) >= 11, "{points}");
}

/// Polls `GET /admin/routing/weights` until `ok` holds, and returns it.
async fn wait_for_overrides(gw: &Gateway, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + SHOWS_WITHIN;
    loop {
        let overrides: Value = reqwest::Client::new()
            .get(gw.url("/admin/routing/weights"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("gateway")
            .json()
            .await
            .expect("overrides JSON");
        if ok(&overrides) {
            return overrides;
        }
        assert!(
            Instant::now() < deadline,
            "the page's change never reached the admin API: {overrides}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
