-- The hookd nodes sharing this database (issue 8: scale out), one row per
-- node, kept fresh by each node's heartbeat. On SQLite there is only ever
-- one process (the file lock), so this holds one live row; the table exists
-- so both backends keep one contract. A node not seen for a while is
-- deleted by the next heartbeat.
CREATE TABLE nodes (
    -- The dispatcher's worker_id (host name and process id by default).
    node_id    TEXT    NOT NULL PRIMARY KEY,
    role       TEXT    NOT NULL CHECK (role IN ('api', 'worker', 'all')),
    -- When the node started, ms since the epoch (for people).
    started_at INTEGER NOT NULL,
    -- Its last heartbeat, ms since the epoch, on the system clock at
    -- statement time.
    last_seen  INTEGER NOT NULL
);
