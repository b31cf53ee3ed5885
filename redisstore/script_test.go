package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/exact"
	"github.com/sluicehq/sluice/internal/redistest"
	"pgregory.net/rapid"
)

// maxPeriodMicros is sluice.MaxPeriod in microseconds.
const maxPeriodMicros = int64(sluice.MaxPeriod / time.Microsecond)

// edgeLimit draws a limit the store accepts, favouring capacity × reduced
// period just below 2^52, where the script's intermediates come closest to
// 2^53.
func edgeLimit(t *rapid.T, label string) sluice.Limit {
	n := rapid.OneOf(
		rapid.Int64Range(0, 3),
		rapid.Int64Range(1, 1000),
		rapid.Int64Range(1, sluice.MaxTokens),
		rapid.Just[int64](sluice.MaxTokens),
	).Draw(t, label+" tokens")
	p := rapid.OneOf(
		rapid.Int64Range(1, 5000),
		rapid.Int64Range(1, maxPeriodMicros),
		rapid.Just(maxPeriodMicros),
	).Draw(t, label+" period µs")
	p1 := int64(1)
	if n > 0 {
		p1 = p / int64(exact.GCD(uint64(n), uint64(p)))
	}
	most := min(sluice.MaxCapacity, (1<<limitBits-1)/p1)
	c := rapid.OneOf(
		rapid.Int64Range(1, most),
		rapid.Int64Range(max(1, most-3), most),
		rapid.Int64Range(1, min(most, 10)),
	).Draw(t, label+" capacity")
	return sluice.Limit{Capacity: c, Rate: sluice.Per(n, time.Duration(p)*time.Microsecond)}
}

// TestScriptMatchesPlan checks the script against bucket.Plan at a 1µs tick
// on states drawn directly, not reached by takes: levels anywhere on the
// grid, limits at the edge of what the store accepts, idle gaps up to the
// end of its time range, the clock behind the stamp (the waits then count
// from now), and limit changes under every conversion. The decision and
// the state written must be Plan's, bit for bit.
func TestScriptMatchesPlan(t *testing.T) {
	c := redistest.Client(t)
	prefix := newPrefix(t, c)
	rapid.Check(t, func(rt *rapid.T) {
		var tc planCase
		tc.from = edgeLimit(rt, "old")
		tc.to = tc.from
		if rapid.Bool().Draw(rt, "limit change") {
			tc.to = edgeLimit(rt, "new")
		}
		tc.conv = rapid.SampledFrom([]sluice.Conversion{sluice.KeepTokens, sluice.ScaleTokens, sluice.ResetTokens}).Draw(rt, "conversion")
		tc.otherSettings = rapid.Bool().Draw(rt, "written with other settings")
		oldPlan, err := bucket.NewPlan(tc.from, time.Microsecond)
		if err != nil {
			rt.Fatalf("NewPlan(%v): %v", tc.from, err)
		}
		// A state on the old limit's grid.
		tc.state.Tokens = rapid.Int64Range(0, tc.from.Capacity).Draw(rt, "tokens")
		if tc.state.Tokens < tc.from.Capacity {
			tc.state.Frac = uint64(rapid.Int64Range(0, int64(oldPlan.Scale())-1).Draw(rt, "frac"))
		}
		tc.state.Stamp = rapid.Int64Range(0, maxExact).Draw(rt, "stamp")
		tc.now = rapid.OneOf(
			rapid.Int64Range(0, maxExact),
			rapid.Int64Range(tc.state.Stamp, min(maxExact, tc.state.Stamp+1000)),
			rapid.Int64Range(max(0, tc.state.Stamp-1000), tc.state.Stamp),
			rapid.Int64Range(tc.state.Stamp, min(maxExact, tc.state.Stamp+int64(2*oldPlan.Scale()))),
		).Draw(rt, "now")
		tc.cost = rapid.Int64Range(1, tc.to.Capacity).Draw(rt, "cost")
		tc.check(rt, c, prefix)
	})
}

// TestScriptConversionEdges: limit changes whose exact products exceed
// 2^53, where a float computation of floor(x*y/z) goes wrong (found by
// TestScriptMatchesPlan against a script that used one), and a refill that
// ends one microsecond before the bucket is full (7/3 µs rounds up to 3).
func TestScriptConversionEdges(t *testing.T) {
	c := redistest.Client(t)
	prefix := newPrefix(t, c)
	maxTokens366d := sluice.Limit{Capacity: 2333373, Rate: sluice.Per(sluice.MaxTokens, sluice.MaxPeriod)}
	tests := []struct {
		name string
		tc   planCase
	}{
		{"scale to 2^40 per 366 days", planCase{
			from: sluice.Limit{Capacity: 2, Rate: sluice.Per(1, 4*time.Microsecond)}, to: maxTokens366d,
			conv: sluice.ScaleTokens, state: bucket.State{Tokens: 1, Frac: 1}, now: 1, cost: 1}},
		{"scale from 2^40 per 366 days", planCase{
			from: maxTokens366d, to: sluice.Limit{Capacity: 4503599, Rate: sluice.Every(1000 * time.Second)},
			conv: sluice.ScaleTokens, state: bucket.State{Tokens: 2333372, Frac: 1930078124, Stamp: 5}, now: 5, cost: 1}},
		{"keep, fraction onto a finer grid", planCase{
			from: maxTokens366d, to: sluice.Limit{Capacity: 142, Rate: sluice.Every(sluice.MaxPeriod)},
			conv: sluice.KeepTokens, state: bucket.State{Tokens: 7, Frac: 1930078124}, now: 0, cost: 1}},
		{"refill a microsecond short of full", planCase{
			from: sluice.Limit{Capacity: 10, Rate: sluice.Per(3, 7*time.Microsecond)}, to: sluice.Limit{Capacity: 10, Rate: sluice.Per(3, 7*time.Microsecond)},
			conv: sluice.KeepTokens, state: bucket.State{Tokens: 9, Stamp: 100}, now: 102, cost: 10}},
		// The clock 2^53 - 1 - 10^12 µs behind the stamp: the wait for one
		// token from now is 2^53 + 30622400000000 - 1 µs, an odd number
		// beyond a double's integers, which the script must not round;
		// the wait until full is beyond a time.Duration (Never).
		{"wait from now beyond 2^53", planCase{
			from: sluice.Limit{Capacity: 142, Rate: sluice.Every(sluice.MaxPeriod)}, to: sluice.Limit{Capacity: 142, Rate: sluice.Every(sluice.MaxPeriod)},
			conv: sluice.KeepTokens, state: bucket.State{Tokens: 0, Stamp: maxExact}, now: 1_000_000_000_000, cost: 1}},
		{"wait from now just below 2^53", planCase{
			from: sluice.Limit{Capacity: 142, Rate: sluice.Every(sluice.MaxPeriod)}, to: sluice.Limit{Capacity: 142, Rate: sluice.Every(sluice.MaxPeriod)},
			conv: sluice.KeepTokens, state: bucket.State{Tokens: 0, Stamp: maxExact}, now: 31622400000000 + 1, cost: 1}},
		{"scale, both products near 2^52", planCase{
			from: sluice.Limit{Capacity: 1 << 40, Rate: sluice.Per(1, 4095*time.Microsecond)},
			to:   sluice.Limit{Capacity: 1<<40 - 1, Rate: sluice.Per(3, 4093*time.Microsecond)},
			conv: sluice.ScaleTokens, state: bucket.State{Tokens: 1<<40 - 1, Frac: 4094}, now: 0, cost: 1 << 39}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.tc.check(t, c, prefix) })
	}
}

// planCase is a bucket in state under limit from, asked at microsecond now
// to take cost under limit to.
type planCase struct {
	from, to      sluice.Limit
	conv          sluice.Conversion
	otherSettings bool // the bucket was written by a store with another conversion and least TTL
	state         bucket.State
	now           int64
	cost          int64
}

// check writes the bucket directly, then requires the store's Peek and Take
// and the state the Take writes to be bucket.Plan's.
func (tc planCase) check(t interface {
	Helper()
	Fatalf(string, ...any)
}, c client, prefix string) {
	t.Helper()
	ctx := context.Background()
	oldPlan, err := bucket.NewPlan(tc.from, time.Microsecond)
	if err != nil {
		t.Fatalf("NewPlan(%v): %v", tc.from, err)
	}
	newPlan, err := bucket.NewPlan(tc.to, time.Microsecond)
	if err != nil {
		t.Fatalf("NewPlan(%v): %v", tc.to, err)
	}
	s, err := New(c, Options{Prefix: prefix, OnLimitChange: tc.conv, Now: func() time.Time { return micros(tc.now) }, MinTTL: time.Hour})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	// The bucket as a store with these settings wrote it, or one with
	// other settings (the limit is the same, the spec is not).
	writer := s
	if tc.otherSettings {
		if writer, err = New(c, Options{Prefix: prefix, OnLimitChange: (tc.conv + 1) % 3}); err != nil {
			t.Fatalf("New: %v", err)
		}
	}
	const key = "k"
	value := stateValue(writer, tc.from, tc.state)
	if err := c.Set(ctx, s.bucketKey(testPolicy, key), value, time.Minute).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}

	// The reference: refill under the old limit, convert, decide.
	want := oldPlan.Refill(tc.state, tc.now)
	if tc.from != tc.to {
		want = newPlan.Convert(want, &oldPlan, tc.conv)
	}
	peekWant := newPlan.Peek(want, tc.now, tc.cost)
	var wantD sluice.Decision
	newPlan.Take(&want, tc.now, tc.cost, &wantD)

	call := fmt.Sprintf("(%v) of %q (%v) at %d", tc.to, value, tc.conv, tc.now)
	peek, err := s.Peek(ctx, sluice.Request{Policy: testPolicy, Key: key, Cost: tc.cost, Limit: tc.to})
	if err != nil {
		t.Fatalf("Peek%s: %v", call, err)
	}
	if diff := cmp.Diff(peekWant, peek); diff != "" {
		t.Fatalf("Peek%s = %+v, want %+v (Plan's) (-want +got):\n%s", call, peek, peekWant, diff)
	}
	got, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: key, Cost: tc.cost, Limit: tc.to})
	if err != nil {
		t.Fatalf("Take%s, cost %d: %v", call, tc.cost, err)
	}
	if diff := cmp.Diff(wantD, got); diff != "" {
		t.Fatalf("Take%s, cost %d = %+v, want %+v (Plan's) (-want +got):\n%s", call, tc.cost, got, wantD, diff)
	}
	stored, err := c.Get(ctx, s.bucketKey(testPolicy, key)).Result()
	if err != nil {
		t.Fatalf("GET after Take: %v", err)
	}
	if wantStored := stateValue(s, tc.to, want); stored != wantStored {
		t.Fatalf("Take%s, cost %d stored %q, want %q", call, tc.cost, stored, wantStored)
	}
}

// stateValue is the bucket value the script stores for state st under l
// with the settings of s: the spec, then the level.
func stateValue(s *Store, l sluice.Limit, st bucket.State) string {
	pl, err := compile(l)
	if err != nil {
		panic(fmt.Sprintf("compile(%v): %v", l, err))
	}
	return s.spec(pl) + levelBytes(st.Tokens, int64(st.Frac), st.Stamp)
}

// levelBytes encodes the level of a bucket value as the script does:
// struct.pack('<I6I7I7', tokens, frac, stamp).
func levelBytes(tokens, frac, stamp int64) string {
	var b []byte
	for i, v := range []int64{tokens, frac, stamp} {
		size := 7
		if i == 0 {
			size = 6
		}
		for range size {
			b = append(b, byte(v))
			v >>= 8
		}
	}
	return string(b)
}

// micros returns the time us microseconds after the store's epoch.
func micros(us int64) time.Time {
	return time.Unix(epochUnix, 0).Add(time.Duration(us) * time.Microsecond)
}

// TestScriptRejectsBadArguments calls the script directly, past the Go
// checks, with every argument replaced by each value Lua would misread
// (tonumber accepts "nan", "inf", "0x10", "1e309" and " 12 "; 2^53+1 is not
// a double) or by a value out of range: each call must fail with an error
// and leave no key behind.
func TestScriptRejectsBadArguments(t *testing.T) {
	c := redistest.Client(t)
	ctx := t.Context()
	prefix := newPrefix(t, c)
	s, err := New(c, Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{s.bucketKey(testPolicy, "k"), s.recordKey(testPolicy, "k", "id")}
	// The fields of a valid take with a request ID, 10 tokens, 3 per
	// second: operation, time, C, n, P, n', p', cost, conversion, least TTL,
	// request-ID memory; for "takes", the fields after the least TTL are
	// the further costs. args makes the script's arguments of them, the
	// seven numbers of the spec encoded into one.
	good := []string{"take", "1000000", "10", "3", "1000000", "3", "1000000", "1", "0", "0", "60000000"}
	edges := []string{"nan", "inf", "-inf", "1e309", "0x10", "-0", "-1", " 12 ", "12 ", "1.5", "1e8", "01", "9007199254740993", "9007199254740992", "99999999999999999999", ""}
	textFields := []int{1, 7, 10} // time, cost, request-ID memory
	args := func(f []string) []string {
		var n [7]int64
		for i, v := range append(slices.Clone(f[2:7]), f[8], f[9]) {
			x, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("spec field %q: %v", v, err)
			}
			n[i] = x
		}
		spec := specArg(plan{c: n[0], n: n[1], p: n[2], n1: n[3], p1: n[4]}, n[5], n[6])
		a := []string{f[0], f[1], spec, f[7]}
		if f[0] == "takes" {
			return append(a, f[11:]...)
		}
		return append(a, f[10:]...)
	}
	run := func(keys []string, args []string) error {
		a := make([]any, len(args))
		for i, v := range args {
			a[i] = v
		}
		return redis.NewScript(script).Run(ctx, c, keys, a...).Err()
	}
	if err := run(keys, args(good)); err != nil {
		t.Fatalf("the valid call fails: %v", err)
	}
	if err := deleteKeys(ctx, c, prefix); err != nil {
		t.Fatal(err)
	}

	type call struct {
		name string
		keys []string
		args []string
	}
	var calls, raw []call // fields, and script arguments
	for _, i := range textFields {
		for _, e := range edges {
			args := append([]string(nil), good...)
			args[i] = e
			calls = append(calls, call{fmt.Sprintf("field %d=%q", i+1, e), keys, args})
		}
	}
	with := func(name string, f func(args []string) []string) {
		calls = append(calls, call{name, keys, f(append([]string(nil), good...))})
	}
	with("unknown operation", func(a []string) []string { a[0] = "give"; return a })
	with("peek with a request-ID key", func(a []string) []string { a[0] = "peek"; return a })
	with("capacity 2^40+1", func(a []string) []string { a[2] = "1099511627777"; return a })
	with("tokens above 2^40", func(a []string) []string { a[3] = "1099511627777"; return a })
	with("period above 366 days", func(a []string) []string { a[4] = "31622400000001"; return a })
	with("period 0", func(a []string) []string { a[4] = "0"; return a })
	with("rate not reduced", func(a []string) []string { a[3], a[4], a[5], a[6] = "2", "1000000", "2", "1000000"; return a })
	with("reduced rate of another rate", func(a []string) []string { a[5], a[6] = "1", "333333"; return a })
	with("reduced tokens 0 of a refilling rate", func(a []string) []string { a[5] = "0"; return a })
	with("no refill reduced to 0/2", func(a []string) []string { a[3], a[5], a[6] = "0", "0", "2"; return a })
	with("capacity × period 2^52", func(a []string) []string {
		a[2], a[3], a[4], a[5], a[6] = "1099511627776", "1", "4096", "1", "4096"
		return a
	})
	with("cost 0", func(a []string) []string { a[7] = "0"; return a })
	with("cost above capacity", func(a []string) []string { a[7] = "11"; return a })
	with("conversion 3", func(a []string) []string { a[8] = "3"; return a })
	with("request-ID memory 0", func(a []string) []string { a[10] = "0"; return a })
	with("time 2^53", func(a []string) []string { a[1] = "9007199254740992"; return a })
	with("least TTL 2^53", func(a []string) []string { a[9] = "9007199254740992"; return a })
	with("period 2^46", func(a []string) []string { a[4], a[6] = "70368744177664", "70368744177664"; return a })
	with("ten arguments", func(a []string) []string { return a[:10] })
	with("twelve arguments", func(a []string) []string { return append(a, "0") })
	with("a second cost with a request ID", func(a []string) []string { return append(a, "1") })
	// "takes": one key per cost, each cost in range, no request ID.
	takes := append([]string(nil), good...)
	takes[0], takes[10] = "takes", "0"
	bucket := keys[0]
	for _, extra := range [][]string{{"0"}, {"11"}, {"1", ""}, {"1", "nan"}, {"-1"}, {"01"}, {"1e1"}} {
		calls = append(calls, call{fmt.Sprintf("takes, more costs %q", extra), slices.Repeat([]string{bucket}, 1+len(extra)), append(slices.Clone(takes), extra...)})
	}
	calls = append(calls,
		call{"takes, a key short", []string{bucket}, append(slices.Clone(takes), "1")},
		call{"takes, a key too many", []string{bucket, bucket, bucket}, append(slices.Clone(takes), "1")},
		call{"peek with a second cost", []string{bucket}, append([]string{"peek"}, append(slices.Clone(takes[1:]), "1")...)},
	)
	calls = append(calls,
		call{"request-ID memory without a request ID", keys[:1], good},
		call{"three keys", append(keys, s.bucketKey(testPolicy, "x")), good},
		call{"no key", nil, good},
	)
	// The spec is binary: a value of any other length is refused, Lua's
	// number edges among them.
	spec := args(good)[2]
	for _, bad := range append([]string{spec[:specLen-1], spec + "\x00", strings.Repeat("1", specLen)}, edges...) {
		a := args(good)
		a[2] = bad
		raw = append(raw, call{fmt.Sprintf("spec %q", bad), keys, a})
	}
	for _, tt := range calls {
		raw = append(raw, call{tt.name, tt.keys, args(tt.args)})
	}
	for _, tt := range raw {
		t.Run(tt.name, func(t *testing.T) {
			err := run(tt.keys, tt.args)
			if err == nil || !strings.Contains(err.Error(), "sluice:") {
				t.Errorf("script(%q) = %v, want a sluice error", tt.args, err)
			}
			if n, err := c.Exists(ctx, keys...).Result(); err != nil || n != 0 {
				t.Errorf("after script(%q): EXISTS = %d, %v; want 0 (nothing written)", tt.args, n, err)
			}
		})
	}
	if left, err := scanKeys(ctx, c, prefix); err != nil || len(left) != 0 {
		t.Errorf("keys left under %q: %q, %v; want none", prefix, left, err)
	}
}

// TestScriptRejectsForeignValues: a bucket or record key holding a value
// the store did not write (another type, text, numbers out of range) fails
// the call and is left as it was, with a request ID and, for a bucket,
// without one (the script's fast path).
func TestScriptRejectsForeignValues(t *testing.T) {
	c := redistest.Client(t)
	ctx := t.Context()
	s := newStore(t, c, Options{})
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(3)}
	bucket, record := s.bucketKey(testPolicy, "k"), s.recordKey(testPolicy, "k", "id")
	// foreign is a value in the store's layout under l with a level the
	// store cannot have written.
	foreign := func(tokens, frac, stamp int64) string {
		return s.spec(plan{c: 10, n: 3, p: 1_000_000, n1: 3, p1: 1_000_000}) + levelBytes(tokens, frac, stamp)
	}
	setBucket := func(v string) func() error {
		return func() error { return c.Set(ctx, bucket, v, 0).Err() }
	}
	tests := []struct {
		name string
		key  string // the key holding the foreign value
		set  func() error
	}{
		{"bucket is a hash", bucket, func() error { return c.HSet(ctx, bucket, "tokens", "1").Err() }},
		{"bucket is text", bucket, setBucket("hello")},
		{"bucket tokens above capacity", bucket, setBucket(foreign(11, 0, 5))},
		{"bucket stamp 2^53", bucket, setBucket(foreign(1, 0, 1<<53))},
		{"bucket fraction of a full bucket", bucket, setBucket(foreign(10, 5, 5))},
		{"bucket fraction of a whole token", bucket, setBucket(foreign(1, 1_000_000, 5))},
		// The request ID is remembered: the bucket is checked before the
		// record is replayed.
		{"bucket fraction of a whole token after the request ID's first use", bucket, func() error {
			if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: l, RequestID: "id"}); err != nil {
				return err
			}
			return c.Set(ctx, bucket, foreign(1, 1_000_000, 5), redis.KeepTTL).Err()
		}},
		{"record is a list", record, func() error { return c.RPush(ctx, record, "x").Err() }},
		{"record is text", record, func() error { return c.Set(ctx, record, "x", 0).Err() }},
	}
	// dump returns the serialized values of the bucket and record keys, ""
	// for a missing one.
	dump := func() [2]string {
		var d [2]string
		for i, k := range []string{bucket, record} {
			d[i], _ = c.Dump(ctx, k).Result()
		}
		return d
	}
	for _, tt := range tests {
		for _, id := range []string{"id", ""} {
			if id == "" && tt.key != bucket {
				continue
			}
			t.Run(fmt.Sprintf("%s/request ID %q", tt.name, id), func(t *testing.T) {
				if err := c.Del(ctx, bucket, record).Err(); err != nil {
					t.Fatal(err)
				}
				if err := tt.set(); err != nil {
					t.Fatal(err)
				}
				before := dump()
				d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: l, RequestID: id})
				if err == nil {
					t.Fatalf("Take = %+v, nil; want an error", d)
				}
				if errors.Is(err, sluice.ErrInvalidLimit) || errors.Is(err, sluice.ErrRequestIDConflict) {
					t.Errorf("Take error %v wraps a parameter sentinel; want a store error", err)
				}
				var se *ScriptError
				if !errors.As(err, &se) || !errors.Is(err, sluice.ErrMisconfigured) || sluice.IsUnavailable(err) {
					t.Errorf("Take error %v (%T) is not a *ScriptError wrapping %v alone", err, err, sluice.ErrMisconfigured)
				}
				if after := dump(); after != before {
					t.Errorf("bucket and record keys changed from %q to %q", before, after)
				}
			})
		}
	}
}

// TestScriptRejectsBadSpecStored: a bucket stored under a spec out of
// range, called with that same spec (past the Go checks, so the bytes
// match and the spec is read from the bucket), fails the call on either
// path and is left as it was.
func TestScriptRejectsBadSpecStored(t *testing.T) {
	c := redistest.Client(t)
	ctx := t.Context()
	s := newStore(t, c, Options{})
	key := s.bucketKey(testPolicy, "k")
	tests := []struct {
		name  string
		pl    plan
		least int64
	}{
		{"capacity 2^40+1", plan{c: 1<<40 + 1, n: 1, p: 1, n1: 1, p1: 1}, 0},
		{"reduced rate tokens 2^40+1", plan{c: 1, n: 1<<40 + 1, p: 1, n1: 1<<40 + 1, p1: 1}, 0},
		{"capacity × reduced period 2^52", plan{c: 1 << 40, n: 1, p: 4096, n1: 1, p1: 4096}, 0},
		{"least TTL 2^53", plan{c: 10, n: 1, p: 1000, n1: 1, p1: 1000}, 1 << 53},
	}
	for _, tt := range tests {
		for _, op := range []string{"take", "peek"} {
			t.Run(tt.name+"/"+op, func(t *testing.T) {
				spec := specArg(tt.pl, 0, tt.least)
				value := spec + levelBytes(0, 0, 5)
				if err := c.Set(ctx, key, value, time.Minute).Err(); err != nil {
					t.Fatal(err)
				}
				err := redis.NewScript(script).Run(ctx, c, []string{key}, op, "1000", spec, "1").Err()
				if err == nil || !strings.Contains(err.Error(), "sluice") {
					t.Errorf("%s of a bucket under its own bad spec: %v; want a sluice error", op, err)
				}
				if got, err := c.Get(ctx, key).Result(); err != nil || got != value {
					t.Errorf("bucket %q, %v after the call; want it left as %q", got, err, value)
				}
			})
		}
	}
}

// TestStoredStampNeverMovesBack: a bucket stamped in the future (written
// by a server whose clock was ahead, before a failover) refills nothing
// until Redis TIME passes the stamp, and keeps its stamp and its TTL beyond
// it; its waits count from now, so they include the time until the stamp.
func TestStoredStampNeverMovesBack(t *testing.T) {
	c := redistest.Client(t)
	ctx := t.Context()
	s := newStore(t, c, Options{})
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
	tm, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	future := tm.Sub(time.Unix(epochUnix, 0)).Microseconds() + int64(time.Hour/time.Microsecond)

	// Empty at a stamp an hour ahead, with the expiry the server that
	// wrote it gave it: one token is an hour and a second away, the full
	// bucket an hour and ten seconds. The denial writes nothing.
	value := stateValue(s, l, bucket.State{Tokens: 0, Stamp: future})
	if err := c.Set(ctx, s.bucketKey(testPolicy, "k"), value, time.Hour+10*time.Second+time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: l})
	if err != nil {
		t.Fatal(err)
	}
	// The waits count from now, an hour before the stamp (less the time
	// since TIME was read above): the wait after the stamp, plus the hour.
	ahead := func(after time.Duration) (lo, hi time.Duration) {
		return time.Hour + after - time.Second, time.Hour + after
	}
	if lo, hi := ahead(time.Second); d.Allowed || d.Remaining != 0 || d.RetryAfter < lo || d.RetryAfter > hi {
		t.Errorf("Take = %+v; want denied, 0 remaining, retry in [%v, %v] (1s after the stamp)", d, lo, hi)
	}
	if lo, hi := ahead(10 * time.Second); d.ResetAfter < lo || d.ResetAfter > hi {
		t.Errorf("Take = %+v; want reset in [%v, %v] (10s after the stamp)", d, lo, hi)
	}
	if got, err := c.Get(ctx, s.bucketKey(testPolicy, "k")).Result(); err != nil || got != value {
		t.Errorf("bucket after Take = %q, %v; want %q unchanged", got, err, value)
	}
	pttl, err := c.PTTL(ctx, s.bucketKey(testPolicy, "k")).Result()
	if min := time.Hour + 9*time.Second; err != nil || pttl < min || pttl > time.Hour+10*time.Second+time.Millisecond {
		t.Errorf("PTTL = %v, %v; want about 1h10s (the stamp, an hour ahead, plus the refill)", pttl, err)
	}

	// Five tokens at that stamp: the take is allowed at the stamp, not
	// now, and the expiry is set from the stamp: full 6s after it.
	if err := c.Set(ctx, s.bucketKey(testPolicy, "k"), stateValue(s, l, bucket.State{Tokens: 5, Stamp: future}), 0).Err(); err != nil {
		t.Fatal(err)
	}
	d, err = s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: l})
	if err != nil {
		t.Fatal(err)
	}
	if lo, hi := ahead(6 * time.Second); !d.Allowed || d.Remaining != 4 || d.ResetAfter < lo || d.ResetAfter > hi {
		t.Errorf("Take = %+v; want allowed, 4 remaining, reset in [%v, %v] (6s after the stamp)", d, lo, hi)
	}
	want := stateValue(s, l, bucket.State{Tokens: 4, Stamp: future})
	if got, err := c.Get(ctx, s.bucketKey(testPolicy, "k")).Result(); err != nil || got != want {
		t.Errorf("bucket after Take = %q, %v; want %q (the stamp kept)", got, err, want)
	}
	pttl, err = c.PTTL(ctx, s.bucketKey(testPolicy, "k")).Result()
	if min := time.Hour + 5*time.Second; err != nil || pttl < min || pttl > time.Hour+6*time.Second+time.Millisecond {
		t.Errorf("PTTL = %v, %v; want about 1h6s (the stamp, an hour ahead, plus the refill)", pttl, err)
	}
}

// TestScriptSharedTakes: one "takes" script call (how a batch sends takes
// under one limit) decides its takes one after another at one time, as
// bucket.Plan does, on two buckets met in any order, stored or missing,
// under limit changes, and stores Plan's final state of each.
func TestScriptSharedTakes(t *testing.T) {
	c := redistest.Client(t)
	ctx := context.Background()
	prefix := newPrefix(t, c)
	s, err := New(c, Options{Prefix: prefix, MinTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	rapid.Check(t, func(rt *rapid.T) {
		from := edgeLimit(rt, "old")
		to := from
		if rapid.Bool().Draw(rt, "limit change") {
			to = edgeLimit(rt, "new")
		}
		oldPlan, err := bucket.NewPlan(from, time.Microsecond)
		if err != nil {
			rt.Fatalf("NewPlan(%v): %v", from, err)
		}
		newPlan, err := bucket.NewPlan(to, time.Microsecond)
		if err != nil {
			rt.Fatalf("NewPlan(%v): %v", to, err)
		}
		now := rapid.Int64Range(0, maxExact).Draw(rt, "now")
		// Two buckets on the old limit's grid, stamped around now, or
		// missing.
		keys := []string{s.bucketKey(testPolicy, "k0"), s.bucketKey(testPolicy, "k1")}
		var want [2]bucket.State
		var values [2]string
		for i, key := range keys {
			var st bucket.State
			st.Tokens = rapid.Int64Range(0, from.Capacity).Draw(rt, "tokens")
			if st.Tokens < from.Capacity {
				st.Frac = uint64(rapid.Int64Range(0, int64(oldPlan.Scale())-1).Draw(rt, "frac"))
			}
			st.Stamp = rapid.Int64Range(max(0, now-int64(2*oldPlan.Scale())), min(maxExact, now+1000)).Draw(rt, "stamp")
			if rapid.Bool().Draw(rt, "missing") {
				if err := c.Del(ctx, key).Err(); err != nil {
					rt.Fatal(err)
				}
				want[i] = newPlan.Full(now)
				values[i] = "(missing)"
				continue
			}
			values[i] = stateValue(s, from, st)
			if err := c.Set(ctx, key, values[i], time.Minute).Err(); err != nil {
				rt.Fatalf("SET: %v", err)
			}
			want[i] = oldPlan.Refill(st, now)
			if from != to {
				want[i] = newPlan.Convert(want[i], &oldPlan, sluice.KeepTokens)
			}
		}
		costs := rapid.SliceOfN(rapid.Int64Range(1, to.Capacity), 2, 8).Draw(rt, "costs")
		which := rapid.SliceOfN(rapid.IntRange(0, 1), len(costs), len(costs)).Draw(rt, "buckets")

		pl, err := compile(to)
		if err != nil {
			rt.Fatalf("compile(%v): %v", to, err)
		}
		args := []any{"evalsha", scriptSHA, len(costs)}
		for _, w := range which {
			args = append(args, keys[w])
		}
		// The store's least TTL of an hour: the explicit time does not
		// follow the server's clock, which expires the keys.
		args = append(args, "takes", now, s.spec(pl), costs[0])
		for _, cost := range costs[1:] {
			args = append(args, cost)
		}
		reply, err := decisionCmdReply(ctx, c, args)
		if err != nil {
			rt.Fatalf("takes %v of buckets %v (%q) at %d: %v", costs, which, values, now, err)
		}
		if len(reply) != 5*len(costs) {
			rt.Fatalf("reply %q has %d values for %d costs", reply, len(reply), len(costs))
		}
		for i, cost := range costs {
			var wantD sluice.Decision
			newPlan.Take(&want[which[i]], now, cost, &wantD)
			got, _, err := decision(reply[5*i:5*i+5], to)
			if err != nil {
				rt.Fatal(err)
			}
			if diff := cmp.Diff(wantD, got); diff != "" {
				rt.Fatalf("take %d (costs %v of buckets %v, %q) at %d (-Plan +script):\n%s", i+1, costs, which, values, now, diff)
			}
		}
		for i, key := range keys {
			if !slices.Contains(which, i) {
				continue
			}
			if stored, err := c.Get(ctx, key).Result(); err != nil || stored != stateValue(s, to, want[i]) {
				rt.Fatalf("bucket %d stored %q, %v; want Plan's %q", i, stored, err, stateValue(s, to, want[i]))
			}
		}
	})
}

// decisionCmdReply runs args, an EVALSHA of the script, and sends the
// script in full if the server does not have it (other tests flush the
// script cache).
func decisionCmdReply(ctx context.Context, c client, args []any) ([]any, error) {
	cmd := redis.NewCmd(ctx, args...)
	if err := c.Process(ctx, cmd); redis.HasErrorPrefix(err, "NOSCRIPT") {
		args = slices.Clone(args)
		args[0], args[1] = "eval", script
		cmd = redis.NewCmd(ctx, args...)
		_ = c.Process(ctx, cmd)
	}
	return cmd.Slice()
}

// TestQuietDenialsDecideAlike checks, on bucket.Plan (which the script
// reproduces bit for bit), why the script may skip writing a denial on
// Redis TIME: for any bucket, a denial at t1 and any later decision at
// t2 >= t1 decide the same, and leave the same state, whether or not the
// denial's state was stored; and the denial does not move the time the
// bucket is full again, so the stored expiry still holds.
func TestQuietDenialsDecideAlike(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		l := sluice.Limit{
			Capacity: rapid.Int64Range(1, 1_000_000).Draw(rt, "capacity"),
			Rate: sluice.Rate{
				Tokens: rapid.Int64Range(0, 1_000_000).Draw(rt, "tokens"),
				Period: time.Duration(rapid.Int64Range(1, 1_000_000_000).Draw(rt, "period µs")) * time.Microsecond,
			},
		}
		if checkLimit(l) != nil {
			rt.Skip("a limit Redis cannot decide exactly")
		}
		p, err := bucket.NewPlan(l, time.Microsecond)
		if err != nil {
			rt.Fatal(err)
		}
		stored := bucket.State{
			Tokens: rapid.Int64Range(0, l.Capacity).Draw(rt, "stored tokens"),
			Stamp:  rapid.Int64Range(0, 1e13).Draw(rt, "stored stamp"),
		}
		if stored.Tokens < l.Capacity {
			stored.Frac = rapid.Uint64Range(0, p.Scale()-1).Draw(rt, "stored frac")
		}
		t1 := rapid.Int64Range(0, 1e13).Draw(rt, "t1")
		t2 := t1 + rapid.Int64Range(0, 1e10).Draw(rt, "t2 - t1")
		cost1 := rapid.Int64Range(1, l.Capacity).Draw(rt, "cost1")
		cost2 := rapid.Int64Range(1, l.Capacity).Draw(rt, "cost2")

		written := stored
		var d1 sluice.Decision
		p.Take(&written, t1, cost1, &d1)
		if d1.Allowed {
			rt.Skip("allowed: the script writes it")
		}
		if got, want := p.FullAt(written), p.FullAt(stored); got != want {
			rt.Fatalf("denial moved the full time from %d to %d (stored %+v, written %+v)", want, got, stored, written)
		}
		quiet := stored
		var dWritten, dQuiet sluice.Decision
		p.Take(&written, t2, cost2, &dWritten)
		p.Take(&quiet, t2, cost2, &dQuiet)
		if dWritten != dQuiet || written != quiet {
			rt.Fatalf("after a denial at %d, a take at %d decided %+v leaving %+v when the denial was stored, %+v leaving %+v when not",
				t1, t2, dWritten, written, dQuiet, quiet)
		}
	})
}

// TestQuietDenials: on Redis TIME a denial of a bucket stored under the
// same limit leaves the stored value and its expiry as they were; with an
// explicit time it stores its stamp; a denial that converts the bucket to
// a new limit stores the conversion.
func TestQuietDenials(t *testing.T) {
	c := redistest.Client(t)
	ctx := t.Context()
	l := sluice.Limit{Capacity: 2, Rate: sluice.Per(1, time.Hour)}
	at := micros(1_000_000)
	for _, tt := range []struct {
		name   string
		o      Options
		writes bool
	}{
		{"Redis TIME", Options{}, false},
		{"explicit time", Options{Now: func() time.Time { at = at.Add(time.Millisecond); return at }, MinTTL: time.Hour}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newStore(t, c, tt.o)
			key := s.bucketKey(testPolicy, "k")
			before := emptyMarked(t, c, s, "k", l)
			time.Sleep(2 * time.Millisecond)
			if d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: l}); err != nil || d.Allowed {
				t.Fatalf("third Take = %+v, %v; want denied", d, err)
			}
			after, pttl := valueAndPTTL(t, c, key)
			if wrote := after != before || pttl < 9*time.Hour; wrote != tt.writes {
				t.Errorf("denial: value %q → %q, PTTL %v; wrote %v, want %v", before, after, pttl, wrote, tt.writes)
			}
			// A denial under another limit converts the bucket and stores it.
			other := sluice.Limit{Capacity: 3, Rate: sluice.Per(1, time.Hour)}
			if d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 3, Limit: other}); err != nil || d.Allowed {
				t.Fatalf("Take under another limit = %+v, %v; want denied", d, err)
			}
			pl, err := compile(other)
			if err != nil {
				t.Fatal(err)
			}
			if v, err := c.Get(ctx, key).Result(); err != nil || !strings.HasPrefix(v, s.spec(pl)) {
				t.Errorf("after a denial under another limit the bucket holds %q, %v; want it stored under the new limit", v, err)
			}
		})
	}
}

// TestQuietDenialsShared: in one "takes" call on Redis TIME (how a batch
// sends takes under one limit), a bucket stored under the same spec whose
// takes are all denied is left as it was, with its expiry, while a bucket
// with an allowed take is written.
func TestQuietDenialsShared(t *testing.T) {
	c := redistest.Client(t)
	ctx := t.Context()
	s := newStore(t, c, Options{})
	l := sluice.Limit{Capacity: 2, Rate: sluice.Per(1, time.Hour)}
	empty, fresh := s.bucketKey(testPolicy, "empty"), s.bucketKey(testPolicy, "fresh")
	before := emptyMarked(t, c, s, "empty", l)
	pl, err := compile(l)
	if err != nil {
		t.Fatal(err)
	}
	args := []any{"evalsha", scriptSHA, 3, empty, fresh, empty, "takes", "redis", s.spec(pl), 1, 1, 2}
	reply, err := decisionCmdReply(ctx, c, args)
	if err != nil {
		t.Fatalf("takes: %v", err)
	}
	var allowed []bool
	for i := 0; i+5 <= len(reply); i += 5 {
		d, _, err := decision(reply[i:i+5], l)
		if err != nil {
			t.Fatal(err)
		}
		allowed = append(allowed, d.Allowed)
	}
	if want := []bool{false, true, false}; !slices.Equal(allowed, want) {
		t.Fatalf("takes allowed %v, want %v", allowed, want)
	}
	after, pttl := valueAndPTTL(t, c, empty)
	if after != before || pttl < 9*time.Hour {
		t.Errorf("denied bucket: value %q → %q, PTTL %v; want it left as it was", before, after, pttl)
	}
	if n, err := c.Exists(ctx, fresh).Result(); err != nil || n != 1 {
		t.Errorf("EXISTS of the bucket with an allowed take = %d, %v; want 1", n, err)
	}
}

// emptyMarked takes every token of key's bucket under l, a limit of
// capacity 2, then sets the bucket's expiry to 10 hours, so that a later
// call that writes the bucket shows in its PTTL. It returns the bucket's
// value.
func emptyMarked(t *testing.T, c client, s *Store, key string, l sluice.Limit) string {
	t.Helper()
	ctx := t.Context()
	for range 2 {
		if d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: key, Cost: 1, Limit: l}); err != nil || !d.Allowed {
			t.Fatalf("Take = %+v, %v; want allowed", d, err)
		}
	}
	v, err := c.Get(ctx, s.bucketKey(testPolicy, key)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.PExpire(ctx, s.bucketKey(testPolicy, key), 10*time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	return v
}

// valueAndPTTL returns the value of key and its PTTL.
func valueAndPTTL(t *testing.T, c client, key string) (string, time.Duration) {
	t.Helper()
	v, err := c.Get(t.Context(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	pttl, err := c.PTTL(t.Context(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return v, pttl
}

// TestTTLOnServerClock: a written bucket expires exactly max(ceil(reset /
// 1000) + 1, least TTL) ms after the server's clock at the write, with
// reset the reply's wait until full, which counts from now (so from before
// a stamp ahead of now), or never if it never refills, on the fast path (a missing bucket,
// a stored one with a fraction, the least TTL) and on the general path (a
// request ID, several takes, a stamp ahead of now), for takes and
// multi-takes. The server's
// millisecond at the write lies between a TIME read before the call and
// one in the same MULTI after it, so a TTL one millisecond short fails
// unless the clock ticked in between (a round trip's chance in a
// millisecond, per case).
func TestTTLOnServerClock(t *testing.T) {
	c := redistest.Client(t)
	ctx := t.Context()
	s := newStore(t, c, Options{})
	if err := c.ScriptLoad(ctx, script).Err(); err != nil {
		t.Fatal(err)
	}
	specOf := func(l sluice.Limit, least int64) string {
		pl, err := compile(l)
		if err != nil {
			t.Fatal(err)
		}
		return specArg(pl, 0, least)
	}
	// 3 tokens every 7 ms, reduced to 3 units of 1/7000 token a
	// microsecond: no wait is a whole number of milliseconds.
	spec := specOf(sluice.Limit{Capacity: 5, Rate: sluice.Per(3, 7*time.Millisecond)}, 0)
	const now = int64(1_000_000_000)
	key, other, least, never := s.bucketKey(testPolicy, "k"), s.bucketKey(testPolicy, "other"), s.bucketKey(testPolicy, "least"), s.bucketKey(testPolicy, "never")
	ahead := s.bucketKey(testPolicy, "ahead")
	// 3 tokens down, stamped 2.5 ms after now: the general path keeps the
	// stamp and measures the expiry from it.
	if err := c.Set(ctx, ahead, spec+levelBytes(2, 0, now+2500), 0).Err(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		keys  []string
		args  []any
		least int64 // the spec's least TTL, ms
	}{
		// 4 tokens left: full in 7000/3 µs.
		{"fast path, missing bucket", []string{key}, []any{"take", now, spec, 1}, 0},
		// 1 µs later: 2 tokens and 3/7000 left.
		{"fast path, stored bucket with a fraction", []string{key}, []any{"take", now + 1, spec, 2}, 0},
		{"fast path, least TTL", []string{least}, []any{"take", now, specOf(sluice.Limit{Capacity: 5, Rate: sluice.Per(3, 7*time.Millisecond)}, 60_000), 1}, 60_000},
		{"fast path, no refill", []string{never}, []any{"take", now, specOf(sluice.Limit{Capacity: 5, Rate: sluice.Per(0, time.Second)}, 0), 1}, 0},
		{"request ID", []string{key, s.recordKey(testPolicy, "k", "id")}, []any{"take", now + 1, spec, 1, 60_000_000}, 0},
		{"takes", []string{other, other}, []any{"takes", now, spec, 1, 1}, 0},
		{"stamp ahead of now", []string{ahead}, []any{"take", now, spec, 1}, 0},
		{"multi-take, fast path", []string{s.bucketKey(testPolicy, "all")}, []any{"all", now, spec, 1}, 0},
		{"multi-take, least TTL", []string{s.bucketKey(testPolicy, "all-least")}, []any{"all", now, specOf(sluice.Limit{Capacity: 5, Rate: sluice.Per(3, 7*time.Millisecond)}, 60_000), 1}, 60_000},
		{"multi-take, stamp ahead of now", []string{ahead}, []any{"all", now, spec, 1}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, err := c.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			var after *redis.TimeCmd
			var run *redis.Cmd
			var expireAt *redis.DurationCmd
			_, err = c.TxPipelined(ctx, func(p redis.Pipeliner) error {
				run = p.EvalSha(ctx, scriptSHA, tt.keys, tt.args...)
				expireAt = p.PExpireTime(ctx, tt.keys[0])
				after = p.Time(ctx)
				return nil
			})
			if err != nil && strings.Contains(err.Error(), "unknown command") {
				t.Skipf("the server has no PEXPIRETIME (Redis 7.0): %v", err)
			}
			if err != nil {
				t.Fatalf("MULTI: %v", err)
			}
			reply, err := run.Slice()
			if err != nil || len(reply) < 5 {
				t.Fatalf("script reply %v, %v", reply, err)
			}
			reset, ok := reply[len(reply)-1].(int64) // the last take's wait until full
			if !ok || reset == 0 {
				t.Fatalf("script reply %v: want a wait until full last", reply)
			}
			if reset < 0 {
				if got := expireAt.Val(); got != -1 {
					t.Errorf("PEXPIRETIME = %v, want -1 (no expiry) for a bucket that never refills", got)
				}
				return
			}
			// The reply's wait counts from now, the stamp's lead included.
			ttl := max((reset+999)/1000+1, tt.least)
			lo, hi := before.UnixMilli()+ttl, after.Val().UnixMilli()+ttl
			if got := expireAt.Val().Milliseconds(); got < lo || got > hi {
				t.Errorf("bucket expires at %d ms, want the server's millisecond at the write (%d to %d) plus %d (wait until full %d µs)",
					got, lo-ttl, hi-ttl, ttl, reset)
			}
		})
	}
}
