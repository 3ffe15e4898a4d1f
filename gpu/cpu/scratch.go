package cpu

import (
	"sync"
	"unsafe"
)

// scratch is one rank's collective scratch: the buffers its rounds read
// their inputs into, kept after each round for the next. A round takes the
// smallest kept buffer that holds what it needs; when none does, one kept
// buffer too small is dropped and a larger one made, each counted on the
// rank's device as a driver free and allocation (they are the device
// memory a GPU backend would take for the collective). A run whose
// collectives repeat (a training step) so allocates only the first time it
// meets a larger one, and keeps as many buffers as rounds of the rank run
// at once (one per stream that issues collectives). Safe for concurrent
// use.
type scratch struct {
	dev  *Device
	mu   sync.Mutex
	kept [][]byte
}

// get returns a buffer of n bytes (8-byte aligned; nil for 0), to be given
// back with put once nothing reads it.
func (s *scratch) get(n int) []byte {
	if n == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	best := -1
	for i, b := range s.kept {
		if cap(b) >= n && (best < 0 || cap(b) < cap(s.kept[best])) {
			best = i
		}
	}
	if best < 0 && len(s.kept) > 0 {
		// Replace the largest buffer that is too small: the rank's rounds
		// run one at a time, so one buffer of the largest size serves them.
		big := 0
		for i, b := range s.kept {
			if cap(b) > cap(s.kept[big]) {
				big = i
			}
		}
		s.kept = append(s.kept[:big], s.kept[big+1:]...)
		s.dev.front.Driver.Frees.Add(1)
	}
	if best < 0 {
		s.dev.front.Driver.Allocs.Add(1)
		words := make([]uint64, (n+7)/8)
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(words))), 8*len(words))[:n]
	}
	b := s.kept[best]
	s.kept = append(s.kept[:best], s.kept[best+1:]...)
	return b[:n]
}

// put keeps b for later rounds.
func (s *scratch) put(b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kept = append(s.kept, b[:cap(b)])
}

// f32View is the first n float32 of b (8-byte aligned, from get).
func f32View(b []byte, n int) []float32 {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), n)[:n:n]
}

// f64View is the first n float64 of b (8-byte aligned, from get).
func f64View(b []byte, n int) []float64 {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*float64)(unsafe.Pointer(unsafe.SliceData(b))), n)[:n:n]
}

// u16View is the first n uint16 of b.
func u16View(b []byte, n int) []uint16 {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(b))), n)[:n:n]
}
