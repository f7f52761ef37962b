//! `cargo xtask build-pgo`: the gateway built with profile-guided optimisation.
//!
//! Three steps, each in a target directory of its own under `<target>/pgo/` so that none of them
//! invalidates another's (or the plain `target/release`) cache:
//!
//! 1. an instrumented release build (`-Cprofile-generate`);
//! 2. a training run: that binary serves a config of every strategy and protocol against the mock
//!    upstream (its own `mock-upstream`, whose profile is written elsewhere), loaded by [`drive`] through
//!    keep-alive connections with the requests a gateway serves most (non-streaming and streamed
//!    Chat, Anthropic Messages relayed and translated, Responses, a rate-limited route, and the
//!    400 and 404 answers of bad requests), then stopped with SIGTERM so that it writes its
//!    profile on the way out;
//! 3. the release build again, optimised with the merged profile (`-Cprofile-use`).
//!
//! The result is `<target>/pgo/switchyard`. LLVM's `llvm-profdata` comes from rustup's
//! `llvm-tools` component, installed when missing.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use super::{KillOnDrop, cargo, run, target_dir, workspace_root};

/// Connections the training drives at once: more than one, so the runtime's cross-thread paths
/// (wake-ups, the request log's channel under contention) are profiled as they run under load.
const CLIENTS: usize = 4;

/// How long the gateway may take to start, and to drain and write its profile after SIGTERM.
const START_DEADLINE: Duration = Duration::from_secs(120);
const EXIT_DEADLINE: Duration = Duration::from_secs(60);

/// One kind of request the training sends, and how many of it.
struct Workload {
    path: &'static str,
    body: String,
    /// The status every answer must have; a training run that got other answers profiled
    /// something else than the gateway's serving path and is refused.
    status: u16,
    requests: usize,
}

pub(super) fn build_pgo() -> Result<()> {
    let target = target_dir()?;
    let pgo_dir = target.join("pgo");
    let host = host_triple()?;
    let instrumented = release_build(
        &pgo_dir.join("instrumented"),
        &host,
        &format!("-Cprofile-generate={}", raw_dir(&pgo_dir).display()),
        "instrumented release build",
    )?;
    let profile = train_profile(&instrumented, &target, &host)?;
    let optimised = release_build(
        &pgo_dir.join("optimised"),
        &host,
        &format!("-Cprofile-use={}", profile.display()),
        "release build with the profile",
    )?;
    let out = pgo_dir.join("switchyard");
    std::fs::copy(&optimised, &out)
        .with_context(|| format!("copying {} to {}", optimised.display(), out.display()))?;
    eprintln!("==> profile-guided build: {}", out.display());
    Ok(())
}

/// `cargo xtask pgo-train <binary>`: steps 2 and the merge of [`build_pgo`] alone, for a binary
/// instrumented some other way (`-Cprofile-generate=<target>/pgo/raw`).
pub(super) fn pgo_train(instrumented: &Path) -> Result<()> {
    let profile = train_profile(instrumented, &target_dir()?, &host_triple()?)?;
    eprintln!("==> profile: {}", profile.display());
    Ok(())
}

/// Where an instrumented build writes its counters: the path is compiled into the binary.
fn raw_dir(pgo_dir: &Path) -> PathBuf {
    pgo_dir.join("raw")
}

/// Trains `instrumented` and merges what it wrote into `<target>/pgo/merged-<hash>.profdata`.
fn train_profile(instrumented: &Path, target: &Path, host: &str) -> Result<PathBuf> {
    super::build_strategies()?;
    let pgo_dir = target.join("pgo");
    let profdata_tool = llvm_profdata(host)?;
    let raw_dir = raw_dir(&pgo_dir);
    if raw_dir.exists() {
        std::fs::remove_dir_all(&raw_dir)
            .with_context(|| format!("clearing {}", raw_dir.display()))?;
    }
    std::fs::create_dir_all(&raw_dir).with_context(|| format!("creating {}", raw_dir.display()))?;

    train(instrumented, target, &pgo_dir.join("training"), 1)?;

    let raw: Vec<PathBuf> = std::fs::read_dir(&raw_dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "profraw"))
        .collect();
    ensure!(
        !raw.is_empty(),
        "the training run wrote no profile into {} (was {} built with -Cprofile-generate={0}?)",
        raw_dir.display(),
        instrumented.display()
    );
    let merged = pgo_dir.join("merged.profdata");
    run(
        Command::new(&profdata_tool)
            .arg("merge")
            .arg("-o")
            .arg(&merged)
            .args(&raw),
        "llvm-profdata merge",
    )?;
    // The profile's contents go into the flag's path: cargo rebuilds when RUSTFLAGS change, not
    // when a file they name does, so a new profile must be a new path.
    let keyed = pgo_dir.join(format!(
        "merged-{}.profdata",
        super::fingerprint(std::slice::from_ref(&merged))?
    ));
    std::fs::rename(&merged, &keyed)?;
    Ok(keyed)
}

/// `cargo build --release` of the gateway into `target_dir` with `rustflags`, for the host triple
/// named explicitly so that the flags reach only the gateway's code, not build scripts or proc
/// macros (which would write profiles of the compiler's own runs). Returns the binary.
fn release_build(target_dir: &Path, host: &str, rustflags: &str, what: &str) -> Result<PathBuf> {
    eprintln!("==> {what}: RUSTFLAGS={rustflags}");
    let status = cargo()
        .args(["build", "--release", "--locked", "-p", "switchyard"])
        .args(["--bins", "--target", host])
        .env("CARGO_TARGET_DIR", target_dir)
        .env("RUSTFLAGS", rustflags)
        .status()
        .with_context(|| format!("running {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(target_dir.join(host).join("release").join("switchyard"))
}

fn host_triple() -> Result<String> {
    let output = Command::new("rustc")
        .arg("-vV")
        .output()
        .context("running rustc -vV")?;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_owned)
        .context("rustc -vV names no host")
}

/// rustup's `llvm-profdata`, of the LLVM that rustc itself uses (a system one of another LLVM
/// version may not read the profile format).
fn llvm_profdata(host: &str) -> Result<PathBuf> {
    let output = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .context("running rustc --print sysroot")?;
    let sysroot = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let tool = Path::new(&sysroot)
        .join("lib/rustlib")
        .join(host)
        .join("bin/llvm-profdata");
    if !tool.exists() {
        run(
            Command::new("rustup").args(["component", "add", "llvm-tools"]),
            "rustup component add llvm-tools",
        )?;
    }
    ensure!(
        tool.exists(),
        "{} is missing after installing llvm-tools",
        tool.display()
    );
    Ok(tool)
}

/// The training config: one model per strategy on the mock, an Anthropic upstream, and a route
/// with a rate limit that never triggers.
fn training_config(work: &Path, mock_port: u16) -> String {
    let upstream = format!("http://127.0.0.1:{mock_port}/v1");
    let mut models = String::new();
    for strategy in ["fixed", "round_robin", "routewise"] {
        models.push_str(&format!(
            "  - id: train-{strategy}\n    router: {strategy}\n    route:\n      \
             - kind: openai_compat\n        base_url: {upstream}\n        provider_model_id: sim\n        \
             pricing: {{ prompt: 0.1, completion: 0.4 }}\n"
        ));
    }
    models.push_str(&format!(
        "  - id: train-anthropic\n    router: fixed\n    route:\n      - kind: anthropic\n        \
         base_url: http://127.0.0.1:{mock_port}\n        provider_model_id: sim\n"
    ));
    let never = 1_000_000_000u64;
    format!(
        "database:\n  url: sqlite://{db}\nroutes:\n  - name: open\n    path_prefix: /\n    \
         disable_auth: true\n  - name: limited\n    path_prefix: /limited\n    disable_auth: true\n    \
         plugins:\n      rate-limit:\n        limits:\n          - scope: consumer\n            \
         requests_per_minute: {never}\n            tokens_per_minute: {never}\n            \
         concurrent_requests: {never}\nmodels:\n{models}",
        db = work.join("train.db").display()
    )
}

fn workloads() -> Vec<Workload> {
    let prompt = r#"[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Summarise the plot of Hamlet in two sentences, please."}]"#;
    let chat = |model: &str, stream: bool| {
        if stream {
            format!(
                r#"{{"model":"{model}","messages":{prompt},"stream":true,"stream_options":{{"include_usage":true}}}}"#
            )
        } else {
            format!(r#"{{"model":"{model}","messages":{prompt},"max_tokens":64}}"#)
        }
    };
    let messages = |model: &str, stream: bool| {
        format!(
            r#"{{"model":"{model}","max_tokens":256,"system":"You are a helpful assistant.","messages":[{{"role":"user","content":"Summarise the plot of Hamlet in two sentences, please."}}],"stream":{stream}}}"#
        )
    };
    let responses = |model: &str, stream: bool| {
        format!(
            r#"{{"model":"{model}","instructions":"You are a helpful assistant.","input":"Summarise the plot of Hamlet in two sentences, please.","stream":{stream}}}"#
        )
    };
    // A longer turn: a conversation with a tool call and its result, and the tool's definition.
    let conversation = |model: &str, stream: bool| {
        let notes =
            "The quarterly figures show revenue up 12 % on the year, costs up 4 %. ".repeat(24);
        format!(
            r#"{{"model":"{model}","stream":{stream},"temperature":0.2,"messages":[{{"role":"system","content":"You are a careful analyst."}},{{"role":"user","content":"Here are my notes: {notes} What is the margin trend?"}},{{"role":"assistant","content":null,"tool_calls":[{{"id":"call_1","type":"function","function":{{"name":"lookup_quarter","arguments":"{{\"quarter\":\"Q3\"}}"}}}}]}},{{"role":"tool","tool_call_id":"call_1","content":"{{\"revenue\":1200,\"costs\":800}}"}},{{"role":"user","content":"And compared with Q2?"}}],"tools":[{{"type":"function","function":{{"name":"lookup_quarter","description":"Figures of one quarter","parameters":{{"type":"object","properties":{{"quarter":{{"type":"string"}}}},"required":["quarter"]}}}}}}]}}"#
        )
    };
    let w = |path, body, status, requests| Workload {
        path,
        body,
        status,
        requests,
    };
    const CHAT: &str = "/v1/chat/completions";
    const MESSAGES: &str = "/v1/messages";
    const RESPONSES: &str = "/v1/responses";
    const LIMITED_CHAT: &str = "/limited/v1/chat/completions";
    let malformed = r#"{"model":"train-fixed","messages":[}"#.to_owned();
    vec![
        w(CHAT, chat("train-fixed", false), 200, 12_000),
        w(CHAT, chat("train-round_robin", false), 200, 3_000),
        w(CHAT, chat("train-routewise", false), 200, 6_000),
        w(CHAT, chat("train-fixed", true), 200, 6_000),
        w(CHAT, chat("train-routewise", true), 200, 3_000),
        w(CHAT, conversation("train-fixed", false), 200, 3_000),
        w(CHAT, conversation("train-routewise", true), 200, 1_500),
        w(LIMITED_CHAT, chat("train-fixed", false), 200, 3_000),
        w(MESSAGES, messages("train-anthropic", false), 200, 3_000),
        w(MESSAGES, messages("train-anthropic", true), 200, 3_000),
        w(MESSAGES, messages("train-fixed", false), 200, 3_000),
        w(MESSAGES, messages("train-fixed", true), 200, 3_000),
        w(RESPONSES, responses("train-fixed", false), 200, 1_500),
        w(RESPONSES, responses("train-fixed", true), 200, 1_500),
        w(CHAT, malformed, 400, 500),
        w(CHAT, chat("no-such-model", false), 404, 500),
    ]
}

/// `cargo xtask ci`'s check of the training on the dev build: every workload still gets the
/// answer it expects (a config key renamed or a protocol change would otherwise break only the
/// image's build), with a twentieth of the requests.
pub(super) fn check_training(binary: &Path) -> Result<()> {
    let target = target_dir()?;
    train(
        binary,
        &target,
        &target.join("pgo").join("training-check"),
        20,
    )
}

/// Starts the mock and `binary`'s gateway, drives the workloads (each `1/share` of its requests)
/// through it and stops it, so that an instrumented binary writes its profile.
fn train(binary: &Path, target: &Path, work: &Path, share: usize) -> Result<()> {
    if work.exists() {
        std::fs::remove_dir_all(work)?;
    }
    std::fs::create_dir_all(work)?;
    let (mock_port, gateway_port) = (free_port()?, free_port()?);
    let config = work.join("train.yaml");
    std::fs::write(&config, training_config(work, mock_port))?;

    // The mock is the same binary; its profile goes beside the training's files, so that the
    // mock's serving does not weigh in the gateway's.
    let _mock = KillOnDrop(
        Command::new(binary)
            .args(["mock-upstream", "--port", &mock_port.to_string()])
            .args(["--completion-tokens", "16"])
            .env("LLVM_PROFILE_FILE", work.join("mock-%p.profraw"))
            .stdout(Stdio::null())
            .spawn()
            .context("starting the mock upstream")?,
    );
    let log_path = work.join("gateway.log");
    let log = std::fs::File::create(&log_path)?;
    let gateway = Command::new(binary)
        .args(["serve", "--config"])
        .arg(&config)
        .args(["--listen", &format!("127.0.0.1:{gateway_port}")])
        .env("SWITCHYARD_BUILTIN_STRATEGIES", target.join("strategies"))
        .env("SWITCHYARD_CACHE_DIR", work.join("cache"))
        .env("RUST_LOG", "warn")
        .current_dir(workspace_root())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting the gateway to train")?;
    let mut gateway = KillOnDrop(gateway);
    wait_healthy(mock_port, None)?;
    wait_healthy(gateway_port, Some(&mut gateway.0))
        .with_context(|| format!("the gateway's log: {}", log_path.display()))?;

    let started = Instant::now();
    let mut total = 0;
    for workload in workloads() {
        let requests = (workload.requests / share).max(CLIENTS);
        drive(gateway_port, &workload, requests)?;
        total += requests;
    }
    eprintln!(
        "==> training: {total} requests in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // SIGTERM: the gateway drains and returns from `main`, and the profile runtime writes the
    // counters at exit (a SIGKILL would lose them).
    let pid = gateway.0.id().to_string();
    run(
        Command::new("sh").args(["-c", &format!("kill -TERM {pid}")]),
        "kill -TERM (the trained gateway)",
    )?;
    let deadline = Instant::now() + EXIT_DEADLINE;
    loop {
        if let Some(status) = gateway.0.try_wait()? {
            ensure!(
                status.success(),
                "the trained gateway exited with {status} (log: {})",
                log_path.display()
            );
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "the trained gateway did not exit within {EXIT_DEADLINE:?} of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A loopback port free at the time of asking.
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind(("127.0.0.1", 0))?
        .local_addr()?
        .port())
}

fn wait_healthy(port: u16, mut process: Option<&mut Child>) -> Result<()> {
    let deadline = Instant::now() + START_DEADLINE;
    loop {
        if let Ok(mut connection) = Connection::open(port)
            && let Ok((200, _)) = connection.send("GET", "/health", "")
        {
            return Ok(());
        }
        if let Some(child) = process.as_mut()
            && let Some(status) = child.try_wait()?
        {
            bail!("the process behind port {port} exited ({status}) before it was healthy");
        }
        ensure!(
            Instant::now() < deadline,
            "nothing healthy on port {port} within {START_DEADLINE:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Sends `requests` of `workload` over [`CLIENTS`] keep-alive connections at once, checking every
/// answer's status, and that a streamed one is a stream.
fn drive(port: u16, workload: &Workload, requests: usize) -> Result<()> {
    let per_client = requests.div_ceil(CLIENTS);
    let streamed = workload.body.contains(r#""stream":true"#);
    std::thread::scope(|scope| {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|_| {
                scope.spawn(|| -> Result<()> {
                    let mut connection = Connection::open(port)?;
                    for _ in 0..per_client {
                        let (status, body) =
                            connection.send("POST", workload.path, &workload.body)?;
                        ensure!(
                            status == workload.status,
                            "{} answered {status}, not {}: {}",
                            workload.path,
                            workload.status,
                            String::from_utf8_lossy(&body)
                        );
                        ensure!(
                            !streamed
                                || body.starts_with(b"event: ")
                                || body.starts_with(b"data: "),
                            "{} answered a stream request without a stream: {}",
                            workload.path,
                            String::from_utf8_lossy(&body)
                        );
                        if connection.closed {
                            connection = Connection::open(port)?;
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        clients.into_iter().try_for_each(|c| match c.join() {
            Ok(result) => result,
            Err(_) => bail!("a training client panicked"),
        })
    })
}

/// A keep-alive HTTP/1.1 client connection: enough of the protocol for the gateway's answers
/// (a `Content-Length` or chunked body).
struct Connection {
    reader: BufReader<TcpStream>,
    /// The server said `Connection: close`.
    closed: bool,
}

impl Connection {
    fn open(port: u16) -> Result<Self> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Self {
            reader: BufReader::new(stream),
            closed: false,
        })
    }

    fn send(&mut self, method: &str, path: &str, body: &str) -> Result<(u16, Vec<u8>)> {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n",
            body.len()
        );
        let stream = self.reader.get_mut();
        stream.write_all(head.as_bytes())?;
        stream.write_all(body.as_bytes())?;

        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        let status: u16 = line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("not an HTTP status line: {line:?}"))?;
        let (mut length, mut chunked) = (None, false);
        loop {
            line.clear();
            self.reader.read_line(&mut line)?;
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            let Some((name, value)) = header.split_once(':') else {
                bail!("not an HTTP header: {header:?}");
            };
            let value = value.trim();
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = Some(value.parse::<usize>()?),
                "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
                "connection" => self.closed = value.eq_ignore_ascii_case("close"),
                _ => {}
            }
        }
        let mut body = Vec::new();
        if chunked {
            loop {
                line.clear();
                self.reader.read_line(&mut line)?;
                let size = usize::from_str_radix(line.trim_end(), 16)
                    .with_context(|| format!("not a chunk size: {line:?}"))?;
                let start = body.len();
                body.resize(start + size + 2, 0);
                self.reader.read_exact(&mut body[start..])?;
                body.truncate(start + size);
                if size == 0 {
                    break;
                }
            }
        } else if let Some(length) = length {
            body.resize(length, 0);
            self.reader.read_exact(&mut body)?;
        } else {
            self.reader.read_to_end(&mut body)?;
            self.closed = true;
        }
        Ok((status, body))
    }
}
