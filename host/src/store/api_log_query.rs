//! Reading the request log: one page of `api_logs`, newest first, under filters
//! (`GET /admin/logs`).
//!
//! Pages are ordered by `created_at_ms`, then `id`, both descending, and every filter column has an
//! index on `(column, created_at_ms)` (migration 0018), so a page is a walk down one index that
//! stops after `limit + 1` rows; a time range narrows the walk. The status has one partial index,
//! of the failed rows (migration 0023): a failing status or class walks it, any other walks the
//! time index, checking the status on each row. The cursor is a row id: the next
//! page starts after that row in this order. Rows are written in batches (every 250 ms), so the log
//! lags the requests by up to about a second.

use super::{Pool, Store, StoreError};

/// Most rows in one page.
pub const MAX_LIMIT: u32 = 500;
/// Rows in a page when the caller does not say.
pub const DEFAULT_LIMIT: u32 = 50;
/// The lowest status the index `api_logs_failed` holds (its `WHERE status >= 400`).
const FAILED_STATUS: i32 = 400;

/// Which statuses a page holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusFilter {
    /// One status (`429`).
    Exact(i32),
    /// A class by its first digit (`5` for `5xx`).
    Class(i32),
}

/// What one page asks for; `None` does not filter.
#[derive(Debug, Clone, PartialEq)]
pub struct LogFilter {
    pub model: Option<String>,
    pub endpoint_id: Option<String>,
    pub consumer: Option<String>,
    pub route: Option<String>,
    pub request_id: Option<String>,
    pub status: Option<StatusFilter>,
    /// Rows created at or after this (unix ms).
    pub since_ms: Option<i64>,
    /// Rows created before this (unix ms).
    pub until_ms: Option<i64>,
    /// The rows after this one (an id from a previous page's `next_before`).
    pub before: Option<i64>,
    /// 1..=[`MAX_LIMIT`].
    pub limit: u32,
}

impl Default for LogFilter {
    fn default() -> Self {
        LogFilter {
            model: None,
            endpoint_id: None,
            consumer: None,
            route: None,
            request_id: None,
            status: None,
            since_ms: None,
            until_ms: None,
            before: None,
            limit: DEFAULT_LIMIT,
        }
    }
}

/// One stored request, as a page returns it. `attempt_log` and `decision` are the stored JSON
/// text; `None` in rows written before they existed (migration 0018).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct StoredRow {
    pub id: i64,
    pub created_at_ms: i64,
    pub request_id: Option<String>,
    pub route: Option<String>,
    pub consumer: Option<String>,
    pub model: String,
    pub endpoint_id: Option<String>,
    pub status: i32,
    pub attempts: i32,
    pub fell_back: bool,
    pub ttft_ms: Option<f64>,
    pub latency_ms: f64,
    pub prompt_tokens: Option<i32>,
    pub completion_tokens: Option<i32>,
    pub cached_tokens: Option<i32>,
    pub cost_usd: Option<f64>,
    pub error: Option<String>,
    pub attempt_log: Option<String>,
    pub decision: Option<String>,
}

/// One page and the cursor of the next (`None` on the last page).
#[derive(Debug, Clone, PartialEq)]
pub struct LogPage {
    pub rows: Vec<StoredRow>,
    pub next_before: Option<i64>,
}

const COLUMNS: &str = "id, created_at_ms, request_id, route, consumer, model, endpoint_id, status, \
    attempts, fell_back, ttft_ms, latency_ms, prompt_tokens, completion_tokens, cached_tokens, \
    cost_usd, error, attempt_log, decision";

/// A value bound to a placeholder.
#[derive(Debug, Clone, PartialEq)]
enum Bind {
    Text(String),
    Int(i64),
}

/// A statement with `$n` placeholders (both backends read them) and its values in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Statement {
    pub sql: String,
    binds: Vec<Bind>,
}

impl Statement {
    fn bind(&mut self, value: Bind) -> String {
        self.binds.push(value);
        format!("${}", self.binds.len())
    }
}

/// The page's statement. `cursor` is the `created_at_ms` of the `before` row when it exists:
/// the page continues after that row; without it (an id that is not stored) the page holds the
/// rows whose id is smaller.
pub fn page_statement(filter: &LogFilter, cursor: Option<i64>, backend: Backend) -> Statement {
    let mut st = Statement {
        sql: String::new(),
        binds: Vec::new(),
    };
    let mut conditions: Vec<String> = Vec::new();
    for (column, value) in [
        ("model", &filter.model),
        ("endpoint_id", &filter.endpoint_id),
        ("consumer", &filter.consumer),
        ("route", &filter.route),
        ("request_id", &filter.request_id),
    ] {
        if let Some(value) = value {
            let p = st.bind(Bind::Text(value.clone()));
            conditions.push(format!("{column} = {p}"));
        }
    }
    // Beside a column filter, a status is never the selective part (five classes, 94 % of rows
    // one of them), but SQLite, without statistics, would walk the status index it was offered
    // and read most of the log (200 ms over a million rows): there the status term names no index
    // (no `status >= 400` below, and a unary `+`, which kept it off the plain status indexes
    // before migration 0023), so the column's index is walked and the status checked on its rows.
    // PostgreSQL knows the expression's statistics and needs them (with `+` it guesses the term
    // selective and sorts).
    let status_term = if conditions.is_empty() || backend == Backend::Postgres {
        ""
    } else {
        "+"
    };
    // Alone, a failing status (or class) names the condition of the partial index
    // `api_logs_failed` word for word, as a literal: a planner uses a partial index only where it
    // can prove the query's rows are in it, and neither proves it from a bound parameter.
    let in_failed_index = |lowest: i32| {
        if status_term.is_empty() && lowest >= FAILED_STATUS {
            format!("status >= {FAILED_STATUS} AND ")
        } else {
            String::new()
        }
    };
    match filter.status {
        Some(StatusFilter::Exact(code)) => {
            let p = st.bind(Bind::Int(i64::from(code)));
            conditions.push(format!(
                "{}{status_term}status = {p}",
                in_failed_index(code)
            ));
        }
        Some(StatusFilter::Class(digit)) => {
            let p = st.bind(Bind::Int(i64::from(digit)));
            conditions.push(format!(
                "{}{status_term}(status / 100) = {p}",
                in_failed_index(digit.saturating_mul(100))
            ));
        }
        None => {}
    }
    if let Some(since) = filter.since_ms {
        let p = st.bind(Bind::Int(since));
        conditions.push(format!("created_at_ms >= {p}"));
    }
    if let Some(until) = filter.until_ms {
        let p = st.bind(Bind::Int(until));
        conditions.push(format!("created_at_ms < {p}"));
    }
    if let Some(before) = filter.before {
        match cursor {
            // After (at, before) in (created_at_ms DESC, id DESC) order; the first half is a plain
            // range on the index's time column.
            Some(at) => {
                let at = st.bind(Bind::Int(at));
                let id = st.bind(Bind::Int(before));
                conditions.push(format!(
                    "created_at_ms <= {at} AND (created_at_ms < {at} OR id < {id})"
                ));
            }
            None => {
                let id = st.bind(Bind::Int(before));
                conditions.push(format!("id < {id}"));
            }
        }
    }
    let limit = st.bind(Bind::Int(i64::from(filter.limit.clamp(1, MAX_LIMIT)) + 1));
    let filter = if conditions.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conditions.join(" AND "))
    };
    st.sql = format!(
        "SELECT {COLUMNS} FROM api_logs{filter} ORDER BY created_at_ms DESC, id DESC LIMIT {limit}"
    );
    st
}

/// Runs a statement built here on `$db`, mapping rows to `$row`.
macro_rules! fetch {
    ($db:ty, $pool:expr, $st:expr, $row:ty) => {{
        let mut q = sqlx::query_as::<$db, $row>(&$st.sql);
        for b in &$st.binds {
            q = match b {
                Bind::Text(s) => q.bind(s.clone()),
                Bind::Int(n) => q.bind(*n),
            };
        }
        q.fetch_all($pool).await
    }};
}

fn failed(store: &Store) -> impl Fn(sqlx::Error) -> StoreError + '_ {
    move |source| StoreError::Database {
        backend: store.backend(),
        source,
    }
}

/// The `created_at_ms` of row `id`, if it is stored.
async fn created_at(store: &Store, id: i64) -> Result<Option<i64>, StoreError> {
    const SQL: &str = "SELECT created_at_ms FROM api_logs WHERE id = $1";
    let at = match store.pool() {
        Pool::Sqlite(p) => {
            sqlx::query_scalar::<_, i64>(SQL)
                .bind(id)
                .fetch_optional(p)
                .await
        }
        Pool::Postgres(p) => {
            sqlx::query_scalar::<_, i64>(SQL)
                .bind(id)
                .fetch_optional(p)
                .await
        }
    };
    at.map_err(failed(store))
}

/// What the consumers named `consumers` (the log's `consumer` column holds consumer names) spent
/// from `since_ms` on: the sum of their rows' `cost_usd` (unpriced rows count 0), and of the days
/// retention rolled up ([`super::retention`]) from `since_ms` on, exact when `since_ms` is a UTC
/// midnight (every budget period's start is). One walk down the `(consumer, created_at_ms)` index
/// per consumer, and one down the roll-up's key. Seeds the budgets' ledger at startup.
pub async fn spent_since(
    store: &Store,
    consumers: &[String],
    since_ms: i64,
) -> Result<f64, StoreError> {
    if consumers.is_empty() {
        return Ok(0.0);
    }
    let names = (2..consumers.len() + 2)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ");
    // CAST: SQLite's SUM of an empty set is NULL, PostgreSQL's SUM of DOUBLE PRECISION a double.
    // One statement, so a prune's transaction is wholly before or after it.
    let sql = format!(
        "SELECT CAST(COALESCE((SELECT SUM(cost_usd) FROM api_logs \
         WHERE created_at_ms >= $1 AND consumer IN ({names})), 0) \
         + COALESCE((SELECT SUM(cost_usd) FROM api_log_spend_days \
         WHERE day_start_ms >= $1 AND consumer IN ({names})), 0) AS DOUBLE PRECISION)"
    );
    macro_rules! sum {
        ($db:ty, $pool:expr) => {{
            let mut q = sqlx::query_scalar::<$db, f64>(&sql).bind(since_ms);
            for c in consumers {
                q = q.bind(c.as_str());
            }
            q.fetch_one($pool).await
        }};
    }
    let spent = match store.pool() {
        Pool::Sqlite(p) => sum!(sqlx::Sqlite, p),
        Pool::Postgres(p) => sum!(sqlx::Postgres, p),
    };
    spent.map_err(failed(store))
}

/// The SQL dialect a statement is written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// The statement [`page`] runs for `filter` (for `EXPLAIN` in the benchmark).
pub async fn statement(store: &Store, filter: &LogFilter) -> Result<Statement, StoreError> {
    let cursor = match filter.before {
        Some(id) => created_at(store, id).await?,
        None => None,
    };
    let backend = match store.pool() {
        Pool::Sqlite(_) => Backend::Sqlite,
        Pool::Postgres(_) => Backend::Postgres,
    };
    Ok(page_statement(filter, cursor, backend))
}

/// One page of the request log.
pub async fn page(store: &Store, filter: &LogFilter) -> Result<LogPage, StoreError> {
    let st = statement(store, filter).await?;
    let mut rows = match store.pool() {
        Pool::Sqlite(p) => fetch!(sqlx::Sqlite, p, st, StoredRow),
        Pool::Postgres(p) => fetch!(sqlx::Postgres, p, st, StoredRow),
    }
    .map_err(failed(store))?;
    let limit = filter.limit.clamp(1, MAX_LIMIT) as usize;
    let next_before = if rows.len() > limit {
        rows.truncate(limit);
        rows.last().map(|r| r.id)
    } else {
        None
    };
    Ok(LogPage { rows, next_before })
}

/// The query plan of `st`, one line per step: SQLite's `EXPLAIN QUERY PLAN` details, or
/// PostgreSQL's `EXPLAIN` text.
pub async fn explain(store: &Store, st: &Statement) -> Result<Vec<String>, StoreError> {
    #[derive(sqlx::FromRow)]
    struct SqlitePlan {
        detail: String,
    }
    #[derive(sqlx::FromRow)]
    struct PgPlan {
        #[sqlx(rename = "QUERY PLAN")]
        line: String,
    }
    let explained = Statement {
        sql: match store.pool() {
            Pool::Sqlite(_) => format!("EXPLAIN QUERY PLAN {}", st.sql),
            Pool::Postgres(_) => format!("EXPLAIN {}", st.sql),
        },
        binds: st.binds.clone(),
    };
    match store.pool() {
        Pool::Sqlite(p) => fetch!(sqlx::Sqlite, p, explained, SqlitePlan)
            .map(|rows| rows.into_iter().map(|r| r.detail).collect()),
        Pool::Postgres(p) => fetch!(sqlx::Postgres, p, explained, PgPlan)
            .map(|rows| rows.into_iter().map(|r| r.line).collect()),
    }
    .map_err(failed(store))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_filter_is_a_bound_condition_and_the_cursor_continues_after_its_row() {
        let filter = LogFilter {
            model: Some("m".into()),
            status: Some(StatusFilter::Class(5)),
            since_ms: Some(10),
            before: Some(42),
            limit: 2,
            ..LogFilter::default()
        };
        let st = page_statement(&filter, Some(99), Backend::Sqlite);
        assert!(
            st.sql.ends_with(
                "FROM api_logs WHERE model = $1 AND +(status / 100) = $2 AND created_at_ms >= $3 \
                 AND created_at_ms <= $4 AND (created_at_ms < $4 OR id < $5) \
                 ORDER BY created_at_ms DESC, id DESC LIMIT $6"
            ),
            "{}",
            st.sql
        );
        assert_eq!(
            st.binds,
            [
                Bind::Text("m".into()),
                Bind::Int(5),
                Bind::Int(10),
                Bind::Int(99),
                Bind::Int(42),
                Bind::Int(3)
            ]
        );
        // PostgreSQL keeps the expression, whose statistics it plans with.
        let st = page_statement(&filter, Some(99), Backend::Postgres);
        assert!(
            st.sql
                .contains("model = $1 AND status >= 400 AND (status / 100) = $2"),
            "{}",
            st.sql
        );
        // An id that is not stored: the rows below it.
        let st = page_statement(&filter, None, Backend::Sqlite);
        assert!(st.sql.contains("AND id < $4 ORDER BY"), "{}", st.sql);
        // Alone, a failing status or class names the failed rows' partial index; a `2xx` does not.
        for (status, condition) in [
            (
                StatusFilter::Exact(429),
                "WHERE status >= 400 AND status = $1 ORDER BY",
            ),
            (
                StatusFilter::Class(5),
                "WHERE status >= 400 AND (status / 100) = $1 ORDER BY",
            ),
            (StatusFilter::Class(2), "WHERE (status / 100) = $1 ORDER BY"),
            (StatusFilter::Exact(200), "WHERE status = $1 ORDER BY"),
        ] {
            let alone = LogFilter {
                status: Some(status),
                ..LogFilter::default()
            };
            for backend in [Backend::Sqlite, Backend::Postgres] {
                let st = page_statement(&alone, None, backend);
                assert!(st.sql.contains(condition), "{}", st.sql);
            }
        }
        let st = page_statement(&LogFilter::default(), None, Backend::Sqlite);
        assert!(
            st.sql
                .ends_with("FROM api_logs ORDER BY created_at_ms DESC, id DESC LIMIT $1")
        );
        assert_eq!(st.binds, [Bind::Int(51)]);
    }
}
