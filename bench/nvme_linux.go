package bench

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// mapAligned maps page-aligned anonymous memory outside the Go heap, faulted
// in up front, for O_DIRECT buffers.
func mapAligned(n int64) ([]byte, error) {
	b, err := unix.Mmap(-1, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("bench: mmap %d bytes: %w", n, err)
	}
	return b, nil
}

func unmapAligned(b []byte) { unix.Munmap(b) }

// cpuTime is user + system CPU time of the process (getrusage RUSAGE_SELF).
func cpuTime() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
