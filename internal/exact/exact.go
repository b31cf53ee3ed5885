// Package exact holds the small integer helpers that Sluice's exact
// arithmetic shares across packages.
package exact

// GCD returns the greatest common divisor of a and b; GCD(a, 0) is a.
func GCD(a, b uint64) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
