#!/usr/bin/env bash
# Interleaved pgbench rounds of the scripts named as arguments (without
# .sql), each on emptied tables after a CHECKPOINT, 16 clients, 5 s:
#   bench/postgres/pgbench/run.sh 3 upsert take insert-floor insert-floor-guard
# The first argument is the number of rounds. PGHOST, PGUSER and PGDATABASE
# default to the test server of the README.
set -euo pipefail
cd "$(dirname "$0")"
export PGHOST=${PGHOST:-127.0.0.1} PGUSER=${PGUSER:-postgres} PGDATABASE=${PGDATABASE:-test}
rounds=$1
shift
for r in $(seq "$rounds"); do
  for s in "$@"; do
    psql -qc "TRUNCATE px.t, px.up; CHECKPOINT"
    printf '%s %s ' "$r" "$s"
    pgbench -n -M prepared -c 16 -j 2 -T 5 -f "$s.sql" | grep 'tps ='
  done
done
