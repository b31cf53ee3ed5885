package redisstore

import "strconv"

// Key layout. A bucket belongs to a (policy, key) pair. Every key of a pair
// starts with the store's prefix and the hash tag {h}, where h is 16 hex
// digits of the FNV-1a 64-bit hash of the caller's key alone (not the
// policy):
//
//	<prefix>{<h>}b:<len(policy)>:<policy><key>                        the bucket
//	<prefix>{<h>}r:<len(policy)>:<policy><len(key)>:<key><request ID>  a request-ID record
//
// with the lengths in decimal. The lengths make each layout a one-to-one
// encoding of its parts: read the digits up to ':', then that many bytes
// of policy, then (for a record) the key's length and the key, and the rest
// is the key (or the request ID). So "api" with "x:y" and "api:x" with "y"
// are two buckets, and sluice.MaxKeyLen bounds the caller's key alone.
//
// Redis Cluster hashes only the text between the first '{' and the next '}'
// into a slot. The prefix has no braces and h is hex, so the tag is always
// the store's own: braces or binary bytes in the policy or the key come
// after it and cannot choose the slot, and distinct keys spread over the
// slots. Every key of one caller's key shares its slot: a bucket and its
// records, as the script's KEYS must, and the buckets of every policy of
// that key, so that a TakeAll of the common stacked limit (a per-second
// burst and a daily quota of one user) is one script on a Cluster as on a
// standalone server. The hash is not secret: it spreads keys, it does not
// separate them (the full policy and key follow the tag).

// tagLen is the length of "{" + 16 hex digits + "}".
const tagLen = 18

// bucketKey returns the key of the bucket of (policy, key).
func (s *Store) bucketKey(policy, key string) string {
	b := make([]byte, 0, len(s.prefix)+tagLen+2+3+len(policy)+len(key))
	b = appendTag(append(b, s.prefix...), key)
	b = append(b, "b:"...)
	b = appendLen(b, policy)
	return string(append(b, key...))
}

// recordKey returns the key of the record of request ID id for the bucket
// of (policy, key).
func (s *Store) recordKey(policy, key, id string) string {
	b := make([]byte, 0, len(s.prefix)+tagLen+2+3+len(policy)+4+len(key)+len(id))
	b = appendTag(append(b, s.prefix...), key)
	b = append(b, "r:"...)
	b = appendLen(b, policy)
	b = appendLen(b, key)
	return string(append(b, id...))
}

// appendLen appends len(s) in decimal, ':' and s.
func appendLen(b []byte, s string) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	return append(b, s...)
}

// appendTag appends the hash tag of the caller's key.
func appendTag(b []byte, key string) []byte {
	const hexDigits = "0123456789abcdef"
	h := keyHash(key)
	b = append(b, '{')
	for shift := 60; shift >= 0; shift -= 4 {
		b = append(b, hexDigits[h>>uint(shift)&0xf])
	}
	return append(b, '}')
}

// keyHash returns the FNV-1a 64-bit hash of key, whose hex digits are the
// hash tag.
func keyHash(key string) uint64 {
	const prime = 1099511628211       // FNV-1a 64 prime
	h := uint64(14695981039346656037) // FNV-1a 64 offset basis
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= prime
	}
	return h
}

// clusterSlot returns the Redis Cluster slot of every key of the caller's
// key: CRC16 (XMODEM) of the 16 hex digits of its tag, modulo 16384.
func clusterSlot(key string) int {
	const hexDigits = "0123456789abcdef"
	h := keyHash(key)
	var crc uint16
	for shift := 60; shift >= 0; shift -= 4 {
		crc ^= uint16(hexDigits[h>>uint(shift)&0xf]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc & 16383)
}
