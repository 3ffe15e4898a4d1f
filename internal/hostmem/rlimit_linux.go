package hostmem

import "syscall"

// AddressSpaceLimit is RLIMIT_AS's soft limit (`ulimit -v`) in bytes; ok
// is false when there is none (RLIM_INFINITY) or it cannot be read.
func AddressSpaceLimit() (bytes int64, ok bool) {
	var rl syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_AS, &rl) != nil || rl.Cur == ^uint64(0) || rl.Cur > 1<<62 {
		return 0, false
	}
	return int64(rl.Cur), true
}
