package memstore_test

import (
	"testing"

	"github.com/sluicehq/sluice/guard"
	"github.com/sluicehq/sluice/memstore"
)

// The in-memory store declares that it never blocks, so that guard calls it
// inline.
func TestNonBlocking(t *testing.T) {
	st, err := memstore.New(memstore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var s any = st
	nb, ok := s.(guard.NonBlocking)
	if !ok || !nb.NonBlocking() {
		t.Fatalf("*memstore.Store implements guard.NonBlocking: %v, answers %v; want true", ok, ok && nb.NonBlocking())
	}
}
