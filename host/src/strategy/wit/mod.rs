//! The WIT versions this host runs, behind one interface.
//!
//! Each supported version of `switchyard:router` has its own module with its own `bindgen!`, linker and
//! conversions between its records and the host's types ([`super::types`]). Everything else in the
//! host talks to a strategy through [`Pre`] and [`Guest`], enums over the versions, so an old component
//! keeps working when a new version ships: its answers are adapted to the newest types (0.1.0's
//! metadata hedge suffix becomes a typed hedge, fields it does not know are dropped on the way in).
//!
//! The version is read from the `switchyard-router-api` custom section the SDK stamps (see
//! `catalog::api_version`); a component without one is tried against the newest version first.

pub(super) mod v0_1;
pub(super) mod v0_2;

use wasmtime::component::{Component, HasSelf, Linker, ResourceAny, ResourceTable};
use wasmtime::{Engine, Store, StoreLimits};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::types::{Candidate, Decision, Observation, Request, StrategyInfo, UpstreamInfo};

/// Name of the custom section in which the SDK stamps the API version a strategy was built against.
pub const API_VERSION_SECTION: &str = "switchyard-router-api";

/// The API versions this host can run, oldest first.
pub const SUPPORTED_API_VERSIONS: &[&str] = &[ApiVersion::V0_1.as_str(), ApiVersion::V0_2.as_str()];

/// A version of the `switchyard:router` WIT package this host runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiVersion {
    /// `wit/since_v0.1.0`: hedges travel as a `;hedge=<ms>@<index>` suffix of the metadata.
    V0_1,
    /// `wit/since_v0.2.0`: typed hedge, in-flight counts, affinity pin, remaining budget.
    V0_2,
}

impl ApiVersion {
    /// Newest first: the order in which a component that does not say is tried.
    const NEWEST_FIRST: [ApiVersion; 2] = [ApiVersion::V0_2, ApiVersion::V0_1];

    pub const fn as_str(self) -> &'static str {
        match self {
            ApiVersion::V0_1 => "0.1.0",
            ApiVersion::V0_2 => "0.2.0",
        }
    }

    /// The version a stamped section names; `None` for one this host does not run.
    pub fn parse(stamp: &str) -> Option<ApiVersion> {
        Self::NEWEST_FIRST.into_iter().find(|v| v.as_str() == stamp)
    }
}

impl std::fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything one strategy instance's `Store` owns: WASI (no files, network or environment), the
/// resource table, the memory cap and a small buffer of the guest's stderr for error messages.
pub struct StoreState {
    pub(in crate::strategy) table: ResourceTable,
    pub(in crate::strategy) wasi: WasiCtx,
    pub(in crate::strategy) limits: StoreLimits,
    pub(in crate::strategy) stderr: MemoryOutputPipe,
    /// `name version` of the strategy, for the guest's log lines.
    pub(in crate::strategy) label: String,
    /// The budget of the call in progress, checked when the epoch deadline fires.
    pub(in crate::strategy) budget: super::engine::CallBudget,
}

impl WasiView for StoreState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// The `host.log` levels, the same in every version.
#[derive(Debug, Clone, Copy)]
enum Level {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

impl StoreState {
    /// `host.log`: one line in the host's log, tagged with the strategy.
    fn log(&self, level: Level, message: &str) {
        let strategy = self.label.as_str();
        match level {
            Level::Trace => tracing::trace!(target: "switchyard::strategy", strategy, "{message}"),
            Level::Debug => tracing::debug!(target: "switchyard::strategy", strategy, "{message}"),
            Level::Info => tracing::info!(target: "switchyard::strategy", strategy, "{message}"),
            Level::Warn => tracing::warn!(target: "switchyard::strategy", strategy, "{message}"),
            Level::Error => tracing::error!(target: "switchyard::strategy", strategy, "{message}"),
        }
    }
}

/// One linker per version (WASI plus that version's `host` interface).
#[derive(Clone)]
pub(super) struct Linkers {
    v0_1: Linker<StoreState>,
    v0_2: Linker<StoreState>,
}

impl Linkers {
    pub(super) fn new(engine: &Engine) -> wasmtime::Result<Self> {
        let wasi = || -> wasmtime::Result<Linker<StoreState>> {
            let mut linker = Linker::new(engine);
            wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
            Ok(linker)
        };
        let mut v0_1 = wasi()?;
        v0_1::StrategyComponent::add_to_linker::<_, HasSelf<_>>(&mut v0_1, |state| state)?;
        let mut v0_2 = wasi()?;
        v0_2::StrategyComponent::add_to_linker::<_, HasSelf<_>>(&mut v0_2, |state| state)?;
        Ok(Self { v0_1, v0_2 })
    }
}

/// A compiled strategy linked against the bindings of its version, ready to instantiate.
pub(super) enum Pre {
    V0_1(v0_1::StrategyComponentPre<StoreState>),
    V0_2(v0_2::StrategyComponentPre<StoreState>),
}

impl Pre {
    /// Links `component` as a strategy of `version`; the error says what does not fit.
    pub(super) fn new(
        linkers: &Linkers,
        component: &Component,
        version: ApiVersion,
    ) -> Result<Pre, String> {
        let world = |e: wasmtime::Error, what: &str| {
            format!("does not fit the switchyard:router@{version} world ({what}): {e:?}")
        };
        let linker = match version {
            ApiVersion::V0_1 => &linkers.v0_1,
            ApiVersion::V0_2 => &linkers.v0_2,
        };
        let instance_pre = linker
            .instantiate_pre(component)
            .map_err(|e| world(e, "imports"))?;
        let exports = |e| world(e, "the strategy interface is not exported");
        Ok(match version {
            ApiVersion::V0_1 => {
                Pre::V0_1(v0_1::StrategyComponentPre::new(instance_pre).map_err(exports)?)
            }
            ApiVersion::V0_2 => {
                Pre::V0_2(v0_2::StrategyComponentPre::new(instance_pre).map_err(exports)?)
            }
        })
    }

    /// For a component that does not stamp its version: the newest version it fits.
    pub(super) fn detect(linkers: &Linkers, component: &Component) -> Result<Pre, String> {
        let mut problems = Vec::new();
        for version in ApiVersion::NEWEST_FIRST {
            match Pre::new(linkers, component, version) {
                Ok(pre) => return Ok(pre),
                Err(e) => problems.push(e),
            }
        }
        Err(problems.join("; "))
    }

    pub(super) fn version(&self) -> ApiVersion {
        match self {
            Pre::V0_1(_) => ApiVersion::V0_1,
            Pre::V0_2(_) => ApiVersion::V0_2,
        }
    }

    pub(super) async fn instantiate(
        &self,
        store: &mut Store<StoreState>,
    ) -> wasmtime::Result<Guest> {
        Ok(match self {
            Pre::V0_1(pre) => Guest::V0_1(v0_1::Live::new(pre.instantiate_async(store).await?)),
            Pre::V0_2(pre) => {
                let bindings = pre.instantiate_async(&mut *store).await?;
                Guest::V0_2(v0_2::Live::new(store, bindings)?)
            }
        })
    }
}

/// One call into a router instance, in host types.
#[derive(Clone, Copy)]
pub(super) enum Call<'a> {
    Upstreams(&'a [UpstreamInfo]),
    Select(&'a Request, &'a [Candidate]),
    Observe(&'a Observation),
    Status,
    Tick(u64),
}

impl Call<'_> {
    /// The WIT name of the call, for errors.
    pub(super) fn name(&self, version: ApiVersion) -> &'static str {
        match self {
            Call::Upstreams(_) if version == ApiVersion::V0_1 => "refresh-route-table",
            Call::Upstreams(_) => "refresh-upstreams",
            Call::Select(..) => "select",
            Call::Observe(_) => "observe",
            Call::Status => "status",
            Call::Tick(_) => "tick",
        }
    }
}

/// What a [`Call`] returned, in host types.
pub(super) enum Reply {
    Done,
    Decision(Result<Decision, String>),
    Status(String),
}

/// A live instance of a strategy component, whatever its version.
pub(super) enum Guest {
    V0_1(v0_1::Live),
    V0_2(v0_2::Live),
}

impl Guest {
    pub(super) fn version(&self) -> ApiVersion {
        match self {
            Guest::V0_1(_) => ApiVersion::V0_1,
            Guest::V0_2(_) => ApiVersion::V0_2,
        }
    }

    pub(super) async fn info(
        &self,
        store: &mut Store<StoreState>,
    ) -> wasmtime::Result<StrategyInfo> {
        match self {
            Guest::V0_1(live) => live.info(store).await,
            Guest::V0_2(live) => live.info(store).await,
        }
    }

    pub(super) async fn params_schema(
        &self,
        store: &mut Store<StoreState>,
    ) -> wasmtime::Result<String> {
        match self {
            Guest::V0_1(live) => live.params_schema(store).await,
            Guest::V0_2(live) => live.params_schema(store).await,
        }
    }

    pub(super) async fn create(
        &self,
        store: &mut Store<StoreState>,
        model_id: &str,
        params_json: &str,
    ) -> wasmtime::Result<Result<ResourceAny, String>> {
        match self {
            Guest::V0_1(live) => live.create(store, model_id, params_json).await,
            Guest::V0_2(live) => live.create(store, model_id, params_json).await,
        }
    }

    /// Runs one call on the router resource `router`.
    pub(super) async fn call(
        &mut self,
        store: &mut Store<StoreState>,
        router: ResourceAny,
        call: Call<'_>,
    ) -> wasmtime::Result<Reply> {
        match self {
            Guest::V0_1(live) => live.call(store, router, call).await,
            Guest::V0_2(live) => live.call(store, router, call).await,
        }
    }
}

/// The `;hedge=<ms>@<index>` suffix 0.1.0 strategies (RouteWise before 0.2.0) put in their metadata
/// to ask for a hedge. The metadata itself is left as it is: the strategy parses its own tags back.
pub(super) fn legacy_hedge(metadata: &str) -> Option<super::types::HedgeRequest> {
    let spec = metadata.split(';').find_map(|p| p.strip_prefix("hedge="))?;
    let (ms, index) = spec.split_once('@')?;
    let after_ms: u64 = ms.parse().ok()?;
    Some(super::types::HedgeRequest {
        after_ms: u32::try_from(after_ms).unwrap_or(u32::MAX),
        backup: index.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::super::types::HedgeRequest;
    use super::*;

    #[test]
    fn the_legacy_hedge_suffix_becomes_a_typed_hedge() {
        assert_eq!(
            legacy_hedge("rw1:1f2e3d4c-42:2:3.5e-4:c;hedge=2475@1"),
            Some(HedgeRequest {
                after_ms: 2475,
                backup: 1
            })
        );
        assert_eq!(
            legacy_hedge("hedge=10@3"),
            Some(HedgeRequest {
                after_ms: 10,
                backup: 3
            })
        );
        for none in [
            "",
            "rw1:1f2e3d4c-42:2:3.5e-4:c",
            ";hedge=x@1",
            ";hedge=10@",
            ";hedge=10",
        ] {
            assert_eq!(legacy_hedge(none), None, "{none}");
        }
    }

    #[test]
    fn versions_parse_from_their_stamps() {
        assert_eq!(ApiVersion::parse("0.1.0"), Some(ApiVersion::V0_1));
        assert_eq!(ApiVersion::parse("0.2.0"), Some(ApiVersion::V0_2));
        assert_eq!(ApiVersion::parse("0.3.0"), None);
        assert_eq!(SUPPORTED_API_VERSIONS, ["0.1.0", "0.2.0"]);
    }
}
