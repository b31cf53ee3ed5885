package pgstore_test

import (
	"context"
	"errors"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/pgstore"
	"github.com/sluicehq/sluice/sluicetest"
	"pgregory.net/rapid"
)

// epoch is tick zero of the explicit-time tests: an arbitrary instant with
// nanoseconds, which the store truncates to whole microseconds.
var epoch = time.Date(2031, time.March, 14, 15, 9, 26, 535897932, time.UTC)

// row is a bucket as stored.
type row struct {
	Tokens, Frac, Stamp                int64
	Capacity, RateTokens, PeriodMicros int64
	FullAt                             int64 // math.MaxInt64 for NULL
}

// tb is what the helpers need of *testing.T and *rapid.T.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
}

// readRow returns the row of (testPolicy, key) in table, and whether there
// is one.
func readRow(t tb, table, key string) (row, bool) {
	t.Helper()
	var r row
	var fullAt *int64
	err := testPool.QueryRow(context.Background(),
		"SELECT tokens, frac, stamp, capacity, rate_tokens, period_us, full_at FROM "+qualified(table)+" WHERE policy = $1 AND key = $2", testPolicy, []byte(key)).
		Scan(&r.Tokens, &r.Frac, &r.Stamp, &r.Capacity, &r.RateTokens, &r.PeriodMicros, &fullAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return row{}, false
	}
	if err != nil {
		t.Fatalf("reading the row of %q: %v", key, err)
	}
	r.FullAt = math.MaxInt64
	if fullAt != nil {
		r.FullAt = *fullAt
	}
	return r, true
}

// refBucket is a bucket of the Go reference: bucket.Plan at a tick of 1µs,
// driven the way memstore drives it.
type refBucket struct {
	plan  bucket.Plan
	state bucket.State
}

// refTake is the reference transition for a take (no request ID) at tick
// now (µs since the Unix epoch) on b, which is nil for a missing bucket.
func refTake(b *refBucket, now int64, cost int64, l sluice.Limit, policy sluice.Conversion) (*refBucket, sluice.Decision) {
	p, err := bucket.NewPlan(l, time.Microsecond)
	if err != nil {
		panic(err)
	}
	switch {
	case b == nil:
		b = &refBucket{plan: p, state: p.Full(now)}
	case b.plan.Limit() != l:
		b.state = p.Convert(b.plan.Refill(b.state, now), &b.plan, policy)
		b.plan = p
	}
	var d sluice.Decision
	b.plan.Take(&b.state, now, cost, &d)
	return b, d
}

// refPeek is the reference answer to a peek of cost at tick now on b (nil
// for a missing bucket), which it does not change.
func refPeek(b *refBucket, now int64, cost int64, l sluice.Limit, conv sluice.Conversion) sluice.Decision {
	p, err := bucket.NewPlan(l, time.Microsecond)
	if err != nil {
		panic(err)
	}
	switch {
	case b == nil:
		return p.Peek(p.Full(now), now, cost)
	case b.plan.Limit() != l:
		return p.Peek(p.Convert(b.plan.Refill(b.state, now), &b.plan, conv), now, cost)
	}
	return b.plan.Peek(b.state, now, cost)
}

// rowOf is the row the store must hold for b.
func rowOf(b *refBucket) row {
	l := b.plan.Limit()
	return row{
		Tokens: b.state.Tokens, Frac: int64(b.state.Frac), Stamp: b.state.Stamp,
		Capacity: l.Capacity, RateTokens: l.Rate.Tokens, PeriodMicros: int64(l.Rate.Period / time.Microsecond),
		FullAt: b.plan.FullAt(b.state),
	}
}

// limitGen draws limits whose period is a whole number of µs, favouring the
// edges of the bounds.
func limitGen() *rapid.Generator[sluice.Limit] { return sluicetest.Limits(time.Microsecond) }

// TestPlanDifferential drives one key of the store and bucket.Plan with the
// same random takes, peeks, limit changes and clock moves (forwards by up
// to 100 years, and backwards), and requires after every take the same
// decision and, in the table, exactly the Plan's state (tokens, frac,
// stamp), limit and full_at (Plan.FullAt), and for every peek the same
// answer: the SQL is the Plan at a tick of 1µs.
func TestPlanDifferential(t *testing.T) {
	planDifferential(t, epoch, rapid.SliceOfN(limitGen(), 1, 3))
}

// bigintEdge is the largest capacity whose deficits the take computes in
// bigint under one token every bigintEdgePeriod: capacity * p' = 2^62 - 1,
// the bound of docs/postgres.md ("bigint where the limit allows it"). One
// token more and it computes in numeric.
const (
	bigintEdge       = 2147483649
	bigintEdgePeriod = 2147483647 * time.Microsecond
)

// TestPlanDifferentialBigintEdge is TestPlanDifferential with limits on
// both sides of the bound up to which a take computes in bigint, and
// random ones, so that one bucket moves between the two arithmetics.
func TestPlanDifferentialBigintEdge(t *testing.T) {
	planDifferential(t, epoch, rapid.SliceOfN(rapid.OneOf(edgeLimitGen(), limitGen()), 1, 3))
}

// edgeLimitGen draws limits on both sides of the bigint bound and at the
// bounds of sluice.Limit.
func edgeLimitGen() *rapid.Generator[sluice.Limit] {
	return rapid.SampledFrom([]sluice.Limit{
		{Capacity: bigintEdge, Rate: sluice.Rate{Tokens: 1, Period: bigintEdgePeriod}},
		{Capacity: bigintEdge + 1, Rate: sluice.Rate{Tokens: 1, Period: bigintEdgePeriod}},
		{Capacity: sluice.MaxCapacity, Rate: sluice.Rate{Tokens: sluice.MaxTokens, Period: time.Microsecond}},
		{Capacity: sluice.MaxCapacity, Rate: sluice.Rate{Tokens: 1, Period: sluice.MaxPeriod}},
	})
}

// TestPlanDifferentialBeforeEpoch is TestPlanDifferential on a clock that
// starts 30 seconds before the Unix epoch, so that times and stamps are
// negative µs and later cross zero, where a take computes in numeric.
func TestPlanDifferentialBeforeEpoch(t *testing.T) {
	planDifferential(t, time.Unix(-30, 0).UTC(), rapid.SliceOfN(limitGen(), 1, 3))
}

// planDifferential runs TestPlanDifferential's check from start, with the
// limits of each key drawn from limits.
func planDifferential(t *testing.T, start time.Time, limits *rapid.Generator[[]sluice.Limit]) {
	t.Helper()
	clock := sluicetest.NewClock(start)
	stores := map[sluice.Conversion]*pgstore.Store{}
	tables := map[sluice.Conversion]string{}
	for _, p := range []sluice.Conversion{sluice.KeepTokens, sluice.ScaleTokens, sluice.ResetTokens} {
		stores[p], tables[p] = newStoreTable(t, pgstore.Options{Now: clock.Now, OnLimitChange: p})
	}
	ctx := context.Background()
	n := 0
	rapid.Check(t, func(rt *rapid.T) {
		policy := rapid.SampledFrom([]sluice.Conversion{sluice.KeepTokens, sluice.ScaleTokens, sluice.ResetTokens}).Draw(rt, "policy")
		s, table := stores[policy], tables[policy]
		// The bucket is created by the take function, or by the plain
		// insert of a take that tries it first (create.go).
		pgstore.SetInsertFirst(s, rapid.Bool().Draw(rt, "insert first"))
		n++
		key := "k" + strconv.Itoa(n) // a fresh bucket per check
		limits := limits.Draw(rt, "limits")
		now := start
		clock.Set(now)
		var b *refBucket
		steps := rapid.IntRange(1, 40).Draw(rt, "steps")
		for i := range steps {
			switch rapid.IntRange(0, 3).Draw(rt, "move (0 none, 1 small, 2 large, 3 back)") {
			case 1:
				now = now.Add(time.Duration(rapid.Int64Range(0, 5e6).Draw(rt, "µs")) * time.Microsecond)
			case 2:
				now = now.Add(time.Duration(rapid.Int64Range(0, int64(100*365*24*time.Hour/time.Microsecond)).Draw(rt, "µs")) * time.Microsecond)
			case 3:
				now = now.Add(-time.Duration(rapid.Int64Range(0, 1e7).Draw(rt, "µs back")) * time.Microsecond)
			}
			clock.Set(now)
			l := rapid.SampledFrom(limits).Draw(rt, "limit")
			cost := rapid.OneOf(rapid.Int64Range(1, min(l.Capacity, 5)), rapid.Int64Range(1, l.Capacity)).Draw(rt, "cost")
			if rapid.IntRange(0, 3).Draw(rt, "peek (0)") == 0 {
				want := refPeek(b, now.UnixMicro(), cost, l, policy)
				got, err := s.Peek(ctx, sluice.Request{Policy: testPolicy, Key: key, Cost: cost, Limit: l})
				if err != nil {
					rt.Fatalf("step %d: Peek(%q, %d, %v): %v", i, key, cost, l, err)
				}
				if diff := cmp.Diff(want, got); diff != "" {
					rt.Fatalf("step %d: Peek(%q, %d, %v) = %+v, want %+v (Plan's) (-want +got):\n%s", i, key, cost, l, got, want, diff)
				}
				continue
			}
			var want sluice.Decision
			b, want = refTake(b, now.UnixMicro(), cost, l, policy)
			got, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: key, Cost: cost, Limit: l})
			if err != nil {
				rt.Fatalf("step %d: Take(%q, %d, %v): %v", i, key, cost, l, err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				rt.Fatalf("step %d: Take(%q, %d, %v) = %+v, want %+v (Plan's) (-want +got):\n%s", i, key, cost, l, got, want, diff)
			}
			gotRow, ok := readRow(rt, table, key)
			if !ok {
				rt.Fatalf("step %d: no row for %q after a take", i, key)
			}
			if diff := cmp.Diff(rowOf(b), gotRow); diff != "" {
				rt.Fatalf("step %d: row of %q = %+v, want %+v (Plan's) (-want +got):\n%s", i, key, gotRow, rowOf(b), diff)
			}
		}
	})
}

// TestTakeFarApartTimes takes from one bucket at explicit times so far
// apart that their difference in µs does not fit in a bigint (year -200000,
// then +200000), under a limit of each arithmetic, with Take and with a
// TakeAll of one part, peeking before each, and requires the Plan's
// decisions, answers and rows: none may compute that difference in bigint.
func TestTakeFarApartTimes(t *testing.T) {
	year := func(y int) time.Time { return time.Date(y, time.June, 1, 0, 0, 0, 0, time.UTC) }
	times := []time.Time{year(-200000), year(-200000).Add(3 * time.Second), year(200000), year(200000).Add(time.Microsecond), year(-200000)}
	for _, l := range []sluice.Limit{
		{Capacity: 10, Rate: sluice.PerSecond(1)},
		{Capacity: bigintEdge + 1, Rate: sluice.Rate{Tokens: 1, Period: bigintEdgePeriod}},
	} {
		for _, op := range []string{"Take", "TakeAll"} {
			t.Run(op+"/"+l.String(), func(t *testing.T) {
				clock := sluicetest.NewClock(times[0])
				s, table := newStoreTable(t, pgstore.Options{Now: clock.Now})
				var b *refBucket
				for i, now := range times {
					clock.Set(now)
					r := sluice.Request{Policy: testPolicy, Key: "far", Cost: 3, Limit: l}
					wantPeek := refPeek(b, now.UnixMicro(), 3, l, sluice.KeepTokens)
					gotPeek, err := s.Peek(context.Background(), r)
					if err != nil {
						t.Fatalf("peek %d at %v: %v", i, now, err)
					}
					if diff := cmp.Diff(wantPeek, gotPeek); diff != "" {
						t.Fatalf("peek %d at %v = %+v, want %+v (Plan's) (-want +got):\n%s", i, now, gotPeek, wantPeek, diff)
					}
					var want sluice.Decision
					b, want = refTake(b, now.UnixMicro(), 3, l, sluice.KeepTokens)
					var got sluice.Decision
					if op == "Take" {
						got, err = s.Take(context.Background(), r)
					} else {
						var md sluice.MultiDecision
						if md, err = s.TakeAll(context.Background(), []sluice.Request{r}); err == nil {
							got = md.Parts[0]
						}
					}
					if err != nil {
						t.Fatalf("%s %d at %v: %v", op, i, now, err)
					}
					if diff := cmp.Diff(want, got); diff != "" {
						t.Fatalf("%s %d at %v = %+v, want %+v (Plan's) (-want +got):\n%s", op, i, now, got, want, diff)
					}
					gotRow, _ := readRow(t, table, "far")
					if diff := cmp.Diff(rowOf(b), gotRow); diff != "" {
						t.Fatalf("%s %d at %v: row = %+v, want %+v (Plan's) (-want +got):\n%s", op, i, now, gotRow, rowOf(b), diff)
					}
				}
			})
		}
	}
}
