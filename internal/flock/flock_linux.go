package flock

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// TryLock takes the exclusive lock of fd's file without waiting. When
// another open file holds it the error matches ErrHeld and names the
// holder ("held by pid 1234").
func TryLock(fd int) error {
	err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, syscall.EWOULDBLOCK):
		return fmt.Errorf("%w (%s)", ErrHeld, Holder(fd))
	}
	return fmt.Errorf("flock: %w", err)
}

// Holder names the process holding a flock on fd's file, from /proc/locks
// ("1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"): "held by pid 1234",
// or "holder unknown".
func Holder(fd int) string {
	var st syscall.Stat_t
	if syscall.Fstat(fd, &st) != nil {
		return "holder unknown"
	}
	fh, err := os.Open("/proc/locks")
	if err != nil {
		return "holder unknown"
	}
	defer fh.Close()
	want := ":" + strconv.FormatUint(st.Ino, 10)
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 6 && f[1] == "FLOCK" && strings.HasSuffix(f[5], want) {
			return "held by pid " + f[4]
		}
	}
	return "holder unknown"
}

// unlock releases fd's lock (the tests; a run's lock goes with its close).
func unlock(fd int) { syscall.Flock(fd, syscall.LOCK_UN) }
