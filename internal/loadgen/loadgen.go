// Package loadgen is the engine of `sluice loadgen`: it sends takes to a
// target (a running service over its HTTP, gRPC or Envoy API, or a store
// in this process) at a fixed concurrency or at a fixed rate, and counts
// every take asked for as allowed, denied or an error of some kind, with
// the latency of each request in an HdrHistogram.
//
// Closed loop (Options.Rate 0): Options.Concurrency request slots each
// send a request, wait for its answer, and send the next; the latency of
// a request runs from its send to its answer. A closed loop measures the
// throughput the target can sustain, but its latencies hide a stall: while
// the target is stuck, the slots send nothing, and the requests that would
// have been sent meanwhile are never measured (coordinated omission).
//
// Open loop (Options.Rate R): request i is due at start + i/R, whatever
// became of the others, and its latency runs from that intended send time
// to its answer. A slot that is free picks the next due request; when all
// slots are busy the request waits, and the wait is part of its latency,
// as it would be for a real client whose request arrives at that moment.
// When a free slot picked the request before it was due, the latency runs
// from the moment it was actually sent instead, so that the generator's
// own timer waking a little late is not charged to the target. The
// latency from the actual send alone (the service time) is recorded too.
//
// The latencies are those of the requests that got a decision, timed out,
// or (open loop) found no free slot within the timeout; a request that
// failed otherwise is counted as an error only.
//
// A run is bounded by Options.Duration, Options.Count, or both (whichever
// comes first), after an optional warm-up whose requests are sent the same
// way and counted apart.
package loadgen

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"

	"github.com/sluicehq/sluice"
)

// Bounds of the Options.
const (
	MaxConcurrency = 10000
	MaxRate        = 10_000_000 // requests a second
	MaxBatch       = 1000       // the service's default bound on a batch
	MaxDuration    = 24 * time.Hour
	MaxWarmup      = time.Hour
	MaxTimeout     = 10 * time.Minute
	MinInterval    = 10 * time.Millisecond
)

// lateAfter is how far behind its intended send time an open-loop request
// must leave to count as late in the summary.
const lateAfter = time.Millisecond

// Options configure a run.
type Options struct {
	// Concurrency is the number of request slots: the requests in flight
	// in a closed loop, the most in flight in an open one. 1 to
	// MaxConcurrency.
	Concurrency int
	// Rate, if not 0, makes the loop open: requests are due at Rate a
	// second, up to MaxRate.
	Rate float64
	// Duration bounds the measured phase, 0 for no bound by time; Count
	// bounds its requests, 0 for no bound by count. At least one is set.
	Duration time.Duration
	Count    int64
	// Warmup is sent before the measured phase, the same way, and counted
	// apart.
	Warmup time.Duration
	// Batch is the takes of one request, 1 to MaxBatch.
	Batch int
	Keys  Keys
	Costs Costs
	// Timeout bounds one request, up to MaxTimeout. In an open loop, a
	// request still waiting for a free slot Timeout after it was due is
	// not sent, and counts as an error of kind "overdue".
	Timeout time.Duration
	// Seed seeds the draws of keys and costs; a run with the same seed
	// and the same slots draws the same sequences in each slot.
	Seed uint64
	// Progress, if not nil, is called every Interval (at least
	// MinInterval) with the counts so far, from a goroutine of the run.
	Progress func(Snapshot)
	Interval time.Duration
}

// Check reports the first option out of its range, with an error
// wrapping sluice.ErrInvalidOption (or sluice.ErrInvalidKey for a key
// prefix too long). Run checks them too.
func (o Options) Check() error {
	inv := sluice.ErrInvalidOption
	switch {
	case o.Concurrency < 1 || o.Concurrency > MaxConcurrency:
		return fmt.Errorf("%w: concurrency %d: want 1 to %d", inv, o.Concurrency, MaxConcurrency)
	case math.IsNaN(o.Rate) || o.Rate < 0 || o.Rate > MaxRate:
		return fmt.Errorf("%w: rate %v: want 0 (a closed loop) or up to %d requests a second", inv, o.Rate, MaxRate)
	case o.Duration < 0 || o.Duration > MaxDuration:
		return fmt.Errorf("%w: duration %v: want 0 to %v", inv, o.Duration, MaxDuration)
	case o.Count < 0:
		return fmt.Errorf("%w: count %d: want 0 or more", inv, o.Count)
	case o.Duration == 0 && o.Count == 0:
		return fmt.Errorf("%w: neither a duration nor a count bounds the run", inv)
	case o.Warmup < 0 || o.Warmup > MaxWarmup:
		return fmt.Errorf("%w: warm-up %v: want 0 to %v", inv, o.Warmup, MaxWarmup)
	case o.Batch < 1 || o.Batch > MaxBatch:
		return fmt.Errorf("%w: batch of %d takes: want 1 to %d", inv, o.Batch, MaxBatch)
	case o.Timeout <= 0 || o.Timeout > MaxTimeout:
		return fmt.Errorf("%w: timeout %v: want above 0, at most %v", inv, o.Timeout, MaxTimeout)
	case o.Progress != nil && o.Interval < MinInterval:
		return fmt.Errorf("%w: progress interval %v: want at least %v", inv, o.Interval, MinInterval)
	}
	if err := o.Keys.check(); err != nil {
		return err
	}
	return o.Costs.check()
}

// Snapshot is the progress of a run so far.
type Snapshot struct {
	// Warmup reports that the warm-up is still on; the counts are then
	// the warm-up's.
	Warmup bool
	// Elapsed is the time since the start of the phase.
	Elapsed time.Duration
	// The counts of the phase so far.
	Requests, Decisions, Allowed, Denied, Errors int64
	// InFlight is the number of requests in flight now.
	InFlight int64
	// P99 is the 99th percentile of the measured phase's latencies so far.
	P99 time.Duration
}

// Run sends the load of o to t and returns its summary. It returns an
// error, and no summary, only for Options out of range (wrapping
// sluice.ErrInvalidOption). When ctx ends the run stops sending, lets the
// requests in flight finish (within the timeout) and returns the summary
// of what was done, Interrupted set.
func Run(ctx context.Context, t Target, o Options) (*Summary, error) {
	if err := o.Check(); err != nil {
		return nil, err
	}
	e := &engine{t: t, o: o, keys: newKeySpace(o.Keys), interrupt: make(chan struct{})}
	return e.run(ctx), nil
}

type engine struct {
	t    Target
	o    Options
	keys *keySpace

	start, measure, end time.Time // end: zero for no bound by time
	period              float64   // open loop: ns between due times
	warmTickets         int64     // open loop: the warm-up's tickets

	shards   []*shard
	ticket   atomic.Int64 // open loop: the next ticket; closed loop: measured requests issued
	inFlight atomic.Int64

	// stop is set when the run's bounds are reached, or ctx ends: a slot
	// takes no new request then.
	stop atomic.Bool
	// interrupt is closed when ctx ends: a slot waiting for a request's
	// due time drops it. (A request due within the bounds is still sent
	// when another slot found the bounds reached.)
	interrupt chan struct{}
	// interrupted reports that ctx ended the run.
	interrupted atomic.Bool
}

func (e *engine) halt() { e.stop.Store(true) }

func (e *engine) run(ctx context.Context) *Summary {
	open := e.o.Rate > 0
	// A shard per few slots: four per core keep the slots' locks mostly
	// free, and at most 64 bound the histograms' memory (about 30 MB).
	n := min(e.o.Concurrency, max(4, 4*runtime.GOMAXPROCS(0)), 64)
	e.shards = make([]*shard, n)
	for i := range e.shards {
		e.shards[i] = newShard(open)
	}
	if open {
		e.period = float64(time.Second) / e.o.Rate
		e.warmTickets = int64(math.Ceil(float64(e.o.Warmup) / e.period))
	}
	cpu0, _ := CPUTime()
	e.start = time.Now()
	e.measure = e.start.Add(e.o.Warmup)
	if e.o.Duration > 0 {
		e.end = e.measure.Add(e.o.Duration)
	}
	// Requests run under a context that ctx's end does not cancel: those
	// in flight when the run is interrupted get their answer.
	reqCtx := context.WithoutCancel(ctx)
	stopWatch := context.AfterFunc(ctx, func() {
		e.interrupted.Store(true)
		e.halt()
		close(e.interrupt) // AfterFunc calls this once
	})
	defer stopWatch()

	progressDone := make(chan struct{})
	var progressWG sync.WaitGroup
	if e.o.Progress != nil {
		progressWG.Go(func() { e.progress(progressDone) })
	}
	var wg sync.WaitGroup
	for i := range e.o.Concurrency {
		wg.Go(func() { e.slot(reqCtx, i) })
	}
	wg.Wait()
	end := time.Now()
	close(progressDone)
	progressWG.Wait()
	cpu1, cpuOK := CPUTime()

	s := e.summary(end)
	if cpuOK {
		s.GeneratorCPUSeconds = (cpu1 - cpu0).Seconds()
		s.GeneratorCores = s.GeneratorCPUSeconds / end.Sub(e.start).Seconds()
	}
	return s
}

// next returns the next request a slot sends: whether it is measured, when
// it was due (open loop) or is sent (closed loop), and whether it is due
// already. ok is false when the run is over for the slot.
func (e *engine) next(timer *time.Timer) (measured bool, due time.Time, waited bool, ok bool) {
	if e.stop.Load() {
		return false, time.Time{}, false, false
	}
	if e.o.Rate == 0 {
		now := time.Now()
		if now.Before(e.measure) {
			return false, now, false, true
		}
		if !e.end.IsZero() && !now.Before(e.end) {
			e.halt()
			return false, time.Time{}, false, false
		}
		if e.o.Count > 0 && e.ticket.Add(1) > e.o.Count {
			e.halt()
			return false, time.Time{}, false, false
		}
		return true, now, false, true
	}
	i := e.ticket.Add(1) - 1
	measured = i >= e.warmTickets
	due = e.start.Add(time.Duration(float64(i) * e.period))
	if measured && (e.o.Count > 0 && i-e.warmTickets >= e.o.Count || !e.end.IsZero() && !due.Before(e.end)) {
		e.halt()
		return false, time.Time{}, false, false
	}
	if d := time.Until(due); d > 0 {
		timer.Reset(d)
		select {
		case <-timer.C:
		case <-e.interrupt:
			return false, time.Time{}, false, false
		}
		waited = true
	}
	return measured, due, waited, true
}

// slot is request slot i: it sends requests until the run is over.
func (e *engine) slot(ctx context.Context, i int) {
	sender := e.t.Sender(i)
	sh := e.shards[i%len(e.shards)]
	rng := rand.New(rand.NewPCG(e.o.Seed, uint64(i)))
	keys := e.keys.picker(rng)
	items := make([]Item, e.o.Batch)
	out := make([]Result, e.o.Batch)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	overdue := fail(kindOverdue, fmt.Sprintf("no request slot was free within the timeout (%v) of the request's send time: all %d were busy; raise -concurrency or lower -rate", e.o.Timeout, e.o.Concurrency))
	for {
		measured, due, waited, ok := e.next(timer)
		if !ok {
			return
		}
		for j := range items {
			items[j] = Item{Key: e.keys.name(keys.next()), Cost: e.o.Costs.draw(rng)}
			out[j] = Result{}
		}
		sent := time.Now()
		// The latency runs from the due time, unless a free slot waited
		// for it (then from the actual send: a timer that woke late is
		// the generator's delay). In a closed loop due is the send.
		from, late := due, sent.Sub(due)
		if waited || e.o.Rate == 0 {
			from, late = sent, 0
		}
		if e.o.Rate > 0 && late > e.o.Timeout {
			setAll(out, overdue)
			sh.record(measured, out, late, 0, late, true)
			continue
		}
		e.inFlight.Add(1)
		rctx, cancel := context.WithTimeout(ctx, e.o.Timeout)
		done := sender.Send(rctx, items, out)
		cancel()
		if done.IsZero() {
			done = time.Now()
		}
		e.inFlight.Add(-1)
		sh.record(measured, out, done.Sub(from), done.Sub(sent), late, late >= lateAfter)
	}
}

// progress calls Options.Progress every Interval until done is closed:
// every Interval from the start during the warm-up, then every Interval
// from the start of the measured phase, so that no snapshot covers a
// sliver of a phase.
func (e *engine) progress(done chan struct{}) {
	scratch := newHist()
	next := e.start.Add(e.o.Interval)
	if !next.Before(e.measure) {
		next = e.measure.Add(e.o.Interval)
	}
	timer := time.NewTimer(time.Until(next))
	defer timer.Stop()
	for {
		select {
		case <-done:
			return
		case <-timer.C:
		}
		e.o.Progress(e.snapshot(next.Before(e.measure), time.Now(), scratch))
		prev := next
		next = next.Add(e.o.Interval)
		if prev.Before(e.measure) && !next.Before(e.measure) {
			next = e.measure.Add(e.o.Interval)
		}
		timer.Reset(time.Until(next))
	}
}

// snapshot returns the counts of the warm-up (warm) or of the measured
// phase, at now.
func (e *engine) snapshot(warm bool, now time.Time, scratch *hdrhistogram.Histogram) Snapshot {
	var c counts
	scratch.Reset()
	for _, sh := range e.shards {
		sh.mu.Lock()
		if warm {
			c.add(&sh.warmup.counts)
		} else {
			c.add(&sh.meas.counts)
			scratch.Merge(sh.meas.latency)
		}
		sh.mu.Unlock()
	}
	s := Snapshot{
		Warmup: warm, Requests: c.requests, Decisions: c.decisions,
		Allowed: c.allowed, Denied: c.denied, Errors: c.errors,
		InFlight: e.inFlight.Load(),
	}
	if warm {
		s.Elapsed = now.Sub(e.start)
	} else {
		s.Elapsed = now.Sub(e.measure)
		s.P99 = time.Duration(scratch.ValueAtQuantile(99))
	}
	return s
}
