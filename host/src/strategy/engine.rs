//! The one wasmtime `Engine` of the process, its epoch ticker, and how a strategy `Store` is made.

use std::path::PathBuf;
use std::time::Duration;

use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime::{Engine, Store, StoreLimitsBuilder};
use wasmtime_wasi::WasiCtx;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;

use super::StrategyError;
use super::bindings::{StoreState, StrategyComponent};

/// One epoch tick; deadlines are counted in these.
const EPOCH_TICK: Duration = Duration::from_millis(1);

/// How long `create` and `refresh-route-table` may run: they run at startup or on route changes, off
/// the request path, and may build tables.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(1);

/// Bytes of guest stderr kept per instance (a panic message fits; a chatty guest is cut off).
const STDERR_CAPTURE_BYTES: usize = 8 * 1024;

/// Limits applied to every call into a strategy.
#[derive(Debug, Clone, Copy)]
pub struct StrategyLimits {
    /// Deadline of one `select`/`observe`/`status`/`tick` call.
    pub call_timeout: Duration,
    /// Cap on one instance's linear memory.
    pub memory_limit_bytes: usize,
}

impl Default for StrategyLimits {
    fn default() -> Self {
        Self {
            call_timeout: Duration::from_millis(5),
            memory_limit_bytes: 64 << 20,
        }
    }
}

/// The process-wide wasm runtime: engine, linker with the host imports, and limits.
#[derive(Clone)]
pub struct StrategyEngine {
    pub(super) engine: Engine,
    pub(super) linker: Linker<StoreState>,
    pub(super) limits: StrategyLimits,
}

impl StrategyEngine {
    /// Builds the engine (component model, epoch interruption, compiled-code cache when a cache folder
    /// can be used) and starts the epoch ticker thread.
    pub fn new(limits: StrategyLimits) -> Result<Self, StrategyError> {
        let mut config = wasmtime::Config::new();
        config.wasm_component_model(true);
        config.epoch_interruption(true);
        // Strategies are synchronous; skipping the async-task bookkeeping roughly halves call overhead.
        config.concurrency_support(false);
        if let Some(dir) = cache_dir() {
            let mut cache_config = wasmtime::CacheConfig::new();
            cache_config.with_directory(dir);
            match wasmtime::Cache::new(cache_config) {
                Ok(cache) => {
                    config.cache(Some(cache));
                }
                Err(e) => tracing::warn!("compiled-strategy cache disabled: {e}"),
            }
        }
        let engine = Engine::new(&config).map_err(|e| StrategyError::Engine(format!("{e:?}")))?;

        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| StrategyError::Engine(format!("{e:?}")))?;
        StrategyComponent::add_to_linker::<_, HasSelf<_>>(&mut linker, |state| state)
            .map_err(|e| StrategyError::Engine(format!("{e:?}")))?;

        spawn_epoch_ticker(&engine);
        Ok(Self {
            engine,
            linker,
            limits,
        })
    }

    pub fn limits(&self) -> StrategyLimits {
        self.limits
    }

    /// A fresh store for one instance of the strategy labelled `label`.
    pub(super) fn new_store(&self, label: &str) -> Store<StoreState> {
        let stderr = MemoryOutputPipe::new(STDERR_CAPTURE_BYTES);
        // No preopens, no environment, no arguments, no sockets: a strategy only computes.
        let wasi = WasiCtx::builder()
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        let limits = StoreLimitsBuilder::new()
            .memory_size(self.limits.memory_limit_bytes)
            .trap_on_grow_failure(true)
            .instances(16)
            .tables(16)
            .memories(4)
            .build();
        let mut store = Store::new(
            &self.engine,
            StoreState {
                table: ResourceTable::new(),
                wasi,
                limits,
                stderr,
                label: label.to_owned(),
            },
        );
        store.limiter(|state| &mut state.limits);
        store.set_epoch_deadline(ticks(SETUP_TIMEOUT));
        store
    }

    /// Epoch ticks for a deadline.
    pub(super) fn ticks(&self, deadline: Duration) -> u64 {
        ticks(deadline)
    }
}

fn ticks(deadline: Duration) -> u64 {
    (deadline.as_micros().div_ceil(EPOCH_TICK.as_micros()) as u64).max(1)
}

/// The ticker holds only a weak handle, so dropping the last engine ends the thread.
fn spawn_epoch_ticker(engine: &Engine) {
    let weak = engine.weak();
    let spawned = std::thread::Builder::new()
        .name("switchyard-epoch".into())
        .spawn(move || {
            loop {
                std::thread::sleep(EPOCH_TICK);
                match weak.upgrade() {
                    Some(engine) => engine.increment_epoch(),
                    None => break,
                }
            }
        });
    if let Err(e) = spawned {
        // Without the ticker no deadline fires; that is worth failing loudly about in the logs.
        tracing::error!("cannot start the strategy epoch ticker, deadlines are disabled: {e}");
    }
}

/// `$SWITCHYARD_CACHE_DIR`, else `$XDG_CACHE_HOME/switchyard`, else `~/.cache/switchyard`.
fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("SWITCHYARD_CACHE_DIR") {
        if dir.is_empty() {
            return None;
        }
        return Some(PathBuf::from(dir));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("switchyard").join("wasmtime"))
}
