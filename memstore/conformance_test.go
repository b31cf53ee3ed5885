package memstore_test

import (
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

func TestConformance(t *testing.T) {
	sluicetest.Run(t, sluicetest.Suite{
		New: func(t *testing.T, o sluicetest.StoreOptions) sluice.Store {
			return newStore(t, memstore.Options{
				Now:           o.Now,
				OnLimitChange: o.OnLimitChange,
				RequestIDTTL:  o.RequestIDTTL,
				SweepInterval: -1, // the suite sweeps through Sweep, at its clock's readings
			})
		},
		Sweep: func(st sluice.Store) { st.(*memstore.Store).SweepNow() },
	})
}
