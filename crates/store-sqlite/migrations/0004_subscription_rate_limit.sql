-- A subscription's explicit rate for its destination host, in attempts per
-- second (`Subscription::rate_limit`). NULL, the usual case and every
-- existing row's, leaves the host's rate adaptive. The bounds are the
-- domain's, checked where the value enters, so changing them needs no
-- migration.
ALTER TABLE subscriptions ADD COLUMN rate_limit INTEGER;
