package memstore

// inlineKey is the longest key an entry holds in place, in its own 16
// bytes, without a string of its own: a lookup then compares two words
// instead of reading the key's bytes from elsewhere in memory (a cache
// miss on every decision of a store too large for the cache), and the
// bucket costs no allocation.
const inlineKey = 16

// lengths is the constant whose prefixes record the length of an inline
// key: a keyRef of a key of n <= inlineKey bytes has long = lengths[:n],
// which points into this constant and allocates nothing.
const lengths = "0123456789abcdef"

// keyRef is a bucket's key as an entry holds it. A key of at most
// inlineKey bytes is packed into k (its bytes in order, little-endian,
// zero-padded) with long = lengths[:len(key)]; a longer key is long, with
// k zero. So two keyRefs are of the same key exactly when their k and
// len(long) are equal and, for long keys, long too.
type keyRef struct {
	k    [2]uint64
	long string
}

// makeKeyRef returns key as a keyRef. A long key is kept as it is; an
// entry must hold its own copy (see ownKeyRef). It is small enough to be
// inlined.
func makeKeyRef(key string) keyRef {
	if len(key) > inlineKey {
		return keyRef{long: key}
	}
	return keyRef{k: packKey(key), long: lengths[:len(key)]}
}

// packKey returns the words of a key of at most inlineKey bytes, reading
// each byte with at most two loads per word (the second overlapping the
// first) rather than byte by byte.
func packKey(key string) [2]uint64 {
	switch n := len(key); {
	case n >= 8:
		// The second word's bytes are key[8:], the top ones of the
		// last eight (x >> 64 is 0 when n is 8).
		return [2]uint64{le64(key), le64(key[n-8:]) >> (8 * (16 - n))}
	case n >= 4:
		return [2]uint64{le32(key) | le32(key[n-4:])<<(8*(n-4)), 0}
	case n > 0:
		return [2]uint64{uint64(key[0]) | uint64(key[n/2])<<(8*(n/2)) | uint64(key[n-1])<<(8*(n-1)), 0}
	}
	return [2]uint64{}
}

// ownKeyRef returns key as an entry keeps it: a long key copied, so that
// the entry does not hold on to the caller's string.
func ownKeyRef(key string) keyRef {
	if len(key) > inlineKey {
		return keyRef{long: string(append([]byte(nil), key...))}
	}
	return makeKeyRef(key)
}

// equal reports whether k and o are the same key.
func (k *keyRef) equal(o *keyRef) bool {
	return k.k == o.k && len(k.long) == len(o.long) && (len(o.long) <= inlineKey || k.long == o.long)
}

// appendTo appends the key's bytes to b.
func (k *keyRef) appendTo(b []byte) []byte {
	if len(k.long) > inlineKey {
		return append(b, k.long...)
	}
	var w [16]byte
	for i := range 8 {
		w[i], w[8+i] = byte(k.k[0]>>(8*i)), byte(k.k[1]>>(8*i))
	}
	return append(b, w[:len(k.long)]...)
}

// String returns the key.
func (k *keyRef) String() string {
	if len(k.long) > inlineKey {
		return k.long
	}
	var b [inlineKey]byte
	return string(k.appendTo(b[:0]))
}
