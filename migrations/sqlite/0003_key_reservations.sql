-- Reservations of upstream keys that are configured outside the database (YAML, environment),
-- by the SHA-256 of the key: the reservation survives the key leaving the configuration and
-- applies again when it comes back. `free` is no reservation, so it is never stored.
CREATE TABLE key_reservations (
    key_hash   TEXT PRIMARY KEY,
    -- A masked hint of the key, to recognise it in listings.
    hint       TEXT NOT NULL,
    min_role   TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
