package memstore

import (
	"hash/maphash"
	"math/bits"
)

// policyName is a policy name prepared for the hot path: the name and its
// first (up to) 8 bytes as a little-endian word, zero-padded. With the
// length, the word identifies a name of at most 8 bytes exactly, so the
// usual short names are compared and hashed without a call. identify
// prepares one.
type policyName struct {
	name string
	word uint64
}

// makePolicyName returns name prepared.
func makePolicyName(name string) policyName {
	p, _ := (*Store)(nil).identify(name, "")
	return p
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

// identify returns policy prepared, and the store's hash of the identity
// (policy, key) (zero for a nil s): its low bits pick the shard, the rest
// index the shard's table.
//
// The hash combines a keyed hash of the key with a keyed hash of the
// policy, so for one policy it is a keyed hash of the key (which callers'
// clients choose), and the same key under two policies lands in unrelated
// places; no name is built for it. A policy of at most 8 bytes (its word
// and length) is hashed with one multiplication by the store's random
// keys, a longer one with maphash. It is all one function so that the hot
// path makes one call for it.
func (s *Store) identify(policy, key string) (p policyName, h uint64) {
	// The word: the first min(8, n) bytes, little-endian, zero-padded.
	switch n := len(policy); {
	case n >= 8:
		p.word = le64(policy)
	case n >= 4:
		// Two loads that overlap put the shared bytes in the same places.
		p.word = le32(policy) | le32(policy[n-4:])<<(8*(n-4))
	case n > 0:
		p.word = uint64(policy[0]) | uint64(policy[n/2])<<(8*(n/2)) | uint64(policy[n-1])<<(8*(n-1))
	}
	p.name = policy
	if s == nil {
		return p, 0
	}
	h = maphash.String(s.seed, key)
	if len(policy) > 8 {
		return p, h ^ maphash.String(s.policySeed, policy)
	}
	hi, lo := bits.Mul64(p.word^s.policyKeys[0], uint64(len(policy))^s.policyKeys[1])
	return p, h ^ hi ^ lo
}

// rehash is the hash of a bucket's identity.
func (s *Store) rehash(e *entry) uint64 {
	_, h := s.identify(e.plan.policy.name, e.key)
	return h
}
