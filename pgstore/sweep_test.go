package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/pgstore"
	"github.com/sluicehq/sluice/sluicetest"
	"pgregory.net/rapid"
)

// idRow is a remembered request ID as stored.
type idRow struct {
	Key, RequestID                           string
	Cost, Capacity, RateTokens, PeriodMicros int64
	Allowed                                  bool
	Remaining, RetryMicros, ResetMicros, Exp int64
}

// readTables returns every bucket row of table by key, and every request ID
// row, all of which must be of testPolicy.
func readTables(t tb, table string) (map[string]row, []idRow) {
	t.Helper()
	ctx := context.Background()
	var others int
	if err := testPool.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+qualified(table)+" WHERE policy <> $1) + (SELECT count(*) FROM "+qualified(table+"_request_ids")+" WHERE policy <> $1)", testPolicy).Scan(&others); err != nil {
		t.Fatalf("reading %s: %v", table, err)
	}
	if others != 0 {
		t.Fatalf("%s holds %d rows of other policies than %q", table, others, testPolicy)
	}
	rows, err := testPool.Query(ctx, "SELECT key, tokens, frac, stamp, capacity, rate_tokens, period_us, coalesce(full_at, 9223372036854775807) FROM "+qualified(table))
	if err != nil {
		t.Fatalf("reading %s: %v", table, err)
	}
	buckets := map[string]row{}
	var key []byte
	var r row
	if _, err := pgx.ForEachRow(rows, []any{&key, &r.Tokens, &r.Frac, &r.Stamp, &r.Capacity, &r.RateTokens, &r.PeriodMicros, &r.FullAt}, func() error {
		buckets[string(key)] = r
		return nil
	}); err != nil {
		t.Fatalf("reading %s: %v", table, err)
	}
	rows, err = testPool.Query(ctx, "SELECT key, request_id, cost, capacity, rate_tokens, period_us, allowed, remaining, retry_us, reset_us, expires_at FROM "+
		qualified(table+"_request_ids")+" ORDER BY key, request_id")
	if err != nil {
		t.Fatalf("reading %s_request_ids: %v", table, err)
	}
	var ids []idRow
	var k, id []byte
	var ir idRow
	if _, err := pgx.ForEachRow(rows, []any{&k, &id, &ir.Cost, &ir.Capacity, &ir.RateTokens, &ir.PeriodMicros, &ir.Allowed, &ir.Remaining, &ir.RetryMicros, &ir.ResetMicros, &ir.Exp}, func() error {
		ir.Key, ir.RequestID = string(k), string(id)
		ids = append(ids, ir)
		return nil
	}); err != nil {
		t.Fatalf("reading %s_request_ids: %v", table, err)
	}
	return buckets, ids
}

// fullAt reports whether the bucket r is full at tick now (µs) and its
// stamp is not after now, computed with bucket.Plan from the row's state:
// exactly the buckets a sweep at now may delete without changing any later
// decision at now or after.
func fullAt(t tb, r row, now int64) bool {
	t.Helper()
	l := sluice.Limit{Capacity: r.Capacity, Rate: sluice.Per(r.RateTokens, time.Duration(r.PeriodMicros)*time.Microsecond)}
	p, err := bucket.NewPlan(l, time.Microsecond)
	if err != nil {
		t.Fatalf("row %+v has an invalid limit: %v", r, err)
	}
	st := p.Refill(bucket.State{Tokens: r.Tokens, Frac: uint64(r.Frac), Stamp: r.Stamp}, now)
	return r.Stamp <= now && st.Tokens == l.Capacity
}

// sweepPair is a store that is swept and one that is not, on one clock.
type sweepPair struct {
	swept, kept           *pgstore.Store
	sweptTable, keptTable string
}

// TestSweepRemovesFullBucketsOnly is a property test of the sweeper: two
// stores receive the same random takes (several keys, limits that refill
// fast, slowly or never, limit changes, request IDs, clock steps back);
// one of them is swept once at a chosen instant. Exactly the buckets that
// are full at that instant (by bucket.Plan's arithmetic on their stored
// state) and the request IDs that have expired are gone; every other row is
// unchanged; and from then on, with time moving forwards, both stores make
// the same decisions, including replays and limit changes.
func TestSweepRemovesFullBucketsOnly(t *testing.T) {
	clock := sluicetest.NewClock(epoch)
	pairs := map[sluice.Conversion]*sweepPair{}
	for _, policy := range []sluice.Conversion{sluice.KeepTokens, sluice.ScaleTokens, sluice.ResetTokens} {
		o := pgstore.Options{Now: clock.Now, OnLimitChange: policy, RequestIDTTL: time.Second}
		p := &sweepPair{}
		p.kept, p.keptTable = newStoreTable(t, o)
		o.SweepBatch = 3 // several batches per sweep
		p.swept, p.sweptTable = newStoreTable(t, o)
		pairs[policy] = p
	}
	ctx := context.Background()
	// Limits that become full within the test's time steps, some that
	// take long or never refill, and the edges of the bounds.
	small := rapid.Custom(func(t *rapid.T) sluice.Limit {
		return sluice.Limit{
			Capacity: rapid.Int64Range(1, 10).Draw(t, "capacity"),
			Rate: sluice.Per(rapid.Int64Range(0, 5).Draw(t, "tokens"),
				rapid.SampledFrom([]time.Duration{time.Microsecond, 7 * time.Millisecond, time.Second, time.Hour}).Draw(t, "period")),
		}
	})
	var total, totalKept pgstore.Swept
	rapid.Check(t, func(rt *rapid.T) {
		policy := rapid.SampledFrom([]sluice.Conversion{sluice.KeepTokens, sluice.ScaleTokens, sluice.ResetTokens}).Draw(rt, "policy")
		p := pairs[policy]
		for _, table := range []string{p.sweptTable, p.keptTable} {
			// Empty tables, and no sweep yet (the floor at its start).
			if _, err := testPool.Exec(ctx, "DELETE FROM "+qualified(table)+"; DELETE FROM "+qualified(table+"_request_ids")+
				"; UPDATE "+qualified(table+"_floor")+" SET floor_us = -9223372036854775808"); err != nil {
				rt.Fatal(err)
			}
		}
		limits := rapid.SliceOfN(rapid.OneOf(small, small, limitGen()), 1, 4).Draw(rt, "limits")
		keys := rapid.IntRange(1, 8).Draw(rt, "keys")
		now := epoch
		clock.Set(now)
		using := map[string]sluice.Limit{}

		// step makes one random request of both stores at now and
		// requires the same answer.
		step := func(i int, phase string) {
			key := "k" + strconv.Itoa(rapid.IntRange(0, keys-1).Draw(rt, "key"))
			l, ok := using[key]
			if !ok || rapid.IntRange(0, 4).Draw(rt, "change limit (0)") == 0 {
				l = rapid.SampledFrom(limits).Draw(rt, "limit")
				using[key] = l
			}
			if rapid.IntRange(0, 4).Draw(rt, "peek (0)") == 0 {
				want, werr := p.kept.Peek(ctx, sluice.Request{Policy: testPolicy, Key: key, Cost: 1, Limit: l})
				got, err := p.swept.Peek(ctx, sluice.Request{Policy: testPolicy, Key: key, Cost: 1, Limit: l})
				if err != nil || werr != nil || got != want {
					rt.Fatalf("%s step %d: Peek(%q, %v) = %+v, %v; the unswept store's %+v, %v", phase, i, key, l, got, err, want, werr)
				}
				return
			}
			r := sluice.Request{Policy: testPolicy, Key: key, Limit: l,
				Cost: rapid.Int64Range(1, l.Capacity).Draw(rt, "cost")}
			if rapid.Bool().Draw(rt, "request ID") {
				r.RequestID = "r" + strconv.Itoa(rapid.IntRange(0, 2).Draw(rt, "request ID"))
			}
			want, werr := p.kept.Take(ctx, r)
			got, err := p.swept.Take(ctx, r)
			if fmt.Sprint(err) != fmt.Sprint(werr) || got != want {
				rt.Fatalf("%s step %d: Take(%+v) = %+v, %v; the unswept store's %+v, %v", phase, i, r, got, err, want, werr)
			}
		}
		forward := func() {
			now = now.Add(time.Duration(rapid.SampledFrom([]int64{0, 1, 1e3, 1e5, 1e6, 1e7, 1e9}).Draw(rt, "forward µs")) * time.Microsecond)
			clock.Set(now)
		}

		for i := range rapid.IntRange(1, 25).Draw(rt, "steps before") {
			if rapid.IntRange(0, 5).Draw(rt, "step back (0)") == 0 {
				now = now.Add(-time.Duration(rapid.Int64Range(1, 2e6).Draw(rt, "back µs")) * time.Microsecond)
				clock.Set(now)
			} else {
				forward()
			}
			step(i, "before the sweep")
		}

		forward()
		sweepAt := now.UnixMicro()
		before, beforeIDs := readTables(rt, p.keptTable)
		swept, err := p.swept.Sweep(ctx)
		if err != nil {
			rt.Fatalf("Sweep: %v", err)
		}
		after, afterIDs := readTables(rt, p.sweptTable)
		wantRows := map[string]row{}
		for key, r := range before {
			full := fullAt(rt, r, sweepAt)
			if full != (r.FullAt <= sweepAt) {
				rt.Fatalf("bucket %q = %+v: full at %d is %v by bucket.Plan, but full_at says %v", key, r, sweepAt, full, !full)
			}
			if !full {
				wantRows[key] = r
			}
		}
		if diff := cmp.Diff(wantRows, after); diff != "" {
			rt.Fatalf("after a sweep at %d, the buckets are not those that were not full (-want +got):\n%s", sweepAt, diff)
		}
		var wantIDs []idRow
		for _, ir := range beforeIDs {
			if ir.Exp > sweepAt {
				wantIDs = append(wantIDs, ir)
			}
		}
		if diff := cmp.Diff(wantIDs, afterIDs); diff != "" {
			rt.Fatalf("after a sweep at %d, the request IDs are not those that had not expired (-want +got):\n%s", sweepAt, diff)
		}
		if want := (pgstore.Swept{Buckets: int64(len(before) - len(wantRows)), RequestIDs: int64(len(beforeIDs) - len(wantIDs))}); swept != want {
			rt.Fatalf("Sweep() = %+v, want %+v", swept, want)
		}
		total.Buckets += swept.Buckets
		total.RequestIDs += swept.RequestIDs
		totalKept.Buckets += int64(len(wantRows))
		totalKept.RequestIDs += int64(len(wantIDs))

		for i := range rapid.IntRange(1, 15).Draw(rt, "steps after") {
			forward()
			step(i, "after the sweep")
		}
		// Every bucket left in the swept store is the unswept store's.
		got, _ := readTables(rt, p.sweptTable)
		kept, _ := readTables(rt, p.keptTable)
		for key, r := range got {
			if kept[key] != r {
				rt.Fatalf("bucket %q is %+v in the swept store, %+v in the other", key, r, kept[key])
			}
		}
	})
	t.Logf("swept %d buckets and %d request IDs, kept %d and %d", total.Buckets, total.RequestIDs, totalKept.Buckets, totalKept.RequestIDs)
}

// TestSweeper: the background sweeper deletes full buckets and expired
// request IDs on its own, counts them, and stops when the store is closed.
func TestSweeper(t *testing.T) {
	clock := sluicetest.NewClock(epoch)
	o := pgstore.Options{Now: clock.Now, RequestIDTTL: time.Second}
	_, table := newStoreTable(t, o) // migrated
	o.Schema, o.Table, o.SweepInterval, o.SweepBatch = testSchema, table, 5*time.Millisecond, 2
	ctx := context.Background()
	s, err := pgstore.New(ctx, testPool, o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(10)}
	for i := range 5 {
		if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "full" + strconv.Itoa(i), Cost: 10, Limit: l, RequestID: "r"}); err != nil {
			t.Fatal(err)
		}
	}
	never := sluice.Limit{Capacity: 10, Rate: sluice.Per(0, time.Second)}
	if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "never", Cost: 1, Limit: never}); err != nil {
		t.Fatal(err)
	}
	clock.Set(epoch.Add(time.Second)) // the five are full, the IDs expired
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := s.Stats()
		if st.SweptBuckets == 5 && st.SweptRequestIDs == 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10s, Stats() = %+v; want 5 buckets and 5 request IDs swept", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	rows, ids := readTables(t, table)
	if _, ok := rows["never"]; len(rows) != 1 || !ok || len(ids) != 0 {
		t.Fatalf("after sweeping, the table holds %v and %d request IDs; want only the bucket %q", rows, len(ids), "never")
	}
	if st := s.Stats(); st.SweepErrors != 0 {
		t.Fatalf("Stats() = %+v; want no errors", st)
	}
	// Closed: nothing is swept any more.
	for i := range 3 {
		if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "late" + strconv.Itoa(i), Cost: 1, Limit: l}); err != nil {
			t.Fatal(err)
		}
	}
	clock.Set(epoch.Add(time.Hour))
	time.Sleep(50 * time.Millisecond)
	if rows, _ := readTables(t, table); len(rows) != 4 {
		t.Fatalf("after Close, the sweeper still deleted buckets: %d left, want 4", len(rows))
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestSweepPause: after a full batch, Sweep pauses for SweepPauseRatio
// times the batch's duration (here capped at a minute) before the next
// one, a pause that the context and Close cut short; with a negative
// ratio it does not pause.
func TestSweepPause(t *testing.T) {
	clock := sluicetest.NewClock(epoch)
	o := pgstore.Options{Now: clock.Now, SweepBatch: 2, SweepPauseRatio: 1e9}
	paced, table := newStoreTable(t, o)
	ctx := context.Background()
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(10)}
	// fill makes n buckets that are empty at at and full a second later,
	// and moves the clock there. (A bucket is never made earlier than the
	// last sweep's time.)
	fill := func(n int, at time.Time) {
		t.Helper()
		clock.Set(at)
		for i := range n {
			if _, err := paced.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k" + strconv.Itoa(i), Cost: 10, Limit: l}); err != nil {
				t.Fatal(err)
			}
		}
		clock.Set(at.Add(time.Second)) // all full
	}
	fill(6, epoch)
	const deadline = 2 * time.Second
	dctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	start := time.Now()
	swept, err := paced.Sweep(dctx)
	elapsed := time.Since(start)
	if !errors.Is(err, sluice.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) || swept.Buckets != 2 {
		t.Fatalf("Sweep with a pause ratio of 1e9 and a %v deadline = %+v, %v after %v; want 2 buckets (one batch) and %v wrapping %v",
			deadline, swept, err, elapsed, sluice.ErrUnavailable, context.DeadlineExceeded)
	}
	if elapsed > deadline+5*time.Second {
		t.Errorf("Sweep returned %v after its deadline of %v", elapsed, deadline)
	}

	o.Schema, o.Table, o.SweepPauseRatio = testSchema, table, -1
	unpaced, err := pgstore.New(ctx, testPool, o)
	if err != nil {
		t.Fatal(err)
	}
	defer unpaced.Close()
	if swept, err := unpaced.Sweep(ctx); err != nil || swept.Buckets != 4 {
		t.Fatalf("Sweep without pauses = %+v, %v; want the 4 buckets left", swept, err)
	}

	// The background sweeper, paused after its first batch, stops at Close.
	fill(6, epoch.Add(time.Second))
	o.SweepPauseRatio, o.SweepInterval = 1e9, time.Millisecond
	background, err := pgstore.New(ctx, testPool, o)
	if err != nil {
		t.Fatal(err)
	}
	defer background.Close()
	for background.Stats().SweptBuckets < 2 {
		if time.Since(start) > time.Minute {
			t.Fatalf("the background sweeper deleted nothing in a minute")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	if st := background.Stats(); st.SweptBuckets != 2 {
		t.Fatalf("during its pause, the background sweeper deleted %d buckets; want 2 (one batch)", st.SweptBuckets)
	}
	start = time.Now()
	if err := background.Close(); err != nil {
		t.Fatal(err)
	}
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Errorf("Close during a sweep's pause took %v", elapsed)
	}
	if st := background.Stats(); st.SweepErrors != 0 {
		t.Errorf("Close during a pause counted as a failed sweep: Stats() = %+v", st)
	}
}

// TestSweepSessionSettings: a sweep commits with synchronous_commit off
// for its own transactions only; the pooled session keeps its setting.
func TestSweepSessionSettings(t *testing.T) {
	ctx := context.Background()
	cfg := testPool.Config()
	cfg.MaxConns = 1 // the session the sweep ran in
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	clock := sluicetest.NewClock(epoch)
	s, _ := newStoreOn(t, pool, pgstore.Options{Now: clock.Now, SweepBatch: 1, SweepPauseRatio: -1})
	for i := range 3 {
		if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k" + strconv.Itoa(i), Cost: 1, Limit: testLimit}); err != nil {
			t.Fatal(err)
		}
	}
	clock.Set(epoch.Add(time.Hour))
	if swept, err := s.Sweep(ctx); err != nil || swept.Buckets != 3 {
		t.Fatalf("Sweep() = %+v, %v; want 3 buckets", swept, err)
	}
	var sc string
	if err := pool.QueryRow(ctx, "SELECT current_setting('synchronous_commit')").Scan(&sc); err != nil {
		t.Fatal(err)
	}
	if sc != "on" {
		t.Fatalf("after a sweep, the pooled session has synchronous_commit %q; want its own \"on\"", sc)
	}
}

// TestSweepMintsNoTokens: a take that read its time before it waited for
// its bucket's row lock, held by a sweep that then deleted the bucket
// (full by the sweep's later time), must not recreate the bucket full at
// its own earlier time, when it was not full: that would mint the tokens
// that refilled in between. The take creates the bucket no earlier than
// the sweep's time, so a later take whose clock still reads before that
// time finds what is left.
//
// It runs with every take trying the insert of a new bucket first, and
// with none (docs/postgres.md, "Takes of new keys").
func TestSweepMintsNoTokens(t *testing.T) {
	for _, first := range []bool{false, true} {
		t.Run(fmt.Sprintf("insert first %v", first), func(t *testing.T) { testSweepMintsNoTokens(t, first) })
	}
}

func testSweepMintsNoTokens(t *testing.T, insertFirst bool) {
	clock := sluicetest.NewClock(epoch)
	s, table := newStoreTable(t, pgstore.Options{Now: clock.Now, StatementTimeout: time.Minute, LockTimeout: time.Minute})
	pgstore.SetInsertFirst(s, insertFirst)
	ctx := context.Background()
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(10)} // full 1s after it is emptied
	at := func(d time.Duration) { clock.Set(epoch.Add(d)) }
	take := func(cost int64) (sluice.Decision, error) {
		return s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: cost, Limit: l})
	}
	if d, err := take(10); err != nil || !d.Allowed {
		t.Fatalf("Take(10) = %+v, %v", d, err)
	}

	// A sweep at +2s, in a transaction held open: it has deleted the full
	// bucket but not committed.
	tx, err := testPool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var swept int64
	sweepAt := epoch.Add(2 * time.Second).UnixMicro()
	if err := tx.QueryRow(ctx, "SELECT o_buckets FROM "+qualified(table+"_sweep")+"($1, 1000)", sweepAt).Scan(&swept); err != nil || swept != 1 {
		t.Fatalf("the sweep at +2s deleted %d buckets, %v; want 1", swept, err)
	}
	// A take whose clock reads +0.5s, when the bucket held 5 tokens, waits
	// for the sweep's lock.
	at(500 * time.Millisecond)
	type result struct {
		d   sluice.Decision
		err error
	}
	done := make(chan result, 1)
	go func() {
		d, err := take(10)
		done <- result{d, err}
	}()
	waitForLockWait(t, table)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil || !res.d.Allowed {
		t.Fatalf("Take(10) at +0.5s after waiting for a sweep at +2s = %+v, %v; want allowed", res.d, res.err)
	}
	// At +1.5s (a clock still behind the sweep's), nothing has refilled
	// since the bucket was made at +2s. Up to +2s, 20 tokens refilled or
	// were there, and 20 were taken; a bucket made full at +0.5s instead
	// would have refilled 10 more by +1.5s, tokens that never existed.
	at(1500 * time.Millisecond)
	denied := sluice.Decision{Remaining: 0, RetryAfter: 1500 * time.Millisecond, ResetAfter: 1500 * time.Millisecond, Limit: l}
	if d, err := take(10); err != nil || d != denied {
		t.Errorf("Take(10) at +1.5s = %+v, %v; want %+v (nothing refilled since the bucket was made at +2s)", d, err, denied)
	}
	// The racing take's ResetAfter runs from its +0.5s through +2s, and
	// one second more.
	if want := (sluice.Decision{Allowed: true, Remaining: 0, ResetAfter: 2500 * time.Millisecond, Limit: l}); res.d != want {
		t.Errorf("Take(10) at +0.5s after waiting for a sweep at +2s = %+v; want %+v (the bucket made at +2s)", res.d, want)
	}
	at(3 * time.Second)
	if d, err := take(10); err != nil || !d.Allowed {
		t.Fatalf("Take(10) at +3s = %+v, %v; want allowed (full again 1s after +2s)", d, err)
	}
}
