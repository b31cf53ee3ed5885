package memstore

import (
	"math/rand/v2"
	"strings"

	"github.com/sluicehq/sluice/bucket"
)

// table is one shard's buckets: an open-addressing hash index over a dense
// slice of entries (the layout of a compact dict). Each bucket costs one
// 48-byte entry, one 8-byte slot at a load of at most 3/4, and its name's
// bytes, with no allocation per bucket beyond the name. The shard's hash of
// a bucket's identity (already computed to pick the shard) is reused, so a
// lookup hashes once.
//
// A slot is 0 when empty, else tag<<32 | index+1, where tag is 32 bits of
// the identity's hash whose low bits are the slot it hashes to (its home),
// so deletion can shift entries back without rehashing names.
type table struct {
	slots   []uint64
	entries []entry
}

// entry is one bucket. Its name encodes the bucket's identity (policy,
// key): see makeName.
type entry struct {
	name  string
	state bucket.State
	plan  *planRef
}

// makeName returns the name of the bucket of (policy, key): the policy's
// length in one byte, the policy, then the key. A policy is 1 to
// sluice.MaxPolicyLen (64) bytes, so the length byte is exact, and two
// identities have one name only if their policies and keys are equal
// ("api" with "x:y" is not "api:x" with "y"). The key keeps all of its
// sluice.MaxKeyLen bytes. Lookups compare the parts in place (entry.is)
// and never build a name.
func makeName(policy, key string) string {
	var b strings.Builder
	b.Grow(1 + len(policy) + len(key))
	b.WriteByte(byte(len(policy)))
	b.WriteString(policy)
	b.WriteString(key)
	return b.String()
}

// splitName returns the policy and key of a name made by makeName.
func splitName(name string) (policy, key string) {
	n := 1 + int(name[0])
	return name[1:n], name[n:]
}

// is reports whether e is the bucket of (policy, key).
func (e *entry) is(policy, key string) bool {
	n := e.name
	return len(n) == 1+len(policy)+len(key) && int(n[0]) == len(policy) &&
		n[1+len(policy):] == key && n[1:1+len(policy)] == policy
}

const minSlots = 8

// tag returns the bits of h a slot keeps: h without the shard bits.
func tag(h uint64, shardBits uint) uint32 { return uint32(h >> shardBits) }

// find returns the index of the entry of (policy, key), whose hash has tag
// tg, or -1, and the slot where it is or would be inserted.
func (t *table) find(policy, key string, tg uint32) (idx, slot int) {
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
			if e := &t.entries[uint32(sv)-1]; e.is(policy, key) {
				return int(uint32(sv) - 1), i
			}
		}
	}
}

// insert adds e, whose name is not present and hashes to tag tg, and
// returns its index. It grows the index to keep the load at most 3/4.
// rehash returns the hash of a name.
func (t *table) insert(tg uint32, e entry, shardBits uint, rehash func(string) uint64) int {
	if (len(t.entries)+1)*4 > len(t.slots)*3 {
		t.resize(max(minSlots, len(t.slots)*2), shardBits, rehash)
	}
	policy, key := splitName(e.name)
	_, slot := t.find(policy, key, tg)
	t.entries = append(t.entries, e)
	t.slots[slot] = uint64(tg)<<32 | uint64(len(t.entries))
	return len(t.entries) - 1
}

// remove deletes the entry at idx, whose name has tag tg. The last entry
// moves into its place.
func (t *table) remove(idx int, tg uint32, shardBits uint, rehash func(string) uint64) {
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
		mt := tag(rehash(moved.name), shardBits)
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
func (t *table) resize(n int, shardBits uint, rehash func(string) uint64) {
	if n < len(t.slots) && cap(t.entries) > 2*len(t.entries) {
		t.entries = append(make([]entry, 0, len(t.entries)+len(t.entries)/4), t.entries...)
	}
	t.slots = make([]uint64, n)
	mask := n - 1
	for idx := range t.entries {
		tg := tag(rehash(t.entries[idx].name), shardBits)
		i := int(tg) & mask
		for t.slots[i] != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = uint64(tg)<<32 | uint64(idx+1)
	}
}

// oldest returns the index of the entry with the oldest stamp among a
// random sample of n entries, or -1 if the table is empty.
func (t *table) oldest(n int) int {
	if len(t.entries) == 0 {
		return -1
	}
	best := rand.IntN(len(t.entries))
	for range n - 1 {
		if i := rand.IntN(len(t.entries)); t.entries[i].state.Stamp < t.entries[best].state.Stamp {
			best = i
		}
	}
	return best
}
