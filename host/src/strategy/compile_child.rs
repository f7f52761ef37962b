//! Compiling strategies in a child process, into the compiled-code cache.
//!
//! A gateway that compiled its strategies idles much larger than one that loaded them from the
//! cache: 103.6 against 50.6 MiB resident with the suite's configuration, and ~250 against ~110
//! MiB with a Python and a JavaScript strategy (docs/performance.md, round eighteen). Part of what
//! the compiler freed stays in pages the compiled components still use, and the compiler's code
//! stays paged in; no allocator call gives that back. A child process built on the same engine
//! configuration compiles the files into the cache and exits, taking all of that with it; the
//! gateway then loads each file from the cache as on any later start.
//!
//! Nothing depends on the child succeeding: without a cache, without the daemon's binary to run
//! (unit tests run in a test harness), when the spawn is refused, the file does not compile, or
//! the deadline passes, the gateway compiles the file itself as it always did, and a broken file
//! gets the gateway's own error.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use wasmtime::component::Component;

use super::StrategyError;
use super::engine::{StrategyEngine, compiling_engine};

/// The daemon's hidden subcommand that compiles the files named after it into the cache.
pub const SUBCOMMAND: &str = "compile-strategies";

/// How long the gateway waits for its compiling child. Compiling an interpreted guest takes
/// seconds, a Rust one well under one; past this the child is killed and the gateway compiles
/// what is left itself.
const DEADLINE: Duration = Duration::from_secs(300);

/// The program that has [`SUBCOMMAND`]: set by the daemon at startup.
static PROGRAM: OnceLock<PathBuf> = OnceLock::new();

/// Lets catalogs compile in a child process running `program` (the daemon's own binary).
pub fn enable(program: PathBuf) {
    let _ = PROGRAM.set(program);
}

/// Compiles `paths` into `engine`'s cache in a child process and waits for it to exit, at most
/// [`DEADLINE`]. Does nothing when the engine has no cache or no program was enabled.
pub(super) async fn warm_cache(engine: &StrategyEngine, paths: &[&Path]) {
    if paths.is_empty() || !engine.caches_compiled_code() {
        return;
    }
    let Some(program) = PROGRAM.get() else {
        return;
    };
    let spawned = tokio::process::Command::new(program)
        .arg(SUBCOMMAND)
        .args(paths)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            tracing::debug!(
                "cannot start a process to compile strategies in ({e}); compiling here"
            );
            return;
        }
    };
    let started = std::time::Instant::now();
    match tokio::time::timeout(DEADLINE, child.wait()).await {
        Ok(Ok(status)) if status.success() => tracing::debug!(
            files = paths.len(),
            ms = started.elapsed().as_millis() as u64,
            "strategies compiled into the cache by a child process"
        ),
        Ok(Ok(status)) => tracing::debug!(
            "the process compiling strategies exited with {status}; what it did not compile is compiled here"
        ),
        Ok(Err(e)) => tracing::debug!("waiting for the process compiling strategies: {e}"),
        Err(_) => tracing::warn!(
            "the process compiling strategies took longer than {} s and was stopped; compiling here",
            DEADLINE.as_secs()
        ),
    }
}

/// The child's side ([`SUBCOMMAND`]): compiles each file, in parallel, into the cache of an engine
/// configured as the gateway's. Errs when there is no cache to fill or a file did not compile
/// (naming each); the gateway only looks at whether the child succeeded.
pub fn compile_into_cache(paths: &[PathBuf]) -> Result<(), StrategyError> {
    let (engine, caches) = compiling_engine()?;
    if !caches {
        return Err(StrategyError::Engine(
            "no compiled-code cache to compile into".into(),
        ));
    }
    let failures: Vec<String> = std::thread::scope(|scope| {
        let compiles: Vec<_> = paths
            .iter()
            .map(|path| {
                let engine = &engine;
                scope.spawn(move || {
                    let bytes = super::catalog::read_limited(path)?;
                    Component::new(engine, &bytes)
                        .map(drop)
                        .map_err(|e| format!("not a valid component: {e}"))
                })
            })
            .collect();
        paths
            .iter()
            .zip(compiles)
            .filter_map(|(path, compile)| {
                let outcome = compile
                    .join()
                    .unwrap_or_else(|_| Err("the compiler panicked".into()));
                outcome.err().map(|e| format!("{}: {e}", path.display()))
            })
            .collect()
    });
    if failures.is_empty() {
        Ok(())
    } else {
        Err(StrategyError::Engine(failures.join("; ")))
    }
}
