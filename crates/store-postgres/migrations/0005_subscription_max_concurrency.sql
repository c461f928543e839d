-- A subscription's explicit cap on attempts in flight at once to its
-- destination host (`Subscription::max_concurrency`). NULL, the usual case
-- and every existing row's, leaves the host at the server-wide
-- `--host-concurrency`. The bounds are the domain's, checked where the value
-- enters, so changing them needs no migration.
ALTER TABLE subscriptions ADD COLUMN max_concurrency integer;
