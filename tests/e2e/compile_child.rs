//! A first start compiles its strategies in a child process (`switchyard compile-strategies`,
//! hidden), which fills the compiled-code cache and exits; the gateway then loads them from the
//! cache, so the compiler's memory never stays in the gateway.

use std::path::Path;
use std::process::{Command, Output};

use crate::harness::{Gateway, Mock, binary, chat_body, target_dir};

fn compile(cache: &str, files: &[&Path]) -> Output {
    Command::new(binary())
        .arg("compile-strategies")
        .args(files)
        .env("SWITCHYARD_CACHE_DIR", cache)
        .output()
        .expect("run switchyard compile-strategies")
}

/// Compiled files in a cache folder (wasmtime keeps one per compiled component).
fn cached_files(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| {
            let path = e.path();
            if path.is_dir() {
                cached_files(&path)
            } else {
                usize::from(path.extension().is_none_or(|x| x != "stats"))
            }
        })
        .sum()
}

#[test]
fn compile_strategies_fills_the_cache_and_names_what_does_not_compile() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let cache_text = cache.to_str().unwrap();
    let fixed = target_dir().join("strategies/fixed.wasm");
    let round_robin = target_dir().join("strategies/round_robin.wasm");

    let out = compile(cache_text, &[&fixed, &round_robin]);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        cached_files(&cache.join("modules")),
        2,
        "one compiled file per component"
    );

    let garbage = dir.path().join("garbage.wasm");
    std::fs::write(&garbage, b"\0asm not really").unwrap();
    let out = compile(cache_text, &[&fixed, &garbage]);
    assert!(
        !out.status.success(),
        "a file that does not compile fails the child"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("garbage.wasm"), "stderr: {stderr}");
    assert!(
        !stderr.contains("fixed.wasm"),
        "only the failing file is named: {stderr}"
    );

    let out = compile("", &[&fixed]);
    assert!(!out.status.success(), "nothing to compile into");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no compiled-code cache"),
        "stderr: {stderr}"
    );
}

#[tokio::test]
async fn a_first_start_compiles_in_a_child_and_serves_from_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let mock = Mock::start(&[]);
    let config = format!(
        "models:\n  - id: chat\n    route:\n      - kind: openai_compat\n        base_url: {}\n",
        mock.base_url()
    );
    let gateway = Gateway::start_with_env(
        &config,
        &[
            ("ROUTING_AFFINITY_ENABLED", "0"),
            ("SWITCHYARD_CACHE_DIR", cache.to_str().unwrap()),
        ],
    );
    let log = gateway.log();
    assert!(
        log.contains("strategies compiled into the cache by a child process"),
        "log: {log}"
    );
    assert!(
        cached_files(&cache.join("modules")) >= 3,
        "the built-ins are in the cache"
    );
    let (status, body) = gateway.chat(chat_body("chat", false)).await;
    assert_eq!(status, 200, "{body}");

    // Without a cache there is nothing for a child to fill: the gateway compiles, as before.
    let uncached = Gateway::start_with_env(
        &config,
        &[
            ("ROUTING_AFFINITY_ENABLED", "0"),
            ("SWITCHYARD_CACHE_DIR", ""),
        ],
    );
    assert!(!uncached.log().contains("by a child process"));
}
