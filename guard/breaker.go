package guard

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// BreakerState is the state of a Store's circuit breaker.
type BreakerState uint8

const (
	// BreakerClosed: every call goes to the store.
	BreakerClosed BreakerState = iota
	// BreakerOpen: no call goes to the store; the failure mode answers at once
	// until the probe interval has passed.
	BreakerOpen
	// BreakerHalfOpen: one call (the probe) is with the store; the others
	// are answered by the failure mode. The probe's success closes the breaker,
	// its failure opens it for another interval.
	BreakerHalfOpen
)

// String returns "closed", "open" or "half-open".
func (b BreakerState) String() string {
	switch b {
	case BreakerClosed:
		return "closed"
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half-open"
	}
	return fmt.Sprintf("BreakerState(%d)", uint8(b))
}

// slots is the number of slots of the failure-ratio window.
const slots = 10

// slot counts the calls of one tenth of the window.
type slot struct {
	index      int64 // which tenth of time since the epoch it counts
	ok, failed int
}

// breaker is the circuit breaker of a Store. Its fast path (closed) reads
// one atomic; everything else is under mu.
type breaker struct {
	consecutive int // failures in a row that open it; 0: off
	percent     int // failure percentage that opens it; 0: off
	minCalls    int
	slotLen     time.Duration
	probeEvery  time.Duration
	epoch       time.Time
	onChange    func(from, to BreakerState)

	state atomic.Uint32 // BreakerState, written under mu

	mu        sync.Mutex
	inRow     int
	window    [slots]slot
	since     time.Time
	nextProbe time.Time
	lastErr   error
	openCause error // wraps ErrBreakerOpen and the error that opened it
}

func (b *breaker) init(o Options, probe time.Duration, now time.Time) {
	switch n := o.ConsecutiveFailures; {
	case n == 0:
		b.consecutive = DefaultConsecutiveFailures
	case n < 0:
		b.consecutive = 0
	default:
		b.consecutive = n
	}
	switch p := o.FailurePercent; {
	case p == 0:
		b.percent = DefaultFailurePercent
	case p < 0:
		b.percent = 0
	default:
		b.percent = min(p, 100)
	}
	b.minCalls = o.MinCalls
	if b.minCalls <= 0 {
		b.minCalls = DefaultMinCalls
	}
	window := o.Window
	if window <= 0 {
		window = DefaultWindow
	}
	b.slotLen = max(window/slots, 1)
	b.probeEvery = probe
	b.epoch = now
	b.since = now
	b.onChange = o.Hooks.BreakerChange
}

// admit tells a call whether it may go to the store, and whether it is the
// probe. A call that may not gets the cause of the degraded decision. The
// clock is read only if the breaker is not closed.
func (b *breaker) admit(clock func() time.Time) (probe bool, cause error) {
	if BreakerState(b.state.Load()) == BreakerClosed {
		return false, nil
	}
	now := clock()
	b.mu.Lock()
	defer b.mu.Unlock()
	switch BreakerState(b.state.Load()) {
	case BreakerClosed:
		return false, nil
	case BreakerOpen:
		if !now.Before(b.nextProbe) {
			b.set(BreakerHalfOpen, now)
			return true, nil
		}
	}
	return false, b.openCause
}

// success records a call the store answered.
func (b *breaker) success(now time.Time, probe bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case probe:
		b.reset()
		b.set(BreakerClosed, now)
	case BreakerState(b.state.Load()) == BreakerClosed:
		b.inRow = 0
		b.count(now, false)
	}
	// A call let through before the breaker opened that succeeds late
	// does not close it: only the probe does.
}

// failure records a store failure.
func (b *breaker) failure(now time.Time, probe bool, cause error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lastErr = cause
	switch {
	case probe:
		b.trip(now, cause)
	case BreakerState(b.state.Load()) == BreakerClosed:
		b.inRow++
		failed, total := b.count(now, true)
		if (b.consecutive > 0 && b.inRow >= b.consecutive) ||
			(b.percent > 0 && total >= b.minCalls && failed*100 >= total*b.percent) {
			b.trip(now, cause)
		}
	}
}

// abandon ends a probe that neither succeeded nor failed (the caller gave
// up, or the store panicked): the breaker goes back to open, and the next
// call probes.
func (b *breaker) abandon(now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if BreakerState(b.state.Load()) == BreakerHalfOpen {
		b.nextProbe = now
		b.set(BreakerOpen, now)
	}
}

// trip opens the breaker (mu held).
func (b *breaker) trip(now time.Time, cause error) {
	b.reset()
	b.nextProbe = now.Add(b.probeEvery)
	b.openCause = fmt.Errorf("%w; last store error: %w", ErrBreakerOpen, cause)
	b.set(BreakerOpen, now)
}

// reset forgets the counts of the closed state (mu held).
func (b *breaker) reset() {
	b.inRow = 0
	b.window = [slots]slot{}
}

// set moves the breaker to state to (mu held) and tells the hook.
func (b *breaker) set(to BreakerState, now time.Time) {
	from := BreakerState(b.state.Load())
	if from == to {
		return
	}
	b.state.Store(uint32(to))
	b.since = now
	if b.onChange != nil {
		b.onChange(from, to)
	}
}

// count adds one call to the window (mu held) and returns the failures and
// calls in the window ending now.
func (b *breaker) count(now time.Time, failed bool) (failures, total int) {
	idx := int64(now.Sub(b.epoch) / b.slotLen)
	s := &b.window[((idx%slots)+slots)%slots]
	if s.index != idx {
		*s = slot{index: idx}
	}
	if failed {
		s.failed++
	} else {
		s.ok++
	}
	for i := range b.window {
		if w := &b.window[i]; w.index > idx-slots && w.index <= idx {
			failures += w.failed
			total += w.ok + w.failed
		}
	}
	return failures, total
}

func (b *breaker) status() Status {
	b.mu.Lock()
	defer b.mu.Unlock()
	return Status{State: BreakerState(b.state.Load()), Since: b.since, LastError: b.lastErr}
}
