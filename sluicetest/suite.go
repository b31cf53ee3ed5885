// Package sluicetest is the conformance suite of sluice stores: a store is
// done when Run passes against it. The suite drives the store and an exact
// reference Model with the same requests at the same instants and requires
// identical decisions and errors; it also checks the no-oversell guarantee,
// clock steps backwards, idle gaps, limits that never refill, bad
// parameters, idempotent request IDs, limit changes under each conversion,
// separate policies on one key, sweeps between steps and under stale clock
// readings, and concurrent use.
//
// A store under test reads time only from StoreOptions.Now, which the suite
// backs with a manual Clock; no test sleeps. A store package runs it from a
// test:
//
//	func TestConformance(t *testing.T) {
//		sluicetest.Run(t, sluicetest.Suite{
//			New: func(t *testing.T, o sluicetest.StoreOptions) sluice.Store {
//				s, err := memstore.New(memstore.Options{
//					Now:           o.Now,
//					OnLimitChange: o.OnLimitChange,
//					RequestIDTTL:  o.RequestIDTTL,
//					SweepInterval: -1, // the suite's clock decides when state goes
//				})
//				if err != nil {
//					t.Fatal(err)
//				}
//				t.Cleanup(func() { s.Close() })
//				return s
//			},
//			Sweep: func(st sluice.Store) { st.(*memstore.Store).SweepNow() },
//		})
//	}
package sluicetest

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sluicehq/sluice"
)

// StoreOptions are what the suite asks a store factory for.
type StoreOptions struct {
	// Now is the clock. The store must read time only from it. Its epoch
	// (tick zero) may be any fixed instant (one call of Now when it is
	// built, or an absolute epoch shared by many processes): the suite only
	// moves the clock by whole ticks, so differences stay exact.
	Now func() time.Time
	// OnLimitChange is how levels carry over on a limit change.
	OnLimitChange sluice.Conversion
	// RequestIDTTL is how long the first decision of a request ID is
	// remembered. The suite always sets it to a positive duration.
	RequestIDTTL time.Duration
}

// Suite describes a store to Run.
//
// The suite compares a store exactly with a Model that never drops a bucket,
// so while a test runs the store must keep every bucket: background sweeping
// should be off (or far slower than a test) and the bound on keys well above
// the few thousand the suite uses. Dropping a full bucket is lossless only
// while time moves forwards: if the clock then steps back, a bucket
// recreated at the earlier time refills from there, not from its stamp.
//
// A request ID must be honoured until its TTL ends. A store may forget it
// from the moment the clock has shown that end (the bound on remembered IDs
// must also be well above what the suite uses): if the clock later steps back
// before the end, the suite accepts either the remembered answer or a new
// decision.
type Suite struct {
	// New returns a fresh, empty store built with o. It registers any
	// cleanup (closing the store) with t.Cleanup. The suite calls New
	// before it moves the clock.
	New func(t *testing.T, o StoreOptions) sluice.Store
	// Tick is the store's time unit: 1ns for memstore, 1µs for a store
	// that counts microseconds. It must divide one second. Zero means 1ns.
	Tick time.Duration
	// Workers and TakesPerWorker size the concurrency tests: Workers
	// goroutines each make TakesPerWorker takes. Zero means 64 and 10000.
	Workers, TakesPerWorker int
	// Supports reports whether the store decides limit l, for a store that
	// cannot decide every valid limit exactly (the Redis store's Lua
	// arithmetic is exact only below 2^53); a non-nil error means it
	// refuses l. Nil means the store decides every valid limit whose period
	// is a whole number of Ticks.
	//
	// For a request that passes sluice.Request.Validate (or a Peek whose key
	// and limit are valid) under a limit the store refuses, the suite
	// requires an error wrapping sluice.ErrInvalidLimit that changes
	// nothing, and does not consult the model. A fixed case that needs a
	// refused limit is skipped; the property tests draw limits the store
	// accepts (a refused limit's capacity is halved until it is accepted),
	// and sometimes change a key to a refused one.
	Supports func(sluice.Limit) error
	// Sweep, when set, makes the store drop now, at its current clock
	// reading, what its background maintenance would drop: full buckets
	// and expired request IDs (memstore's SweepNow, pgstore's sweep). The
	// suite calls it between the steps of the model tests, and concurrently
	// with takes whose clock readings are stale (read before a sweep with
	// a later reading ran). Nil means the store has no sweep of its own
	// (Redis expires keys by itself).
	Sweep func(st sluice.Store)
}

// Defaults of the zero Suite fields.
const (
	DefaultWorkers        = 64
	DefaultTakesPerWorker = 10000
)

// testPolicy is the policy of the suite's requests, unless a test says
// otherwise.
const testPolicy = "test"

// start is tick zero of every test: an arbitrary wall time, so that a store
// that reads the zero time or time.Now by mistake is noticed.
var start = time.Date(2031, time.March, 14, 15, 9, 26, 535897932, time.UTC)

// Run runs the conformance suite against the stores s.New makes. Each test
// is a subtest with a fresh store. The model-based property tests use
// pgregory.net/rapid with its defaults (100 checks of about 30 steps);
// -rapid.checks and -rapid.steps raise them.
func Run(t *testing.T, s Suite) {
	t.Helper()
	if s.New == nil {
		t.Fatal("sluicetest.Suite.New is nil")
	}
	if s.Tick == 0 {
		s.Tick = time.Nanosecond
	}
	if s.Tick < 0 || time.Second%s.Tick != 0 {
		t.Fatalf("sluicetest.Suite.Tick = %v; it must be positive and divide one second", s.Tick)
	}
	if s.Workers <= 0 {
		s.Workers = DefaultWorkers
	}
	if s.TakesPerWorker <= 0 {
		s.TakesPerWorker = DefaultTakesPerWorker
	}
	t.Run("Model", s.testModel)
	t.Run("Guarantee", s.testGuarantee)
	t.Run("ClockRollback", s.testClockRollback)
	t.Run("IdleGaps", s.testIdleGaps)
	t.Run("NoRefill", s.testNoRefill)
	t.Run("WholeCapacity", s.testWholeCapacity)
	t.Run("BadParameters", s.testBadParameters)
	t.Run("RequestIDs", s.testRequestIDs)
	t.Run("LimitChanges", s.testLimitChanges)
	t.Run("ConcurrentOneKey", s.testConcurrentOneKey)
	t.Run("ConcurrentKeys", s.testConcurrentKeys)
	t.Run("Policies", s.testPolicies)
	t.Run("StaleReadingSweep", s.testStaleReadingSweep)
	t.Run("ConcurrentStaleSweeps", s.testConcurrentStaleSweeps)
	// The operations of sluice.Operator, for a store that implements it.
	t.Run("TakeAll", s.testTakeAll)
	t.Run("Drain", s.testDrain)
	t.Run("Refund", s.testRefund)
	t.Run("Reset", s.testReset)
	t.Run("OpsBadInput", s.testOpsBadInput)
	t.Run("ConcurrentTakeAll", s.testConcurrentTakeAll)
	t.Run("ConcurrentDrainRefund", s.testConcurrentDrainRefund)
}

// tb is what the checks need of *testing.T and *rapid.T.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
}

// rig drives a store and a Model with the same calls at the same instants
// and fails on the first difference.
type rig struct {
	store    sluice.Store
	supports func(sluice.Limit) error // nil: every limit
	model    *Model
	clock    *Clock
	tick     time.Duration
	now      int64 // ticks since start
	hwm      int64 // the latest tick the clock has shown
	ctx      context.Context
}

func (s Suite) newRig(t *testing.T, conv sluice.Conversion, requestIDTTL time.Duration) *rig {
	t.Helper()
	c := NewClock(start)
	st := s.New(t, StoreOptions{Now: c.Now, OnLimitChange: conv, RequestIDTTL: requestIDTTL})
	if st == nil {
		t.Fatal("sluicetest.Suite.New returned nil")
	}
	return &rig{
		store:    st,
		supports: s.Supports,
		model:    NewModel(s.Tick, conv, requestIDTTL),
		clock:    c,
		tick:     s.Tick,
		ctx:      context.Background(),
	}
}

// set moves the clock to tick now.
func (r *rig) set(now int64) {
	r.now = now
	r.hwm = max(r.hwm, now)
	r.clock.Set(start.Add(time.Duration(now) * r.tick))
}

// advance moves the clock by d, which must be a whole number of ticks and
// may be negative.
func (r *rig) advance(d time.Duration) {
	r.set(r.now + int64(d/r.tick))
}

// ticks returns d in ticks, rounded down.
func (r *rig) ticks(d time.Duration) int64 { return int64(d / r.tick) }

// take makes the same request of the store and the model, fails t unless
// both return the same decision or the same sentinel error, and returns them.
func (r *rig) take(t tb, req sluice.Request) (sluice.Decision, error) {
	t.Helper()
	got, err := r.store.Take(r.ctx, req)
	if r.refusedLimit(t, fmt.Sprintf("Take(%s) at %v", describe(req), r.at()), req.Validate() == nil, req.Limit, got, err) {
		return got, err
	}
	if r.forgettable(req) {
		// The store may or may not have forgotten the request ID: the
		// model's answer if it did not (a replay or a conflict, which
		// changes nothing), else the model forgets it too.
		want, wantErr := r.model.Take(r.now, req)
		if differ(got, err, want, wantErr) == "" {
			return got, err
		}
		delete(r.model.ids, modelIDKey{req.Policy, req.Key, req.RequestID})
	}
	want, wantErr := r.model.Take(r.now, req)
	same(t, fmt.Sprintf("Take(%s) at %v", describe(req), r.at()), got, err, want, wantErr)
	return got, err
}

// forgettable reports whether the store may have forgotten the request ID
// of req although the model still honours it: its TTL ended at a time the
// clock has shown (a store may then drop it, as bounded memory requires),
// and the clock has since stepped back before that end.
func (r *rig) forgettable(req sluice.Request) bool {
	if req.RequestID == "" {
		return false
	}
	rec, ok := r.model.ids[modelIDKey{req.Policy, req.Key, req.RequestID}]
	if !ok {
		return false
	}
	end := satAdd(rec.at, r.model.idTTL)
	return r.now < end && end <= r.hwm
}

// refused returns the error of Suite.Supports for l, nil if the store
// decides l.
func (r *rig) refused(l sluice.Limit) error {
	if r.supports == nil {
		return nil
	}
	return r.supports(l)
}

// peek is take for Peek of one token of key under l, in the suite's
// default policy.
func (r *rig) peek(t tb, key string, l sluice.Limit) (sluice.Decision, error) {
	t.Helper()
	return r.peekReq(t, sluice.Request{Policy: testPolicy, Key: key, Cost: 1, Limit: l})
}

// peekReq is take for Peek.
func (r *rig) peekReq(t tb, req sluice.Request) (sluice.Decision, error) {
	t.Helper()
	got, err := r.store.Peek(r.ctx, req)
	if r.refusedLimit(t, fmt.Sprintf("Peek(%s) at %v", describe(req), r.at()), req.ValidatePeek() == nil, req.Limit, got, err) {
		return got, err
	}
	want, wantErr := r.model.Peek(r.now, req)
	same(t, fmt.Sprintf("Peek(%s) at %v", describe(req), r.at()), got, err, want, wantErr)
	return got, err
}

// mustTake is take for a request that must not fail, checked against a
// hand-computed decision as well as the model. If the store refuses the
// limit (Suite.Supports), the refusal is checked and the test skipped.
func (r *rig) mustTake(t tb, req sluice.Request, want sluice.Decision) {
	t.Helper()
	got, err := r.take(t, req)
	if why := r.refused(req.Limit); why != nil {
		t.Skipf("the store refuses limit %v, which this case needs: %v", req.Limit, why)
	}
	if err != nil {
		t.Fatalf("Take(%s) at %v: %v", describe(req), r.at(), err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("Take(%s) at %v = %+v, want %+v (-want +got):\n%s", describe(req), r.at(), got, want, diff)
	}
}

// mustPeek is mustTake for a Peek of one token of key under l, in the
// suite's default policy.
func (r *rig) mustPeek(t tb, key string, l sluice.Limit, want sluice.Decision) {
	t.Helper()
	r.mustPeekReq(t, sluice.Request{Policy: testPolicy, Key: key, Cost: 1, Limit: l}, want)
}

// mustPeekReq is mustTake for Peek.
func (r *rig) mustPeekReq(t tb, req sluice.Request, want sluice.Decision) {
	t.Helper()
	got, err := r.peekReq(t, req)
	if why := r.refused(req.Limit); why != nil {
		t.Skipf("the store refuses limit %v, which this case needs: %v", req.Limit, why)
	}
	if err != nil {
		t.Fatalf("Peek(%s) at %v: %v", describe(req), r.at(), err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("Peek(%s) at %v = %+v, want %+v (-want +got):\n%s", describe(req), r.at(), got, want, diff)
	}
}

// at describes the current instant for failure messages.
func (r *rig) at() string {
	return fmt.Sprintf("tick %d (+%v)", r.now, time.Duration(r.now)*r.tick)
}

// same fails t unless (got, err) equals (want, wantErr): equal decisions, or
// errors wrapping the same sluice sentinel.
func same(t tb, call string, got sluice.Decision, err error, want sluice.Decision, wantErr error) {
	t.Helper()
	if msg := differ(got, err, want, wantErr); msg != "" {
		t.Fatalf("%s%s", call, msg)
	}
}

// differ returns "" if (got, err) equals (want, wantErr), else the end of a
// failure message.
func differ(got sluice.Decision, err error, want sluice.Decision, wantErr error) string {
	if wantErr != nil {
		target := sentinel(wantErr)
		if err == nil || !errors.Is(err, target) {
			return fmt.Sprintf(" = %+v, %v; want error %v (%v)", got, err, target, wantErr)
		}
		return ""
	}
	if err != nil {
		return fmt.Sprintf(": error %v; want %+v", err, want)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		return fmt.Sprintf(" = %+v, want %+v (the model's) (-want +got):\n%s", got, want, diff)
	}
	return ""
}

var sentinels = []error{
	sluice.ErrInvalidPolicy,
	sluice.ErrInvalidKey,
	sluice.ErrInvalidCost,
	sluice.ErrInvalidLimit,
	sluice.ErrInvalidRequestID,
	sluice.ErrRequestIDConflict,
	sluice.ErrUnknownRequestID,
	sluice.ErrInvalidMulti,
	sluice.ErrTooManyKeys,
}

// sentinel returns the sluice sentinel err wraps, or err itself.
func sentinel(err error) error {
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return s
		}
	}
	return err
}

// describe formats a request compactly for failure messages.
func describe(r sluice.Request) string {
	s := fmt.Sprintf("policy %q, key %q, cost %d, limit %q", short(r.Policy), short(r.Key), r.Cost, r.Limit)
	if r.RequestID != "" {
		s += fmt.Sprintf(", ID %q", short(r.RequestID))
	}
	return s
}

// short abbreviates long keys and IDs in messages.
func short(s string) string {
	if len(s) <= 40 {
		return s
	}
	return fmt.Sprintf("%s...(%d bytes)", s[:16], len(s))
}

// level formats an exact level.
func level(x *big.Rat) string {
	if x == nil {
		return "missing"
	}
	return x.RatString()
}
