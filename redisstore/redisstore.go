// Package redisstore is the sluice.Store shared by any number of processes
// through Redis (standalone, Sentinel or Cluster): every decision is one Lua
// script that reads the bucket, refills it, converts it on a limit change,
// decides, writes it back with its expiry and remembers an allowed request
// ID, in one atomic step and one round trip.
//
// A Store is also a sluice.Operator: TakeAll, Drain, Refund and Reset are
// one script each, the same atomic step. The one exception is a TakeAll
// on Redis Cluster whose buckets lie in several slots, which no script can
// reach at once: see Store.TakeAll for how it decides them slot by slot
// without ever overselling. Every policy of one key shares that key's
// slot, so stacked limits on one key are always one script.
//
// The script reproduces bucket.Plan exactly at a tick of one microsecond.
// Lua numbers are doubles, exact only below 2^53, so a limit is accepted only
// if its exact arithmetic stays below that bound (Store.CheckLimit, which
// sluice.NewLimiter asks); every other valid limit is refused with
// sluice.ErrInvalidLimit, never approximated.
//
// Time comes from Redis TIME by default, one clock for every instance; a
// bucket's stamp never moves back, so a server clock that steps back (a
// failover to a host with a slower clock) refills nothing, and the waits
// count from the server's now. Options.Now passes time explicitly instead,
// for tests and simulations.
//
// A bucket key expires when its bucket is full again, which is lossless:
// a missing bucket starts full.
//
// # Client settings
//
// New refuses a go-redis client whose ContextTimeoutEnabled is false:
// go-redis then ignores the caller's deadline on its sockets, so a Redis
// that accepts connections and never answers holds every decision for the
// client's ReadTimeout (5 s by default). The configuration to use:
//
//	client := redis.NewClient(&redis.Options{
//		Addr:                  "127.0.0.1:6379",
//		ContextTimeoutEnabled: true,                   // required: the caller's deadline bounds each call
//		MaxRetries:            -1,                     // no retries for other commands on this client
//		DialerRetries:         1,                      // one dial attempt, not 5 with 100 ms pauses
//		DialTimeout:           200 * time.Millisecond, // a dial without a deadline
//		ReadTimeout:           time.Second,            // bounds batched pipelines, which have no deadline
//		WriteTimeout:          time.Second,
//	})
//
// The same fields exist in redis.ClusterOptions, redis.FailoverOptions,
// redis.RingOptions and redis.UniversalOptions. The store marks every
// decision command as not retryable, so go-redis sends it at most once
// whatever MaxRetries says (a reply lost after the script ran must not
// charge twice); MaxRetries: -1 keeps other code sharing the client from
// retrying. Dialing never runs the script: DialerRetries only costs time,
// up to the caller's deadline (without one, 4 pauses of 100 ms and up to 5
// DialTimeouts per call while Redis is down, and a log line for each failed
// dial until go-redis stops dialing). docs/redis.md explains each setting.
package redisstore

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice"
)

// Defaults for the zero Options.
const (
	// DefaultPrefix starts every key of a Store whose Options.Prefix is
	// empty.
	DefaultPrefix = "sluice:"
	// DefaultRequestIDTTL is how long the first allowed decision of a
	// request ID is remembered when Options.RequestIDTTL is zero.
	DefaultRequestIDTTL = 5 * time.Minute
	// DefaultBatch is the most decisions sent together when Options.Batch
	// is zero and the client has pipelines.
	DefaultBatch = 64
	// DefaultPipelines is the most pipelines in flight at once when
	// Options.Pipelines is 0.
	DefaultPipelines = 2
)

// epochUnix is the store's time zero, 2020-01-01T00:00:00Z, in seconds since
// 1970. Times are microseconds since it, below 2^53: until the year 2305.
const epochUnix = 1577836800

// Options configure a Store. The zero value of every field means its
// documented default; a value out of range is an error wrapping
// sluice.ErrInvalidOption, never repaired.
type Options struct {
	// Prefix starts every key the store writes. Default DefaultPrefix
	// ("sluice:"). It must not contain '{' or '}': the store puts a hash tag
	// of its own after it, made from the caller's key, so that the buckets
	// of every policy of a key and their request IDs share a Redis Cluster
	// slot, and policies and keys cannot choose the slot.
	Prefix string
	// OnLimitChange converts a bucket's level when a request of its policy
	// arrives with a limit other than the one the bucket was last decided
	// under. Default sluice.KeepTokens. Stats().Conversions counts them.
	OnLimitChange sluice.Conversion
	// RequestIDTTL is how long the first allowed decision of a request ID
	// is remembered, rounded up to a microsecond: at most 2^53−1 µs (about
	// 285 years). Default DefaultRequestIDTTL (5 minutes). Negative is an
	// error.
	RequestIDTTL time.Duration
	// Now, when set, is the clock, read once per call and passed to the
	// script: for tests and simulations. Every store sharing keys must then
	// read the same clock. Default nil: the script reads Redis TIME, one
	// clock for every instance, which is what production wants. Times are
	// counted in whole microseconds since 2020-01-01 UTC; a time before that
	// or after the year 2305 fails the call with sluice.ErrMisconfigured.
	Now func() time.Time
	// MinTTL is the shortest expiry the store gives any key it writes,
	// rounded up to a millisecond. Default zero: a bucket key expires 1ms
	// after its bucket is full again and a request-ID record 1ms after its
	// TTL, which loses nothing. Key expiry runs on the Redis server's real
	// clock, so with an explicit Now whose time does not follow it (a test
	// clock that jumps or steps back) set MinTTL above the real duration of
	// the run: a bucket that expired on the real clock would start full
	// where the explicit clock says it is still refilling. Negative is an
	// error.
	MinTTL time.Duration
	// Batch is the most decisions sent together: the decisions that
	// callers of this Store make at the same time go in one go-redis
	// pipeline of at most Batch scripts, at most Pipelines of them in
	// flight at a time, and the takes in it under one limit share one script call where
	// Redis allows (any keys on a standalone server, one key on a Cluster
	// or Ring), as do the multi-takes under the same limits (any buckets
	// on a standalone server, the same buckets on a Cluster or Ring). A lone caller is sent at once, so batching adds no wait;
	// 64 concurrent callers share a few round trips, and Redis spends less
	// time per decision. Each script is still marked not retryable, so a
	// lost pipeline reply fails its decisions once and charges none twice.
	// The pipelines run under no caller's context (each caller still stops
	// waiting when its context ends); the client's read and write timeouts
	// bound them. Default 0: DefaultBatch if the client is a Pipeliner
	// (every go-redis client is), else no batching. 1: no batching, each
	// decision its own round trip. Above 1 the client must be a Pipeliner.
	// Negative is an error.
	Batch int
	// Pipelines is the most pipelines in flight at once with batching,
	// each on a connection of its own. A lone caller's decision is sent at
	// once; while it is in flight, later decisions wait for it to come
	// back, unless 8 or more of them are waiting and fewer than Pipelines
	// are in flight: then they go at once, in a pipeline of their own. So
	// Redis always has work while the client reads a reply, and no
	// pipeline is sent for fewer than 8 decisions but the first. Default 0:
	// DefaultPipelines. 1: one pipeline at a time. Negative is an error;
	// without batching (Batch 1) it has no effect.
	Pipelines int
}

// Store is a sluice.Store in Redis. It is safe for concurrent use and holds
// no state of its own besides its configuration and counters: any number
// of Stores in any number of processes with the same Prefix share the
// buckets. Create one with New.
type Store struct {
	client Client
	prefix string
	conv   sluice.Conversion
	idTTL  int64 // microseconds, >= 1
	minTTL int64 // milliseconds
	now    func() time.Time
	batch  *batcher // nil: one round trip per decision
	spread spread   // where the keys of one call may lie

	loader      loader
	conversions atomic.Uint64
	crossSlot   atomic.Uint64
	lostRefunds atomic.Uint64
}

// spread says which keys one script call may hold.
type spread int

const (
	// anyKeys: a standalone server (a *redis.Client) holds every key.
	anyKeys spread = iota
	// slotKeys: a Redis Cluster; the keys of one call share a slot.
	slotKeys
	// tagKeys: a Ring, or a client the store cannot look into; the keys of
	// one call share a hash tag (one caller's key).
	tagKeys
)

// Stats are a Store's counters since New.
type Stats struct {
	// ScriptLoads is the number of times the store sent the script in
	// full (EVAL) to a server that did not have it cached (its first use,
	// a restart, a failover, SCRIPT FLUSH) and the server answered: once
	// per server for all the callers that met NOSCRIPT there at the same
	// time (the first sends its decision with EVAL, the others wait for it
	// and run the cached script), and again only for a decision that met
	// NOSCRIPT three times.
	ScriptLoads uint64
	// Conversions is the number of takes that found their bucket stored
	// under another limit of its policy and converted it (see
	// Options.OnLimitChange). A steady rate means processes disagree on a
	// policy's limit.
	Conversions uint64
	// Pipelines is the number of pipelines sent with batching, each
	// carrying the decisions that queued while another was in flight; a
	// decision made while nothing was in flight is sent alone and not
	// counted. 0 without batching.
	Pipelines uint64
	// SharedTakes is the number of takes that went in the script call of
	// an earlier take in the same pipeline (same limit; same bucket on a
	// Cluster or Ring), and of multi-takes (TakeAll) that went in the call
	// of an earlier one (the same limits in order; the same buckets on a
	// Cluster or Ring): decided after it, at the same time, with one read
	// and one write of each bucket for all.
	SharedTakes uint64
	// CrossSlotTakes is the number of TakeAll calls whose buckets lay in
	// several Redis Cluster slots (on a Ring, under several keys), decided
	// slot by slot: take, then give back if a later slot denies (see
	// TakeAll). 0 on a standalone server.
	CrossSlotTakes uint64
	// LostRefunds is the number of those calls that a later slot denied
	// (or that failed there) and whose giving back of what the earlier
	// slots took failed: those tokens stay taken, as if used, until the
	// buckets refill. Nothing is ever given twice.
	LostRefunds uint64
}

// Stats returns the store's counters. It is safe to call concurrently.
func (s *Store) Stats() Stats {
	st := Stats{
		ScriptLoads:    s.loader.loads.Load(),
		Conversions:    s.conversions.Load(),
		CrossSlotTakes: s.crossSlot.Load(),
		LostRefunds:    s.lostRefunds.Load(),
	}
	if s.batch != nil {
		st.Pipelines = s.batch.pipelines.Load()
		st.SharedTakes = s.batch.shared.Load()
	}
	return st
}

var (
	_ sluice.Store        = (*Store)(nil)
	_ sluice.Operator     = (*Store)(nil)
	_ sluice.LimitChecker = (*Store)(nil)
)

// New returns a Store deciding in Redis through client. It does no I/O: the
// script is loaded into each Redis server the first time that server is
// asked to run it, and again after the server lost it (restart, failover,
// SCRIPT FLUSH). It refuses, with an error wrapping sluice.ErrInvalidOption
// that names the option, a nil client, a go-redis client whose
// ContextTimeoutEnabled is false (see "Client settings" above), and
// options out of range.
func New(client Client, o Options) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: redisstore: client is nil", sluice.ErrInvalidOption)
	}
	if err := checkClient(client); err != nil {
		return nil, err
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if strings.ContainsAny(o.Prefix, "{}") {
		return nil, fmt.Errorf("%w: redisstore: Options.Prefix %q contains '{' or '}'; the store chooses each key's hash tag itself", sluice.ErrInvalidOption, o.Prefix)
	}
	if err := o.OnLimitChange.Validate(); err != nil {
		return nil, fmt.Errorf("redisstore: Options.OnLimitChange: %w", err)
	}
	const maxIDTTL = maxExact * time.Microsecond
	switch {
	case o.RequestIDTTL < 0 || o.RequestIDTTL > maxIDTTL:
		return nil, fmt.Errorf("%w: redisstore: Options.RequestIDTTL %v is outside [0, %v] (0 for the default of %v; the script counts it in microseconds below 2^53)",
			sluice.ErrInvalidOption, o.RequestIDTTL, maxIDTTL, DefaultRequestIDTTL)
	case o.RequestIDTTL == 0:
		o.RequestIDTTL = DefaultRequestIDTTL
	}
	if o.MinTTL < 0 {
		return nil, fmt.Errorf("%w: redisstore: Options.MinTTL %v is negative; use 0 (no minimum) or a positive duration", sluice.ErrInvalidOption, o.MinTTL)
	}
	sp := tagKeys
	switch client.(type) {
	case *redis.Client:
		sp = anyKeys
	case *redis.ClusterClient:
		sp = slotKeys
	}
	var b *batcher
	p, pipelines := client.(Pipeliner)
	switch {
	case o.Batch < 0:
		return nil, fmt.Errorf("%w: redisstore: Options.Batch %d is negative; use 0 (the default), 1 (no batching) or more", sluice.ErrInvalidOption, o.Batch)
	case o.Batch == 0 && pipelines:
		o.Batch = DefaultBatch
	case o.Batch > 1 && !pipelines:
		return nil, fmt.Errorf("%w: redisstore: Options.Batch %d needs a client with go-redis pipelines (a Pipeliner); %T is not one, so use 0 or 1", sluice.ErrInvalidOption, o.Batch, client)
	}
	switch {
	case o.Pipelines < 0:
		return nil, fmt.Errorf("%w: redisstore: Options.Pipelines %d is negative; use 0 (the default, %d), or 1 or more", sluice.ErrInvalidOption, o.Pipelines, DefaultPipelines)
	case o.Pipelines == 0:
		o.Pipelines = DefaultPipelines
	}
	if o.Batch > 1 {
		// A standalone client (not a Cluster or a Ring, whose keys live
		// on several servers) can send one script call for the takes of
		// several buckets.
		b = &batcher{client: p, max: o.Batch, flights: o.Pipelines, anyKey: sp == anyKeys}
	}
	return &Store{
		batch:  b,
		spread: sp,
		client: client,
		prefix: o.Prefix,
		conv:   o.OnLimitChange,
		idTTL:  ceilDiv(int64(o.RequestIDTTL), int64(time.Microsecond)),
		minTTL: ceilDiv(int64(o.MinTTL), int64(time.Millisecond)),
		now:    o.Now,
	}, nil
}

// Take implements sluice.Store: one script run, which is never retried by
// the client (see docs/redis.md). Parameter errors wrap the sluice
// sentinels and send nothing to Redis; a request ID remembered with other
// parameters is sluice.ErrRequestIDConflict; a value at one of the store's
// keys that Sluice did not write, or a clock outside the store's range, is
// an error wrapping sluice.ErrMisconfigured (a *ScriptError if the script
// raised it), and changed nothing; every other error (Redis unreachable or
// not serving, a timeout, the context done) wraps sluice.ErrUnavailable,
// and the bucket may or may not have been charged if the script was sent.
func (s *Store) Take(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := r.Validate(); err != nil {
		return sluice.Decision{}, err
	}
	pl, err := compile(r.Limit)
	if err != nil {
		return sluice.Decision{}, err
	}
	now, err := s.clock()
	if err != nil {
		return sluice.Decision{}, err
	}
	var keys []string
	idTTL := int64(0)
	if r.RequestID == "" {
		keys = []string{s.bucketKey(r.Policy, r.Key)}
	} else {
		keys = []string{s.bucketKey(r.Policy, r.Key), s.recordKey(r.Policy, r.Key, r.RequestID)}
		idTTL = s.idTTL
	}
	reply, err := s.run(ctx, keys, "take", now, pl, r.Cost, idTTL)
	if err != nil {
		return sluice.Decision{}, err
	}
	if len(reply) == replyLen && reply[0] == kindConflict {
		return sluice.Decision{}, conflict(reply, r)
	}
	d, converted, err := decision(reply, r.Limit)
	if converted {
		s.conversions.Add(1)
	}
	return d, err
}

// Peek implements sluice.Store with the same script in read-only mode: it
// writes nothing, so it neither creates a bucket nor moves a stamp. Its
// errors are Take's.
func (s *Store) Peek(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := r.ValidatePeek(); err != nil {
		return sluice.Decision{}, err
	}
	pl, err := compile(r.Limit)
	if err != nil {
		return sluice.Decision{}, err
	}
	now, err := s.clock()
	if err != nil {
		return sluice.Decision{}, err
	}
	reply, err := s.run(ctx, []string{s.bucketKey(r.Policy, r.Key)}, "peek", now, pl, r.Cost, 0)
	if err != nil {
		return sluice.Decision{}, err
	}
	d, _, err := decision(reply, r.Limit)
	return d, err
}

// clock returns the script's time argument: "redis" for Redis TIME, or the
// explicit time in microseconds since the epoch.
func (s *Store) clock() (any, error) {
	if s.now == nil {
		return "redis", nil
	}
	t := s.now()
	d := t.Sub(time.Unix(epochUnix, 0))
	if d < 0 || d/time.Microsecond > maxExact {
		return nil, fmt.Errorf("%w: redisstore: time %v from Options.Now is outside the store's range (2020-01-01 UTC plus 2^53µs, about 285 years)", sluice.ErrMisconfigured, t)
	}
	return int64(d / time.Microsecond), nil
}

// ceilDiv returns ceil(a/b) for a >= 0, b > 0.
func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 {
		q++
	}
	return q
}
