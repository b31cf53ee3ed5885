package pgstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/pgstore"
)

// lockHold is how long TestLockWaits holds a bucket's lock once a take
// waits for it.
const lockHold = 100 * time.Millisecond

// TestLockWaits: a take that finds its bucket locked by another
// transaction (a decision, an insert of the same new key) waits for it,
// decides, and adds that wait to Stats: LockWaits by one, LockWaitSeconds
// by at least the time the lock was held after the take started waiting,
// and by no more than the take took. Takes that find their bucket free, or
// missing, add nothing; so does a take whose bucket a sweep is deleting,
// which waits for the delete to commit and then creates the bucket, full
// (the price of telling it from a missing bucket would be a second index
// probe on every new key: docs/postgres.md). A take that tries the insert
// first (docs/postgres.md, "Takes of new keys") and waits there for
// another session inserting the same key does not count that wait either:
// the plain insert reports no time.
func TestLockWaits(t *testing.T) {
	for _, first := range []bool{false, true} {
		t.Run(fmt.Sprintf("insert first %v", first), func(t *testing.T) { testLockWaits(t, first) })
	}
}

func testLockWaits(t *testing.T, insertFirst bool) {
	tests := []struct {
		name string
		// hold takes the bucket of key "k" (present unless missing is
		// set) in tx, as another session would.
		hold    string
		missing bool
		// uncounted is set when the wait is not counted in Stats, and
		// uncountedFirst when it is not counted by a take that tries
		// the insert first.
		uncounted, uncountedFirst bool
	}{
		{"row locked", "SELECT 1 FROM %s WHERE key = $1 FOR UPDATE", false, false, false},
		{"row updated", "UPDATE %s SET stamp = stamp WHERE key = $1", false, false, false},
		{"row being deleted", "DELETE FROM %s WHERE key = $1", false, true, true},
		{"new key being inserted", "INSERT INTO %s (policy, key, tokens, frac, stamp, capacity, rate_tokens, period_us, full_at) VALUES ('" + testPolicy + "', $1, 10, 0, 0, 10, 1, 1000000, 0)", true, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			s, table := newStoreTable(t, pgstore.Options{StatementTimeout: time.Minute, LockTimeout: time.Minute})
			pgstore.SetInsertFirst(s, insertFirst)
			r := sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: testLimit}
			if !tt.missing {
				// Creating the bucket, then taking from it unhindered,
				// waits for nothing.
				for range 2 {
					if _, err := s.Take(ctx, r); err != nil {
						t.Fatal(err)
					}
				}
			}
			if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "other", Cost: 1, Limit: testLimit}); err != nil {
				t.Fatal(err)
			}
			if st := s.Stats(); st.LockWaits != 0 || st.LockWaitSeconds != 0 || st.LockTimeouts != 0 {
				t.Fatalf("after takes on free and missing buckets, Stats() = %+v; want no lock waits", st)
			}

			tx, err := testPool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, fmt.Sprintf(tt.hold, qualified(table)), []byte("k")); err != nil {
				t.Fatal(err)
			}
			type result struct {
				d       sluice.Decision
				err     error
				elapsed time.Duration
			}
			done := make(chan result, 1)
			go func() {
				start := time.Now()
				d, err := s.Take(ctx, r)
				done <- result{d, err, time.Since(start)}
			}()
			waitForLockWait(t, table)
			time.Sleep(lockHold)
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			res := <-done
			if res.err != nil || !res.d.Allowed {
				t.Fatalf("Take(%+v) after waiting = %+v, %v; want allowed", r, res.d, res.err)
			}
			if res.elapsed < lockHold {
				t.Errorf("Take(%+v) returned after %v; want it to wait for the other transaction, at least %v", r, res.elapsed, lockHold)
			}
			st := s.Stats()
			if tt.uncounted || insertFirst && tt.uncountedFirst {
				if want := testLimit.Capacity - 1; res.d.Remaining != want {
					t.Errorf("Take(%+v) after its bucket was deleted = %+v; want a new, full bucket (remaining %d)", r, res.d, want)
				}
				if st.LockWaits != 0 || st.LockWaitSeconds != 0 || st.LockTimeouts != 0 {
					t.Errorf("after a take that waited for a delete, Stats() = %+v; want no lock waits", st)
				}
				return
			}
			if st.LockWaits != 1 || st.LockTimeouts != 0 {
				t.Errorf("after one take that waited, Stats() = %+v; want LockWaits 1, LockTimeouts 0", st)
			}
			if lo, hi := lockHold.Seconds(), res.elapsed.Seconds(); st.LockWaitSeconds < lo || st.LockWaitSeconds > hi {
				t.Errorf("Stats().LockWaitSeconds = %v after a take that waited at least %v and took %v; want between them", st.LockWaitSeconds, lockHold, res.elapsed)
			}
		})
	}
}

// waitForLockWait returns once a session waits for a lock on a row of
// table (a take of the store), and fails t if none does within 10s.
func waitForLockWait(t *testing.T, table string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		err := testPool.QueryRow(context.Background(),
			"SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database() AND (query LIKE $1 OR query LIKE $2)",
			"%"+pgx.Identifier{testSchema, table + "_take"}.Sanitize()+"%",
			"%INSERT INTO "+qualified(table)+" AS b%").Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no take waited for a lock on %s within 10s", table)
		}
		time.Sleep(time.Millisecond)
	}
}
