// Package hostmem reads how much memory the host can still give a process
// (MemAvailable in /proc/meminfo) and how much address space RLIMIT_AS
// leaves it (`ulimit -v`, against VmSize in /proc/self/status), for the
// checks that refuse a budget the host or the limit cannot hold before
// anything is allocated: the CPU backend's devices (gpu/cpu), the pinned
// pools (pinned, engine) and a run's start (cmd).
package hostmem

import (
	"math"
	"os"
	"strconv"
	"strings"
)

// MeminfoPath is where the kernel reports the host's available memory.
const MeminfoPath = "/proc/meminfo"

// Available reads MemAvailable (bytes) from a meminfo file (MeminfoPath, or
// a test's file). ok is false where it cannot be read or parsed (not
// Linux): the callers then check nothing.
func Available(path string) (bytes int64, ok bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "MemAvailable:" {
			kib, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil || kib < 0 || kib > math.MaxInt64/1024 {
				return 0, false
			}
			return kib * 1024, true
		}
	}
	return 0, false
}
