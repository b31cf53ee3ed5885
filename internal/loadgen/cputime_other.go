//go:build !unix

package loadgen

import "time"

// cpuTime is not measured here: the summary then leaves the generator's
// CPU time out.
func cpuTime() (time.Duration, bool) { return 0, false }
