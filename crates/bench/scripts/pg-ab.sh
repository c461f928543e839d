#!/bin/bash
# Alternates two hookd builds through one PostgreSQL scenario, a pair at a
# time, and prints per run the deliveries/s (and the rate after ingest, or
# the backlog's drain, where the scenario reports them), lost, duplicates,
# hookd's and the harness's CPU, hookd's peak RSS, and PostgreSQL's CPU over
# the run: the postmaster's reaped children plus its live ones, from /proc.
# The server's CPU per harness CPU-s is steadier than the rate on a shared
# machine: the harness does the same work in every run of a scenario.
#
#   pg-ab.sh SCENARIO PAIRS HOOKD_A HOOKD_B [hookd-bench flags]
#
# hookd-bench is the one beside HOOKD_A (or $HOOKD_BENCH); PostgreSQL at
# $PG_URL (postgres://postgres@127.0.0.1:5432/test), on this machine (its
# postmaster's pid file under /var/run/postgresql).
set -euo pipefail
scenario=$1 pairs=$2 a=$3 b=$4
shift 4
bench=${HOOKD_BENCH:-$(dirname "$a")/hookd-bench}
if [ ! -x "$bench" ]; then
    echo "no hookd-bench at $bench: set HOOKD_BENCH" >&2
    exit 1
fi
url=${PG_URL:-postgres://postgres@127.0.0.1:5432/test}
postmaster=$(head -n1 /var/run/postgresql/*.pid | head -n1)

# Clock ticks of CPU used by the server's processes so far.
pg_ticks() {
    local total
    total=$(awk '{print $14 + $15 + $16 + $17}' "/proc/$postmaster/stat")
    for child in $(pgrep -P "$postmaster"); do
        total=$((total + $(awk '{print $14 + $15}' "/proc/$child/stat" 2>/dev/null || echo 0)))
    done
    echo "$total"
}

hz=$(getconf CLK_TCK)
for _ in $(seq 1 "$pairs"); do
    for bin in "$a" "$b"; do
        before=$(pg_ticks)
        line=$("$bench" "$scenario" --backend postgres --pg-url "$url" --hookd "$bin" "$@" 2>/dev/null | tail -n1)
        after=$(pg_ticks)
        echo "$line" | python3 -c '
import json, sys
j = json.loads(sys.stdin.read())
pg = int(sys.argv[2]) / int(sys.argv[3])
harness = j.get("harness_cpu_s")
extra = [(k, j[k]) for k in ("after_ingest_deliveries_per_s", "drain_per_s") if j.get(k) is not None]
print(sys.argv[1], j["deliveries_per_s"], *[x for kv in extra for x in kv],
      "lost", j["lost"], "dup", j["duplicates"],
      "hookd_cpu_s", j["hookd_cpu_s"], "harness_cpu_s", harness,
      "rss_mib", j["hookd_peak_rss_mib"], "pg_cpu_s", round(pg, 1),
      "pg_per_harness", round(pg / harness, 2) if harness else None)
' "$(basename "$bin")" "$((after - before))" "$hz"
    done
done
