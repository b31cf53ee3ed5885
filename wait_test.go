package sluice_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
)

func newWaitLimiter(t *testing.T, l sluice.Limit) *sluice.Limiter {
	t.Helper()
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	lim, err := sluice.NewLimiter(st, "wait", l)
	if err != nil {
		t.Fatal(err)
	}
	return lim
}

// Wait sleeps until the bucket covers the cost: 20 tokens a second, an
// empty bucket, a cost of 2 takes about 100 ms.
func TestWaitSleepsUntilAllowed(t *testing.T) {
	lim := newWaitLimiter(t, sluice.Limit{Capacity: 2, Rate: sluice.PerSecond(20)})
	ctx := t.Context()
	if d, err := lim.Wait(ctx, "k", 2); err != nil || !d.Allowed {
		t.Fatalf("first Wait = %+v, %v", d, err)
	}
	begin := time.Now()
	d, err := lim.Wait(ctx, "k", 2)
	took := time.Since(begin)
	if err != nil || !d.Allowed {
		t.Fatalf("second Wait = %+v, %v", d, err)
	}
	if took < 100*time.Millisecond {
		t.Fatalf("Wait returned after %v; the bucket needed 100ms to cover 2 tokens", took)
	}
}

// Wait returns at once when no wait helps or the wait ends after the
// deadline, and with ctx's error when ctx ends during the sleep.
func TestWaitRefuses(t *testing.T) {
	never := newWaitLimiter(t, sluice.Limit{Capacity: 1, Rate: sluice.Per(0, time.Second)})
	if _, err := never.Wait(t.Context(), "k", 1); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	d, err := never.Wait(t.Context(), "k", 1)
	if !errors.Is(err, sluice.ErrWaitNever) || d.RetryAfter != sluice.Never || time.Since(begin) > 50*time.Millisecond {
		t.Fatalf("Wait on a bucket that never refills = %+v, %v after %v; want ErrWaitNever at once", d, err, time.Since(begin))
	}

	slow := newWaitLimiter(t, sluice.Limit{Capacity: 1, Rate: sluice.Per(1, time.Hour)})
	if _, err := slow.Wait(t.Context(), "k", 1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	begin = time.Now()
	d, err = slow.Wait(ctx, "k", 1)
	if !errors.Is(err, sluice.ErrWaitTooLong) || d.Allowed || time.Since(begin) > 50*time.Millisecond {
		t.Fatalf("Wait of an hour under a 5s deadline = %+v, %v after %v; want ErrWaitTooLong at once", d, err, time.Since(begin))
	}

	// No deadline: the wait starts, and cancelling ends it.
	ctx, cancel = context.WithCancel(t.Context())
	go func() { time.Sleep(50 * time.Millisecond); cancel() }()
	begin = time.Now()
	_, err = slow.Wait(ctx, "k", 1)
	if !errors.Is(err, context.Canceled) || time.Since(begin) > time.Second {
		t.Fatalf("cancelled Wait = %v after %v; want context.Canceled soon after 50ms", err, time.Since(begin))
	}
	// Bad input is the store's error, at once.
	if _, err := slow.Wait(t.Context(), "k", 2); !errors.Is(err, sluice.ErrInvalidCost) {
		t.Fatalf("Wait of more than the capacity = %v, want ErrInvalidCost", err)
	}
}

// Concurrent waiters share the refill: 10 waiters for one token each on an
// empty bucket of 100/s all get through, and no more than the refill
// allows.
func TestWaitConcurrent(t *testing.T) {
	lim := newWaitLimiter(t, sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(100)})
	ctx := t.Context()
	if _, err := lim.Wait(ctx, "k", 1); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	errs := make(chan error, 10)
	for range 10 {
		go func() {
			d, err := lim.Wait(ctx, "k", 1)
			if err == nil && !d.Allowed {
				err = errors.New("Wait returned a denial without an error")
			}
			errs <- err
		}()
	}
	for range 10 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if took := time.Since(begin); took < 100*time.Millisecond {
		t.Fatalf("10 waiters for 10 tokens at 100/s finished after %v; the refill takes 100ms", took)
	}
}
