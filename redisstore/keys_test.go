package redisstore

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestKeyLayout: a bucket's key encodes (policy, key) one to one, so no
// two pairs share a bucket or a record key; the hash tag comes from the
// caller's key alone (braces in it cannot choose the tag), so every policy
// of one key, and a bucket and its records, share it, and distinct keys
// do not.
func TestKeyLayout(t *testing.T) {
	s, err := New(offline(t), Options{Prefix: "p:"})
	if err != nil {
		t.Fatal(err)
	}
	tag := func(k string) string {
		_, rest, _ := strings.Cut(k, "{")
		tag, _, _ := strings.Cut(rest, "}")
		return tag
	}
	tests := []struct {
		policy, key, id string
	}{
		{"api", "user", ""}, {"api", "{user}", ""}, {"{api}", "user", ""}, {"a}", "{b}c", "x"}, {"api", "}{", "{}"},
		{"api", "\x00\xff", "\n"}, {"api", "x:y", "r"}, {"api:x", "y", "r"}, {"ab", "c", "r"}, {"a", "bc", "r"},
		{"1", "2:ab", ""}, {"12", ":ab", ""},
		{strings.Repeat("p", sluice.MaxPolicyLen), strings.Repeat("k", sluice.MaxKeyLen), "r"},
	}
	buckets := map[string][2]string{}
	records := map[string][3]string{}
	tags := map[string]string{} // tag → key
	for _, tt := range tests {
		b := s.bucketKey(tt.policy, tt.key)
		if want := fmt.Sprintf("p:{%s}b:%d:%s%s", tag(b), len(tt.policy), tt.policy, tt.key); b != want || len(tag(b)) != 16 {
			t.Errorf("bucketKey(%q, %q) = %q, want %q with a 16-digit tag", tt.policy, tt.key, b, want)
		}
		r := s.recordKey(tt.policy, tt.key, tt.id)
		if want := fmt.Sprintf("p:{%s}r:%d:%s%d:%s%s", tag(b), len(tt.policy), tt.policy, len(tt.key), tt.key, tt.id); r != want {
			t.Errorf("recordKey(%q, %q, %q) = %q, want %q (the bucket's tag)", tt.policy, tt.key, tt.id, r, want)
		}
		if other, ok := buckets[b]; ok {
			t.Errorf("pairs %q and %q share the bucket key %q", other, [2]string{tt.policy, tt.key}, b)
		}
		if other, ok := records[r]; ok {
			t.Errorf("requests %q and %q share the record key %q", other, [3]string{tt.policy, tt.key, tt.id}, r)
		}
		if other, ok := tags[tag(b)]; ok && other != tt.key {
			t.Errorf("keys %q and %q share the tag %q", other, tt.key, tag(b))
		}
		if other := s.bucketKey("other", tt.key); tag(other) != tag(b) {
			t.Errorf("bucketKey(%q, %q) has tag %q, bucketKey(%q, %q) %q; want one tag for every policy of a key", tt.policy, tt.key, tag(b), "other", tt.key, tag(other))
		}
		buckets[b], records[r], tags[tag(b)] = [2]string{tt.policy, tt.key}, [3]string{tt.policy, tt.key, tt.id}, tt.key
	}
	if a, b := s.recordKey("p", "ab", "c"), s.recordKey("p", "a", "bc"); a == b {
		t.Errorf("recordKey(%q, %q, %q) = recordKey(%q, %q, %q) = %q", "p", "ab", "c", "p", "a", "bc", a)
	}
}

// TestClusterSlots: on the cluster, the buckets and records of every
// policy of one key hash to one slot, whatever braces the policy and the
// key hold, and clusterSlot computes that slot as the server does; 1,000
// keys with the same braced text spread over the slots.
func TestClusterSlots(t *testing.T) {
	if testing.Short() {
		t.Skip("the cluster is not started in -short mode")
	}
	c := redistest.ClusterClient(t)
	ctx := t.Context()
	s := newStore(t, c, Options{})
	slots := map[int64]bool{}
	for i := range 1000 {
		key := fmt.Sprintf("{user}%d", i)
		if i%2 == 1 {
			key = fmt.Sprintf("x}{%d", i)
		}
		var slot int64 = -1
		for _, k := range []string{s.bucketKey("{p}", key), s.bucketKey(fmt.Sprintf("{p}%d}", i), key), s.recordKey("{p}", key, "{id}"), s.recordKey("q", key, "")} {
			got, err := c.ClusterKeySlot(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			if slot >= 0 && got != slot {
				t.Fatalf("key %q: %q is in slot %d, another key of it in %d; want one slot", key, k, got, slot)
			}
			slot = got
		}
		if got := clusterSlot(key); int64(got) != slot {
			t.Fatalf("clusterSlot(%q) = %d, the server says %d", key, got, slot)
		}
		slots[slot] = true
	}
	// 1,000 keys over 16,384 slots: about 970 distinct slots expected.
	if len(slots) < 900 {
		t.Errorf("1,000 keys sharing the text {user} hash to %d slots, want about 970", len(slots))
	}
}

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
