package cpu

import (
	"math/bits"
	"sync"
)

// Kernel temporaries. A kernel's pieces (parallel) need fp32 memory of
// their own: widened bf16 rows, GEMM panels, attention tiles, elementwise
// results. Made afresh for every call they would be hundreds of MB of
// garbage a step of gpt2 (batch 1 × 128 tokens), and in a fresh process
// every page of garbage costs a minor fault. So each device keeps them: a
// piece takes its buffers from the device's kept ones (bufs, a free list
// per power-of-two capacity) and gives them back when it ends; nothing
// reads a piece's temporaries after it returns. A class holds as many
// buffers as were in use at once, whichever kernels used them, so a
// training step allocates only where it holds more at once than any step
// before it. The objects that hand the buffers out (temps, attnWork,
// packedScratch) and the embedding gradient's slot tables are kept on free
// lists (keep) too.
//
// These are not device memory and are not counted as such: they stand for
// a GPU kernel's registers and shared memory. The collectives' scratch
// (scratch.go) is, and is counted.

// keep is a free list of objects of type T, each kept with what it holds
// between uses (a temps its list of held buffers, a slots its map). Safe
// for concurrent use.
type keep[T any] struct {
	mu   sync.Mutex
	free []*T
}

// get returns a kept object, or a new one when none is free.
func (k *keep[T]) get() *T {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := len(k.free)
	if n == 0 {
		return new(T)
	}
	t := k.free[n-1]
	k.free[n-1] = nil
	k.free = k.free[:n-1]
	return t
}

// put keeps t for a later get; the caller no longer uses t or any buffer
// it handed out.
func (k *keep[T]) put(t *T) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.free = append(k.free, t)
}

// bufs is a device's kept fp32 buffers, by capacity: class c holds
// buffers of 2^c values. A buffer goes back to its class when its user is
// done, so that a class holds as many buffers as were in use at once, of
// one size, whichever kernels used them. Safe for concurrent use.
type bufs struct {
	mu   sync.Mutex
	free [64][][]float32
}

// class is the class of the buffers that hold n values.
func class(n int) int { return bits.Len(uint(max(n, 1) - 1)) }

// get returns a buffer of at least n values (its capacity its class's).
func (p *bufs) get(n int) []float32 {
	c := class(n)
	p.mu.Lock()
	if k := len(p.free[c]); k > 0 {
		b := p.free[c][k-1]
		p.free[c][k-1] = nil
		p.free[c] = p.free[c][:k-1]
		p.mu.Unlock()
		return b
	}
	p.mu.Unlock()
	return make([]float32, 1<<c)
}

// put keeps b for a later get (nil: nothing). A buffer not from get (one
// a kernel grew itself) joins the largest class it holds.
func (p *bufs) put(b []float32) {
	if cap(b) == 0 {
		return
	}
	c := bits.Len(uint(cap(b))) - 1
	p.mu.Lock()
	p.free[c] = append(p.free[c], b[:cap(b)])
	p.mu.Unlock()
}

// temps is one piece's fp32 temporaries, from the device's kept buffers
// (bufs) and given back to them by reset. A buffer's contents are left
// from its last use (not zero): callers write before they read, or clear.
type temps struct {
	from *bufs
	held [][]float32
}

// get returns n float32 of a kept buffer, valid until the next reset.
func (t *temps) get(n int) []float32 {
	b := t.from.get(n)
	t.held = append(t.held, b)
	return b[:n:n]
}

// reset gives every buffer back.
func (t *temps) reset() {
	for i, b := range t.held {
		t.from.put(b)
		t.held[i] = nil
	}
	t.held = t.held[:0]
}

// takeTemps returns temporaries for the calling goroutine's use, to be
// given back with giveTemps.
func (d *Device) takeTemps() *temps {
	t := d.temps.get()
	t.from = &d.bufs
	return t
}

// giveTemps gives t and its buffers back; nothing reads them any more.
func (d *Device) giveTemps(t *temps) {
	t.reset()
	d.temps.put(t)
}
