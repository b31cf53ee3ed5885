package memstore

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// testHash returns a store's hash of entries, and planRefs for policies.
func testHash() (func(*entry) uint64, func(policy string) *planRef) {
	s := &Store{seed: maphash.MakeSeed(), policySeed: maphash.MakeSeed(), policyKeys: [2]uint64{rand.Uint64(), rand.Uint64()}}
	refs := map[string]*planRef{}
	ref := func(policy string) *planRef {
		if refs[policy] == nil {
			refs[policy] = &planRef{policy: makePolicyName(policy)}
		}
		return refs[policy]
	}
	return s.rehash, ref
}

type identity struct{ policy, key string }

// TestTableAgainstMap drives a table and a Go map with the same random
// inserts and removals and checks after each step that every bucket is
// found at the entry that holds it and no removed bucket is found.
func TestTableAgainstMap(t *testing.T) {
	policies := []string{"a", "ab", "api", "api:x", "policy-9", "policy-10-long", "policy-11-long"}
	for _, shardBits := range []uint{0, 4, 8} {
		t.Run(fmt.Sprint("shardBits=", shardBits), func(t *testing.T) {
			hash, ref := testHash()
			rng := rand.New(rand.NewPCG(1, uint64(shardBits)))
			var tb table
			want := map[identity]int64{}
			for step := range 20_000 {
				id := identity{policies[rng.IntN(len(policies))], fmt.Sprint("b", rng.IntN(500))}
				e := entry{key: ownKeyRef(id.key), plan: ref(id.policy)}
				e.state.Stamp = int64(step)
				tg := tag(hash(&e), shardBits)
				idx, _ := tb.find(e.plan.policy, id.key, tg)
				_, present := want[id]
				if (idx >= 0) != present {
					t.Fatalf("step %d: find(%q, %q) = %d, present in map %v", step, id.policy, id.key, idx, present)
				}
				// Grow for two thirds of the run, then mostly shrink.
				insert := rng.IntN(3) < 2 == (step < 13_000)
				switch {
				case !present && insert:
					tb.insert(tg, e, shardBits, hash)
					want[id] = int64(step)
				case present && !insert:
					tb.remove(idx, tg, shardBits, hash)
					delete(want, id)
				}
				if len(tb.entries) != len(want) {
					t.Fatalf("step %d: %d entries, want %d", step, len(tb.entries), len(want))
				}
				if step%997 == 0 || step == 19_999 {
					checkTable(t, &tb, want, shardBits, hash, ref)
				}
			}
			if len(tb.slots) > 64 && len(tb.entries)*8 < len(tb.slots) {
				t.Errorf("%d slots for %d entries after shrinking, want at most 8 per entry", len(tb.slots), len(tb.entries))
			}
		})
	}
}

func checkTable(t *testing.T, tb *table, want map[identity]int64, shardBits uint, hash func(*entry) uint64, ref func(string) *planRef) {
	t.Helper()
	used := 0
	for _, sv := range tb.slots {
		if sv != 0 {
			used++
		}
	}
	if used != len(tb.entries) || used*4 > len(tb.slots)*3 {
		t.Fatalf("%d used slots of %d for %d entries", used, len(tb.slots), len(tb.entries))
	}
	for id, stamp := range want {
		e := entry{key: ownKeyRef(id.key), plan: ref(id.policy)}
		idx, _ := tb.find(e.plan.policy, id.key, tag(hash(&e), shardBits))
		if idx < 0 || tb.entries[idx].key.String() != id.key || tb.entries[idx].plan.policy.name != id.policy || tb.entries[idx].state.Stamp != stamp {
			t.Fatalf("find(%q, %q) = %d, want the entry with stamp %d", id.policy, id.key, idx, stamp)
		}
	}
}

func TestTableOldest(t *testing.T) {
	var tb table
	if got := tb.oldest(8, nil); got != -1 {
		t.Fatalf("oldest of an empty table = %d, want -1", got)
	}
	hash, ref := testHash()
	for i := range 4 {
		e := entry{key: ownKeyRef(fmt.Sprint(i)), plan: ref("test")}
		e.state.Stamp = int64(10 - i)
		tb.insert(tag(hash(&e), 0), e, 0, hash)
	}
	// A sample of 64 among 4 entries sees the oldest with near certainty
	// (probability of missing it (3/4)^64 < 1e-7).
	if got := tb.oldest(64, nil); tb.entries[got].state.Stamp != 7 {
		t.Fatalf("oldest(64) = entry with stamp %d, want 7", tb.entries[got].state.Stamp)
	}
}

// A policy name's word packs its first 8 bytes exactly, and policyName.is tells every
// pair of names apart, including names whose first 8 bytes agree and
// (invalid) names that differ only by a zero byte.
func TestPolicyNames(t *testing.T) {
	names := []string{"a", "b", "ab", "ba", "abc", "abcd", "abcde", "abcdef", "abcdefg", "abcdefgh",
		"abcdefghi", "abcdefghj", "abcdefgh-1", "abcdefgh-2", "x-abcdefgh", "a\x00", "\x00a", "a\x00\x00\x00\x00",
		strings.Repeat("p", 64), strings.Repeat("p", 63) + "q"}
	for _, n := range names {
		var want uint64
		for i := 0; i < len(n) && i < 8; i++ {
			want |= uint64(n[i]) << (8 * i)
		}
		if got := makePolicyName(n).word; got != want {
			t.Errorf("makePolicyName(%q).word = %#x, want %#x", n, got, want)
		}
	}
	for i, a := range names {
		for j, b := range names {
			if got := makePolicyName(a).is(makePolicyName(b)); got != (i == j) {
				t.Errorf("makePolicyName(%q).is(%q) = %v, want %v", a, b, got, i == j)
			}
		}
	}
}

// An entry is (policy, key): moving bytes between the two makes another
// identity.
func TestEntryIdentity(t *testing.T) {
	ids := []identity{{"api", "x:y"}, {"api:x", "y"}, {"a", "bc"}, {"ab", "c"}, {"p", "\x00"}, {"p\x00", ""}}
	_, ref := testHash()
	for i, a := range ids {
		e := entry{key: ownKeyRef(a.key), plan: ref(a.policy)}
		for j, b := range ids {
			if k := makeKeyRef(b.key); e.is(makePolicyName(b.policy), &k) != (i == j) {
				got := !(i == j)
				t.Errorf("entry of %q is %q = %v, want %v", a, b, got, i == j)
			}
		}
	}
}

// The hot path in takeFields hashes names of 4 to 8 bytes written out;
// everything else (Peek, rehash when a table grows, sweeps) uses
// Store.hash. They must agree for every name length, or a bucket taken on
// the hot path would be invisible to the rest.
func TestHotPathHash(t *testing.T) {
	s, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	for n := 1; n <= 64; n++ {
		policy := strings.Repeat("p", n-1) + "q"
		for k := 0; k < 200; k++ { // enough to grow each table several times
			// Keys of 6 to 44 bytes: inline and not (see inlineKey).
			key := fmt.Sprintf("key-%d", k) + strings.Repeat("x", k%39)
			p, h := s.identify(policy, key)
			if got := s.hash(p, key); got != h {
				t.Fatalf("identify and hash disagree for %q", policy)
			}
			l := sluice.Limit{Capacity: 2, Rate: sluice.Per(1, time.Hour)}
			if d, err := s.Take(context.Background(), sluice.Request{Policy: policy, Key: key, Cost: 2, Limit: l}); err != nil || !d.Allowed {
				t.Fatalf("first take of %q %q = %+v, %v", policy, key, d, err)
			}
			// A second take goes through the hot path (existing bucket, same
			// limit); the peek and the table's growth use Store.hash.
			if d, err := s.Take(context.Background(), sluice.Request{Policy: policy, Key: key, Cost: 1, Limit: l}); err != nil || d.Allowed {
				t.Fatalf("hot-path take of %q %q on an empty bucket = %+v, %v", policy, key, d, err)
			}
		}
		for k := 0; k < 200; k++ {
			key := fmt.Sprintf("key-%d", k) + strings.Repeat("x", k%39)
			l := sluice.Limit{Capacity: 2, Rate: sluice.Per(1, time.Hour)}
			if d, err := s.Peek(context.Background(), sluice.Request{Policy: policy, Key: key, Cost: 1, Limit: l}); err != nil || d.Allowed {
				t.Fatalf("peek of %q %q after the table grew = %+v, %v; the bucket was lost", policy, key, d, err)
			}
		}
	}
}

// oldest never returns a pinned entry: it skips them in its sample, and
// when the sample held only pinned entries it takes the first other one.
func TestTableOldestSkipsPinned(t *testing.T) {
	var tb table
	hash, ref := testHash()
	var pins []pin
	for i := range 40 {
		e := entry{key: ownKeyRef(fmt.Sprint(i)), plan: ref("test")}
		e.state.Stamp = int64(i)
		tb.insert(tag(hash(&e), 0), e, 0, hash)
		if i != 25 {
			pins = append(pins, pin{policy: e.plan.policy, key: e.key.String()})
		}
	}
	for range 100 {
		if got := tb.oldest(2, pins); got < 0 || tb.entries[got].key.String() != "25" {
			t.Fatalf("oldest(2) with all but entry 25 pinned = %d, want entry 25", got)
		}
	}
	if got := tb.oldest(8, append(pins, pin{policy: pins[0].policy, key: "25"})); got != -1 {
		t.Fatalf("oldest(8) with every entry pinned = %d, want -1", got)
	}
}
