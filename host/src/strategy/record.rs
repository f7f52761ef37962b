//! Decision recording (`strategies.record`): a sampled fraction of strategy decisions, each with
//! everything the strategy was told and what it answered, appended as JSON lines to a file that
//! rotates at a size limit. `switchyard strategies replay` ([`super::replay`]) re-runs them.
//!
//! A record's `input` has the shape of a `strategies run --input` file (the upstream table as WIT
//! route records, the request's facts, the candidates as the strategy saw them), so one line can
//! be re-run alone with `jq .input`. The host supplies the seed and the time to every `select`,
//! so a strategy that decides from its inputs decides the same again.
//!
//! Why a file and not the database: records are written by the request path's neighbour and read
//! only offline, in order, by a command that needs no connection; a rotating file bounds their
//! disk use by two numbers and keeps them out of the request log's tables and backups.
//!
//! The request path only samples and queues (`queue`, default 1024); a full queue drops the
//! decision and counts it. One thread serialises and writes, so disk latency never reaches a
//! request.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::StrategyError;
use super::catalog::LoadedStrategy;
use super::router::ModelRouter;
use super::types::{Candidate, CircuitState, Decision, Modalities, Request, UpstreamInfo};
use crate::config::RecordConfig;
use crate::telemetry::metrics as telemetry;

/// The record format's version (`v` of every line).
pub const RECORD_VERSION: u64 = 1;

/// Why recording cannot start.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The record file cannot be opened for appending.
    #[error("strategies.record.path {}: {source}", path.display())]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The writer thread could not be started.
    #[error("strategies.record: starting the writer: {0}")]
    Thread(std::io::Error),
}

/// What the writer has done, for `/routing`.
#[derive(Debug, Default)]
pub struct RecorderStats {
    pub written: AtomicU64,
    /// Dropped because `queue` decisions were already waiting.
    pub dropped: AtomicU64,
    /// Lost to a write error.
    pub failed: AtomicU64,
}

/// One sampled decision, as the request path hands it over (serialised by the writer).
struct Sample {
    at_ms: u64,
    model: String,
    strategy: Arc<LoadedStrategy>,
    params_json: String,
    routes: Vec<UpstreamInfo>,
    request: Request,
    candidates: Vec<Candidate>,
    decided: Result<Decision, String>,
}

/// Samples decisions and queues them for the writer thread.
pub struct Recorder {
    config: RecordConfig,
    path: PathBuf,
    queue: mpsc::Sender<Sample>,
    pub stats: Arc<RecorderStats>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("path", &self.path)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Recorder {
    /// Opens `path` (the resolved `config.path`) for appending and starts the writer thread.
    pub fn start(config: &RecordConfig, path: PathBuf) -> Result<Recorder, RecordError> {
        let file = RotatingFile::open(&path, config.max_file_bytes, config.max_files)?;
        let stats = Arc::new(RecorderStats::default());
        let (queue, samples) = mpsc::channel(config.queue.max(1));
        let writer_stats = stats.clone();
        std::thread::Builder::new()
            .name("decision-record".into())
            .spawn(move || write_samples(samples, file, &writer_stats))
            .map_err(RecordError::Thread)?;
        Ok(Recorder {
            config: config.clone(),
            path,
            queue,
            stats,
        })
    }

    /// Records this decision with probability `sample_rate`; never waits.
    pub fn offer(
        &self,
        router: &ModelRouter,
        request: &Request,
        candidates: &[Candidate],
        decided: &Result<Decision, StrategyError>,
    ) {
        if rand::random::<f64>() >= self.config.sample_rate {
            return;
        }
        let sample = Sample {
            at_ms: crate::clock::unix_ms(),
            model: router.model_id.clone(),
            strategy: router.strategy.clone(),
            params_json: router.params_json().to_owned(),
            routes: router.upstreams(),
            request: *request,
            candidates: candidates.to_vec(),
            decided: match decided {
                Ok(d) => Ok(d.clone()),
                Err(e) => Err(e.to_string()),
            },
        };
        if self.queue.try_send(sample).is_err() {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            telemetry::decision_record("dropped");
        }
    }

    /// What `/routing` shows about recording.
    pub fn report(&self) -> Value {
        json!({
            "path": self.path,
            "sample_rate": self.config.sample_rate,
            "max_file_bytes": self.config.max_file_bytes,
            "max_files": self.config.max_files,
            "queue_capacity": self.config.queue,
            "written": self.stats.written.load(Ordering::Relaxed),
            "dropped": self.stats.dropped.load(Ordering::Relaxed),
            "failed": self.stats.failed.load(Ordering::Relaxed),
        })
    }
}

/// The writer thread: serialises what arrives, writes it, flushes whenever the queue is empty
/// (so a record is on disk moments after its request), and ends when the recorder is dropped.
fn write_samples(
    mut samples: mpsc::Receiver<Sample>,
    mut file: RotatingFile,
    stats: &RecorderStats,
) {
    let mut warned = false;
    while let Some(first) = samples.blocking_recv() {
        let mut next = Some(first);
        while let Some(sample) = next {
            let mut line = record_line(&sample).to_string();
            line.push('\n');
            match file.append(line.as_bytes()) {
                Ok(()) => {
                    stats.written.fetch_add(1, Ordering::Relaxed);
                    telemetry::decision_record("written");
                }
                Err(e) => {
                    stats.failed.fetch_add(1, Ordering::Relaxed);
                    telemetry::decision_record("failed");
                    if !warned {
                        tracing::warn!(path = %file.path.display(), "writing a decision record failed: {e}");
                        warned = true;
                    }
                }
            }
            next = samples.try_recv().ok();
        }
        if let Err(e) = file.flush() {
            tracing::warn!(path = %file.path.display(), "flushing decision records failed: {e}");
        }
    }
}

/// A file appended to until it would pass `max_bytes`, then renamed to `PATH.1` (older ones
/// move up, `PATH.{max_files - 1}` is deleted) and started afresh.
struct RotatingFile {
    path: PathBuf,
    max_bytes: u64,
    max_files: u32,
    out: std::io::BufWriter<std::fs::File>,
    written: u64,
}

impl RotatingFile {
    fn open(path: &Path, max_bytes: u64, max_files: u32) -> Result<RotatingFile, RecordError> {
        let failed = |source| RecordError::Open {
            path: path.to_owned(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(failed)?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(failed)?;
        let written = file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(RotatingFile {
            path: path.to_owned(),
            max_bytes,
            max_files,
            out: std::io::BufWriter::new(file),
            written,
        })
    }

    fn append(&mut self, line: &[u8]) -> std::io::Result<()> {
        if self.written > 0 && self.written + line.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        self.out.write_all(line)?;
        self.written += line.len() as u64;
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        self.out.flush()?;
        let numbered = |n: u32| {
            let mut p = self.path.clone().into_os_string();
            p.push(format!(".{n}"));
            PathBuf::from(p)
        };
        if self.max_files > 1 {
            let _ = std::fs::remove_file(numbered(self.max_files - 1));
            for n in (1..self.max_files - 1).rev() {
                let from = numbered(n);
                if from.exists() {
                    std::fs::rename(&from, numbered(n + 1))?;
                }
            }
            std::fs::rename(&self.path, numbered(1))?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&self.path)?;
        self.out = std::io::BufWriter::new(file);
        self.written = 0;
        Ok(())
    }
}

/// One record line: when, which model and strategy, the `strategies run` input, and what the
/// strategy answered (`served`) or why it did not (`error`: the request went in declared order).
fn record_line(s: &Sample) -> Value {
    let params: Value = serde_json::from_str(&s.params_json).unwrap_or(Value::Null);
    let mut line = json!({
        "v": RECORD_VERSION,
        "at_ms": s.at_ms,
        "model": s.model,
        "strategy": s.strategy.name,
        "strategy_version": s.strategy.version,
        "params": params,
        "input": {
            "model": s.model,
            "routes": s.routes.iter().map(route_json).collect::<Vec<_>>(),
            "request": request_json(&s.request),
            "candidates": s.candidates.iter().map(candidate_json).collect::<Vec<_>>(),
        },
    });
    match &s.decided {
        Ok(d) => {
            let endpoint = |i: &u32| {
                s.routes
                    .iter()
                    .find(|r| r.index == *i)
                    .map_or_else(|| format!("#{i}"), |r| r.endpoint_id.clone())
            };
            line["served"] = json!({
                "order": d.order,
                "endpoints": d.order.iter().map(endpoint).collect::<Vec<_>>(),
                "hedge": d.hedge,
                "strategy_metadata": d.strategy_metadata,
            });
        }
        Err(e) => line["error"] = json!(e),
    }
    line
}

/// A route as the WIT `route` record `strategies run` reads.
fn route_json(r: &UpstreamInfo) -> Value {
    json!({
        "index": r.index,
        "endpoint_id": r.endpoint_id,
        "provider": r.provider,
        "base_url": r.base_url,
        "provider_model_id": r.provider_model_id,
        "weight": r.weight,
        "priority": r.priority,
        "input_modalities": r.input_modalities,
        "pricing": r.pricing.map(|p| json!({
            "prompt": p.prompt,
            "completion": p.completion,
            "input_cache_reads": p.input_cache_reads,
            "input_cache_writes": p.input_cache_writes,
        })),
        "metadata_json": r.metadata_json,
    })
}

/// A request as recordings store it (also what `strategies/testing/echo_inputs` answers with).
pub fn request_json(r: &Request) -> Value {
    let modalities: Vec<&str> = [
        (Modalities::IMAGE, "image"),
        (Modalities::AUDIO, "audio"),
        (Modalities::VIDEO, "video"),
    ]
    .into_iter()
    .filter(|(flag, _)| r.modalities.contains(*flag))
    .map(|(_, name)| name)
    .collect();
    json!({
        "prompt_tokens": r.prompt_tokens,
        "max_tokens": r.max_tokens,
        "stream": r.stream,
        "seed": r.seed,
        "now_ms": r.now_ms,
        "caller_hash": r.caller_hash,
        "modalities": modalities,
        "prefill": {
            "enabled": r.prefill.enabled,
            "intervene_tokens": r.prefill.intervene_tokens,
            "elephant_tokens": r.prefill.elephant_tokens,
            "elephant_limit": r.prefill.elephant_limit,
        },
        "remaining_budget_usd": r.remaining_budget_usd,
    })
}

/// A candidate as recordings store it.
pub fn candidate_json(c: &Candidate) -> Value {
    json!({
        "index": c.index,
        "weight": c.weight,
        "priority": c.priority,
        "availability": c.availability,
        "circuit": match c.circuit {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::HalfOpen => "half_open",
        },
        "prefill_backlog_tokens": c.prefill_backlog_tokens,
        "inflight_elephants": c.inflight_elephants,
        "uncached_prompt_tokens": c.uncached_prompt_tokens,
        "ttft_ms": c.ttft_ms,
        "latency_ms": c.latency_ms,
        "inflight_requests": c.inflight_requests,
        "affinity_pinned": c.affinity_pinned,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strategy::offline;
    use crate::strategy::types::{PrefillPolicy, Pricing};

    fn sample_input() -> (Vec<UpstreamInfo>, Request, Vec<Candidate>) {
        let routes = vec![
            UpstreamInfo {
                index: 0,
                endpoint_id: "m:a".into(),
                provider: "openai_compat".into(),
                base_url: "http://a/v1".into(),
                provider_model_id: "x".into(),
                weight: 0.1 + 0.2,
                priority: 1,
                input_modalities: vec!["text".into(), "image".into()],
                pricing: Some(Pricing {
                    prompt: 0.6,
                    completion: 2.4,
                    input_cache_reads: 0.06,
                    input_cache_writes: 0.0,
                }),
                metadata_json: r#"{"provider_type":"quota"}"#.into(),
            },
            UpstreamInfo {
                index: 1,
                endpoint_id: "m:b".into(),
                provider: "anthropic".into(),
                base_url: "http://b".into(),
                provider_model_id: "y".into(),
                weight: 2.0,
                priority: 0,
                input_modalities: vec!["text".into()],
                pricing: None,
                metadata_json: "{}".into(),
            },
        ];
        let request = Request {
            caller_hash: u64::MAX - 3,
            prompt_tokens: 1234,
            max_tokens: Some(99),
            stream: true,
            modalities: Modalities::IMAGE,
            seed: (1 << 53) - 1,
            now_ms: 1_790_000_000_123,
            prefill: PrefillPolicy {
                enabled: false,
                intervene_tokens: 7,
                elephant_tokens: 8,
                elephant_limit: 9,
            },
            remaining_budget_usd: Some(1.0 / 3.0),
        };
        let candidates = vec![Candidate {
            index: 1,
            weight: 2.0,
            priority: 0,
            availability: 0.987_654_321,
            circuit: CircuitState::HalfOpen,
            prefill_backlog_tokens: 5,
            inflight_elephants: 1,
            uncached_prompt_tokens: 1000,
            ttft_ms: Some(12.5),
            latency_ms: None,
            inflight_requests: 3,
            affinity_pinned: true,
        }];
        (routes, request, candidates)
    }

    /// What the writer writes, `strategies run` and replay read back exactly: a replayed decision
    /// is made on the same inputs, to the last bit.
    #[test]
    fn a_record_reads_back_as_the_inputs_it_was_made_from() {
        let (routes, request, candidates) = sample_input();
        let input = json!({
            "model": "m",
            "routes": routes.iter().map(route_json).collect::<Vec<_>>(),
            "request": request_json(&request),
            "candidates": candidates.iter().map(candidate_json).collect::<Vec<_>>(),
        });
        let text = input.to_string();
        let file = Path::new("r.jsonl");
        let parsed = offline::parse_input(file, &text).unwrap();
        assert_eq!(offline::routes(file, &parsed).unwrap(), routes);
        assert_eq!(offline::request(&parsed), request);
        let read = offline::candidates(file, &parsed, &routes).unwrap();
        assert_eq!(read, candidates);
    }

    #[test]
    fn the_file_rotates_at_its_size_and_keeps_max_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.jsonl");
        let mut file = RotatingFile::open(&path, 10, 3).unwrap();
        for line in ["aaaaaa\n", "bbbbbb\n", "cccccc\n", "dddddd\n"] {
            file.append(line.as_bytes()).unwrap();
        }
        file.flush().unwrap();
        let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
        assert_eq!(read("d.jsonl"), "dddddd\n");
        assert_eq!(read("d.jsonl.1"), "cccccc\n");
        assert_eq!(read("d.jsonl.2"), "bbbbbb\n");
        assert!(
            !dir.path().join("d.jsonl.3").exists(),
            "max_files bounds the files"
        );
        // Reopened, it appends and counts what is there.
        drop(file);
        let mut file = RotatingFile::open(&path, 10, 1).unwrap();
        file.append(b"e\n").unwrap();
        file.append(b"ffffffff\n").unwrap();
        file.flush().unwrap();
        assert_eq!(
            read("d.jsonl"),
            "ffffffff\n",
            "one file: truncated in place"
        );
    }
}
