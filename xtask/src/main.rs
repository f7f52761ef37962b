//! Repository chores: `cargo xtask <command>`.
//!
//! - `build-strategies`: builds every strategy component for `wasm32-wasip2` with the `wasm` profile and
//!   copies them to `<target>/strategies/<name>.wasm` (built-ins) and
//!   `<target>/strategies-testing/<name>.wasm` (test components: deliberately broken ones, and one built
//!   against the frozen WIT 0.1.0), where `<target>` is
//!   Cargo's target directory (`CARGO_TARGET_DIR`, else `<workspace>/target`). It also builds the
//!   `least_backlog` example in each SDK's language to `<target>/strategies-examples/`
//!   (`least_backlog_{rs,py,js}.wasm`): Rust with the workspace, Python and JavaScript with the
//!   SDKs' own build commands and the tools they pin (componentize-py, componentize-qjs), which it
//!   installs once into a cache outside the clone (`~/.cache/switchyard/sdk-tools/`, or
//!   `$SWITCHYARD_TOOL_CACHE`) and reinstalls when the SDK's manifest changes. An example is
//!   rebuilt only when its source, its SDK or the tools change.
//! - `demo`: builds everything, starts two mock upstreams on 127.0.0.1:9001/9002 and serves
//!   `config/switchyard.yaml` in the foreground (Ctrl-C stops all three).
//! - `ci`: every check CI runs: fmt, clippy (host and wasm targets) with `-D warnings`, the strategy
//!   build (examples included), the Python and JavaScript SDKs' unit tests, and every test of the
//!   workspace.
//! - `deploy-manifests`: re-renders `deploy/manifests/` from the Helm chart (`deploy/check.py --write`,
//!   in a virtualenv with `deploy/requirements.txt` under the target directory; the `deploy` e2e tests
//!   check that the committed files equal the render).
//! - `build-pgo`: the gateway built with profile-guided optimisation, trained on the mock upstream
//!   (see [`pgo`]); the binary is `<target>/pgo/switchyard`. `pgo-train BINARY` runs only the
//!   training and the merge, for a binary instrumented another way.

mod pgo;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use serde_json::Value;

const WASM_TARGET: &str = "wasm32-wasip2";
const WASM_PROFILE: &str = "wasm";

/// A strategy crate and where its component goes.
struct Component {
    package: &'static str,
    dir: &'static str,
    file: &'static str,
}

const COMPONENTS: &[Component] = &[
    Component {
        package: "strategy-fixed",
        dir: "strategies",
        file: "fixed.wasm",
    },
    Component {
        package: "strategy-round-robin",
        dir: "strategies",
        file: "round_robin.wasm",
    },
    Component {
        package: "strategy-routewise",
        dir: "strategies",
        file: "routewise.wasm",
    },
    Component {
        package: "strategy-spin-forever",
        dir: "strategies-testing",
        file: "spin_forever.wasm",
    },
    Component {
        package: "strategy-allocate-gigabyte",
        dir: "strategies-testing",
        file: "allocate_gigabyte.wasm",
    },
    Component {
        package: "strategy-trap-on-select",
        dir: "strategies-testing",
        file: "trap_on_select.wasm",
    },
    // Echoes `select`'s inputs: pins the host's own lowering of them (tests/e2e/strategies.rs).
    Component {
        package: "strategy-echo-inputs",
        dir: "strategies-testing",
        file: "echo_inputs.wasm",
    },
    // The Rust one of the three `least_backlog` examples (tests/e2e/strategy_sdks.rs).
    Component {
        package: "strategy-least-backlog",
        dir: "strategies-examples",
        file: "least_backlog_rs.wasm",
    },
    // Built against the frozen WIT 0.1.0 without the SDK: proves old components keep working.
    Component {
        package: "strategy-v0-1-fixture",
        dir: "strategies-testing",
        file: "v0_1_fixture.wasm",
    },
];

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("build-strategies") if args.len() == 1 => build_strategies(),
        Some("demo") if args.len() == 1 => demo(),
        Some("ci") if args.len() == 1 => ci(),
        Some("deploy-manifests") if args.len() == 1 => deploy_manifests(),
        Some("build-pgo") if args.len() == 1 => pgo::build_pgo(),
        Some("pgo-train") if args.len() == 2 => pgo::pgo_train(Path::new(&args[1])),
        _ => {
            eprintln!(
                "usage: cargo xtask <build-strategies | demo | ci | deploy-manifests | build-pgo \
                 | pgo-train BINARY>"
            );
            std::process::exit(2);
        }
    }
}

/// Runs a cargo command to completion, failing with its description.
fn run_cargo(args: &[&str], what: &str) -> Result<()> {
    eprintln!("==> {what}: cargo {}", args.join(" "));
    let status = cargo()
        .args(args)
        .status()
        .with_context(|| format!("running {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

fn ci() -> Result<()> {
    ensure_wasm_target()?;
    ensure_postgres()?;
    ensure_redis()?;
    ensure_debian_tools()?;
    run_cargo(&["fmt", "--all", "--check"], "format check")?;
    run_cargo(
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
        "clippy (host)",
    )?;
    let mut wasm_clippy = vec!["clippy", "--target", WASM_TARGET, "-p", "switchyard-sdk"];
    for component in COMPONENTS {
        wasm_clippy.extend(["-p", component.package]);
    }
    wasm_clippy.extend(["--", "-D", "warnings"]);
    run_cargo(&wasm_clippy, "clippy (wasm32-wasip2)")?;
    build_strategies()?;
    sdk_unit_tests()?;
    run_cargo(&["test", "--workspace", "--no-fail-fast"], "tests")?;
    eprintln!("==> the profile-guided build's training, on the dev build");
    pgo::check_training(&target_dir()?.join("debug").join("switchyard"))?;
    eprintln!("==> all checks passed");
    Ok(())
}

/// The storage tests run against the machine's PostgreSQL (127.0.0.1:5432, database `test`); start
/// the local cluster when it is not accepting connections.
fn ensure_postgres() -> Result<()> {
    let ready = || {
        Command::new("pg_isready")
            .args(["-h", "127.0.0.1", "-p", "5432", "-q"])
            .status()
            .is_ok_and(|s| s.success())
    };
    if ready() {
        return Ok(());
    }
    eprintln!("==> PostgreSQL is not accepting connections; starting the local cluster");
    let versions: Vec<String> = std::fs::read_dir("/etc/postgresql")
        .map(|dir| {
            dir.filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect()
        })
        .unwrap_or_default();
    for version in &versions {
        let _ = Command::new("pg_ctlcluster")
            .args(["--skip-systemctl-redirect", version, "main", "start"])
            .status();
    }
    for _ in 0..30 {
        if ready() {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
    bail!(
        "PostgreSQL is not running on 127.0.0.1:5432 and could not be started (clusters found: {versions:?}); the storage tests need it"
    )
}

/// Debian packages the tests run for real: installed with apt when a probe of their programs
/// fails. Each entry: the packages, the programs that must answer `--version`, and who needs them.
const DEBIAN_TOOLS: &[(&[&str], &[&str], &str)] = &[
    (&["prometheus"], &["prometheus"], "the metrics test"),
    (
        &["nginx"],
        &["nginx"],
        "the fleet test (three replicas behind nginx)",
    ),
    (
        &["chromium", "chromium-driver"],
        &["chromium", "chromedriver"],
        "the dashboard test",
    ),
    (
        &["nodejs", "npm"],
        &["node", "npm"],
        "the JavaScript SDK (its example, unit tests and scaffold test)",
    ),
];

fn ensure_debian_tools() -> Result<()> {
    for (packages, programs, needed_by) in DEBIAN_TOOLS {
        ensure_debian_packages(packages, programs, needed_by)?;
    }
    Ok(())
}

/// Installs `packages` unless every one of `programs` already answers `--version`.
fn ensure_debian_packages(packages: &[&str], programs: &[&str], needed_by: &str) -> Result<()> {
    let works = |program: &str| {
        // nginx is in /usr/sbin, which a non-login PATH may lack.
        [program.to_owned(), format!("/usr/sbin/{program}")]
            .iter()
            .any(|p| {
                Command::new(p)
                    .arg(if program == "nginx" {
                        "-v"
                    } else {
                        "--version"
                    })
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            })
    };
    let installed = || programs.iter().all(|p| works(p));
    if installed() {
        return Ok(());
    }
    let list = packages.join(" ");
    eprintln!("==> installing {list} (apt-get install -y {list}) for {needed_by}");
    let mut install = vec!["install", "-y", "-qq", "--no-install-recommends"];
    install.extend_from_slice(packages);
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    if !apt(&install) {
        apt(&["update", "-qq"]);
        apt(&install);
    }
    if !installed() {
        bail!("`apt-get install -y {list}` did not install {list}; {needed_by} needs it");
    }
    Ok(())
}

/// The fleet tests share routing state through the machine's Redis (127.0.0.1:6379); start one
/// when nothing answers there (it keeps nothing on disk).
fn ensure_redis() -> Result<()> {
    let answers = || {
        Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", "6379", "ping"])
            .output()
            .is_ok_and(|o| o.status.success() && o.stdout.starts_with(b"PONG"))
    };
    if answers() {
        return Ok(());
    }
    eprintln!("==> Redis is not answering on 127.0.0.1:6379; starting redis-server");
    let _ = Command::new("redis-server")
        .args([
            "--daemonize",
            "yes",
            "--bind",
            "127.0.0.1",
            "--port",
            "6379",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .status();
    for _ in 0..30 {
        if answers() {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    bail!(
        "Redis is not running on 127.0.0.1:6379 and `redis-server` could not start it; the fleet tests need it"
    )
}

/// The Helm CLI is in none of the registries the project installs from; `deploy/check.py` renders the
/// chart with Helm's Go SDK from PyPI (`helm-python-sdk`), in a virtualenv outside the clone that is
/// rebuilt when `deploy/requirements.txt` changes (tests/e2e/deploy.rs uses the same one).
fn deploy_manifests() -> Result<()> {
    let root = workspace_root();
    let requirements = root.join("deploy/requirements.txt");
    let wanted = std::fs::read_to_string(&requirements)
        .with_context(|| format!("reading {}", requirements.display()))?;
    let venv = target_dir()?.join("deploy-venv");
    let marker = venv.join("requirements.installed");
    let python = venv.join("bin/python");
    if std::fs::read_to_string(&marker).ok().as_deref() != Some(wanted.as_str()) || !python.exists()
    {
        eprintln!(
            "==> virtualenv {} (deploy/requirements.txt)",
            venv.display()
        );
        let _ = std::fs::remove_dir_all(&venv);
        let status = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .context("running python3 -m venv (python3 is needed)")?;
        if !status.success() {
            bail!(
                "creating the virtualenv {} failed ({status})",
                venv.display()
            );
        }
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
            .context("running pip")?;
        if !status.success() {
            bail!("installing {} failed ({status})", requirements.display());
        }
        std::fs::write(&marker, wanted).context("writing the virtualenv's marker")?;
    }
    let status = Command::new(&python)
        .args(["deploy/check.py", "--write"])
        .current_dir(&root)
        .status()
        .context("running deploy/check.py --write")?;
    if !status.success() {
        bail!("deploy/check.py --write failed ({status})");
    }
    Ok(())
}

/// Kills the wrapped child when dropped, so the demo's mock upstreams never outlive it.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn demo() -> Result<()> {
    build_strategies()?;
    run_cargo(&["build", "-p", "switchyard"], "build the gateway")?;
    let binary = target_dir()?.join("debug").join("switchyard");
    let root = workspace_root();
    let mock = |port: &str, model: &str| -> Result<KillOnDrop> {
        let child = Command::new(&binary)
            .args(["mock-upstream", "--port", port, "--model", model])
            .args(["--ttft-ms", "40", "--tokens-per-s", "60"])
            .current_dir(&root)
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("starting mock upstream on port {port}"))?;
        Ok(KillOnDrop(child))
    };
    let _small = mock("9001", "sim-small")?;
    let _large = mock("9002", "sim-large")?;
    eprintln!("==> mock upstreams on 127.0.0.1:9001 and 127.0.0.1:9002");
    let status = Command::new(&binary)
        .args(["serve", "--config", "config/switchyard.yaml"])
        .current_dir(&root)
        .status()
        .context("starting switchyard serve")?;
    if !status.success() {
        bail!("switchyard serve exited ({status})");
    }
    Ok(())
}

/// The checkout this run belongs to. `cargo run` (what `cargo xtask` is) names the manifest's
/// directory in the environment; the path compiled in is only a fallback. A CI clone shares a
/// target directory with earlier clones and cargo does not rebuild xtask for a new path, so the
/// compiled-in path was an earlier clone: strategies were built from its sources, not this one's.
fn workspace_root() -> PathBuf {
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    manifest_dir
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

fn cargo() -> Command {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    command.current_dir(workspace_root());
    command
}

fn build_strategies() -> Result<()> {
    ensure_wasm_target()?;
    let target_dir = target_dir()?;

    let mut build = cargo();
    build.args(["build", "--target", WASM_TARGET, "--profile", WASM_PROFILE]);
    build.arg("--message-format=json-render-diagnostics");
    for component in COMPONENTS {
        build.args(["-p", component.package]);
    }
    // Diagnostics and progress go straight to the terminal; stdout carries the JSON messages.
    let output = build
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo build")?;
    if !output.status.success() {
        bail!("cargo build for {WASM_TARGET} failed ({})", output.status);
    }
    let stdout = String::from_utf8(output.stdout).context("cargo's JSON messages are not UTF-8")?;
    let artifacts = wasm_artifacts(&stdout);

    for component in COMPONENTS {
        let built = artifacts
            .iter()
            .find(|(package, _)| package == component.package)
            .map(|(_, path)| path)
            .with_context(|| format!("cargo reported no .wasm for {}", component.package))?;
        check_component(built)?;
        let dir = target_dir.join(component.dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let dest = dir.join(component.file);
        std::fs::copy(built, &dest)
            .with_context(|| format!("copying {} to {}", built.display(), dest.display()))?;
        let size = std::fs::metadata(&dest)
            .map(|m| m.len())
            .unwrap_or_default();
        eprintln!(
            "{:>28} -> {} ({size} bytes)",
            component.package,
            dest.display()
        );
    }
    build_sdk_examples(&target_dir)?;
    Ok(())
}

/// Where the SDKs' pinned tools are installed: outside the clone, shared by every clone and
/// target directory of the machine, so a fresh CI clone does not download them again.
fn tool_cache() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("SWITCHYARD_TOOL_CACHE") {
        return Ok(PathBuf::from(dir));
    }
    let base = match std::env::var_os("XDG_CACHE_HOME") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?).join(".cache"),
    };
    Ok(base.join("switchyard").join("sdk-tools"))
}

/// Runs `command`, failing with `what` when it does not succeed.
fn run(command: &mut Command, what: &str) -> Result<()> {
    let status = command
        .status()
        .with_context(|| format!("running {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

/// A stable fingerprint of files' paths and contents (a cache key, not a security boundary).
fn fingerprint(files: &[PathBuf]) -> Result<String> {
    use std::hash::{DefaultHasher, Hasher};
    // `DefaultHasher::new()` has fixed keys: the same input gives the same key in every run.
    let mut hasher = DefaultHasher::new();
    let root = workspace_root();
    for file in files {
        // Relative paths: a clone elsewhere (CI's is fresh each run) keeps the same key.
        let name = file.strip_prefix(&root).unwrap_or(file);
        hasher.write(name.to_string_lossy().as_bytes());
        hasher.write(&std::fs::read(file).with_context(|| format!("reading {}", file.display()))?);
    }
    Ok(format!("{:016x}", hasher.finish()))
}

/// Every file under `dir`, sorted, skipping caches and installed dependencies.
fn files_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let path = entry?.path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            if matches!(
                name.as_deref(),
                Some("node_modules" | "__pycache__" | "build")
            ) || name.as_deref().is_some_and(|n| n.ends_with(".egg-info"))
            {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

/// A virtualenv with the Python SDK and its pinned componentize-py, rebuilt when
/// `sdk/python/pyproject.toml` changes. Returns its `python`.
fn python_sdk_tools() -> Result<PathBuf> {
    let root = workspace_root();
    let manifest = root.join("sdk/python/pyproject.toml");
    let wanted = std::fs::read_to_string(&manifest)
        .with_context(|| format!("reading {}", manifest.display()))?;
    let venv = tool_cache()?.join("py-venv");
    let marker = venv.join("pyproject.installed");
    let python = venv.join("bin/python");
    if std::fs::read_to_string(&marker).ok().as_deref() == Some(wanted.as_str()) && python.exists()
    {
        return Ok(python);
    }
    eprintln!("==> Python SDK tools into {}", venv.display());
    let _ = std::fs::remove_dir_all(&venv);
    run(
        Command::new("python3").args(["-m", "venv"]).arg(&venv),
        "python3 -m venv (python3 is needed to build the Python example)",
    )?;
    // Installs componentize-py at the SDK's pin; the build runs the checkout's SDK sources
    // (PYTHONPATH), so the installed copy of the SDK itself is never stale.
    run(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .arg(root.join("sdk/python")),
        "pip install sdk/python",
    )?;
    std::fs::write(&marker, wanted).context("writing the virtualenv's marker")?;
    Ok(python)
}

/// A node_modules with the JavaScript SDK installed as a user installs it (`npm install
/// --install-links`, which copies the SDK and installs its pinned componentize-qjs), redone when
/// the SDK's files change (npm's own cache makes that a few seconds). Returns the SDK's command.
fn js_sdk_tools() -> Result<PathBuf> {
    let sdk = workspace_root().join("sdk/js");
    let wanted = fingerprint(&files_under(&sdk)?)?;
    let dir = tool_cache()?.join("node");
    let marker = dir.join("sdk.installed");
    let command = dir.join("node_modules/.bin/switchyard-strategy");
    if std::fs::read_to_string(&marker).ok().as_deref() == Some(wanted.as_str()) && command.exists()
    {
        return Ok(command);
    }
    eprintln!("==> JavaScript SDK tools into {}", dir.display());
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(
        dir.join("package.json"),
        "{\"private\": true, \"description\": \"cargo xtask: the JavaScript SDK's tools\"}\n",
    )
    .context("writing the tools' package.json")?;
    run(
        Command::new("npm")
            .args([
                "install",
                "--no-audit",
                "--no-fund",
                "--no-save",
                "--loglevel=error",
                "--install-links",
            ])
            .arg(&sdk)
            .current_dir(&dir),
        "npm install sdk/js (node and npm are needed to build the JavaScript example)",
    )?;
    std::fs::write(&marker, wanted).context("writing the node_modules' marker")?;
    Ok(command)
}

/// Builds the Python and JavaScript `least_backlog` examples into `<target>/strategies-examples/`,
/// each only when its inputs changed since the last build.
fn build_sdk_examples(target_dir: &Path) -> Result<()> {
    let root = workspace_root();
    let out = target_dir.join("strategies-examples");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;

    let python = python_sdk_tools()?;
    let source = root.join("strategies/examples/python/least_backlog.py");
    let mut inputs = files_under(&root.join("sdk/python"))?;
    inputs.push(source.clone());
    build_example(&out.join("least_backlog_py.wasm"), &inputs, || {
        run(
            Command::new(&python)
                .args(["-m", "switchyard_strategy", "build", "-q"])
                .arg(&source)
                .arg("-o")
                .arg(out.join("least_backlog_py.wasm"))
                .env("PYTHONPATH", root.join("sdk/python")),
            "the Python example's build",
        )
    })?;

    let js = js_sdk_tools()?;
    let source = root.join("strategies/examples/js/least_backlog.js");
    let mut inputs = files_under(&root.join("sdk/js"))?;
    inputs.push(source.clone());
    build_example(&out.join("least_backlog_js.wasm"), &inputs, || {
        run(
            Command::new(&js)
                .args(["build", "-q"])
                .arg(&source)
                .arg("-o")
                .arg(out.join("least_backlog_js.wasm")),
            "the JavaScript example's build",
        )
    })?;
    Ok(())
}

/// Runs `build` unless `dest` was built from the same `inputs` (recorded beside it).
fn build_example(
    dest: &Path,
    inputs: &[PathBuf],
    build: impl FnOnce() -> Result<()>,
) -> Result<()> {
    let key = fingerprint(inputs)?;
    let recorded = dest.with_extension("inputs");
    let started = std::time::Instant::now();
    if dest.exists() && std::fs::read_to_string(&recorded).ok().as_deref() == Some(key.as_str()) {
        eprintln!("{:>28} -> {} (unchanged)", "", dest.display());
        return Ok(());
    }
    let _ = std::fs::remove_file(&recorded);
    build()?;
    check_component(dest)?;
    std::fs::write(&recorded, key).with_context(|| format!("writing {}", recorded.display()))?;
    let size = std::fs::metadata(dest).map(|m| m.len()).unwrap_or_default();
    eprintln!(
        "{:>28} -> {} ({size} bytes, {:.1} s)",
        "",
        dest.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The Python SDK's unit tests (with the virtualenv's componentize-py, so the check that its
/// records match the generated bindings runs) and the JavaScript SDK's, in Node.
fn sdk_unit_tests() -> Result<()> {
    let root = workspace_root();
    let python = python_sdk_tools()?;
    eprintln!("==> Python SDK unit tests");
    run(
        Command::new(&python)
            .args(["-m", "unittest", "discover", "-s", "sdk/python/tests"])
            .env("PYTHONPATH", root.join("sdk/python"))
            .current_dir(&root),
        "the Python SDK's unit tests",
    )?;
    eprintln!("==> JavaScript SDK unit tests");
    run(
        Command::new("node")
            .args(["--test", "sdk/js/test/"])
            .current_dir(&root),
        "the JavaScript SDK's unit tests",
    )
}

/// `rustup target add` is a no-op when the target is installed. Without rustup (a distro toolchain), the
/// build itself reports a missing target.
fn ensure_wasm_target() -> Result<()> {
    let status = Command::new("rustup")
        .args(["target", "add", WASM_TARGET])
        .current_dir(workspace_root())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    match status {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => bail!("`rustup target add {WASM_TARGET}` failed ({status})"),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("rustup not found; assuming {WASM_TARGET} is installed");
            Ok(())
        }
        Err(error) => Err(error).context("running rustup"),
    }
}

/// Cargo's own answer (honours `CARGO_TARGET_DIR` and config; `<workspace>/target` by default).
fn target_dir() -> Result<PathBuf> {
    let output = cargo()
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo metadata")?;
    if !output.status.success() {
        bail!("cargo metadata failed ({})", output.status);
    }
    let metadata: Value =
        serde_json::from_slice(&output.stdout).context("parsing cargo metadata")?;
    metadata["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .context("cargo metadata has no target_directory")
}

/// `(package name, path)` of every `.wasm` cdylib in cargo's JSON messages.
fn wasm_artifacts(messages: &str) -> Vec<(String, PathBuf)> {
    let mut artifacts = Vec::new();
    for line in messages.lines() {
        let Ok(message) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if message["reason"] != "compiler-artifact" {
            continue;
        }
        let is_cdylib = message["target"]["kind"]
            .as_array()
            .is_some_and(|kinds| kinds.iter().any(|k| k == "cdylib"));
        if !is_cdylib {
            continue;
        }
        let Some(package) = package_name(&message) else {
            continue;
        };
        let wasm = message["filenames"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .find(|f| f.ends_with(".wasm"));
        if let Some(wasm) = wasm {
            artifacts.push((package, PathBuf::from(wasm)));
        }
    }
    artifacts
}

/// The package name from a message's `manifest_path` (`.../<crate dir>/Cargo.toml`) is ambiguous, so read
/// it from the package id: `path+file:///.../dir#name@0.1.0` (or `...#0.1.0` when name == dir).
fn package_name(message: &Value) -> Option<String> {
    let id = message["package_id"].as_str()?;
    let (url, fragment) = id.rsplit_once('#')?;
    match fragment.rsplit_once('@') {
        Some((name, _version)) => Some(name.to_owned()),
        None => url.rsplit('/').next().map(str::to_owned),
    }
}

/// A component starts with `\0asm`, then version 0x0d and layer 1 (a core module has layer 0).
fn check_component(path: &Path) -> Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if bytes.get(..8) != Some(b"\0asm\x0d\x00\x01\x00".as_slice()) {
        bail!("{} is not a WebAssembly component", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_names_from_ids() {
        let named = serde_json::json!({"package_id": "path+file:///w/strategies/fixed#strategy-fixed@0.1.0"});
        assert_eq!(package_name(&named).as_deref(), Some("strategy-fixed"));
        let plain = serde_json::json!({"package_id": "path+file:///w/xtask#0.1.0"});
        assert_eq!(package_name(&plain).as_deref(), Some("xtask"));
    }
}
