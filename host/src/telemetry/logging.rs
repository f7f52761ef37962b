//! The process's log subscriber: human-readable text or one JSON object per line, and, when
//! traces are exported, the OpenTelemetry layer beside it.

use std::fmt;

use tracing::{Event, Level, Metadata, Subscriber};
use tracing_log::NormalizeEvent as _;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

use super::request_id::{self, RequestScope};
use super::trace::Tracing;
use crate::config::LogFormat;

/// Installs the global subscriber on stderr. `RUST_LOG` wins over `level` (the config's
/// `logging.level`), so one run can be made verbose without editing the file.
///
/// A line logged while a request is served names it: text lines after their level as
/// `request{request_id=…}:`, JSON lines in `span` and `spans` (`{"name":"request","request_id":…}`),
/// with `trace_id` and `span_id` (of the request's span) when traces are on. The request is not a
/// `tracing` span but the task's [`RequestScope`]; [`Lines`] writes it as the fmt layer writes a
/// span.
///
/// With `traces`, the log filter applies to the log lines only: the exported spans have their own
/// target (see [`super::trace`]), so `level: warn` does not turn tracing off. Without, the
/// subscriber is exactly the log-only one.
pub fn init(format: LogFormat, level: &str, traces: Option<&Tracing>) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let Some(traces) = traces else {
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr);
        match format {
            LogFormat::Text => builder.with_ansi(ansi).event_format(Lines::Text).init(),
            LogFormat::Json => builder
                .with_ansi(false)
                .fmt_fields(JsonFields::new())
                .event_format(Lines::Json)
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
                    .with_ansi(ansi)
                    .event_format(Lines::Text)
                    .with_filter(filter),
            )
            .init(),
        LogFormat::Json => registry
            .with(
                lines
                    .with_ansi(false)
                    .fmt_fields(JsonFields::new())
                    .event_format(Lines::Json)
                    .with_filter(filter),
            )
            .init(),
    }
}

/// How a line is written: as the fmt layer's `Full` text or `Json` format writes it (timestamp,
/// level, spans, target, fields), with the current request's scope in the place of a `request`
/// span around the event's own spans.
#[derive(Debug, Clone, Copy)]
pub enum Lines {
    Text,
    Json,
}

impl<S, N> FormatEvent<S, N> for Lines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        // A `log` record's own target and level, not the `log` facade's.
        let normalized = event.normalized_metadata();
        let line = Line {
            meta: normalized.as_ref().unwrap_or_else(|| event.metadata()),
            event,
        };
        request_id::with_current(|scope| match self {
            Lines::Text => line.text(ctx, writer.by_ref(), scope),
            Lines::Json => line.json(ctx, writer.by_ref(), scope),
        })
    }
}

/// One event and what it says of itself.
struct Line<'a> {
    meta: &'a Metadata<'a>,
    event: &'a Event<'a>,
}

impl Line<'_> {
    fn text<S, N>(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        scope: Option<&RequestScope>,
    ) -> fmt::Result
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
        N: for<'a> FormatFields<'a> + 'static,
    {
        let (meta, event) = (self.meta, self.event);
        let ansi = writer.has_ansi_escapes();
        let (dim, bold, reset) = if ansi {
            ("\x1b[2m", "\x1b[1m", "\x1b[0m")
        } else {
            ("", "", "")
        };
        writer.write_str(dim)?;
        SystemTime.format_time(&mut writer)?;
        writer.write_str(reset)?;
        let level = *meta.level();
        if ansi {
            write!(writer, " {}{level:>5}{reset} ", level_colour(level))?;
        } else {
            write!(writer, " {level:>5} ")?;
        }
        let mut spans = false;
        if let Some(scope) = scope {
            write!(
                writer,
                "{bold}request{{{reset}request_id={}",
                scope.id().as_str()
            )?;
            if let Some(trace) = scope.trace() {
                write!(
                    writer,
                    " trace_id={} span_id={}",
                    trace.trace_id, trace.span_id
                )?;
            }
            write!(writer, "{bold}}}{reset}{dim}:{reset}")?;
            spans = true;
        }
        if let Some(event_scope) = ctx.event_scope() {
            for span in event_scope.from_root() {
                write!(writer, "{bold}{}{reset}", span.metadata().name())?;
                let extensions = span.extensions();
                if let Some(fields) = extensions.get::<FormattedFields<N>>()
                    && !fields.is_empty()
                {
                    write!(writer, "{bold}{{{reset}{fields}{bold}}}{reset}")?;
                }
                write!(writer, "{dim}:{reset}")?;
                spans = true;
            }
        }
        if spans {
            writer.write_char(' ')?;
        }
        write!(writer, "{dim}{}:{reset} ", meta.target())?;
        ctx.format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }

    fn json<S, N>(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        scope: Option<&RequestScope>,
    ) -> fmt::Result
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
        N: for<'a> FormatFields<'a> + 'static,
    {
        let (meta, event) = (self.meta, self.event);
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        let quoted = |text: &str| serde_json::to_string(text).map_err(|_| fmt::Error);
        write!(
            writer,
            "{{\"timestamp\":{},\"level\":\"{}\",\"fields\":",
            quoted(&timestamp)?,
            meta.level()
        )?;
        // `JsonFields` writes the event's fields as one JSON object.
        ctx.format_fields(writer.by_ref(), event)?;
        write!(writer, ",\"target\":{}", quoted(meta.target())?)?;
        // The spans from the outermost, each `{"name":…, fields…}`; the request's scope first.
        let mut spans: Vec<serde_json::Map<String, serde_json::Value>> = Vec::new();
        if let Some(scope) = scope {
            let mut span = serde_json::Map::new();
            span.insert("name".into(), "request".into());
            span.insert("request_id".into(), scope.id().as_str().into());
            if let Some(trace) = scope.trace() {
                span.insert("trace_id".into(), trace.trace_id.clone().into());
                span.insert("span_id".into(), trace.span_id.clone().into());
            }
            spans.push(span);
        }
        if let Some(event_scope) = ctx.event_scope() {
            for span in event_scope.from_root() {
                let extensions = span.extensions();
                let mut fields = extensions
                    .get::<FormattedFields<N>>()
                    .and_then(|f| serde_json::from_str::<serde_json::Map<_, _>>(f).ok())
                    .unwrap_or_default();
                fields.insert("name".into(), span.metadata().name().into());
                spans.push(fields);
            }
        }
        if let Some(current) = spans.last() {
            let current = serde_json::to_string(current).map_err(|_| fmt::Error)?;
            let all = serde_json::to_string(&spans).map_err(|_| fmt::Error)?;
            write!(writer, ",\"span\":{current},\"spans\":{all}")?;
        }
        writeln!(writer, "}}")
    }
}

/// The colours the fmt layer gives levels.
fn level_colour(level: Level) -> &'static str {
    match level {
        Level::TRACE => "\x1b[35m",
        Level::DEBUG => "\x1b[34m",
        Level::INFO => "\x1b[32m",
        Level::WARN => "\x1b[33m",
        Level::ERROR => "\x1b[31m",
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;
    use crate::telemetry::request_id::{RequestId, TraceIds};

    /// Lines written to memory.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    impl Captured {
        fn lines(&self) -> Vec<String> {
            String::from_utf8(self.0.lock().unwrap().clone())
                .unwrap()
                .lines()
                .map(str::to_owned)
                .collect()
        }
    }

    /// Logs one line outside any request, one inside a request, one inside a traced request and
    /// one inside a span within a request, with `lines` writing them.
    fn log_four(lines: Lines, json: bool) -> Vec<String> {
        let out = Captured::default();
        let builder = tracing_subscriber::fmt()
            .with_writer(out.clone())
            .with_ansi(false);
        let log = || {
            tracing::info!(target: "switchyard::access", fell_back = true, "served");
            let plain = RequestScope::new(RequestId::accept(b"id-\"1\"").unwrap());
            plain.run(|| tracing::warn!(target: "switchyard::access", status = 502, "failed"));
            let traced = RequestScope::new(RequestId::accept(b"id-2").unwrap());
            traced.clone().run(|| {
                request_id::record_trace(TraceIds {
                    trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
                    span_id: "00f067aa0ba902b7".into(),
                });
                tracing::info!(target: "switchyard::access", "traced");
                tracing::info_span!("attempt", endpoint = "m:a")
                    .in_scope(|| tracing::debug!(target: "switchyard::upstream", "inner"));
            });
        };
        if json {
            let subscriber = builder
                .with_max_level(Level::DEBUG)
                .fmt_fields(JsonFields::new())
                .event_format(lines)
                .finish();
            tracing::subscriber::with_default(subscriber, log);
        } else {
            let subscriber = builder
                .with_max_level(Level::DEBUG)
                .event_format(lines)
                .finish();
            tracing::subscriber::with_default(subscriber, log);
        }
        out.lines()
    }

    #[test]
    fn json_lines_name_the_request_as_a_span_would() {
        let lines: Vec<serde_json::Value> = log_four(Lines::Json, true)
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        assert_eq!(lines.len(), 4, "{lines:#?}");
        let [outside, plain, traced, inner] = &lines[..] else {
            unreachable!()
        };
        assert_eq!(outside["fields"]["message"], "served");
        assert_eq!(outside["fields"]["fell_back"], true);
        assert_eq!(outside["target"], "switchyard::access");
        assert_eq!(outside["level"], "INFO");
        assert!(outside["timestamp"].as_str().unwrap().ends_with('Z'));
        assert!(outside.get("span").is_none() && outside.get("spans").is_none());

        assert_eq!(plain["level"], "WARN");
        assert_eq!(plain["fields"]["status"], 502);
        // The id is escaped as JSON text.
        assert_eq!(
            plain["span"],
            serde_json::json!({"name": "request", "request_id": "id-\"1\""})
        );
        assert_eq!(plain["spans"], serde_json::json!([plain["span"]]));

        let request = serde_json::json!({
            "name": "request", "request_id": "id-2",
            "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "00f067aa0ba902b7",
        });
        assert_eq!(traced["span"], request);
        // A span inside the request is the current one, the request the outermost.
        assert_eq!(
            inner["span"],
            serde_json::json!({"name": "attempt", "endpoint": "m:a"})
        );
        assert_eq!(inner["spans"], serde_json::json!([request, inner["span"]]));
        assert_eq!(inner["level"], "DEBUG");
    }

    #[test]
    fn text_lines_name_the_request_after_the_level() {
        let lines = log_four(Lines::Text, false);
        assert_eq!(lines.len(), 4, "{lines:#?}");
        let after_time = |l: &str| l.split_once(' ').unwrap().1.to_owned();
        assert_eq!(
            after_time(&lines[0]),
            " INFO switchyard::access: served fell_back=true"
        );
        assert_eq!(
            after_time(&lines[1]),
            " WARN request{request_id=id-\"1\"}: switchyard::access: failed status=502"
        );
        assert_eq!(
            after_time(&lines[2]),
            " INFO request{request_id=id-2 trace_id=4bf92f3577b34da6a3ce929d0e0e4736 \
             span_id=00f067aa0ba902b7}: switchyard::access: traced"
        );
        assert_eq!(
            after_time(&lines[3]),
            "DEBUG request{request_id=id-2 trace_id=4bf92f3577b34da6a3ce929d0e0e4736 \
             span_id=00f067aa0ba902b7}:attempt{endpoint=\"m:a\"}: switchyard::upstream: inner"
        );
        assert!(lines[0].split(' ').next().unwrap().ends_with('Z'));
    }
}
