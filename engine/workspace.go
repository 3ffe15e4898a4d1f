package engine

import (
	"fmt"

	"github.com/strata-ai/strata/gpu"
)

// The workspace of a rank: the device buffers a step uses for a while and
// gives back (gathered chunks, gradient buckets and their reduce shards,
// the gradient shards bound for the tier store) are taken at New, sized
// from the layout, as rings of slots. A step takes a slot and gives it
// back with the event of its last use; the next holder's first writer
// waits for that event on its own stream (a stream wait, not a host wait),
// so a step allocates and frees no device memory: on a GPU a free waits
// for the whole device to go idle, which defeats prefetch and, with the
// collectives' stream waits, can hang (gpu/cuda/README.md).

// ring is one purpose's slots on one device (tagged gpu.Workspace and the
// purpose, as the allocations they replace were).
type ring struct {
	dev   gpu.Device
	tag   gpu.Tag
	dt    gpu.DType
	slots []gpu.Buffer
	free  []int       // slot indices not held
	after []gpu.Event // per slot: the last use by its previous holder; nil: none (or complete)
}

// newRing allocates one slot per element count of sizes.
func newRing(dev gpu.Device, purpose string, dt gpu.DType, sizes ...int) (*ring, error) {
	g := &ring{dev: dev, tag: gpu.Tag{Kind: gpu.Workspace, Purpose: purpose}, dt: dt}
	for _, n := range sizes {
		if _, err := g.grow(n); err != nil {
			g.release()
			return nil, err
		}
	}
	g.free = g.free[:0]
	for i := len(g.slots) - 1; i >= 0; i-- {
		g.free = append(g.free, i)
	}
	return g, nil
}

// grow adds a slot of n elements (held by the caller) and returns its index.
func (g *ring) grow(n int) (int, error) {
	b, err := g.dev.Alloc(n, g.dt, g.tag)
	if err != nil {
		return 0, err
	}
	g.slots = append(g.slots, b)
	g.after = append(g.after, nil)
	return len(g.slots) - 1, nil
}

// take returns a free slot of at least n elements (the smallest), its
// buffer's first n elements, and the event its first writer must wait
// for (nil: none). When no free slot holds n elements (the access order
// needs more than the layout planned for) it adds one: a device
// allocation, which fails as Alloc does, and the slot stays for the next
// steps.
func (g *ring) take(n int) (int, gpu.Buffer, gpu.Event, error) {
	best := -1
	for k, i := range g.free {
		if g.slots[i].Len() >= n && (best < 0 || g.slots[i].Len() < g.slots[g.free[best]].Len()) {
			best = k
		}
	}
	if best < 0 {
		i, err := g.grow(n)
		if err != nil {
			return 0, nil, nil, err
		}
		return i, g.slots[i].Slice(0, n), nil, nil
	}
	i := g.free[best]
	g.free = append(g.free[:best], g.free[best+1:]...)
	after := g.after[i]
	g.after[i] = nil
	return i, g.slots[i].Slice(0, n), after, nil
}

// put gives slot i back; after is its last use (nil: complete).
func (g *ring) put(i int, after gpu.Event) {
	for _, k := range g.free {
		if k == i {
			panic(fmt.Sprintf("engine: %s slot %d given back twice", g.tag.Purpose, i))
		}
	}
	g.after[i] = after
	g.free = append(g.free, i)
}

// slot is slot i's whole buffer (the failed step's scratch).
func (g *ring) slot(i int) gpu.Buffer { return g.slots[i] }

// settle forgets the slots' last uses (the streams have completed).
func (g *ring) settle() {
	if g != nil {
		clear(g.after)
	}
}

// release frees every slot (the streams have completed; none is held).
func (g *ring) release() {
	if g == nil {
		return
	}
	for _, b := range g.slots {
		g.dev.Free(b)
	}
	g.slots, g.free, g.after = nil, nil, nil
}

// rings are a rank's workspace: nil where its stage and layout need none.
type rings struct {
	gathered *ring // stage 3: Options.MaxLiveChunks slots of the largest padded chunk
	buckets  *ring // stages 2-3: three full gradient buckets of the largest trainable chunk
	reduce   *ring // stages 2-3 with A > 1: a reduce shard per bucket
	grads    *ring // optimizer state on NVMe: the reduced gradient shards on their way to the tier store
	// scratch is the ring whose first slot a failed step's collectives run
	// on: the gathered ring at stage 3 (the largest chunk), else the bucket
	// ring (the largest trainable chunk, all a reduction needs).
	scratch *ring
}

// newRings allocates rank r's workspace rings (workspaceNeedBytes is
// their arithmetic).
func (r *rank) newRings() error {
	e := r.e
	var maxPadded, maxGradPadded, maxGradShard int
	var shards []int
	for _, p := range e.chunks {
		maxPadded = max(maxPadded, e.n*p.shard)
		if !p.frozen {
			maxGradPadded, maxGradShard = max(maxGradPadded, e.n*p.shard), max(maxGradShard, p.shard)
			shards = append(shards, p.shard)
		}
	}
	repeat := func(k, n int) []int {
		out := make([]int, k)
		for i := range out {
			out[i] = n
		}
		return out
	}
	alloc := func(dst **ring, purpose string, sizes []int) error {
		if len(sizes) == 0 || sizes[0] == 0 {
			return nil
		}
		g, err := newRing(r.dev, purpose, e.precision, sizes...)
		*dst = g
		return err
	}
	var err error
	if e.stage == 3 {
		err = alloc(&r.rings.gathered, "gathered chunk", repeat(e.opts.MaxLiveChunks, maxPadded))
	}
	r.rings.scratch = r.rings.gathered
	if err == nil && e.stage >= 2 {
		err = alloc(&r.rings.buckets, "grad bucket", repeat(3, maxGradPadded))
		if e.stage == 2 {
			r.rings.scratch = r.rings.buckets
		}
		if err == nil && e.accum > 1 {
			err = alloc(&r.rings.reduce, "reduce shard", repeat(3, maxGradShard))
		}
	}
	if err == nil && e.gradTiered {
		if e.accum == 1 {
			shards = repeat(2, maxGradShard)
		}
		err = alloc(&r.rings.grads, "grad shard", shards)
	}
	if err != nil {
		r.releaseRings()
	}
	return err
}

// ringBytes is the device memory of the rank's rings.
func (r *rank) ringBytes() int64 {
	var n int64
	for _, g := range []*ring{r.rings.gathered, r.rings.buckets, r.rings.reduce, r.rings.grads} {
		if g != nil {
			for _, b := range g.slots {
				n += b.Bytes()
			}
		}
	}
	return n
}

// settleRings forgets the slots' last uses (the rank's streams have
// completed).
func (r *rank) settleRings() {
	for _, g := range []*ring{r.rings.gathered, r.rings.buckets, r.rings.reduce, r.rings.grads} {
		g.settle()
	}
}

func (r *rank) releaseRings() {
	for _, g := range []*ring{r.rings.gathered, r.rings.buckets, r.rings.reduce, r.rings.grads} {
		g.release()
	}
	r.rings = rings{}
}

// reserveCommScratch has the rank's Comm take, now, the scratch of the
// largest collective of each kind the steps issue (gpu.ScratchReserver):
// at stage 0 the AllReduce of a chunk's gradient, at stages 1-3 the
// AllGather of a chunk's params and the ReduceScatter of its gradient.
func (r *rank) reserveCommScratch() error {
	sr, ok := r.comm.(gpu.ScratchReserver)
	if !ok {
		return nil
	}
	e := r.e
	maxPadded := 0
	for _, p := range e.chunks {
		maxPadded = max(maxPadded, e.n*p.shard)
	}
	kinds := []gpu.Collective{gpu.CollAllGather, gpu.CollReduceScatter}
	if e.stage == 0 {
		kinds = []gpu.Collective{gpu.CollAllReduce}
	}
	for _, k := range kinds {
		if err := sr.ReserveScratch(k, maxPadded, e.precision); err != nil {
			return err
		}
	}
	return nil
}
