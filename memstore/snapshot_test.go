package memstore_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

func snapStore(t *testing.T, c *sluicetest.Clock, o memstore.Options) *memstore.Store {
	t.Helper()
	o.Now, o.SweepInterval = c.Now, -1
	s, err := memstore.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// A snapshot is exact: a store loaded from it decides every later request
// as the store that wrote it would have, after the time the restart took,
// with another epoch and fractions of tokens kept.
func TestSnapshotRoundTrip(t *testing.T) {
	c := sluicetest.NewClock(time.Date(2030, 5, 1, 12, 0, 0, 0, time.UTC))
	a := snapStore(t, c, memstore.Options{})
	limits := []sluice.Limit{
		{Capacity: 10, Rate: sluice.Per(3, 7*time.Second)},
		{Capacity: 1000, Rate: sluice.Per(1, 24*time.Hour)},
		{Capacity: 5, Rate: sluice.Per(0, time.Second)},
	}
	ctx := t.Context()
	rng := rand.New(rand.NewPCG(1, 2))
	var reqs []sluice.Request
	for i := range 300 {
		l := limits[i%len(limits)]
		r := sluice.Request{Policy: []string{"api", "login", "a-much-longer-policy-name"}[i%3], Key: fmt.Sprint("key-", i%97), Cost: 1 + rng.Int64N(l.Capacity), Limit: l}
		reqs = append(reqs, r)
		if _, err := a.Take(ctx, r); err != nil {
			t.Fatal(err)
		}
		c.Advance(time.Duration(rng.Int64N(int64(300 * time.Millisecond))))
	}
	var buf bytes.Buffer
	n, err := a.WriteSnapshot(&buf)
	if err != nil || n == 0 {
		t.Fatalf("WriteSnapshot = %d, %v", n, err)
	}
	// The restart takes 1.5 s; the new store's epoch is then.
	c.Advance(1500 * time.Millisecond)
	b := snapStore(t, c, memstore.Options{})
	if got, err := b.ReadSnapshot(bytes.NewReader(buf.Bytes()), memstore.SnapshotOptions{}); err != nil || got != n {
		t.Fatalf("ReadSnapshot = %d, %v; want %d", got, err, n)
	}
	for i, r := range reqs {
		if i%5 == 0 {
			c.Advance(time.Duration(rng.Int64N(int64(time.Second))))
		}
		da, erra := a.Take(ctx, r)
		db, errb := b.Take(ctx, r)
		if erra != nil || errb != nil || da != db {
			t.Fatalf("take %d after the restart: the writer says %+v, %v; the loaded store %+v, %v", i, da, erra, db, errb)
		}
	}
}

func TestSnapshotRefused(t *testing.T) {
	c := sluicetest.NewClock(time.Date(2030, 5, 1, 12, 0, 0, 0, time.UTC))
	a := snapStore(t, c, memstore.Options{})
	l := sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Hour)}
	for i := range 20 {
		if _, err := a.Take(t.Context(), sluice.Request{Policy: "p", Key: fmt.Sprint(i), Cost: 3, Limit: l}); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	if _, err := a.WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	good := buf.Bytes()
	flip := bytes.Clone(good)
	flip[len(flip)/2] ^= 0x40
	for _, c2 := range []struct {
		name string
		data []byte
		o    memstore.SnapshotOptions
		text string
	}{
		{"empty", nil, memstore.SnapshotOptions{}, "truncated in the header"},
		{"other format", []byte("{\"buckets\":[]}\n................................................"), memstore.SnapshotOptions{}, "not a memstore snapshot"},
		{"truncated", good[:len(good)-40], memstore.SnapshotOptions{}, "truncated"},
		{"no checksum", good[:len(good)-32], memstore.SnapshotOptions{}, "checksum is missing"},
		{"corrupt", flip, memstore.SnapshotOptions{}, ""},
		{"extra bytes", append(bytes.Clone(good), 0), memstore.SnapshotOptions{}, "extra bytes"},
		{"too old", good, memstore.SnapshotOptions{MaxAge: time.Minute}, "ago, more than the 1m0s allowed"},
	} {
		t.Run(c2.name, func(t *testing.T) {
			c.Advance(2 * time.Minute)
			b := snapStore(t, c, memstore.Options{})
			n, err := b.ReadSnapshot(bytes.NewReader(c2.data), c2.o)
			if !errors.Is(err, memstore.ErrSnapshot) || n != 0 || !bytes.Contains([]byte(err.Error()), []byte(c2.text)) {
				t.Fatalf("ReadSnapshot = %d, %v; want ErrSnapshot containing %q", n, err, c2.text)
			}
			if st := b.Stats(); st.Buckets != 0 {
				t.Fatalf("a refused snapshot left %d buckets", st.Buckets)
			}
		})
	}
	// Written in the future: the clock stepped back.
	past := sluicetest.NewClock(time.Date(2030, 4, 1, 0, 0, 0, 0, time.UTC))
	b := snapStore(t, past, memstore.Options{})
	if _, err := b.ReadSnapshot(bytes.NewReader(good), memstore.SnapshotOptions{}); !errors.Is(err, memstore.ErrSnapshot) {
		t.Fatalf("a snapshot from the future = %v", err)
	}
	// More buckets than the store may hold, or a store already in use.
	small := snapStore(t, c, memstore.Options{MaxKeys: 10})
	if _, err := small.ReadSnapshot(bytes.NewReader(good), memstore.SnapshotOptions{}); !errors.Is(err, memstore.ErrSnapshot) {
		t.Fatalf("20 buckets into MaxKeys 10 = %v", err)
	}
	used := snapStore(t, c, memstore.Options{})
	if _, err := used.Take(t.Context(), sluice.Request{Policy: "p", Key: "x", Cost: 1, Limit: l}); err != nil {
		t.Fatal(err)
	}
	if _, err := used.ReadSnapshot(bytes.NewReader(good), memstore.SnapshotOptions{}); !errors.Is(err, memstore.ErrSnapshot) {
		t.Fatalf("a snapshot into a store in use = %v", err)
	}
	if st := used.Stats(); st.Buckets != 1 {
		t.Fatalf("the refused load changed the store in use: %d keys", st.Buckets)
	}
}

// A snapshot written while takes run is race-free and loads.
func TestSnapshotWhileTaking(t *testing.T) {
	s, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l := sluice.Limit{Capacity: 5, Rate: sluice.Per(1, time.Minute)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 20000 {
			if _, err := s.Take(t.Context(), sluice.Request{Policy: "p", Key: fmt.Sprint(i % 1000), Cost: 1, Limit: l}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for range 5 {
		var buf bytes.Buffer
		if _, err := s.WriteSnapshot(&buf); err != nil {
			t.Fatal(err)
		}
		b, err := memstore.New(memstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.ReadSnapshot(&buf, memstore.SnapshotOptions{}); err != nil {
			t.Fatal(err)
		}
		b.Close()
	}
	<-done
}
