//! How fast `GET /admin/logs` pages a large request log: fills `api_logs` with a million rows
//! (a SQLite file, and a schema on the machine's PostgreSQL) and times the gateway's own page
//! query ([`api_log_query::page`]) for each filter, with and without a time range, and a deep
//! cursor; prints p50 and max per query and each query's plan (`EXPLAIN`), so that a plan that
//! stopped using its index shows.
//!
//! `cargo bench -p switchyard --bench request_log` (release; `--profile dev` builds faster and
//! times the same database work). `REQUEST_LOG_ROWS` changes the row count (default 1,000,000),
//! `REQUEST_LOG_BACKENDS` the backends (`sqlite,postgres`), `SWITCHYARD_TEST_PG_URL` the server.
//! Not a test: it asserts nothing about time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::{Duration, Instant};

use sqlx::Connection;
use switchyard::store::api_log_query::{self, LogFilter, StatusFilter};
use switchyard::store::{Pool, Store};

/// Runs of each query.
const RUNS: usize = 25;
/// One row every 600 ms: a million rows span about a week.
const SPACING_MS: i64 = 600;
const START_MS: i64 = 1_780_000_000_000;

/// Ten models with four endpoints each, 100 consumers, three routes; 94 % 200, 3 % 429, 2 % 502,
/// 1 % 499; one attempt log and decision of a realistic size (a fallback: two attempts).
fn fill_sql(postgres: bool, rows: i64) -> String {
    let series = if postgres {
        format!("generate_series(1, {rows}) AS s(i)")
    } else {
        format!(
            "(WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < {rows}) SELECT i FROM s)"
        )
    };
    // `r`: a multiplicative hash of the row number into 0..1,000,000, whose digits pick the columns
    // independently (the same rows on both backends; not `random()`, which SQLite may evaluate
    // once per use after flattening the subquery).
    format!(
        "INSERT INTO api_logs (created_at_ms, route, consumer, model, endpoint_id, attempts, fell_back, \
         status, ttft_ms, latency_ms, prompt_tokens, completion_tokens, error, request_id, cost_usd, \
         cached_tokens, cache_write_tokens, attempt_log, decision) \
         SELECT {START_MS} + i * {SPACING_MS}, 'route-' || (r / 400000), 'consumer-' || ((r / 40) % 100), \
         'model-' || (r % 10), 'model-' || (r % 10) || ':local-' || (9000 + (r / 10) % 4), 2, {t}, \
         CASE WHEN (r / 4000) % 100 < 94 THEN 200 WHEN (r / 4000) % 100 < 97 THEN 429 \
         WHEN (r / 4000) % 100 < 99 THEN 502 ELSE 499 END, \
         120.5, 900.25, 1200, 250, NULL, 'req-' || i, 0.00114, 1000, 0, \
         '[{{\"endpoint_id\":\"model-1:local-9000\",\"provider\":\"openai_compat\",\"status\":500,\"error_type\":\"http_status\",\"hedge\":false,\"prompt_tokens\":0,\"completion_tokens\":0,\"cached_tokens\":0,\"cache_write_tokens\":0,\"cost_usd\":0.0,\"latency_ms\":12.5}},{{\"endpoint_id\":\"model-1:local-9001\",\"provider\":\"openai_compat\",\"status\":200,\"error_type\":null,\"hedge\":false,\"prompt_tokens\":1200,\"completion_tokens\":250,\"cached_tokens\":1000,\"cache_write_tokens\":0,\"cost_usd\":0.00114,\"latency_ms\":880.0}}]', \
         '{{\"strategy\":\"fixed\",\"order\":[\"model-1:local-9000\",\"model-1:local-9001\"],\"seed\":4503599627370495}}' \
         FROM (SELECT i, ((i * 2654435761) % 4294967296) / 4295 AS r FROM {series}) AS g",
        t = if postgres { "TRUE" } else { "1" },
    )
}

async fn open(backend: &str) -> (Store, Option<String>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    if backend == "sqlite" {
        let url = format!("sqlite://{}", dir.path().join("logs.db").display());
        return (Store::open(&url).await.unwrap(), None, dir);
    }
    let base = std::env::var("SWITCHYARD_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let schema = format!("sy_bench_{:016x}", rand::random::<u64>());
    let mut conn = sqlx::PgConnection::connect(&base).await.unwrap();
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(&mut conn)
        .await
        .unwrap();
    let url = format!("{base}?options=-c%20search_path%3D{schema}");
    (Store::open(&url).await.unwrap(), Some(schema), dir)
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

async fn run(backend: &str, rows: i64) {
    let (store, schema, _dir) = open(backend).await;
    let filled = Instant::now();
    let sql = fill_sql(backend == "postgres", rows);
    match store.pool() {
        Pool::Sqlite(p) => {
            sqlx::query(&sql).execute(p).await.unwrap();
        }
        Pool::Postgres(p) => {
            sqlx::query(&sql).execute(p).await.unwrap();
            // What autovacuum does on its own after a bulk load.
            sqlx::query("ANALYZE api_logs").execute(p).await.unwrap();
        }
    }
    println!(
        "\n## {backend}: {rows} rows written in {:.1} s\n",
        filled.elapsed().as_secs_f64()
    );
    let end = START_MS + rows * SPACING_MS;
    // An hour in the middle of the log, and the last hour.
    let middle = (START_MS + end) / 2;
    let windows = [
        ("", None, None),
        (
            ", an hour in the middle",
            Some(middle),
            Some(middle + 3_600_000),
        ),
        (", the last hour", Some(end - 3_600_000), None),
    ];
    let filters: Vec<(&str, LogFilter)> = vec![
        ("none", LogFilter::default()),
        (
            "model",
            LogFilter {
                model: Some("model-3".into()),
                ..LogFilter::default()
            },
        ),
        (
            "endpoint",
            LogFilter {
                endpoint_id: Some("model-3:local-9002".into()),
                ..LogFilter::default()
            },
        ),
        (
            "consumer",
            LogFilter {
                consumer: Some("consumer-42".into()),
                ..LogFilter::default()
            },
        ),
        (
            "route",
            LogFilter {
                route: Some("route-1".into()),
                ..LogFilter::default()
            },
        ),
        (
            "request_id",
            LogFilter {
                request_id: Some(format!("req-{}", rows / 3)),
                ..LogFilter::default()
            },
        ),
        (
            "status=429",
            LogFilter {
                status: Some(StatusFilter::Exact(429)),
                ..LogFilter::default()
            },
        ),
        (
            "status=5xx",
            LogFilter {
                status: Some(StatusFilter::Class(5)),
                ..LogFilter::default()
            },
        ),
        (
            "status=4xx",
            LogFilter {
                status: Some(StatusFilter::Class(4)),
                ..LogFilter::default()
            },
        ),
        (
            "model+consumer+status=2xx",
            LogFilter {
                model: Some("model-3".into()),
                consumer: Some("consumer-42".into()),
                status: Some(StatusFilter::Class(2)),
                ..LogFilter::default()
            },
        ),
        (
            "model=unknown",
            LogFilter {
                model: Some("nope".into()),
                ..LogFilter::default()
            },
        ),
        (
            "model, limit=500",
            LogFilter {
                model: Some("model-3".into()),
                limit: 500,
                ..LogFilter::default()
            },
        ),
        (
            "model, before=deep cursor",
            LogFilter {
                model: Some("model-3".into()),
                before: Some(rows / 2),
                ..LogFilter::default()
            },
        ),
        (
            "status=5xx, before=deep cursor",
            LogFilter {
                status: Some(StatusFilter::Class(5)),
                before: Some(rows / 2),
                ..LogFilter::default()
            },
        ),
    ];
    println!("| query | rows | p50 ms | max ms | plan |");
    println!("| --- | ---: | ---: | ---: | --- |");
    let mut worst = Duration::ZERO;
    for (name, filter) in &filters {
        for (window, since, until) in &windows {
            if filter.before.is_some() && since.is_some() {
                continue;
            }
            let filter = LogFilter {
                since_ms: *since,
                until_ms: *until,
                ..filter.clone()
            };
            let mut times = Vec::with_capacity(RUNS);
            let mut found = 0;
            for _ in 0..RUNS {
                let started = Instant::now();
                let page = api_log_query::page(&store, &filter).await.unwrap();
                times.push(started.elapsed());
                found = page.rows.len();
            }
            times.sort();
            let max = *times.last().unwrap();
            worst = worst.max(max);
            let st = api_log_query::statement(&store, &filter).await.unwrap();
            let plan = api_log_query::explain(&store, &st).await.unwrap();
            // The plan's lines that say how rows are found.
            let plan: Vec<String> = plan
                .iter()
                .map(|l| l.trim().trim_start_matches("->").trim().to_owned())
                .filter(|l| {
                    [
                        "SCAN", "SEARCH", "TEMP", "Index", "Seq Scan", "Sort", "Bitmap",
                    ]
                    .iter()
                    .any(|w| l.contains(w))
                })
                .map(|l| l.split("  (cost").next().unwrap_or(&l).to_owned())
                .collect();
            println!(
                "| {name}{window} | {found} | {} | {} | {} |",
                ms(percentile(&times, 0.5)),
                ms(max),
                plan.join("; ")
            );
        }
    }
    println!("\nslowest single page on {backend}: {} ms", ms(worst));
    if let (Some(schema), Pool::Postgres(p)) = (schema, store.pool()) {
        let _ = sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
            .execute(p)
            .await;
    }
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is read from the command line.
    let rows: i64 = std::env::var("REQUEST_LOG_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let backends =
        std::env::var("REQUEST_LOG_BACKENDS").unwrap_or_else(|_| "sqlite,postgres".into());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for backend in backends.split(',').map(str::trim) {
        runtime.block_on(run(backend, rows));
    }
}
