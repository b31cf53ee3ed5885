package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/pgstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// TestConformance runs the shared suite with explicit time at the store's
// tick of 1µs. The background sweeper is off: the suite sweeps by itself
// (Sweep), at the store's clock reading, between the steps of its model
// tests and beside takes whose readings are stale.
//
// It runs three times: with the store choosing whether a take tries the
// insert of a new bucket first (docs/postgres.md, "Takes of new keys"),
// with every eligible take trying it, and with none.
func TestConformance(t *testing.T) {
	for _, mode := range []string{"adaptive", "insert first", "function only"} {
		t.Run(mode, func(t *testing.T) { testConformance(t, mode) })
	}
}

func testConformance(t *testing.T, mode string) {
	sluicetest.Run(t, sluicetest.Suite{
		New: func(t *testing.T, o sluicetest.StoreOptions) sluice.Store {
			s := newStore(t, pgstore.Options{
				Now:           o.Now,
				OnLimitChange: o.OnLimitChange,
				RequestIDTTL:  o.RequestIDTTL,
				SweepInterval: -1,
				// Sweeps of the suite's few buckets: no pause.
				SweepPauseRatio: -1,
				// The suite checks exact counts, not latency: a hot key's
				// queue may wait for many commits.
				StatementTimeout: time.Minute,
				LockTimeout:      time.Minute,
			})
			if mode != "adaptive" {
				pgstore.SetInsertFirst(s, mode == "insert first")
			}
			return s
		},
		Sweep: func(st sluice.Store) {
			if _, err := st.(*pgstore.Store).Sweep(context.Background()); err != nil {
				t.Errorf("Sweep: %v", err)
			}
		},
		Tick:           time.Microsecond,
		Workers:        16,
		TakesPerWorker: 100,
	})
}
