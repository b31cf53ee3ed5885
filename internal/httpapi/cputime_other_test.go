//go:build !unix

package httpapi

import "time"

// cpuTime reports false: the process's CPU time is not read here.
func cpuTime() (time.Duration, bool) { return 0, false }
