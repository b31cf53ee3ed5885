#!/usr/bin/env bash
# instructions.sh counts the machine instructions Redis executes inside
# EVALSHA per decision, for each limiter of BenchmarkDecisions (one caller
# by default).
# It starts a private redis-server under valgrind's callgrind, counting only
# inside evalShaCommand (the time INFO commandstats reports as
# usec_per_call), runs the benchmark for one limiter and workload twice, with
# N and 2N decisions, and prints the difference divided by N: the cost of
# one more decision, free of start-up, warm-up and script loading. Unlike
# timings, the counts repeat to within a fraction of a percent from run to
# run, so they can tell apart scripts whose times differ by less than the
# machine's noise.
#
# Run from bench/:   redis/instructions.sh [N]        (default N = 1000)
# Needs valgrind and redis-server; LIMITERS and WORKLOADS (space-separated)
# narrow the run, e.g. LIMITERS=sluice WORKLOADS=hot redis/instructions.sh,
# CALLERS (1, 16 or 64; default 1) picks the number of callers, and KEEP=1
# keeps the scratch directory (callgrind's output, the logs) for a look.
#
# Under callgrind the server runs some 50 times slower, so the hot key
# refills more between calls than at full speed and more of its decisions
# are allowed; every limiter sees the same slowed server, but the share
# allowed (printed, for the run of 2N) moves the hot key's figure: a denial
# writes nothing and costs less.
set -euo pipefail
cd "$(dirname "$0")/.."

N=${1:-1000}
LIMITERS=${LIMITERS:-redis_rate sluice-unbatched sluice}
WORKLOADS=${WORKLOADS:-hot spread}
CALLERS=${CALLERS:-1}
for tool in valgrind callgrind_annotate redis-server redis-cli; do
  command -v "$tool" >/dev/null || { echo "instructions.sh: $tool is not installed" >&2; exit 1; }
done

work=$(mktemp -d)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  [ -n "${KEEP:-}" ] && echo "kept $work" >&2 || rm -rf "$work"
}
trap cleanup EXIT

go test -c -o "$work/redis.test" ./redis/

# freeport prints a loopback TCP port nothing listens on.
freeport() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# count LIMITER WORKLOAD DECISIONS writes to $work/result the instructions
# counted inside evalShaCommand over one benchmark run of DECISIONS
# decisions, and the share of them allowed. It runs in this shell, so that a
# failure stops the script and the trap stops the server.
count() {
  local port out
  port=$(freeport)
  out="$work/callgrind.out"
  rm -f "$out"
  valgrind --tool=callgrind --toggle-collect=evalShaCommand --callgrind-out-file="$out" \
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$work" >"$work/redis.log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
  SLUICE_REDIS_URL="redis://127.0.0.1:$port/0" "$work/redis.test" -test.run '^$' \
    -test.bench "^BenchmarkDecisions\$/^$1\$/^$2\$/^callers=$CALLERS\$" -test.benchtime "${3}x" >"$work/bench.log" ||
    { cat "$work/bench.log" >&2; exit 1; }
  grep -q "^BenchmarkDecisions/$1/$2/callers=$CALLERS-" "$work/bench.log" ||
    { echo "instructions.sh: no benchmark ran for $1 $2" >&2; cat "$work/bench.log" >&2; exit 1; }
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$pid" 2>/dev/null || true
  pid=
  callgrind_annotate "$out" >"$work/annotate.txt"
  {
    awk '/PROGRAM TOTALS/ { gsub(",", "", $1); printf "%s ", $1; exit }' "$work/annotate.txt"
    awk '{ for (i = 2; i <= NF; i++) if ($i == "%allowed") { print $(i - 1); exit } }' "$work/bench.log"
  } >"$work/result"
}

printf '%-18s %-8s %22s %10s\n' limiter workload 'instructions/decision' '%allowed'
for w in $WORKLOADS; do
  for l in $LIMITERS; do
    count "$l" "$w" "$N"
    read -r a _ <"$work/result"
    count "$l" "$w" $((2 * N))
    read -r b allowed <"$work/result"
    printf '%-18s %-8s %22d %10s\n' "$l" "$w" $(((b - a) / N)) "$allowed"
  done
done
