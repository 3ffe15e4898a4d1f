package bench

import (
	"errors"
	"time"

	"golang.org/x/sys/unix"
)

// processGone reports whether no process has pid (kill(pid, 0) says ESRCH).
func processGone(pid int) bool { return errors.Is(unix.Kill(pid, 0), unix.ESRCH) }

// cpuTime is user + system CPU time of the process (getrusage RUSAGE_SELF).
func cpuTime() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
