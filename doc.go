// Package sluice is an exact per-key token-bucket rate limiter: the model,
// the Store contract that every backend keeps, and a Limiter that binds a
// store to one quota.
//
// # The model
//
// A Limit is a capacity C (whole tokens, the largest burst) and a Rate of n
// tokens every period P, an exact rational number: "100 10/s" is a burst of
// 100 refilled at 10 tokens a second (ParseLimit reads that form). Every
// (policy, key) has a bucket. A bucket seen for the first time is full. A
// request brings the bucket up to date lazily — level = min(C, level +
// elapsed·n/P), computed in integers, with fractions of a token kept — and
// takes its cost if the level covers it; otherwise it is denied and takes
// nothing. There are no timers: a bucket changes only when it is asked.
//
// Time never runs backwards inside a bucket: a clock that steps back
// refills nothing. Every rounding goes against the caller: Remaining rounds
// down, RetryAfter and ResetAfter round up to the store's time unit, and are
// measured from the caller's now. A denial that no wait can cure (a bucket
// that never refills, or a wait beyond a time.Duration) has RetryAfter ==
// Never.
//
// # The guarantee
//
// For any bucket and any interval (t0, t1], the tokens taken are at most
// the level at t0 plus (t1−t0)·n/P plus the tokens refunded, and the level
// stays within [0, C].
// Every store in this module is tested against an exact reference model
// (package sluicetest) on random traces, under concurrency, with background
// sweeps running and with clocks read out of order.
//
// # Policies and keys
//
// A policy names one quota ("api", "login"). Two policies never share a
// bucket, even for the same key; one policy whose limit changes (a tier, a
// config reload) converts its buckets as the store's Conversion says. Keys
// are opaque bytes, at most MaxKeyLen. Stores keep keys as they are given,
// and a shared store shows them to whoever can read it: hash keys that are
// personal data (an e-mail address, an IP address kept for longer than the
// law allows) before passing them, with a keyed hash if they must not be
// guessable.
//
// # The Store contract
//
// Every Store is safe for concurrent use, and each decision on one bucket is
// one atomic read-refill-decide-write step, also across processes for the
// shared stores (one Lua script in Redis, one transaction in PostgreSQL).
//
// Take validates the request first (Request.Validate) and then, if the
// store can decide the limit (CheckLimit), decides it. A denial is a
// Decision with Allowed false, never an error. The errors are:
//   - ErrInvalidPolicy, ErrInvalidKey, ErrInvalidCost, ErrInvalidLimit,
//     ErrInvalidRequestID: a bad parameter; no state changed (IsInvalid).
//   - ErrRequestIDConflict: a remembered request ID came back with another
//     cost or limit; nothing changed.
//   - ErrTooManyKeys: a bounded store is full and refuses new keys.
//   - ErrMisconfigured: the store is reachable but not set up for Sluice.
//   - ErrUnavailable: a shared store could not decide; the request may have
//     been charged. Wrap the store in package guard to decide by a failure
//     policy instead.
//   - the context's error, if ctx ended before the store decided.
//
// Peek answers as a Take of the same cost would, without consuming
// anything, without creating a bucket, and without a request ID.
//
// TakeAll decides several buckets together — a per-second burst and a
// daily quota, a per-IP and a per-tenant limit — and takes from all of them
// or from none: a request that one bucket denies costs the others nothing.
// It is one atomic step (memstore locks the buckets' shards in a fixed
// order; Redis runs one script; PostgreSQL one statement; Redis Cluster
// documents how it handles buckets in different slots without ever
// overselling). The MultiDecision says which bucket denied and the longest
// wait. Multi-takes take no request ID.
//
// Drain takes what is there, up to the cost: for charges made after the
// fact (bytes sent, tokens a model generated), where the work is done and
// refusing it helps nobody. Its cost may exceed the capacity.
//
// Refund gives tokens back, never above the capacity: a reservation that
// was not used, work that was cancelled. With the request ID of an allowed
// take it undoes that take, once and for at most its cost; a second refund
// of the same ID is Replayed and gives nothing, so a retried refund never
// turns into extra tokens. ErrUnknownRequestID means the take is not (or no
// longer) remembered.
//
// Reset makes a bucket full, as if it had never been used: "forget failed
// logins after a successful one", or an operator's action.
//
// A Request with a RequestID is idempotent: the first allowed decision is
// remembered, with the bucket update, for a bounded time; a retry gets it
// back with Replayed set and is not charged again. Denials are not
// remembered, so the retry of a denied request decides afresh.
//
// # Packages
//
// The stores are memstore (in-process), redisstore (Redis and Redis
// Cluster) and pgstore (PostgreSQL). Package guard adds deadlines, a
// failure policy and a circuit breaker to any store; promstore adds
// Prometheus metrics; httplimit and grpclimit are middleware. Package bucket
// holds the exact arithmetic itself, for stores and tools.
package sluice
