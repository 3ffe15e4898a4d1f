package hostmem

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/strata-ai/strata/internal/units"
)

// StatusPath is where the kernel reports the process's address space
// (VmSize in /proc/self/status).
const StatusPath = "/proc/self/status"

// RunHeadroomBytes is the address space a run takes past what it plans
// (its pools, its devices' memory): each thread's stack (8 MiB) and the C
// library's malloc arena of each thread that calls into it (64 MiB
// reserved, untouched), and the Go heap's growth. Measured: `strata
// train`'s demonstration starts at 1.5 GB of VmSize (with about 80 MB
// resident) and peaks at 1.86 GB; under a limit that leaves it 130-200 MB
// it dies at random in the Go runtime (a thread or a heap arena it cannot
// reserve), under 250-300 MB it runs.
const RunHeadroomBytes = 512 << 20

// AddressSpace reads VmSize (bytes) from a status file (StatusPath, or a
// test's file): the address space the process holds, reserved or used.
// ok is false where it cannot be read (not Linux).
func AddressSpace(path string) (bytes int64, ok bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "VmSize:" {
			kib, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil || kib < 0 || kib > math.MaxInt64/1024 {
				return 0, false
			}
			return kib * 1024, true
		}
	}
	return 0, false
}

// AddressSpaceError is a run that cannot fit under RLIMIT_AS (`ulimit
// -v`). A Go program holds a GiB or more of address space it never
// touches (the runtime's heap index, the C library's per-thread arenas),
// so a limit that looks like plenty of RAM can leave no room: the run
// would die in the Go runtime, with its stack traces, at its first
// allocation past it.
type AddressSpaceError struct {
	What       string // what needs the room: "strata.host_budget 4 GiB (pinned host memory)", "train"
	NeedBytes  int64  // what it needs, RunHeadroomBytes included
	LimitBytes int64  // RLIMIT_AS's soft limit
	UsedBytes  int64  // VmSize when checked
}

func (e *AddressSpaceError) Error() string {
	least, fits := units.Add(e.UsedBytes, e.NeedBytes, 256<<20-1)
	raise := "raise the limit to at least " + units.FormatBytes(least&^(256<<20-1)) + fmt.Sprintf(" (`ulimit -v %d`)", least>>10&^(256<<10-1))
	if !fits {
		raise = "raise the limit"
	}
	head := fmt.Sprintf("%s of it for threads and the heap", units.FormatBytes(RunHeadroomBytes))
	if e.NeedBytes == RunHeadroomBytes {
		head = "for its threads and the heap"
	}
	return fmt.Sprintf("the address-space limit RLIMIT_AS (ulimit -v) is %s, and the process holds %s of it already "+
		"(VmSize: the Go runtime and the C library reserve a GiB or more they never touch), but %s needs %s more (%s): "+
		"%s or lift it (`ulimit -v unlimited`); to cap the memory a run uses, use a cgroup (systemd-run -p MemoryMax=, "+
		"docker run --memory) or GOMEMLIMIT, which count memory used, not address space reserved",
		units.FormatBytes(e.LimitBytes), units.FormatBytes(e.UsedBytes), e.What, units.FormatBytes(e.NeedBytes), head, raise)
}

// CheckAddressSpace refuses what (needBytes more, and RunHeadroomBytes)
// when RLIMIT_AS cannot give it beside the address space the process
// holds: an *AddressSpaceError. With no limit, or where the limit or
// VmSize cannot be read (not Linux), it checks nothing.
func CheckAddressSpace(what string, needBytes int64) error {
	limit, ok := AddressSpaceLimit()
	if !ok {
		return nil
	}
	used, ok := AddressSpace(StatusPath)
	if !ok {
		return nil
	}
	return checkAddressSpace(what, needBytes, limit, used)
}

func checkAddressSpace(what string, needBytes, limitBytes, usedBytes int64) error {
	need, fits := units.Add(max(needBytes, 0), RunHeadroomBytes)
	if fits && usedBytes <= limitBytes && need <= limitBytes-usedBytes {
		return nil
	}
	if !fits {
		need = math.MaxInt64
	}
	return &AddressSpaceError{What: what, NeedBytes: need, LimitBytes: limitBytes, UsedBytes: usedBytes}
}
