package limitcore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

var (
	errNoKey = errors.New("test: no key")
	errStore = errors.New("test: store failed")
	start    = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
)

// call is the request type of these tests: what a transport would read
// from an HTTP request or a gRPC call.
type call struct {
	user, tenant string
	cost         int64
	id           string
}

func byUser(c call) (string, error) {
	if c.user == "" {
		return "", fmt.Errorf("%w: no user", errNoKey)
	}
	return "user:" + c.user, nil
}

func byTenant(c call) (string, error) { return "tenant:" + c.tenant, nil }

func costOf(c call) (int64, error) {
	if c.cost < 0 {
		return 0, errors.New("cost function failed")
	}
	return max(c.cost, 1), nil
}

var (
	burst = sluice.Limit{Capacity: 5, Rate: sluice.PerSecond(1)}
	daily = sluice.Limit{Capacity: 3, Rate: sluice.Per(3, 24*time.Hour)} // a token every 8 hours
)

func config(limits ...Limit[call]) Config[call] {
	for i := range limits {
		if limits[i].Option == "" {
			limits[i].Option = fmt.Sprintf("Options.Limits[%d]", i)
		}
		if limits[i].Key == nil {
			limits[i].Key = byUser
		}
	}
	return Config[call]{Limits: limits, Cost: costOf, ErrNoKey: errNoKey, ErrStore: errStore}
}

// newMem returns a memstore.Store on clock, closed when the test ends.
func newMem(t *testing.T, clock *sluicetest.Clock) *memstore.Store {
	t.Helper()
	mem, err := memstore.New(memstore.Options{Now: clock.Now, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	return mem
}

// plain is a sluice.Store that is not a sluice.Operator.
type plain struct{ sluice.Store }

func TestNew(t *testing.T) {
	store := newMem(t, sluicetest.NewClock(start))
	ok := sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(1)}
	limitFunc := func(call) (sluice.Limit, error) { return ok, nil }
	many := func(n int) []Limit[call] {
		ls := make([]Limit[call], n)
		for i := range ls {
			ls[i] = Limit[call]{Policy: fmt.Sprintf("p%d", i), Limit: ok}
		}
		return ls
	}
	withID := config(Limit[call]{Policy: "a", Limit: ok}, Limit[call]{Policy: "b", Limit: ok})
	withID.RequestID = func(c call) string { return c.id }
	withID.RequestIDOption = "Options.RequestIDHeader"
	tests := []struct {
		name  string
		store sluice.Store
		cfg   Config[call]
		want  error // nil: accepted
		msg   string
	}{
		{name: "one limit", store: store, cfg: config(Limit[call]{Policy: "a", Limit: ok})},
		{name: "one limit on a plain store", store: plain{store}, cfg: config(Limit[call]{Policy: "a", Limit: ok})},
		{name: "sluice.MaxParts limits", store: store, cfg: config(many(sluice.MaxParts)...)},
		{name: "LimitFunc", store: store, cfg: config(Limit[call]{Policy: "a", LimitFunc: limitFunc}, Limit[call]{Policy: "b", Limit: ok})},
		{name: "nil store", cfg: config(Limit[call]{Policy: "a", Limit: ok}), want: sluice.ErrInvalidOption},
		{name: "no limits", store: store, cfg: config(), want: sluice.ErrInvalidOption},
		{name: "too many limits", store: store, cfg: config(many(sluice.MaxParts + 1)...), want: sluice.ErrInvalidOption, msg: "17 limits, more than 16"},
		{name: "empty policy", store: store, cfg: config(Limit[call]{Policy: "a", Limit: ok}, Limit[call]{Limit: ok}), want: sluice.ErrInvalidPolicy, msg: "Options.Limits[1].Policy is empty"},
		{name: "bad policy", store: store, cfg: config(Limit[call]{Policy: "a b", Limit: ok}), want: sluice.ErrInvalidPolicy},
		{name: "same policy twice", store: store, cfg: config(Limit[call]{Policy: "a", Limit: ok}, Limit[call]{Policy: "a", Limit: burst}), want: sluice.ErrInvalidOption, msg: `Options.Limits[0] and Options.Limits[1] both have policy "a"`},
		{name: "Limit and LimitFunc", store: store, cfg: config(Limit[call]{Policy: "a", Limit: ok, LimitFunc: limitFunc}), want: sluice.ErrInvalidOption},
		{name: "no limit", store: store, cfg: config(Limit[call]{Policy: "a"}), want: sluice.ErrInvalidLimit},
		{name: "no key function", store: store, cfg: Config[call]{Limits: []Limit[call]{{Option: "Options", Policy: "a", Limit: ok}}}, want: sluice.ErrInvalidOption},
		{name: "several limits and a request ID", store: store, cfg: withID, want: sluice.ErrInvalidOption, msg: "Options.RequestIDHeader cannot be used with several limits"},
		{name: "several limits on a plain store", store: plain{store}, cfg: config(Limit[call]{Policy: "a", Limit: ok}, Limit[call]{Policy: "b", Limit: ok}), want: sluice.ErrInvalidOption, msg: "does not implement sluice.Operator"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.store, tt.cfg)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			if !errors.Is(err, tt.want) || !strings.Contains(fmt.Sprint(err), tt.msg) {
				t.Errorf("New error = %v, want %v mentioning %q", err, tt.want, tt.msg)
			}
		})
	}
}

// A burst limit and a daily quota decided together: a request the daily
// quota denies takes nothing from the burst bucket, and the wait is the
// daily quota's.
func TestDecideSeveral(t *testing.T) {
	clock := sluicetest.NewClock(start)
	store := newMem(t, clock)
	c, err := New(store, config(Limit[call]{Policy: "burst", Limit: burst}, Limit[call]{Policy: "daily", Limit: daily}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var d Decision
	for i := range 3 {
		if err := c.Decide(ctx, call{user: "u"}, &d); err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			t.Fatalf("request %d: %+v, want allowed", i, d)
		}
	}
	for i := range 10 {
		clock.Advance(time.Second)
		if err := c.Decide(ctx, call{user: "u"}, &d); err != nil {
			t.Fatal(err)
		}
		wait := 8*time.Hour - time.Duration(i+1)*time.Second
		if d.Allowed || d.Denied != 1 || d.RetryAfter != wait {
			t.Fatalf("request %d after the daily quota: allowed %v, denied %d, wait %v; want denied by 1 (daily) for %v", i, d.Allowed, d.Denied, d.RetryAfter, wait)
		}
	}
	// Nothing was taken from the burst bucket by the denials: it is full.
	p, err := store.Peek(ctx, sluice.Request{Policy: "burst", Key: "user:u", Cost: 1, Limit: burst})
	if err != nil {
		t.Fatal(err)
	}
	if p.Remaining != burst.Capacity {
		t.Errorf("burst bucket after 10 denials: %d remaining, want %d (nothing charged)", p.Remaining, burst.Capacity)
	}
	want := []sluice.Request{
		{Policy: "burst", Key: "user:u", Cost: 1, Limit: burst},
		{Policy: "daily", Key: "user:u", Cost: 1, Limit: daily},
	}
	if diff := cmp.Diff(want, d.Requests); diff != "" {
		t.Errorf("Requests (-want +got):\n%s", diff)
	}
	f := c.Fields(&d)
	wantFields := Fields{
		Policy:     `"burst";q=5;w=5, "daily";q=3;w=86400`,
		Limit:      `"burst";r=5;t=1, "daily";r=0;t=28790`,
		RetryAfter: 28790, // 8h after the third request, 10s later
	}
	if f != wantFields {
		t.Errorf("Fields = %+v, want %+v", f, wantFields)
	}
}

// One limit is one Take, with the request ID; the decision is its only
// part.
func TestDecideOne(t *testing.T) {
	clock := sluicetest.NewClock(start)
	store := newMem(t, clock)
	cfg := config(Limit[call]{Option: "Options", Policy: "api", Limit: sluice.Limit{Capacity: 1, Rate: sluice.Every(time.Minute)}})
	cfg.RequestID = func(c call) string { return c.id }
	c, err := New(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var d Decision
	for i, want := range []struct {
		id       string
		allowed  bool
		replayed bool
	}{{"a", true, false}, {"a", true, true}, {"b", false, false}} {
		if err := c.Decide(ctx, call{user: "u", id: want.id}, &d); err != nil {
			t.Fatal(err)
		}
		if d.Allowed != want.allowed || d.Parts[0].Replayed != want.replayed || len(d.Parts) != 1 || d.Requests[0].RequestID != want.id {
			t.Errorf("request %d (ID %q): %+v, want allowed %v, replayed %v", i, want.id, d, want.allowed, want.replayed)
		}
		if want.allowed && d.Denied != -1 || !want.allowed && (d.Denied != 0 || d.RetryAfter != time.Minute) {
			t.Errorf("request %d: Denied %d, RetryAfter %v", i, d.Denied, d.RetryAfter)
		}
	}
	if f, want := c.Fields(&d), (Fields{Policy: `"api";q=1;w=60`, Limit: `"api";r=0;t=60`, RetryAfter: 60}); f != want {
		t.Errorf("Fields = %+v, want %+v", f, want)
	}
}

// failing answers every call with err, or with a MultiDecision of parts
// parts.
type failing struct {
	err   error
	parts int
}

func (s failing) Take(context.Context, sluice.Request) (sluice.Decision, error) {
	return sluice.Decision{}, s.err
}

func (s failing) Peek(context.Context, sluice.Request) (sluice.Decision, error) {
	return sluice.Decision{}, s.err
}

func (s failing) TakeAll(context.Context, []sluice.Request) (sluice.MultiDecision, error) {
	return sluice.MultiDecision{Parts: make([]sluice.Decision, s.parts)}, s.err
}

func (s failing) Drain(context.Context, sluice.Request) (sluice.Decision, error) {
	return sluice.Decision{}, s.err
}

func (s failing) Refund(context.Context, sluice.Request) (sluice.Decision, error) {
	return sluice.Decision{}, s.err
}

func (s failing) Reset(context.Context, string, string) error { return s.err }

func TestDecideErrors(t *testing.T) {
	down := fmt.Errorf("%w: dial tcp 10.1.1.1:6379: connection refused", sluice.ErrUnavailable)
	keyDown := errors.New("token verifier down")
	limitDown := errors.New("plan service down")
	ok := sluice.Limit{Capacity: 2, Rate: sluice.PerSecond(1)}
	two := func(a, b Limit[call]) Config[call] { return config(a, b) }
	tests := []struct {
		name  string
		store sluice.Store
		cfg   Config[call]
		call  call
		want  []error
		class Class
		msg   string
	}{
		{name: "no key", cfg: config(Limit[call]{Policy: "a", Limit: ok}), want: []error{errNoKey}, class: BadRequest},
		{name: "empty key", cfg: two(Limit[call]{Policy: "a", Limit: ok}, Limit[call]{Policy: "b", Limit: ok, Key: func(call) (string, error) { return "", nil }}),
			call: call{user: "u"}, want: []error{errNoKey}, class: BadRequest, msg: `policy "b"`},
		{name: "key too long", cfg: config(Limit[call]{Policy: "a", Limit: ok}), call: call{user: strings.Repeat("u", sluice.MaxKeyLen)},
			want: []error{sluice.ErrInvalidKey}, class: BadRequest},
		{name: "key function fails", cfg: config(Limit[call]{Policy: "a", Limit: ok, Key: func(call) (string, error) { return "", keyDown }}),
			want: []error{keyDown}, class: Internal},
		{name: "limit function fails", cfg: config(Limit[call]{Policy: "a", LimitFunc: func(call) (sluice.Limit, error) { return sluice.Limit{}, limitDown }}),
			call: call{user: "u"}, want: []error{limitDown}, class: Internal},
		{name: "limit function's limit invalid", cfg: config(Limit[call]{Policy: "a", LimitFunc: func(call) (sluice.Limit, error) { return sluice.Limit{}, nil }}),
			call: call{user: "u"}, want: []error{sluice.ErrInvalidLimit}, class: Internal},
		{name: "cost function fails", cfg: config(Limit[call]{Policy: "a", Limit: ok}), call: call{user: "u", cost: -1}, class: Internal},
		{name: "cost above one of the limits", cfg: two(Limit[call]{Policy: "a", Limit: sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}}, Limit[call]{Policy: "b", Limit: ok}),
			call: call{user: "u", cost: 3}, want: []error{sluice.ErrInvalidCost}, class: Internal, msg: `policy "b"`},
		{name: "store down", store: failing{err: down}, cfg: config(Limit[call]{Policy: "a", Limit: ok}), call: call{user: "u"},
			want: []error{errStore, sluice.ErrUnavailable}, class: Unavailable},
		{name: "store down, several limits", store: failing{err: down}, cfg: two(Limit[call]{Policy: "a", Limit: ok}, Limit[call]{Policy: "b", Limit: ok}), call: call{user: "u"},
			want: []error{errStore, sluice.ErrUnavailable}, class: Unavailable},
		{name: "store refuses the limit", store: failing{err: fmt.Errorf("%w: too long for this store", sluice.ErrInvalidLimit)}, cfg: config(Limit[call]{Policy: "a", LimitFunc: func(call) (sluice.Limit, error) { return ok, nil }}),
			call: call{user: "u"}, want: []error{sluice.ErrInvalidLimit}, class: Internal},
		{name: "a wrapper whose store cannot take several buckets", store: failing{err: fmt.Errorf("guard: %w", errors.ErrUnsupported)}, cfg: two(Limit[call]{Policy: "a", Limit: ok}, Limit[call]{Policy: "b", Limit: ok}),
			call: call{user: "u"}, want: []error{errors.ErrUnsupported}, class: Internal},
		{name: "a store that answers too few parts", store: failing{parts: 1}, cfg: two(Limit[call]{Policy: "a", Limit: ok}, Limit[call]{Policy: "b", Limit: ok}),
			call: call{user: "u"}, want: []error{errStore}, class: Unavailable, msg: "1 parts for a multi-take of 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := tt.store
			if store == nil {
				store = newMem(t, sluicetest.NewClock(start))
			}
			c, err := New(store, tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			var d Decision
			err = c.Decide(context.Background(), tt.call, &d)
			if err == nil {
				t.Fatalf("Decide(%+v) = %+v, want an error", tt.call, d)
			}
			for _, want := range tt.want {
				if !errors.Is(err, want) {
					t.Errorf("Decide error = %v, want it to wrap %v", err, want)
				}
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("Decide error = %v, want it to mention %q", err, tt.msg)
			}
			if got := Classify(err, errNoKey, errStore); got != tt.class {
				t.Errorf("Classify(%v) = %d, want %d", err, got, tt.class)
			}
		})
	}
	if got := Classify(fmt.Errorf("%w: reused", sluice.ErrRequestIDConflict), errNoKey, errStore); got != Conflict {
		t.Errorf("Classify(ErrRequestIDConflict) = %d, want %d", got, Conflict)
	}
}

// degradedStore answers every multi-take with md.
type degradedStore struct {
	failing
	md sluice.MultiDecision
}

func (s degradedStore) TakeAll(context.Context, []sluice.Request) (sluice.MultiDecision, error) {
	return s.md, nil
}

func TestFieldsDegradedAndDynamic(t *testing.T) {
	ctx := context.Background()
	reduced := sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(1)}
	md := sluice.MultiDecision{Denied: 1, RetryAfter: 1500 * time.Millisecond, Degraded: true, Parts: []sluice.Decision{
		{Allowed: true, Degraded: true},
		{RetryAfter: 1500 * time.Millisecond, Degraded: true, Limit: reduced},
	}}
	c, err := New(degradedStore{md: md}, config(Limit[call]{Policy: "burst", Limit: burst}, Limit[call]{Policy: "daily", Limit: daily}))
	if err != nil {
		t.Fatal(err)
	}
	var d Decision
	if err := c.Decide(ctx, call{user: "u"}, &d); err != nil {
		t.Fatal(err)
	}
	if f, want := c.Fields(&d), (Fields{Policy: `"daily";q=1;w=1`, RetryAfter: 2}); f != want {
		t.Errorf("degraded: Fields = %+v, want %+v (no RateLimit; the reduced limit alone in RateLimit-Policy)", f, want)
	}

	// A limit from a LimitFunc is written as it is, every time.
	clock := sluicetest.NewClock(start)
	tier := sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(10)}
	c, err = New(newMem(t, clock), config(
		Limit[call]{Policy: "tenant", Key: byTenant, LimitFunc: func(call) (sluice.Limit, error) { return tier, nil }},
		Limit[call]{Policy: "user", Limit: burst},
	))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Decide(ctx, call{user: "u", tenant: "t", cost: 2}, &d); err != nil {
		t.Fatal(err)
	}
	want := Fields{Policy: `"tenant";q=100;w=10, "user";q=5;w=5`, Limit: `"tenant";r=98;t=1, "user";r=3;t=1`}
	if f := c.Fields(&d); f != want {
		t.Errorf("Fields = %+v, want %+v", f, want)
	}
	if d.Requests[0].Key != "tenant:t" || d.Requests[1].Key != "user:u" {
		t.Errorf("keys = %q, %q, want each limit's own", d.Requests[0].Key, d.Requests[1].Key)
	}
}

func TestFirstKey(t *testing.T) {
	failing := errors.New("verifier down")
	fail := func(call) (string, error) { return "", failing }
	tests := []struct {
		name    string
		fns     []func(call) (string, error)
		want    string
		wantErr error
	}{
		{name: "first", fns: []func(call) (string, error){byUser, byTenant}, want: "user:u"},
		{name: "second", fns: []func(call) (string, error){func(call) (string, error) { return "", errNoKey }, byTenant}, want: "tenant:t"},
		{name: "none", fns: []func(call) (string, error){func(call) (string, error) { return "", errNoKey }}, wantErr: errNoKey},
		{name: "empty", wantErr: errNoKey},
		{name: "other error stops", fns: []func(call) (string, error){fail, byUser}, wantErr: failing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := FirstKey(errNoKey, tt.fns)(call{user: "u", tenant: "t"})
			if !errors.Is(err, tt.wantErr) || got != tt.want {
				t.Errorf("FirstKey(...) = %q, %v, want %q, %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}
