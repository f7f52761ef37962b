-- Configuration managed through the admin API: routes and their plugin configs, consumers and their
-- keys, providers, upstreams with their keys and model mappings.
--
-- The statements that read and write these tables are shared with PostgreSQL, so both schemas use
-- the same column names and portable types: lists, maps and JSON documents are JSON text, timestamps
-- are Unix seconds (BIGINT), flags are BOOLEAN.

-- Bumped by every configuration write; other processes poll it to learn that something changed.
CREATE TABLE config_version (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    version BIGINT NOT NULL
);
INSERT INTO config_version (id, version) VALUES (1, 0);

CREATE TABLE routes (
    id                           TEXT PRIMARY KEY,
    tenant_id                    TEXT NOT NULL,
    name                         TEXT NOT NULL,
    path_prefix                  TEXT NOT NULL,
    disabled_at                  BIGINT,
    disable_auth                 BOOLEAN NOT NULL DEFAULT FALSE,
    passthrough_auth_token       BOOLEAN NOT NULL DEFAULT FALSE,
    -- [{"sha256": ..., "hint": ...}]: the tokens themselves are never stored.
    legacy_bearer_auth_tokens    TEXT NOT NULL DEFAULT '[]',
    protocol_transformation_type TEXT NOT NULL DEFAULT 'if-different-protocol',
    groups                       TEXT NOT NULL DEFAULT '[]',
    labels                       TEXT NOT NULL DEFAULT '{}',
    metadata                     TEXT NOT NULL DEFAULT '{}',
    max_attempts                 BIGINT NOT NULL DEFAULT 2,
    created_at                   BIGINT NOT NULL,
    updated_at                   BIGINT NOT NULL
);
-- Two enabled routes cannot claim the same prefix; disabled ones may linger.
CREATE UNIQUE INDEX routes_enabled_path_prefix ON routes (path_prefix) WHERE disabled_at IS NULL;

CREATE TABLE plugin_configs (
    id         TEXT PRIMARY KEY,
    route_id   TEXT NOT NULL REFERENCES routes (id) ON DELETE CASCADE,
    plugin     TEXT NOT NULL,
    config     TEXT NOT NULL DEFAULT '{}',
    enabled    BOOLEAN NOT NULL DEFAULT TRUE,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE UNIQUE INDEX plugin_configs_route_plugin ON plugin_configs (route_id, plugin);

CREATE TABLE consumers (
    id         TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    groups     TEXT NOT NULL DEFAULT '[]',
    role       TEXT NOT NULL DEFAULT 'free',
    disabled   BOOLEAN NOT NULL DEFAULT FALSE,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE UNIQUE INDEX consumers_name ON consumers (name);

CREATE TABLE consumer_api_keys (
    id          TEXT PRIMARY KEY,
    consumer_id TEXT NOT NULL REFERENCES consumers (id) ON DELETE CASCADE,
    -- SHA-256 (hex) of the secret; the secret is shown once, at creation, and never stored.
    key_hash    TEXT NOT NULL,
    prefix      TEXT NOT NULL,
    groups      TEXT NOT NULL DEFAULT '[]',
    expires_at  BIGINT,
    revoked_at  BIGINT,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL
);
CREATE UNIQUE INDEX consumer_api_keys_hash ON consumer_api_keys (key_hash);
CREATE INDEX consumer_api_keys_consumer ON consumer_api_keys (consumer_id);

CREATE TABLE providers (
    id                   TEXT PRIMARY KEY,
    name                 TEXT NOT NULL,
    protocol             TEXT NOT NULL,
    default_capabilities TEXT NOT NULL DEFAULT '[]',
    created_at           BIGINT NOT NULL,
    updated_at           BIGINT NOT NULL
);
CREATE UNIQUE INDEX providers_name ON providers (name);

CREATE TABLE upstreams (
    id           TEXT PRIMARY KEY,
    -- A provider with upstreams cannot be deleted.
    provider_id  TEXT NOT NULL REFERENCES providers (id) ON DELETE RESTRICT,
    base_url     TEXT NOT NULL,
    group_name   TEXT NOT NULL DEFAULT 'default',
    priority     BIGINT NOT NULL DEFAULT 0,
    lb_weight    DOUBLE PRECISION NOT NULL DEFAULT 1.0,
    -- NULL: the provider's default capabilities.
    capabilities TEXT,
    enabled      BOOLEAN NOT NULL DEFAULT TRUE,
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL
);
CREATE INDEX upstreams_provider ON upstreams (provider_id);

CREATE TABLE upstream_api_keys (
    id          TEXT PRIMARY KEY,
    upstream_id TEXT NOT NULL REFERENCES upstreams (id) ON DELETE CASCADE,
    -- Sent upstream, so kept as is; masked in every API response.
    secret      TEXT NOT NULL,
    lb_weight   DOUBLE PRECISION,
    min_role    TEXT NOT NULL DEFAULT 'free',
    enabled     BOOLEAN NOT NULL DEFAULT TRUE,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL
);
CREATE INDEX upstream_api_keys_upstream ON upstream_api_keys (upstream_id);

CREATE TABLE upstream_models (
    id                TEXT PRIMARY KEY,
    model             TEXT NOT NULL,
    upstream_id       TEXT NOT NULL REFERENCES upstreams (id) ON DELETE CASCADE,
    provider_model_id TEXT NOT NULL,
    created_at        BIGINT NOT NULL,
    updated_at        BIGINT NOT NULL
);
CREATE UNIQUE INDEX upstream_models_model_upstream ON upstream_models (model, upstream_id);
CREATE INDEX upstream_models_upstream ON upstream_models (upstream_id);
