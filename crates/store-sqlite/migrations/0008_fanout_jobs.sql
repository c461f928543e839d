-- Lazy fan-out (design §9.2): an event matching more subscriptions than the
-- store's threshold is committed with one fan-out job instead of all its
-- delivery rows; `materialize_fanout` writes them later, one batch per
-- transaction.
--
-- The job is keyed by its event (one job per event). `next_batch` is the
-- cursor: batches [0, next_batch) are written (and their rows deleted),
-- the job is finished once next_batch = batches. A finished job keeps its
-- row (its counts) until retention deletes its event.
CREATE TABLE fanout_jobs (
    event_id     BLOB    NOT NULL PRIMARY KEY REFERENCES events (event_id) ON DELETE CASCADE,
    -- Planned deliveries in all its batches.
    total        INTEGER NOT NULL,
    batches      INTEGER NOT NULL,
    next_batch   INTEGER NOT NULL DEFAULT 0,
    -- Planned deliveries of the batches written so far.
    materialized INTEGER NOT NULL DEFAULT 0,
    created_at   INTEGER NOT NULL,
    finished_at  INTEGER
) STRICT;

-- What the materialiser polls: unfinished jobs, oldest first.
CREATE INDEX fanout_jobs_unfinished ON fanout_jobs (created_at, event_id)
    WHERE finished_at IS NULL;

-- The planned deliveries, one row per batch (hookd_store::fanout's
-- encoding: ids, subscriptions, hosts). A batch's row is deleted in the
-- transaction that writes its deliveries.
CREATE TABLE fanout_batches (
    event_id BLOB    NOT NULL REFERENCES fanout_jobs (event_id) ON DELETE CASCADE,
    seq      INTEGER NOT NULL,
    planned  BLOB    NOT NULL,
    PRIMARY KEY (event_id, seq)
) STRICT, WITHOUT ROWID;
