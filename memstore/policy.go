package memstore

import (
	"hash/maphash"
	"math/bits"
)

// policyName is a policy name prepared for the hot path: the name and its
// first (up to) 8 bytes as a little-endian word, zero-padded. With the
// length, the word identifies a name of at most 8 bytes exactly, so the
// usual short names are compared and hashed without a call.
// makePolicyName prepares one.
type policyName struct {
	name string
	word uint64
}

// makePolicyName returns name prepared: its word is the first min(8, n)
// bytes, little-endian, zero-padded. It is small enough to be inlined.
func makePolicyName(name string) policyName {
	return policyName{name: name, word: policyWord(name)}
}

// policyWord is the word of makePolicyName.
func policyWord(s string) uint64 {
	switch n := len(s); {
	case n >= 8:
		return le64(s)
	case n >= 4:
		// Two loads that overlap put the shared bytes in the same places.
		return le32(s) | le32(s[n-4:])<<(8*(n-4))
	case n > 0:
		return uint64(s[0]) | uint64(s[n/2])<<(8*(n/2)) | uint64(s[n-1])<<(8*(n-1))
	}
	return 0
}

// is reports whether p and q are the same name.
func (p policyName) is(q policyName) bool {
	return p.word == q.word && len(p.name) == len(q.name) && (len(p.name) <= 8 || p.name == q.name)
}

func le64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

func le32(s string) uint64 {
	_ = s[3]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24
}

// hash is the store's hash of the identity (p, key): its low bits pick
// the shard, the rest index the shard's table.
//
// It combines a keyed hash of the key with a keyed hash of the policy, so
// for one policy it is a keyed hash of the key (which callers' clients
// choose), and the same key under two policies lands in unrelated places;
// no name is built for it. A name of at most 8 bytes (its word and length)
// is hashed with one multiplication by the store's random keys, a longer
// one with maphash; so is a key: one of at most inlineKey bytes (its two
// words as an entry holds them, and its length) with two, a longer one
// with maphash. takeFields computes the same hash with the usual case
// written out, so that the hot path makes no call for the whole identity;
// TestHotPathHash checks that the two agree.
func (s *Store) hash(p policyName, key string) uint64 {
	k := makeKeyRef(key)
	return s.keyHash(&k) ^ s.policyHash(p)
}

// keyHash is the key's part of hash.
func (s *Store) keyHash(k *keyRef) uint64 {
	if len(k.long) > inlineKey {
		return maphash.String(s.seed, k.long)
	}
	return s.inlineKeyHash(k.k, len(k.long))
}

// inlineKeyHash is the hash of a key of n <= inlineKey bytes whose words
// are w: the multiply-and-fold of the words under two of the store's
// random keys, folded again with the length under the third (the mixing
// of the runtime's own hash of short strings where it has no AES). The
// length is in it because the words of "a" and "a\x00" are the same.
func (s *Store) inlineKeyHash(w [2]uint64, n int) uint64 {
	return mix(mix(w[0]^s.keyKeys[0], w[1]^s.keyKeys[1])^uint64(n), s.keyKeys[2])
}

// mix is the 64-bit fold of the 128-bit product of a and b.
func mix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// policyHash is the policy's part of hash.
func (s *Store) policyHash(p policyName) uint64 {
	if len(p.name) > 8 {
		return maphash.String(s.policySeed, p.name)
	}
	return s.shortPolicyHash(p.word, len(p.name))
}

// shortPolicyHash is the hash of a policy name of n <= 8 bytes whose word
// is w.
func (s *Store) shortPolicyHash(w uint64, n int) uint64 {
	return mix(w^s.policyKeys[0], uint64(n)^s.policyKeys[1])
}

// identify returns policy prepared and the hash of (policy, key).
func (s *Store) identify(policy, key string) (policyName, uint64) {
	p := makePolicyName(policy)
	return p, s.hash(p, key)
}

// rehash is the hash of a bucket's identity.
func (s *Store) rehash(e *entry) uint64 {
	return s.keyHash(&e.key) ^ s.policyHash(e.plan.policy)
}
