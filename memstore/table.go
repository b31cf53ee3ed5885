package memstore

import (
	"math/rand/v2"

	"github.com/sluicehq/sluice/bucket"
)

// table is one shard's buckets: an open-addressing hash index over a dense
// slice of entries (the layout of a compact dict). Each bucket costs one
// 64-byte entry, one 8-byte slot at a load of at most 3/4, and, for a key
// longer than 16 bytes, the key's bytes, with no other allocation per
// bucket. The shard's hash of
// a bucket's identity (already computed to pick the shard) is reused, so a
// lookup hashes once. A key of up to 16 bytes is held in the entry itself
// (keyRef): such a bucket costs its 64-byte entry and its slot, and a
// lookup reads the slot and the entry, nothing else.
//
// A slot is 0 when empty, else tag<<32 | index+1, where tag is 32 bits of
// the identity's hash whose low bits are the slot it hashes to (its home),
// so deletion can shift entries back without rehashing.
type table struct {
	slots   []uint64
	entries []entry
}

// entry is one bucket. Its identity is (plan.policy, key): the policy is
// kept once per shard and limit in the planRef, the caller's key in full
// in the entry, so no two identities are confused ("api" with "x:y" is not
// "api:x" with "y") and sluice.MaxKeyLen bounds the key alone.
type entry struct {
	key   keyRef
	state bucket.State
	plan  *planRef
}

// is reports whether e is the bucket of (p, k).
func (e *entry) is(p policyName, k *keyRef) bool {
	return e.key.equal(k) && e.plan.policy.is(p)
}

const minSlots = 8

// tag returns the bits of h a slot keeps: h without the shard bits.
func tag(h uint64, shardBits uint) uint32 { return uint32(h >> shardBits) }

// find returns the index of the entry of (p, key), whose hash has tag tg,
// or -1, and the slot where it is or would be inserted.
func (t *table) find(p policyName, key string, tg uint32) (idx, slot int) {
	k := makeKeyRef(key)
	return t.findRef(p, &k, tg)
}

// findRef is find of a key made a keyRef.
func (t *table) findRef(p policyName, k *keyRef, tg uint32) (idx, slot int) {
	if len(t.slots) == 0 {
		return -1, -1
	}
	mask := len(t.slots) - 1
	for i := int(tg) & mask; ; i = (i + 1) & mask {
		sv := t.slots[i]
		if sv == 0 {
			return -1, i
		}
		if uint32(sv>>32) == tg {
			if e := &t.entries[uint32(sv)-1]; e.is(p, k) {
				return int(uint32(sv) - 1), i
			}
		}
	}
}

// insert adds e, which is not present and hashes to tag tg, and returns
// its index. It grows the index to keep the load at most 3/4. rehash
// returns the hash of an entry.
func (t *table) insert(tg uint32, e entry, shardBits uint, rehash func(*entry) uint64) int {
	if (len(t.entries)+1)*4 > len(t.slots)*3 {
		t.resize(max(minSlots, len(t.slots)*2), shardBits, rehash)
	}
	_, slot := t.findRef(e.plan.policy, &e.key, tg)
	t.entries = append(t.entries, e)
	t.slots[slot] = uint64(tg)<<32 | uint64(len(t.entries))
	return len(t.entries) - 1
}

// remove deletes the entry at idx, which has tag tg. The last entry moves
// into its place.
func (t *table) remove(idx int, tg uint32, shardBits uint, rehash func(*entry) uint64) {
	mask := len(t.slots) - 1
	// Find the slot of idx and empty it, shifting later entries of the
	// probe run back (linear probing needs no tombstones).
	i := int(tg) & mask
	for uint32(t.slots[i]) != uint32(idx+1) {
		i = (i + 1) & mask
	}
	for j := i; ; {
		j = (j + 1) & mask
		sv := t.slots[j]
		if sv == 0 {
			break
		}
		// Leave sv where it is if its home lies cyclically in (i, j].
		home := int(uint32(sv>>32)) & mask
		if i <= j && i < home && home <= j || i > j && (i < home || home <= j) {
			continue
		}
		t.slots[i] = sv
		i = j
	}
	t.slots[i] = 0

	// Move the last entry into the gap and repoint its slot.
	last := len(t.entries) - 1
	if idx != last {
		moved := t.entries[last]
		t.entries[idx] = moved
		mt := tag(rehash(&moved), shardBits)
		k := int(mt) & mask
		for uint32(t.slots[k]) != uint32(last+1) {
			k = (k + 1) & mask
		}
		t.slots[k] = uint64(mt)<<32 | uint64(idx+1)
	}
	t.entries[last] = entry{}
	t.entries = t.entries[:last]

	// Give memory back after a flood has been reclaimed.
	if len(t.slots) > minSlots && len(t.entries)*8 < len(t.slots) {
		t.resize(len(t.slots)/4, shardBits, rehash)
	}
}

// resize rebuilds the index with n slots (a power of two) and trims the
// entries' spare capacity when shrinking.
func (t *table) resize(n int, shardBits uint, rehash func(*entry) uint64) {
	if n < len(t.slots) && cap(t.entries) > 2*len(t.entries) {
		t.entries = append(make([]entry, 0, len(t.entries)+len(t.entries)/4), t.entries...)
	}
	t.slots = make([]uint64, n)
	mask := n - 1
	for idx := range t.entries {
		tg := tag(rehash(&t.entries[idx]), shardBits)
		i := int(tg) & mask
		for t.slots[i] != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = uint64(tg)<<32 | uint64(idx+1)
	}
}

// oldest returns the index of the entry with the oldest stamp among a
// random sample of n entries that are not pinned, or -1 if there is none.
// If every entry sampled is pinned, it returns the first entry that is
// not.
func (t *table) oldest(n int, pins []pin) int {
	if len(t.entries) == 0 {
		return -1
	}
	best := -1
	for range n {
		i := rand.IntN(len(t.entries))
		if pinned(pins, &t.entries[i]) {
			continue
		}
		if best < 0 || t.entries[i].state.Stamp < t.entries[best].state.Stamp {
			best = i
		}
	}
	if best < 0 {
		for i := range t.entries {
			if !pinned(pins, &t.entries[i]) {
				return i
			}
		}
	}
	return best
}

// pin names a bucket that an insert must neither reclaim nor evict to make
// room: another bucket of the multi-take that makes the insert.
type pin struct {
	policy policyName
	key    string
}

// pinned reports whether e is one of the buckets pins name.
func pinned(pins []pin, e *entry) bool {
	for i := range pins {
		if k := makeKeyRef(pins[i].key); e.is(pins[i].policy, &k) {
			return true
		}
	}
	return false
}
