-- RouteWise router_params set at run time through /admin/routewise/*: a global fallback layer and
-- per-model overrides (keyed by the canonical model id; ids may contain `/`). Values are JSON text,
-- validated against the strategy's params schema before they are written. Writes bump
-- config_version like every other configuration write, so every process reloads them.
-- Numbered 0004 so that it cannot collide with a 0003 written on another branch.

CREATE TABLE routewise_settings (
    param      TEXT PRIMARY KEY,
    value      TEXT NOT NULL,
    updated_at BIGINT NOT NULL
);

CREATE TABLE routewise_model_settings (
    model_id   TEXT NOT NULL,
    param      TEXT NOT NULL,
    value      TEXT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (model_id, param)
);

-- The RouteWise DB bootstrap reads the newest api_logs rows of one model.
CREATE INDEX IF NOT EXISTS api_logs_model_created_at ON api_logs (model, created_at_ms);
