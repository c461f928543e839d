#!/usr/bin/env bash
# Bulk replay figure: how fast a replay job re-sends a subscription's failed
# deliveries once its endpoint is fixed (issue 5, R3).
# 1. a `hookd listen` answering 400 receives `secs` seconds of events (one
#    attempt each: they all end `failed`);
# 2. the listener is restarted answering 200;
# 3. POST /subscriptions/{id}/replay {"statuses":["failed"]} and poll the job
#    until it completes; report deliveries re-sent per second.
# Usage: bench/replay.sh sqlite|postgres [ingest-seconds] [rate_limit|none]
set -euo pipefail
backend=${1:-sqlite}; secs=${2:-10}; rate=${3:-none}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/target/release/hookd
[ -x "$bin" ] || cargo build --release -p hookd
dir=$(mktemp -d)
case $backend in
  sqlite) db="sqlite:$dir/hookd.db" ;;
  postgres)
    schema="bench_$(date +%s)"
    psql -q -h 127.0.0.1 -U postgres test -c "CREATE SCHEMA $schema"
    db="postgres://postgres@127.0.0.1:5432/test?options=-c%20search_path%3D$schema" ;;
esac
export HOOKD_ADMIN_TOKEN=bench HOOKD_TOKEN=bench HOOKD_LOG=warn
H="Authorization: Bearer bench"; J='Content-Type: application/json'
"$bin" listen --port 19001 --status 400 > /dev/null &
rx=$!
"$bin" serve --listen 127.0.0.1:18081 --database "$db" --allow-private-destinations > "$dir/serve.log" 2>&1 &
srv=$!
trap 'kill $srv $rx 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"; [ "$backend" = postgres ] && psql -q -h 127.0.0.1 -U postgres test -c "DROP SCHEMA $schema CASCADE" || true' EXIT
for _ in $(seq 100); do curl -sf localhost:18081/healthz >/dev/null && break; sleep 0.1; done
limit=""; [ "$rate" != none ] && limit=", \"rate_limit\": $rate"
sub=$(curl -sf localhost:18081/subscriptions -H "$H" -H "$J" \
  -d "{\"url\":\"http://127.0.0.1:19001/hook\",\"event_types\":[\"bench.*\"],\"retry_policy\":{\"max_attempts\":1}$limit}" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["sub_id"])')
since=$(date -u +%Y-%m-%dT%H:%M:%SZ -d '-1 minute')
wrk -t2 -c32 -d"${secs}s" -s "$root/bench/ingest.lua" http://127.0.0.1:18081 | tail -n 1
health() { curl -sf "localhost:18081/subscriptions/$sub/health" -H "$H"; }
echo "waiting for the failures to settle" >&2
until [ "$(health | python3 -c 'import json,sys; print(json.load(sys.stdin)["pending_count"])')" = 0 ]; do sleep 0.5; done
kill $rx; wait $rx 2>/dev/null || true
"$bin" listen --port 19001 --status 200 > /dev/null &
rx=$!
sleep 0.5
echo "replaying" >&2
start=$(date +%s.%N)
job=$(curl -sf "localhost:18081/subscriptions/$sub/replay" -H "$H" -H "$J" \
  -d "{\"since\":\"$since\",\"statuses\":[\"failed\"]}" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
while :; do
  j=$(curl -sf "localhost:18081/jobs/$job" -H "$H")
  state=$(echo "$j" | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')
  [ "$state" != running ] && break
  sleep 0.2
done
end=$(date +%s.%N)
echo "$j" | python3 -c "
import json,sys
j=json.load(sys.stdin); secs=$end-$start
print(f\"replay ($backend, rate_limit=$rate): {j['state']} total={j['total']} done={j['done']} failed={j['failed']} skipped={j['skipped']} in {secs:.1f} s = {j['done']/secs:.0f} deliveries/s\")"
