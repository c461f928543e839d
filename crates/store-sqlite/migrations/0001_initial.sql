-- hookd's logical schema (docs/schema-notes.md) on SQLite.
--
-- Engine-forced choices: ids are 16-byte BLOBs (UUIDv7 bytes, so byte order
-- is creation order and ids make stable cursors); times are INTEGER unix
-- milliseconds, UTC; bools are INTEGER 0/1. Tables are STRICT so a wrong
-- type is an error here rather than a surprise when reading back.

CREATE TABLE subscriptions (
    sub_id                     BLOB    NOT NULL PRIMARY KEY,
    customer_id                TEXT,
    url                        TEXT    NOT NULL,
    host                       TEXT    NOT NULL,
    -- JSON array of pattern strings, e.g. ["invoice.*", "user.created"].
    event_types                TEXT    NOT NULL,
    -- whsec_… text; the signing key is needed in the clear to sign.
    secret                     TEXT    NOT NULL,
    previous_secret            TEXT,
    previous_secret_expires_at INTEGER,
    ordered                    INTEGER NOT NULL CHECK (ordered IN (0, 1)),
    -- JSON object (RetryPolicy); unset fields follow the server defaults.
    retry_policy               TEXT    NOT NULL,
    -- 'deleted' is a tombstone: the row stays so its deliveries keep their history.
    state                      TEXT    NOT NULL CHECK (state IN ('active', 'disabled', 'deleted')),
    description                TEXT,
    created_at                 INTEGER NOT NULL,
    updated_at                 INTEGER NOT NULL
) STRICT;

CREATE INDEX subscriptions_customer ON subscriptions (customer_id, sub_id);

-- Small named counters. `subscription_generation` is bumped in every
-- subscription write transaction, so ingest can tell its fan-out index is stale.
CREATE TABLE meta (
    key   TEXT    NOT NULL PRIMARY KEY,
    value INTEGER NOT NULL
) STRICT;

INSERT INTO meta (key, value) VALUES ('subscription_generation', 0);

CREATE TABLE events (
    event_id        BLOB    NOT NULL PRIMARY KEY,
    type            TEXT    NOT NULL,
    -- Byte for byte as the producer sent it: signatures cover these bytes.
    payload         TEXT    NOT NULL,
    idempotency_key TEXT UNIQUE,
    customer_id     TEXT,
    created_at      INTEGER NOT NULL
) STRICT;

CREATE TABLE deliveries (
    delivery_id      BLOB    NOT NULL PRIMARY KEY,
    event_id         BLOB    NOT NULL REFERENCES events (event_id),
    sub_id           BLOB    NOT NULL REFERENCES subscriptions (sub_id),
    event_type       TEXT    NOT NULL,
    destination_host TEXT    NOT NULL,
    state            TEXT    NOT NULL
        CHECK (state IN ('pending', 'inflight', 'delivered', 'failed', 'dead')),
    attempt          INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  INTEGER NOT NULL,
    lease_expires    INTEGER,
    -- Bumped by every claim: completion and renewal are conditional on it,
    -- so a worker whose lease was lost cannot overwrite a newer claim.
    lease_token      INTEGER NOT NULL DEFAULT 0,
    worker_id        TEXT,
    last_status      INTEGER,
    last_error       TEXT,
    created_at       INTEGER NOT NULL,
    window_start     INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    UNIQUE (event_id, sub_id)
) STRICT;

-- What claims scan: sized by pending work only, not by history.
CREATE INDEX deliveries_due ON deliveries (destination_host, next_attempt_at)
    WHERE state = 'pending';
-- What reclaim_expired scans.
CREATE INDEX deliveries_lease ON deliveries (lease_expires)
    WHERE state = 'inflight';
-- The delivery log of one subscription, newest first.
CREATE INDEX deliveries_sub ON deliveries (sub_id, delivery_id);

CREATE TABLE attempts (
    attempt_id       INTEGER PRIMARY KEY AUTOINCREMENT,
    delivery_id      BLOB    NOT NULL REFERENCES deliveries (delivery_id),
    number           INTEGER NOT NULL,
    started_at       INTEGER NOT NULL,
    duration_ms      INTEGER NOT NULL,
    status           INTEGER,
    error_class      TEXT,
    -- At most 1 KiB of the response body (untrusted text).
    response_snippet TEXT
) STRICT;

CREATE INDEX attempts_delivery ON attempts (delivery_id, attempt_id);

CREATE TABLE tokens (
    -- SHA-256 of the token text; the token itself is never stored.
    token_hash  BLOB    NOT NULL PRIMARY KEY,
    -- NULL means an admin token.
    customer_id TEXT,
    label       TEXT,
    created_at  INTEGER NOT NULL
) STRICT;
