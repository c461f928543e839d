-- `deliveries_due (destination_host, next_attempt_at)` served claims by host
-- alone. The dispatcher has claimed per subscription since 0003, through
-- `deliveries_due_sub` (a subscription has one destination host, so its due
-- rows at a host are found by subscription), and no other statement looks
-- for pending rows by host. Every delivery paid for the index twice: an
-- entry written at ingest, and a new one at the claim (its key did not
-- change, but the row moved out of HOT range as the other indexes changed).
-- `fanout` A/B, 3 alternating pairs: 12,966 deliveries/s mean without it,
-- 12,157 with it (docs/benchmarks.md, session 7).
DROP INDEX deliveries_due;
