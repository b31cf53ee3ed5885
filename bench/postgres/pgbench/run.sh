#!/usr/bin/env bash
# Interleaved pgbench rounds of the scripts named as arguments (without
# .sql), each on emptied tables after a CHECKPOINT, 5 s each:
#   bench/postgres/pgbench/run.sh 3 upsert take insert-floor insert-floor-guard
#   CLIENTS=1 bench/postgres/pgbench/run.sh 2 upsert-hot take-hot
# The first argument is the number of rounds; CLIENTS (default 16) the
# pgbench clients. Each line gives pgbench's transactions a second and, from
# /proc/stat around the run, the machine's CPU time (all processes) and
# context switches per transaction (a script is one transaction:
# take-hot-8 makes 8 decisions in each). PGHOST, PGUSER and PGDATABASE
# default to the test server of the README.
set -euo pipefail
cd "$(dirname "$0")"
export PGHOST=${PGHOST:-127.0.0.1} PGUSER=${PGUSER:-postgres} PGDATABASE=${PGDATABASE:-test}
clients=${CLIENTS:-16}
rounds=$1
shift
# busy prints the CPU ticks spent outside idle and iowait, and the context
# switches, since boot.
busy() { awk '/^cpu /{b=$2+$3+$4+$7+$8} /^ctxt/{c=$2} END{print b, c}' /proc/stat; }
hz=$(getconf CLK_TCK)
for r in $(seq "$rounds"); do
  for s in "$@"; do
    psql -qc "TRUNCATE px.t, px.up; CHECKPOINT"
    read -r b1 c1 < <(busy)
    out=$(pgbench -n -M prepared -c "$clients" -j "$(( clients < 2 ? 1 : 2 ))" -T 5 -f "$s.sql")
    read -r b2 c2 < <(busy)
    tx=$(awk '/number of transactions actually processed/{split($NF, a, "/"); print a[1]}' <<<"$out")
    tps=$(awk '/^tps =/{print $3}' <<<"$out")
    awk -v r="$r" -v s="$s" -v tps="$tps" -v tx="$tx" -v b="$((b2 - b1))" -v c="$((c2 - c1))" -v hz="$hz" \
      'BEGIN{printf "%s %s tps = %.0f, CPU %.0f µs and %.0f context switches a transaction\n", r, s, tps, b*1e6/hz/tx, c/tx}'
  done
done
