// Package redis measures the Redis store of sluice
// (github.com/sluicehq/sluice/redisstore) side by side with
// github.com/go-redis/redis_rate on the same server: decisions per second
// at 1, 16 and 64 concurrent callers, on one hot key and on 100,000 keys,
// and the Redis CPU each decision costs (INFO commandstats usec_per_call
// of EVALSHA and EVAL). BenchmarkClients runs sluice's script through
// github.com/redis/rueidis too, to see whether that client's
// auto-pipelining would beat redisstore's own batching through go-redis.
// It holds only benchmarks and a smoke test; see
// docs/BENCHMARKS.md for how to run them and for the results.
// instructions.sh, beside them, counts the machine instructions Redis runs
// inside EVALSHA per decision at one caller, under valgrind's callgrind: a
// figure that repeats from run to run where timings do not.
//
// The server is the one at SLUICE_REDIS_URL (default
// redis://127.0.0.1:6379/15). The benchmarks flush that database and reset
// the server's statistics (CONFIG RESETSTAT), so point them at a server of
// their own. If no server answers, they are skipped, or fail when CI=true.
package redis
