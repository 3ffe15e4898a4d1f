package cpu

import "sync"

// Kernel temporaries. A kernel's pieces (parallel) need fp32 memory of
// their own: widened bf16 rows, GEMM panels, attention tiles, elementwise
// results. Made afresh for every call they were about 240 MB of Go heap a
// step of gpt2 (batch 1 × 128 tokens), and in a fresh process every page
// of that garbage is a minor fault. So each device keeps them: a piece
// takes a scratch object from one of the device's free lists, uses it
// while it runs, and gives it back when it ends (nothing reads a piece's
// temporaries after it returns); the object keeps its buffers, grown to
// the largest a piece has needed, for the next piece. The free lists hold
// as many objects as pieces ran at once (the workers of the device's busy
// streams), so a training step allocates only where one needs more than
// any before it.
//
// These are not device memory and are not counted as such: they stand for
// a GPU kernel's registers and shared memory. The collectives' scratch
// (scratch.go) is, and is counted.

// keep is a free list of scratch objects of type T, each keeping its
// buffers between uses. Safe for concurrent use.
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

// temps is one piece's fp32 temporaries: the i-th get since the last
// reset returns the i-th kept buffer, grown when short. A buffer's
// contents are left from its last use (not zero): callers write before
// they read, or clear.
type temps struct {
	bufs [][]float32
	next int
}

// get returns n float32 of the next kept buffer, valid until the next
// reset.
func (t *temps) get(n int) []float32 {
	if t.next == len(t.bufs) {
		t.bufs = append(t.bufs, nil)
	}
	b := t.bufs[t.next]
	if cap(b) < n {
		b = make([]float32, n)
		t.bufs[t.next] = b
	}
	t.next++
	return b[:n:n]
}

// reset makes every buffer free for the next gets.
func (t *temps) reset() { t.next = 0 }

// takeTemps returns temporaries for the calling goroutine's use, to be
// given back with giveTemps.
func (d *Device) takeTemps() *temps { return d.temps.get() }

// giveTemps gives t back; nothing reads its buffers any more.
func (d *Device) giveTemps(t *temps) {
	t.reset()
	d.temps.put(t)
}
