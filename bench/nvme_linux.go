package bench

import (
	"time"

	"golang.org/x/sys/unix"
)

// cpuTime is user + system CPU time of the process (getrusage RUSAGE_SELF).
func cpuTime() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
