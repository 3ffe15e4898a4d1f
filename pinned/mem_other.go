//go:build !linux

package pinned

import (
	"errors"
	"unsafe"
)

// Outside Linux the arenas are plain Go memory: not locked, no huge-page
// advice, unmapped by the garbage collector once the Pool is dropped.

var errNotLinux = errors.New("not Linux")

func sysMap(sizeBytes, alignBytes int64, o Options) ([]byte, error) {
	b := make([]byte, sizeBytes+alignBytes)
	head := (alignBytes - int64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))%alignBytes) % alignBytes
	return b[head : head+sizeBytes : head+sizeBytes], nil
}

func sysPopulate(mem []byte, m PopulateMethod) (PopulateMethod, error) {
	touch(mem, minAlignBytes)
	return PopulateTouch, nil
}

func sysLock(mem []byte) error   { return errNotLinux }
func sysUnlock(mem []byte) error { return nil }
func sysUnmap(mem []byte) error  { return nil }

func lockNote(err error, totalBytes int64) string {
	return "not Linux: plain Go memory, not locked and not advised for huge pages; running unlocked"
}

func hasIPCLock() bool { return false }

func thpMode() string { return "n/a (not Linux)" }

func sysHugePageBytes([][]byte) (int64, error) { return 0, errNotLinux }

func lockLimit() (int64, bool) { return 0, false }
