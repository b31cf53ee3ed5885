// Package memory compares the in-memory store of sluice with other per-key
// rate limiters for Go, running the same workloads side by side. It holds
// only benchmarks; see docs/BENCHMARKS.md for how to run them and for the
// results.
//
// Every limiter is set to the same shape: a burst of 100 tokens refilled at
// 10 tokens a second (sub-benchmarks named rate=10), or at 1e9 tokens a
// second so that almost every decision is allowed (rate=1e9). The peers are:
//
//   - sluice: github.com/sluicehq/sluice/memstore, Store.Take;
//   - xrate: golang.org/x/time/rate, one *rate.Limiter per key in a sync.Map,
//     Allow;
//   - golimiter: github.com/sethvargo/go-limiter/memorystore, Take;
//   - throttled: github.com/throttled/throttled/v2, GCRARateLimiterCtx over
//     store/memstore, RateLimitCtx;
//   - baseline: the least work any per-key token bucket must do (256 locked
//     map shards, one monotonic clock read, a float refill), the yardstick
//     for the cost of one decision.
package memory
