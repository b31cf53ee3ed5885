// Package guard wraps any sluice.Store with a failure policy, so that no
// store repeats it: every call to the store gets a deadline, and when the
// store fails or does not answer in time a named policy decides instead —
// deny (FailClosed), allow (FailOpen), or decide against an in-process
// bucket holding a fraction of the limit (FailLocal). A circuit breaker
// stops calling a failing store and probes it back.
//
// # Degraded decisions
//
// A decision made by the policy instead of the store is returned with a nil
// error and Decision.Degraded set, whatever the policy: a caller that
// follows the sluice.Store contract keeps working (FailOpen really lets the
// traffic through), and a caller that must tell an outage from a quota
// denial checks Degraded — the service answers a degraded denial with 503,
// never 429. The cause (the store's error, ErrTimeout, or ErrBreakerOpen)
// goes to Hooks.Degraded with the call's context, and Status reports the
// breaker's state and the last store error.
//
// # What stays an error
//
// Bad parameters are never degraded: Take and Peek validate them before the
// store is called and return errors wrapping the sluice sentinels. An error
// the store returns that wraps ErrInvalidKey, ErrInvalidCost,
// ErrInvalidLimit (a store may refuse more limits than sluice does),
// ErrInvalidRequestID, ErrRequestIDConflict or ErrTooManyKeys is the
// store's answer, not a failure: it is returned as it is and counts as a
// success for the breaker. The error of a call whose context the caller
// ended (canceled, or the caller's own deadline passed) is returned too,
// and the breaker does not count it: nobody is waiting for a decision.
// Keep Options.Timeout below the callers' deadlines.
//
// # No retries
//
// A decision is never sent twice. A store call that failed may still have
// been charged (its reply was lost); a second call could charge again. A
// caller that retries on its own should send a request ID.
//
// # No goroutines
//
// The guard starts none: the breaker is driven by the calls and the clock
// (a call that finds the probe interval elapsed becomes the probe), and the
// local buckets of FailLocal live in a memstore.Store without a sweeper.
// There is nothing to close.
package guard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
)

// Errors a degraded decision is caused by, besides the store's own errors.
// They reach the caller through Hooks.Degraded and Status, never as the
// error of Take or Peek.
var (
	// ErrTimeout means the store did not answer within Options.Timeout. It
	// wraps the error the store returned when its deadline passed. The
	// store may have made (and charged) the decision nonetheless.
	ErrTimeout = errors.New("guard: store did not answer in time")
	// ErrBreakerOpen means the store was not called because the circuit
	// breaker is open. It wraps the store error that opened the breaker.
	ErrBreakerOpen = errors.New("guard: circuit breaker open")
)

// FailureMode names what decides when the store cannot: the zero value is
// FailLocal.
type FailureMode uint8

const (
	// FailLocal decides against an in-process bucket per key holding
	// 1/LocalDivisor of the limit: capacity and rate both scaled (see
	// LocalLimit). Over an outage of length T each instance allows a key
	// at most C/N + (r/N)·T, so N instances together stay within the
	// limit. The default, as the research (reliability.md §7) advises.
	FailLocal FailureMode = iota
	// FailClosed denies: Allowed false, Degraded true, RetryAfter the
	// probe interval (a hint, not an exact wait). For endpoints where an
	// unlimited burst costs more than an outage (authentication).
	FailClosed
	// FailOpen allows: Allowed true, Degraded true. No limit holds during
	// an outage.
	FailOpen
)

// String returns "local", "closed" or "open", the names ParseFailureMode reads.
func (p FailureMode) String() string {
	switch p {
	case FailLocal:
		return "local"
	case FailClosed:
		return "closed"
	case FailOpen:
		return "open"
	}
	return fmt.Sprintf("FailureMode(%d)", uint8(p))
}

// ParseFailureMode returns the FailureMode named "local", "closed" or "open".
func ParseFailureMode(s string) (FailureMode, error) {
	switch s {
	case "local":
		return FailLocal, nil
	case "closed":
		return FailClosed, nil
	case "open":
		return FailOpen, nil
	}
	return 0, fmt.Errorf("guard: failure policy %q is unknown; use \"local\", \"closed\" or \"open\"", s)
}

// MarshalText implements encoding.TextMarshaler with the names of String.
func (p FailureMode) MarshalText() ([]byte, error) {
	if p > FailOpen {
		return nil, fmt.Errorf("guard: failure policy %d is unknown", uint8(p))
	}
	return []byte(p.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler with ParseFailureMode, for
// configuration files.
func (p *FailureMode) UnmarshalText(b []byte) error {
	v, err := ParseFailureMode(string(b))
	if err != nil {
		return err
	}
	*p = v
	return nil
}

// Defaults for the zero Options (reliability.md §7).
const (
	DefaultTimeout             = 50 * time.Millisecond
	DefaultConsecutiveFailures = 5
	DefaultFailurePercent      = 50
	DefaultWindow              = time.Second
	DefaultMinCalls            = 10
	DefaultProbeInterval       = 500 * time.Millisecond
	DefaultLocalDivisor        = 1
	DefaultLocalMaxKeys        = 1 << 16
)

// Options configure a Store. The zero value of every field means its
// documented default.
type Options struct {
	// FailureMode decides when the store cannot. Default FailLocal. A
	// value that names no mode is treated as FailClosed.
	FailureMode FailureMode
	// LocalDivisor is N for FailLocal: each local bucket holds 1/N of the
	// request's limit. Set it to the number of instances sharing the
	// store. Default 1 (each instance may allow the whole limit during an
	// outage); values below 1 mean the default.
	LocalDivisor int64
	// LocalMaxKeys bounds the number of local buckets. A new key finding
	// them all in use and none full is denied (degraded). Default
	// DefaultLocalMaxKeys (65,536; about 6 MiB).
	LocalMaxKeys int

	// Timeout is the deadline of every store call (the caller's earlier
	// deadline, if any, still applies). A call past it is a failure whose
	// cause wraps ErrTimeout. Default DefaultTimeout (50ms); zero or
	// negative means the default: every call has a deadline. The store
	// must honour its context (for go-redis: ContextTimeoutEnabled).
	Timeout time.Duration

	// ConsecutiveFailures opens the breaker after that many store failures
	// in a row. Default 5; negative disables this trigger.
	ConsecutiveFailures int
	// FailurePercent opens the breaker when at least that percentage of
	// the store calls of the last Window failed, once at least MinCalls
	// were made in it. Default 50; values above 100 mean 100; negative
	// disables this trigger.
	FailurePercent int
	// Window is the sliding window of FailurePercent, kept in ten slots.
	// Default 1s.
	Window time.Duration
	// MinCalls is the fewest calls in Window that FailurePercent judges.
	// Default 10.
	MinCalls int
	// ProbeInterval is how long the breaker stays open before one call is
	// let through to the store as a probe; it closes if that call
	// succeeds, and stays open another interval if not. Default 500ms.
	ProbeInterval time.Duration

	// Now is the clock of the breaker, of the latency Hooks.StoreCall
	// reports and of the local buckets. Default time.Now (monotonic).
	Now func() time.Time
	// Hooks observe the guard (metrics, logs). Default none.
	Hooks Hooks
}

// Op names the Store method a call is for.
type Op uint8

const (
	// OpTake is a Take.
	OpTake Op = iota
	// OpPeek is a Peek.
	OpPeek
)

// String returns "take" or "peek".
func (o Op) String() string {
	if o == OpPeek {
		return "peek"
	}
	return "take"
}

// Call describes one call the guard made to the wrapped store.
type Call struct {
	// Op is the method called.
	Op Op
	// Took is the time the call took, on Options.Now.
	Took time.Duration
	// Err is nil if the store decided, the store's error (an answer such
	// as ErrInvalidLimit, or a failure), or, when the deadline passed, an
	// error wrapping ErrTimeout and the store's error.
	Err error
	// Probe reports that the call was the breaker's probe.
	Probe bool
}

// Degradation describes one decision made by the policy instead of the
// store.
type Degradation struct {
	// Op is the method called.
	Op Op
	// Policy is the request's policy name.
	Policy string
	// FailureMode is the mode that decided.
	FailureMode FailureMode
	// Allowed is the decision's Allowed.
	Allowed bool
	// Cause is why the store did not decide: the store's error, an error
	// wrapping ErrTimeout, or one wrapping ErrBreakerOpen.
	Cause error
}

// Hooks are functions the guard calls to report what it does. Each is
// optional, is called synchronously on the caller's goroutine, must be
// quick and safe for concurrent use, and must not call the guard.
type Hooks struct {
	// StoreCall is called after every call to the wrapped store, with the
	// caller's context.
	StoreCall func(ctx context.Context, c Call)
	// Degraded is called for every degraded decision, with the caller's
	// context, before Take or Peek returns it: the place to log the
	// cause of a request's degraded answer.
	Degraded func(ctx context.Context, d Degradation)
	// BreakerChange is called on every change of the breaker's state,
	// under the breaker's lock, so calls arrive in the order of the
	// changes.
	BreakerChange func(from, to BreakerState)
}

// Store is a sluice.Store that applies a failure policy around another
// store. It is safe for concurrent use. Create one with New.
type Store struct {
	store   sluice.Store
	policy  FailureMode
	timeout time.Duration
	probe   time.Duration
	now     func() time.Time
	hooks   Hooks
	divisor int64
	local   *memstore.Store // FailLocal only
	br      breaker
}

var _ sluice.Store = (*Store)(nil)

// New returns a Store deciding in store, and by o.Policy when store fails.
// Option values out of range are replaced by their defaults.
func New(store sluice.Store, o Options) (*Store, error) {
	s := &Store{
		store:   store,
		policy:  o.FailureMode,
		timeout: o.Timeout,
		probe:   o.ProbeInterval,
		now:     o.Now,
		hooks:   o.Hooks,
		divisor: o.LocalDivisor,
	}
	if s.policy > FailOpen {
		s.policy = FailClosed
	}
	if s.timeout <= 0 {
		s.timeout = DefaultTimeout
	}
	if s.probe <= 0 {
		s.probe = DefaultProbeInterval
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.divisor < 1 {
		s.divisor = DefaultLocalDivisor
	}
	if s.policy == FailLocal {
		maxKeys := o.LocalMaxKeys
		if maxKeys <= 0 {
			maxKeys = DefaultLocalMaxKeys
		}
		s.local, _ = memstore.New(memstore.Options{
			Now:           o.Now,
			MaxKeys:       maxKeys,
			MaxRequestIDs: maxKeys,
			Overflow:      memstore.RefuseNew,
			SweepInterval: -1, // no goroutine: full buckets are reclaimed when the table is full
		})
	}
	s.br.init(o, s.probe, s.now())
	return s, nil
}

// FailureMode returns the mode s decides by when the store cannot.
func (s *Store) FailureMode() FailureMode { return s.policy }

// Take implements sluice.Store. It validates r (errors wrap the sluice
// sentinels; the store is not called), then asks the store within the
// deadline, unless the breaker is open. If the store fails or times out,
// the policy decides and the decision is Degraded; the error is then nil.
func (s *Store) Take(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := r.Validate(); err != nil {
		return sluice.Decision{}, err
	}
	return s.decide(ctx, OpTake, &r)
}

// Peek implements sluice.Store like Take, without consuming: a degraded
// Peek reports the local bucket (FailLocal), or Allowed true (FailOpen) or
// false (FailClosed).
func (s *Store) Peek(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := r.ValidatePeek(); err != nil {
		return sluice.Decision{}, err
	}
	return s.decide(ctx, OpPeek, &r)
}

// Status is a snapshot of the breaker.
type Status struct {
	// State is the breaker's state.
	State BreakerState
	// Since is when it entered State, on Options.Now.
	Since time.Time
	// LastError is the most recent store failure (nil if none yet): the
	// store's error, or one wrapping ErrTimeout.
	LastError error
}

// Status returns the breaker's state, for health checks and logs.
func (s *Store) Status() Status { return s.br.status() }

// LocalStats returns the counters of the local buckets of FailLocal (zero
// for the other policies).
func (s *Store) LocalStats() memstore.Stats {
	if s.local == nil {
		return memstore.Stats{}
	}
	return s.local.Stats()
}

// decide asks the store for a validated request, or the policy.
func (s *Store) decide(ctx context.Context, op Op, r *sluice.Request) (sluice.Decision, error) {
	if err := ctx.Err(); err != nil {
		return sluice.Decision{}, err
	}
	probe, cause := s.br.admit(s.now())
	if cause != nil {
		return s.degrade(ctx, op, r, cause)
	}
	d, failed, err := s.call(ctx, op, r, probe)
	if failed {
		return s.degrade(ctx, op, r, err)
	}
	return d, err
}

// call makes one store call with the deadline and reports it to the
// breaker and the hooks. failed reports a store failure, with err its
// cause; otherwise (d, err) is the answer to return.
func (s *Store) call(ctx context.Context, op Op, r *sluice.Request, probe bool) (d sluice.Decision, failed bool, err error) {
	settled := false
	if probe {
		// A store that panics must not leave the breaker half-open for
		// ever: the panic goes on, and another call probes.
		defer func() {
			if !settled {
				s.br.abandon(s.now())
			}
		}()
	}
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	start := s.now()
	if op == OpTake {
		d, err = s.store.Take(cctx, *r)
	} else {
		d, err = s.store.Peek(cctx, *r)
	}
	end := s.now()
	expired := errors.Is(cctx.Err(), context.DeadlineExceeded)
	cancel()

	switch {
	case err == nil || isAnswer(err):
		s.br.success(end, probe)
	case ctx.Err() != nil:
		// The caller gave up: nobody waits for a decision, and the store
		// is not to blame. A probe lets the next call probe again.
		if probe {
			s.br.abandon(end)
		}
	default:
		if expired {
			err = fmt.Errorf("%w (%v): %w", ErrTimeout, s.timeout, err)
		}
		s.br.failure(end, probe, err)
		failed = true
	}
	settled = true
	if s.hooks.StoreCall != nil {
		s.hooks.StoreCall(ctx, Call{Op: op, Took: end.Sub(start), Err: err, Probe: probe})
	}
	return d, failed, err
}

// isAnswer reports whether err is a store's answer rather than a failure:
// the store is up, the call was wrong or refused.
func isAnswer(err error) bool {
	return sluice.IsInvalid(err) || errors.Is(err, sluice.ErrTooManyKeys)
}

// degrade decides r by the policy because of cause.
func (s *Store) degrade(ctx context.Context, op Op, r *sluice.Request, cause error) (sluice.Decision, error) {
	var d sluice.Decision
	switch s.policy {
	case FailOpen:
		d = sluice.Decision{Allowed: true, Limit: r.Limit, Degraded: true}
	case FailLocal:
		var err error
		if d, err = s.decideLocally(ctx, op, r); err != nil {
			return sluice.Decision{}, err
		}
	default:
		d = sluice.Decision{RetryAfter: s.probe, Limit: r.Limit, Degraded: true}
	}
	if s.hooks.Degraded != nil {
		s.hooks.Degraded(ctx, Degradation{Op: op, Policy: r.Policy, FailureMode: s.policy, Allowed: d.Allowed, Cause: cause})
	}
	return d, nil
}
