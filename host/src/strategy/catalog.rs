//! Discovering and loading strategy components.
//!
//! A strategy that cannot be loaded is registered as *missing* with the reason: only the models that
//! select it fail validation; the gateway itself always starts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use wasmtime::component::Component;

use super::StrategyError;
use super::engine::StrategyEngine;
use super::wit::{API_VERSION_SECTION, ApiVersion, Pre, SUPPORTED_API_VERSIONS};

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
    pub name: String,
    pub path: PathBuf,
    pub reason: String,
}

#[derive(Debug, Clone)]
pub enum CatalogEntry {
    Loaded(Arc<LoadedStrategy>),
    Missing(MissingStrategy),
}

/// Every strategy the gateway knows, by name.
#[derive(Debug, Default, Clone)]
pub struct StrategyCatalog {
    entries: BTreeMap<String, CatalogEntry>,
}

impl StrategyCatalog {
    /// Loads the built-ins from `builtin_dir`, then every `*.wasm` in `extra_dir` (a strategy there
    /// replaces a built-in of the same name, with a log line saying so).
    pub async fn discover(
        engine: &StrategyEngine,
        builtin_dir: Option<&Path>,
        extra_dir: Option<&Path>,
    ) -> Self {
        let mut catalog = StrategyCatalog::default();
        for name in BUILTIN_STRATEGIES {
            let path = builtin_dir
                .map(|d| d.join(format!("{name}.wasm")))
                .unwrap_or_else(|| PathBuf::from(format!("{name}.wasm")));
            if !path.is_file() {
                catalog.entries.insert(
                    name.to_string(),
                    CatalogEntry::Missing(MissingStrategy {
                        name: name.to_string(),
                        reason: format!(
                            "built-in strategy file {} does not exist; build it with `cargo xtask build-strategies`",
                            path.display()
                        ),
                        path,
                    }),
                );
                continue;
            }
            catalog.add_file(engine, &path).await;
        }
        if let Some(dir) = extra_dir.filter(|d| {
            // An absent folder simply holds no extra strategies.
            let exists = d.exists();
            if !exists {
                tracing::debug!("strategies.dir {} does not exist", d.display());
            }
            exists
        }) {
            match wasm_files(dir) {
                Ok(files) => {
                    for path in files {
                        catalog.add_file(engine, &path).await;
                    }
                }
                Err(e) => tracing::warn!("strategies.dir {}: {e}", dir.display()),
            }
        }
        catalog
    }

    /// Loads one file and registers it under its declared name (the file stem when it cannot say).
    pub async fn add_file(&mut self, engine: &StrategyEngine, path: &Path) {
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let entry = match load(engine, path).await {
            Ok(loaded) => {
                tracing::debug!(strategy = %loaded.label(), path = %path.display(), "strategy loaded");
                CatalogEntry::Loaded(Arc::new(loaded))
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), "strategy registered as missing: {e}");
                CatalogEntry::Missing(MissingStrategy {
                    name: stem.clone(),
                    path: path.to_owned(),
                    reason: e.to_string(),
                })
            }
        };
        let name = match &entry {
            CatalogEntry::Loaded(l) => l.name.clone(),
            CatalogEntry::Missing(m) => m.name.clone(),
        };
        if let Some(previous) = self.entries.get(&name) {
            let previous_path = match previous {
                CatalogEntry::Loaded(l) => l.path.clone(),
                CatalogEntry::Missing(m) => m.path.clone(),
            };
            // A broken file never shadows a working strategy of the same name.
            if matches!(entry, CatalogEntry::Missing(_))
                && matches!(previous, CatalogEntry::Loaded(_))
            {
                return;
            }
            tracing::info!(
                strategy = %name,
                "{} replaces {}",
                path.display(),
                previous_path.display()
            );
        }
        self.entries.insert(name, entry);
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
    let fail = |reason: String| StrategyError::Load {
        path: path.to_owned(),
        reason,
    };
    let bytes = std::fs::read(path).map_err(|e| fail(format!("cannot read: {e}")))?;
    let api_version = api_version(&bytes).map_err(fail)?;
    let stamped = match &api_version {
        Some(v) => Some(
            ApiVersion::parse(v).ok_or_else(|| StrategyError::UnsupportedApi {
                path: path.to_owned(),
                found: v.clone(),
                supported: SUPPORTED_API_VERSIONS.join(", "),
            })?,
        ),
        None => None,
    };
    let component = Component::new(&engine.engine, &bytes)
        .map_err(|e| fail(format!("not a valid component: {e:?}")))?;
    let pre = match stamped {
        Some(version) => Pre::new(&engine.linkers, &component, version),
        None => Pre::detect(&engine.linkers, &component),
    }
    .map_err(fail)?;

    // Ask the component who it is and what it accepts, in a throwaway instance.
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut store = engine.new_store(&stem);
    let guest = pre
        .instantiate(&mut store)
        .await
        .map_err(|e| fail(format!("cannot instantiate: {e:?}")))?;
    let info = guest
        .info(&mut store)
        .await
        .map_err(|e| fail(format!("info() trapped: {e:?}")))?;
    let schema_text = guest
        .params_schema(&mut store)
        .await
        .map_err(|e| fail(format!("params-schema() trapped: {e:?}")))?;
    let params_schema: serde_json::Value = serde_json::from_str(&schema_text)
        .map_err(|e| fail(format!("params-schema() is not JSON: {e}")))?;
    if params_schema.get("additionalProperties") != Some(&serde_json::Value::Bool(false)) {
        return Err(fail(
            "params-schema() must set `additionalProperties: false` so a mistyped key is an error"
                .into(),
        ));
    }
    let validator = jsonschema::draft202012::new(&params_schema)
        .map_err(|e| fail(format!("params-schema() is not a valid JSON Schema: {e}")))?;
    let name = if info.name.trim().is_empty() {
        stem
    } else {
        info.name
    };
    Ok(LoadedStrategy {
        name,
        version: info.version,
        description: info.description,
        path: path.to_owned(),
        api_version,
        api: pre.version(),
        params_schema,
        validator,
        pre,
    })
}

/// Reads the API version the SDK stamped into the component, without compiling it.
///
/// Custom sections sit at the top level of the binary in a simple form: id 0, a LEB128 size, a
/// LEB128-prefixed name, then the payload. Only the top level and nested core modules are scanned
/// shallowly; a component without the section is accepted (other toolchains may not stamp it).
pub fn api_version(bytes: &[u8]) -> Result<Option<String>, String> {
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
    fn scan(bytes: &[u8], depth: u32) -> Option<String> {
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
                if name == API_VERSION_SECTION.as_bytes() {
                    let payload = &body[p + name_len..];
                    return Some(String::from_utf8_lossy(payload).trim().to_owned());
                }
            } else if is_component && (id == 1 || id == 4) && depth < 4 {
                // A nested core module (id 1) or component (id 4): the SDK's static lands in the
                // core module that holds the strategy's code.
                if let Some(v) = scan(body, depth + 1) {
                    return Some(v);
                }
            }
        }
        None
    }
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err("not a WebAssembly file (bad magic number)".into());
    }
    if bytes[6] != 1 {
        return Err(
            "is a core WebAssembly module, not a component; build for wasm32-wasip2 or wrap it with `wasm-tools component new`"
                .into(),
        );
    }
    Ok(scan(bytes, 0))
}
