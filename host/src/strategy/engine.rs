//! The one wasmtime `Engine` of the process, its epoch ticker, and how a strategy `Store` is made.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use wasmtime::component::ResourceTable;
use wasmtime::{Engine, Store, StoreLimitsBuilder};
use wasmtime_wasi::WasiCtx;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;

use super::StrategyError;
use super::wit::{Linkers, StoreState};

/// One epoch tick; deadlines are counted in these.
const EPOCH_TICK: Duration = Duration::from_millis(1);

/// How often the ticker looks while guest code is entered but none was running at its last look.
/// A `select` runs for microseconds, so under load nearly every look finds no guest running: a
/// tick every millisecond was a thousand wake-ups of the ticker thread a second (0.6 µs of CPU a
/// `routewise` request at 22,000 requests a second, `bench/ab.py --threads`). A guest found
/// running is then ticked every [`EPOCH_TICK`] until a look finds none, so a call that runs
/// away reaches its deadline at most one look later than with ticks every millisecond.
const WATCH_TICK: Duration = Duration::from_millis(5);

/// Looks without any guest entry before the ticker parks (20 ms).
const PARK_AFTER_IDLE_LOOKS: u32 = 4;

/// How often a parked ticker still ticks: a guest entry that did not say it was running (see
/// [`StrategyEngine::guest_running`]) is still stopped, a hundred times later than its deadline,
/// and a dropped engine is noticed.
const PARKED_TICK: Duration = Duration::from_millis(100);

/// How long `create` and `refresh-route-table` may run: they run at startup or on route changes, off
/// the request path, and may build tables.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(1);

/// Bytes of guest stderr kept per instance (a panic message fits; a chatty guest is cut off).
const STDERR_CAPTURE_BYTES: usize = 8 * 1024;

/// What one call may spend. The deadline is CPU time, not wall time: on a saturated machine a
/// thread can be descheduled for longer than a strategy's whole deadline, and killing the instance
/// for that would reset its state for nothing.
///
/// The epoch deadline fires after `cpu_budget` of wall time (the fast path pays nothing more); the
/// callback then reads the thread's CPU clock and lets the guest go on, tick by tick, until it has
/// used `cpu_budget` of CPU since that first check. A guest that really computes is stopped after
/// at most twice its budget; one merely preempted runs to completion. A wall-clock backstop stops
/// everything at `backstop_ticks`.
#[derive(Debug, Clone, Copy, Default)]
pub struct CallBudget {
    pub(super) cpu_budget: Duration,
    pub(super) backstop_ticks: u64,
    pub(super) extended_ticks: u64,
    /// The thread's CPU clock at the first deadline check.
    pub(super) cpu_mark: Option<Duration>,
}

/// The error a call ends with when its budget is spent.
#[derive(Debug, thiserror::Error)]
#[error("deadline elapsed")]
pub(super) struct DeadlineElapsed;

/// Wall-clock multiple of the deadline after which a call is stopped whatever its CPU use.
const BACKSTOP_FACTOR: u32 = 20;

/// `strategies.max_call_timeout_ms` when unset: a strategy may ask for ten times the default.
pub const DEFAULT_MAX_CALL_TIMEOUT: Duration = Duration::from_millis(50);

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

/// The process-wide wasm runtime: engine, one linker with the host imports per WIT version, and
/// limits.
#[derive(Clone)]
pub struct StrategyEngine {
    pub(super) engine: Engine,
    pub(super) linkers: Linkers,
    pub(super) limits: StrategyLimits,
    /// The longest call deadline a strategy may declare or a model may set.
    max_call_timeout: Duration,
    /// Whether the epoch ticker is needed: guest code running, or run lately.
    demand: Arc<TickDemand>,
    /// Whether the engine has a compiled-code cache (a folder it could use).
    caches_compiled_code: bool,
}

/// The wasmtime engine strategies are compiled with (component model, epoch interruption, the
/// compiled-code cache when a cache folder can be used), and whether it caches. A child process
/// that compiles into the cache (`compile_child`) builds the same one, so that what it writes is
/// what the gateway looks up.
pub(super) fn compiling_engine() -> Result<(Engine, bool), StrategyError> {
    let mut config = wasmtime::Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    // Strategies are synchronous; skipping the async-task bookkeeping roughly halves call overhead.
    config.concurrency_support(false);
    if let Some(profiler) = profiler_from_env()? {
        config.profiler(profiler);
    }
    let mut caches = false;
    if let Some(dir) = cache_dir() {
        let mut cache_config = wasmtime::CacheConfig::new();
        cache_config.with_directory(dir);
        match wasmtime::Cache::new(cache_config) {
            Ok(cache) => {
                config.cache(Some(cache));
                caches = true;
            }
            Err(e) => tracing::warn!("compiled-strategy cache disabled: {e}"),
        }
    }
    let engine = Engine::new(&config).map_err(|e| StrategyError::Engine(format!("{e:?}")))?;
    Ok((engine, caches))
}

impl StrategyEngine {
    /// Builds the engine ([`compiling_engine`]) and starts the epoch ticker thread.
    pub fn new(limits: StrategyLimits) -> Result<Self, StrategyError> {
        let (engine, caches_compiled_code) = compiling_engine()?;

        let linkers = Linkers::new(&engine).map_err(|e| StrategyError::Engine(format!("{e:?}")))?;

        let demand = Arc::new(TickDemand::default());
        spawn_epoch_ticker(&engine, demand.clone());
        Ok(Self {
            engine,
            linkers,
            limits,
            max_call_timeout: limits.call_timeout.max(DEFAULT_MAX_CALL_TIMEOUT),
            demand,
            caches_compiled_code,
        })
    }

    /// Whether compiled strategies go to (and come from) the compiled-code cache.
    pub fn caches_compiled_code(&self) -> bool {
        self.caches_compiled_code
    }

    /// Whether the epoch ticker is parked: no guest code has run for a while.
    pub fn epoch_ticker_parked(&self) -> bool {
        self.demand.parked.load(Ordering::SeqCst)
    }

    /// Says guest code may run until the guard is dropped: the epoch ticker, which the deadlines
    /// count on, ticks every millisecond while a guest is found running (see [`WATCH_TICK`]),
    /// and parks only once no entry has begun for a while. Held across every entry into a guest
    /// (instantiation, every call).
    pub(super) fn guest_running(&self) -> GuestRunning<'_> {
        self.demand.enter()
    }

    pub fn limits(&self) -> StrategyLimits {
        self.limits
    }

    /// The longest deadline a strategy may declare or a model may set.
    pub fn max_call_timeout(&self) -> Duration {
        self.max_call_timeout
    }

    /// Sets the longest deadline a strategy may declare (`strategies.max_call_timeout_ms`).
    pub fn set_max_call_timeout(&mut self, max: Duration) {
        self.max_call_timeout = max.max(self.limits.call_timeout);
    }

    /// The deadline of a model's calls into `strategy`: the model's `router_deadline_ms`, else
    /// what the strategy declares (custom section `switchyard-router-deadline-ms`), else
    /// `strategies.call_timeout_ms`; never above the host's maximum.
    pub fn deadline_for(
        &self,
        model: Option<Duration>,
        strategy: &super::LoadedStrategy,
    ) -> Duration {
        model
            .or(strategy.declared_deadline)
            .unwrap_or(self.limits.call_timeout)
            .min(self.max_call_timeout)
    }

    /// The same engine (its compiled code and linkers shared) whose calls get `call_timeout`.
    pub fn with_call_timeout(&self, call_timeout: Duration) -> Self {
        let mut engine = self.clone();
        engine.limits.call_timeout = call_timeout;
        engine
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
                budget: CallBudget::default(),
            },
        );
        store.limiter(|state| &mut state.limits);
        store.epoch_deadline_callback(|mut ctx| {
            let budget = &mut ctx.data_mut().budget;
            budget.extended_ticks += 1;
            if budget.extended_ticks > budget.backstop_ticks {
                return Err(wasmtime::Error::new(DeadlineElapsed));
            }
            match budget.cpu_mark {
                None => match cpu_time::ThreadTime::try_now() {
                    Ok(mark) => budget.cpu_mark = Some(mark.as_duration()),
                    // Without a CPU clock the wall-clock deadline is all there is.
                    Err(_) => return Err(wasmtime::Error::new(DeadlineElapsed)),
                },
                Some(mark) => {
                    let used = cpu_time::ThreadTime::try_now()
                        .map(|now| now.as_duration().saturating_sub(mark));
                    if used.map_or(true, |used| used >= budget.cpu_budget) {
                        return Err(wasmtime::Error::new(DeadlineElapsed));
                    }
                }
            }
            Ok(wasmtime::UpdateDeadline::Continue(1))
        });
        arm(&mut store, SETUP_TIMEOUT);
        store
    }
}

/// Arms the budget of the next call: `deadline` of CPU time, 20× that of wall time.
pub(super) fn arm(store: &mut Store<StoreState>, deadline: Duration) {
    let first = ticks(deadline);
    store.data_mut().budget = CallBudget {
        cpu_budget: deadline,
        backstop_ticks: first.saturating_mul(u64::from(BACKSTOP_FACTOR)),
        extended_ticks: 0,
        cpu_mark: None,
    };
    store.set_epoch_deadline(first);
}

/// The wall-clock limit of a call, for host-side waits that epochs cannot interrupt.
pub(super) fn wall_backstop(deadline: Duration) -> Duration {
    deadline * BACKSTOP_FACTOR + EPOCH_TICK * 2
}

fn ticks(deadline: Duration) -> u64 {
    (deadline.as_micros().div_ceil(EPOCH_TICK.as_micros()) as u64).max(1)
}

/// What the epoch ticker needs to know: whether guest code is running or ran lately. Ticking
/// every millisecond cost an idle gateway 2.5 % of a core (a thousand wake-ups a second); the
/// ticker now parks after [`PARK_AFTER_IDLE_LOOKS`] looks without guest code, and the next guest
/// entry wakes it. Under load it never parks, so an entry costs one atomic add and one load.
#[derive(Default)]
struct TickDemand {
    /// Low 32 bits: guest entries running now. High 32 bits: entries begun, wrapping.
    entries: AtomicU64,
    /// The ticker is parked, or about to park.
    parked: AtomicBool,
    /// The ticker found a guest running at its last look and ticks every millisecond.
    close: AtomicBool,
    /// Times the ticker has parked.
    parks: AtomicU64,
    /// The ticker thread, to unpark it.
    ticker: OnceLock<std::thread::Thread>,
}

/// One guest entry running, in [`TickDemand::entries`].
const RUNNING: u64 = 1;
/// One guest entry begun, in [`TickDemand::entries`].
const BEGUN: u64 = 1 << 32;

impl TickDemand {
    fn enter(&self) -> GuestRunning<'_> {
        // SeqCst on both sides: either the ticker, having set `parked`, sees this entry and stays
        // up, or this load sees `parked` and wakes it (an unpark before its park is kept).
        self.entries.fetch_add(RUNNING + BEGUN, Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst)
            && let Some(ticker) = self.ticker.get()
        {
            ticker.unpark();
        }
        GuestRunning(self)
    }

    fn running(entries: u64) -> bool {
        entries & (BEGUN - 1) != 0
    }
}

/// Guest code may be running while this lives (see [`StrategyEngine::guest_running`]).
pub(super) struct GuestRunning<'a>(&'a TickDemand);

impl Drop for GuestRunning<'_> {
    fn drop(&mut self) {
        self.0.entries.fetch_sub(RUNNING, Ordering::SeqCst);
    }
}

/// The ticker holds only a weak handle, so dropping the last engine ends the thread.
fn spawn_epoch_ticker(engine: &Engine, demand: Arc<TickDemand>) {
    let weak = engine.weak();
    let tick = move || match weak.upgrade() {
        Some(engine) => {
            engine.increment_epoch();
            true
        }
        None => false,
    };
    let spawned = std::thread::Builder::new()
        .name("switchyard-epoch".into())
        .spawn(move || {
            let _ = demand.ticker.set(std::thread::current());
            let mut seen = demand.entries.load(Ordering::SeqCst);
            let mut idle_looks = 0;
            // A guest was running at the last look: tick every millisecond.
            let mut close = TickDemand::running(seen);
            loop {
                std::thread::sleep(if close { EPOCH_TICK } else { WATCH_TICK });
                if !tick() {
                    return;
                }
                let now = demand.entries.load(Ordering::SeqCst);
                close = TickDemand::running(now);
                demand.close.store(close, Ordering::Relaxed);
                if now != seen || close {
                    seen = now;
                    idle_looks = 0;
                    continue;
                }
                idle_looks += 1;
                if idle_looks < PARK_AFTER_IDLE_LOOKS {
                    continue;
                }
                demand.parks.fetch_add(1, Ordering::Relaxed);
                demand.parked.store(true, Ordering::SeqCst);
                while demand.entries.load(Ordering::SeqCst) == seen {
                    std::thread::park_timeout(PARKED_TICK);
                    if !tick() {
                        return;
                    }
                }
                demand.parked.store(false, Ordering::SeqCst);
                idle_looks = 0;
                // An entry woke it: the guest may be running now.
                close = true;
            }
        });
    if let Err(e) = spawned {
        // Without the ticker no deadline fires; that is worth failing loudly about in the logs.
        tracing::error!("cannot start the strategy epoch ticker, deadlines are disabled: {e}");
    }
}

/// `$SWITCHYARD_CACHE_DIR`, else `$XDG_CACHE_HOME/switchyard`, else `~/.cache/switchyard`.
/// `SWITCHYARD_WASM_PROFILER=perfmap` names compiled strategy code in `/tmp/perf-<pid>.map`: what
/// `perf report` reads, and what turns callgrind's `???:0x…` entries into guest functions. Unset
/// or `none`: nothing (the default; each compiled function is written out once, at load).
/// wasmtime's `jitdump` needs its `profiling` feature, which this build leaves out.
fn profiler_from_env() -> Result<Option<wasmtime::ProfilingStrategy>, StrategyError> {
    profiler(std::env::var_os("SWITCHYARD_WASM_PROFILER").as_deref())
}

fn profiler(
    value: Option<&std::ffi::OsStr>,
) -> Result<Option<wasmtime::ProfilingStrategy>, StrategyError> {
    let Some(value) = value else {
        return Ok(None);
    };
    match value.to_str() {
        Some("" | "none") => Ok(None),
        Some("perfmap") => Ok(Some(wasmtime::ProfilingStrategy::PerfMap)),
        _ => Err(StrategyError::Engine(format!(
            "SWITCHYARD_WASM_PROFILER={}: expected perfmap or none",
            value.to_string_lossy()
        ))),
    }
}

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

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn the_profiler_knob_takes_perfmap_or_none_and_names_itself_otherwise() {
        use std::ffi::OsStr;
        assert!(matches!(profiler(None), Ok(None)));
        assert!(matches!(profiler(Some(OsStr::new("none"))), Ok(None)));
        assert!(matches!(profiler(Some(OsStr::new(""))), Ok(None)));
        assert!(matches!(
            profiler(Some(OsStr::new("perfmap"))),
            Ok(Some(wasmtime::ProfilingStrategy::PerfMap))
        ));
        for wrong in ["jitdump", "PerfMap", "vtune"] {
            let err = profiler(Some(OsStr::new(wrong)))
                .expect_err(wrong)
                .to_string();
            assert!(
                err.contains(&format!("SWITCHYARD_WASM_PROFILER={wrong}"))
                    && err.contains("perfmap"),
                "{err}"
            );
        }
    }

    /// Waits up to 30 s (a loaded machine) for the ticker to be parked or not.
    fn wait_parked(engine: &StrategyEngine, parked: bool) {
        let until = Instant::now() + Duration::from_secs(30);
        while engine.epoch_ticker_parked() != parked {
            assert!(
                Instant::now() < until,
                "the ticker never became parked={parked}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits up to 30 s for the ticker to tick every millisecond or not, doing `meanwhile` between
    /// looks.
    fn wait_close(engine: &StrategyEngine, close: bool, mut meanwhile: impl FnMut()) {
        let until = Instant::now() + Duration::from_secs(30);
        while engine.demand.close.load(Ordering::Relaxed) != close {
            assert!(
                Instant::now() < until,
                "the ticker never became close={close}"
            );
            meanwhile();
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    #[test]
    fn the_ticker_ticks_every_millisecond_only_while_it_finds_a_guest_running() {
        let engine = StrategyEngine::new(StrategyLimits::default()).unwrap();
        let running = engine.guest_running();
        wait_close(&engine, true, || {});
        // Still running a while later: still ticking closely, and never parked.
        std::thread::sleep(WATCH_TICK * 4);
        assert!(engine.demand.close.load(Ordering::Relaxed));
        assert!(!engine.epoch_ticker_parked());
        drop(running);
        // Brief entries, as under load: the ticker watches without parking.
        wait_close(&engine, false, || drop(engine.guest_running()));
        assert!(!engine.epoch_ticker_parked());
    }

    #[test]
    fn the_ticker_parks_when_no_guest_runs_and_a_guest_entry_wakes_it() {
        let engine = StrategyEngine::new(StrategyLimits::default()).unwrap();
        wait_parked(&engine, true);
        let running = engine.guest_running();
        wait_parked(&engine, false);
        // It never parks while guest code may run, however long that is.
        std::thread::sleep(PARKED_TICK * 3);
        assert!(!engine.epoch_ticker_parked());
        drop(running);
        wait_parked(&engine, true);
        // An entry that begins and ends while it is parked is noticed (it counts as begun, not
        // only as running): the ticker ticks again, then parks again. Watching `parked` turn
        // false instead could miss its 20 ms up on a loaded machine.
        let parks = engine.demand.parks.load(Ordering::Relaxed);
        drop(engine.guest_running());
        let until = Instant::now() + Duration::from_secs(30);
        while engine.demand.parks.load(Ordering::Relaxed) == parks {
            assert!(
                Instant::now() < until,
                "a brief entry did not wake the ticker"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
