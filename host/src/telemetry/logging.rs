//! The process's log subscriber: human-readable text or one JSON object per line, and, when
//! traces are exported, the OpenTelemetry layer beside it.

use tracing_subscriber::EnvFilter;

use super::trace::Tracing;
use crate::config::LogFormat;

/// Installs the global subscriber on stderr. `RUST_LOG` wins over `level` (the config's
/// `logging.level`), so one run can be made verbose without editing the file.
///
/// JSON lines carry the event's fields, the current span (`span`) and every span it is inside
/// (`spans`): the `request` span's `request_id` is on every line logged while serving a request,
/// and, when traces are exported, its `trace_id` and `span_id` (of the request's span).
///
/// With `traces`, the log filter applies to the log lines only: the exported spans have their own
/// target (see [`super::trace`]), so `level: warn` does not turn tracing off. Without, the
/// subscriber is exactly the log-only one.
pub fn init(format: LogFormat, level: &str, traces: Option<&Tracing>) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let Some(traces) = traces else {
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr);
        match format {
            LogFormat::Text => builder
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .init(),
            LogFormat::Json => builder
                .json()
                .with_current_span(true)
                .with_span_list(true)
                .init(),
        }
        return;
    };
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry().with(traces.layer());
    match format {
        LogFormat::Text => registry
            .with(
                lines
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                    .with_filter(filter),
            )
            .init(),
        LogFormat::Json => registry
            .with(
                lines
                    .json()
                    .with_current_span(true)
                    .with_span_list(true)
                    .with_filter(filter),
            )
            .init(),
    }
}
