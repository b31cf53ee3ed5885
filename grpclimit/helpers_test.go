package grpclimit_test

import (
	"testing"

	"github.com/sluicehq/sluice/memstore"
)

// newMem returns a memstore.Store configured by o, closed when the test
// ends.
func newMem(tb testing.TB, o memstore.Options) *memstore.Store {
	tb.Helper()
	mem, err := memstore.New(o)
	if err != nil {
		tb.Fatalf("memstore.New(%+v): %v", o, err)
	}
	tb.Cleanup(func() { mem.Close() })
	return mem
}
