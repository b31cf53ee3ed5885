package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/pgstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// dbMicros reads the database clock in µs since the Unix epoch.
func dbMicros(t *testing.T) int64 {
	t.Helper()
	var us int64
	if err := testPool.QueryRow(context.Background(), "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint").Scan(&us); err != nil {
		t.Fatal(err)
	}
	return us
}

// TestDatabaseClock: without Options.Now, a take is stamped with the
// database clock, read during the statement, and the stamp never moves back.
func TestDatabaseClock(t *testing.T) {
	s, table := newStoreTable(t, pgstore.Options{})
	ctx := context.Background()
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
	var last int64
	for i := range 3 {
		before := dbMicros(t)
		d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: l})
		after := dbMicros(t)
		if err != nil || !d.Allowed {
			t.Fatalf("Take %d = %+v, %v", i, d, err)
		}
		r, _ := readRow(t, table, "k")
		if r.Stamp < before || r.Stamp > after || r.Stamp < last {
			t.Fatalf("take %d stamped %d, not within the database clock's [%d, %d] or before the previous stamp %d", i, r.Stamp, before, after, last)
		}
		last = r.Stamp
		// Less than a second refilled since the first take: the level is
		// 10 - (i+1) tokens and a fraction.
		if want := int64(9 - i); d.Remaining < want || d.Remaining > want+1 {
			t.Fatalf("Take %d: Remaining %d, want about %d", i, d.Remaining, want)
		}
	}
}

// TestPeekCreatesNothing: a Peek of a missing bucket reports it full and
// writes no row; a Peek of an existing one under another limit converts
// only its answer.
func TestPeekCreatesNothing(t *testing.T) {
	clock := sluicetest.NewClock(epoch)
	s, table := newStoreTable(t, pgstore.Options{Now: clock.Now})
	ctx := context.Background()
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(2)}
	d, err := s.Peek(ctx, sluice.Request{Policy: testPolicy, Key: "missing", Cost: 1, Limit: l})
	if want := (sluice.Decision{Allowed: true, Remaining: 10, Limit: l}); err != nil || d != want {
		t.Fatalf("Peek(missing) = %+v, %v; want %+v", d, err, want)
	}
	if _, ok := readRow(t, table, "missing"); ok {
		t.Fatalf("Peek created a row for a missing key")
	}
	if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 6, Limit: l}); err != nil {
		t.Fatal(err)
	}
	before, _ := readRow(t, table, "k")
	clock.Set(epoch.Add(time.Second))
	other := sluice.Limit{Capacity: 3, Rate: sluice.PerSecond(1)}
	d, err = s.Peek(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: other})
	// 4 + 2 = 6 tokens, kept and clamped to 3: full under the new limit.
	if want := (sluice.Decision{Allowed: true, Remaining: 3, Limit: other}); err != nil || d != want {
		t.Fatalf("Peek(k, %v) = %+v, %v; want %+v", other, d, err, want)
	}
	if after, _ := readRow(t, table, "k"); after != before {
		t.Fatalf("Peek changed the row from %+v to %+v", before, after)
	}
}

// TestReplayAfterSweep: a request ID outlives its bucket. Once the bucket
// is full and swept, a retry still gets the remembered decision, consumes
// nothing and leaves no bucket behind; after the TTL it is decided anew.
func TestReplayAfterSweep(t *testing.T) {
	clock := sluicetest.NewClock(epoch)
	s, table := newStoreTable(t, pgstore.Options{Now: clock.Now, RequestIDTTL: time.Minute})
	ctx := context.Background()
	l := sluice.Limit{Capacity: 5, Rate: sluice.PerSecond(1)}
	r := sluice.Request{Policy: testPolicy, Key: "k", Cost: 5, Limit: l, RequestID: "charge-1"}
	first, err := s.Take(ctx, r)
	if want := (sluice.Decision{Allowed: true, Remaining: 0, ResetAfter: 5 * time.Second, Limit: l}); err != nil || first != want {
		t.Fatalf("Take = %+v, %v; want %+v", first, err, want)
	}
	clock.Set(epoch.Add(10 * time.Second))
	if swept, err := s.Sweep(ctx); err != nil || swept != (pgstore.Swept{Buckets: 1}) {
		t.Fatalf("Sweep() = %+v, %v; want the full bucket swept", swept, err)
	}
	got, err := s.Take(ctx, r)
	if want := replayed(first); err != nil || got != want {
		t.Fatalf("retry after the sweep = %+v, %v; want %+v", got, err, want)
	}
	if _, ok := readRow(t, table, "k"); ok {
		t.Fatalf("the replay left a bucket row")
	}
	if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 4, Limit: l, RequestID: "charge-1"}); err == nil {
		t.Fatalf("the same request ID with another cost was not a conflict")
	}
	clock.Set(epoch.Add(time.Minute))
	got, err = s.Take(ctx, r)
	if want := (sluice.Decision{Allowed: true, Remaining: 0, ResetAfter: 5 * time.Second, Limit: l}); err != nil || got != want {
		t.Fatalf("Take after the TTL = %+v, %v; want %+v (a new decision)", got, err, want)
	}
}

// TestDenialNotRemembered: a request ID remembers only an allowed
// decision. A denial took nothing, so its retry, even with another cost,
// decides afresh; once a retry is allowed, that decision is the one
// replayed.
func TestDenialNotRemembered(t *testing.T) {
	clock := sluicetest.NewClock(epoch)
	s, table := newStoreTable(t, pgstore.Options{Now: clock.Now, RequestIDTTL: time.Hour})
	ctx := context.Background()
	l := sluice.Limit{Capacity: 5, Rate: sluice.PerSecond(1)}
	if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 5, Limit: l}); err != nil {
		t.Fatal(err)
	}
	r := sluice.Request{Policy: testPolicy, Key: "k", Cost: 3, Limit: l, RequestID: "charge-1"}
	got, err := s.Take(ctx, r)
	if want := (sluice.Decision{Remaining: 0, RetryAfter: 3 * time.Second, ResetAfter: 5 * time.Second, Limit: l}); err != nil || got != want {
		t.Fatalf("Take(%+v) from an empty bucket = %+v, %v; want %+v", r, got, err, want)
	}
	if _, ids := readTables(t, table); len(ids) != 0 {
		t.Fatalf("a denial left request ID records %+v", ids)
	}
	other := r
	other.Cost = 2
	got, err = s.Take(ctx, other)
	if want := (sluice.Decision{Remaining: 0, RetryAfter: 2 * time.Second, ResetAfter: 5 * time.Second, Limit: l}); err != nil || got != want {
		t.Fatalf("Take(%+v) after a denial of the same ID with cost 3 = %+v, %v; want %+v (a new decision, no conflict)", other, got, err, want)
	}
	clock.Set(epoch.Add(3 * time.Second))
	first, err := s.Take(ctx, r)
	if want := (sluice.Decision{Allowed: true, Remaining: 0, ResetAfter: 5 * time.Second, Limit: l}); err != nil || first != want {
		t.Fatalf("retry of a denied Take(%+v) after 3s = %+v, %v; want %+v (decided afresh)", r, first, err, want)
	}
	clock.Set(epoch.Add(10 * time.Second))
	if got, err := s.Take(ctx, r); err != nil || got != replayed(first) {
		t.Fatalf("retry of an allowed Take(%+v) = %+v, %v; want %+v", r, got, err, replayed(first))
	}
}

// TestWaitsFromNow: after the clock steps back behind a bucket's stamp,
// RetryAfter and ResetAfter of Take and Peek are measured from the
// caller's now, so they include the time from now to the stamp; a wait
// that is zero stays zero.
func TestWaitsFromNow(t *testing.T) {
	clock := sluicetest.NewClock(epoch)
	s := newStore(t, pgstore.Options{Now: clock.Now})
	ctx := context.Background()
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
	at := func(d time.Duration) { clock.Set(epoch.Add(d)) }
	req := func(cost int64) sluice.Request {
		return sluice.Request{Policy: testPolicy, Key: "k", Cost: cost, Limit: l}
	}
	steps := []struct {
		at   time.Duration
		peek bool
		cost int64
		want sluice.Decision
	}{
		{0, false, 10, sluice.Decision{Allowed: true, Remaining: 0, ResetAfter: 10 * time.Second, Limit: l}},
		// 5s behind the stamp: the waits from the stamp, plus 5s.
		{-5 * time.Second, false, 1, sluice.Decision{Remaining: 0, RetryAfter: 6 * time.Second, ResetAfter: 15 * time.Second, Limit: l}},
		{-5 * time.Second, true, 3, sluice.Decision{Remaining: 0, RetryAfter: 8 * time.Second, ResetAfter: 15 * time.Second, Limit: l}},
		{10 * time.Second, false, 1, sluice.Decision{Allowed: true, Remaining: 9, ResetAfter: time.Second, Limit: l}},
		// The level covers the cost: no wait, however far behind.
		{5 * time.Second, true, 9, sluice.Decision{Allowed: true, Remaining: 9, ResetAfter: 6 * time.Second, Limit: l}},
		{5 * time.Second, true, 10, sluice.Decision{Remaining: 9, RetryAfter: 6 * time.Second, ResetAfter: 6 * time.Second, Limit: l}},
		{5 * time.Second, false, 1, sluice.Decision{Allowed: true, Remaining: 8, ResetAfter: 7 * time.Second, Limit: l}},
		{10 * time.Second, false, 1, sluice.Decision{Allowed: true, Remaining: 7, ResetAfter: 3 * time.Second, Limit: l}},
	}
	for i, st := range steps {
		at(st.at)
		var got sluice.Decision
		var err error
		op := "Take"
		if st.peek {
			op = "Peek"
			got, err = s.Peek(ctx, req(st.cost))
		} else {
			got, err = s.Take(ctx, req(st.cost))
		}
		if err != nil || got != st.want {
			t.Fatalf("step %d: %s(cost %d) at %v = %+v, %v; want %+v", i, op, st.cost, st.at, got, err, st.want)
		}
	}
}

// TestPeekCost: Peek answers for its request's cost, and is refused a
// cost outside [1, capacity] and a request ID before the database is
// asked.
func TestPeekCost(t *testing.T) {
	clock := sluicetest.NewClock(epoch)
	s := newStore(t, pgstore.Options{Now: clock.Now})
	ctx := context.Background()
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(2)}
	if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 7, Limit: l}); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		cost int64
		want sluice.Decision
	}{
		{3, sluice.Decision{Allowed: true, Remaining: 3, ResetAfter: 3500 * time.Millisecond, Limit: l}},
		{4, sluice.Decision{Remaining: 3, RetryAfter: 500 * time.Millisecond, ResetAfter: 3500 * time.Millisecond, Limit: l}},
		{10, sluice.Decision{Remaining: 3, RetryAfter: 3500 * time.Millisecond, ResetAfter: 3500 * time.Millisecond, Limit: l}},
	} {
		r := sluice.Request{Policy: testPolicy, Key: "k", Cost: tt.cost, Limit: l}
		if got, err := s.Peek(ctx, r); err != nil || got != tt.want {
			t.Errorf("Peek(cost %d) with 3 tokens = %+v, %v; want %+v", tt.cost, got, err, tt.want)
		}
	}
	for _, tt := range []struct {
		r    sluice.Request
		want error
	}{
		{sluice.Request{Policy: testPolicy, Key: "k", Cost: 11, Limit: l}, sluice.ErrInvalidCost},
		{sluice.Request{Policy: testPolicy, Key: "k", Cost: 0, Limit: l}, sluice.ErrInvalidCost},
		{sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: l, RequestID: "r"}, sluice.ErrInvalidRequestID},
	} {
		if _, err := s.Peek(ctx, tt.r); !errors.Is(err, tt.want) {
			t.Errorf("Peek(%+v) = %v; want %v", tt.r, err, tt.want)
		}
	}
}
