//! Loading the YAML config: read, parse strictly while interpolating `${VAR}` into scalar values,
//! validate into runtime types.
//!
//! Every error names the file, the line and the key path (`models[0].route[1]: unknown field ...`);
//! validation errors also name the model id.
//!
//! The work is split by job: `runtime` types are what the rest of the host reads, `validate`
//! turns the raw YAML ([`raw`]) into them, `knobs` reads the settings that an environment variable
//! may override, and `endpoint_id` names each upstream location.

mod endpoint_id;
mod interpolate;
mod knobs;
mod lines;
pub mod raw;
mod runtime;
mod validate;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

pub use endpoint_id::{endpoint_id, is_loopback};
pub use lines::KeyLines;
pub use raw::{Capability, DefaultAuth, LogFormat, ProviderKind};
pub use runtime::{
    Config, DatabaseModelsConfig, EdgeConfig, FleetConfig, HealthCheckConfig, LoggingConfig,
    ModelConfig, ModelUpstream, PoolKey, RecordConfig, RoutingConfig, ServerConfig, ShadowConfig,
    StrategiesConfig, StreamDeadlineOverrides, StreamDeadlines, TelemetryConfig,
    UpstreamClientConfig,
};

/// A config that could not be loaded. The message always names the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: cannot read config: {source}")]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    /// `${VAR}` named a variable that is not set and has no default.
    #[error(
        "{file}:{line}: environment variable {var} is not set (write ${{{var}:-}} to make it optional)"
    )]
    MissingVariable {
        file: PathBuf,
        line: usize,
        var: String,
    },
    /// The YAML is malformed or does not match the schema (unknown key, wrong type).
    #[error("{file}{location}: {path}{message}")]
    Parse {
        file: PathBuf,
        location: String,
        path: String,
        message: String,
    },
    /// The YAML parsed but a value is not acceptable. `location` is `:LINE` (the key's line) or
    /// empty when the value is not in the file (a default, an environment variable).
    #[error("{file}{location}: {path}: {message}")]
    Invalid {
        file: PathBuf,
        location: String,
        path: String,
        message: String,
    },
}

/// The group of upstreams and routes that declare none, and the group callers without any group
/// constraint may use.
pub const DEFAULT_GROUP: &str = "default";

impl Config {
    /// Reads and validates `path`, interpolating `${VAR}` from the process environment.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: path.to_owned(),
            source,
        })?;
        Self::from_yaml(path, &text, &|name| std::env::var(name).ok())
    }

    /// Parses `text` as if it were the file `path`; `env` looks up interpolated variables.
    pub fn from_yaml(
        path: &Path,
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let raw = validate::parse(path, text, env)?;
        let lines = KeyLines::new(text);
        validate::validate(path, raw, env, lines.clone()).map_err(|e| match e {
            ConfigError::Invalid {
                file,
                location,
                path,
                message,
            } if location.is_empty() => ConfigError::Invalid {
                file,
                location: lines
                    .line(&path)
                    .map(|l| format!(":{l}"))
                    .unwrap_or_default(),
                path,
                message,
            },
            e => e,
        })
    }

    /// `:LINE` of a key path in this config's file, or empty (see [`KeyLines::line`]).
    pub fn location_of(&self, key_path: &str) -> String {
        self.lines
            .line(key_path)
            .map(|l| format!(":{l}"))
            .unwrap_or_default()
    }

    /// Resolves a path written in the config relative to the config file's folder.
    pub fn resolve_path(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_owned()
        } else {
            self.source
                .parent()
                .unwrap_or_else(|| Path::new("."))
                .join(p)
        }
    }
}
