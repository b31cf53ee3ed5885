#!/usr/bin/env bash
# rounds scripts... ; prints tps, cpu ms per 1000 tx (all cores), ctx switches per tx
export PGHOST=127.0.0.1 PGUSER=postgres PGDATABASE=test
rounds=$1; shift
C=${C:-16}
for r in $(seq $rounds); do for s in "$@"; do
  psql -qc "TRUNCATE px.t, px.up; CHECKPOINT"
  read -r _ u n sy id io irq sirq _ < <(grep '^cpu ' /proc/stat); b1=$((u+n+sy+irq+sirq)); c1=$(awk '/^ctxt/{print $2}' /proc/stat)
  out=$(pgbench -n -M prepared -c $C -j 2 -T 5 -f "$s.sql" 2>&1)
  read -r _ u n sy id io irq sirq _ < <(grep '^cpu ' /proc/stat); b2=$((u+n+sy+irq+sirq)); c2=$(awk '/^ctxt/{print $2}' /proc/stat)
  tx=$(echo "$out" | awk '/number of transactions actually processed/{print $NF}' | cut -d/ -f1)
  tps=$(echo "$out" | awk '/tps =/{print $3}')
  echo "$r $s tps=$tps cpu_us/tx=$(( (b2-b1)*10000*1000/ (tx>0?tx:1) /1000 )) cs/tx=$(( (c2-c1)/ (tx>0?tx:1) ))"
done; done
