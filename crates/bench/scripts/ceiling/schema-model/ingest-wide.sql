-- The start of the models that keep the wide row (current.sql,
-- claims-on-queue.sql): timing on, the reference trigger off (the same in
-- every model), empty tables and a checkpoint, then the ingest phase: 400
-- statements, each 500 deliveries (5 events to 100 subscriptions),
-- inserted into `deliveries`, whose trigger writes the queue rows. UUIDs
-- in id order, as hookd's UUIDv7s are.
\timing on
ALTER TABLE deliveries DISABLE TRIGGER deliveries_references;
TRUNCATE deliveries, delivery_queue, attempts;
CHECKPOINT;
\echo phase ingest
DO $$ BEGIN FOR b IN 0..399 LOOP
 INSERT INTO deliveries (delivery_id, event_id, sub_id, event_type, destination_host, retain_from)
 SELECT ('00000000-0000-7000-8000-' || lpad(to_hex(b*500+i),12,'0'))::uuid,
        ('00000000-0000-7000-9000-' || lpad(to_hex(b*5+i/100),12,'0'))::uuid,
        ('00000000-0000-7000-a000-' || lpad(to_hex(i%100),12,'0'))::uuid,
        'order.created', '127.0.0.' || (i%100), '2026-12-07 12:00+00'
 FROM generate_series(0,499) i;
COMMIT;
END LOOP; END $$;
ANALYZE deliveries; ANALYZE delivery_queue;
