package pgstore_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/pgstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// TestConformance runs the shared suite with explicit time at the store's
// tick of 1µs. The sweeper is off: the suite compares with a model that
// keeps every bucket.
func TestConformance(t *testing.T) {
	sluicetest.Run(t, sluicetest.Suite{
		New: func(t *testing.T, o sluicetest.StoreOptions) sluice.Store {
			return newStore(t, pgstore.Options{
				Now:           o.Now,
				OnLimitChange: o.OnLimitChange,
				RequestIDTTL:  o.RequestIDTTL,
				SweepInterval: -1,
				// The suite checks exact counts, not latency: a hot key's
				// queue may wait for many commits.
				StatementTimeout: time.Minute,
				LockTimeout:      time.Minute,
			})
		},
		Tick:           time.Microsecond,
		Workers:        16,
		TakesPerWorker: 100,
	})
}
