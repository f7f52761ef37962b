-- One row per answered request; written off the hot path in batches.
CREATE TABLE IF NOT EXISTS api_logs (
    id              BIGSERIAL PRIMARY KEY,
    created_at_ms   BIGINT NOT NULL,
    route           TEXT,
    consumer        TEXT,
    model           TEXT NOT NULL,
    endpoint_id     TEXT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    fell_back       BOOLEAN NOT NULL DEFAULT FALSE,
    status          INTEGER NOT NULL,
    ttft_ms         DOUBLE PRECISION,
    latency_ms      DOUBLE PRECISION NOT NULL,
    prompt_tokens   INTEGER,
    completion_tokens INTEGER,
    error           TEXT
);
CREATE INDEX IF NOT EXISTS api_logs_created_at ON api_logs (created_at_ms);
CREATE INDEX IF NOT EXISTS api_logs_endpoint ON api_logs (endpoint_id, created_at_ms);
