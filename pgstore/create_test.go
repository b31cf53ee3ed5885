package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/pgstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// TestInsertFirstFloor: a take of a new key at a time before the latest
// sweep's creates its bucket no earlier than the sweep, as the take
// function does: the bucket the sweep deleted was full at the sweep's
// time, not at the take's, and a bucket made full at the take's time would
// hold the tokens that refilled in between. A take that tries the plain
// insert first (docs/postgres.md, "Takes of new keys") finds the floor
// above its stamp in its second statement, is rolled back, and is decided
// by the function: one insert-first try, one miss.
func TestInsertFirstFloor(t *testing.T) {
	for _, first := range []bool{false, true} {
		t.Run(fmt.Sprintf("insert first %v", first), func(t *testing.T) {
			l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(10)} // full 1s after it is emptied
			s, at, take := clockedKey(t, first, l)
			ctx := context.Background()
			if d, err := take(10); err != nil || !d.Allowed {
				t.Fatalf("Take(10) = %+v, %v", d, err)
			}
			// A sweep at +2s deletes the bucket, full since +1s.
			at(2 * time.Second)
			if n, err := s.Sweep(ctx); err != nil || n.Buckets != 1 {
				t.Fatalf("Sweep at +2s = %+v, %v; want 1 bucket deleted", n, err)
			}
			before := s.Stats()
			// A take whose clock reads +0.5s, when the bucket held 5
			// tokens, creates it at +2s: its reset runs from +0.5s to +2s
			// and one second more.
			at(500 * time.Millisecond)
			want := sluice.Decision{Allowed: true, Remaining: 0, ResetAfter: 2500 * time.Millisecond, Limit: l}
			if d, err := take(10); err != nil || d != want {
				t.Fatalf("Take(10) at +0.5s after a sweep at +2s = %+v, %v; want %+v", d, err, want)
			}
			if st := s.Stats(); st.InsertFirst-before.InsertFirst != uint64(one(first)) || st.InsertFirstMisses-before.InsertFirstMisses != uint64(one(first)) {
				t.Errorf("Stats() = %+v after %+v; want InsertFirst and InsertFirstMisses up by %d", st, before, one(first))
			}
			// Its full_at runs from +2s too: a sweep at +2.5s, when it
			// holds 5 tokens, leaves it.
			at(2500 * time.Millisecond)
			if n, err := s.Sweep(ctx); err != nil || n.Buckets != 0 {
				t.Fatalf("Sweep at +2.5s = %+v, %v; want nothing deleted (the bucket is full at +3s)", n, err)
			}
			// At +1.5s nothing has refilled since +2s.
			at(1500 * time.Millisecond)
			denied := sluice.Decision{Remaining: 0, RetryAfter: 1500 * time.Millisecond, ResetAfter: 1500 * time.Millisecond, Limit: l}
			if d, err := take(10); err != nil || d != denied {
				t.Errorf("Take(10) at +1.5s = %+v, %v; want %+v (nothing refilled since the bucket was made at +2s)", d, err, denied)
			}
			at(3 * time.Second)
			if d, err := take(10); err != nil || !d.Allowed {
				t.Fatalf("Take(10) at +3s = %+v, %v; want allowed (full again 1s after +2s)", d, err)
			}
		})
	}
}

// TestInsertFirstBehindFloorExisting: a take whose plain insert finds its
// bucket there, at a time behind the sweep floor, is a miss (its guard
// leaves the floor check nothing to check), decided by the function on the
// bucket as it is (stamped before the floor, not full at the sweep, so not
// deleted), and nothing moves the bucket's stamp to the floor, which would
// throw away what refilled before it.
func TestInsertFirstBehindFloorExisting(t *testing.T) {
	l := sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(1)}
	s, at, take := clockedKey(t, true, l)
	ctx := context.Background()
	if d, err := take(100); err != nil || !d.Allowed {
		t.Fatalf("Take(100) = %+v, %v", d, err)
	}
	// A sweep at +5s raises the floor; the empty bucket stays.
	at(5 * time.Second)
	if n, err := s.Sweep(ctx); err != nil || n.Buckets != 0 {
		t.Fatalf("Sweep at +5s = %+v, %v; want nothing deleted", n, err)
	}
	// At +3s, behind the floor, 3 tokens have refilled since the take at 0.
	at(3 * time.Second)
	want := sluice.Decision{Allowed: true, Remaining: 0, ResetAfter: 100 * time.Second, Limit: l}
	if d, err := take(3); err != nil || d != want {
		t.Fatalf("Take(3) at +3s = %+v, %v; want %+v", d, err, want)
	}
	if st := s.Stats(); st.InsertFirst != 2 || st.InsertFirstMisses != 1 {
		t.Errorf("Stats() = %+v; want InsertFirst 2, InsertFirstMisses 1", st)
	}
}

// TestInsertFirstAdaptive: a store tries the insert first while its tries
// create buckets, stops after a few that find their bucket, then tries only
// one take in insertFirstProbe (32), and starts again once those create
// buckets. Every decision is the function's.
func TestInsertFirstAdaptive(t *testing.T) {
	s := newStore(t, pgstore.Options{})
	ctx := context.Background()
	l := sluice.Limit{Capacity: 1 << 20, Rate: sluice.PerSecond(1)}
	take := func(key string) {
		t.Helper()
		d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: key, Cost: 1, Limit: l})
		if err != nil || !d.Allowed {
			t.Fatalf("Take(%q) = %+v, %v", key, d, err)
		}
	}
	// New keys: every take tries the insert, and creates.
	for i := range 19 {
		take(fmt.Sprintf("new %d", i))
	}
	take("old")
	if st := s.Stats(); st.InsertFirst != 20 || st.InsertFirstMisses != 0 {
		t.Fatalf("after 20 takes of new keys, Stats() = %+v; want InsertFirst 20, no miss", st)
	}
	// One key over and over: three misses take the score from its top
	// (8) below 0; then one take in 32 tries.
	for range 320 {
		take("old")
	}
	st := s.Stats()
	if tries, misses := st.InsertFirst-20, st.InsertFirstMisses; tries != misses || misses < 3+320/32-1 || misses > 3+320/32+1 {
		t.Fatalf("after 320 takes of one key, Stats() = %+v; want 3 misses and one in 32 of the rest (%d to %d)", st, 3+320/32-1, 3+320/32+1)
	}
	// New keys again: five probes that create, one take in 32, bring the
	// score from its bottom (-4) above 0, and every take tries again.
	for i := range 5 * 32 {
		take(fmt.Sprintf("back %d", i))
	}
	st2 := s.Stats()
	if got := st2.InsertFirst - st.InsertFirst; got < 5 || got > 5+31 {
		t.Errorf("160 takes of new keys after the misses tried the insert first %d times; want 5 probes, and then every take (5 to 36)", got)
	}
	for i := range 32 {
		take(fmt.Sprintf("again %d", i))
	}
	st3 := s.Stats()
	if st3.InsertFirstMisses != st.InsertFirstMisses {
		t.Errorf("takes of new keys missed: Stats() = %+v after %+v", st3, st)
	}
	if got := st3.InsertFirst - st2.InsertFirst; got != 32 {
		t.Errorf("32 more takes of new keys tried the insert first %d times; want all 32", got)
	}
}

// TestInsertFirstSchemaChanged: a store that found its own schema version
// on its first call, and whose plain insert a later migration made fail
// (here, a trigger that refuses inserts outside the take function, as a
// later version's new column or constraint could), reports that take's
// error, reads the schema's version again on its next call, and decides
// from then on with the function alone once the version is not its own.
func TestInsertFirstSchemaChanged(t *testing.T) {
	ctx := context.Background()
	s, table := newStoreTable(t, pgstore.Options{})
	take := func(key string) (sluice.Decision, error) {
		return s.Take(ctx, sluice.Request{Policy: testPolicy, Key: key, Cost: 1, Limit: testLimit})
	}
	if d, err := take("before"); err != nil || !d.Allowed {
		t.Fatalf("Take = %+v, %v", d, err)
	}
	if st := s.Stats(); st.InsertFirst != 1 {
		t.Fatalf("Stats() = %+v; want the first take to try the insert first", st)
	}
	fn := qualified(table + "_plain_insert_refused")
	if _, err := testPool.Exec(ctx, `CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF current_query() LIKE 'INSERT%' THEN
		RAISE EXCEPTION 'a later schema''s bucket row' USING ERRCODE = 'not_null_violation';
	END IF;
	RETURN NEW;
END
$$;
CREATE TRIGGER plain_insert_refused BEFORE INSERT ON `+qualified(table)+` FOR EACH ROW EXECUTE FUNCTION `+fn+`();
COMMENT ON TABLE `+qualified(table)+` IS 'sluice pgstore token buckets, schema version 99'`); err != nil {
		t.Fatal(err)
	}
	if _, err := take("during"); !errors.Is(err, sluice.ErrUnavailable) {
		t.Fatalf("Take of a new key whose plain insert fails = %v; want the error (wrapping %v)", err, sluice.ErrUnavailable)
	}
	for i := range 3 {
		if d, err := take(fmt.Sprintf("after %d", i)); err != nil || !d.Allowed {
			t.Fatalf("Take %d after the failed insert = %+v, %v; want the function to decide it", i, d, err)
		}
	}
	if st := s.Stats(); st.InsertFirst != 1 {
		t.Errorf("Stats() = %+v; want no insert-first try after the schema's version changed", st)
	}
}

// TestInsertFirstConflictBehindFloor: a take whose insert passes its guard
// (the bucket is not there yet in its snapshot), waits for another session
// inserting the same key, and then finds it there, at a time behind the
// sweep floor, fails its floor check after the conflict: that is a miss,
// decided by the function on the bucket the other session made, not an
// error.
func TestInsertFirstConflictBehindFloor(t *testing.T) {
	clock := sluicetest.NewClock(epoch)
	s, table := newStoreTable(t, pgstore.Options{Now: clock.Now, StatementTimeout: time.Minute, LockTimeout: time.Minute})
	pgstore.SetInsertFirst(s, true)
	ctx := context.Background()
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
	// A sweep at +5s raises the floor.
	clock.Set(epoch.Add(5 * time.Second))
	if _, err := s.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	// Another session inserts the bucket of "k", empty at +5s, and holds it.
	tx, err := testPool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	at5 := epoch.Add(5 * time.Second).UnixMicro()
	if _, err := tx.Exec(ctx, "INSERT INTO "+qualified(table)+" (policy, key, tokens, frac, stamp, capacity, rate_tokens, period_us, full_at) VALUES ($1, $2, 0, 0, $3, 10, 1, 1000000, $4)",
		testPolicy, []byte("k"), at5, at5+10e6); err != nil {
		t.Fatal(err)
	}
	// A take at +1s, behind the floor, waits in its insert.
	clock.Set(epoch.Add(time.Second))
	type result struct {
		d   sluice.Decision
		err error
	}
	done := make(chan result, 1)
	go func() {
		d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: l})
		done <- result{d, err}
	}()
	waitForLockWait(t, table)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	res := <-done
	// The function decides on the empty bucket stamped +5s: nothing has
	// refilled by then, and a token refills one second after it.
	want := sluice.Decision{Remaining: 0, RetryAfter: 5 * time.Second, ResetAfter: 14 * time.Second, Limit: l}
	if res.err != nil || res.d != want {
		t.Fatalf("Take at +1s after waiting for another session's insert, behind the floor = %+v, %v; want %+v", res.d, res.err, want)
	}
	if st := s.Stats(); st.InsertFirst != 1 || st.InsertFirstMisses != 1 {
		t.Errorf("Stats() = %+v; want InsertFirst 1, InsertFirstMisses 1", st)
	}
}

// clockedKey returns a store on an explicit clock that starts at epoch,
// whose every eligible take tries the insert first or none does
// (insertFirst), with at, which sets the clock to epoch + d, and take,
// which takes cost from the key "k" under l.
func clockedKey(t *testing.T, insertFirst bool, l sluice.Limit) (*pgstore.Store, func(d time.Duration), func(cost int64) (sluice.Decision, error)) {
	t.Helper()
	clock := sluicetest.NewClock(epoch)
	s := newStore(t, pgstore.Options{Now: clock.Now})
	pgstore.SetInsertFirst(s, insertFirst)
	at := func(d time.Duration) { clock.Set(epoch.Add(d)) }
	take := func(cost int64) (sluice.Decision, error) {
		return s.Take(context.Background(), sluice.Request{Policy: testPolicy, Key: "k", Cost: cost, Limit: l})
	}
	return s, at, take
}
