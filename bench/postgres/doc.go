// Package postgres measures the PostgreSQL store of sluice
// (github.com/sluicehq/sluice/pgstore): decisions per second with 16
// concurrent callers, on spread keys and on one hot key, with
// synchronous_commit on and off (BenchmarkTake), and decisions under two
// limits at once (TakeAll of two buckets) next to single takes, with 64
// callers (BenchmarkTwoLimits). It holds only benchmarks and a smoke test;
// see docs/BENCHMARKS.md for how to run them and for the results.
//
// The server is the one at SLUICE_POSTGRES_URL (default
// postgres://postgres@127.0.0.1:5432/test). Each run works in a fresh
// schema of random name, created by Migrate and dropped at the end. If no
// server answers, the benchmarks are skipped, or fail when CI=true.
package postgres
