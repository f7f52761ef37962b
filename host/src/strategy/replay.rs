//! `switchyard strategies replay`: recorded decisions ([`super::record`]) re-run through any
//! strategy component, and how often it agrees with what the gateway's strategy decided.
//!
//! Records are read in file order. Each model gets one router of the replayed strategy, created
//! with the upstream table of its first record (a later record with another table pushes it, as
//! the gateway did), so a stateful strategy sees the recorded decisions in the order they were
//! made. Observations are not recorded: a strategy that learns from them replays from what it
//! knows at creation, and a stateful one (a rotation) agrees only when every decision was
//! recorded (`sample_rate: 1`) from the start.

use std::collections::BTreeMap;
use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::catalog::LoadedStrategy;
use super::engine::StrategyEngine;
use super::offline::{self, DecisionInput, OfflineError};
use super::record::RECORD_VERSION;
use super::router::ModelRouter;
use super::shadow::{Agreement, compare};
use super::types::UpstreamInfo;

/// The longest record line read; a longer one is an error, not an allocation.
pub const MAX_LINE_BYTES: usize = 16 << 20;

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A `--from` file cannot be read.
    #[error("{}: {source}", file.display())]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    /// A line is not a decision record this version reads.
    #[error("{}:{line}: {message}", file.display())]
    Record {
        file: PathBuf,
        line: usize,
        message: String,
    },
    /// The params do not satisfy the replayed strategy's schema.
    #[error(
        "model `{model}`: strategy `{strategy}` rejects the params {params}: {}{hint}",
        problems.join("; ")
    )]
    Params {
        model: String,
        strategy: String,
        params: String,
        problems: Vec<String>,
        hint: &'static str,
    },
    /// The strategy could not be instantiated for a model.
    #[error("model `{model}`: {source}")]
    Strategy {
        model: String,
        source: super::StrategyError,
    },
}

/// What to replay.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// `--params`; `None`: each model's recorded params when the replayed strategy is the one that
    /// decided, else `{}`.
    pub params: Option<Value>,
    /// Only this model (by the id recorded).
    pub model: Option<String>,
    /// Disagreements shown per model.
    pub examples: usize,
}

/// One line of a record file.
#[derive(Debug, Deserialize)]
struct RecordLine {
    v: u64,
    at_ms: u64,
    model: String,
    strategy: String,
    strategy_version: String,
    params: Value,
    input: DecisionInput,
    /// Absent when the strategy failed (the record has `error` instead).
    served: Option<Served>,
}

#[derive(Debug, Deserialize)]
struct Served {
    order: Vec<u32>,
}

/// What `strategies replay` prints.
#[derive(Debug, Serialize)]
pub struct ReplayReport {
    /// `name version` of the replayed strategy.
    pub strategy: String,
    pub files: Vec<PathBuf>,
    /// Record lines read (every model).
    pub records: usize,
    pub models: Vec<ModelReport>,
}

/// Agreement for one model.
#[derive(Debug, Serialize)]
pub struct ModelReport {
    pub model: String,
    /// `name version` of the strategy that decided when the records were made (the first
    /// record's).
    pub recorded_strategy: String,
    /// The params the replayed strategy was created with.
    pub params: Value,
    /// Decisions compared: records of a served decision that the replayed strategy answered.
    pub compared: usize,
    pub same_primary: usize,
    pub same_order: usize,
    pub primary_agreement: Option<f64>,
    pub order_agreement: Option<f64>,
    /// Records where the recorded strategy had failed (the request went in declared order).
    pub recorded_failures: usize,
    /// Records the replayed strategy failed on (an error, a trap, an invalid order).
    pub replay_failures: usize,
    /// The first disagreements and replay failures, up to `--examples`.
    pub disagreements: Vec<Disagreement>,
}

/// A decision the replayed strategy made differently.
#[derive(Debug, Serialize)]
pub struct Disagreement {
    /// `file:line` of the record.
    pub record: String,
    pub at_ms: u64,
    pub seed: u64,
    /// Endpoint ids in the order served.
    pub served: Vec<String>,
    /// Endpoint ids in the replayed order; empty when it failed.
    pub replayed: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

struct ModelReplay {
    router: ModelRouter,
    routes: Vec<UpstreamInfo>,
    report: ModelReport,
}

/// Replays every record of `files`, in order, through `strategy`.
pub async fn replay(
    engine: &StrategyEngine,
    strategy: Arc<LoadedStrategy>,
    files: &[PathBuf],
    options: &ReplayOptions,
) -> Result<ReplayReport, ReplayError> {
    let mut models: BTreeMap<String, ModelReplay> = BTreeMap::new();
    let mut records = 0;
    for file in files {
        let read_error = |source| ReplayError::Read {
            file: file.clone(),
            source,
        };
        let mut reader = std::io::BufReader::new(std::fs::File::open(file).map_err(read_error)?);
        let mut buf = Vec::new();
        for line_no in 1.. {
            buf.clear();
            let n = (&mut reader)
                .take(MAX_LINE_BYTES as u64 + 1)
                .read_until(b'\n', &mut buf)
                .map_err(|source| ReplayError::Read {
                    file: file.clone(),
                    source,
                })?;
            if n == 0 {
                break;
            }
            let at = |message: String| ReplayError::Record {
                file: file.clone(),
                line: line_no,
                message,
            };
            if buf.len() > MAX_LINE_BYTES {
                return Err(at(format!("longer than {MAX_LINE_BYTES} bytes")));
            }
            let text = std::str::from_utf8(&buf).map_err(|e| at(e.to_string()))?;
            if text.trim().is_empty() {
                continue;
            }
            let record: RecordLine = {
                let mut de = serde_json::Deserializer::from_str(text);
                serde_path_to_error::deserialize(&mut de).map_err(|e| {
                    let path = e.path().to_string();
                    at(format!("{path}: {}", e.into_inner()))
                })?
            };
            if record.v != RECORD_VERSION {
                return Err(at(format!(
                    "record version {} (this switchyard reads {RECORD_VERSION})",
                    record.v
                )));
            }
            if options.model.as_ref().is_some_and(|m| *m != record.model) {
                continue;
            }
            records += 1;
            replay_one(
                engine,
                &strategy,
                options,
                &mut models,
                record,
                file,
                line_no,
            )
            .await?;
        }
    }
    Ok(ReplayReport {
        strategy: strategy.label(),
        files: files.to_vec(),
        records,
        models: models
            .into_values()
            .map(|m| {
                let mut r = m.report;
                let ratio = |n: usize| (r.compared > 0).then(|| n as f64 / r.compared as f64);
                r.primary_agreement = ratio(r.same_primary);
                r.order_agreement = ratio(r.same_order);
                r
            })
            .collect(),
    })
}

async fn replay_one(
    engine: &StrategyEngine,
    strategy: &Arc<LoadedStrategy>,
    options: &ReplayOptions,
    models: &mut BTreeMap<String, ModelReplay>,
    record: RecordLine,
    file: &Path,
    line: usize,
) -> Result<(), ReplayError> {
    let where_ = format!("{}:{line}", file.display());
    let input_error = |e: OfflineError| ReplayError::Record {
        file: file.to_owned(),
        line,
        message: e.to_string(),
    };
    let routes = offline::routes(file, &record.input).map_err(input_error)?;
    let candidates = offline::candidates(file, &record.input, &routes).map_err(input_error)?;
    let request = offline::request(&record.input);
    let model = match models.entry(record.model.clone()) {
        std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
        std::collections::btree_map::Entry::Vacant(v) => {
            let (params, hint) = match &options.params {
                Some(p) => (p.clone(), ""),
                None if record.strategy == strategy.name => (record.params.clone(), ""),
                None => (
                    serde_json::json!({}),
                    " (the records were made by another strategy, so its params were not used: give --params)",
                ),
            };
            if let Err(problems) = strategy.validate_params(&params) {
                return Err(ReplayError::Params {
                    model: record.model,
                    strategy: strategy.label(),
                    params: params.to_string(),
                    problems,
                    hint,
                });
            }
            let router = ModelRouter::new(
                engine,
                strategy.clone(),
                &record.model,
                &params,
                routes.clone(),
            )
            .await
            .map_err(|source| ReplayError::Strategy {
                model: record.model.clone(),
                source,
            })?;
            v.insert(ModelReplay {
                router,
                routes: routes.clone(),
                report: ModelReport {
                    model: record.model.clone(),
                    recorded_strategy: format!("{} {}", record.strategy, record.strategy_version),
                    params,
                    compared: 0,
                    same_primary: 0,
                    same_order: 0,
                    primary_agreement: None,
                    order_agreement: None,
                    recorded_failures: 0,
                    replay_failures: 0,
                    disagreements: Vec::new(),
                },
            })
        }
    };
    if model.routes != routes {
        // As the gateway did when the model's upstreams changed; a failure shows in the select.
        let _ = model.router.refresh_upstreams(routes.clone()).await;
        model.routes = routes.clone();
    }
    let endpoints = |order: &[u32]| -> Vec<String> {
        order
            .iter()
            .map(|i| {
                routes
                    .iter()
                    .find(|r| r.index == *i)
                    .map_or_else(|| format!("#{i}"), |r| r.endpoint_id.clone())
            })
            .collect()
    };
    let replayed = model.router.select(&request, &candidates).await;
    let report = &mut model.report;
    let Some(served) = &record.served else {
        // The gateway's strategy failed here: there is no decision to agree with.
        report.recorded_failures += 1;
        return Ok(());
    };
    let mut example = |replayed: Vec<String>, error: Option<String>| {
        if report.disagreements.len() < options.examples {
            report.disagreements.push(Disagreement {
                record: where_.clone(),
                at_ms: record.at_ms,
                seed: request.seed,
                served: endpoints(&served.order),
                replayed,
                error,
            });
        }
    };
    match replayed {
        Err(e) => {
            report.replay_failures += 1;
            example(Vec::new(), Some(e.to_string()));
        }
        Ok(decision) => {
            let agreement = compare(&decision.order, &served.order);
            if agreement != Agreement::SameOrder {
                example(endpoints(&decision.order), None);
            }
            let report = &mut model.report;
            report.compared += 1;
            match agreement {
                Agreement::SameOrder => {
                    report.same_order += 1;
                    report.same_primary += 1;
                }
                Agreement::SamePrimary => report.same_primary += 1,
                Agreement::DifferentPrimary => {}
            }
        }
    }
    Ok(())
}
