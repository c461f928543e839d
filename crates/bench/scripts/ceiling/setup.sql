-- The issue's ceiling model: the design's §4 tables at their smallest (no
-- partitions, no queue table, no triggers), to measure what PostgreSQL
-- alone spends per delivery when each delivery is inserted, claimed and
-- completed in batches. Not hookd's schema: a floor under it.
DROP SCHEMA IF EXISTS ceiling CASCADE;
CREATE SCHEMA ceiling;
SET search_path = ceiling;
CREATE TABLE events (
    event_id uuid PRIMARY KEY,
    type text NOT NULL,
    payload text NOT NULL,
    idempotency_key text NOT NULL UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE subs (sub_id uuid PRIMARY KEY, host text NOT NULL);
INSERT INTO subs
SELECT gen_random_uuid(), '127.0.0.' || (i + 1) FROM generate_series(1, 100) i;
CREATE TABLE deliveries (
    delivery_id uuid PRIMARY KEY,
    event_id uuid NOT NULL,
    sub_id uuid NOT NULL,
    destination_host text NOT NULL,
    attempt int NOT NULL DEFAULT 0,
    state text NOT NULL,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    lease_expires timestamptz,
    worker_id text,
    last_status int,
    last_error text,
    UNIQUE (event_id, sub_id)
);
CREATE INDEX deliveries_due ON deliveries (destination_host, next_attempt_at)
    WHERE state = 'pending';
CREATE TABLE attempts (
    delivery_id uuid NOT NULL,
    attempt int NOT NULL,
    status int NOT NULL,
    at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (delivery_id, attempt)
);
