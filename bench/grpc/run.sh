#!/usr/bin/env bash
# run.sh measures the gRPC APIs of `sluice serve` with the memory store:
# it builds sluice (go build ./cmd/sluice from the repository root; or
# takes the binaries of SLUICE_BINS) and the load generator (bench/grpc),
# and for each round, each mode and each binary starts a fresh
# `sluice serve` on free loopback ports, waits for /readyz, runs the load
# generator against its gRPC listener in its own process, and stops the
# service. It prints each run's report, the CPU time the service, the load
# generator and all other processes used meanwhile (from /proc), and at the
# end the median of the rounds for each mode.
#
# Run from bench/:   grpc/run.sh [MODE...]        (default: take batch envoy)
#
# The modes are the load generator's: take (sluice.v1 Take), batch
# (sluice.v1 TakeBatch of BATCH takes) and envoy (Envoy's ShouldRateLimit
# of one descriptor, user=KEY, under a key-only rule: a bucket per key).
#
# Settings, from the environment (defaults in brackets):
#   ROUNDS [3]  DURATION [10s]  WARMUP [1s]  IN_FLIGHT [64]  KEYS [10000]
#   BATCH [100]  LIMIT ["100 10/s"], the limit of the one policy, "bench"
#   RULE_LIMIT [10], RULE_UNIT [second]: the Envoy rule of the descriptor
#     key "user" in the domain "bench" allows RULE_LIMIT per RULE_UNIT (a
#     bucket of RULE_LIMIT, refilled RULE_LIMIT per unit): by default the
#     refill of the policy, so that a key's long-run share is that of a
#     sluice.v1 take at the same rate (at some 4 calls a second per key,
#     all of either are allowed)
#   CONNS [2], the HTTP/2 connections the calls in flight are spread over.
#     On 2 cores 1, 2 and 4 gave the same decisions/s, and 8 or 16 cost
#     the generator and the service more CPU time per call for none. 2
#     keeps a run from resting on one connection, whose one reading and
#     one writing goroutine on each side carry every call (what limits
#     gRPC over one connection where there are more cores), for some
#     0.4µs of client CPU time a decision more than 1.
#   CLIENT [raw], the load generator's -client (raw or proto)
#   CLIENT_PROCS [1], the load generator's GOMAXPROCS: on one P it wakes
#     less often and leaves the rest of a small machine to the service
#   WAIT_IDLE [0]: before each run, wait (at most 10 minutes) until the
#     CPUs were at least that many percent idle over 3 seconds
#   SLUICE_BINS: instead of building sluice, compare these binaries,
#     given as "label=path label=path ...": each mode of each round runs
#     against each of them in turn, and the medians are by label
#   KEEP=1 keeps the scratch directory (config, service logs).
#
# Each run's header gives the load average and the share of the CPUs that
# was idle over the second before it: the machine may be shared.
#
# The modes of one round run one after the other, each against a service
# of its own, so that a drift of the (shared) machine falls on every mode.
set -euo pipefail
cd "$(dirname "$0")/.."

MODES=${*:-take batch envoy}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-1s}
IN_FLIGHT=${IN_FLIGHT:-64}
KEYS=${KEYS:-10000}
BATCH=${BATCH:-100}
LIMIT=${LIMIT:-100 10/s}
RULE_LIMIT=${RULE_LIMIT:-10}
RULE_UNIT=${RULE_UNIT:-second}
CONNS=${CONNS:-2}
CLIENT=${CLIENT:-raw}
CLIENT_PROCS=${CLIENT_PROCS:-1}
WAIT_IDLE=${WAIT_IDLE:-0}

work=$(mktemp -d)
pid=
stop_service() {
  if [ -n "$pid" ]; then
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=
  fi
}
cleanup() {
  stop_service
  if [ -n "${KEEP:-}" ]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

if [ -z "${SLUICE_BINS:-}" ]; then
  (cd .. && go build -o "$work/sluice" ./cmd/sluice)
  SLUICE_BINS="sluice=$work/sluice"
fi
for bin in $SLUICE_BINS; do
  [ -x "${bin#*=}" ] || { echo "run.sh: SLUICE_BINS: ${bin#*=} is not an executable" >&2; exit 1; }
done
go build -o "$work/loadgen" ./grpc

# Port 0 lets the service pick free ports; its banner says which. The
# rules are an envoyproxy/ratelimit config file (docs/envoy.md).
cat >"$work/rules.yaml" <<EOF
domain: bench
descriptors:
  - key: user
    rate_limit:
      unit: $RULE_UNIT
      requests_per_unit: $RULE_LIMIT
EOF
cat >"$work/sluice.yaml" <<EOF
listen:
  http: "127.0.0.1:0"
  grpc: "127.0.0.1:0"
  admin: "127.0.0.1:0"
store:
  type: memory
envoy:
  config: "$work/rules.yaml"
policies:
  bench:
    limit: "$LIMIT"
EOF

# start_service starts the sluice binary $1 with serve and sets pid and
# addr, the gRPC listener's, once /readyz answers 200 (the gRPC health
# service turns SERVING with it).
start_service() {
  "$1" serve -config "$work/sluice.yaml" -watch=false >"$work/serve.out" 2>"$work/serve.err" &
  pid=$!
  url=
  addr=
  for _ in $(seq 200); do
    url=$(sed -n 's|^sluice: serving the HTTP API on \(http://[^ ,]*\),.*|\1|p' "$work/serve.out")
    addr=$(sed -n 's|^sluice: serving .*, gRPC ([^)]*) on \([^ ,]*\),.*|\1|p' "$work/serve.out")
    if [ -n "$url" ] && [ -n "$addr" ] && curl -fsS "$url/readyz" >/dev/null 2>&1; then
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  echo "run.sh: sluice serve did not become ready" >&2
  cat "$work/serve.out" "$work/serve.err" >&2
  exit 1
}

# seconds prints a duration of the form 1s, 1.5s, 500ms or 0 in seconds.
seconds() {
  case $1 in
    0) echo 0 ;;
    *ms) echo "${1%ms}" | awk '{ print $1 / 1000 }' ;;
    *s) echo "${1%s}" ;;
    *) echo "run.sh: duration $1: write it as 1s, 1.5s or 500ms" >&2; exit 1 ;;
  esac
}
seconds "$WARMUP" >/dev/null
seconds "$DURATION" >/dev/null

# idle prints the percentage of the CPUs' time that was idle over the next
# $1 seconds.
idle() {
  local a b
  a=$(awk '/^cpu / { print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat)
  sleep "$1"
  b=$(awk '/^cpu / { print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat)
  echo "$a $b" | awk '{ printf "%.0f\n", 100 * ($3 - $1) / ($4 - $2) }'
}

# wait_idle waits until idle 3 reaches WAIT_IDLE, for at most 10 minutes.
wait_idle() {
  [ "$WAIT_IDLE" -gt 0 ] || return 0
  local deadline=$((SECONDS + 600))
  until [ "$(idle 3)" -ge "$WAIT_IDLE" ]; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "run.sh: the CPUs were not ${WAIT_IDLE}% idle within 10 minutes; running anyway" >&2
      return 0
    fi
  done
}

# busy_ticks prints the time all CPUs were busy, in clock ticks.
busy_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }

# cpu_ticks prints the user + system CPU time of process $1, in clock ticks.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

echo "sluice serve, memory store, policy bench \"$LIMIT\", Envoy rule bench/user $RULE_LIMIT per $RULE_UNIT; $IN_FLIGHT in flight over $CONNS connections, $KEYS keys, $DURATION after ${WARMUP} of warm-up; client $CLIENT on $CLIENT_PROCS P; $(nproc) cores"
hz=$(getconf CLK_TCK)
: >"$work/results"
for round in $(seq "$ROUNDS"); do
  for mode in $MODES; do
    for bin in $SLUICE_BINS; do
      label=${bin%%=*}
      wait_idle
      echo
      echo "== round $round, $mode, $label; load average $(cut -d' ' -f1-3 /proc/loadavg), $(idle 1)% idle"
      start_service "${bin#*=}"
      busy0=$(busy_ticks)
      before=$(cpu_ticks "$pid")
      t0=$EPOCHREALTIME
      TIMEFORMAT='%3U %3S'
      { time GOMAXPROCS=$CLIENT_PROCS "$work/loadgen" -addr "$addr" -policy bench -domain bench -descriptor user -mode "$mode" -batch "$BATCH" \
        -in-flight "$IN_FLIGHT" -conns "$CONNS" -keys "$KEYS" -duration "$DURATION" -warmup "$WARMUP" -client "$CLIENT" -seed "$round" >"$work/run.out"; } 2>"$work/time.out" ||
        { cat "$work/run.out" "$work/time.out" >&2; exit 1; }
      t1=$EPOCHREALTIME
      after=$(cpu_ticks "$pid")
      busy1=$(busy_ticks)
      stop_service
      cat "$work/run.out"
      # Over the warm-up and the run: the cores the service, the load
      # generator and every other process used, and the service's CPU time
      # per decision (taking the warm-up's rate to be the run's).
      rate=$(sed -n 's/^result .*decisions\/s=\([0-9]*\).*/\1/p' "$work/run.out")
      read -r svc per gen others < <(tail -1 "$work/time.out" | awk -v s=$((after - before)) -v b=$((busy1 - busy0)) \
        -v hz="$hz" -v t0="$t0" -v t1="$t1" -v r="$rate" '{
          wall = t1 - t0; svc = s / hz; gen = $1 + $2; others = b / hz - svc - gen
          printf "%.2f %.2f %.2f %.2f\n", svc / wall, svc * 1e6 / (r * wall), gen / wall, (others > 0 ? others : 0) / wall }')
      echo "CPU      service $svc cores (${per}µs a decision), load generator $gen cores, other processes $others cores, of $(nproc)"
      sed -n "/^result /s/^result /result label=$label /; /^result /s/\$/ service-cores=$svc service-cpu-us=$per other-cores=$others/p" "$work/run.out" >>"$work/results"
    done
  done
done

# The median of each field of the result lines, by binary and mode.
echo
echo "== medians of $ROUNDS rounds"
for bin in $SLUICE_BINS; do
  label=${bin%%=*}
  for mode in $MODES; do
    grep "^result label=$label mode=$mode " "$work/results" | awk -v name="$label $mode" '
      { for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[1] == "mode" || kv[1] == "label") continue
          v = kv[2]; unit = v; sub(/^[0-9.]+/, "", unit); sub(/[^0-9.]+$/, "", v)
          vals[kv[1], NR] = v; units[kv[1]] = unit; if (NR == 1) order[++n] = kv[1] } }
      END { line = name
        for (j = 1; j <= n; j++) { k = order[j]
          for (r = 1; r <= NR; r++) a[r] = vals[k, r]
          for (x = 1; x <= NR; x++) for (y = x + 1; y <= NR; y++) if (a[y] + 0 < a[x] + 0) { t = a[x]; a[x] = a[y]; a[y] = t }
          med = NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2
          line = line " " k "=" med units[k] }
        print line }'
  done
done
