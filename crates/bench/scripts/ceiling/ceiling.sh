#!/bin/bash
# The issue's PostgreSQL ceiling, measured: a pgbench model of the design's
# tables at their smallest (setup.sql) run for DURATION with CLIENTS
# connections, printing deliveries completed per second and PostgreSQL's CPU
# microseconds per delivery. The CPU is the whole machine's busy time (from
# /proc/stat) over the run: on an idle machine that is the server's, plus
# pgbench's own (printed apart, from its rusage). The models:
#   insert-claim-complete  the three-write design (§5, §7)
#   insert-complete        §9.1 on a lone node: no claim
#
#   ceiling.sh MODEL [CLIENTS=2] [DURATION=20]
set -euo pipefail
here=$(dirname "$0")
model=$1 clients=${2:-2} duration=${3:-20}
url=${PG_URL:-postgres://postgres@127.0.0.1:5432/test}
busy_ticks() {
    awk '/^cpu / {print $2 + $3 + $4 + $7 + $8}' /proc/stat
}
psql -q "$url" -f "$here/setup.sql" >/dev/null 2>&1
psql -q "$url" -c 'CHECKPOINT' >/dev/null
before=$(busy_ticks)
start=$(date +%s.%N)
/usr/bin/time -f '%U %S' -o /tmp/ceiling-time.log \
    pgbench -n -M prepared -c "$clients" -j 1 -T "$duration" -f "$here/$model.sql" "$url" >/tmp/ceiling-pgbench.log 2>&1 || { tail -c 400 /tmp/ceiling-pgbench.log; exit 1; }
end=$(date +%s.%N)
after=$(busy_ticks)
done_rows=$(psql -Atq "$url" -c 'SELECT count(*) FROM ceiling.attempts')
hz=$(getconf CLK_TCK)
client=$(awk '{print $1 + $2}' /tmp/ceiling-time.log)
python3 - "$model" "$clients" "$done_rows" "$start" "$end" "$((after - before))" "$hz" "$client" <<'PY'
import sys
model, clients, n, start, end, ticks, hz, client = sys.argv[1:]
n, wall = int(n), float(end) - float(start)
cpu = int(ticks) / int(hz) - float(client)
print(f"{model} clients={clients} deliveries={n} wall_s={wall:.1f} "
      f"deliveries_per_s={n / wall:,.0f} server_cpu_s={cpu:.1f} pgbench_cpu_s={client} "
      f"server_cpu_us_per_delivery={cpu * 1e6 / n:.1f}")
PY
psql -q "$url" -c "SET client_min_messages = warning; DROP SCHEMA ceiling CASCADE" >/dev/null
