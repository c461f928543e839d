-- Lazy fan-out (design §9.2): an event matching more subscriptions than the
-- store's threshold is committed with one fan-out job instead of all its
-- delivery rows; `materialize_fanout` writes them later, one batch per
-- transaction, taking a job `FOR UPDATE SKIP LOCKED` so nodes share jobs
-- without waiting on each other.
--
-- The job is keyed by its event (one job per event). `next_batch` is the
-- cursor: batches [0, next_batch) are written (and their rows deleted),
-- the job is finished once next_batch = batches. A finished job keeps its
-- row (its counts) until retention deletes its event.
--
-- Not partitioned: jobs are few and short-lived. The deliveries a job
-- writes go into the day partition of the transaction that writes them
-- (`retain_from = now()`), which exists (or is created) as for ingest.
CREATE TABLE fanout_jobs (
    event_id     uuid        PRIMARY KEY REFERENCES events (event_id) ON DELETE CASCADE,
    -- Planned deliveries in all its batches.
    total        bigint      NOT NULL,
    batches      integer     NOT NULL,
    next_batch   integer     NOT NULL DEFAULT 0,
    -- Planned deliveries of the batches written so far.
    materialized bigint      NOT NULL DEFAULT 0,
    created_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz
);

-- What the materialisers poll: unfinished jobs, oldest first.
CREATE INDEX fanout_jobs_unfinished ON fanout_jobs (created_at, event_id)
    WHERE finished_at IS NULL;

-- The planned deliveries, one row per batch (hookd_store::fanout's
-- encoding: ids, subscriptions, hosts). A batch's row is deleted in the
-- transaction that writes its deliveries.
CREATE TABLE fanout_batches (
    event_id uuid    NOT NULL REFERENCES fanout_jobs (event_id) ON DELETE CASCADE,
    seq      integer NOT NULL,
    planned  bytea   NOT NULL,
    PRIMARY KEY (event_id, seq)
);
