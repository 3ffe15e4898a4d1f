package pinned

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"
)

// sysHugePageBytes is how much of mems the kernel backs with transparent
// huge pages now: the AnonHugePages of every mapping in /proc/self/smaps
// that overlaps one of them, capped at the overlap (the kernel may merge an
// arena's mapping with a neighbour).
func sysHugePageBytes(mems [][]byte) (int64, error) {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return 0, fmt.Errorf("pinned: huge pages: %w", err)
	}
	defer f.Close()
	var total, overlap int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if lo, hi, ok := smapsRange(line); ok {
			overlap = 0
			for _, m := range mems {
				a := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(m))))
				b := a + uint64(len(m))
				if s, e := max(a, lo), min(b, hi); s < e {
					overlap += int64(e - s)
				}
			}
			continue
		}
		if overlap > 0 && strings.HasPrefix(line, "AnonHugePages:") {
			fs := strings.Fields(line)
			kb, err := strconv.ParseInt(fs[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("pinned: huge pages: /proc/self/smaps line %q: %w", line, err)
			}
			total += min(kb<<10, overlap)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("pinned: huge pages: read /proc/self/smaps: %w", err)
	}
	return total, nil
}

// smapsRange parses a mapping's header ("7f12a0000000-7f12e0000000 rw-p ...").
func smapsRange(line string) (lo, hi uint64, ok bool) {
	sp := strings.IndexByte(line, ' ')
	if sp < 0 {
		return 0, 0, false
	}
	a, b, found := strings.Cut(line[:sp], "-")
	if !found {
		return 0, 0, false
	}
	lo, err1 := strconv.ParseUint(a, 16, 64)
	hi, err2 := strconv.ParseUint(b, 16, 64)
	return lo, hi, err1 == nil && err2 == nil
}
