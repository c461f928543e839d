-- The hookd nodes sharing this database (issue 8: scale out), one row per
-- node, kept fresh by each node's heartbeat every few seconds. Worker nodes
-- count the live delivering ones to divide each destination's concurrency
-- cap among themselves. A node not seen for a while is deleted by the next
-- heartbeat of any node; nothing else refers to this table.
CREATE TABLE nodes (
    -- The dispatcher's worker_id (host name and process id by default).
    node_id    text        PRIMARY KEY,
    role       text        NOT NULL CHECK (role IN ('api', 'worker', 'all')),
    -- When the node started, on its own clock (for people).
    started_at timestamptz NOT NULL,
    -- Its last heartbeat, on the database's clock: what liveness is
    -- judged by, so nodes with skewed clocks agree.
    last_seen  timestamptz NOT NULL
);
