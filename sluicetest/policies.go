package sluicetest

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// testPolicies: two policies never share a bucket or a request ID, whatever
// their keys, and the stored identity of (policy, key) has no collisions.
func (s Suite) testPolicies(t *testing.T) {
	r := s.newRig(t, sluice.KeepTokens, time.Hour)

	// A burst limit and a daily quota on one key, one request a second for
	// a minute: each is decided on its own bucket, so the daily quota
	// allows exactly its 20 (with a shared bucket, each call would convert
	// the other's bucket and the quota would allow more).
	burst := sluice.Limit{Capacity: 5, Rate: sluice.PerSecond(5)}
	daily := sluice.Limit{Capacity: 20, Rate: sluice.Per(20, 24*time.Hour)}
	var burstAllowed, dailyAllowed int
	for i := range 60 {
		r.set(r.ticks(time.Duration(i) * time.Second))
		if d, err := r.take(t, sluice.Request{Policy: "burst", Key: "user-1", Cost: 1, Limit: burst}); err == nil && d.Allowed {
			burstAllowed++
		}
		if d, err := r.take(t, sluice.Request{Policy: "daily", Key: "user-1", Cost: 1, Limit: daily}); err == nil && d.Allowed {
			dailyAllowed++
		}
	}
	if burstAllowed != 60 || dailyAllowed != 20 {
		t.Fatalf("one take a second for 60s on one key: policy %q (%v) allowed %d, policy %q (%v) allowed %d; want 60 and 20",
			"burst", burst, burstAllowed, "daily", daily, dailyAllowed)
	}

	// Pairs whose concatenations collide in a naive encoding: each is a
	// bucket of its own.
	once := sluice.Limit{Capacity: 1, Rate: sluice.Per(0, time.Second)}
	pairs := []struct{ policy, key string }{
		{"api", "x:y"}, {"api:x", "y"},
		{"ab", "c"}, {"a", "bc"},
		{"a", "b\x00c"}, {"a", "b"},
		{"x{y}", "z"}, {"x", "{y}z"},
		{strings.Repeat("p", sluice.MaxPolicyLen), strings.Repeat("k", sluice.MaxKeyLen)},
		{"p", strings.Repeat("k", sluice.MaxKeyLen)},
	}
	for _, p := range pairs {
		r.mustTake(t, sluice.Request{Policy: p.policy, Key: p.key, Cost: 1, Limit: once}, allow(0, sluice.Never, once))
	}
	for _, p := range pairs {
		r.mustTake(t, sluice.Request{Policy: p.policy, Key: p.key, Cost: 1, Limit: once}, deny(0, sluice.Never, sluice.Never, once))
	}

	// A request ID is scoped by policy: the same key and ID under another
	// policy is a request of its own.
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
	first := allow(8, 2*time.Second, l)
	r.mustTake(t, sluice.Request{Policy: "p1", Key: "k", Cost: 2, Limit: l, RequestID: "id"}, first)
	r.mustTake(t, sluice.Request{Policy: "p2", Key: "k", Cost: 2, Limit: l, RequestID: "id"}, first)
	r.mustTake(t, sluice.Request{Policy: "p1", Key: "k", Cost: 2, Limit: l, RequestID: "id"}, replayed(first))
	r.mustPeekReq(t, sluice.Request{Policy: "p2", Key: "k", Cost: 9, Limit: l}, deny(8, time.Second, 2*time.Second, l))
}
