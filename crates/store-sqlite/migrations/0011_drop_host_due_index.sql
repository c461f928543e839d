-- `deliveries_due (destination_host, next_attempt_at)` served claims by host
-- alone. The dispatcher has claimed per subscription since 0003, through
-- `deliveries_due_sub` (a subscription has one destination host, so its
-- due rows at a host are found by subscription), and no other statement
-- looks for pending rows by host. Every delivery paid for the index on the
-- one writer twice: an entry written at ingest, removed at the claim.
-- `fanout` A/B, 6 alternating pairs: 10,394 deliveries/s mean without it,
-- 9,739 with it (docs/benchmarks.md, session 7).
DROP INDEX deliveries_due;
