-- A delivery's event and subscription are checked once per statement, not
-- once per row. The foreign keys of `deliveries` ran two checks per
-- inserted row (`SELECT 1 ... FOR KEY SHARE` on the event and on the
-- subscription), a hundred of each for an event fanned out to a hundred
-- subscriptions: in a model of `fanout` (docs/benchmarks.md, session 16)
-- they were 45 % of the ingest statement's time.
--
-- A second statement-level insert trigger (beside 0015's, which writes the
-- queue; the statement is undone whole if either fails) refuses a
-- statement any of whose rows names an event or a subscription that does
-- not exist, with the foreign key's SQLSTATE (23503), so ingest stays all
-- or nothing as before. What the
-- keys' locks guarded is guarded otherwise: a subscription row is never
-- deleted (deleting one marks it `deleted`), and retention deletes an event
-- only when no delivery, unfinished fan-out job or shard outbox row refers
-- to it (`EVENT_UNNEEDED` in retention.rs); an event's deliveries are
-- written with it, or by its fan-out job while the job is unfinished.
-- By what they are, not by name: 0006 created them while the old table's
-- keys still held the usual names.
DO $$
DECLARE
    fk name;
BEGIN
    FOR fk IN SELECT conname FROM pg_constraint
              WHERE conrelid = 'deliveries'::regclass AND contype = 'f' LOOP
        EXECUTE format('ALTER TABLE deliveries DROP CONSTRAINT %I', fk);
    END LOOP;
END
$$;

CREATE FUNCTION hookd_delivery_references() RETURNS trigger
LANGUAGE plpgsql SET enable_hashjoin = off SET enable_mergejoin = off AS $$
DECLARE
    missing uuid;
BEGIN
    -- Each distinct event and subscription once, by its primary key.
    SELECT n.event_id INTO missing FROM (SELECT DISTINCT event_id FROM hookd_new_deliveries) n
    WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.event_id = n.event_id) LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'a delivery names event %, which does not exist', missing
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    SELECT n.sub_id INTO missing FROM (SELECT DISTINCT sub_id FROM hookd_new_deliveries) n
    WHERE NOT EXISTS (SELECT 1 FROM subscriptions s WHERE s.sub_id = n.sub_id) LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'a delivery names subscription %, which does not exist', missing
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER deliveries_references AFTER INSERT ON deliveries
    REFERENCING NEW TABLE AS hookd_new_deliveries
    FOR EACH STATEMENT EXECUTE FUNCTION hookd_delivery_references();
