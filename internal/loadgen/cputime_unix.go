//go:build unix

package loadgen

import (
	"syscall"
	"time"
)

// CPUTime returns the user and system CPU time of this process, and
// false where it cannot be read.
func CPUTime() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
