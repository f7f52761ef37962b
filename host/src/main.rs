//! The `switchyard` binary: CLI parsing and process setup. Errors become `anyhow` only here.
#![forbid(unsafe_code)]
// This is the CLI: printing results to stdout is its job.
#![allow(clippy::print_stdout)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};

use switchyard::config::{Config, LogFormat};
use switchyard::gateway::{DirLoad, Gateway, Routing, builtin_strategies_dir};
use switchyard::mock::{self, MockOptions};
use switchyard::routewise::quota;
use switchyard::store::Store;
use switchyard::strategy::{
    CatalogEntry, StrategyCatalog, StrategyEngine, StrategyLimits, catalog, compile_child,
    contract, offline, replay,
};
use switchyard::telemetry;

mod scaffold;

/// glibc's allocator was ~16 % of the gateway's CPU under load (malloc, free and
/// `malloc_consolidate` at the top of the profile): each request parses and builds JSON and HTTP
/// messages. mimalloc's thread-local free lists cost a fraction of that.
#[global_allocator]
static ALLOCATOR: switchyard_allocator::GlobalAllocator = switchyard_allocator::GlobalAllocator;

#[derive(Parser)]
#[command(
    name = "switchyard",
    version,
    about = "LLM inference gateway with WebAssembly routing strategies"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args)]
struct ConfigArg {
    /// The config file.
    #[arg(
        short,
        long,
        env = "SWITCHYARD_CONFIG",
        default_value = "config/switchyard.yaml"
    )]
    config: PathBuf,
}

/// See `serve --runtime`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum RuntimeShape {
    PerCore,
    Shared,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the gateway.
    Serve {
        #[command(flatten)]
        config: ConfigArg,
        /// Listen address, overriding `server.listen` (port 0 picks a free port).
        #[arg(long)]
        listen: Option<String>,
        /// Threads that serve requests; when unset, one per CPU core but one (at least one): the
        /// request log's writer, about a fifth of a request's work, and the background tasks run
        /// on threads of their own, and with a serving thread on every core they were preempted
        /// by and preempted the serving threads. On 2-core machines one serving thread spent
        /// 3-35 % less CPU per request than two in every benchmark run (rounds ten to thirteen of
        /// docs/performance.md) and served about as many requests or more; a dedicated 2-core
        /// machine run at saturation may still want `--worker-threads 2`.
        #[arg(long, env = "SWITCHYARD_WORKER_THREADS", value_parser = clap::value_parser!(u16).range(1..))]
        worker_threads: Option<u16>,
        /// How the serving threads share work. `per-core` (the default): each thread runs its own
        /// single-threaded runtime and accepts on its own socket (`SO_REUSEPORT`), so a
        /// connection's requests, its upstream connections and its strategy calls never hop
        /// between threads. `shared`: one work-stealing runtime for every connection, which can
        /// move work off a descheduled thread. Measured on a 2-core machine shared with the load
        /// generator (bench/runtime_shape.py, medians of 4 alternating rounds): per-core spent
        /// 12 % less CPU per request with one thread and 4 % less with two, and served 11 % more
        /// requests with one and 10 % fewer with two (a thread cannot take another's
        /// connections); see docs/performance.md.
        #[arg(long, env = "SWITCHYARD_RUNTIME", value_enum, default_value_t = RuntimeShape::PerCore)]
        runtime: RuntimeShape,
    },
    /// Validate the config and strategies; print each model's router and routes.
    Check {
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Apply database migrations and exit.
    Migrate {
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Inspect and test strategy components.
    Strategies {
        #[command(subcommand)]
        command: StrategiesCommand,
    },
    /// Compile strategy files into the compiled-code cache and exit: what `serve` runs in a child
    /// process so that the compiler's memory leaves with it (`strategy::compile_child`).
    #[command(name = compile_child::SUBCOMMAND, hide = true)]
    CompileStrategies { files: Vec<PathBuf> },
    /// Run a simulated upstream speaking OpenAI Chat Completions, OpenAI Responses and Anthropic
    /// Messages (and embeddings).
    MockUpstream {
        /// Port to listen on; 0 picks a free one (printed on the first line).
        #[arg(long, default_value_t = 9001)]
        port: u16,
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// Milliseconds before the first token.
        #[arg(long, default_value_t = 0)]
        ttft_ms: u64,
        /// Token rate of the answer; 0 sends as fast as possible.
        #[arg(long, default_value_t = 0.0)]
        tokens_per_s: f64,
        /// Send the first token at --ttft-ms, then pace the rest by --tokens-per-s (a stream that
        /// starts and then idles).
        #[arg(long)]
        first_token_at_once: bool,
        /// Fraction of requests answered with HTTP 500.
        #[arg(long, default_value_t = 0.0)]
        fail_rate: f64,
        /// Model name the upstream reports.
        #[arg(long, default_value = "sim")]
        model: String,
        /// Tokens per answer (capped by the request's max_tokens).
        #[arg(long, default_value_t = 16)]
        completion_tokens: u32,
        /// Serve only this chat protocol (openai, openai_responses, anthropic); the other chat
        /// endpoints answer 404. All three by default.
        #[arg(long)]
        protocol: Option<switchyard::protocol::Dialect>,
        /// Answer with a tool call (get_weather {"city":"Paris"}) when the request offers tools.
        #[arg(long)]
        tool_call: bool,
    },
}

#[derive(Subcommand)]
enum StrategiesCommand {
    /// List every strategy the config can use, loaded or missing.
    List {
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Print a strategy's `router_params` JSON Schema.
    Schema {
        name: String,
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Run the router contract suite against a strategy component.
    Test {
        file: PathBuf,
        /// Router params as JSON (default `{}`).
        #[arg(long, default_value = "{}")]
        params: String,
    },
    /// Scaffold a strategy project: source, build script and a unit test, which builds and passes
    /// `strategies test` as written.
    New {
        /// The strategy's name (lowercase letters, digits and `_`): its crate, module and file.
        name: String,
        #[arg(long, value_enum)]
        lang: scaffold::Lang,
        /// The project folder to create (default `./NAME`); must not exist or be empty.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// The `sdk/` folder of a Switchyard checkout (default: the one this binary was built
        /// from).
        #[arg(long)]
        sdk: Option<PathBuf>,
    },
    /// Run one decision offline and print its order, endpoints, metadata and the strategy's
    /// status as JSON (see docs/routewise.md, "Offline decisions").
    Run {
        /// A strategy name from the catalog, or the path of a `.wasm` component.
        name: String,
        /// Router params: a JSON file, or inline JSON (default `{}`).
        #[arg(long)]
        params: Option<String>,
        /// The decision: route table, request facts, candidates, observations to replay.
        #[arg(long)]
        input: PathBuf,
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Re-run recorded decisions (`strategies.record`) through a strategy and report, per model,
    /// how often its primary and its order agree with what was served, as JSON.
    Replay {
        /// A strategy name from the catalog, or the path of a `.wasm` component.
        #[arg(long)]
        strategy: String,
        /// Router params: a JSON file, or inline JSON (default: the recorded params when the
        /// strategy is the one that decided, else `{}`).
        #[arg(long)]
        params: Option<String>,
        /// Record files, read in the order given (rotated files are older: `d.jsonl.1` before
        /// `d.jsonl`).
        #[arg(long, required = true, num_args = 1..)]
        from: Vec<PathBuf>,
        /// Only this model's records.
        #[arg(long)]
        model: Option<String>,
        /// Disagreements shown per model.
        #[arg(long, default_value_t = 5)]
        examples: usize,
        #[command(flatten)]
        config: ConfigArg,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // `serve` logs as its config says (`logging:`); everything else logs text at `info`.
    let served_config = match &cli.command {
        Command::Serve { config, .. } => Some(load_config(&config.config)?),
        _ => None,
    };
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    let mut serving_threads = None;
    if let Command::Serve {
        worker_threads,
        runtime: shape,
        ..
    } = &cli.command
    {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        match shape {
            // Requests run on the serving threads; this runtime keeps the background work
            // (health checks, the request log's writer, the fleet), which needs one thread.
            RuntimeShape::PerCore => {
                runtime.worker_threads(1);
                serving_threads = Some(
                    worker_threads.map_or_else(|| default_serving_threads(cores), usize::from),
                );
            }
            // One runtime for everything, background work included: every core.
            RuntimeShape::Shared => {
                runtime.worker_threads(worker_threads.map_or(cores, usize::from));
            }
        }
    }
    let runtime = runtime.build().context("starting the async runtime")?;
    if let (Command::Serve { .. }, Ok(program)) = (&cli.command, std::env::current_exe()) {
        compile_child::enable(program);
    }
    // Traces are exported by tasks on this runtime, and the OpenTelemetry layer is part of the
    // log subscriber: both come after the runtime, before anything logs.
    let traces = match &served_config {
        Some(config) => {
            let traces =
                telemetry::trace::Tracing::install(&config.telemetry, runtime.handle().clone())
                    .with_context(|| format!("{}: telemetry", config.source.display()))?;
            telemetry::logging::init(
                config.logging.format,
                &config.logging.level,
                traces.as_ref(),
            );
            traces
        }
        None => {
            telemetry::logging::init(LogFormat::Text, "info", None);
            None
        }
    };
    match cli.command {
        Command::Serve { listen, .. } => match served_config {
            Some(config) => runtime.block_on(serve(config, listen, serving_threads, traces)),
            None => bail!("serve: no config"),
        },
        Command::Check { config } => runtime.block_on(check(&config.config)),
        Command::Migrate { config } => runtime.block_on(async {
            let config = load_config(&config.config)?;
            let store = Store::open(&config.database_url).await?;
            println!("{} database is up to date", store.backend());
            Ok(())
        }),
        Command::Strategies { command } => runtime.block_on(strategies(command)),
        Command::CompileStrategies { files } => Ok(compile_child::compile_into_cache(&files)?),
        Command::MockUpstream {
            port,
            host,
            ttft_ms,
            tokens_per_s,
            fail_rate,
            model,
            completion_tokens,
            protocol,
            tool_call,
            first_token_at_once,
        } => {
            let ip = host
                .parse()
                .with_context(|| format!("--host {host} is not an IP address"))?;
            runtime.block_on(async {
                mock::run(MockOptions {
                    listen: SocketAddr::new(ip, port),
                    ttft_ms,
                    tokens_per_s,
                    first_token_at_once,
                    fail_rate,
                    model,
                    completion_tokens,
                    protocol,
                    tool_call,
                })
                .await
                .context("mock upstream")
            })
        }
    }
}

fn load_config(path: &Path) -> anyhow::Result<Config> {
    Ok(Config::load(path)?)
}

/// Serving threads on `cores` cores when `--worker-threads` is not given: all but one, so the
/// request log's writer and the background runtime keep a core (see `--worker-threads`).
fn default_serving_threads(cores: usize) -> usize {
    cores.saturating_sub(1).max(1)
}

/// `serving_threads`: serve on that many single-threaded runtimes (`--runtime per-core`); `None`
/// serves on the current (work-stealing) runtime.
async fn serve(
    config: Config,
    listen: Option<String>,
    serving_threads: Option<usize>,
    traces: Option<telemetry::trace::Tracing>,
) -> anyhow::Result<()> {
    let max_connections = client_connection_cap(&config.server.edge);
    // `SWITCHYARD_METRICS=off` records nothing (`/metrics` answers 503): the baseline of the
    // benchmark that measures what metrics cost (bench/metrics_cost.py).
    if std::env::var("SWITCHYARD_METRICS").as_deref() != Ok("off") {
        telemetry::metrics::install().context("installing the metrics recorder")?;
        telemetry::metrics::spawn_upkeep();
    }
    // Stateful providers (routewise::quota): one process only unless a fleet shares their
    // accounting; no quota-only model uncalibrated.
    if config.fleet.is_none() {
        quota::replica_guard(&config.models, &|var| std::env::var(var).ok())?;
    }
    // Built-ins now; `strategies.dir` after the gateway listens (spawn_strategy_loader).
    let routing = Routing::build(&config, DirLoad::Later).await?;
    let store = Store::open(&config.database_url)
        .await
        .with_context(|| format!("{}: database.url", config.source.display()))?;
    // Routes, consumers and upstreams from the database: loaded now, then kept in sync
    // (LISTEN/NOTIFY on PostgreSQL, a version poll on SQLite).
    if let Err(e) = store.snapshots().reload(store.config()).await {
        tracing::warn!("loading the configuration from the database failed: {e}");
    }
    store.spawn_sync();
    let listen = listen.unwrap_or_else(|| config.server.listen.clone());
    let gateway = Arc::new(Gateway::new(config, routing, Some(store.clone()))?);
    // Also runs the RouteWise DB bootstrap, which may calibrate cost envelopes: check after it.
    gateway.apply_snapshot(store.snapshot()).await;
    quota::cold_start(&gateway.table()).await?;
    gateway.spawn_strategy_loader();
    gateway.spawn_snapshot_sync();
    gateway.spawn_ticker();
    gateway.spawn_health_checks();
    gateway.spawn_extension_tasks();
    let listener = Listening::bind(&listen, serving_threads)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let addr = listener.local_addr()?;
    if !addr.ip().is_loopback() {
        for route in gateway.inbound_routes().unauthenticated() {
            tracing::warn!(
                route = %route.name,
                path_prefix = %route.path_prefix,
                "serving without authentication on {addr}, which is not a loopback address: anyone who can reach it may spend the upstream credentials"
            );
        }
    }
    for model in gateway.table().models() {
        tracing::info!(
            model = %model.config.id,
            strategy = %model.router.strategy.label(),
            routes = model.config.upstreams.len(),
            "model ready"
        );
    }
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        writeln!(out, "switchyard listening on http://{addr}")?;
        out.flush()?;
    }
    if let Some(metrics_listen) = gateway.config.server.metrics_listen.clone() {
        serve_metrics(&metrics_listen, gateway.clone()).await?;
    }
    if let Some(traces) = &traces {
        tracing::info!("exporting traces to {}", traces.endpoint());
    }
    // Loading the configuration, the strategies and an instance per model freed more than the
    // idle gateway keeps; the allocator would hold it until this thread allocates again.
    switchyard_allocator::return_freed_memory();
    let signalled = serve_until_drained(listener, gateway.clone(), max_connections).await?;
    // The request log writes in intervals, the span exporter in batches: what the last interval
    // queued is written before exit, both at once.
    let request_log = async {
        if let Some(api_log) = &gateway.api_log {
            api_log.finish(REQUEST_LOG_EXIT_DEADLINE).await;
        }
    };
    let spans = async {
        if let Some(traces) = traces {
            traces
                .shutdown(trace_exit_deadline(&gateway, signalled))
                .await;
        }
    };
    tokio::join!(request_log, spans);
    Ok(())
}

/// Raises the soft file limit to the hard one and derives the connection cap from it, before
/// anything opens files.
fn client_connection_cap(edge: &switchyard::config::EdgeConfig) -> usize {
    use switchyard::server::listener;
    let file_limit = listener::raise_file_limit();
    let max_connections = listener::connection_cap(edge.max_connections, file_limit);
    tracing::info!(
        file_limit,
        max_connections,
        header_read_timeout_seconds = edge.header_read_timeout.as_secs_f64(),
        request_body_timeout_seconds = edge.request_body_timeout.as_secs_f64(),
        shutdown_grace_seconds = edge.shutdown_grace.as_secs_f64(),
        "client connection limits"
    );
    max_connections
}

/// How long exit waits for the last spans' export: what is left of the shutdown grace since
/// SIGTERM, but at least one export's timeout, so the last requests' spans get one try.
fn trace_exit_deadline(
    gateway: &Gateway,
    signalled: Option<std::time::Instant>,
) -> std::time::Duration {
    let grace = gateway.config.server.edge.shutdown_grace;
    let left = signalled.map_or(grace, |at| grace.saturating_sub(at.elapsed()));
    left.max(telemetry::trace::EXPORT_TIMEOUT)
}

/// How long exit waits for the request log's last rows (a stuck database must not hold it).
const REQUEST_LOG_EXIT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// The gateway's listening sockets: one for the shared runtime, or one per serving thread.
enum Listening {
    Shared(tokio::net::TcpListener),
    PerCore(Vec<std::net::TcpListener>),
}

impl Listening {
    async fn bind(listen: &str, serving_threads: Option<usize>) -> std::io::Result<Self> {
        let Some(threads) = serving_threads else {
            return Ok(Self::Shared(tokio::net::TcpListener::bind(listen).await?));
        };
        let addr = tokio::net::lookup_host(listen)
            .await?
            .next()
            .ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::NotFound, "no address to listen on")
            })?;
        Ok(Self::PerCore(switchyard::server::listener::bind_shared(
            addr, threads,
        )?))
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match self {
            Self::Shared(listener) => listener.local_addr(),
            Self::PerCore(listeners) => listeners
                .first()
                .ok_or_else(|| std::io::Error::other("no listening socket"))?
                .local_addr(),
        }
    }
}

/// Serves until SIGTERM (or Ctrl-C) and the drain that follows are over; returns when the
/// signal came.
async fn serve_until_drained(
    listener: Listening,
    gateway: Arc<Gateway>,
    max_connections: usize,
) -> anyhow::Result<Option<std::time::Instant>> {
    let edge = gateway.config.server.edge.clone();
    let drain = gateway.drain.clone();
    let app = switchyard::server::Edge::gateway(gateway);
    let signalled = Arc::new(std::sync::OnceLock::new());
    let signal = {
        let signalled = signalled.clone();
        async move {
            shutdown_signal().await;
            let _ = signalled.set(std::time::Instant::now());
        }
    };
    use switchyard::server::listener::{serve, serve_per_core};
    match listener {
        Listening::Shared(listener) => {
            serve(listener, app, &edge, max_connections, drain, signal).await;
        }
        Listening::PerCore(listeners) => {
            serve_per_core(listeners, app, &edge, max_connections, drain, signal)
                .await
                .context("starting the serving threads")?;
        }
    }
    Ok(signalled.get().copied())
}

/// Connections the metrics-only listener holds at once: scrapers are few.
const METRICS_MAX_CONNECTIONS: usize = 64;

/// The metrics-only listener (`server.metrics_listen`): `/metrics` without a token. Its address is
/// logged, so a parent that asked for port 0 can learn it. It has the main listener's head and
/// body deadlines and a small connection cap of its own, and keeps answering while the main
/// listener drains (a scraper sees the drain happen); it ends with the process.
async fn serve_metrics(listen: &str, gateway: Arc<Gateway>) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen} (server.metrics_listen)"))?;
    let addr = listener.local_addr()?;
    tracing::info!("serving /metrics without a token on http://{addr}/metrics");
    let edge = gateway.config.server.edge.clone();
    let app =
        switchyard::server::Edge::routed(switchyard::server::metrics::listener_router(gateway));
    tokio::spawn(async move {
        switchyard::server::listener::serve(
            listener,
            app,
            &edge,
            METRICS_MAX_CONNECTIONS,
            Arc::default(),
            std::future::pending(),
        )
        .await;
    });
    Ok(())
}

/// Ctrl-C, or SIGTERM as sent by process supervisors and container runtimes.
async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate => {}
    }
}

async fn check(config_path: &Path) -> anyhow::Result<()> {
    let config = load_config(config_path)?;
    let routing = Routing::build(&config, DirLoad::Now).await?;
    quota::cold_start(&routing.table).await?;
    println!("{}: OK", config.source.display());
    for model in routing.table.models() {
        let c = &model.config;
        let aliases = if c.aliases.is_empty() {
            String::new()
        } else {
            format!(" (aliases: {})", c.aliases.join(", "))
        };
        println!(
            "model {}{aliases}: router {} {}, params {}{}",
            c.id,
            model.router.strategy.name,
            model.router.strategy.version,
            c.router_params,
            if c.published { "" } else { " [unpublished]" }
        );
        if let (Some(shadow), Some(spec)) = (&model.shadow, &c.shadow) {
            let s = &shadow.router.strategy;
            println!("  shadow {} {}, params {}", s.name, s.version, spec.params);
        }
        for r in &c.upstreams {
            println!(
                "  [{}] {} {} {} model={} weight={} priority={}",
                r.index,
                r.endpoint_id,
                r.kind.as_str(),
                switchyard::upstream::redact::url(&r.base_url),
                r.provider_model_id,
                r.weight,
                r.priority
            );
        }
    }
    // Quota routes whose snapshot cannot resolve: warnings, not errors: the config is valid, but
    // RouteWise excludes those routes until they get a snapshot.
    let env = |var: &str| std::env::var(var).ok();
    for problem in quota::QuotaPlan::build(&config.models, &env).diagnostics() {
        println!("warning: {problem}");
    }
    Ok(())
}

async fn catalog_for(config_path: &Path) -> anyhow::Result<(StrategyEngine, StrategyCatalog)> {
    catalog_with(config_path, |limits| limits).await
}

/// The config's catalog, on an engine whose limits `adjust` may change.
async fn catalog_with(
    config_path: &Path,
    adjust: impl Fn(StrategyLimits) -> StrategyLimits,
) -> anyhow::Result<(StrategyEngine, StrategyCatalog)> {
    let config = load_config(config_path)?;
    let engine = StrategyEngine::new(adjust(StrategyLimits {
        call_timeout: config.strategies.call_timeout,
        memory_limit_bytes: config.strategies.memory_limit_bytes,
    }))?;
    let extra = config
        .strategies
        .dir
        .as_deref()
        .map(|d| config.resolve_path(d));
    let builtin = builtin_strategies_dir(&config);
    let catalog = StrategyCatalog::discover(&engine, Some(&builtin), extra.as_deref()).await;
    Ok((engine, catalog))
}

async fn strategies(command: StrategiesCommand) -> anyhow::Result<()> {
    match command {
        StrategiesCommand::List { config } => {
            let (_, catalog) = catalog_for(&config.config).await?;
            // One line per entry, tab-separated: name, version, state, path, description or
            // reason, imports. Reasons and descriptions are joined to one line.
            let imports = |list: &[String]| {
                if list.is_empty() {
                    "imports: -".to_owned()
                } else {
                    format!("imports: {}", list.join(", "))
                }
            };
            for (name, entry) in catalog.entries() {
                match entry {
                    CatalogEntry::Loaded(s) => println!(
                        "{name}\t{}\tloaded\t{}\t{}\t{}",
                        s.version,
                        s.path.display(),
                        catalog::one_line(&s.description),
                        imports(&s.imports)
                    ),
                    CatalogEntry::Missing(m) => println!(
                        "{name}\t-\tmissing\t{}\t{}\t{}",
                        m.path.display(),
                        m.reason,
                        imports(&m.imports)
                    ),
                }
            }
            // Files whose strategy name another entry serves (or their own older content does,
            // after a change): listed too, so no broken file goes unseen.
            for (failed, _) in catalog.failed_files() {
                let shown = catalog.get(&failed.name).is_some_and(
                    |e| matches!(e, CatalogEntry::Missing(m) if m.path == failed.path),
                );
                if !shown {
                    println!(
                        "{}\t-\tfailed\t{}\t{}\t{}",
                        failed.name,
                        failed.path.display(),
                        failed.reason,
                        imports(&failed.imports)
                    );
                }
            }
            Ok(())
        }
        StrategiesCommand::Schema { name, config } => {
            let (_, catalog) = catalog_for(&config.config).await?;
            match catalog.get(&name) {
                Some(CatalogEntry::Loaded(s)) => {
                    println!("{}", serde_json::to_string_pretty(&s.params_schema)?);
                    Ok(())
                }
                Some(CatalogEntry::Missing(m)) => {
                    bail!("strategy `{name}` is unavailable: {}", m.reason)
                }
                None => bail!(
                    "unknown strategy `{name}`; known strategies: {}",
                    catalog.names().join(", ")
                ),
            }
        }
        StrategiesCommand::New {
            name,
            lang,
            dir,
            sdk,
        } => {
            let dir = dir.unwrap_or_else(|| PathBuf::from(&name));
            let Some(sdk) = sdk.or_else(scaffold::default_sdk_dir) else {
                bail!(
                    "the SDKs are not where this binary was built; pass --sdk with the sdk/ folder of a Switchyard checkout"
                );
            };
            let files = scaffold::scaffold(&name, lang, &dir, &sdk)?;
            for f in &files {
                println!("created {}", f.display());
            }
            println!("{}", scaffold::next_steps(&name, lang, &dir));
            Ok(())
        }
        StrategiesCommand::Run {
            name,
            params,
            input,
            config,
        } => run_decision(&name, params.as_deref(), &input, &config.config).await,
        StrategiesCommand::Replay {
            strategy,
            params,
            from,
            model,
            examples,
            config,
        } => {
            let options = replay::ReplayOptions {
                params: params.as_deref().map(parse_params).transpose()?,
                model,
                examples,
            };
            let (engine, strategy) = offline_strategy(&strategy, &config.config).await?;
            let report = replay::replay(&engine, strategy, &from, &options).await?;
            println!("{}", serde_json::to_string_pretty(&report)?);
            Ok(())
        }
        StrategiesCommand::Test { file, params } => {
            let params: serde_json::Value =
                serde_json::from_str(&params).context("--params is not JSON")?;
            let engine = StrategyEngine::new(StrategyLimits::default())?;
            // Surface an unreadable or non-component file before running checks.
            let bytes =
                std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            if let Err(e) = catalog::api_version(&bytes) {
                bail!("{}: {e}", file.display());
            }
            let report = contract::run(&engine, &file, &params).await;
            println!("router contract: {}", report.strategy);
            for c in &report.checks {
                let mark = if c.passed { "ok  " } else { "FAIL" };
                if c.detail.is_empty() {
                    println!("  {mark} {}", c.name);
                } else {
                    println!("  {mark} {} — {}", c.name, c.detail);
                }
            }
            if report.passed() {
                println!("all {} checks passed", report.checks.len());
                Ok(())
            } else {
                bail!(
                    "{} of {} checks failed",
                    report.checks.iter().filter(|c| !c.passed).count(),
                    report.checks.len()
                )
            }
        }
    }
}

/// `--params`: inline JSON, or a JSON file.
fn parse_params(text: &str) -> anyhow::Result<serde_json::Value> {
    let text = text.trim();
    if text.starts_with('{') {
        return serde_json::from_str(text).context("--params is not JSON");
    }
    let content =
        std::fs::read_to_string(text).with_context(|| format!("reading --params {text}"))?;
    serde_json::from_str(&content).with_context(|| format!("--params {text} is not JSON"))
}

/// A strategy for offline use (`run`, `replay`): by path, or by name from the config's catalog.
/// Offline there is no request to protect: a generous deadline keeps a busy machine from turning
/// a slow call into a failure.
async fn offline_strategy(
    name: &str,
    config_path: &Path,
) -> anyhow::Result<(StrategyEngine, Arc<switchyard::strategy::LoadedStrategy>)> {
    let offline_limits = |limits: StrategyLimits| StrategyLimits {
        call_timeout: limits.call_timeout.max(std::time::Duration::from_secs(1)),
        ..limits
    };
    let as_path = Path::new(name);
    if name.ends_with(".wasm") || as_path.is_file() {
        let engine = StrategyEngine::new(offline_limits(StrategyLimits::default()))?;
        let strategy = catalog::load(&engine, as_path).await?;
        return Ok((engine, Arc::new(strategy)));
    }
    let (engine, catalog) = catalog_with(config_path, offline_limits).await?;
    match catalog.get(name) {
        Some(CatalogEntry::Loaded(s)) => Ok((engine, s.clone())),
        Some(CatalogEntry::Missing(m)) => {
            bail!("strategy `{name}` is unavailable: {}", m.reason)
        }
        None => bail!(
            "unknown strategy `{name}`; known strategies: {}",
            catalog.names().join(", ")
        ),
    }
}

/// `strategies run`: loads the strategy (by path, or by name from the config's catalog), runs the
/// decision and prints it.
async fn run_decision(
    name: &str,
    params: Option<&str>,
    input: &Path,
    config_path: &Path,
) -> anyhow::Result<()> {
    let params = match params {
        None => serde_json::json!({}),
        Some(text) => parse_params(text)?,
    };
    let text =
        std::fs::read_to_string(input).with_context(|| format!("reading {}", input.display()))?;
    let decision = offline::parse_input(input, &text)?;
    let (engine, strategy) = offline_strategy(name, config_path).await?;
    let output = offline::run(&engine, strategy, &params, input, &decision).await?;
    println!("{}", serde_json::to_string_pretty(&output)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::default_serving_threads;

    #[test]
    fn the_default_leaves_one_core_to_the_background_but_serves_on_at_least_one() {
        assert_eq!([1, 2, 4, 16].map(default_serving_threads), [1, 1, 3, 15]);
    }
}
