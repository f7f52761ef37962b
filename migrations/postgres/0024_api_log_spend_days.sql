-- Request-log retention (`database.request_log_retention_days`). Rows older than the retention are
-- deleted in batches, and in the same transaction what they cost is added here, per consumer and
-- UTC day. A budget's spend over a period (every period starts at a UTC midnight; `never` at 0) is
-- the sum of the log's rows since the start and of this table's days since the start, so pruning
-- the log changes no budget.
CREATE TABLE api_log_spend_days (
    consumer     TEXT NOT NULL,
    -- The UTC day the rows were created in, as Unix milliseconds of its 00:00.
    day_start_ms BIGINT NOT NULL,
    cost_usd     DOUBLE PRECISION NOT NULL,
    -- The rows the day's spend came from (priced or not), for an operator's report.
    requests     BIGINT NOT NULL,
    PRIMARY KEY (consumer, day_start_ms)
);
