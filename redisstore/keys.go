package redisstore

import "strconv"

// Key layout. Every key of a user key k starts with the prefix and the hash
// tag {h}, where h is 16 hex digits of the FNV-1a 64-bit hash of k:
//
//	<prefix>{<h>}b:<k>                      the bucket
//	<prefix>{<h>}r:<len(k)>:<k><request ID>  a request-ID record
//
// Redis Cluster hashes only the text between the first '{' and the next '}'
// into a slot. The prefix has no braces and h is hex, so the tag is always
// ours: braces or binary bytes in k cannot choose the slot, distinct keys
// spread over the slots, and a bucket and its records share one slot, as the
// script's KEYS must. The length of k makes a record key unambiguous. The
// hash is not secret: it spreads keys, it does not separate them (the full
// key follows the tag).

// tagLen is the length of "{" + 16 hex digits + "}".
const tagLen = 18

// bucketKey returns the key of the bucket of key.
func (s *Store) bucketKey(key string) string {
	b := make([]byte, 0, len(s.prefix)+tagLen+2+len(key))
	b = appendTag(append(b, s.prefix...), key)
	b = append(b, "b:"...)
	return string(append(b, key...))
}

// recordKey returns the key of the record of request ID id for key.
func (s *Store) recordKey(key, id string) string {
	b := make([]byte, 0, len(s.prefix)+tagLen+2+4+len(key)+len(id))
	b = appendTag(append(b, s.prefix...), key)
	b = append(b, "r:"...)
	b = strconv.AppendInt(b, int64(len(key)), 10)
	b = append(b, ':')
	b = append(b, key...)
	return string(append(b, id...))
}

// appendTag appends the hash tag of key.
func appendTag(b []byte, key string) []byte {
	const hexDigits = "0123456789abcdef"
	h := uint64(14695981039346656037) // FNV-1a 64 offset basis
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= 1099511628211 // FNV-1a 64 prime
	}
	b = append(b, '{')
	for shift := 60; shift >= 0; shift -= 4 {
		b = append(b, hexDigits[h>>uint(shift)&0xf])
	}
	return append(b, '}')
}
