package cpuadam

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

// Options configure an Optimizer.
type Options struct {
	// Threads is the number of goroutines that run kernels, the caller's
	// included (Threads-1 persistent workers are started). 0 means
	// runtime.GOMAXPROCS(0).
	Threads int
	// ISA picks the kernels; ISAAuto (the zero value) means Best().
	ISA ISA
	// MinTileLen is the fewest elements worth a tile of their own: a call
	// over n elements uses at most max(1, n/MinTileLen) threads. 0 means
	// 1<<15 (128 KiB of each fp32 stream).
	MinTileLen int
}

// maxThreads bounds Options.Threads.
const maxThreads = 1024

func (o Options) withDefaults() Options {
	if o.Threads == 0 {
		o.Threads = runtime.GOMAXPROCS(0)
	}
	if o.ISA == ISAAuto {
		o.ISA = Best()
	}
	if o.MinTileLen == 0 {
		o.MinTileLen = 1 << 15
	}
	return o
}

// Validate says what is wrong with o (after defaults).
func (o Options) Validate() error {
	o = o.withDefaults()
	switch {
	case o.Threads < 1 || o.Threads > maxThreads:
		return fmt.Errorf("cpuadam: threads %d must be in [1, %d]", o.Threads, maxThreads)
	case o.ISA >= isaCount:
		return fmt.Errorf("cpuadam: unknown isa %d", o.ISA)
	case !o.ISA.Supported():
		return fmt.Errorf("cpuadam: isa %v is not supported by this CPU or build (best: %v)", o.ISA, Best())
	case o.MinTileLen < 1:
		return fmt.Errorf("cpuadam: min tile length %d must be >= 1", o.MinTileLen)
	}
	return nil
}

func (o Options) String() string {
	o = o.withDefaults()
	return fmt.Sprintf("threads=%d isa=%v min-tile=%d", o.Threads, o.ISA, o.MinTileLen)
}

// Optimizer runs the kernels of one ISA on a persistent pool of goroutines.
// A call splits its slices into at most Threads large contiguous tiles
// (boundaries on 64-byte addresses of param), runs the first on the
// calling goroutine and the others on the workers, and returns when all
// are done; no goroutine is started and nothing is allocated per call
// (SumSquares grows a scratch slice the first time it meets a larger
// input). Results are the same bits for any Threads. Calls are
// serialized; an Optimizer is safe for concurrent use. Close stops the
// workers.
type Optimizer struct {
	opts Options
	ks   ISA // resolved: never ISAAuto

	mu     sync.Mutex
	closed bool
	work   []chan task   // one per worker
	done   chan struct{} // one receive per finished worker tile
	exited sync.WaitGroup

	k      kconsts // the current step's scalars, read by the workers
	bounds [maxThreads + 1]int
	maxAbs [maxThreads]uint32
	sums   []float64
}

type taskKind uint8

const (
	taskAdamF32 taskKind = iota
	taskAdamBF16
	taskSumSq
	taskMaxAbs
	taskR4W3
	taskShard
)

// task is one tile's work; it travels by value over a channel.
type task struct {
	kind      taskKind
	lo, hi    int
	k         *kconsts
	mode      Mode
	param, gf []float32
	m, v      []float32
	gh, out   []uint16
	sums      []float64 // taskSumSq: one per block of [lo, hi)
	maxAbs    *uint32
	shard     Shard // taskShard
}

// New starts an Optimizer's workers.
func New(opts Options) (*Optimizer, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	o := &Optimizer{opts: opts, ks: opts.ISA, done: make(chan struct{}, opts.Threads)}
	o.work = make([]chan task, opts.Threads-1)
	for i := range o.work {
		o.work[i] = make(chan task, 1)
		o.exited.Add(1)
		go o.worker(o.work[i])
	}
	return o, nil
}

// Options returns the options in effect, defaults filled in.
func (o *Optimizer) Options() Options { return o.opts }

// Close stops the workers; it is safe to call more than once. Using the
// Optimizer after Close panics.
func (o *Optimizer) Close() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil
	}
	o.closed = true
	for _, w := range o.work {
		close(w)
	}
	o.exited.Wait()
	return nil
}

func (o *Optimizer) worker(in <-chan task) {
	defer o.exited.Done()
	for t := range in {
		o.run(&t)
		o.done <- struct{}{}
	}
}

func (o *Optimizer) run(t *task) {
	lo, hi := t.lo, t.hi
	switch t.kind {
	case taskAdamF32:
		o.ks.adamF32(t.k, t.mode, t.param[lo:hi], t.gf[lo:hi], t.m[lo:hi], t.v[lo:hi], sub(t.out, lo, hi))
	case taskAdamBF16:
		o.ks.adamBF16(t.k, t.mode, t.param[lo:hi], t.gh[lo:hi], t.m[lo:hi], t.v[lo:hi], sub(t.out, lo, hi))
	case taskSumSq:
		if t.gf != nil {
			blockSums(o.ks, t.gf[lo:hi], nil, t.sums)
		} else {
			blockSums(o.ks, nil, t.gh[lo:hi], t.sums)
		}
	case taskMaxAbs:
		if t.gf != nil {
			*t.maxAbs = o.ks.maxAbsF32(t.gf[lo:hi])
		} else {
			*t.maxAbs = o.ks.maxAbsBF16(t.gh[lo:hi])
		}
	case taskR4W3:
		o.ks.r4w3(t.param[lo:hi], t.gf[lo:hi], t.m[lo:hi], t.v[lo:hi])
	case taskShard:
		o.ks.adamShard(t.k, t.mode, t.shard.Slice(lo, hi))
	}
}

func sub(s []uint16, lo, hi int) []uint16 {
	if s == nil {
		return nil
	}
	return s[lo:hi]
}

// split fills o.bounds[0..tiles] for n elements cut on multiples of
// quantum counted from first, and returns the number of tiles.
func (o *Optimizer) split(n, quantum, first int) int {
	tiles := max(1, min(o.opts.Threads, n/o.opts.MinTileLen))
	o.bounds[0] = 0
	for t := 1; t < tiles; t++ {
		b := n * t / tiles
		b = first + (b-first)/quantum*quantum
		o.bounds[t] = max(o.bounds[t-1], min(b, n))
	}
	o.bounds[tiles] = n
	return tiles
}

// alignFirst is the first index of p whose address is 64-byte aligned (or
// 0 when p is empty or not 4-byte aligned).
func alignFirst(p []float32) int {
	if len(p) == 0 {
		return 0
	}
	a := uintptr(unsafe.Pointer(&p[0]))
	if a%4 != 0 {
		return 0
	}
	return int((64 - a%64) % 64 / 4)
}

// do runs t split into tiles; the caller holds o.mu.
func (o *Optimizer) do(t task, n, quantum, first int) {
	if o.closed {
		panic("cpuadam: Optimizer used after Close")
	}
	tiles := o.split(n, quantum, first)
	for i := 1; i < tiles; i++ {
		w := t
		w.lo, w.hi = o.bounds[i], o.bounds[i+1]
		o.prepare(&w, i)
		o.work[i-1] <- w
	}
	t.lo, t.hi = o.bounds[0], o.bounds[1]
	o.prepare(&t, 0)
	o.run(&t)
	for i := 1; i < tiles; i++ {
		<-o.done
	}
}

func (o *Optimizer) prepare(t *task, tile int) {
	switch t.kind {
	case taskSumSq:
		t.sums = o.sums[t.lo/sumBlockLen : (t.hi+sumBlockLen-1)/sumBlockLen]
	case taskMaxAbs:
		t.maxAbs = &o.maxAbs[tile]
	}
}

// StepF32 is the package's StepF32 on the pool.
func (o *Optimizer) StepF32(p Params, param, grad, m, v []float32, out []uint16) {
	checkLens(len(param), len(grad), len(m), len(v), out)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.k = makeConsts(p)
	o.do(task{kind: taskAdamF32, k: &o.k, mode: p.Mode, param: param, gf: grad, m: m, v: v, out: out}, len(param), 16, alignFirst(param))
}

// StepBF16 is the package's StepBF16 on the pool.
func (o *Optimizer) StepBF16(p Params, param []float32, grad []uint16, m, v []float32, out []uint16) {
	checkLens(len(param), len(grad), len(m), len(v), out)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.k = makeConsts(p)
	o.do(task{kind: taskAdamBF16, k: &o.k, mode: p.Mode, param: param, gh: grad, m: m, v: v, out: out}, len(param), 16, alignFirst(param))
}

// Step is the package's Step on the pool; same bits. Int8 moments and a
// Remainder are cut into tiles on QuantBlock boundaries from the shard's
// start.
func (o *Optimizer) Step(p Params, s Shard) {
	s.check()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.k = makeConsts(p)
	quantum, first := 16, alignFirst(s.Param)
	if s.M.Precision() == MomentsInt8 || s.Rem.Lo != nil {
		quantum, first = QuantBlock, 0 // whole blocks, whole bytes of up bits
	}
	o.do(task{kind: taskShard, k: &o.k, mode: p.Mode, shard: s}, s.Len(), quantum, first)
}

// SumSquares is the package's SumSquares on the pool; same bits.
func (o *Optimizer) SumSquares(x []float32) float64 {
	return o.sumSquares(task{kind: taskSumSq, gf: x}, len(x))
}

// SumSquaresBF16 is the package's SumSquaresBF16 on the pool; same bits.
func (o *Optimizer) SumSquaresBF16(x []uint16) float64 {
	if x == nil {
		x = []uint16{}
	}
	return o.sumSquares(task{kind: taskSumSq, gh: x}, len(x))
}

func (o *Optimizer) sumSquares(t task, n int) float64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	blocks := (n + sumBlockLen - 1) / sumBlockLen
	if cap(o.sums) < blocks {
		o.sums = make([]float64, blocks)
	}
	o.sums = o.sums[:blocks]
	if t.gf == nil && t.gh == nil {
		t.gf = []float32{}
	}
	o.do(t, n, sumBlockLen, 0)
	var total float64
	for _, s := range o.sums {
		total += s
	}
	return total
}

// NonFinite is the package's NonFinite on the pool.
func (o *Optimizer) NonFinite(x []float32) bool {
	if x == nil {
		x = []float32{}
	}
	return o.maxAbsOf(task{kind: taskMaxAbs, gf: x}, len(x)) >= 0x7f800000
}

// NonFiniteBF16 is the package's NonFiniteBF16 on the pool.
func (o *Optimizer) NonFiniteBF16(x []uint16) bool {
	if x == nil {
		x = []uint16{}
	}
	return o.maxAbsOf(task{kind: taskMaxAbs, gh: x}, len(x)) >= 0x7f800000
}

func (o *Optimizer) maxAbsOf(t task, n int) uint32 {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.do(t, n, 16, 0)
	var mx uint32
	for i := range o.split(n, 16, 0) {
		mx = max(mx, o.maxAbs[i])
	}
	return mx
}

// StreamR4W3 runs the roofline anchor of `strata bench adam` on the pool:
// the r4w3 loop of membw.c (bench/tools/membw.c, the memory-bandwidth roofline) (read a, b, c, d; write a, c,
// d, in place; documented at r4w3AVX512), with the same tiles as StepF32.
// It measures the memory, not Adam: its values mean nothing.
func (o *Optimizer) StreamR4W3(a, b, c, d []float32) {
	checkLens(len(a), len(b), len(c), len(d), nil)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.do(task{kind: taskR4W3, param: a, gf: b, m: c, v: d}, len(a), 16, alignFirst(a))
}
