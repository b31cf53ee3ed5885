package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/pgstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// TestPolicies: a bucket's identity is (policy, key). Two requests whose
// policies differ never share a bucket or a request ID, also when their
// policy and key joined would be the same bytes, and with the longest
// policy name and key.
func TestPolicies(t *testing.T) {
	clock := sluicetest.NewClock(epoch)
	s := newStore(t, pgstore.Options{Now: clock.Now})
	ctx := context.Background()
	// No refill: whatever one bucket gives is all it has.
	l := sluice.Limit{Capacity: 10, Rate: sluice.Per(0, time.Second)}
	longPolicy := strings.Repeat("p", sluice.MaxPolicyLen)
	longKey := strings.Repeat("k", sluice.MaxKeyLen)
	tests := []struct {
		name   string
		policy [2]string
		key    [2]string
	}{
		{"same key", [2]string{"api", "login"}, [2]string{"user-1", "user-1"}},
		{"separator moved", [2]string{"api", "api:x"}, [2]string{"x:y", "y"}},
		{"prefix moved", [2]string{"a", "ab"}, [2]string{"bc", "c"}},
		{"longest", [2]string{longPolicy, longPolicy[1:]}, [2]string{longKey, "p" + longKey[1:]}},
		{"binary key", [2]string{"api", "login"}, [2]string{"\x00\xff", "\x00\xff"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := sluice.Request{Policy: tt.policy[0], Key: tt.key[0], Cost: 10, Limit: l, RequestID: "same"}
			b := sluice.Request{Policy: tt.policy[1], Key: tt.key[1], Cost: 4, Limit: l, RequestID: "same"}
			if got, err := s.Take(ctx, a); err != nil || !got.Allowed || got.Remaining != 0 || got.Replayed {
				t.Fatalf("Take(%.20q/%.20q, 10) = %+v, %v; want allowed, 0 remaining", a.Policy, a.Key, got, err)
			}
			// The same request ID with another cost, under the other
			// policy: a request of its own, from a full bucket of its own.
			if got, err := s.Take(ctx, b); err != nil || !got.Allowed || got.Remaining != 6 || got.Replayed {
				t.Fatalf("Take(%.20q/%.20q, 4, same ID) = %+v, %v; want allowed, 6 remaining, not replayed", b.Policy, b.Key, got, err)
			}
			a.RequestID, b.RequestID = "", ""
			a.Cost, b.Cost = 1, 6
			if got, err := s.Take(ctx, a); err != nil || got.Allowed {
				t.Fatalf("Take(%.20q/%.20q, 1) from an empty bucket = %+v, %v; want denied", a.Policy, a.Key, got, err)
			}
			if got, err := s.Take(ctx, b); err != nil || !got.Allowed || got.Remaining != 0 {
				t.Fatalf("Take(%.20q/%.20q, 6) = %+v, %v; want allowed, 0 remaining", b.Policy, b.Key, got, err)
			}
			// A replay stays with its own policy.
			b.RequestID, b.Cost = "same", 4
			if got, err := s.Take(ctx, b); err != nil || !got.Replayed || got.Remaining != 6 {
				t.Fatalf("retry of Take(%.20q/%.20q, 4, same ID) = %+v, %v; want its replay (6 remaining)", b.Policy, b.Key, got, err)
			}
			a.RequestID, a.Cost = "same", 4
			if _, err := s.Take(ctx, a); !errors.Is(err, sluice.ErrRequestIDConflict) {
				t.Fatalf("Take(%.20q/%.20q, 4, same ID as its cost 10) = %v; want %v", a.Policy, a.Key, err, sluice.ErrRequestIDConflict)
			}
		})
	}
	// A policy that is not a valid name is refused before the database.
	for _, p := range []string{"", "a b", strings.Repeat("p", sluice.MaxPolicyLen+1)} {
		if _, err := s.Take(ctx, sluice.Request{Policy: p, Key: "k", Cost: 1, Limit: l}); !errors.Is(err, sluice.ErrInvalidPolicy) {
			t.Errorf("Take with policy %q = %v; want %v", p, err, sluice.ErrInvalidPolicy)
		}
		if _, err := s.Peek(ctx, sluice.Request{Policy: p, Key: "k", Cost: 1, Limit: l}); !errors.Is(err, sluice.ErrInvalidPolicy) {
			t.Errorf("Peek with policy %q = %v; want %v", p, err, sluice.ErrInvalidPolicy)
		}
	}
}
