package memstore

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
)

// Snapshot format, version 1. All integers are little-endian.
//
//	magic    "sluice-memstore-snapshot-1\n"
//	written  int64   wall clock of the snapshot, Unix nanoseconds
//	count    uint64  buckets
//	count × bucket:
//	  policy  uint8 length, bytes
//	  key     uint16 length, bytes
//	  limit   int64 capacity, int64 rate tokens, int64 period (ns)
//	  state   int64 tokens, uint64 fraction units, int64 stamp (Unix ns)
//	sum      32 bytes, SHA-256 of everything before it
//
// A bucket's stamp is stored as wall-clock time so that a snapshot read
// by another process (whose store has another epoch) refills each bucket
// by exactly the time that passed. Full buckets are left out: a missing
// bucket is full.
const snapshotMagic = "sluice-memstore-snapshot-1\n"

// ErrSnapshot means a snapshot could not be read: it is corrupt or
// truncated, of another format, written in the future or older than the
// caller accepts, or it does not fit the store. Nothing was loaded.
var ErrSnapshot = errors.New("memstore: unusable snapshot")

// WriteSnapshot writes every bucket of s that is not full to w, exactly,
// and returns how many it wrote. Decisions may run while it writes: each
// shard is copied under its lock, one at a time, so a bucket is written as
// it was at some instant during the call. Request-ID records are not
// written: after a restart, a retry is decided afresh.
func (s *Store) WriteSnapshot(w io.Writer) (int, error) {
	h := sha256.New()
	bw := bufio.NewWriter(io.MultiWriter(w, h))
	now := s.clock()
	type rec struct {
		policy, key string
		limit       sluice.Limit
		state       bucket.State
	}
	var recs []rec
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for j := range sh.table.entries {
			e := &sh.table.entries[j]
			pl := &e.plan.plan
			if pl.FullAt(e.state) <= now {
				continue // full: the same as missing
			}
			recs = append(recs, rec{e.plan.policy.name, e.key.String(), pl.Limit(), e.state})
		}
		sh.mu.Unlock()
	}
	wall := s.epoch.UnixNano()
	var buf [8]byte
	put := func(v uint64) {
		binary.LittleEndian.PutUint64(buf[:], v)
		bw.Write(buf[:])
	}
	bw.WriteString(snapshotMagic)
	put(uint64(wall + now))
	put(uint64(len(recs)))
	for _, r := range recs {
		bw.WriteByte(byte(len(r.policy)))
		bw.WriteString(r.policy)
		binary.LittleEndian.PutUint16(buf[:2], uint16(len(r.key)))
		bw.Write(buf[:2])
		bw.WriteString(r.key)
		put(uint64(r.limit.Capacity))
		put(uint64(r.limit.Rate.Tokens))
		put(uint64(r.limit.Rate.Period))
		put(uint64(r.state.Tokens))
		put(r.state.Frac)
		put(uint64(wall + r.state.Stamp))
	}
	if err := bw.Flush(); err != nil {
		return 0, err
	}
	if _, err := w.Write(h.Sum(nil)); err != nil {
		return 0, err
	}
	return len(recs), nil
}

// SnapshotOptions bound what ReadSnapshot accepts.
type SnapshotOptions struct {
	// MaxAge refuses a snapshot written longer ago than this. Zero accepts
	// any age (every bucket refills by the time that passed, exactly).
	MaxAge time.Duration
	// MaxSkew refuses a snapshot written later than now by more than this
	// (a clock that stepped back between the write and the read). Default
	// one minute.
	MaxSkew time.Duration
}

// ReadSnapshot loads a snapshot that WriteSnapshot wrote into s, which
// must hold no buckets, and returns how many buckets it loaded. It reads
// and checks the whole snapshot before it loads anything: a snapshot that
// is corrupt, truncated, followed by extra bytes, of another format,
// outside o's bounds, holding a bucket that is not valid, or holding more
// buckets than s's MaxKeys is an error wrapping ErrSnapshot, and s is left
// empty.
func (s *Store) ReadSnapshot(r io.Reader, o SnapshotOptions) (int, error) {
	if o.MaxSkew == 0 {
		o.MaxSkew = time.Minute
	}
	if o.MaxAge < 0 || o.MaxSkew < 0 {
		return 0, fmt.Errorf("%w: snapshot MaxAge %v and MaxSkew %v must not be negative", sluice.ErrInvalidOption, o.MaxAge, o.MaxSkew)
	}
	h := sha256.New()
	sr := &snapReader{r: bufio.NewReader(r), h: h}
	magic := sr.bytes(len(snapshotMagic))
	if sr.err == nil && string(magic) != snapshotMagic {
		return 0, fmt.Errorf("%w: not a memstore snapshot of version 1 (it starts %q)", ErrSnapshot, magic)
	}
	written := int64(sr.u64())
	count := sr.u64()
	if sr.err != nil {
		return 0, sr.fail("the header")
	}
	wall := s.epoch.UnixNano()
	now := s.clock()
	nowWall := wall + now
	if age := time.Duration(nowWall - written); written > nowWall && -age > o.MaxSkew {
		return 0, fmt.Errorf("%w: written at %v, %v after now: the clock stepped back since (allowed: %v)", ErrSnapshot, time.Unix(0, written).UTC(), -age, o.MaxSkew)
	} else if o.MaxAge > 0 && age > o.MaxAge {
		return 0, fmt.Errorf("%w: written at %v, %v ago, more than the %v allowed", ErrSnapshot, time.Unix(0, written).UTC(), age.Round(time.Second), o.MaxAge)
	}
	if count > uint64(s.maxKeys) {
		return 0, fmt.Errorf("%w: holds %d buckets, more than the store's MaxKeys of %d", ErrSnapshot, count, s.maxKeys)
	}
	type rec struct {
		policy, key string
		plan        bucket.Plan
		state       bucket.State
	}
	recs := make([]rec, 0, min(count, 1<<16))
	plans := map[sluice.Limit]bucket.Plan{}
	for i := uint64(0); i < count; i++ {
		policy := string(sr.bytes(int(sr.u8())))
		key := string(sr.bytes(int(sr.u16())))
		l := sluice.Limit{Capacity: int64(sr.u64()), Rate: sluice.Rate{Tokens: int64(sr.u64()), Period: time.Duration(sr.u64())}}
		st := bucket.State{Tokens: int64(sr.u64()), Frac: sr.u64()}
		stampWall := int64(sr.u64())
		if sr.err != nil {
			return 0, sr.fail(fmt.Sprintf("bucket %d of %d", i+1, count))
		}
		if err := sluice.ValidatePolicy(policy); err != nil {
			return 0, fmt.Errorf("%w: bucket %d: %v", ErrSnapshot, i+1, err)
		}
		if err := sluice.ValidateKey(key); err != nil {
			return 0, fmt.Errorf("%w: bucket %d: %v", ErrSnapshot, i+1, err)
		}
		pl, ok := plans[l]
		if !ok {
			var err error
			if pl, err = bucket.NewPlan(l, time.Nanosecond); err != nil {
				return 0, fmt.Errorf("%w: bucket %d (policy %q): %v", ErrSnapshot, i+1, policy, err)
			}
			plans[l] = pl
		}
		if st.Tokens < 0 || st.Tokens > l.Capacity || st.Frac >= pl.Scale() || (st.Tokens == l.Capacity && st.Frac != 0) {
			return 0, fmt.Errorf("%w: bucket %d (policy %q) has %d tokens and %d/%d of a token, outside its limit %v", ErrSnapshot, i+1, policy, st.Tokens, st.Frac, pl.Scale(), l)
		}
		// The stamp in this store's ticks; a stamp before its epoch is
		// negative, which ticks allow.
		st.Stamp = stampWall - wall
		if (stampWall^wall) < 0 && (st.Stamp^stampWall) < 0 {
			return 0, fmt.Errorf("%w: bucket %d has a stamp out of range", ErrSnapshot, i+1)
		}
		recs = append(recs, rec{policy, key, pl, st})
	}
	sum := h.Sum(nil)
	stored := make([]byte, sha256.Size)
	if _, err := io.ReadFull(sr.r, stored); err != nil {
		return 0, fmt.Errorf("%w: truncated: the checksum is missing", ErrSnapshot)
	}
	if string(stored) != string(sum) {
		return 0, fmt.Errorf("%w: the checksum does not match: the file is corrupt", ErrSnapshot)
	}
	if n, _ := sr.r.Read(make([]byte, 1)); n != 0 {
		return 0, fmt.Errorf("%w: extra bytes after the checksum", ErrSnapshot)
	}

	// Everything checked: load it, refusing if the store is not empty.
	for i := range s.shards {
		s.shards[i].mu.Lock()
	}
	defer func() {
		for i := range s.shards {
			s.shards[i].mu.Unlock()
		}
	}()
	if k := s.keys.Load(); k != 0 {
		return 0, fmt.Errorf("%w: the store already holds %d buckets; load a snapshot into a new store", ErrSnapshot, k)
	}
	for i, r := range recs {
		pn := makePolicyName(r.policy)
		h := s.hash(pn, r.key)
		sh := &s.shards[h&s.mask]
		tg := tag(h, s.shardBits)
		if idx, _ := sh.table.find(pn, r.key, tg); idx >= 0 {
			s.unload()
			return 0, fmt.Errorf("%w: bucket %d (policy %q) appears twice", ErrSnapshot, i+1, r.policy)
		}
		pr, err := sh.acquire(pn, r.plan.Limit())
		if err != nil {
			s.unload()
			return 0, fmt.Errorf("%w: bucket %d: %v", ErrSnapshot, i+1, err)
		}
		s.keys.Add(1)
		sh.table.insert(tg, entry{key: ownKeyRef(r.key), state: r.state, plan: pr}, s.shardBits, s.rehash)
		sh.noteFull(r.plan.FullAt(r.state))
	}
	return len(recs), nil
}

// unload drops every bucket, with every shard locked, undoing a load that
// failed half way.
func (s *Store) unload() {
	for i := range s.shards {
		sh := &s.shards[i]
		for j := len(sh.table.entries) - 1; j >= 0; j-- {
			sh.release(sh.table.entries[j].plan)
		}
		s.keys.Add(-int64(len(sh.table.entries)))
		sh.table = table{}
	}
}

// snapReader reads a snapshot's fields, hashing what it reads; after the
// first error it reads zeros.
type snapReader struct {
	r   *bufio.Reader
	h   hash.Hash
	err error
	buf [8]byte
}

func (sr *snapReader) bytes(n int) []byte {
	if sr.err != nil {
		return nil
	}
	b := make([]byte, n)
	if _, sr.err = io.ReadFull(sr.r, b); sr.err != nil {
		return nil
	}
	sr.h.Write(b)
	return b
}

func (sr *snapReader) fixed(n int) []byte {
	if sr.err != nil {
		return sr.buf[:n:n]
	}
	if _, sr.err = io.ReadFull(sr.r, sr.buf[:n]); sr.err != nil {
		clear(sr.buf[:])
		return sr.buf[:n]
	}
	sr.h.Write(sr.buf[:n])
	return sr.buf[:n]
}

func (sr *snapReader) u8() uint8   { return sr.fixed(1)[0] }
func (sr *snapReader) u16() uint16 { return binary.LittleEndian.Uint16(sr.fixed(2)) }
func (sr *snapReader) u64() uint64 { return binary.LittleEndian.Uint64(sr.fixed(8)) }

// fail is the error of a read that ended early in part.
func (sr *snapReader) fail(part string) error {
	if errors.Is(sr.err, io.EOF) || errors.Is(sr.err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: truncated in %s", ErrSnapshot, part)
	}
	return fmt.Errorf("%w: reading %s: %v", ErrSnapshot, part, sr.err)
}
