// Package redisstore is the sluice.Store shared by any number of processes
// through Redis (standalone, Sentinel or Cluster): every decision is one Lua
// script that reads the bucket, refills it, converts it on a limit change,
// decides, writes it back with its expiry and remembers the request ID, in
// one atomic step and one round trip.
//
// The script reproduces sluice.Plan exactly at a tick of one microsecond.
// Lua numbers are doubles, exact only below 2^53, so a limit is accepted only
// if its exact arithmetic stays below that bound (CheckLimit); every other
// valid limit is refused with sluice.ErrInvalidLimit, never approximated.
//
// Time comes from Redis TIME by default, one clock for every instance; a
// bucket's stamp never moves back, so a server clock that steps back (a
// failover to a host with a slower clock) refills nothing. Options.Now passes
// time explicitly instead, for tests and simulations.
//
// A bucket key expires when its bucket is full again, which is lossless:
// a missing bucket starts full. Give the decision path a client that never
// retries a command on its own (a reply lost after the script ran would
// charge twice): the Store marks its commands as not retryable for go-redis,
// and docs/redis.md gives the client settings and deployment advice.
package redisstore

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice"
)

// script is the decision script; New computes its SHA-1 digest for EVALSHA.
//
//go:embed bucket.lua
var script string

// Defaults for the zero Options.
const (
	// DefaultPrefix starts every key of a Store whose Options.Prefix is
	// empty.
	DefaultPrefix = "sluice:"
	// DefaultRequestIDTTL is how long the first decision of a request ID is
	// remembered when Options.RequestIDTTL is zero.
	DefaultRequestIDTTL = 5 * time.Minute
	// DefaultBatch is the most decisions sent together when Options.Batch
	// is zero and the client has pipelines.
	DefaultBatch = 64
)

// epochUnix is the store's time zero, 2020-01-01T00:00:00Z, in seconds since
// 1970. Times are microseconds since it, below 2^53: until the year 2305.
const epochUnix = 1577836800

// Bounds of Lua's exact integers.
const (
	maxExact  = 1<<53 - 1 // the largest integer every double below it is exact
	limitBits = 52        // C*p' and n' must be below 2^limitBits
)

// Client is what a Store needs of a go-redis client. *redis.Client,
// *redis.ClusterClient, *redis.Ring and every redis.UniversalClient satisfy
// it.
type Client interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// Options configure a Store. The zero value of every field means its
// documented default.
type Options struct {
	// Prefix starts every key the store writes. Default DefaultPrefix
	// ("sluice:"). It must not contain '{' or '}': the store puts a hash tag
	// of its own after it, so that a bucket and its request IDs share a
	// Redis Cluster slot, and user keys cannot choose the slot.
	Prefix string
	// OnLimitChange converts a bucket's level when a request arrives with a
	// limit other than the one the bucket was last decided under. Default
	// sluice.KeepTokens.
	OnLimitChange sluice.Conversion
	// RequestIDTTL is how long the first decision of a request ID is
	// remembered, rounded up to a microsecond. Default DefaultRequestIDTTL
	// (5 minutes). Negative is an error.
	RequestIDTTL time.Duration
	// Now, when set, is the clock, read once per call and passed to the
	// script: for tests and simulations. Every store sharing keys must then
	// read the same clock. Default nil: the script reads Redis TIME, one
	// clock for every instance, which is what production wants. Times are
	// counted in whole microseconds since 2020-01-01 UTC; a time before that
	// or after the year 2305 fails the call.
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
	// pipeline of at most Batch scripts, one pipeline in flight at a time,
	// and the takes in it under one limit share one script call where
	// Redis allows (any keys on a standalone server, one key on a Cluster
	// or Ring). A lone caller is sent at once, so batching adds no wait;
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
}

// Store is a sluice.Store in Redis. It is safe for concurrent use and holds
// no state of its own besides its configuration: any number of Stores in any
// number of processes with the same Prefix share the buckets. Create one
// with New.
type Store struct {
	client Client
	prefix string
	policy sluice.Conversion
	idTTL  int64 // microseconds, >= 1
	minTTL int64 // milliseconds
	now    func() time.Time
	sha    string
	batch  *batcher // nil: one round trip per decision

	scriptLoads atomic.Uint64
}

// Stats are a Store's counters since New.
type Stats struct {
	// ScriptLoads is the number of times a server did not have the script
	// cached (its first use, a restart, a failover, SCRIPT FLUSH) and the
	// store sent it in full with EVAL.
	ScriptLoads uint64
	// Pipelines is the number of pipelines sent with batching, each
	// carrying the decisions that queued while another was in flight; a
	// decision made while nothing was in flight is sent alone and not
	// counted. 0 without batching.
	Pipelines uint64
	// SharedTakes is the number of takes that went in the script call of
	// an earlier take in the same pipeline (same bucket, same limit):
	// decided after it, at the same time, with one read and one write of
	// the bucket for all.
	SharedTakes uint64
}

// Stats returns the store's counters. It is safe to call concurrently.
func (s *Store) Stats() Stats {
	st := Stats{ScriptLoads: s.scriptLoads.Load()}
	if s.batch != nil {
		st.Pipelines = s.batch.pipelines.Load()
		st.SharedTakes = s.batch.shared.Load()
	}
	return st
}

var _ sluice.Store = (*Store)(nil)

// New returns a Store deciding in Redis through client. It checks the
// options (a Prefix with '{' or '}', an unknown OnLimitChange or a negative
// duration is an error) and does no I/O: the script is loaded into each
// Redis server the first time that server is asked to run it, and again
// after the server lost it (restart, failover, SCRIPT FLUSH).
func New(client Client, o Options) (*Store, error) {
	if client == nil {
		return nil, errors.New("redisstore: client is nil")
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if strings.ContainsAny(o.Prefix, "{}") {
		return nil, fmt.Errorf("redisstore: prefix %q contains '{' or '}'; the store chooses each key's hash tag itself", o.Prefix)
	}
	if o.OnLimitChange > sluice.ResetTokens {
		return nil, fmt.Errorf("redisstore: limit-change policy %v is unknown; use sluice.KeepTokens, ScaleTokens or ResetTokens", o.OnLimitChange)
	}
	if o.RequestIDTTL < 0 {
		return nil, fmt.Errorf("redisstore: request-ID TTL %v is negative", o.RequestIDTTL)
	}
	if o.RequestIDTTL == 0 {
		o.RequestIDTTL = DefaultRequestIDTTL
	}
	if o.MinTTL < 0 {
		return nil, fmt.Errorf("redisstore: minimum TTL %v is negative", o.MinTTL)
	}
	var b *batcher
	p, pipelines := client.(Pipeliner)
	switch {
	case o.Batch < 0:
		return nil, fmt.Errorf("redisstore: batch size %d is negative", o.Batch)
	case o.Batch == 0 && pipelines:
		o.Batch = DefaultBatch
	case o.Batch > 1 && !pipelines:
		return nil, fmt.Errorf("redisstore: batch size %d needs a client with go-redis pipelines (a Pipeliner); %T is not one", o.Batch, client)
	}
	if o.Batch > 1 {
		// A standalone client (not a Cluster or a Ring, whose keys live
		// on several servers) can send one script call for the takes of
		// several buckets.
		_, anyKey := client.(*redis.Client)
		b = &batcher{client: p, max: o.Batch, anyKey: anyKey}
	}
	sum := sha1.Sum([]byte(script))
	return &Store{
		batch:  b,
		client: client,
		prefix: o.Prefix,
		policy: o.OnLimitChange,
		idTTL:  ceilDiv(int64(o.RequestIDTTL), int64(time.Microsecond)),
		minTTL: ceilDiv(int64(o.MinTTL), int64(time.Millisecond)),
		now:    o.Now,
		sha:    hex.EncodeToString(sum[:]),
	}, nil
}

// plan is a limit prepared for the script: the rate n per P microseconds
// reduced by their gcd to n1 per p1, as sluice.NewPlan does at a 1µs tick.
type plan struct {
	c, n, p, n1, p1 int64
}

// CheckLimit reports whether a Store can decide l exactly: l is valid, its
// period is a whole number of microseconds, and, with the rate n per P
// reduced by gcd(n, P µs) to n' per p', capacity × p' is below 2^52 (so
// every intermediate of the script stays below 2^53, where Lua's doubles
// stop being exact). For example, 1000 tokens a minute (p' = 60,000µs)
// allows a capacity up to 75 billion; one token every 366 days, a capacity
// up to 142; a capacity of 2^40 needs p' below 4096µs. The error wraps
// sluice.ErrInvalidLimit and names the bound.
func CheckLimit(l sluice.Limit) error {
	_, err := compile(l)
	return err
}

func compile(l sluice.Limit) (plan, error) {
	if err := l.Validate(); err != nil {
		return plan{}, err
	}
	if l.Rate.Period%time.Microsecond != 0 {
		return plan{}, fmt.Errorf("%w: period %v is not a whole number of microseconds, the Redis store's time unit", sluice.ErrInvalidLimit, l.Rate.Period)
	}
	pl := plan{c: l.Capacity, n: l.Rate.Tokens, p: int64(l.Rate.Period / time.Microsecond), n1: 0, p1: 1}
	if pl.n > 0 {
		g := gcd(pl.n, pl.p)
		pl.n1, pl.p1 = pl.n/g, pl.p/g
	}
	if hi, lo := bits.Mul64(uint64(pl.c), uint64(pl.p1)); hi != 0 || lo >= 1<<limitBits {
		return plan{}, fmt.Errorf("%w: Redis cannot decide limit %q exactly: capacity %d × reduced period %dµs (the period over gcd(tokens, period)) must be below 2^52, the range of Lua's exact integers; lower the capacity or use a period with more tokens in common",
			sluice.ErrInvalidLimit, l, pl.c, pl.p1)
	}
	if pl.n1 >= 1<<limitBits {
		return plan{}, fmt.Errorf("%w: Redis cannot decide limit %q exactly: reduced rate tokens %d must be below 2^52", sluice.ErrInvalidLimit, l, pl.n1)
	}
	return pl, nil
}

// Take implements sluice.Store: one script run, which is never retried by
// the client (see docs/redis.md). Parameter errors wrap the sluice sentinels
// and send nothing to Redis; a request ID remembered with other parameters
// is sluice.ErrRequestIDConflict; any other error (Redis unreachable, the
// context done, a foreign value at a bucket's key, a time outside the
// store's range) is returned wrapped, and the bucket may or may not have
// been charged if the error came after the script was sent.
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
		keys = []string{s.bucketKey(r.Key)}
	} else {
		keys = []string{s.bucketKey(r.Key), s.recordKey(r.Key, r.RequestID)}
		idTTL = s.idTTL
	}
	reply, err := s.run(ctx, keys, "take", now, pl, r.Cost, idTTL)
	if err != nil {
		return sluice.Decision{}, err
	}
	if len(reply) == 5 && reply[0] == "conflict" {
		return sluice.Decision{}, fmt.Errorf("%w: request ID %q for this key was first used with cost %v and limit \"%v %v/%vµs\", now cost %d and limit %q",
			sluice.ErrRequestIDConflict, r.RequestID, reply[1], reply[2], reply[3], reply[4], r.Cost, r.Limit)
	}
	return decision(reply, r.Limit)
}

// Peek implements sluice.Store with the same script in read-only mode: it
// writes nothing, so it neither creates a bucket nor moves a stamp.
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
	reply, err := s.run(ctx, []string{s.bucketKey(r.Key)}, "peek", now, pl, r.Cost, 0)
	if err != nil {
		return sluice.Decision{}, err
	}
	return decision(reply, r.Limit)
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
		return nil, fmt.Errorf("redisstore: time %v is outside the store's range (2020-01-01 UTC plus 2^53µs, about 285 years)", t)
	}
	return int64(d / time.Microsecond), nil
}

// decisionCmd is an EVALSHA or EVAL that go-redis must never send twice on
// its own: if the reply is lost after the script ran, a second run would
// charge the bucket again. NOSCRIPT, which means the script did not run, is
// handled by Store.run.
type decisionCmd struct{ *redis.Cmd }

// NoRetry tells go-redis not to retry the command.
func (decisionCmd) NoRetry() bool { return true }

// spec returns the script's spec argument for limit pl under the store's
// settings (see bucket.lua).
func (s *Store) spec(pl plan) string {
	return specArg(pl, int64(s.policy), s.minTTL)
}

// specLen is the length of a spec argument.
const specLen = 38

// specArg encodes a spec as the script reads it,
// struct.unpack('<I6I6I6I6I6BI7'): C, n, P, n', p' as little-endian
// unsigned integers of 6 bytes, the limit-change policy as 1 and the least
// TTL in milliseconds as 7. A bucket's value starts with the spec it was
// written under.
func specArg(pl plan, policy, leastTTL int64) string {
	var b [specLen]byte
	i := 0
	put := func(v int64, size int) {
		for range size {
			b[i] = byte(v)
			v >>= 8
			i++
		}
	}
	for _, v := range [...]int64{pl.c, pl.n, pl.p, pl.n1, pl.p1} {
		put(v, 6)
	}
	put(policy, 1)
	put(leastTTL, 7)
	return string(b[:])
}

// run runs the script by EVALSHA, and by EVAL if the server does not have it
// cached, and returns its reply as go-redis read it (see bucket.lua).
func (s *Store) run(ctx context.Context, keys []string, op string, now any, pl plan, cost, idTTL int64) ([]any, error) {
	args := make([]any, 0, 3+len(keys)+5)
	args = append(args, "evalsha", s.sha, len(keys))
	for _, k := range keys {
		args = append(args, k)
	}
	args = append(args, op, now, s.spec(pl), cost)
	if idTTL > 0 {
		args = append(args, idTTL)
	}
	cmd, err := s.send(ctx, args)
	if err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT")) {
		s.scriptLoads.Add(1)
		args[0], args[1] = "eval", script
		cmd, err = s.send(ctx, args)
	}
	if err != nil {
		if isScriptError(err) {
			return nil, &ScriptError{err: err}
		}
		return nil, fmt.Errorf("redisstore: %w", err)
	}
	reply, err := cmd.Slice()
	if err != nil {
		return nil, &ScriptError{err: fmt.Errorf("reply: %w", err)}
	}
	return reply, nil
}

// Resending a command that Redis refused without running it.
// The pauses add up to about a second; the caller's context can cut them
// short.
const (
	maxResends  = 24
	firstResend = time.Millisecond
	maxResend   = 50 * time.Millisecond
)

// send sends a script command, and sends it again, up to maxResends times
// with a doubling pause, while Redis answers with an error that says it did
// not run it (see refusedUnrun) and ctx allows: a resend of such a command
// cannot charge twice. Every other outcome is returned at once.
func (s *Store) send(ctx context.Context, args []any) (decisionCmd, error) {
	pause := firstResend
	for resends := 0; ; resends++ {
		cmd := decisionCmd{redis.NewCmd(ctx, args...)}
		err := s.process(ctx, cmd)
		if err == nil || resends == maxResends || !refusedUnrun(err) {
			return cmd, err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return cmd, err
		case <-t.C:
		}
		pause = min(2*pause, maxResend)
	}
}

// refusedUnrun reports whether err is an error reply with which Redis
// refuses a command before running it: another script is running past
// busy-reply-threshold (BUSY), the server is loading its data (LOADING), a
// slot is migrating under a multi-key command (TRYAGAIN), the cluster or
// the master is down (CLUSTERDOWN, MASTERDOWN).
func refusedUnrun(err error) bool {
	for _, p := range []string{"BUSY ", "LOADING ", "TRYAGAIN ", "CLUSTERDOWN ", "MASTERDOWN "} {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	return false
}

// ScriptError is an error raised by the decision script, or a reply of it
// the store could not read: the script ran (or was refused by its own
// argument checks) and wrote nothing it should not have, but no decision
// came of it. A foreign value at a bucket's key (WRONGTYPE) is one cause.
// Its ScriptError method lets metrics classify it without importing this
// package.
type ScriptError struct{ err error }

func (e *ScriptError) Error() string { return "redisstore: script: " + e.err.Error() }

// Unwrap returns the underlying error (a go-redis error reply, or a reply
// parse error).
func (e *ScriptError) Unwrap() error { return e.err }

// ScriptError marks the error as the script's.
func (*ScriptError) ScriptError() {}

// isScriptError reports whether err is an error reply raised inside the
// script: by its own argument checks ("ERR sluice: ...") or by Redis while
// running it (Redis 7 ends those with "script: <sha>, on @user_script:<line>.";
// Redis 6 writes "@user_script:<line>:" in them).
func isScriptError(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	return strings.HasPrefix(msg, "ERR sluice:") || strings.Contains(msg, "user_script")
}

// Positions in the arguments of a script command built by run.
const (
	argKeys = 3 // the first key
	// With one key:
	argOp   = 4
	argCost = 7
	argN    = 8 // the number of arguments
)

// shareID returns, for a take without a request ID sent by EVALSHA, what
// identifies the takes that may share one script call with it: its
// arguments but the cost (the limit, the time argument and the settings)
// and, unless anyKey, the bucket. Other commands share nothing.
func shareID(args []any, anyKey bool) (string, bool) {
	if len(args) != argN || args[0] != "evalsha" || args[2] != 1 || args[argOp] != "take" {
		return "", false
	}
	b := make([]byte, 0, 128)
	for i, a := range args[argKeys:] {
		if i := argKeys + i; i == argCost || (i == argKeys && anyKey) {
			continue
		}
		switch a := a.(type) {
		case string:
			b = append(b, a...)
		case int64:
			b = strconv.AppendInt(b, a, 10)
		default:
			b = fmt.Append(b, a)
		}
		b = append(b, 0)
	}
	return string(b), true
}

// sharedArgs returns the arguments of one "takes" script call for the
// takes of args, each a take that shareID accepted with the same identity.
func sharedArgs(args [][]any) []any {
	first := args[0]
	out := make([]any, 0, argN+2*len(args))
	out = append(out, first[0], first[1], len(args))
	for _, a := range args {
		out = append(out, a[argKeys])
	}
	out = append(out, "takes")
	out = append(out, first[argOp+1:]...)
	for _, a := range args[1:] {
		out = append(out, a[argCost])
	}
	return out
}

// process sends cmd on its own, or in the next pipeline when batching.
func (s *Store) process(ctx context.Context, cmd decisionCmd) error {
	if s.batch != nil {
		return s.batch.process(ctx, cmd)
	}
	return s.client.Process(ctx, cmd)
}

// decision reads an "ok" or "replay" reply of the script: the kind, then
// four integers (allowed, remaining, and the waits in microseconds, -1 for
// never).
func decision(reply []any, l sluice.Limit) (sluice.Decision, error) {
	if len(reply) == 5 {
		kind, _ := reply[0].(string)
		allowed, ok1 := reply[1].(int64)
		remaining, ok2 := reply[2].(int64)
		retry, ok3 := wait(reply[3])
		reset, ok4 := wait(reply[4])
		if (kind == "ok" || kind == "replay") && ok1 && (allowed == 0 || allowed == 1) && ok2 && remaining >= 0 && ok3 && ok4 {
			return sluice.Decision{
				Allowed:    allowed == 1,
				Remaining:  remaining,
				RetryAfter: retry,
				ResetAfter: reset,
				Limit:      l,
				Replayed:   kind == "replay",
			}, nil
		}
	}
	return sluice.Decision{}, &ScriptError{err: fmt.Errorf("reply %v is not a decision", reply)}
}

// wait reads a wait in microseconds, -1 for never.
func wait(v any) (time.Duration, bool) {
	us, ok := v.(int64)
	switch {
	case !ok || us < -1:
		return 0, false
	case us == -1 || us > math.MaxInt64/int64(time.Microsecond):
		return sluice.Never, true
	}
	return time.Duration(us) * time.Microsecond, true
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// ceilDiv returns ceil(a/b) for a >= 0, b > 0.
func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 {
		q++
	}
	return q
}
