#!/usr/bin/env bash
# run.sh compares `sluice serve` (memory store) with gubernator (a single
# node) on the same workload: it builds sluice (go build ./cmd/sluice from
# the repository root; or takes SLUICE_BIN) and the comparison command
# (bench/gubernator), and runs the command, which for each round, each
# cell and each server starts a fresh server on free loopback ports, warms
# it up, measures one run and stops it, and prints each run's report and
# at the end the median and range of each measure by cell and server
# (main.go in bench/gubernator says what it measures and how).
#
# Run from bench/:   gubernator/run.sh [CELL...]
#   (default: http-single grpc-single http-batch grpc-batch)
#
# Settings, from the environment (defaults in brackets):
#   ROUNDS [3]  DURATION [10s]  WARMUP [1s]  IN_FLIGHT [64]  KEYS [10000]
#   BATCH [100]  CONNS [4], the HTTP/2 connections of the gRPC cells
#   LIMIT ["100 10/s"], sluice's limit; gubernator's request items ask
#     for the closest of its own (LEAKY_BUCKET limit 100 burst 100
#     duration 10000ms for the default)
#   ALGORITHM [leaky], gubernator's algorithm: leaky or token (its
#     TOKEN_BUCKET, a fixed window: not the same shape)
#   SERVERS [sluice,gubernator], in the order of odd rounds (even rounds
#     reverse it)
#   CLIENT_PROCS [1], the load generator's GOMAXPROCS (the servers get
#     the machine's)
#   WAIT_IDLE [0]: before each run, wait (at most 10 minutes) until the
#     CPUs were at least that many percent idle over 3 seconds
#   RETRY_BUSY [0]: run a run again (at most 3 times) if the other
#     processes used more than that many cores over it; 0: never
#   SLUICE_BIN: instead of building sluice, run this binary
#
# Each run's header gives the load average and the share of the CPUs that
# was idle over the second before it: the machine may be shared.
set -euo pipefail
cd "$(dirname "$0")/.."

CELLS=${*:-http-single grpc-single http-batch grpc-batch}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-1s}
IN_FLIGHT=${IN_FLIGHT:-64}
KEYS=${KEYS:-10000}
BATCH=${BATCH:-100}
CONNS=${CONNS:-4}
LIMIT=${LIMIT:-100 10/s}
ALGORITHM=${ALGORITHM:-leaky}
SERVERS=${SERVERS:-sluice,gubernator}
CLIENT_PROCS=${CLIENT_PROCS:-1}
WAIT_IDLE=${WAIT_IDLE:-0}
RETRY_BUSY=${RETRY_BUSY:-0}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ -z "${SLUICE_BIN:-}" ]; then
  (cd .. && go build -o "$work/sluice" ./cmd/sluice)
  SLUICE_BIN=$work/sluice
fi
[ -x "$SLUICE_BIN" ] || { echo "run.sh: SLUICE_BIN: $SLUICE_BIN is not an executable" >&2; exit 1; }
go build -o "$work/compare" ./gubernator

echo "$(go version); $(nproc) cores; $(date -u '+%Y-%m-%d %H:%M UTC')"
"$work/compare" -sluice "$SLUICE_BIN" -servers "$SERVERS" -cells "${CELLS// /,}" -rounds "$ROUNDS" \
  -duration "$DURATION" -warmup "$WARMUP" -in-flight "$IN_FLIGHT" -keys "$KEYS" -batch "$BATCH" -conns "$CONNS" \
  -limit "$LIMIT" -algorithm "$ALGORITHM" -procs "$CLIENT_PROCS" -wait-idle "$WAIT_IDLE" -retry-busy "$RETRY_BUSY"
