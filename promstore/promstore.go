// Package promstore records what a limiter does as Prometheus metrics, in a
// registry the caller supplies (never the global one):
//
//   - New wraps any sluice.Store and counts its decisions by policy,
//     operation (take, peek, and those of sluice.Operator: take_all,
//     drain, refund, reset) and result, multi-takes as a whole, drained
//     and refunded tokens by policy, replays, errors by kind, the
//     remaining tokens as a fraction of the capacity, and the latency
//     callers see.
//   - GuardHooks returns the guard.Hooks that record what a guard.Store
//     does behind that: store latency and errors by kind, degraded
//     decisions by failure mode and reason, breaker state and transitions.
//   - RegisterMemstore exports a memstore.Store's counters: live buckets,
//     evictions by reason, refused keys, limit conversions.
//
// The counters of the shared stores are exported by subpackages, so that a
// program compiles a Redis or PostgreSQL client only if it uses one:
// redisprom.Register for a redisstore.Store's (script loads), and
// pgprom.Register for a pgstore.Store's (sweeps, row-lock waits, lock
// timeouts). This package imports neither store, nor go-redis, nor pgx: Kind
// recognises their errors by their methods.
//
// No metric has a label per key or per user. Decisions are labelled by the
// request's policy name, which the operator chooses (a handful of quotas),
// and at most Options.MaxPolicies names get series of their own: the number
// of series is bounded, whatever the traffic. Metric names and labels are
// listed in docs/failure.md. The library's other packages do not import
// Prometheus; only a program that imports this one compiles it.
//
// Wire a guarded Redis store like this:
//
//	hooks, err := promstore.GuardHooks(reg, promstore.Options{})
//	g, err := guard.New(redisStore, guard.Options{FailureMode: guard.FailLocal, LocalDivisor: 4, Hooks: hooks})
//	store, err := promstore.New(g, reg, promstore.Options{})
//	err = redisprom.Register(reg, promstore.Options{}, redisStore.Stats)
package promstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/guard"
)

// DefaultNamespace starts every metric name when Options.Namespace is
// empty.
const DefaultNamespace = "sluice"

// DefaultMaxPolicies is the number of policy names that get decision series
// of their own when Options.MaxPolicies is zero.
const DefaultMaxPolicies = 64

// OtherPolicies is the policy label of the decisions whose policy name got
// no series of its own: names beyond Options.MaxPolicies, and names that
// are not valid (sluice.ValidatePolicy). It has a space, so it is never a
// valid policy name itself.
const OtherPolicies = "(other policies)"

// Results of a decision, the values of the result label.
const (
	ResultAllowed         = "allowed"
	ResultDenied          = "denied"
	ResultDegradedAllowed = "degraded_allowed"
	ResultDegradedDenied  = "degraded_denied"
	ResultError           = "error"
)

// Kinds of error, the values of the kind label (see Kind).
const (
	KindInvalid       = "invalid"
	KindRefused       = "refused"
	KindMisconfigured = "misconfigured"
	KindCanceled      = "canceled"
	KindTimeout       = "timeout"
	KindUnavailable   = "unavailable"
	KindScript        = "script"
	KindServer        = "server"
	KindBreakerOpen   = "breaker_open"
	KindStalled       = "stalled"
	KindUnsupported   = "unsupported"
	KindOther         = "other"
)

// Options configure the metrics. The zero value of every field means its
// documented default.
type Options struct {
	// Namespace starts every metric name, as in sluice_decisions_total.
	// Default DefaultNamespace ("sluice").
	Namespace string
	// ConstLabels are added to every metric: for example {"limiter":
	// "login"} to tell apart several limiters in one registry, which
	// then must all use the same label names (Prometheus allows one set
	// of label names per metric name). Default none.
	ConstLabels prometheus.Labels
	// DurationBuckets are the upper bounds, in seconds, of the latency
	// histograms. Default 100µs to 1s: .0001, .00025, .0005, .001, .0025,
	// .005, .01, .025, .05, .1, .25, 1.
	DurationBuckets []float64
	// RemainingBuckets are the upper bounds of the remaining-fraction
	// histogram. Default 0, .05, .1, .25, .5, .75, .9, 1.
	RemainingBuckets []float64
	// Kind classifies errors for the kind label; it may return "" to fall
	// back to the built-in Kind. Use it for errors Kind does not know, such
	// as the sentinels of a store of your own. Default nil: Kind alone.
	// Keep the set of values it returns small and fixed.
	Kind func(error) string
	// MaxPolicies bounds the policy names that get decision series of
	// their own (New): the first MaxPolicies valid names seen; the
	// decisions of any other name are counted under OtherPolicies. Each
	// name costs ten series (take and peek), and 22 more once it is used
	// with TakeAll, Drain, Refund or Reset (their decisions, drained and
	// refunded tokens). Default DefaultMaxPolicies (64); negative is
	// refused.
	MaxPolicies int
}

// check fills in the defaults of o, or returns an error wrapping
// sluice.ErrInvalidOption that names the first option out of range.
func (o *Options) check() error {
	if o.MaxPolicies < 0 {
		return fmt.Errorf("%w: promstore option MaxPolicies is %d; use 0 for the default (%d) or a positive bound", sluice.ErrInvalidOption, o.MaxPolicies, DefaultMaxPolicies)
	}
	for _, b := range []struct {
		name string
		v    []float64
	}{{"DurationBuckets", o.DurationBuckets}, {"RemainingBuckets", o.RemainingBuckets}} {
		for i := 1; i < len(b.v); i++ {
			if !(b.v[i-1] < b.v[i]) {
				return fmt.Errorf("%w: promstore option %s %v is not strictly increasing (%v, then %v); list the upper bounds in increasing order, or none for the default", sluice.ErrInvalidOption, b.name, b.v, b.v[i-1], b.v[i])
			}
		}
	}
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if len(o.DurationBuckets) == 0 {
		o.DurationBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1}
	}
	if len(o.RemainingBuckets) == 0 {
		o.RemainingBuckets = []float64{0, .05, .1, .25, .5, .75, .9, 1}
	}
	if o.MaxPolicies == 0 {
		o.MaxPolicies = DefaultMaxPolicies
	}
	return nil
}

// kind classifies err with o.Kind, then Kind.
func (o *Options) kind(err error) string {
	if o.Kind != nil {
		if k := o.Kind(err); k != "" {
			return k
		}
	}
	return Kind(err)
}

// redisError is what go-redis's error replies (redis.Error) implement; it
// is matched by method so that this package need not import go-redis.
type redisError interface {
	error
	RedisError()
}

// scriptError is what redisstore's errors raised by or about its Lua script
// implement (a script runtime error reply, a reply that is not a
// decision); it is matched by method, like redisError.
type scriptError interface {
	error
	ScriptError()
}

// sqlError is what PostgreSQL errors implement (pgx's *pgconn.PgError); it
// is matched by method, like redisError.
type sqlError interface {
	error
	SQLState() string
}

// SQLSTATE codes and classes Kind tells apart; the others are "server".
const (
	sqlLockNotAvailable = "55P03" // lock_timeout expired
	sqlQueryCanceled    = "57014" // statement_timeout expired (or a cancel request, which pgx does not send for a context)
	sqlConnection       = "08"    // class: connection exception
	sqlShutdown         = "57P0"  // 57P01 admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now, ...
)

// Kind classifies an error of a sluice.Store, or the cause of a degraded
// decision, for the kind label:
//
//   - "invalid": bad parameters (sluice.IsInvalid: ErrInvalidPolicy,
//     ErrInvalidKey, ErrInvalidCost, ErrInvalidLimit, ErrInvalidRequestID,
//     ErrRequestIDConflict, ErrUnknownRequestID, ErrInvalidMulti);
//   - "refused": sluice.ErrTooManyKeys;
//   - "misconfigured": sluice.ErrMisconfigured (the store answered, but is
//     not set up for Sluice: a schema never migrated, a foreign value at
//     one of its keys);
//   - "unsupported": errors.ErrUnsupported (an operation of
//     sluice.Operator asked of a store that does not implement it);
//   - "breaker_open": guard.ErrBreakerOpen (no store call was made);
//   - "stalled": guard.ErrStalled (no store call was made: too many are
//     still running past their deadline);
//   - "timeout": guard.ErrTimeout, a deadline, a network timeout, or a
//     PostgreSQL lock or statement timeout (SQLSTATE 55P03
//     lock_not_available, 57014 query_canceled);
//   - "canceled": context.Canceled (the caller gave up);
//   - "script": the store's script failed or answered with something other
//     than a decision: an error in whose chain a value has a ScriptError()
//     method, as redisstore's script errors do;
//   - "unavailable": the server could not be reached or the connection
//     broke (refused, reset, closed, EOF), or PostgreSQL reported so:
//     SQLSTATE class 08 (connection exception) or 57P01 to 57P05 (admin
//     or crash shutdown, cannot connect now, database dropped, idle
//     session timeout);
//   - "server": the store's server answered with another error: a Redis
//     error reply (OOM, READONLY, LOADING, CLUSTERDOWN...), a PostgreSQL
//     error with any other SQLSTATE (a serialization failure, too many
//     connections...);
//   - "unavailable" again for any other error wrapping
//     sluice.ErrUnavailable, whose cause none of the above recognised;
//   - "other": anything else.
//
// The first that matches, in this order, is the kind. Errors are matched
// anywhere in their chain (errors.Is, errors.As), so sluice.ErrUnavailable,
// which the shared stores wrap their failures in, does not hide their
// cause: a lock timeout it wraps is a "timeout", a READONLY reply a
// "server" error. Redis error replies are recognised by a RedisError()
// method, PostgreSQL errors by a SQLState() string method (*pgconn.PgError
// has one), so that this package imports neither client. It returns "" for
// a nil error.
func Kind(err error) string {
	var (
		netErr    net.Error
		scriptErr scriptError
		redisErr  redisError
		sqlErr    sqlError
		opErr     *net.OpError
	)
	switch {
	case err == nil:
		return ""
	case sluice.IsInvalid(err):
		return KindInvalid
	case errors.Is(err, sluice.ErrTooManyKeys):
		return KindRefused
	case errors.Is(err, sluice.ErrMisconfigured):
		return KindMisconfigured
	case errors.Is(err, errors.ErrUnsupported):
		return KindUnsupported
	case errors.Is(err, guard.ErrBreakerOpen):
		return KindBreakerOpen
	case errors.Is(err, guard.ErrStalled):
		return KindStalled
	case errors.Is(err, guard.ErrTimeout), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout(),
		errors.As(err, &sqlErr) && sqlKind(sqlErr.SQLState()) == KindTimeout:
		return KindTimeout
	case errors.Is(err, context.Canceled):
		return KindCanceled
	case errors.As(err, &scriptErr):
		return KindScript
	case errors.As(err, &opErr), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, net.ErrClosed), errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return KindUnavailable
	case errors.As(err, &redisErr):
		return KindServer
	case errors.As(err, &sqlErr):
		return sqlKind(sqlErr.SQLState())
	case errors.Is(err, sluice.ErrUnavailable):
		return KindUnavailable
	}
	return KindOther
}

// sqlKind classifies a PostgreSQL error by its SQLSTATE code: "timeout",
// "unavailable" or "server".
func sqlKind(code string) string {
	switch {
	case code == sqlLockNotAvailable, code == sqlQueryCanceled:
		return KindTimeout
	case strings.HasPrefix(code, sqlConnection), strings.HasPrefix(code, sqlShutdown):
		return KindUnavailable
	}
	return KindServer
}

// errNilStats is the error of RegisterMemstore given no stats function.
var errNilStats = fmt.Errorf("%w: promstore: the stats function is nil; pass the store's Stats method", sluice.ErrInvalidOption)

// register registers every collector with reg, or none: on an error it
// unregisters those it had registered.
func register(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	if reg == nil {
		return fmt.Errorf("%w: promstore: the registerer is nil; pass one explicitly (the global registry is never used)", sluice.ErrInvalidOption)
	}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			return err
		}
	}
	return nil
}

// ops are the operations, in the order of their guard.Op values.
var ops = [...]guard.Op{guard.OpTake, guard.OpPeek, guard.OpTakeAll, guard.OpDrain, guard.OpRefund, guard.OpReset}

// Store is a sluice.Store that records the decisions of another store, and
// a sluice.Operator whose operations work if that store is one. It is safe
// for concurrent use if the wrapped store is. Create one with New.
type Store struct {
	next sluice.Store
	ops  sluice.Operator // next, if it is one; else nil
	o    Options

	decisions *prometheus.CounterVec // policy, op, result
	drained   *prometheus.CounterVec // policy
	refunded  *prometheus.CounterVec // policy
	policies  sync.Map               // policy name → *policyCounters
	mu        sync.Mutex             // held to add a policy
	named     int                    // policies with series of their own (mu)
	other     atomic.Pointer[policyCounters]

	errors    *prometheus.CounterVec        // op, kind
	duration  [len(ops)]prometheus.Observer // [op]
	multi     [5]prometheus.Counter         // [result]
	remaining prometheus.Observer
	replays   prometheus.Counter
}

// policyCounters are the counters of one policy label: those of Take and
// Peek from its first decision, those of the other operations from its
// first call of one of them.
type policyCounters struct {
	policy string
	basic  [2][5]prometheus.Counter // [op][result] of take, peek
	more   atomic.Pointer[opCounters]
}

// opCounters are a policy's counters of the operations beyond Take and
// Peek.
type opCounters struct {
	decisions         [len(ops) - 2][5]prometheus.Counter // [op-2][result]
	drained, refunded prometheus.Counter
}

var (
	_ sluice.Operator     = (*Store)(nil)
	_ sluice.LimitChecker = (*Store)(nil)
	_ guard.NonBlocking   = (*Store)(nil)
)

var results = [5]string{ResultAllowed, ResultDenied, ResultDegradedAllowed, ResultDegradedDenied, ResultError}

// Indexes of results.
const (
	resAllowed = iota
	resDenied
	resDegradedAllowed
	resDegradedDenied
	resError
)

// New registers the decision metrics with reg and returns a Store that
// records them for every call to next:
//
//   - <ns>_decisions_total{policy, op, result}: counter; policy the
//     request's policy name (or OtherPolicies, see Options.MaxPolicies),
//     op "take", "peek", "take_all", "drain", "refund" or "reset", result
//     "allowed", "denied", "degraded_allowed", "degraded_denied" or
//     "error". A TakeAll counts once per request, under its policy, by
//     whether its bucket covered its cost (Parts[i].Allowed: "allowed"
//     even when another bucket denied the whole); a Drain is "allowed" if
//     all of its cost was there; a Refund or Reset that was made is
//     "allowed".
//   - <ns>_take_all_decisions_total{result}: counter of TakeAll calls by
//     the result of the whole.
//   - <ns>_drained_tokens_total{policy}: counter of the tokens drains took
//     (Decision.Taken), degraded decisions included (FailLocal's come from
//     the local bucket; FailOpen's and FailClosed's take none).
//   - <ns>_refunded_tokens_total{policy}: counter of the tokens refunds
//     gave back (minus Decision.Taken).
//   - <ns>_errors_total{op, kind}: counter of errors returned to the
//     caller, by Kind.
//   - <ns>_decision_duration_seconds{op}: histogram of the time a call
//     took, as the caller saw it.
//   - <ns>_remaining_ratio: histogram of Remaining / Capacity after each
//     take, each part of a multi-take and each drain decided by the store
//     (not degraded, not an error).
//   - <ns>_replays_total: counter of replayed decisions (request IDs of
//     takes and refunds).
//
// The take and peek series of a policy appear with its first decision;
// those of the other operations, and its token counters, with its first
// call of one of them. It returns an error, and registers nothing, if next
// or reg is nil or an option is out of range (errors wrapping
// sluice.ErrInvalidOption), or if reg refuses a collector (the same names
// and labels registered twice). If next does not implement
// sluice.Operator, the Store's operations beyond Take and Peek return an
// error wrapping errors.ErrUnsupported (counted, of kind "unsupported").
func New(next sluice.Store, reg prometheus.Registerer, o Options) (*Store, error) {
	if next == nil {
		return nil, fmt.Errorf("%w: promstore: the store is nil", sluice.ErrInvalidOption)
	}
	if err := o.check(); err != nil {
		return nil, err
	}
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: o.Namespace, Name: "decisions_total", ConstLabels: o.ConstLabels,
		Help: "Decisions by policy, operation (take, peek, take_all, drain, refund, reset) and result (allowed, denied, degraded_allowed, degraded_denied, error); a multi-take counts once per bucket.",
	}, []string{"policy", "op", "result"})
	multi := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: o.Namespace, Name: "take_all_decisions_total", ConstLabels: o.ConstLabels,
		Help: "Multi-takes (TakeAll) by result (allowed, denied, degraded_allowed, degraded_denied, error), once per call.",
	}, []string{"result"})
	drained := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: o.Namespace, Name: "drained_tokens_total", ConstLabels: o.ConstLabels,
		Help: "Tokens taken by drains, by policy (Decision.Taken).",
	}, []string{"policy"})
	refunded := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: o.Namespace, Name: "refunded_tokens_total", ConstLabels: o.ConstLabels,
		Help: "Tokens given back by refunds, by policy (minus Decision.Taken).",
	}, []string{"policy"})
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: o.Namespace, Name: "errors_total", ConstLabels: o.ConstLabels,
		Help: "Errors returned to callers, by operation and kind (invalid, refused, misconfigured, unsupported, canceled, timeout, unavailable, script, server, other).",
	}, []string{"op", "kind"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: o.Namespace, Name: "decision_duration_seconds", ConstLabels: o.ConstLabels,
		Help:    "Time a call took, as the caller saw it, by operation, in seconds.",
		Buckets: o.DurationBuckets,
	}, []string{"op"})
	remaining := prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: o.Namespace, Name: "remaining_ratio", ConstLabels: o.ConstLabels,
		Help:    "Tokens remaining after a take, a multi-take's bucket or a drain decided by the store, as a fraction of the capacity.",
		Buckets: o.RemainingBuckets,
	})
	replays := prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: o.Namespace, Name: "replays_total", ConstLabels: o.ConstLabels,
		Help: "Decisions replayed for a repeated request ID (takes and refunds); they consumed or gave back nothing.",
	})
	if err := register(reg, decisions, multi, drained, refunded, errs, duration, remaining, replays); err != nil {
		return nil, err
	}
	s := &Store{next: next, o: o, decisions: decisions, drained: drained, refunded: refunded, errors: errs, remaining: remaining, replays: replays}
	s.ops, _ = next.(sluice.Operator)
	for i, res := range results {
		s.multi[i] = multi.WithLabelValues(res)
	}
	for i, op := range ops {
		s.duration[i] = duration.WithLabelValues(op.String())
		for _, k := range []string{KindInvalid, KindRefused, KindMisconfigured, KindCanceled, KindTimeout, KindUnavailable, KindScript, KindServer, KindOther} {
			errs.WithLabelValues(op.String(), k) // exported at zero from the start
		}
	}
	for _, op := range ops[2:] {
		errs.WithLabelValues(op.String(), KindUnsupported)
	}
	return s, nil
}

// counters returns the decision counters of policy: its own while fewer
// than Options.MaxPolicies names have them, else those of OtherPolicies.
func (s *Store) counters(policy string) *policyCounters {
	if c, ok := s.policies.Load(policy); ok {
		return c.(*policyCounters)
	}
	if sluice.ValidatePolicy(policy) != nil {
		return s.otherCounters()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.policies.Load(policy); ok {
		return c.(*policyCounters)
	}
	if s.named >= s.o.MaxPolicies {
		return s.otherCounters()
	}
	c := s.newCounters(policy)
	s.policies.Store(policy, c)
	s.named++
	return c
}

// otherCounters returns the counters of OtherPolicies, created on first
// use.
func (s *Store) otherCounters() *policyCounters {
	if c := s.other.Load(); c != nil {
		return c
	}
	c := s.newCounters(OtherPolicies)
	if !s.other.CompareAndSwap(nil, c) {
		return s.other.Load()
	}
	return c
}

// newCounters creates the take and peek series of one policy label.
func (s *Store) newCounters(policy string) *policyCounters {
	c := &policyCounters{policy: policy}
	for i, op := range ops[:2] {
		for j, res := range results {
			c.basic[i][j] = s.decisions.WithLabelValues(policy, op.String(), res)
		}
	}
	return c
}

// moreCounters returns the counters of c's policy for the operations
// beyond Take and Peek, created on first use.
func (s *Store) moreCounters(c *policyCounters) *opCounters {
	if m := c.more.Load(); m != nil {
		return m
	}
	m := &opCounters{drained: s.drained.WithLabelValues(c.policy), refunded: s.refunded.WithLabelValues(c.policy)}
	for i, op := range ops[2:] {
		for j, res := range results {
			m.decisions[i][j] = s.decisions.WithLabelValues(c.policy, op.String(), res)
		}
	}
	if !c.more.CompareAndSwap(nil, m) {
		return c.more.Load()
	}
	return m
}

// decision returns the counter of op and result res of c's policy.
func (s *Store) decision(c *policyCounters, op guard.Op, res int) prometheus.Counter {
	if op <= guard.OpPeek {
		return c.basic[op][res]
	}
	return s.moreCounters(c).decisions[op-2][res]
}

// CheckLimit implements sluice.LimitChecker by asking the wrapped store
// (sluice.CheckLimit), so that sluice.NewLimiter and the middleware refuse,
// at construction, a limit the store cannot decide.
func (s *Store) CheckLimit(l sluice.Limit) error { return sluice.CheckLimit(s.next, l) }

// NonBlocking implements guard.NonBlocking by asking the wrapped store: the
// metrics themselves never block.
func (s *Store) NonBlocking() bool {
	nb, ok := s.next.(guard.NonBlocking)
	return ok && nb.NonBlocking()
}

// Take implements sluice.Store: it calls the wrapped store and records the
// call.
func (s *Store) Take(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	start := time.Now()
	d, err := s.next.Take(ctx, r)
	s.record(guard.OpTake, r.Policy, time.Since(start), d, err)
	s.observeRemaining(d, err)
	return d, err
}

// Peek implements sluice.Store: it calls the wrapped store and records the
// call.
func (s *Store) Peek(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	start := time.Now()
	d, err := s.next.Peek(ctx, r)
	s.record(guard.OpPeek, r.Policy, time.Since(start), d, err)
	return d, err
}

// TakeAll implements sluice.Operator: it calls the wrapped store and
// records the call once as a whole and once per request.
func (s *Store) TakeAll(ctx context.Context, rs []sluice.Request) (sluice.MultiDecision, error) {
	start := time.Now()
	var (
		md  sluice.MultiDecision
		err error
	)
	if s.ops == nil {
		err = s.unsupported(guard.OpTakeAll)
	} else {
		md, err = s.ops.TakeAll(ctx, rs)
	}
	s.duration[guard.OpTakeAll].Observe(time.Since(start).Seconds())
	s.multi[result(md.Allowed, md.Degraded, err)].Inc()
	if err != nil {
		s.errors.WithLabelValues(guard.OpTakeAll.String(), s.o.kind(err)).Inc()
	}
	for i := range rs {
		var d sluice.Decision
		if err == nil && i < len(md.Parts) {
			d = md.Parts[i]
			d.Degraded = d.Degraded || md.Degraded
		}
		s.decision(s.counters(rs[i].Policy), guard.OpTakeAll, result(d.Allowed, d.Degraded, err)).Inc()
		s.observeRemaining(d, err)
	}
	return md, err
}

// Drain implements sluice.Operator: it calls the wrapped store and records
// the call and the tokens taken.
func (s *Store) Drain(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	start := time.Now()
	var (
		d   sluice.Decision
		err error
	)
	if s.ops == nil {
		err = s.unsupported(guard.OpDrain)
	} else {
		d, err = s.ops.Drain(ctx, r)
	}
	c := s.record(guard.OpDrain, r.Policy, time.Since(start), d, err)
	if err == nil && d.Taken > 0 {
		s.moreCounters(c).drained.Add(float64(d.Taken))
	}
	s.observeRemaining(d, err)
	return d, err
}

// Refund implements sluice.Operator: it calls the wrapped store and
// records the call and the tokens given back.
func (s *Store) Refund(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	start := time.Now()
	var (
		d   sluice.Decision
		err error
	)
	if s.ops == nil {
		err = s.unsupported(guard.OpRefund)
	} else {
		d, err = s.ops.Refund(ctx, r)
	}
	c := s.record(guard.OpRefund, r.Policy, time.Since(start), d, err)
	if err == nil && d.Taken < 0 {
		s.moreCounters(c).refunded.Add(float64(-d.Taken))
	}
	return d, err
}

// Reset implements sluice.Operator: it calls the wrapped store and records
// the call, as "allowed" if the reset was made.
func (s *Store) Reset(ctx context.Context, policy, key string) error {
	start := time.Now()
	var err error
	if s.ops == nil {
		err = s.unsupported(guard.OpReset)
	} else {
		err = s.ops.Reset(ctx, policy, key)
	}
	s.record(guard.OpReset, policy, time.Since(start), sluice.Decision{Allowed: true}, err)
	return err
}

// unsupported is the error of an operation the wrapped store does not
// implement.
func (s *Store) unsupported(op guard.Op) error {
	return fmt.Errorf("promstore: %v: the store (%T) does not implement sluice.Operator: %w", op, s.next, errors.ErrUnsupported)
}

// result returns the index in results of a decision or an error.
func result(allowed, degraded bool, err error) int {
	switch {
	case err != nil:
		return resError
	case degraded && allowed:
		return resDegradedAllowed
	case degraded:
		return resDegradedDenied
	case !allowed:
		return resDenied
	}
	return resAllowed
}

// record records one call of op on policy, and returns the policy's
// counters.
func (s *Store) record(op guard.Op, policy string, took time.Duration, d sluice.Decision, err error) *policyCounters {
	s.duration[op].Observe(took.Seconds())
	if err != nil {
		s.errors.WithLabelValues(op.String(), s.o.kind(err)).Inc()
	}
	c := s.counters(policy)
	s.decision(c, op, result(d.Allowed, d.Degraded, err)).Inc()
	if err == nil && d.Replayed {
		s.replays.Inc()
	}
	return c
}

// observeRemaining records the remaining fraction of a decision that took
// tokens, if the store made it.
func (s *Store) observeRemaining(d sluice.Decision, err error) {
	if err == nil && !d.Degraded && d.Limit.Capacity > 0 {
		s.remaining.Observe(float64(d.Remaining) / float64(d.Limit.Capacity))
	}
}
