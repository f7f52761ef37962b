//! Starting the real `switchyard` binary and real mock upstreams on free loopback ports.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use sqlx::Connection;

pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_switchyard")
}

/// The cargo target dir the binary was built into (`target/debug/switchyard` → `target`).
pub fn target_dir() -> PathBuf {
    Path::new(binary())
        .parent()
        .and_then(Path::parent)
        .expect("binary lives in <target>/<profile>/")
        .to_owned()
}

/// A component built by `cargo xtask build-strategies`: built-ins under `strategies/`, the
/// deliberately bad test components under `strategies-testing/`.
pub fn component(folder: &str, name: &str) -> PathBuf {
    let path = target_dir().join(folder).join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "{} is missing: run `cargo xtask build-strategies` first (the README's test command does)",
        path.display()
    );
    path
}

/// The repository's root (the test crate's parent). `cargo test` names the crate's folder in the
/// environment: a CI clone that reuses an earlier clone's target directory may run a test binary
/// cargo did not rebuild, whose compiled-in path is the earlier clone.
pub fn repo() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("..")
}

/// One virtualenv is built at a time (tests run in parallel, and two may want the same one).
static VENV_BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A virtualenv named `name` under the cargo target dir (outside the clone) with the pinned
/// packages of `requirements` (relative to the repository), built once and rebuilt when that file
/// changes. Returns its `python`.
pub fn python_venv(name: &str, requirements: &str) -> PathBuf {
    let _one_at_a_time = VENV_BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let requirements = repo().join(requirements);
    let wanted = std::fs::read_to_string(&requirements)
        .unwrap_or_else(|e| panic!("{}: {e}", requirements.display()));
    let venv = target_dir().join(name);
    let marker = venv.join("requirements.installed");
    let python = venv.join("bin/python");
    if std::fs::read_to_string(&marker).ok().as_deref() == Some(wanted.as_str()) && python.exists()
    {
        return python;
    }
    let _ = std::fs::remove_dir_all(&venv);
    let status = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .expect("python3 is needed for the tests that run Python clients or servers");
    assert!(status.success(), "creating the virtualenv {name} failed");
    let status = Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-r",
        ])
        .arg(&requirements)
        .status()
        .expect("pip");
    assert!(
        status.success(),
        "installing {} failed",
        requirements.display()
    );
    std::fs::write(&marker, wanted).expect("marker");
    python
}

fn configure(cmd: &mut Command) {
    cmd.env("SWITCHYARD_CACHE_DIR", target_dir().join("wasmtime-cache"))
        .env(
            "SWITCHYARD_BUILTIN_STRATEGIES",
            target_dir().join("strategies"),
        )
        .env_remove("SWITCHYARD_CONFIG")
        // Most tests are not about authentication; those that are set `consumer_keys` again or
        // declare routes.
        .env("SWITCHYARD_DEFAULT_AUTH", "disabled")
        .env("RUST_LOG", "info,switchyard=debug");
    // What the quota sources and the single-process guard read must come from the test alone.
    for var in [
        // Traces are off unless a test turns them on.
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_SDK_DISABLED",
        "OTEL_SERVICE_NAME",
        "CHUTES_API_KEY",
        "CHUTES_API_BASE",
        "MINIMAX_API_KEY",
        "MINIMAX_API_BASE",
        "SWITCHYARD_REPLICAS",
        "WEB_CONCURRENCY",
        "UVICORN_WORKERS",
        "GUNICORN_WORKERS",
    ] {
        cmd.env_remove(var);
    }
}

/// Reads the child's first stdout line (`... listening on http://ADDR`) and returns the port.
pub fn read_port(child: &mut Child, what: &str) -> u16 {
    try_read_port(child, what).unwrap_or_else(|e| panic!("{e}"))
}

/// [`read_port`], saying why there is no port instead of panicking.
fn try_read_port(child: &mut Child, what: &str) -> Result<u16, String> {
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| format!("{what}: reading its first line: {e}"))?;
    line.trim()
        .rsplit("http://")
        .next()
        .and_then(|addr| addr.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("{what} did not announce its address; first line: {line:?}"))
}

/// A running `switchyard mock-upstream`.
pub struct Mock {
    pub port: u16,
    child: Child,
}

impl Mock {
    pub fn start(extra: &[&str]) -> Mock {
        let mut cmd = Command::new(binary());
        cmd.args(["mock-upstream", "--port", "0"]).args(extra);
        configure(&mut cmd);
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn mock-upstream");
        let port = read_port(&mut child, "mock-upstream");
        Mock { port, child }
    }

    /// The base URL a route points at.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    pub async fn stats(&self) -> serde_json::Value {
        reqwest::get(format!("http://127.0.0.1:{}/_mock/stats", self.port))
            .await
            .expect("mock stats")
            .json()
            .await
            .expect("mock stats JSON")
    }

    pub async fn chat_requests(&self) -> u64 {
        self.stats().await["chat_requests"].as_u64().unwrap_or(0)
    }

    pub async fn behave(&self, behaviour: serde_json::Value) {
        let status = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{}/_mock/behaviour", self.port))
            .json(&behaviour)
            .send()
            .await
            .expect("mock behaviour")
            .status();
        assert!(
            status.is_success(),
            "mock refused behaviour {behaviour}: {status}"
        );
    }

    /// Ends the process, as a crashed upstream would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A running `switchyard serve` with a config written to a temporary folder.
pub struct Gateway {
    pub port: u16,
    child: Child,
    pub dir: tempfile::TempDir,
}

impl Gateway {
    /// Starts the gateway on port 0 with `body_yaml` (everything after the `database:` section).
    ///
    /// Every test request comes from 127.0.0.1 without a key, i.e. from one anonymous caller, whom
    /// session affinity would keep on one endpoint; tests about weights and fallback turn it off,
    /// affinity tests use [`Gateway::start_with_env`] to turn it on.
    pub fn start(body_yaml: &str) -> Gateway {
        Self::start_with_env(body_yaml, &[("ROUTING_AFFINITY_ENABLED", "0")])
    }

    /// Like [`Gateway::start`], with extra environment variables for the gateway process.
    pub fn start_with_env(body_yaml: &str, env: &[(&str, &str)]) -> Gateway {
        Self::start_on(None, body_yaml, env)
    }

    /// Like [`Gateway::start_with_env`] on the database at `database_url` (a SQLite file in the
    /// test's folder when `None`).
    pub fn start_on(database_url: Option<&str>, body_yaml: &str, env: &[(&str, &str)]) -> Gateway {
        Self::start_via(Command::new(binary()), database_url, body_yaml, env)
    }

    /// Like [`Gateway::start`], with the process's file limit (soft and hard) set to `nofile`.
    pub fn start_with_file_limit(body_yaml: &str, nofile: u32) -> Gateway {
        let mut sh = Command::new("sh");
        sh.arg("-c")
            .arg(format!("ulimit -n {nofile} && exec \"$0\" \"$@\""))
            .arg(binary());
        Self::start_via(sh, None, body_yaml, &[("ROUTING_AFFINITY_ENABLED", "0")])
    }

    /// Starts `cmd` (the binary, or a shell that execs it) with `serve` and its arguments.
    fn start_via(
        mut cmd: Command,
        database_url: Option<&str>,
        body_yaml: &str,
        env: &[(&str, &str)],
    ) -> Gateway {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = write_config_on(dir.path(), database_url, body_yaml);
        cmd.args(["serve", "--config"])
            .arg(&config)
            .args(["--listen", "127.0.0.1:0"]);
        configure(&mut cmd);
        cmd.envs(env.iter().copied());
        let log = std::fs::File::create(dir.path().join("gateway.log")).expect("log file");
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawn switchyard serve");
        let port = try_read_port(&mut child, "switchyard serve").unwrap_or_else(|e| {
            // The log is in the test's folder, which goes with the panic: say what it held. Killed
            // first, so a child that printed something else cannot keep the wait from returning.
            let _ = child.kill();
            let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
            let log = std::fs::read_to_string(dir.path().join("gateway.log")).unwrap_or_default();
            let from = (log.len().saturating_sub(4000)..log.len())
                .find(|&i| log.is_char_boundary(i))
                .unwrap_or(log.len());
            let tail = &log[from..];
            panic!("{e}; the process ended ({status}); its log ends:\n{tail}")
        });
        Gateway { port, child, dir }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// The gateway's process id, for reading its `/proc` entries.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM, as a process supervisor stopping the gateway does.
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM failed");
    }

    /// The exit status, once the process has exited; `None` if it is still running after `within`.
    pub fn wait_exit(&mut self, within: std::time::Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for serve") {
                return Some(status);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Everything the gateway logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("gateway.log")).unwrap_or_default()
    }

    pub async fn chat(&self, body: serde_json::Value) -> (u16, serde_json::Value) {
        let (status, text) = self.chat_text(body).await;
        let json = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("gateway answered non-JSON ({e}): {text}"));
        (status, json)
    }

    /// `POST /v1/chat/completions`, its answer read whole as text (a stream's frames, say).
    pub async fn chat_text(&self, body: serde_json::Value) -> (u16, String) {
        let response = reqwest::Client::new()
            .post(self.url("/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .expect("gateway reachable");
        let status = response.status().as_u16();
        (status, response.text().await.expect("body"))
    }
}

impl Gateway {
    /// `GET /health/deep` with the admin token (it is behind the admin rule unless
    /// `routing.public_health_deep` is set); panics unless it answers 200.
    pub async fn deep(&self, admin_token: &str) -> serde_json::Value {
        let text = self.admin_get("/health/deep", admin_token).await;
        serde_json::from_str(&text).expect("/health/deep is JSON")
    }

    /// `GET /metrics` on the main listener with the admin token; panics unless it answers 200.
    pub async fn metrics(&self, admin_token: &str) -> String {
        self.admin_get("/metrics", admin_token).await
    }

    /// `GET path` with the admin token; the body, after a panic naming the path unless it is 200.
    async fn admin_get(&self, path: &str, admin_token: &str) -> String {
        let response = reqwest::Client::new()
            .get(self.url(path))
            .bearer_auth(admin_token)
            .send()
            .await
            .expect("gateway reachable");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        assert_eq!(status, 200, "{path} answered {status}: {text}");
        text
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- gateway log ---\n{}", self.log());
        }
    }
}

/// Writes `config.yaml` with a SQLite file in `dir` and returns its path. The listen address comes
/// from `--listen`, so `body_yaml` may have its own `server:` section.
pub fn write_config(dir: &Path, body_yaml: &str) -> PathBuf {
    write_config_on(dir, None, body_yaml)
}

/// [`write_config`] with the database at `database_url` instead.
pub fn write_config_on(dir: &Path, database_url: Option<&str>, body_yaml: &str) -> PathBuf {
    let path = dir.join("config.yaml");
    let url = database_url
        .map(str::to_owned)
        .unwrap_or_else(|| format!("sqlite://{}", dir.join("switchyard.db").display()));
    let text = format!("database:\n  url: \"{url}\"\n{body_yaml}");
    std::fs::write(&path, text).expect("write config");
    path
}

/// Runs `switchyard check` on a config body.
pub fn check(body_yaml: &str) -> Output {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), body_yaml);
    let mut cmd = Command::new(binary());
    cmd.args(["check", "--config"]).arg(&config);
    configure(&mut cmd);
    cmd.output().expect("run switchyard check")
}

/// Runs `switchyard check` on a config body with extra environment variables.
pub fn check_with_env(body_yaml: &str, env: &[(&str, &str)]) -> Output {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), body_yaml);
    let mut cmd = Command::new(binary());
    cmd.args(["check", "--config"]).arg(&config);
    configure(&mut cmd);
    cmd.envs(env.iter().copied());
    cmd.output().expect("run switchyard check")
}

/// Runs `switchyard serve` on a config body that must make it refuse to start; returns what it
/// wrote to stderr. Panics if it starts listening or is still running after a minute.
pub fn serve_refuses(body_yaml: &str, env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), body_yaml);
    let mut cmd = Command::new(binary());
    cmd.args(["serve", "--config"])
        .arg(&config)
        .args(["--listen", "127.0.0.1:0"]);
    configure(&mut cmd);
    cmd.envs(env.iter().copied());
    let log = dir.path().join("stderr.log");
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("spawn switchyard serve");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for serve") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "serve did not refuse to start:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!status.success(), "serve exited successfully:\n{stderr}");
    stderr
}

/// A minimal chat request body.
pub fn chat_body(model: &str, stream: bool) -> serde_json::Value {
    serde_json::json!({
        "model": model,
        "stream": stream,
        "messages": [{ "role": "user", "content": "Say hello." }],
    })
}

/// Tests that use PostgreSQL hold this shared; a test that restarts the server holds it
/// exclusively, so no other test sees the outage.
pub static POSTGRES_IN_USE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// The test server's URL: `SWITCHYARD_TEST_PG_URL`, else the machine's local server.
pub fn postgres_base_url() -> String {
    std::env::var("SWITCHYARD_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A fresh schema in the test database, dropped on drop.
pub struct PgSchema {
    base: String,
    name: String,
    pub url: String,
    /// Held while the schema lives, so a test restarting the server waits for the others.
    _shared: Option<tokio::sync::RwLockReadGuard<'static, ()>>,
}

impl PgSchema {
    pub async fn create() -> PgSchema {
        let shared = POSTGRES_IN_USE.read().await;
        let mut schema = Self::create_unguarded().await;
        schema._shared = Some(shared);
        schema
    }

    /// A schema for a test that holds [`POSTGRES_IN_USE`] exclusively itself.
    pub async fn create_unguarded() -> PgSchema {
        let base = postgres_base_url();
        let name = format!("sy_e2e_{:016x}", rand::random::<u64>());
        let mut conn =
            match tokio::time::timeout(Duration::from_secs(10), sqlx::PgConnection::connect(&base))
                .await
            {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => panic!(
                    "PostgreSQL is unreachable at {base}: {e}\nStart it with \
                 `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`."
                ),
                Err(_) => panic!("PostgreSQL at {base} did not answer within 10 s"),
            };
        sqlx::query(&format!("CREATE SCHEMA {name}"))
            .execute(&mut conn)
            .await
            .unwrap();
        let url = format!("{base}?options=-c%20search_path%3D{name}");
        PgSchema {
            base,
            name,
            url,
            _shared: None,
        }
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        let (base, name) = (self.base.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                if let Ok(mut conn) = sqlx::PgConnection::connect(&base).await {
                    let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
                        .execute(&mut conn)
                        .await;
                }
            });
        })
        .join();
    }
}

/// Restarts the machine's PostgreSQL cluster and waits until it accepts connections again.
/// Callers hold [`POSTGRES_IN_USE`] exclusively.
pub fn restart_postgres() {
    let versions: Vec<String> = std::fs::read_dir("/etc/postgresql")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let version = versions
        .first()
        .expect("a PostgreSQL cluster under /etc/postgresql");
    let status = Command::new("pg_ctlcluster")
        .args(["--skip-systemctl-redirect", version, "main", "restart"])
        .status()
        .expect("run pg_ctlcluster");
    assert!(status.success(), "pg_ctlcluster restart failed: {status}");
    let start = std::time::Instant::now();
    while std::net::TcpStream::connect("127.0.0.1:5432").is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "PostgreSQL did not come back"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Posts `body` to `path` with `key` (as a bearer, or Anthropic's `x-api-key` under `/messages`).
pub async fn send(
    gw: &Gateway,
    path: &str,
    key: Option<&str>,
    body: serde_json::Value,
) -> (u16, reqwest::header::HeaderMap, serde_json::Value) {
    let mut request = reqwest::Client::new().post(gw.url(path)).json(&body);
    if let Some(key) = key {
        request = if path.contains("/messages") {
            request
                .header("x-api-key", key)
                .header("anthropic-version", "2023-06-01")
        } else {
            request.bearer_auth(key)
        };
    }
    let response = request.send().await.expect("gateway reachable");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap_or_default();
    let value = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
    (status, headers, value)
}

pub fn header(headers: &reqwest::header::HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// `bytes` with a custom section `name` holding `payload` appended.
pub fn with_section(bytes: &[u8], name: &str, payload: &str) -> Vec<u8> {
    let mut body = vec![name.len() as u8];
    body.extend_from_slice(name.as_bytes());
    body.extend_from_slice(payload.as_bytes());
    let mut out = bytes.to_vec();
    out.push(0x00);
    out.push(body.len() as u8);
    out.extend_from_slice(&body);
    out
}
