//! Discovering and loading strategy components.
//!
//! A strategy that cannot be loaded is registered as *missing* with the reason: only the models that
//! select it fail validation; the gateway itself always starts.
//!
//! Built-ins load first; the files of `strategies.dir` load through [`StrategyCatalog::reload`],
//! at start and again whenever the folder changes: a catalog is a value, and a reload builds the
//! next one from the last, compiling only files whose content changed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use wasmtime::component::Component;

use sha2::{Digest, Sha256};

use super::StrategyError;
use super::engine::StrategyEngine;
use super::imports;
use super::skips::{SKIPS_SECTION, SkippedCalls};
use super::wit::{API_VERSION_SECTION, ApiVersion, Pre, SUPPORTED_API_VERSIONS};

/// Name of the custom section in which a strategy declares the deadline its calls need, in
/// decimal milliseconds (`"20"`): an interpreted guest's `select` at many candidates needs more
/// than the 5 ms default. The host caps it at `strategies.max_call_timeout_ms`.
pub const DEADLINE_SECTION: &str = "switchyard-router-deadline-ms";

/// The strategies that ship with Switchyard; each is expected in the built-in folder as `{name}.wasm`.
pub const BUILTIN_STRATEGIES: &[&str] = &["fixed", "round_robin", "routewise"];

/// A compiled strategy, ready to instantiate one router per model.
pub struct LoadedStrategy {
    pub name: String,
    pub version: String,
    pub description: String,
    pub path: PathBuf,
    /// The WIT API version stamped by the SDK, if the component carries one.
    pub api_version: Option<String>,
    /// The WIT API version the host runs it with (the stamped one, else the newest that fits).
    pub api: ApiVersion,
    /// The `router_params` schema as the component exported it.
    pub params_schema: serde_json::Value,
    /// The component's imports as it names them (`wasi:io/streams@0.2.6`), read before compiling.
    pub imports: Vec<String>,
    /// SHA-256 of the file's content: a reload keeps a strategy whose file still hashes the same.
    pub sha256: String,
    /// The `select` deadline the component declares (custom section
    /// [`DEADLINE_SECTION`], decimal milliseconds), capped by the host when used.
    pub declared_deadline: Option<std::time::Duration>,
    /// The calls the component declares it does without (custom section [`SKIPS_SECTION`]).
    pub skips: SkippedCalls,
    validator: jsonschema::Validator,
    pub(super) pre: Pre,
}

impl std::fmt::Debug for LoadedStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedStrategy")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl LoadedStrategy {
    /// Whether the strategy sees `affinity-pinned` on its candidates (WIT 0.2.0 and later) and so
    /// decides for itself what session affinity is worth; the host keeps the pinned candidate
    /// first for older strategies, which cannot see it.
    pub fn sees_affinity(&self) -> bool {
        self.api != ApiVersion::V0_1
    }

    /// `name version`, the label used in logs and errors.
    pub fn label(&self) -> String {
        format!("{} {}", self.name, self.version)
    }

    /// Checks `params` against the strategy's schema; each message names the offending key.
    pub fn validate_params(&self, params: &serde_json::Value) -> Result<(), Vec<String>> {
        let errors: Vec<String> = self
            .validator
            .iter_errors(params)
            .map(|e| {
                let at = e.instance_path().to_string();
                if at.is_empty() {
                    e.to_string()
                } else {
                    format!("at `{}`: {e}", at.trim_start_matches('/').replace('/', "."))
                }
            })
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}

/// A strategy name that was expected or found but cannot be used, with the reason.
#[derive(Debug, Clone)]
pub struct MissingStrategy {
    /// The name the file declares when it got as far as `info()`, else its file stem.
    pub name: String,
    pub path: PathBuf,
    /// One line (wasmtime's multi-line reports are joined), so listings stay one line per entry.
    pub reason: String,
    /// The component's imports, when its binary could be read.
    pub imports: Vec<String>,
    /// SHA-256 of the file's content, when it could be read.
    pub sha256: Option<String>,
}

#[derive(Debug, Clone)]
pub enum CatalogEntry {
    Loaded(Arc<LoadedStrategy>),
    Missing(MissingStrategy),
}

impl CatalogEntry {
    pub fn path(&self) -> &Path {
        match self {
            CatalogEntry::Loaded(l) => &l.path,
            CatalogEntry::Missing(m) => &m.path,
        }
    }
}

/// One file of `strategies.dir` as the catalog knows it.
#[derive(Debug, Clone)]
struct FileState {
    /// The newest content of the file that loaded (and, for a hot reload, passed the contract
    /// suite): what its strategy name serves.
    serving: Option<Arc<LoadedStrategy>>,
    /// The file's current content, when it failed: `serving` (older content) goes on serving.
    failed: Option<MissingStrategy>,
}

impl FileState {
    /// The hash of the content last seen in the file.
    fn sha256(&self) -> Option<&str> {
        match (&self.failed, &self.serving) {
            (Some(f), _) => f.sha256.as_deref(),
            (None, Some(s)) => Some(&s.sha256),
            (None, None) => None,
        }
    }
}

/// What a reload did with one file of `strategies.dir`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FileOutcome {
    pub path: PathBuf,
    /// `loaded` (new or changed content, now serving), `unchanged`, `failed` (its current content
    /// cannot serve, changed or not) or `removed`.
    pub state: &'static str,
    /// The strategy name the file declares (or its stem when it could not say).
    pub strategy: String,
    pub sha256: Option<String>,
    /// Why it failed, for `failed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What this file still serves after a failure (`name version`, its older content), if anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub still_serving: Option<String>,
}

/// Every strategy the gateway knows, by name.
///
/// A value: a reload builds a new catalog from the old one (reusing every file whose content did
/// not change) and the gateway swaps it in whole.
#[derive(Debug, Default, Clone)]
pub struct StrategyCatalog {
    entries: BTreeMap<String, CatalogEntry>,
    builtins: BTreeMap<String, CatalogEntry>,
    files: BTreeMap<PathBuf, FileState>,
}

/// Largest strategy file read (the biggest interpreted guests are ~12 MB).
pub const MAX_STRATEGY_FILE_BYTES: u64 = 256 << 20;

/// What a reload checks a new or changed file with before it serves: the contract suite, given
/// the strategy and the params to create it with.
pub type Verify<'a> = &'a (
        dyn Fn(Arc<LoadedStrategy>) -> futures::future::BoxFuture<'static, Result<(), String>>
            + Sync
    );

impl StrategyCatalog {
    /// Loads the built-ins from `builtin_dir`, then every `*.wasm` in `extra_dir` (a strategy there
    /// replaces a built-in of the same name, with a log line saying so). Files load in parallel.
    pub async fn discover(
        engine: &StrategyEngine,
        builtin_dir: Option<&Path>,
        extra_dir: Option<&Path>,
    ) -> Self {
        let builtins = Self::builtins(engine, builtin_dir).await;
        match extra_dir {
            Some(dir) => builtins.reload(engine, dir, None).await.0,
            None => builtins,
        }
    }

    /// The built-in strategies only, loaded in parallel.
    pub async fn builtins(engine: &StrategyEngine, builtin_dir: Option<&Path>) -> Self {
        let mut catalog = StrategyCatalog::default();
        let mut present = Vec::new();
        for name in BUILTIN_STRATEGIES {
            let path = builtin_dir
                .map(|d| d.join(format!("{name}.wasm")))
                .unwrap_or_else(|| PathBuf::from(format!("{name}.wasm")));
            if path.is_file() {
                present.push(path);
                continue;
            }
            catalog.builtins.insert(
                name.to_string(),
                CatalogEntry::Missing(MissingStrategy {
                    name: name.to_string(),
                    reason: format!(
                        "built-in strategy file {} does not exist; build it with `cargo xtask build-strategies`",
                        path.display()
                    ),
                    path,
                    imports: Vec::new(),
                    sha256: None,
                }),
            );
        }
        let paths: Vec<&Path> = present.iter().map(PathBuf::as_path).collect();
        super::compile_child::warm_cache(engine, &paths).await;
        let loads = present.iter().map(|path| load_file(engine, path));
        for (path, loaded) in present.iter().zip(futures::future::join_all(loads).await) {
            let entry = match loaded {
                Ok(l) => {
                    tracing::debug!(strategy = %l.label(), path = %path.display(), "strategy loaded");
                    CatalogEntry::Loaded(Arc::new(l))
                }
                Err(m) => {
                    tracing::warn!(path = %path.display(), "strategy registered as missing: {}", m.reason);
                    CatalogEntry::Missing(m)
                }
            };
            let name = match &entry {
                CatalogEntry::Loaded(l) => l.name.clone(),
                CatalogEntry::Missing(m) => m.name.clone(),
            };
            insert(&mut catalog.builtins, name, entry);
        }
        catalog.recompute();
        catalog
    }

    /// A new catalog with `dir`'s files as they are now. A file whose content (SHA-256) is the one
    /// already known keeps its compiled strategy; new and changed files load in parallel and, when
    /// `verify` is given, must pass it. A changed file that fails leaves its older content serving.
    /// Removed files leave the catalog (a built-in they shadowed comes back).
    pub async fn reload(
        &self,
        engine: &StrategyEngine,
        dir: &Path,
        verify: Option<Verify<'_>>,
    ) -> (StrategyCatalog, Vec<FileOutcome>) {
        let mut next = StrategyCatalog {
            builtins: self.builtins.clone(),
            ..Default::default()
        };
        let mut outcomes = Vec::new();
        let files = if dir.exists() {
            wasm_files(dir).unwrap_or_else(|e| {
                tracing::warn!("strategies.dir {}: {e}", dir.display());
                Vec::new()
            })
        } else {
            // An absent folder simply holds no extra strategies.
            tracing::debug!("strategies.dir {} does not exist", dir.display());
            Vec::new()
        };
        // Read and hash every file; only new content is compiled.
        let mut changed = Vec::new();
        for path in files {
            let bytes = read_limited(&path);
            let sha = bytes.as_ref().ok().map(|b| hex::encode(Sha256::digest(b)));
            let known = self.files.get(&path);
            if let (Some(state), Some(sha)) = (known, &sha)
                && state.sha256() == Some(sha.as_str())
            {
                // A file whose content failed stays `failed` until it changes.
                let kind = if state.failed.is_some() {
                    "failed"
                } else {
                    "unchanged"
                };
                outcomes.push(outcome(&path, state, kind));
                next.files.insert(path, state.clone());
                continue;
            }
            changed.push((path, bytes));
        }
        let compiled: Vec<&Path> = changed
            .iter()
            .filter(|(_, bytes)| bytes.is_ok())
            .map(|(path, _)| path.as_path())
            .collect();
        super::compile_child::warm_cache(engine, &compiled).await;
        let loads = changed.iter().map(|(path, bytes)| async move {
            let loaded = match bytes {
                Ok(bytes) => load_bytes(engine, path, bytes.clone()).await,
                Err(reason) => Err(MissingStrategy {
                    name: stem(path),
                    path: path.clone(),
                    reason: reason.clone(),
                    imports: Vec::new(),
                    sha256: None,
                }),
            };
            match (loaded, verify) {
                (Ok(l), Some(verify)) => {
                    let l = Arc::new(l);
                    match verify(l.clone()).await {
                        Ok(()) => Ok(l),
                        Err(reason) => Err(MissingStrategy {
                            name: l.name.clone(),
                            path: path.clone(),
                            reason: one_line(&format!("fails the router contract: {reason}")),
                            imports: l.imports.clone(),
                            sha256: Some(l.sha256.clone()),
                        }),
                    }
                }
                (Ok(l), None) => Ok(Arc::new(l)),
                (Err(m), _) => Err(m),
            }
        });
        for ((path, _), result) in changed.iter().zip(futures::future::join_all(loads).await) {
            let previous = self.files.get(path).and_then(|s| s.serving.clone());
            let state = match result {
                Ok(loaded) => {
                    tracing::info!(strategy = %loaded.label(), path = %path.display(), sha256 = %loaded.sha256, "strategy loaded");
                    FileState {
                        serving: Some(loaded),
                        failed: None,
                    }
                }
                Err(missing) => {
                    match &previous {
                        Some(old) => tracing::warn!(
                            path = %path.display(),
                            "strategy file changed but cannot be used; {} goes on serving: {}",
                            old.label(),
                            missing.reason
                        ),
                        None => {
                            tracing::warn!(path = %path.display(), "strategy registered as missing: {}", missing.reason)
                        }
                    }
                    FileState {
                        serving: previous,
                        failed: Some(missing),
                    }
                }
            };
            let kind = if state.failed.is_some() {
                "failed"
            } else {
                "loaded"
            };
            outcomes.push(outcome(path, &state, kind));
            next.files.insert(path.clone(), state);
        }
        for (path, state) in &self.files {
            if !next.files.contains_key(path) {
                tracing::info!(path = %path.display(), "strategy file removed");
                outcomes.push(outcome(path, state, "removed"));
            }
        }
        next.recompute();
        (next, outcomes)
    }

    /// Rebuilds the by-name view: built-ins, then the folder's files in path order (a later file
    /// replaces an earlier one of the same name; a broken file never shadows a working one).
    fn recompute(&mut self) {
        let mut entries = self.builtins.clone();
        for state in self.files.values() {
            let entry = match (&state.serving, &state.failed) {
                (Some(l), _) => CatalogEntry::Loaded(l.clone()),
                (None, Some(m)) => CatalogEntry::Missing(m.clone()),
                (None, None) => continue,
            };
            let name = match &entry {
                CatalogEntry::Loaded(l) => l.name.clone(),
                CatalogEntry::Missing(m) => m.name.clone(),
            };
            insert(&mut entries, name, entry);
        }
        self.entries = entries;
    }

    /// Files of `strategies.dir` whose current content failed, whether or not an older content
    /// still serves: what `/health/deep` reports.
    pub fn failed_files(
        &self,
    ) -> impl Iterator<Item = (&MissingStrategy, Option<&Arc<LoadedStrategy>>)> {
        self.files
            .values()
            .filter_map(|s| s.failed.as_ref().map(|f| (f, s.serving.as_ref())))
    }

    pub fn get(&self, name: &str) -> Option<&CatalogEntry> {
        self.entries.get(name)
    }

    pub fn entries(&self) -> impl Iterator<Item = (&String, &CatalogEntry)> {
        self.entries.iter()
    }

    /// Names of every registered strategy, loaded or missing, for error messages.
    pub fn names(&self) -> Vec<&str> {
        self.entries.keys().map(String::as_str).collect()
    }
}

/// Registers `entry` under `name`, logging when it replaces another file's entry.
fn insert(entries: &mut BTreeMap<String, CatalogEntry>, name: String, entry: CatalogEntry) {
    if let Some(previous) = entries.get(&name) {
        // A broken file never shadows a working strategy of the same name.
        if matches!(entry, CatalogEntry::Missing(_)) && matches!(previous, CatalogEntry::Loaded(_))
        {
            return;
        }
        tracing::debug!(
            strategy = %name,
            "{} replaces {}",
            entry.path().display(),
            previous.path().display()
        );
    }
    entries.insert(name, entry);
}

fn outcome(path: &Path, state: &FileState, kind: &'static str) -> FileOutcome {
    FileOutcome {
        path: path.to_owned(),
        state: kind,
        strategy: match (&state.failed, &state.serving) {
            (Some(f), _) => f.name.clone(),
            (None, Some(s)) => s.name.clone(),
            (None, None) => stem(path),
        },
        sha256: state.sha256().map(str::to_owned),
        reason: state.failed.as_ref().map(|f| f.reason.clone()),
        still_serving: state
            .failed
            .as_ref()
            .and(state.serving.as_ref())
            .map(|s| s.label()),
    }
}

fn stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Reads a strategy file, refusing one larger than [`MAX_STRATEGY_FILE_BYTES`].
pub(super) fn read_limited(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read: {e}"))?;
    let mut bytes = Vec::new();
    file.take(MAX_STRATEGY_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() as u64 > MAX_STRATEGY_FILE_BYTES {
        return Err(format!(
            "is larger than the {} MiB a strategy file may have",
            MAX_STRATEGY_FILE_BYTES >> 20
        ));
    }
    Ok(bytes)
}

/// Joins a multi-line report (wasmtime's `Caused by:` chains) into one line.
pub fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && *l != "Caused by:")
        .map(|l| {
            l.trim_start_matches(|c: char| c.is_ascii_digit() || c == ':')
                .trim()
        })
        .collect::<Vec<_>>()
        .join("; ")
        .replace('\t', " ")
}

fn wasm_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "wasm"))
        .collect();
    files.sort();
    Ok(files)
}

/// Reads, version-checks, compiles and introspects one component.
pub async fn load(engine: &StrategyEngine, path: &Path) -> Result<LoadedStrategy, StrategyError> {
    let bytes = read_limited(path).map_err(|reason| StrategyError::Load {
        path: path.to_owned(),
        reason,
    })?;
    load_bytes(engine, path, bytes)
        .await
        .map_err(|m| StrategyError::Load {
            path: m.path,
            reason: m.reason,
        })
}

/// [`load_bytes`] from the file at `path`, as a catalog entry on failure.
async fn load_file(
    engine: &StrategyEngine,
    path: &Path,
) -> Result<LoadedStrategy, MissingStrategy> {
    match read_limited(path) {
        Ok(bytes) => load_bytes(engine, path, bytes).await,
        Err(reason) => Err(MissingStrategy {
            name: stem(path),
            path: path.to_owned(),
            reason,
            imports: Vec::new(),
            sha256: None,
        }),
    }
}

/// Checks the version stamp and the imports (cheap), then compiles on a blocking thread (seconds
/// for an interpreted guest) and asks the component for its name and params schema. A failure
/// carries what could be read: the declared name once `info()` answered, the imports, the hash.
pub async fn load_bytes(
    engine: &StrategyEngine,
    path: &Path,
    bytes: Vec<u8>,
) -> Result<LoadedStrategy, MissingStrategy> {
    let sha256 = hex::encode(Sha256::digest(&bytes));
    let mut failure = MissingStrategy {
        name: stem(path),
        path: path.to_owned(),
        reason: String::new(),
        imports: Vec::new(),
        sha256: Some(sha256.clone()),
    };
    let fail = |mut failure: MissingStrategy, e: StrategyError| {
        failure.reason = one_line(&match e {
            StrategyError::Load { reason, .. } => reason,
            e => e.to_string(),
        });
        failure
    };
    // A file refused before compiling: the reason is all there is to say.
    let refuse = |mut failure: MissingStrategy, reason: String| {
        failure.reason = one_line(&reason);
        failure
    };
    let declared = match declarations(&bytes) {
        Ok(declared) => declared,
        Err(reason) => return Err(refuse(failure, reason)),
    };
    let shape = match imports::read(&bytes) {
        Ok(shape) => shape,
        Err(reason) => return Err(refuse(failure, reason)),
    };
    failure.imports = shape.imports.clone();
    if let Err(reason) = imports::check(&shape) {
        return Err(refuse(failure, reason));
    }
    let api_version = declared.api_version;
    match compile_and_ask(engine, path, bytes, api_version, shape.imports, sha256).await {
        Ok(mut loaded) => {
            loaded.declared_deadline = declared.deadline;
            loaded.skips = declared.skips;
            Ok(loaded)
        }
        Err((declared, e)) => {
            if let Some(name) = declared {
                failure.name = name;
            }
            Err(fail(failure, e))
        }
    }
}

/// What a component says about itself in custom sections, read without compiling it.
struct Declarations {
    /// The WIT API version the SDK stamped, if any.
    api_version: Option<String>,
    /// [`DEADLINE_SECTION`], when present.
    deadline: Option<std::time::Duration>,
    /// [`SKIPS_SECTION`]; nothing skipped when absent.
    skips: SkippedCalls,
}

/// Reads the component's [`Declarations`]; a malformed one is the file's refusal reason.
fn declarations(bytes: &[u8]) -> Result<Declarations, String> {
    let api_version = api_version(bytes)?;
    let deadline = match custom_section(bytes, DEADLINE_SECTION) {
        None => None,
        Some(text) => match text.parse::<u64>() {
            Ok(ms) if ms > 0 => Some(std::time::Duration::from_millis(ms)),
            _ => {
                return Err(format!(
                    "custom section {DEADLINE_SECTION} must hold a positive number of milliseconds, not {text:?}"
                ));
            }
        },
    };
    let skips = custom_section(bytes, SKIPS_SECTION)
        .map(|text| SkippedCalls::parse(&text))
        .transpose()?
        .unwrap_or_default();
    Ok(Declarations {
        api_version,
        deadline,
        skips,
    })
}

/// The expensive half of a load. The error carries the declared name once `info()` answered.
async fn compile_and_ask(
    engine: &StrategyEngine,
    path: &Path,
    bytes: Vec<u8>,
    api_version: Option<String>,
    imports: Vec<String>,
    sha256: String,
) -> Result<LoadedStrategy, (Option<String>, StrategyError)> {
    let fail = |reason: String| StrategyError::Load {
        path: path.to_owned(),
        reason,
    };
    let stamped = match &api_version {
        Some(v) => Some(ApiVersion::parse(v).ok_or_else(|| {
            (
                None,
                StrategyError::UnsupportedApi {
                    path: path.to_owned(),
                    found: v.clone(),
                    supported: SUPPORTED_API_VERSIONS.join(", "),
                },
            )
        })?),
        None => None,
    };
    // Compiling takes seconds for an interpreted guest: on a blocking thread, so the runtime's
    // workers keep serving, and several files compile at once.
    let compile_engine = engine.engine.clone();
    let component = tokio::task::spawn_blocking(move || {
        let component = Component::new(&compile_engine, &bytes);
        // Compiling frees tens of MiB on this thread; its heap would keep them resident for as
        // long as the thread lives, and the blocking pool keeps idle threads for seconds.
        switchyard_allocator::return_freed_memory();
        component
    })
    .await
    .map_err(|e| (None, fail(format!("compiling stopped: {e}"))))?
    .map_err(|e| (None, fail(format!("not a valid component: {e:?}"))))?;
    let pre = match stamped {
        Some(version) => Pre::new(&engine.linkers, &component, version),
        None => Pre::detect(&engine.linkers, &component),
    }
    .map_err(|e| (None, fail(e)))?;

    // Ask the component who it is and what it accepts, in a throwaway instance.
    let stem = stem(path);
    let _running = engine.guest_running();
    let mut store = engine.new_store(&stem);
    let guest = pre
        .instantiate(&mut store)
        .await
        .map_err(|e| (None, fail(format!("cannot instantiate: {e:?}"))))?;
    let info = guest
        .info(&mut store)
        .await
        .map_err(|e| (None, fail(format!("info() trapped: {e:?}"))))?;
    let name = if info.name.trim().is_empty() {
        stem
    } else {
        info.name
    };
    let declared = Some(name.clone());
    let schema_text = guest.params_schema(&mut store).await.map_err(|e| {
        (
            declared.clone(),
            fail(format!("params-schema() trapped: {e:?}")),
        )
    })?;
    let params_schema: serde_json::Value = serde_json::from_str(&schema_text).map_err(|e| {
        (
            declared.clone(),
            fail(format!("params-schema() is not JSON: {e}")),
        )
    })?;
    if params_schema.get("additionalProperties") != Some(&serde_json::Value::Bool(false)) {
        return Err((
            declared,
            fail(
                "params-schema() must set `additionalProperties: false` so a mistyped key is an error"
                    .into(),
            ),
        ));
    }
    let validator = jsonschema::draft202012::new(&params_schema).map_err(|e| {
        (
            declared.clone(),
            fail(format!("params-schema() is not a valid JSON Schema: {e}")),
        )
    })?;
    Ok(LoadedStrategy {
        name,
        version: info.version,
        description: info.description,
        path: path.to_owned(),
        api_version,
        api: pre.version(),
        params_schema,
        validator,
        imports,
        sha256,
        declared_deadline: None,
        skips: SkippedCalls::default(),
        pre,
    })
}

/// Reads the API version the SDK stamped into the component, without compiling it.
///
/// Custom sections sit at the top level of the binary in a simple form: id 0, a LEB128 size, a
/// LEB128-prefixed name, then the payload. Only the top level and nested core modules are scanned
/// shallowly; a component without the section is accepted (other toolchains may not stamp it).
pub fn api_version(bytes: &[u8]) -> Result<Option<String>, String> {
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err("not a WebAssembly file (bad magic number)".into());
    }
    if bytes[6] != 1 {
        return Err(
            "is a core WebAssembly module, not a component; build for wasm32-wasip2 or wrap it with `wasm-tools component new`"
                .into(),
        );
    }
    Ok(custom_section(bytes, API_VERSION_SECTION))
}

/// The trimmed text of the first custom section called `wanted`, at the top level of the
/// component or in a nested module or component (where a language's static lands), without
/// compiling anything.
pub fn custom_section(bytes: &[u8], wanted: &str) -> Option<String> {
    fn leb(bytes: &[u8], pos: &mut usize) -> Option<u64> {
        let mut result = 0u64;
        let mut shift = 0;
        loop {
            let b = *bytes.get(*pos)?;
            *pos += 1;
            result |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(result);
            }
            shift += 7;
            if shift > 63 {
                return None;
            }
        }
    }
    fn scan(bytes: &[u8], wanted: &str, depth: u32) -> Option<String> {
        // Preamble: magic + version/layer (8 bytes).
        if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
            return None;
        }
        let is_component = bytes[6] == 1;
        let mut pos = 8;
        while pos < bytes.len() {
            let id = bytes[pos];
            pos += 1;
            let size = leb(bytes, &mut pos)? as usize;
            let body = bytes.get(pos..pos.checked_add(size)?)?;
            pos += size;
            if id == 0 {
                let mut p = 0;
                let name_len = leb(body, &mut p)? as usize;
                let name = body.get(p..p + name_len)?;
                if name == wanted.as_bytes() {
                    let payload = &body[p + name_len..];
                    return Some(String::from_utf8_lossy(payload).trim().to_owned());
                }
            } else if is_component && (id == 1 || id == 4) && depth < 4 {
                // A nested core module (id 1) or component (id 4): the SDK's static lands in the
                // core module that holds the strategy's code.
                if let Some(v) = scan(body, wanted, depth + 1) {
                    return Some(v);
                }
            }
        }
        None
    }
    scan(bytes, wanted, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A component importing `wasi:http/types@0.2.10` (an empty instance) and nothing else.
    fn http_importing_component() -> Vec<u8> {
        let name = b"wasi:http/types@0.2.10";
        let mut bytes = b"\0asm\x0d\x00\x01\x00".to_vec();
        bytes.extend_from_slice(&[0x07, 0x03, 0x01, 0x42, 0x00]);
        let mut import = vec![0x01, 0x00, name.len() as u8];
        import.extend_from_slice(name);
        import.extend_from_slice(&[0x05, 0x00]);
        bytes.push(0x0a);
        bytes.push(import.len() as u8);
        bytes.extend_from_slice(&import);
        bytes
    }

    #[tokio::test]
    async fn an_import_the_host_lacks_is_refused_by_name_with_the_imports_listed() {
        let engine = StrategyEngine::new(super::super::StrategyLimits::default()).unwrap();
        let bytes = http_importing_component();
        assert_eq!(
            imports::read(&bytes).unwrap().imports,
            ["wasi:http/types@0.2.10"]
        );
        let failure = load_bytes(&engine, Path::new("/strategies/js.wasm"), bytes)
            .await
            .unwrap_err();
        assert_eq!(failure.name, "js", "no info() to ask: the file stem");
        assert_eq!(failure.imports, ["wasi:http/types@0.2.10"]);
        assert!(
            failure
                .reason
                .starts_with("imports wasi:http/types@0.2.10: strategies get no network"),
            "{}",
            failure.reason
        );
        assert!(failure.sha256.is_some());
    }

    #[test]
    fn multi_line_reports_become_one_line() {
        let text = "not a valid component: failed to compile\n\nCaused by:\n    0: func 0 failed\n    1: type index out of bounds\tat 12";
        assert_eq!(
            one_line(text),
            "not a valid component: failed to compile; func 0 failed; type index out of bounds at 12"
        );
    }

    #[test]
    fn custom_sections_are_found_by_name() {
        let mut bytes = b"\0asm\x0d\x00\x01\x00".to_vec();
        let mut body = vec![DEADLINE_SECTION.len() as u8];
        body.extend_from_slice(DEADLINE_SECTION.as_bytes());
        body.extend_from_slice(b"20");
        bytes.push(0);
        bytes.push(body.len() as u8);
        bytes.extend_from_slice(&body);
        assert_eq!(
            custom_section(&bytes, DEADLINE_SECTION).as_deref(),
            Some("20")
        );
        assert_eq!(custom_section(&bytes, API_VERSION_SECTION), None);
    }
}
