//go:build linux

package pinned

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/strata-ai/strata/internal/units"
)

// sysMap maps sizeBytes of anonymous private memory starting at a multiple
// of alignBytes, outside the Go heap, advised for huge pages unless
// o.NoHugePages. With PopulateMapFlag the pages are faulted in here.
func sysMap(sizeBytes, alignBytes int64, o Options) ([]byte, error) {
	page := int64(unix.Getpagesize())
	slack := max(alignBytes-page, 0)
	const prot = unix.PROT_READ | unix.PROT_WRITE
	const flags = unix.MAP_PRIVATE | unix.MAP_ANONYMOUS
	raw, err := unix.MmapPtr(-1, 0, nil, uintptr(sizeBytes+slack), prot, flags)
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", units.FormatBytes(sizeBytes), err)
	}
	// Trim the slack so the mapping starts on the alignment.
	head := (alignBytes - int64(uintptr(raw))%alignBytes) % alignBytes
	start := unsafe.Add(raw, head)
	if head > 0 {
		_ = unix.MunmapPtr(raw, uintptr(head))
	}
	if tail := slack - head; tail > 0 {
		_ = unix.MunmapPtr(unsafe.Add(start, sizeBytes), uintptr(tail))
	}
	if o.Populate == PopulateMapFlag {
		// Replace the range in place with a populated mapping.
		if _, err := unix.MmapPtr(-1, 0, start, uintptr(sizeBytes), prot, flags|unix.MAP_FIXED|unix.MAP_POPULATE); err != nil {
			_ = unix.MunmapPtr(start, uintptr(sizeBytes))
			return nil, fmt.Errorf("mmap MAP_POPULATE %s: %w", units.FormatBytes(sizeBytes), err)
		}
	}
	mem := unsafe.Slice((*byte)(start), sizeBytes)
	if !o.NoHugePages {
		// Advice only: EINVAL when THP is compiled out is not a failure.
		_ = unix.Madvise(mem, unix.MADV_HUGEPAGE)
	}
	return mem, nil
}

// sysPopulate faults every page of mem in for writing, once.
func sysPopulate(mem []byte, m PopulateMethod) (PopulateMethod, error) {
	switch m {
	case PopulateMapFlag:
		return m, nil // done by sysMap
	case PopulateAuto, PopulateMadvise:
		err := unix.Madvise(mem, unix.MADV_POPULATE_WRITE)
		if err == nil {
			return PopulateMadvise, nil
		}
		if m == PopulateMadvise || !errors.Is(err, unix.EINVAL) {
			return m, fmt.Errorf("madvise(MADV_POPULATE_WRITE) %s: %w", units.FormatBytes(int64(len(mem))), err)
		}
		// EINVAL: kernel older than 5.14; touch instead.
	}
	touch(mem, int64(unix.Getpagesize()))
	return PopulateTouch, nil
}

func sysLock(mem []byte) error   { return unix.Mlock(mem) }
func sysUnlock(mem []byte) error { return unix.Munlock(mem) }

func sysUnmap(mem []byte) error {
	return unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(mem)), uintptr(len(mem)))
}

// lockNote explains an mlock outcome for totalBytes (err nil: it worked).
func lockNote(err error, totalBytes int64) string {
	var rl unix.Rlimit
	limit := "unknown"
	limitBytes := int64(-1)
	if unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl) == nil {
		if rl.Cur == unix.RLIM_INFINITY {
			limit = "unlimited"
		} else {
			limitBytes = int64(rl.Cur)
			limit = units.FormatBytes(limitBytes)
		}
	}
	total := units.FormatBytes(totalBytes)
	if err == nil {
		if limitBytes >= 0 && limitBytes < totalBytes {
			return fmt.Sprintf("mlock %s: ok (past RLIMIT_MEMLOCK %s by CAP_IPC_LOCK)", total, limit)
		}
		return fmt.Sprintf("mlock %s: ok (RLIMIT_MEMLOCK %s)", total, limit)
	}
	name := err.Error()
	var errno unix.Errno
	if errors.As(err, &errno) {
		name = unix.ErrnoName(errno)
	}
	if (errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.EPERM)) && !hasIPCLock() && limitBytes >= 0 && limitBytes < totalBytes {
		return fmt.Sprintf("mlock: %s: RLIMIT_MEMLOCK %s < %s requested and no CAP_IPC_LOCK "+
			"(raise it with `ulimit -l`, LimitMEMLOCK= or /etc/security/limits.conf, or grant CAP_IPC_LOCK); running unlocked",
			name, limit, total)
	}
	return fmt.Sprintf("mlock %s: %s (RLIMIT_MEMLOCK %s); running unlocked", total, name, limit)
}

// hasIPCLock reports whether the calling thread has CAP_IPC_LOCK in its
// effective set (capabilities are per thread on Linux).
func hasIPCLock() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if unix.Capget(&hdr, &data[0]) != nil {
		return false
	}
	return data[unix.CAP_IPC_LOCK/32].Effective&(1<<(unix.CAP_IPC_LOCK%32)) != 0
}

// thpMode reads the transparent huge page mode: "always", "madvise" or "never".
func thpMode() string {
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil {
		return "unavailable"
	}
	s := string(b)
	i, j := strings.IndexByte(s, '['), strings.IndexByte(s, ']')
	if i < 0 || j < i {
		return strings.TrimSpace(s)
	}
	return s[i+1 : j]
}

// lockLimit is RLIMIT_MEMLOCK's soft limit; false when unlimited or unknown.
func lockLimit() (int64, bool) {
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl) != nil || rl.Cur == unix.RLIM_INFINITY || rl.Cur > 1<<62 {
		return 0, false
	}
	return int64(rl.Cur), true
}
