package pinned

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// putBit marks a Buffer returned with Put; the low bits count its leases.
const putBit = int64(1) << 62

// Buffer is one allocation from a Pool: a page-aligned region of its
// mapping, which may span arenas.
// Each Get returns a new *Buffer, so a stale handle kept after Put is caught
// (Put twice, Lease or Bytes after Put panic) even when its memory has been
// handed out again.
type Buffer struct {
	pool        *Pool
	offsetBytes int64
	sizeBytes   int64 // as requested
	paddedBytes int64 // rounded up to the alignment: what the budget is charged
	purpose     string
	state       atomic.Int64 // leases | putBit
}

// Bytes is the buffer's memory: len is the size asked for, cap the size
// rounded up to the pool's alignment (so b[:cap(b)] is a valid O_DIRECT
// transfer). It must not be used after Put.
func (b *Buffer) Bytes() []byte {
	if b.state.Load()&putBit != 0 {
		panic(fmt.Sprintf("pinned: Bytes of a %q buffer already returned with Put", b.purpose))
	}
	if b.pool.closed.Load() {
		panic(fmt.Sprintf("pinned: Bytes of a %q buffer after the pool was closed", b.purpose))
	}
	return b.pool.heap[b.offsetBytes : b.offsetBytes+b.sizeBytes : b.offsetBytes+b.paddedBytes]
}

// Len is the size asked for in Get.
func (b *Buffer) Len() int64 { return b.sizeBytes }

// PaddedLen is the size rounded up to the alignment, charged to the budget.
func (b *Buffer) PaddedLen() int64 { return b.paddedBytes }

// Purpose is the purpose given to Get.
func (b *Buffer) Purpose() string { return b.purpose }

// Offset is the buffer's offset in the pool's mapping.
func (b *Buffer) Offset() int64 { return b.offsetBytes }

// Addr is the buffer's address, for code handing it to a kernel or a driver.
func (b *Buffer) Addr() uintptr {
	return uintptr(unsafe.Pointer(unsafe.SliceData(b.pool.heap))) + uintptr(b.offsetBytes)
}

// Lease marks the buffer as in flight (handed to I/O or DMA). Put panics
// until every Lease has been matched by a Release. Lease is safe to call
// from any goroutine; leasing a buffer already returned panics.
func (b *Buffer) Lease() {
	for {
		s := b.state.Load()
		if s&putBit != 0 {
			panic(fmt.Sprintf("pinned: Lease of a %q buffer already returned with Put", b.purpose))
		}
		if b.state.CompareAndSwap(s, s+1) {
			return
		}
	}
}

// Release ends one Lease, typically from the completion of the I/O.
func (b *Buffer) Release() {
	for {
		s := b.state.Load()
		if s&putBit != 0 {
			panic(fmt.Sprintf("pinned: Release of a %q buffer already returned with Put", b.purpose))
		}
		if s == 0 {
			panic(fmt.Sprintf("pinned: Release of a %q buffer without a Lease", b.purpose))
		}
		if b.state.CompareAndSwap(s, s-1) {
			return
		}
	}
}

// Leases is the number of outstanding leases.
func (b *Buffer) Leases() int { return int(b.state.Load() &^ putBit) }

// markPut flips the buffer to returned, panicking on a double Put or on
// outstanding leases.
func (b *Buffer) markPut() {
	for {
		s := b.state.Load()
		if s&putBit != 0 {
			panic(fmt.Sprintf("pinned: Put of a %q buffer (%d bytes) already returned with Put", b.purpose, b.sizeBytes))
		}
		if s != 0 {
			panic(fmt.Sprintf("pinned: Put of a %q buffer (%d bytes) with %d leases outstanding: its I/O has not completed", b.purpose, b.sizeBytes, s))
		}
		if b.state.CompareAndSwap(0, putBit) {
			return
		}
	}
}
