package memstore_test

import (
	"context"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
)

// A bucket belongs to (policy, key): two policies never share one, and no
// pair of policy and key is mistaken for another whose bytes run together
// the same way.
func TestPoliciesKeepBucketsApart(t *testing.T) {
	long := strings.Repeat("k", sluice.MaxKeyLen)
	longPolicy := strings.Repeat("p", sluice.MaxPolicyLen)
	tests := []struct {
		name     string
		policy1  string
		key1     string
		policy2  string
		key2     string
		wantSame bool
	}{
		{"same policy and key", "api", "user-1", "api", "user-1", true},
		{"two policies, one key", "api", "user-1", "login", "user-1", false},
		{"separator moved across", "api", "x:y", "api:x", "y", false},
		{"byte moved across", "ab", "c", "a", "bc", false},
		{"slash moved across", "api/v1", "k", "api", "v1/k", false},
		{"policy is a prefix of the key", "a", "a", "aa", "a", false},
		{"longest policy and key", longPolicy, long, longPolicy, long, true},
		{"longest key under two policies", longPolicy, long, "api", long, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStore(t, memstore.Options{Now: newClock().Now, SweepInterval: -1})
			ctx := context.Background()
			first := sluice.Request{Policy: tt.policy1, Key: tt.key1, Cost: 10, Limit: perSecond10}
			if d, err := s.Take(ctx, first); err != nil || !d.Allowed {
				t.Fatalf("Take(%q, %q) = %+v, %v; want allowed", tt.policy1, tt.key1, d, err)
			}
			// The second request sees the drained bucket only if it is the
			// same one.
			second := sluice.Request{Policy: tt.policy2, Key: tt.key2, Cost: 1, Limit: perSecond10}
			d, err := s.Take(ctx, second)
			if err != nil {
				t.Fatalf("Take(%q, %q) error %v", tt.policy2, tt.key2, err)
			}
			if got := !d.Allowed; got != tt.wantSame {
				t.Fatalf("Take(%q, %q) after draining (%q, %q) = %+v; shares the bucket: %v, want %v",
					tt.policy2, tt.key2, tt.policy1, tt.key1, d, got, tt.wantSame)
			}
			wantBuckets := int64(2)
			if tt.wantSame {
				wantBuckets = 1
			}
			if st := s.Stats(); st.Buckets != wantBuckets {
				t.Fatalf("Stats().Buckets = %d, want %d", st.Buckets, wantBuckets)
			}
		})
	}
}

// The caller's key may be MaxKeyLen bytes under any policy: the policy does
// not eat into it. One byte more is refused.
func TestMaxKeyLenBoundsTheKeyAlone(t *testing.T) {
	s := newStore(t, memstore.Options{SweepInterval: -1})
	ctx := context.Background()
	policy := strings.Repeat("p", sluice.MaxPolicyLen)
	r := sluice.Request{Policy: policy, Key: strings.Repeat("k", sluice.MaxKeyLen), Cost: 1, Limit: perSecond10}
	if d, err := s.Take(ctx, r); err != nil || !d.Allowed {
		t.Fatalf("Take(%d-byte policy, %d-byte key) = %+v, %v; want allowed", len(r.Policy), len(r.Key), d, err)
	}
	if d, err := s.Peek(ctx, r); err != nil || d.Remaining != 9 {
		t.Fatalf("Peek(%d-byte policy, %d-byte key) = %+v, %v; want 9 remaining", len(r.Policy), len(r.Key), d, err)
	}
	r.Key += "k"
	if _, err := s.Take(ctx, r); !sluice.IsInvalid(err) {
		t.Fatalf("Take(%d-byte key) error %v, want ErrInvalidKey", len(r.Key), err)
	}
}

// A request ID is scoped by policy as well as key: the same ID under another
// policy is another request.
func TestRequestIDScopedByPolicy(t *testing.T) {
	s := newStore(t, memstore.Options{Now: newClock().Now, SweepInterval: -1})
	ctx := context.Background()
	r := sluice.Request{Policy: "api", Key: "user-1", Cost: 3, Limit: perSecond10, RequestID: "req-1"}
	if d, err := s.Take(ctx, r); err != nil || !d.Allowed || d.Replayed {
		t.Fatalf("Take(%+v) = %+v, %v; want a fresh allowed decision", r, d, err)
	}
	other := r
	other.Policy = "export"
	other.Cost = 5 // the same ID with another cost would conflict under one policy
	d, err := s.Take(ctx, other)
	if err != nil || !d.Allowed || d.Replayed || d.Remaining != 5 {
		t.Fatalf("Take(%+v) = %+v, %v; want a fresh allowed decision with 5 remaining", other, d, err)
	}
}

// The hot path (an existing bucket, the same limit, no request ID) does not
// allocate, whichever policy.
func TestTakeHotPathDoesNotAllocate(t *testing.T) {
	s := newStore(t, memstore.Options{SweepInterval: -1})
	ctx := context.Background()
	requests := []sluice.Request{
		{Policy: "api", Key: "user-1", Cost: 1, Limit: benchLimit},
		{Policy: "login", Key: "user-1", Cost: 1, Limit: benchLimit},
		{Policy: strings.Repeat("p", sluice.MaxPolicyLen), Key: strings.Repeat("k", sluice.MaxKeyLen), Cost: 1, Limit: benchLimit},
	}
	for _, r := range requests {
		if _, err := s.Take(ctx, r); err != nil {
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(100, func() {
			if _, err := s.Take(ctx, r); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("Take(policy %d bytes, key %d bytes) allocates %v times per call, want 0", len(r.Policy), len(r.Key), allocs)
		}
	}
}
