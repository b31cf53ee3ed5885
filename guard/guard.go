// Package guard wraps any sluice.Store with a failure mode, so that no
// store repeats it: every call to the store has a deadline the guard keeps
// itself, and when the store fails or does not answer in time a named
// failure mode decides instead — deny (FailClosed), allow (FailOpen), or
// decide against an in-process bucket holding a fraction of the limit
// (FailLocal). A circuit breaker stops calling a failing store and probes it
// back.
//
// # Degraded decisions
//
// A decision made by the failure mode instead of the store is returned with
// a nil error and Decision.Degraded set, whatever the mode: a caller that
// follows the sluice.Store contract keeps working (FailOpen really lets the
// traffic through), and a caller that must tell an outage from a quota
// denial checks Degraded — the service answers a degraded denial with 503,
// never 429. The cause (the store's error, ErrTimeout, ErrBreakerOpen or
// ErrStalled) goes to Hooks.Degraded with the call's context, and Status
// reports the breaker's state and the last store error.
//
// # The deadline
//
// The guard does not rely on the store to honour its context. Each call to
// the store runs on a goroutine of its own while the caller waits for the
// earlier of its own deadline and Options.Timeout; at that moment the caller
// gets its answer, whatever the store is doing. The store's context carries
// the same deadline, so a store that honours it stops at once; a store that
// does not goes on in the background, abandoned (its result is dropped). At
// most Options.MaxStalled abandoned calls may be running at a time: while
// that many are, the guard calls the store no more and degrades every
// decision at once, with a cause wrapping ErrStalled (Status counts them).
// A store that never waits for I/O, such as memstore, can say so by
// implementing NonBlocking; the guard then calls it on the caller's
// goroutine, with no goroutine and no deadline of its own.
//
// Whose deadline ended the call decides what it means. If it was the
// guard's (Options.Timeout was the earlier deadline), the call is a store
// failure whose cause wraps ErrTimeout, however the store reported it (a
// socket deadline set from the context can fire a moment before the
// context's own timer). If it was the caller's (its deadline was the
// earlier one, or it canceled), the caller gets its own context's error,
// nothing is degraded and the breaker counts nothing: nobody is waiting for
// a decision, and the store is not to blame. Keep Options.Timeout below the
// callers' deadlines.
//
// # The operations
//
// Store is a sluice.Operator: TakeAll, Drain, Refund and Reset get the
// deadline, MaxStalled, the breaker and the caller's-deadline rules of
// Take, and the failure mode decides for each as follows (docs/failure.md
// has a table):
//
//   - TakeAll, as Take: FailOpen allows every part; FailClosed denies
//     every part with RetryAfter the probe interval (Denied 0, the first
//     of equal waits); FailLocal takes all or nothing from the local
//     buckets. The MultiDecision and each part are Degraded.
//   - Drain: FailOpen allows and FailClosed denies, both with Taken 0 —
//     nothing was taken; FailLocal drains the local bucket. A degraded
//     drain was not recorded by the store, whatever its Taken says: a
//     caller that must account for every token (a charge made after the
//     fact) keeps the cost and drains it again once the store is back.
//   - Refund and Reset: no failure mode can give tokens back, or reset a
//     bucket, in the store's place, so they are never degraded: the error
//     wraps sluice.ErrUnavailable and the cause. Under FailLocal they are
//     also made to the local bucket, so that a take the local bucket made
//     during the outage gets its tokens back there (with a request ID: only
//     a take the local bucket made), and a reset key is not held back by
//     it; the caller still learns that the store's bucket is unchanged.
//
// A failure of any operation counts for the breaker, and any operation can
// be its probe. The guard implements sluice.Operator whatever the store it
// wraps; if that store does not, the operations beyond Take and Peek
// return an error wrapping errors.ErrUnsupported, without calling it,
// degrading or counting anything.
//
// # What stays an error
//
// Bad parameters are never degraded: every operation validates them before
// the store is called (Request.Validate, ValidatePeek, ValidateDrain,
// ValidateRefund, sluice.ValidateAll, sluice.ValidateReset) and returns
// errors wrapping the sluice sentinels. An error
// the store returns that sluice.IsInvalid reports (a store may refuse more
// limits than sluice does), or that wraps sluice.ErrTooManyKeys or
// sluice.ErrMisconfigured (the store is reachable but not set up for
// Sluice: a deployment mistake, not an outage), is the store's answer: it is
// returned as it is, never degraded, and counts as a success for the
// breaker. So is sluice.ErrUnknownRequestID, a Refund's answer. Every other error — sluice.ErrUnavailable, a timeout, and any
// error the guard does not know — is a store failure: the failure mode
// decides, and the breaker counts it.
//
// # No retries
//
// A decision is never sent twice. A store call that failed may still have
// been charged (its reply was lost); a second call could charge again. A
// caller that retries on its own should send a request ID.
//
// # Goroutines
//
// The guard starts one goroutine per store call (none for a NonBlocking
// store), which ends when the store's call returns, and no other: the
// breaker is driven by the calls and the clock (a call that finds the probe
// interval elapsed becomes the probe), and the local buckets of FailLocal
// live in a memstore.Store without a sweeper. There is nothing to close.
package guard

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
)

// Errors a degraded decision is caused by, besides the store's own errors.
// They reach the caller through Hooks.Degraded and Status, never as the
// error of Take, Peek, TakeAll or Drain; the error of a Refund or Reset the
// store did not make wraps them (and sluice.ErrUnavailable).
var (
	// ErrTimeout means the store did not answer within Options.Timeout. It
	// wraps the error the store returned at its deadline, or
	// context.DeadlineExceeded if the store had not returned when the guard
	// stopped waiting. The store may have made (and charged) the decision
	// nonetheless.
	ErrTimeout = errors.New("guard: store did not answer in time")
	// ErrBreakerOpen means the store was not called because the circuit
	// breaker is open. It wraps the store error that opened the breaker.
	ErrBreakerOpen = errors.New("guard: circuit breaker open")
	// ErrStalled means the store was not called because Options.MaxStalled
	// of its calls are still running after the guard stopped waiting for
	// them: the store does not honour its context, and is stuck.
	ErrStalled = errors.New("guard: too many store calls still running past their deadline")
)

// NonBlocking is implemented by a store whose methods (Take and Peek, and
// those of sluice.Operator if it implements it) never wait for I/O,
// another process or a lock held across such a wait, so that they return
// promptly whatever happens elsewhere. If NonBlocking returns true,
// the guard calls the store on the caller's goroutine and gives it the
// caller's context as it is: there is nothing a deadline could cut short,
// and the call costs no goroutine and no timer. The answer must not change
// over the store's life. A store that wraps another (promstore.Store)
// reports the store it wraps. A store that does not implement NonBlocking is
// treated as one that may block.
type NonBlocking interface {
	NonBlocking() bool
}

// FailureMode names what decides when the store cannot: the zero value is
// FailLocal.
type FailureMode uint8

const (
	// FailLocal decides against an in-process bucket per (policy, key)
	// holding 1/LocalDivisor of the limit: capacity and rate both scaled
	// (see LocalLimit). Over an outage of length T each instance allows a
	// key at most C/N + (r/N)·T, so N instances together stay within the
	// limit. The default.
	FailLocal FailureMode = iota
	// FailClosed denies: Allowed false, Degraded true, RetryAfter the
	// probe interval (a hint, not an exact wait). For endpoints where an
	// unlimited burst costs more than an outage (authentication).
	FailClosed
	// FailOpen allows: Allowed true, Degraded true. No limit holds during
	// an outage.
	FailOpen
)

// String returns "local", "closed" or "open", the names ParseFailureMode
// reads.
func (m FailureMode) String() string {
	switch m {
	case FailLocal:
		return "local"
	case FailClosed:
		return "closed"
	case FailOpen:
		return "open"
	}
	return fmt.Sprintf("FailureMode(%d)", uint8(m))
}

// ParseFailureMode returns the FailureMode named "local", "closed" or
// "open". The error wraps sluice.ErrInvalidOption.
func ParseFailureMode(s string) (FailureMode, error) {
	switch s {
	case "local":
		return FailLocal, nil
	case "closed":
		return FailClosed, nil
	case "open":
		return FailOpen, nil
	}
	return 0, fmt.Errorf("%w: guard failure mode %q is unknown; use \"local\", \"closed\" or \"open\"", sluice.ErrInvalidOption, s)
}

// Validate reports whether m is one of the defined failure modes. The error
// wraps sluice.ErrInvalidOption.
func (m FailureMode) Validate() error {
	if m > FailOpen {
		return fmt.Errorf("%w: guard failure mode %d is unknown; use FailLocal, FailClosed or FailOpen", sluice.ErrInvalidOption, uint8(m))
	}
	return nil
}

// MarshalText implements encoding.TextMarshaler with the names of String.
// The error of an unknown mode wraps sluice.ErrInvalidOption.
func (m FailureMode) MarshalText() ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return []byte(m.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler with ParseFailureMode,
// for configuration files.
func (m *FailureMode) UnmarshalText(b []byte) error {
	v, err := ParseFailureMode(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// Defaults for the zero Options.
const (
	DefaultTimeout             = 50 * time.Millisecond
	DefaultConsecutiveFailures = 5
	DefaultFailurePercent      = 50
	DefaultWindow              = time.Second
	DefaultMinCalls            = 10
	DefaultProbeInterval       = 500 * time.Millisecond
	DefaultLocalDivisor        = 1
	DefaultLocalMaxKeys        = 1 << 16
	DefaultMaxStalled          = 256
)

// Options configure a Store. The zero value of every field means its
// documented default; a value out of range makes New fail.
type Options struct {
	// FailureMode decides when the store cannot. Default FailLocal.
	FailureMode FailureMode
	// LocalDivisor is N for FailLocal: each local bucket holds 1/N of the
	// request's limit. Set it to the number of instances sharing the
	// store. Default 1 (each instance may allow the whole limit during an
	// outage); negative is refused.
	LocalDivisor int64
	// LocalMaxKeys bounds the number of local buckets. A new key finding
	// them all in use and none full is denied (degraded). Default
	// DefaultLocalMaxKeys (65,536; about 6 MiB); negative is refused.
	LocalMaxKeys int

	// Timeout is the deadline of every store call (the caller's earlier
	// deadline, if any, still applies). A call past it is a failure whose
	// cause wraps ErrTimeout; the guard answers at the deadline whether or
	// not the store honours its context. Default DefaultTimeout (50ms):
	// every call has a deadline; negative is refused.
	Timeout time.Duration
	// MaxStalled bounds the store calls still running after the guard
	// stopped waiting for them (their deadline passed, or their caller
	// gave up). While that many are running, decisions are degraded at
	// once with a cause wrapping ErrStalled, without calling the store.
	// Calls admitted at the same moment may each add one beyond it, so
	// the goroutines left behind are at most MaxStalled plus the callers
	// waiting at once. Default DefaultMaxStalled (256); negative is
	// refused.
	MaxStalled int

	// ConsecutiveFailures opens the breaker after that many store failures
	// in a row. Default 5; negative disables this trigger.
	ConsecutiveFailures int
	// FailurePercent opens the breaker when at least that percentage of
	// the store calls of the last Window failed, once at least MinCalls
	// were made in it. Default 50; above 100 is refused; negative disables
	// this trigger.
	FailurePercent int
	// Window is the sliding window of FailurePercent, kept in ten slots.
	// Default 1s; negative is refused.
	Window time.Duration
	// MinCalls is the fewest calls in Window that FailurePercent judges.
	// Default 10; negative is refused.
	MinCalls int
	// ProbeInterval is how long the breaker stays open before one call is
	// let through to the store as a probe; it closes if that call
	// succeeds, and stays open another interval if not. Default 500ms;
	// negative is refused.
	ProbeInterval time.Duration

	// Now is the clock of the breaker, of the latency Hooks.StoreCall
	// reports and of the local buckets. Default time.Now (monotonic).
	// Deadlines are context deadlines and run on the real clock.
	Now func() time.Time
	// Hooks observe the guard (metrics, logs). Default none.
	Hooks Hooks
}

// validate checks every option against its range.
func (o *Options) validate() error {
	if err := o.FailureMode.Validate(); err != nil {
		return err
	}
	for _, c := range []struct {
		name string
		v    int64
	}{
		{"LocalDivisor", o.LocalDivisor},
		{"LocalMaxKeys", int64(o.LocalMaxKeys)},
		{"Timeout", int64(o.Timeout)},
		{"MaxStalled", int64(o.MaxStalled)},
		{"Window", int64(o.Window)},
		{"MinCalls", int64(o.MinCalls)},
		{"ProbeInterval", int64(o.ProbeInterval)},
	} {
		if c.v < 0 {
			return fmt.Errorf("%w: guard option %s is %d; use 0 for the default or a positive value", sluice.ErrInvalidOption, c.name, c.v)
		}
	}
	if o.FailurePercent > 100 {
		return fmt.Errorf("%w: guard option FailurePercent is %d; use 1 to 100, 0 for the default (%d) or a negative value to disable it", sluice.ErrInvalidOption, o.FailurePercent, DefaultFailurePercent)
	}
	return nil
}

// Op names the Store method a call is for.
type Op uint8

const (
	// OpTake is a Take.
	OpTake Op = iota
	// OpPeek is a Peek.
	OpPeek
	// OpTakeAll is a TakeAll.
	OpTakeAll
	// OpDrain is a Drain.
	OpDrain
	// OpRefund is a Refund.
	OpRefund
	// OpReset is a Reset.
	OpReset
)

// String returns "take", "peek", "take_all", "drain", "refund" or
// "reset", the names metrics label the operations with.
func (o Op) String() string {
	switch o {
	case OpTake:
		return "take"
	case OpPeek:
		return "peek"
	case OpTakeAll:
		return "take_all"
	case OpDrain:
		return "drain"
	case OpRefund:
		return "refund"
	case OpReset:
		return "reset"
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// Call describes one call the guard made to the wrapped store.
type Call struct {
	// Op is the method called.
	Op Op
	// Policy is the request's policy name (a multi-take's first
	// request's).
	Policy string
	// Took is the time the call took, on Options.Now: until the store
	// answered, or until the guard stopped waiting.
	Took time.Duration
	// Err is nil if the store decided, the store's error (an answer such
	// as ErrInvalidLimit, or a failure), an error wrapping ErrTimeout when
	// the guard's deadline passed, or the caller's context error when the
	// caller's did.
	Err error
	// Probe reports that the call was the breaker's probe.
	Probe bool
}

// Degradation describes one decision made by the failure mode instead of
// the store: of a Take, Peek, TakeAll or Drain (a Refund or Reset the store
// did not make is an error, never a degraded decision).
type Degradation struct {
	// Op is the method called.
	Op Op
	// Policy is the request's policy name (a multi-take's first
	// request's).
	Policy string
	// FailureMode is the mode that decided.
	FailureMode FailureMode
	// Allowed is the decision's Allowed (a multi-take's: all of them).
	Allowed bool
	// Cause is why the store did not decide: the store's error, or an
	// error wrapping ErrTimeout, ErrBreakerOpen or ErrStalled.
	Cause error
}

// Hooks are functions the guard calls to report what it does. Each is
// optional, is called synchronously on the caller's goroutine, must be
// quick and safe for concurrent use, and must not call the guard.
type Hooks struct {
	// StoreCall is called after every call to the wrapped store, with the
	// caller's context, when the guard has its result or stops waiting.
	StoreCall func(ctx context.Context, c Call)
	// Degraded is called for every degraded decision, with the caller's
	// context, before Take, Peek, TakeAll or Drain returns it: the place
	// to log the cause of a request's degraded answer.
	Degraded func(ctx context.Context, d Degradation)
	// BreakerChange is called on every change of the breaker's state,
	// under the breaker's lock, so calls arrive in the order of the
	// changes.
	BreakerChange func(from, to BreakerState)
}

// Store is a sluice.Store that applies a failure mode around another
// store, and a sluice.Operator whose operations work if that store is one.
// It is safe for concurrent use. Create one with New.
type Store struct {
	store      sluice.Store
	ops        sluice.Operator // store, if it is one; else nil
	inline     bool            // the store is NonBlocking: called on the caller's goroutine
	mode       FailureMode
	timeout    time.Duration
	maxStalled int64
	probe      time.Duration
	now        func() time.Time
	hooks      Hooks
	divisor    int64
	local      *memstore.Store // FailLocal only
	br         breaker

	stalled atomic.Int64  // abandoned store calls still running
	skipped atomic.Uint64 // decisions degraded because of them
}

var (
	_ sluice.Operator     = (*Store)(nil)
	_ sluice.LimitChecker = (*Store)(nil)
)

// New returns a Store deciding in store, and by o.FailureMode when store
// fails. It returns an error wrapping sluice.ErrInvalidOption, and no
// Store, if store is nil or an option is out of range; the message names
// the option and its allowed values.
func New(store sluice.Store, o Options) (*Store, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: guard store is nil", sluice.ErrInvalidOption)
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	s := &Store{
		store:      store,
		mode:       o.FailureMode,
		timeout:    o.Timeout,
		maxStalled: int64(o.MaxStalled),
		probe:      o.ProbeInterval,
		now:        o.Now,
		hooks:      o.Hooks,
		divisor:    o.LocalDivisor,
	}
	s.ops, _ = store.(sluice.Operator)
	if nb, ok := store.(NonBlocking); ok {
		s.inline = nb.NonBlocking()
	}
	if s.timeout == 0 {
		s.timeout = DefaultTimeout
	}
	if s.maxStalled == 0 {
		s.maxStalled = DefaultMaxStalled
	}
	if s.probe == 0 {
		s.probe = DefaultProbeInterval
	}
	if s.now == nil {
		// time.Now with its monotonic reading, without reading the wall
		// clock on every call (on some virtual machines that costs more
		// than a memstore decision).
		epoch := time.Now()
		s.now = func() time.Time { return epoch.Add(time.Since(epoch)) }
	}
	if s.divisor == 0 {
		s.divisor = DefaultLocalDivisor
	}
	if s.mode == FailLocal {
		maxKeys := o.LocalMaxKeys
		if maxKeys == 0 {
			maxKeys = DefaultLocalMaxKeys
		}
		// Each shard needs room for one request ID: at most as many
		// shards as keys, a power of two.
		shards := 256
		for shards > maxKeys {
			shards >>= 1
		}
		local, err := memstore.New(memstore.Options{
			Now:           o.Now,
			MaxKeys:       maxKeys,
			MaxRequestIDs: maxKeys,
			Shards:        shards,
			Overflow:      memstore.RefuseNew,
			SweepInterval: -1, // no goroutine: full buckets are reclaimed when the table is full
		})
		if err != nil {
			return nil, fmt.Errorf("guard: local buckets: %w", err)
		}
		s.local = local
	}
	s.br.init(o, s.probe, s.now())
	return s, nil
}

// FailureMode returns the mode s decides by when the store cannot.
func (s *Store) FailureMode() FailureMode { return s.mode }

// CheckLimit implements sluice.LimitChecker: it reports whether the wrapped
// store decides l (sluice.CheckLimit), so that sluice.NewLimiter and the
// middleware refuse, at construction, a limit the store behind the guard
// cannot decide. The error wraps sluice.ErrInvalidLimit.
func (s *Store) CheckLimit(l sluice.Limit) error { return sluice.CheckLimit(s.store, l) }

// Take implements sluice.Store. It validates r (errors wrap the sluice
// sentinels; the store is not called), then asks the store within the
// deadline, unless the breaker is open or too many calls are stalled. If
// the store fails or times out, the failure mode decides and the decision
// is Degraded; the error is then nil.
func (s *Store) Take(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := r.Validate(); err != nil {
		return sluice.Decision{}, err
	}
	return s.decide(ctx, &query{op: OpTake, r: r})
}

// Peek implements sluice.Store like Take, without consuming: a degraded
// Peek reports the local bucket (FailLocal), or Allowed true (FailOpen) or
// false (FailClosed).
func (s *Store) Peek(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := r.ValidatePeek(); err != nil {
		return sluice.Decision{}, err
	}
	return s.decide(ctx, &query{op: OpPeek, r: r})
}

// TakeAll implements sluice.Operator like Take: it validates rs
// (sluice.ValidateAll), then asks the store within the deadline. If the
// store fails, the failure mode decides and the MultiDecision and each of
// its Parts are Degraded: FailOpen allows every part; FailClosed denies
// every part with RetryAfter the probe interval (so Denied is 0, the first
// of equal waits); FailLocal takes all or nothing from the local buckets
// (each part under LocalLimit), and denies every part as FailClosed does
// if a part's cost exceeds its local capacity or a new local bucket finds
// no room. If the store does not implement sluice.Operator, the error wraps
// errors.ErrUnsupported.
func (s *Store) TakeAll(ctx context.Context, rs []sluice.Request) (sluice.MultiDecision, error) {
	if err := sluice.ValidateAll(rs); err != nil {
		return sluice.MultiDecision{}, err
	}
	if s.ops == nil {
		return sluice.MultiDecision{}, s.unsupported(OpTakeAll)
	}
	q := query{op: OpTakeAll, rs: rs}
	if _, err := s.decide(ctx, &q); err != nil {
		return sluice.MultiDecision{}, err
	}
	return q.md, nil
}

// Drain implements sluice.Operator like Take: it validates r
// (Request.ValidateDrain), then asks the store within the deadline. If the
// store fails, the failure mode decides and the decision is Degraded:
// FailOpen allows and FailClosed denies (RetryAfter the probe interval),
// both with Taken 0, since nothing was taken; FailLocal drains the local
// bucket (under LocalLimit). A degraded drain was not recorded by the
// store, whatever its Taken (the local bucket's): a caller that must
// account for every token keeps the cost and drains it again once the
// store is back, knowing that a drain that timed out may have been
// recorded anyway (its reply lost). If the store does not implement
// sluice.Operator, the error wraps errors.ErrUnsupported.
func (s *Store) Drain(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := r.ValidateDrain(); err != nil {
		return sluice.Decision{}, err
	}
	if s.ops == nil {
		return sluice.Decision{}, s.unsupported(OpDrain)
	}
	return s.decide(ctx, &query{op: OpDrain, r: r})
}

// Refund implements sluice.Operator: it validates r
// (Request.ValidateRefund), then asks the store within the deadline. No
// failure mode gives tokens back in the store's place: if the store fails,
// Refund returns an error wrapping sluice.ErrUnavailable and the cause
// (the store's error, ErrTimeout, ErrBreakerOpen or ErrStalled), never a
// degraded decision. Under FailLocal the refund is also given to the local
// bucket, if there is one (with a request ID, only if the local bucket
// made that take), so that the outage's budget reflects it. If the store
// does not implement sluice.Operator, the error wraps
// errors.ErrUnsupported.
func (s *Store) Refund(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := r.ValidateRefund(); err != nil {
		return sluice.Decision{}, err
	}
	if s.ops == nil {
		return sluice.Decision{}, s.unsupported(OpRefund)
	}
	return s.decide(ctx, &query{op: OpRefund, r: r})
}

// Reset implements sluice.Operator like Refund: it validates policy and
// key (sluice.ValidateReset), then asks the store within the deadline; if
// the store fails, the error wraps sluice.ErrUnavailable and the cause,
// and under FailLocal the local bucket is reset too. If the store does not
// implement sluice.Operator, the error wraps errors.ErrUnsupported.
func (s *Store) Reset(ctx context.Context, policy, key string) error {
	if err := sluice.ValidateReset(policy, key); err != nil {
		return err
	}
	if s.ops == nil {
		return s.unsupported(OpReset)
	}
	_, err := s.decide(ctx, &query{op: OpReset, r: sluice.Request{Policy: policy, Key: key}})
	return err
}

// unsupported is the error of an operation the wrapped store does not
// implement.
func (s *Store) unsupported(op Op) error {
	return fmt.Errorf("guard: %v: the store (%T) does not implement sluice.Operator: %w", op, s.store, errors.ErrUnsupported)
}

// Status is a snapshot of the breaker and of the calls the guard
// abandoned.
type Status struct {
	// State is the breaker's state.
	State BreakerState
	// Since is when it entered State, on Options.Now.
	Since time.Time
	// LastError is the most recent store failure (nil if none yet): the
	// store's error, or one wrapping ErrTimeout.
	LastError error
	// Stalled is the number of store calls still running after the guard
	// stopped waiting for them.
	Stalled int64
	// Skipped counts the decisions degraded without calling the store
	// because Stalled had reached Options.MaxStalled.
	Skipped uint64
}

// Status returns the breaker's state and the stalled calls, for health
// checks and logs.
func (s *Store) Status() Status {
	st := s.br.status()
	st.Stalled = s.stalled.Load()
	st.Skipped = s.skipped.Load()
	return st
}

// LocalStats returns the counters of the local buckets of FailLocal (zero
// for the other modes).
func (s *Store) LocalStats() memstore.Stats {
	if s.local == nil {
		return memstore.Stats{}
	}
	return s.local.Stats()
}

// decide asks the store for a validated query, or the failure mode.
func (s *Store) decide(ctx context.Context, q *query) (sluice.Decision, error) {
	if err := ctx.Err(); err != nil {
		return sluice.Decision{}, err
	}
	if !s.inline {
		if n := s.stalled.Load(); n >= s.maxStalled {
			s.skipped.Add(1)
			return s.degrade(ctx, q, fmt.Errorf("%w: %d calls running, at most %d allowed (Options.MaxStalled)", ErrStalled, n, s.maxStalled))
		}
	}
	probe, cause := s.br.admit(s.now)
	if cause != nil {
		return s.degrade(ctx, q, cause)
	}
	d, failed, err := s.call(ctx, q, probe)
	if failed {
		return s.degrade(ctx, q, err)
	}
	return d, err
}

// isAnswer reports whether err is a store's answer rather than a failure:
// the store is up, and the call was wrong, refused, or the store is not
// set up for Sluice.
func isAnswer(err error) bool {
	return sluice.IsInvalid(err) || errors.Is(err, sluice.ErrTooManyKeys) || errors.Is(err, sluice.ErrMisconfigured)
}

// degrade decides q by the failure mode because of cause; a Refund or a
// Reset fails.
func (s *Store) degrade(ctx context.Context, q *query, cause error) (sluice.Decision, error) {
	var (
		d       sluice.Decision
		allowed bool
	)
	switch q.op {
	case OpRefund, OpReset:
		return sluice.Decision{}, s.notMade(ctx, q, cause)
	case OpTakeAll:
		md, err := s.degradeAll(ctx, q.rs)
		if err != nil {
			return sluice.Decision{}, err
		}
		q.md, allowed = md, md.Allowed
	default:
		switch s.mode {
		case FailOpen:
			d = sluice.Decision{Allowed: true, Limit: q.r.Limit, Degraded: true}
		case FailLocal:
			var err error
			if d, err = s.decideLocally(ctx, q.op, &q.r); err != nil {
				return sluice.Decision{}, err
			}
		default:
			d = sluice.Decision{RetryAfter: s.probe, Limit: q.r.Limit, Degraded: true}
		}
		allowed = d.Allowed
	}
	if s.hooks.Degraded != nil {
		s.hooks.Degraded(ctx, Degradation{Op: q.op, Policy: q.policy(), FailureMode: s.mode, Allowed: allowed, Cause: cause})
	}
	return d, nil
}

// degradeAll decides a multi-take by the failure mode.
func (s *Store) degradeAll(ctx context.Context, rs []sluice.Request) (sluice.MultiDecision, error) {
	if s.mode == FailLocal {
		return s.takeAllLocally(ctx, rs)
	}
	md := sluice.MultiDecision{Parts: make([]sluice.Decision, len(rs)), Degraded: true}
	for i, r := range rs {
		if s.mode == FailOpen {
			md.Parts[i] = sluice.Decision{Allowed: true, Limit: r.Limit, Degraded: true}
		} else {
			md.Parts[i] = sluice.Decision{RetryAfter: s.probe, Limit: r.Limit, Degraded: true}
		}
	}
	md.Combine()
	return md, nil
}

// notMade is the error of a Refund or Reset the store did not make because
// of cause; under FailLocal it is made to the local bucket first.
func (s *Store) notMade(ctx context.Context, q *query, cause error) error {
	if s.mode == FailLocal {
		s.applyLocally(ctx, q)
	}
	if errors.Is(cause, sluice.ErrUnavailable) {
		return fmt.Errorf("guard: %v not made by the store: %w", q.op, cause)
	}
	return fmt.Errorf("guard: %v not made by the store: %w: %w", q.op, sluice.ErrUnavailable, cause)
}
