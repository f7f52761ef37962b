//! The process's log subscriber: human-readable text or one JSON object per line.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber on stderr. `RUST_LOG` wins over `level` (the config's
/// `logging.level`), so one run can be made verbose without editing the file.
///
/// JSON lines carry the event's fields, the current span (`span`) and every span it is inside
/// (`spans`): the `request` span's `request_id` is on every line logged while serving a request.
pub fn init(format: LogFormat, level: &str) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
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
}
