#!/usr/bin/env bash
# Quick ingest figure: events accepted per second by `hookd serve`, with one
# matching subscription per event delivered to a local `hookd listen`.
# Usage: bench/ingest.sh sqlite|postgres [seconds]
set -euo pipefail
backend=${1:-sqlite}; secs=${2:-10}
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
"$bin" listen --port 19000 > /dev/null &
rx=$!
"$bin" serve --listen 127.0.0.1:18080 --database "$db" --allow-private-destinations &
srv=$!
trap 'kill $srv $rx 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"; [ "$backend" = postgres ] && psql -q -h 127.0.0.1 -U postgres test -c "DROP SCHEMA $schema CASCADE" || true' EXIT
for _ in $(seq 100); do curl -sf localhost:18080/healthz >/dev/null && break; sleep 0.1; done
curl -sf localhost:18080/subscriptions -H "Authorization: Bearer bench" -H 'Content-Type: application/json' \
  -d '{"url":"http://127.0.0.1:19000/hook","event_types":["bench.*"]}' > /dev/null
wrk -t2 -c32 -d"${secs}s" -s "$root/bench/ingest.lua" http://127.0.0.1:18080 | tail -n 1
