package cuda

import (
	"sync"
)

// scratchAlignBytes aligns every piece of a stream's scratch (cuMemAlloc's
// alignment, so that kernels may read it as any type).
//
// This is the ops' scratch. The rank-order collectives have their own,
// charged to the device budget and taken ahead by ReserveScratch
// (comm_rank.go); NCCL keeps its buffers itself.
const scratchAlignBytes = 256

// streamScratch is a stream's scratch memory: one block from the GPU's
// stream-ordered pool (cuMemAllocAsync), outside the device's budget (in
// Options.ReserveBytes), handed out front to back to the ops enqueued on
// the stream and reused from the front once every
// piece is given back. The stream's order makes the reuse safe: a kernel
// enqueued later on the same stream runs after every kernel that used the
// piece before. A request that does not fit gets a block of its own (freed
// stream-ordered after its op) and raises what the next block holds, so
// that a run whose ops repeat (a training step) takes device memory only
// until it has met its largest step: after that, no cuMemAllocAsync or
// cuMemFreeAsync.
type streamScratch struct {
	mu   sync.Mutex
	base uint64 // the block; 0: none yet
	size int64
	used int64 // bytes handed out from the block since it was last empty
	live int   // pieces of the block not given back
	want int64 // the most the stream's pieces have needed at once
}

// scratch takes n bytes of s's scratch and returns them with free (called
// after the op that uses them is enqueued). Called with the context
// current.
func (s *Stream) scratch(n int64) (uint64, func(), error) {
	sc := &s.sc
	n = (max(n, 1) + scratchAlignBytes - 1) / scratchAlignBytes * scratchAlignBytes
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.live == 0 && sc.want > sc.size {
		if err := sc.regrow(s); err != nil {
			return 0, nil, err
		}
	}
	if sc.used+n <= sc.size {
		p := sc.base + uint64(sc.used)
		sc.used += n
		sc.live++
		sc.want = max(sc.want, sc.used)
		return p, func() {
			sc.mu.Lock()
			if sc.live--; sc.live == 0 {
				sc.used = 0
			}
			sc.mu.Unlock()
		}, nil
	}
	sc.want = max(sc.want, sc.used+n)
	drv := s.dev.g.l.drv
	var p uint64
	if err := drv.check(drv.cuMemAllocAsync(&p, uint64(n), s.h), "cuMemAllocAsync %d bytes of scratch", n); err != nil {
		return 0, nil, err
	}
	s.dev.front.Driver.Allocs.Add(1)
	return p, func() {
		drv.cuMemFreeAsync(p, s.h)
		s.dev.front.Driver.Frees.Add(1)
	}, nil
}

// regrow replaces the block (empty) with one of want bytes, both in
// stream order. Called with sc.mu held and the context current.
func (sc *streamScratch) regrow(s *Stream) error {
	drv := s.dev.g.l.drv
	sc.release(s)
	var p uint64
	if err := drv.check(drv.cuMemAllocAsync(&p, uint64(sc.want), s.h), "cuMemAllocAsync %d bytes of scratch", sc.want); err != nil {
		return err
	}
	s.dev.front.Driver.Allocs.Add(1)
	sc.base, sc.size = p, sc.want
	return nil
}

// release frees the block in stream order (no piece of it is live).
// Called with the context current.
func (sc *streamScratch) release(s *Stream) {
	if sc.base == 0 {
		return
	}
	s.dev.g.l.drv.cuMemFreeAsync(sc.base, s.h)
	s.dev.front.Driver.Frees.Add(1)
	sc.base, sc.size, sc.used = 0, 0, 0
}
