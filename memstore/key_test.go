package memstore

import (
	"fmt"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// TestKeyRef: a key made a keyRef, inline (up to 16 bytes) or not, gives
// back its bytes and its hash, and two keyRefs are equal exactly when
// their keys are, NUL bytes and lengths included.
func TestKeyRef(t *testing.T) {
	s, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Keys that differ only in trailing NULs or in length around the
	// inline bound.
	var fixed []string
	for n := range 2*inlineKey + 2 {
		fixed = append(fixed, strings.Repeat("\x00", n), strings.Repeat("k", n), strings.Repeat("\xff", n))
	}
	check := func(t interface{ Fatalf(string, ...any) }, a, b string) {
		ka, kb := makeKeyRef(a), ownKeyRef(b)
		if got := ka.String(); got != a {
			t.Fatalf("makeKeyRef(%q).String() = %q", a, got)
		}
		if got := kb.String(); got != b {
			t.Fatalf("ownKeyRef(%q).String() = %q", b, got)
		}
		if ha, hb := s.keyHash(&ka), s.keyHash(&kb); a == b && ha != hb {
			t.Fatalf("the hashes of %q made by makeKeyRef and ownKeyRef differ: %x, %x", a, ha, hb)
		}
		if got := ka.equal(&kb); got != (a == b) {
			t.Fatalf("makeKeyRef(%q) equal ownKeyRef(%q) = %v, want %v", a, b, got, a == b)
		}
	}
	for _, a := range fixed {
		for _, b := range fixed {
			check(t, a, b)
		}
	}
	rapid.Check(t, func(rt *rapid.T) {
		raw := rapid.SliceOfN(rapid.Byte(), 0, 3*inlineKey).Draw(rt, "key")
		other := rapid.SliceOfN(rapid.Byte(), 0, 3*inlineKey).Draw(rt, "other")
		if rapid.Bool().Draw(rt, "same") {
			other = raw
		}
		check(rt, string(raw), string(other))
	})
}

// TestOwnKeyRefCopies: an entry's long key does not share the caller's
// bytes, and an inline one allocates nothing.
func TestOwnKeyRefCopies(t *testing.T) {
	b := []byte(strings.Repeat("x", inlineKey+1))
	k := ownKeyRef(string(b))
	b[0] = 'y'
	if got := k.String(); got != strings.Repeat("x", inlineKey+1) {
		t.Fatalf("after the caller changed its bytes, the key is %q", got)
	}
	key := strings.Repeat("z", inlineKey)
	if n := testing.AllocsPerRun(100, func() { k = ownKeyRef(key) }); n != 0 {
		t.Fatalf("ownKeyRef of a %d-byte key allocates %v times, want 0", inlineKey, n)
	}
}

// TestInlineKeyHash: the keyed hash of short keys spreads keys that differ
// in one byte, in their length only (trailing NULs) or in their order
// over the whole 64 bits: no two of 300,000 such keys collide, and the
// table's bits (tag and shard) of sequential keys are as often 0 as 1.
func TestInlineKeyHash(t *testing.T) {
	s, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	seen := make(map[uint64]string)
	var ones [64]int
	add := func(key string) {
		k := makeKeyRef(key)
		h := s.keyHash(&k)
		if other, ok := seen[h]; ok && other != key {
			t.Fatalf("%q and %q hash alike (%x)", key, other, h)
		}
		seen[h] = key
		for i := range ones {
			ones[i] += int(h >> i & 1)
		}
	}
	for i := range 100_000 {
		add(fmt.Sprintf("user:%d", i))
		add(fmt.Sprintf("%016d", i))
		add(strings.Repeat("\x00", i%(inlineKey+1)) + fmt.Sprint(i/(inlineKey+1)))
	}
	for i, n := range ones {
		if frac := float64(n) / float64(len(seen)); frac < 0.49 || frac > 0.51 {
			t.Errorf("bit %d of the hash is 1 in %.3f of %d keys; want about half", i, frac, len(seen))
		}
	}
}
