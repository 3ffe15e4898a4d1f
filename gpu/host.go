package gpu

import (
	"fmt"
	"sort"
	"sync"
	"unsafe"
)

// HostRegistry is the host memory registered with one backend's devices
// (gpu/cuda: page-locked with cuMemHostRegister): ranges of addresses that
// the fronts of the backend's devices look up for every host copy
// (Front.HostCopy), so that the link counters say how many bytes moved
// from or to pageable memory. It is a pinned.Registrar (Register and
// Unregister by arena), the CPU backend's own: there, registering only
// records the range. A nil *HostRegistry holds nothing. Safe for
// concurrent use.
type HostRegistry struct {
	mu     sync.RWMutex
	ranges []hostRange // sorted by start, disjoint
}

type hostRange struct{ start, end uintptr }

// NewHostRegistry returns an empty registry.
func NewHostRegistry() *HostRegistry { return &HostRegistry{} }

func rangeOf(mem []byte) hostRange {
	p := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	return hostRange{p, p + uintptr(len(mem))}
}

// Register records mem (arenaIndex names it in errors). A range that
// overlaps one registered is refused.
func (r *HostRegistry) Register(arenaIndex int, mem []byte) error {
	if len(mem) == 0 {
		return nil
	}
	h := rangeOf(mem)
	r.mu.Lock()
	defer r.mu.Unlock()
	i := sort.Search(len(r.ranges), func(i int) bool { return r.ranges[i].end > h.start })
	if i < len(r.ranges) && r.ranges[i].start < h.end {
		return fmt.Errorf("gpu: register arena %d: overlaps memory registered before", arenaIndex)
	}
	r.ranges = append(r.ranges, hostRange{})
	copy(r.ranges[i+1:], r.ranges[i:])
	r.ranges[i] = h
	return nil
}

// Unregister forgets mem, registered before as one range.
func (r *HostRegistry) Unregister(arenaIndex int, mem []byte) error {
	if len(mem) == 0 {
		return nil
	}
	h := rangeOf(mem)
	r.mu.Lock()
	defer r.mu.Unlock()
	i := sort.Search(len(r.ranges), func(i int) bool { return r.ranges[i].start >= h.start })
	if i == len(r.ranges) || r.ranges[i] != h {
		return fmt.Errorf("gpu: unregister arena %d: not registered", arenaIndex)
	}
	r.ranges = append(r.ranges[:i], r.ranges[i+1:]...)
	return nil
}

// Contains says whether mem lies inside registered memory: one range, or
// ranges that follow each other without a gap (a pinned pool's arenas are
// one mapping registered in pieces, and a buffer may span them).
func (r *HostRegistry) Contains(mem []byte) bool {
	if r == nil || len(mem) == 0 {
		return false
	}
	h := rangeOf(mem)
	r.mu.RLock()
	defer r.mu.RUnlock()
	i := sort.Search(len(r.ranges), func(i int) bool { return r.ranges[i].end > h.start })
	if i == len(r.ranges) || r.ranges[i].start > h.start {
		return false
	}
	for ; r.ranges[i].end < h.end; i++ {
		if i+1 == len(r.ranges) || r.ranges[i+1].start != r.ranges[i].end {
			return false
		}
	}
	return true
}

// Split cuts mem at the boundaries of the registered ranges it spans, so
// that a backend whose driver registered each range on its own copies
// each piece from one registration. Memory outside the registry is one
// piece.
func (r *HostRegistry) Split(mem []byte) [][]byte {
	if r == nil || len(mem) == 0 {
		return [][]byte{mem}
	}
	h := rangeOf(mem)
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out [][]byte
	i := sort.Search(len(r.ranges), func(i int) bool { return r.ranges[i].end > h.start })
	for ; i < len(r.ranges) && r.ranges[i].end < h.end && r.ranges[i].start <= h.start; i++ {
		n := r.ranges[i].end - h.start
		out = append(out, mem[:n:n])
		mem = mem[n:]
		h.start += n
	}
	return append(out, mem)
}

// Bytes is the registered memory in all.
func (r *HostRegistry) Bytes() int64 {
	if r == nil {
		return 0
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	var n int64
	for _, h := range r.ranges {
		n += int64(h.end - h.start)
	}
	return n
}
