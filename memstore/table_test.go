package memstore

import (
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"strings"
	"testing"
)

// nameHash returns a hash of bucket names like the store's.
func nameHash() func(string) uint64 {
	s := &Store{seed: maphash.MakeSeed(), policySeed: maphash.MakeSeed()}
	return s.rehash
}

// TestTableAgainstMap drives a table and a Go map with the same random
// inserts and removals and checks after each step that every name is found
// at the entry that holds it and no removed name is found.
func TestTableAgainstMap(t *testing.T) {
	policies := []string{"a", "ab", "api", "api:x"}
	for _, shardBits := range []uint{0, 4, 8} {
		t.Run(fmt.Sprint("shardBits=", shardBits), func(t *testing.T) {
			hash := nameHash()
			rng := rand.New(rand.NewPCG(1, uint64(shardBits)))
			var tb table
			want := map[string]int64{}
			for step := range 20_000 {
				policy := policies[rng.IntN(len(policies))]
				key := fmt.Sprint("b", rng.IntN(750))
				k := makeName(policy, key)
				tg := tag(hash(k), shardBits)
				idx, _ := tb.find(policy, key, tg)
				_, present := want[k]
				if (idx >= 0) != present {
					t.Fatalf("step %d: find(%q) = %d, present in map %v", step, k, idx, present)
				}
				// Grow for two thirds of the run, then mostly shrink.
				insert := rng.IntN(3) < 2 == (step < 13_000)
				switch {
				case !present && insert:
					e := entry{name: k}
					e.state.Stamp = int64(step)
					tb.insert(tg, e, shardBits, hash)
					want[k] = int64(step)
				case present && !insert:
					tb.remove(idx, tg, shardBits, hash)
					delete(want, k)
				}
				if len(tb.entries) != len(want) {
					t.Fatalf("step %d: %d entries, want %d", step, len(tb.entries), len(want))
				}
				if step%997 == 0 || step == 19_999 {
					checkTable(t, &tb, want, shardBits, hash)
				}
			}
			if len(tb.slots) > 64 && len(tb.entries)*8 < len(tb.slots) {
				t.Errorf("%d slots for %d entries after shrinking, want at most 8 per entry", len(tb.slots), len(tb.entries))
			}
		})
	}
}

func checkTable(t *testing.T, tb *table, want map[string]int64, shardBits uint, hash func(string) uint64) {
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
	for k, stamp := range want {
		policy, key := splitName(k)
		idx, _ := tb.find(policy, key, tag(hash(k), shardBits))
		if idx < 0 || tb.entries[idx].name != k || tb.entries[idx].state.Stamp != stamp {
			t.Fatalf("find(%q) = %d, want the entry with stamp %d", k, idx, stamp)
		}
	}
}

func TestTableOldest(t *testing.T) {
	var tb table
	if got := tb.oldest(8); got != -1 {
		t.Fatalf("oldest of an empty table = %d, want -1", got)
	}
	hash := nameHash()
	for i := range 4 {
		e := entry{name: makeName("test", fmt.Sprint(i))}
		e.state.Stamp = int64(10 - i)
		tb.insert(tag(hash(e.name), 0), e, 0, hash)
	}
	// A sample of 64 among 4 entries sees the oldest with near certainty
	// (probability of missing it (3/4)^64 < 1e-7).
	if got := tb.oldest(64); tb.entries[got].state.Stamp != 7 {
		t.Fatalf("oldest(64) = entry with stamp %d, want 7", tb.entries[got].state.Stamp)
	}
}

// Names encode (policy, key) without collisions, and split back.
func TestNames(t *testing.T) {
	tests := []struct{ policy, key string }{
		{"api", "x:y"}, {"api:x", "y"}, {"a", "bc"}, {"ab", "c"},
		{"p", "\x00"}, {"p", "\x01p"}, {strings.Repeat("p", 64), strings.Repeat("k", 512)},
	}
	seen := map[string]int{}
	for i, tt := range tests {
		n := makeName(tt.policy, tt.key)
		if j, ok := seen[n]; ok {
			t.Fatalf("makeName(%q, %q) = makeName(%q, %q) = %q", tt.policy, tt.key, tests[j].policy, tests[j].key, n)
		}
		seen[n] = i
		if p, k := splitName(n); p != tt.policy || k != tt.key {
			t.Fatalf("splitName(makeName(%q, %q)) = %q, %q", tt.policy, tt.key, p, k)
		}
		e := entry{name: n}
		for j, other := range tests {
			if got := e.is(other.policy, other.key); got != (i == j) {
				t.Fatalf("entry of (%q, %q) is (%q, %q) = %v, want %v", tt.policy, tt.key, other.policy, other.key, got, i == j)
			}
		}
	}
}
