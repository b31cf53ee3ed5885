//go:build !unix

package loadgen

import "time"

// CPUTime is not measured here: the summary then leaves the generator's
// CPU time out.
func CPUTime() (time.Duration, bool) { return 0, false }
