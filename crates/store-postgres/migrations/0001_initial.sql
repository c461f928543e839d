-- hookd's logical schema (docs/schema-notes.md) in PostgreSQL types: ids are
-- `uuid`, times `timestamptz`, and every time the store compares is written
-- from the database's own now(), so no node clock decides due-ness or leases.

-- The subscription generation: bumped in every subscription write
-- transaction so ingest can tell its fan-out index is stale.
CREATE TABLE meta (
    name  text PRIMARY KEY,
    value bigint NOT NULL
);
INSERT INTO meta (name, value) VALUES ('subscription_generation', 0);

CREATE TABLE subscriptions (
    sub_id                     uuid PRIMARY KEY,
    customer_id                text,
    url                        text NOT NULL,
    -- Denormalised from url: new deliveries copy it as their destination_host.
    host                       text NOT NULL,
    -- JSON array of pattern strings ("*", "invoice.*", "user.created").
    event_types                jsonb NOT NULL,
    secret                     text NOT NULL,
    previous_secret            text,
    previous_secret_expires_at timestamptz,
    ordered                    boolean NOT NULL,
    retry_policy               jsonb NOT NULL,
    -- 'deleted' is a tombstone: the row stays so its deliveries keep their FK.
    state                      text NOT NULL CHECK (state IN ('active', 'disabled', 'deleted')),
    description                text,
    created_at                 timestamptz NOT NULL DEFAULT now(),
    updated_at                 timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX subscriptions_customer ON subscriptions (customer_id, sub_id);

CREATE TABLE events (
    event_id        uuid PRIMARY KEY,
    type            text NOT NULL,
    -- text, not jsonb: the payload is kept byte for byte as the producer sent it.
    payload         text NOT NULL,
    -- NULLs never collide, so events without a key are never deduplicated.
    idempotency_key text UNIQUE,
    customer_id     text,
    created_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE deliveries (
    delivery_id      uuid PRIMARY KEY,
    event_id         uuid NOT NULL REFERENCES events (event_id),
    sub_id           uuid NOT NULL REFERENCES subscriptions (sub_id),
    event_type       text NOT NULL,
    -- The shard key for claims and per-destination admission.
    destination_host text NOT NULL,
    state            text NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'inflight', 'delivered', 'failed', 'dead')),
    attempt          integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    lease_expires    timestamptz,
    -- Bumped by every claim; completion, renewal and release are conditional
    -- on it, so a worker whose lease was lost cannot overwrite a newer claim.
    lease_token      bigint NOT NULL DEFAULT 0,
    worker_id        text,
    last_status      integer,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    window_start     timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (event_id, sub_id)
);
-- Sized by pending work only: delivered history does not slow claims down.
CREATE INDEX deliveries_due ON deliveries (destination_host, next_attempt_at) WHERE state = 'pending';
-- For reclaim_expired: only rows in flight carry a lease.
CREATE INDEX deliveries_lease ON deliveries (lease_expires) WHERE state = 'inflight';
-- For the delivery log of one subscription, newest first.
CREATE INDEX deliveries_sub ON deliveries (sub_id, delivery_id);

CREATE TABLE attempts (
    attempt_id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    delivery_id      uuid NOT NULL REFERENCES deliveries (delivery_id),
    number           integer NOT NULL,
    started_at       timestamptz NOT NULL,
    duration_ms      bigint NOT NULL,
    status           integer,
    error_class      text,
    -- At most 1 KB (MAX_SNIPPET_BYTES), truncated by the caller.
    response_snippet text
);
CREATE INDEX attempts_delivery ON attempts (delivery_id, attempt_id);

CREATE TABLE tokens (
    -- SHA-256 of the token; the token itself is never stored.
    token_hash  bytea PRIMARY KEY,
    -- NULL for an admin token.
    customer_id text,
    label       text,
    created_at  timestamptz NOT NULL DEFAULT now()
);
