package redisstore

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/sluicetest"
)

// TestConformance runs the conformance suite with explicit time at a tick
// of 1µs against the standalone server and the private cluster: every
// decision must equal the reference model's, and every limit the store
// refuses (CheckLimit) must be refused with sluice.ErrInvalidLimit. It runs
// with decisions sent one by one and in pipelines (Options.Batch).
func TestConformance(t *testing.T) {
	for name, c := range topologies(t) {
		for _, batch := range batchModes {
			t.Run(fmt.Sprintf("%s/batch=%d", name, batch), func(t *testing.T) {
				sluicetest.Run(t, sluicetest.Suite{
					New: func(t *testing.T, o sluicetest.StoreOptions) sluice.Store {
						return newStore(t, c, Options{
							Now:           o.Now,
							OnLimitChange: o.OnLimitChange,
							RequestIDTTL:  o.RequestIDTTL,
							// The suite's clock jumps by years and steps back;
							// keys must outlive the test in real time.
							MinTTL: time.Hour,
							Batch:  batch,
						})
					},
					Tick:     time.Microsecond,
					Supports: checkLimit,
					// 64 workers as in production-like contention; fewer takes
					// than in memory, each being a round trip.
					Workers:        64,
					TakesPerWorker: 100,
				})
			})
		}
	}
}
