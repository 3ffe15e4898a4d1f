package cpu

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu"
)

// parallel splits [0, n) into contiguous pieces of at least grain items,
// up to piecesPerWorker per worker, and runs fn on each from d.workers
// goroutines (the first the calling one) that take the next piece as they
// finish one. A worker the OS or the Go scheduler holds back (the tier
// store's I/O completions, cpuadam, the runtime's own threads share the
// cores) then delays the kernel by what it loses, not by a whole fixed
// share of it. Callers make each item's result independent of the split,
// so results depend neither on the worker count nor on which worker ran
// which piece. fn takes its temporaries from t (pool.go), which gives
// them back to the device when the piece ends: fn uses them only until it
// returns.
func (d *Device) parallel(n, grain int, fn func(lo, hi int, t *temps)) {
	if n <= 0 {
		return
	}
	pieces := min(d.workers*piecesPerWorker, max(1, n/max(1, grain)))
	if pieces <= 1 || d.workers <= 1 {
		t := d.takeTemps()
		fn(0, n, t)
		d.giveTemps(t)
		return
	}
	var next atomic.Int64
	run := func() {
		t := d.takeTemps()
		for {
			p := int(next.Add(1) - 1)
			if p >= pieces {
				break
			}
			t.reset()
			fn(p*n/pieces, (p+1)*n/pieces, t)
		}
		d.giveTemps(t)
	}
	var wg sync.WaitGroup
	for range min(d.workers, pieces) - 1 {
		wg.Go(run)
	}
	run()
	wg.Wait()
}

// piecesPerWorker is how many pieces parallel cuts per worker: more
// balance the workers when one is held back; fewer keep the GEMMs' packed
// panels reused across more tiles of a piece.
const piecesPerWorker = 4

// loadF32 returns elements [lo, hi) of b as float32: the memory itself for
// F32, a conversion into tmp (grown when short) otherwise. Kernels pass
// tmp from their temporaries (pool.go), long enough, so that it does not
// allocate.
func loadF32(b *Buffer, lo, hi int, tmp []float32) []float32 {
	switch b.DType() {
	case gpu.F32:
		return b.f32()[lo:hi]
	case gpu.BF16, gpu.F16:
		if cap(tmp) < hi-lo {
			tmp = make([]float32, hi-lo)
		}
		tmp = tmp[:hi-lo]
		dtype.Widen(b.DType(), tmp, b.u16()[lo:hi])
		return tmp
	case gpu.F64:
		if cap(tmp) < hi-lo {
			tmp = make([]float32, hi-lo)
		}
		tmp = tmp[:hi-lo]
		for i, v := range b.f64()[lo:hi] {
			tmp[i] = float32(v)
		}
		return tmp
	case gpu.I32:
		if cap(tmp) < hi-lo {
			tmp = make([]float32, hi-lo)
		}
		tmp = tmp[:hi-lo]
		for i, v := range b.i32()[lo:hi] {
			tmp[i] = float32(v)
		}
		return tmp
	}
	panic(fmt.Sprintf("gpu/cpu: unknown dtype %s", b.DType()))
}

// storeF32 writes v into b at element off, rounding once to b's dtype. It
// is a no-op when v is b's own F32 memory.
func storeF32(b *Buffer, off int, v []float32) {
	if len(v) == 0 {
		return
	}
	switch b.DType() {
	case gpu.F32:
		dst := b.f32()[off : off+len(v)]
		if &dst[0] != &v[0] {
			copy(dst, v)
		}
	case gpu.BF16, gpu.F16:
		dtype.Narrow(b.DType(), b.u16()[off:off+len(v)], v)
	case gpu.F64:
		dst := b.f64()[off : off+len(v)]
		for i, x := range v {
			dst[i] = float64(x)
		}
	case gpu.I32:
		dst := b.i32()[off : off+len(v)]
		for i, x := range v {
			dst[i] = int32(x)
		}
	default:
		panic(fmt.Sprintf("gpu/cpu: unknown dtype %s", b.DType()))
	}
}
