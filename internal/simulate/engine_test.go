package simulate

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

func mustLimits(t *testing.T, texts ...string) []sluice.Limit {
	t.Helper()
	var out []sluice.Limit
	for _, s := range texts {
		l, err := sluice.ParseLimit(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, l)
	}
	return out
}

// randomTrace returns n requests of a few keys, mostly in time order with
// some steps back, at offsets of whole microseconds and odd nanoseconds.
func randomTrace(rng *rand.Rand, n int, maxCost int64) []Request {
	keys := []string{"a", "b", "c", "d"}
	var at time.Duration
	out := make([]Request, n)
	for i := range out {
		switch rng.IntN(10) {
		case 0: // a burst: the same offset
		case 1: // the clock steps back
			at -= time.Duration(rng.Int64N(int64(300 * time.Millisecond)))
			at = max(at, 0)
		default:
			at += time.Duration(rng.Int64N(int64(400*time.Millisecond))) + time.Duration(rng.IntN(3))
		}
		out[i] = Request{At: at, Key: keys[rng.IntN(len(keys))], Cost: 1 + rng.Int64N(maxCost), Line: i + 1}
	}
	return out
}

// TestBucketMatchesModel replays random traces through Bucket and through
// sluicetest.Model, the reference written independently of package
// bucket, and requires the same decision for every request: one limit
// with Take, several with TakeAll, on the clocks of the memory store and
// of Redis and PostgreSQL.
func TestSimulateBucketMatchesModel(t *testing.T) {
	cases := []struct {
		limits []string
		tick   time.Duration
	}{
		{[]string{"3 1/s"}, time.Nanosecond},
		{[]string{"10 7/3s"}, time.Nanosecond},
		{[]string{"5 2/s"}, time.Microsecond},
		{[]string{"1 1/250ms"}, time.Nanosecond},
		{[]string{"4 0/s"}, time.Nanosecond},
		{[]string{"5 5/m", "3 1/s"}, time.Nanosecond},
		{[]string{"6 2/s", "9 1/s", "4 3/s"}, time.Microsecond},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.limits, "+")+"@"+tc.tick.String(), func(t *testing.T) {
			limits := mustLimits(t, tc.limits...)
			b, err := NewBucket(limits, tc.tick)
			if err != nil {
				t.Fatal(err)
			}
			model := sluicetest.NewModel(tc.tick, sluice.KeepTokens, 0)
			rng := rand.New(rand.NewPCG(1, uint64(len(tc.limits))))
			trace := randomTrace(rng, 1500, 5)
			var allowed, denied, errs int
			for i, r := range trace {
				got := b.Decide(r)
				want := modelDecide(t, model, limits, tc.tick, r)
				if (got.Err != nil) != (want.Err != nil) || got.Allowed != want.Allowed || got.Denied != want.Denied ||
					got.Remaining != want.Remaining || got.RetryAfter != want.RetryAfter || got.ResetAfter != want.ResetAfter || got.Short != want.Short {
					t.Fatalf("request %d %+v: Bucket decided %+v, the model %+v", i, r, got, want)
				}
				switch {
				case got.Err != nil:
					errs++
				case got.Allowed:
					allowed++
				default:
					denied++
				}
			}
			// The trace must exercise both outcomes, or the test proves
			// little.
			if allowed == 0 || denied == 0 {
				t.Errorf("allowed %d, denied %d, errors %d: the trace does not exercise both outcomes", allowed, denied, errs)
			}
		})
	}
}

// modelDecide is the model's decision of r as a Decision.
func modelDecide(t *testing.T, m *sluicetest.Model, limits []sluice.Limit, tick time.Duration, r Request) Decision {
	t.Helper()
	now := int64(r.At / tick)
	rs := make([]sluice.Request, len(limits))
	for i, l := range limits {
		policy := "p"
		if i > 0 {
			policy += "/" + strconv.Itoa(i)
		}
		rs[i] = sluice.Request{Policy: policy, Key: r.Key, Cost: r.Cost, Limit: l}
	}
	var parts []sluice.Decision
	var md sluice.MultiDecision
	if len(limits) == 1 {
		d, err := m.Take(now, rs[0])
		if err != nil {
			return Decision{Err: err, Denied: -1}
		}
		parts = []sluice.Decision{d}
		md = sluice.MultiDecision{Parts: parts}
		md.Combine()
	} else {
		var err error
		md, err = m.TakeAll(now, rs)
		if err != nil {
			return Decision{Err: err, Denied: -1}
		}
		parts = md.Parts
	}
	d := Decision{Allowed: md.Allowed, Denied: md.Denied, RetryAfter: md.RetryAfter, Remaining: parts[0].Remaining}
	for i, p := range parts {
		if !p.Allowed {
			d.Short |= 1 << i
		}
		d.Remaining = min(d.Remaining, p.Remaining)
		d.ResetAfter = max(d.ResetAfter, p.ResetAfter)
	}
	return d
}

func TestSimulateBucketErrors(t *testing.T) {
	if _, err := NewBucket(nil, 0); !errors.Is(err, sluice.ErrInvalidOption) {
		t.Errorf("NewBucket(no limits) = %v, want ErrInvalidOption", err)
	}
	if _, err := NewBucket(mustLimits(t, "3 1/1500ns"), time.Microsecond); !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Errorf("NewBucket(period not whole µs, 1µs clock) = %v, want ErrInvalidLimit", err)
	}
	b, err := NewBucket(mustLimits(t, "3 1/s", "10 1/m"), 0)
	if err != nil {
		t.Fatal(err)
	}
	d := b.Decide(Request{Key: "k", Cost: 5})
	if !errors.Is(d.Err, sluice.ErrInvalidCost) || !strings.Contains(d.Err.Error(), "limit 0 (3 1/s)") {
		t.Errorf("cost 5 above capacity 3: Decide = %+v, want an ErrInvalidCost naming limit 0", d)
	}
	if d.Allowed || d.Denied != -1 {
		t.Errorf("an error is neither allowed nor denied: %+v", d)
	}
	// The refused request made no bucket: the key's first take finds it
	// full.
	if d := b.Decide(Request{Key: "k", Cost: 3}); !d.Allowed || d.Remaining != 0 {
		t.Errorf("take of 3 after the refused request = %+v, want allowed with 0 left", d)
	}
}

// TestFixedWindow checks the fixed-window counter on cases computed by
// hand: requests counted before the check, denied ones too; windows
// aligned to the Unix epoch, not to the trace.
func TestSimulateFixedWindow(t *testing.T) {
	type step struct {
		at      string
		key     string
		cost    int64
		allowed bool
		left    int64
	}
	cases := []struct {
		name    string
		windows []Window
		start   time.Time
		steps   []step
	}{
		{
			name:    "N per window, then a new window",
			windows: []Window{{3, time.Second}},
			start:   time.Unix(0, 0),
			steps: []step{
				{"0s", "a", 1, true, 2},
				{"100ms", "a", 1, true, 1},
				{"200ms", "b", 1, true, 2}, // another key, another counter
				{"999ms", "a", 1, true, 0},
				{"999ms", "a", 1, false, 0},
				{"1s", "a", 1, true, 2}, // the window of 1s starts afresh
			},
		},
		{
			name:    "denied hits are counted",
			windows: []Window{{3, time.Minute}},
			start:   time.Unix(0, 0),
			steps: []step{
				{"0s", "a", 2, true, 1},
				{"10s", "a", 2, false, 0}, // 4 > 3
				// 5 > 3: allowed if the denied 2 were not counted.
				{"20s", "a", 1, false, 0},
				{"59.999s", "a", 1, false, 0},
				{"60s", "a", 3, true, 0},
			},
		},
		{
			name:    "aligned to the epoch, not to the trace",
			windows: []Window{{2, time.Minute}},
			start:   time.Unix(30, 0), // offset 0 is 30s into a minute
			steps: []step{
				{"0s", "a", 1, true, 1},
				{"10s", "a", 1, true, 0},
				{"29.999s", "a", 1, false, 0},
				{"30s", "a", 1, true, 1}, // 60s since the epoch: a new window
			},
		},
		{
			name:    "a start in the middle of a day window",
			windows: []Window{{1, 24 * time.Hour}},
			start:   time.Date(2025, 3, 1, 23, 0, 0, 0, time.UTC),
			steps: []step{
				{"0s", "a", 1, true, 0},
				{"59m59s", "a", 1, false, 0},
				{"1h", "a", 1, true, 0}, // 00:00 UTC
			},
		},
		{
			name:    "several windows: every counter counts, any over denies",
			windows: []Window{{2, time.Second}, {3, time.Minute}},
			start:   time.Unix(0, 0),
			steps: []step{
				{"0s", "a", 1, true, 1},
				{"0s", "a", 1, true, 0},
				{"0s", "a", 1, false, 0}, // over the second; the minute counts 3
				{"1s", "a", 1, false, 0}, // the minute: 4 > 3
				{"60s", "a", 1, true, 1},
			},
		},
		{
			name:    "zero per window denies everything",
			windows: []Window{{0, time.Second}},
			start:   time.Unix(0, 0),
			steps:   []step{{"0s", "a", 1, false, 0}, {"5s", "a", 1, false, 0}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fw, err := NewFixedWindow(tc.windows, tc.start)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tc.steps {
				at, err := time.ParseDuration(s.at)
				if err != nil {
					t.Fatal(err)
				}
				d := fw.Decide(Request{At: at, Key: s.key, Cost: s.cost})
				if d.Allowed != s.allowed || d.Remaining != s.left {
					t.Errorf("step %d (%s %s cost %d): allowed %t, %d left; want %t, %d left", i, s.at, s.key, s.cost, d.Allowed, d.Remaining, s.allowed, s.left)
				}
				if d.Allowed != (d.Denied < 0) {
					t.Errorf("step %d: Allowed %t with Denied %d", i, d.Allowed, d.Denied)
				}
			}
		})
	}
}

func TestSimulateFixedWindowWaits(t *testing.T) {
	fw, err := NewFixedWindow([]Window{{1, time.Minute}}, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	fw.Decide(Request{At: 10 * time.Second, Key: "a", Cost: 1})
	d := fw.Decide(Request{At: 15 * time.Second, Key: "a", Cost: 1})
	if d.Allowed || d.RetryAfter != 45*time.Second || d.ResetAfter != 45*time.Second {
		t.Errorf("denied at 15s of a minute window: %+v, want retry and reset in 45s (the window's end)", d)
	}
	d = fw.Decide(Request{At: 20 * time.Second, Key: "b", Cost: 2})
	if d.Allowed || d.RetryAfter != sluice.Never {
		t.Errorf("cost 2 of a window of 1: %+v, want denied, retry never", d)
	}
}

func TestSimulateNewFixedWindowErrors(t *testing.T) {
	tests := []struct {
		windows []Window
		start   time.Time
		want    error
		text    string
	}{
		{nil, time.Unix(0, 0), sluice.ErrInvalidOption, "0 windows"},
		{[]Window{{1, 1500 * time.Millisecond}}, time.Unix(0, 0), sluice.ErrInvalidLimit, "whole number of seconds"},
		{[]Window{{-1, time.Second}}, time.Unix(0, 0), sluice.ErrInvalidLimit, "outside [0, 4294967295]"},
		{[]Window{{1, time.Second}}, time.Date(1960, 1, 1, 0, 0, 0, 0, time.UTC), sluice.ErrInvalidOption, "1970"},
	}
	for _, tt := range tests {
		_, err := NewFixedWindow(tt.windows, tt.start)
		if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.text) {
			t.Errorf("NewFixedWindow(%v, %v) = %v, want %v containing %q", tt.windows, tt.start, err, tt.want, tt.text)
		}
	}
}

func TestSimulateParseWindow(t *testing.T) {
	good := []struct {
		in   string
		want Window
		text string
	}{
		{"100/minute", Window{100, time.Minute}, "100/minute"},
		{"10/SECOND", Window{10, time.Second}, "10/second"},
		{"5/m", Window{5, time.Minute}, "5/minute"},
		{"7/90s", Window{7, 90 * time.Second}, "7/1m30s"},
		{"1/month", Window{1, 30 * 24 * time.Hour}, "1/month"},
		{"0/hour", Window{0, time.Hour}, "0/hour"},
		{"4294967295/year", Window{4294967295, 365 * 24 * time.Hour}, "4294967295/year"},
	}
	for _, tt := range good {
		w, err := ParseWindow(tt.in)
		if err != nil || w != tt.want || w.String() != tt.text {
			t.Errorf("ParseWindow(%q) = %v (%q), %v; want %v (%q)", tt.in, w, w.String(), err, tt.want, tt.text)
		}
	}
	bad := []struct{ in, text string }{
		{"100", `not "requests/unit"`},
		{"ten/second", "not a whole number"},
		{"-1/second", "not a whole number"},
		{"4294967296/second", "outside [0, 4294967295]"},
		{"5/fortnight", `unit "fortnight"`},
		{"5/ s", `unit " s"`},
	}
	for _, tt := range bad {
		_, err := ParseWindow(tt.in)
		if !errors.Is(err, sluice.ErrInvalidLimit) || !strings.Contains(err.Error(), tt.text) {
			t.Errorf("ParseWindow(%q) = %v, want ErrInvalidLimit containing %q", tt.in, err, tt.text)
		}
	}
}

func TestSimulateWindowOf(t *testing.T) {
	if w, ok := WindowOf(mustLimits(t, "60 60/m")[0]); !ok || w != (Window{60, time.Minute}) {
		t.Errorf("WindowOf(60 60/m) = %v, %t; want 60/minute", w, ok)
	}
	if _, ok := WindowOf(mustLimits(t, "20 1/s")[0]); ok {
		t.Error("WindowOf(20 1/s) = true; its capacity is not its refill")
	}
}

func TestSimulateReplayTallies(t *testing.T) {
	b, err := NewBucket(mustLimits(t, "2 1/s"), 0)
	if err != nil {
		t.Fatal(err)
	}
	trace := []Request{
		{At: 0, Key: "x", Cost: 1}, {At: 0, Key: "x", Cost: 1}, {At: 0, Key: "x", Cost: 1},
		{At: 500 * time.Millisecond, Key: "x", Cost: 1}, {At: time.Second, Key: "x", Cost: 1},
		{At: time.Second, Key: "y", Cost: 3}, {At: 2 * time.Second, Key: "y", Cost: 2},
	}
	run := Replay(trace, b)
	want := Tally{Requests: 7, Allowed: 4, Denied: 2, Errors: 1, Taken: 5, FirstDenied: 0}
	if run.Total != want {
		t.Errorf("Total = %+v, want %+v", run.Total, want)
	}
	if x := *run.Keys["x"]; x.Allowed != 3 || x.Denied != 2 || x.Taken != 3 {
		t.Errorf("key x = %+v, want 3 allowed, 2 denied, 3 taken", x)
	}
	if y := *run.Keys["y"]; y.Errors != 1 || y.Allowed != 1 || y.FirstDenied != -1 {
		t.Errorf("key y = %+v, want 1 error, 1 allowed, never denied", y)
	}
	ranked := run.Ranked()
	if ranked[0].Key != "x" || run.Worst() != "x" {
		t.Errorf("Ranked = %+v, Worst %q; want x first", ranked, run.Worst())
	}
}

func TestSimulateDifferences(t *testing.T) {
	trace := []Request{{At: 0, Key: "a", Cost: 1}, {At: 0, Key: "a", Cost: 1}, {At: time.Second, Key: "b", Cost: 1}}
	a := &Run{Decisions: []Decision{{Allowed: true}, {Allowed: false}, {Allowed: true}}}
	b := &Run{Decisions: []Decision{{Allowed: true}, {Allowed: true}, {Allowed: false}}}
	diffs := Differences(trace, a, b)
	if len(diffs) != 2 || diffs[0].Index != 1 || diffs[0].A != "denied" || diffs[0].B != "allowed" || diffs[1].Key != "b" {
		t.Fatalf("Differences = %+v", diffs)
	}
	byKey := DifferencesByKey(diffs)
	if len(byKey) != 2 || byKey[0].Key != "a" || byKey[0].ADeniedBAllowed != 1 || byKey[1].AAllowedBDenied != 1 {
		t.Errorf("DifferencesByKey = %+v", byKey)
	}
}

// TestSimulateBucketMatchesMemstore replays the same random traces through
// the memory store on a fake clock, the store sluice serve decides in by
// default: Bucket makes the decisions the service would.
func TestSimulateBucketMatchesMemstore(t *testing.T) {
	for _, texts := range [][]string{{"3 1/s"}, {"5 5/m", "3 1/s"}} {
		t.Run(strings.Join(texts, "+"), func(t *testing.T) {
			limits := mustLimits(t, texts...)
			b, err := NewBucket(limits, 0)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Date(2025, 3, 1, 9, 0, 0, 0, time.UTC)
			now := start
			store, err := memstore.New(memstore.Options{Now: func() time.Time { return now }, SweepInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			rng := rand.New(rand.NewPCG(2, uint64(len(texts))))
			for i, r := range randomTrace(rng, 1000, 4) {
				now = start.Add(r.At)
				rs := make([]sluice.Request, len(limits))
				for j, l := range limits {
					rs[j] = sluice.Request{Policy: "p" + strconv.Itoa(j), Key: r.Key, Cost: r.Cost, Limit: l}
				}
				var allowed bool
				var retry time.Duration
				var storeErr error
				if len(limits) == 1 {
					d, err := store.Take(context.Background(), rs[0])
					allowed, retry, storeErr = d.Allowed, d.RetryAfter, err
				} else {
					md, err := store.TakeAll(context.Background(), rs)
					allowed, retry, storeErr = md.Allowed, md.RetryAfter, err
				}
				got := b.Decide(r)
				if (got.Err != nil) != (storeErr != nil) || (storeErr == nil && (got.Allowed != allowed || got.RetryAfter != retry)) {
					t.Fatalf("request %d %+v: Bucket %+v, memstore allowed %t retry %v error %v", i, r, got, allowed, retry, storeErr)
				}
			}
		})
	}
}
