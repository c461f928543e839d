-- Each node's destinations whose circuit is not closed (open or half-open),
-- as its last heartbeat reported them: a JSON array of host names, sorted.
-- A hot-shard split of a host is refused while any live node reports its
-- circuit here (R5: never split during a failure). Replaced whole by every
-- heartbeat; empty on api nodes.
ALTER TABLE nodes ADD COLUMN open_circuits TEXT NOT NULL DEFAULT '[]';
