#!/bin/bash
# hookd's own PostgreSQL schema under the statements of each model, one
# server session, no HTTP and no hookd: the seconds the server spends on
# the ingest, claim and record statements of 200,000 deliveries. Each model
# runs RUNS times in a scratch database migrated by `hookd migrate`, which
# is dropped at the end. What a model saves here is an upper bound on what
# the same change saves in `hookd-bench fanout`, where commits, round trips
# and the HTTP side share the machine (docs/benchmarks.md, session 30).
#
#   model.sh [RUNS=2]      (HOOKD = the hookd binary, default target/release/hookd;
#                           it must be a build of the code modelled: its migrations
#                           make the schema, triggers and all)
set -euo pipefail
here=$(dirname "$0")
runs=${1:-2}
hookd=${HOOKD:-target/release/hookd}
base=${PG_BASE:-postgres://postgres@127.0.0.1:5432}
db=hookd_schema_model_$$
psql -q "$base/test" -c "CREATE DATABASE $db" >/dev/null
trap 'psql -q "$base/test" -c "DROP DATABASE IF EXISTS $db" >/dev/null' EXIT
HOOKD_LOG=warn HOOKD_ENCRYPTION_KEY=$("$hookd" keys generate 2>/dev/null | tail -1) \
    "$hookd" migrate --database "$base/$db" >/dev/null
for model in current claims-on-queue two-write; do
    for _ in $(seq "$runs"); do
        psql -q "$base/$db" -f "$here/$model.sql" 2>&1 | awk -v m="$model" '
            /^phase / { phase = $2; next }
            /^Time: / && phase != "" { t[phase] = $2 / 1000; phase = "" }
            /^ *recorded / { counts = $0 }
            END { printf "%-16s ingest %.2f s  claim %.2f s  record %.2f s  total %.2f s  (%s)\n",
                  m, t["ingest"], t["claim"], t["record"], t["ingest"] + t["claim"] + t["record"], counts
                  if (counts !~ /recorded 200000 unfinished 0/) exit 1 }'
    done
done
