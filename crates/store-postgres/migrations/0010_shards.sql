-- Sharding by destination (issue 8, design §4 and R5).
--
-- In the CONTROL database: the shard map, versioned (every change is a new
-- row; the highest version is the map), and the ingest outbox: an event
-- accepted in sharded mode commits here with its planned deliveries, and
-- the row goes once every shard holding some of them has committed its
-- part. A row left behind by a crash is finished by a sweeper.
--
-- In every SHARD database: which events' parts it has written, so that
-- writing a part again (the sweeper after a crash) writes nothing twice.
--
-- A database that is not sharded keeps these tables empty.

CREATE TABLE shard_map (
    version     bigint      PRIMARY KEY,
    shards      text[]      NOT NULL,
    split_hosts text[]      NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- No foreign key to events: retention keeps an event while its outbox row
-- exists (it checks), and an outbox row must never go with its event.
CREATE TABLE shard_outbox (
    event_id   uuid        PRIMARY KEY,
    deliveries bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX shard_outbox_by_age ON shard_outbox (created_at);

CREATE TABLE shard_parts (
    event_id   uuid        PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX shard_parts_by_age ON shard_parts (created_at);
