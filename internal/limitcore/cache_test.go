package limitcore

import (
	"strconv"
	"testing"
)

func TestCache(t *testing.T) {
	var c Cache[int, *string]
	builds := 0
	get := func(k int) *string {
		return c.Get(k, 2, func() *string { builds++; s := strconv.Itoa(k); return &s })
	}
	a := get(1)
	if b := get(1); a != b || *a != "1" || builds != 1 {
		t.Fatalf("second Get of a key built again (%d builds) or gave another value", builds)
	}
	get(2)
	x, y := get(3), get(3) // past Max: built each time, not kept
	if x == y || *x != "3" || builds != 4 {
		t.Fatalf("a key past Max was kept (%d builds)", builds)
	}
}
