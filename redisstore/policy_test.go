package redisstore

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// TestPolicyBucketsApart: a bucket is (policy, key). The same key under
// two policies is two buckets with request IDs of their own, and no policy
// and key run together into another pair's bucket ("api" + "x:y" against
// "api:x" + "y"), whatever braces or bytes they hold, up to the longest
// policy with the longest key.
func TestPolicyBucketsApart(t *testing.T) {
	pairs := [][2]string{
		{"api", "k"}, {"login", "k"},
		{"api", "x:y"}, {"api:x", "y"},
		{"ab", "c"}, {"a", "bc"},
		{"1", "2:ab"}, {"12", ":ab"}, {"1:2", "ab"},
		{"{t}", "k"}, {"t", "{t}k"}, {"a}", "{b"}, {"a", "}{b"},
		{"p", "\x00\xff"}, {"p\x7e", "\x00"},
		{strings.Repeat("p", sluice.MaxPolicyLen), strings.Repeat("k", sluice.MaxKeyLen)},
	}
	l := sluice.Limit{Capacity: 2, Rate: sluice.Per(1, time.Hour)}
	for name, c := range topologies(t) {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			s := newStore(t, c, Options{})
			for round, want := range []sluice.Decision{
				{Allowed: true, Remaining: 0, ResetAfter: 2 * time.Hour, Limit: l},
				{Allowed: false, Remaining: 0, RetryAfter: time.Hour, ResetAfter: 2 * time.Hour, Limit: l},
			} {
				for _, p := range pairs {
					r := sluice.Request{Policy: p[0], Key: p[1], Cost: 2, Limit: l}
					d, err := s.Take(ctx, r)
					if err != nil {
						t.Fatalf("round %d: Take(%q, %q) = %v", round, p[0], p[1], err)
					}
					// Redis TIME moves on between the takes: the waits of
					// a denial are up to a second shorter.
					if d.Allowed != want.Allowed || d.Remaining != want.Remaining || d.ResetAfter > want.ResetAfter || d.ResetAfter < want.ResetAfter-time.Second {
						t.Errorf("round %d: Take(%q, %q) = %+v, want %+v", round, p[0], p[1], d, want)
					}
				}
			}
			// A request ID is the policy's own: the same key and ID under
			// another policy is another request.
			for _, policy := range []string{"id-a", "id-b"} {
				r := sluice.Request{Policy: policy, Key: "k", Cost: 1, Limit: l, RequestID: "r"}
				if d, err := s.Take(ctx, r); err != nil || !d.Allowed || d.Replayed {
					t.Errorf("Take(%q, %q, ID %q) = %+v, %v; want allowed, not replayed", policy, "k", "r", d, err)
				}
			}
		})
	}
}

// TestDeniedRequestIDDecidesAfresh: a denial is not remembered under its
// request ID (no record is written), so a retry with the ID decides again,
// and once allowed it is remembered and replayed.
func TestDeniedRequestIDDecidesAfresh(t *testing.T) {
	l := sluice.Limit{Capacity: 1, Rate: sluice.Per(1, time.Minute)}
	for name, c := range topologies(t) {
		for _, batch := range batchModes {
			t.Run(fmt.Sprintf("%s/batch=%d", name, batch), func(t *testing.T) {
				ctx := t.Context()
				at := micros(1_000_000)
				s := newStore(t, c, Options{Now: func() time.Time { return at }, MinTTL: time.Hour, Batch: batch})
				take := func(id string) sluice.Decision {
					t.Helper()
					d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: l, RequestID: id})
					if err != nil {
						t.Fatalf("Take(ID %q) = %v", id, err)
					}
					return d
				}
				if d := take(""); !d.Allowed {
					t.Fatalf("first Take = %+v, want allowed", d)
				}
				for i := range 2 {
					if d := take("r"); d.Allowed || d.Replayed || d.RetryAfter != time.Minute {
						t.Fatalf("Take %d with ID %q of an empty bucket = %+v; want denied afresh (not replayed), retry after 1m", i+1, "r", d)
					}
				}
				if keys, err := scanKeys(ctx, c, s.prefix); err != nil || len(keys) != 1 {
					t.Errorf("keys after the denials %q, %v; want the bucket's alone (no record of a denial)", keys, err)
				}
				at = at.Add(time.Minute)
				if d := take("r"); !d.Allowed || d.Replayed {
					t.Fatalf("Take with ID %q a minute later = %+v; want allowed, not replayed", "r", d)
				}
				if d := take("r"); !d.Allowed || !d.Replayed {
					t.Fatalf("retry of the allowed Take with ID %q = %+v; want its replay", "r", d)
				}
				other := sluice.Limit{Capacity: 2, Rate: l.Rate}
				if d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: other, RequestID: "r"}); !errors.Is(err, sluice.ErrRequestIDConflict) {
					t.Fatalf("Take with ID %q under another limit = %+v, %v; want %v", "r", d, err, sluice.ErrRequestIDConflict)
				}
			})
		}
	}
}

// TestLimiterRefusesLimitRedisCannotDecide: a limit valid in the model but
// beyond Lua's exact integers fails when a Limiter is built over the
// store (sluice.CheckLimit asks the store), not on every request.
func TestLimiterRefusesLimitRedisCannotDecide(t *testing.T) {
	s, err := New(offline(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := sluice.ParseLimit("143 1/366d")
	if err != nil {
		t.Fatal(err)
	}
	if lim, err := sluice.NewLimiter(s, "api", l); !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Errorf("sluice.NewLimiter(redisstore, %q, %v) = %v, %v; want an error wrapping %v", "api", l, lim, err, sluice.ErrInvalidLimit)
	}
	if err := sluice.CheckLimit(s, l); !errors.Is(err, sluice.ErrInvalidLimit) || !strings.Contains(err.Error(), "2^52") {
		t.Errorf("sluice.CheckLimit(redisstore, %v) = %v; want an error wrapping %v naming the bound", l, err, sluice.ErrInvalidLimit)
	}
	ok := sluice.Limit{Capacity: 142, Rate: l.Rate}
	if _, err := sluice.NewLimiter(s, "api", ok); err != nil {
		t.Errorf("sluice.NewLimiter(redisstore, %q, %v) = %v; want a limiter", "api", ok, err)
	}
}
