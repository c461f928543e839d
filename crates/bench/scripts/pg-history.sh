#!/bin/bash
# Runs a hookd-bench scenario against PostgreSQL holding seven finished days
# of history, as a service keeping the default 7 days would (docs/benchmarks.md,
# session 15). A fresh benchmark schema has today's partition and three empty
# ones; this has 300,000 delivered rows in each of the seven days before today
# (21,000 events of 100 deliveries), and a row found by id alone is looked for
# in every day's index.
#
#   pg-history.sh template HOOKD       # once: builds database hist_tpl
#   pg-history.sh run HOOKD SCENARIO [hookd serve flags]
#
# `run` copies hist_tpl to hist_run, starts HOOKD on it, runs
# `hookd-bench SCENARIO --target` against it (hookd-bench next to HOOKD, or
# $HOOKD_BENCH), prints the JSON line with PostgreSQL's and hookd's CPU
# seconds, and drops the copy. `single` needs the flags its own run sets:
# --host-concurrency 256 --destination-rate-initial 50000
# --destination-rate-max 50000. PostgreSQL at $PGHOST (127.0.0.1), user postgres.
set -euo pipefail
cmd=$1 bin=$2
shift 2
bench=${HOOKD_BENCH:-$(dirname "$bin")/hookd-bench}
export PGHOST=${PGHOST:-127.0.0.1} PGUSER=${PGUSER:-postgres}
export HOOKD_ADMIN_TOKEN=hookd_bench_admin_token_0123456789
export HOOKD_ENCRYPTION_KEY=gF5gsPpyzNUh9ampThvO4mKF8Jib+IKXxZl1yVVXS24=
export HOOKD_LOG=warn
port=39997
auth="Authorization: Bearer $HOOKD_ADMIN_TOKEN"

start() { # database, then extra serve flags
    local db=$1
    shift
    "$bin" serve --database "postgres://$PGUSER@$PGHOST:5432/$db" --listen 127.0.0.1:$port \
        --allow-private-destinations "$@" > /dev/null 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do
        curl -sf http://127.0.0.1:$port/readyz > /dev/null && return
        sleep 0.2
    done
    echo "hookd did not become ready" >&2
    exit 1
}

# PostgreSQL's CPU seconds so far: the postmaster's reaped children and its live ones.
pg_cpu() {
    local pm t
    pm=$(pgrep -o -f 'bin/postgres -D')
    t=$(awk '{print $14+$15+$16+$17}' "/proc/$pm/stat")
    for c in $(pgrep -P "$pm"); do
        t=$((t + $(awk '{print $14+$15}' "/proc/$c/stat" 2>/dev/null || echo 0)))
    done
    echo "$t"
}

case $cmd in
template)
    psql -q test -c "DROP DATABASE IF EXISTS hist_tpl" -c "CREATE DATABASE hist_tpl"
    start hist_tpl
    sub=$(curl -sf -H "$auth" -H 'content-type: application/json' \
        -d '{"url":"http://127.0.0.9:9/h","event_types":["history.event"]}' \
        http://127.0.0.1:$port/subscriptions | python3 -c 'import json,sys; print(json.load(sys.stdin)["sub_id"])')
    # The history's subscription is deleted: nothing claims its rows.
    curl -sf -X DELETE -H "$auth" http://127.0.0.1:$port/subscriptions/"$sub" > /dev/null
    kill $pid
    wait $pid || true
    psql -q hist_tpl <<'SQL'
SELECT hookd_day_partition((now() AT TIME ZONE 'UTC')::date - i) FROM generate_series(1, 7) i;
CREATE TEMP TABLE h AS
    SELECT g, date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
              - (1 + (g / 100) % 7) * interval '1 day' + g * interval '1 millisecond' AS t,
           gen_random_uuid() AS delivery_id
    FROM generate_series(0, 2099999) g;
CREATE TEMP TABLE he AS SELECT g / 100 AS e, gen_random_uuid() AS event_id, min(t) AS t FROM h GROUP BY g / 100;
INSERT INTO events (event_id, type, payload, created_at) SELECT event_id, 'history.event', '{}', t FROM he;
INSERT INTO deliveries (delivery_id, event_id, sub_id, event_type, destination_host, state, attempt,
    next_attempt_at, created_at, window_start, updated_at, retain_from)
SELECT h.delivery_id, he.event_id, s.sub_id, 'history.event', '127.0.0.9', 'delivered', 1, h.t, h.t, h.t, h.t, h.t
FROM h JOIN he ON he.e = h.g / 100, (SELECT sub_id FROM subscriptions LIMIT 1) s;
VACUUM ANALYZE;
-- A two-row subscriptions table analysed would make every connection's
-- cached foreign-key check scan it as the run adds 100: as never analysed.
UPDATE pg_class SET reltuples = -1, relpages = 0 WHERE relname = 'subscriptions';
DELETE FROM pg_statistic WHERE starelid = 'subscriptions'::regclass;
SQL
    ;;
run)
    scenario=$1
    shift
    psql -q test -c "DROP DATABASE IF EXISTS hist_run" \
        -c "CREATE DATABASE hist_run TEMPLATE hist_tpl STRATEGY FILE_COPY" -c "CHECKPOINT"
    start hist_run "$@"
    p0=$(pg_cpu)
    c0=$(awk '{print $14+$15}' /proc/$pid/stat)
    out=$(mktemp -d)
    "$bench" "$scenario" --target http://127.0.0.1:$port --token "$HOOKD_ADMIN_TOKEN" --out "$out" > "$out/log" 2>&1
    p1=$(pg_cpu)
    c1=$(awk '{print $14+$15}' /proc/$pid/stat)
    kill $pid
    wait $pid || true
    echo "postgres_cpu_s=$(((p1 - p0) / 100)).$(printf '%02d' $(((p1 - p0) % 100))) hookd_cpu_s=$(((c1 - c0) / 100)).$(printf '%02d' $(((c1 - c0) % 100)))"
    grep '^{' "$out/log"
    psql -q test -c "DROP DATABASE hist_run"
    ;;
*)
    echo "usage: $0 template HOOKD | run HOOKD SCENARIO [hookd serve flags]" >&2
    exit 2
    ;;
esac
