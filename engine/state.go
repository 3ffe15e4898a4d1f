package engine

import (
	"fmt"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu"
)

// devState is a rank's model state on its device: parameters, gradients
// and, with the optimizer on the device, its master weights and moments,
// per chunk. With the optimizer on the host (ZeRO-Offload and
// ZeRO-Infinity) master, m, v, the host copy of the reduced gradient and
// the params under offload_param live in the tier store instead (tiers).
//
// Layout per chunk c (S = ShardElems, padded chunk = N·S, rank r's slice is
// [r·S, (r+1)·S)):
//
//	param   stages 0-2 and persistent stage-3 chunks: the full padded chunk
//	        (bf16, or f32 in fp32 mode); stage 3: the rank's shard, S (none
//	        when the tier store holds it: offload_param)
//	grad    stages 0-1: the full padded chunk; stages 2-3: the rank's shard
//	        (none between steps when the optimizer state is on NVMe: the
//	        shard is workspace until its copy reaches the tier store)
//	master, m, v (f32)
//	        device optimizer only: stage 0 the full chunk, else the rank's
//	        shard; no master in fp32 mode (the params are the master weights)
//
// A frozen chunk (strata.freeze) has its params only: no grad, master, m
// or v (its Grad is the rank's scratch, frozenGrad).
//
// Every device allocation here is tagged gpu.ModelState and lives from New
// to Close, so the device's model-state peak is exactly their sum.
type devState struct {
	e      *Engine
	r      int
	dev    gpu.Device
	full   []bool
	param  []gpu.Buffer
	grad   []gpu.Buffer
	master []gpu.Buffer // nil entries in fp32 mode or with the host optimizer
	m, v   []gpu.Buffer // nil with the host optimizer
	allocs []gpu.Buffer
}

func newDevState(e *Engine, r int, dev gpu.Device) (*devState, error) {
	st := &devState{e: e, r: r, dev: dev}
	nc := len(e.chunks)
	st.full = make([]bool, nc)
	st.param, st.grad = make([]gpu.Buffer, nc), make([]gpu.Buffer, nc)
	st.master, st.m, st.v = make([]gpu.Buffer, nc), make([]gpu.Buffer, nc), make([]gpu.Buffer, nc)
	for c := range e.chunks {
		if err := st.alloc(c); err != nil {
			st.free()
			return nil, err
		}
	}
	return st, nil
}

// alloc allocates chunk c's buffers.
func (st *devState) alloc(c int) error {
	e, p := st.e, st.e.chunks[c]
	pt := e.precision
	get := func(b *gpu.Buffer, n int, dt gpu.DType, purpose string) error {
		var err error
		if *b, err = st.dev.Alloc(n, dt, gpu.Tag{Kind: gpu.ModelState, Purpose: purpose}); err != nil {
			return fmt.Errorf("%s of chunk %d: %w", purpose, c, err)
		}
		st.allocs = append(st.allocs, *b)
		return nil
	}
	padded := e.n * p.shard
	st.full[c] = e.stage < 3 || p.persistent
	var err error
	switch {
	case st.full[c]:
		err = get(&st.param[c], padded, pt, "param")
	case !e.paramTiered(c): // else in the tier store
		err = get(&st.param[c], p.shard, pt, "param shard")
	}
	if err != nil || p.frozen {
		return err // frozen: params only (freeze.go)
	}
	switch {
	case e.stage < 2:
		err = get(&st.grad[c], padded, pt, "grad")
	case !e.gradTiered: // else allocated for the reduction, freed once copied to the tier store
		err = get(&st.grad[c], p.shard, pt, "grad shard")
	}
	if err != nil || e.offload {
		return err
	}
	on := e.optElems(c)
	if pt.Half() {
		if err := get(&st.master[c], on, gpu.F32, "master"); err != nil {
			return err
		}
	}
	if err := get(&st.m[c], on, gpu.F32, "adam m"); err != nil {
		return err
	}
	return get(&st.v[c], on, gpu.F32, "adam v")
}

func (st *devState) free() {
	for _, b := range st.allocs {
		st.dev.Free(b)
	}
	st.allocs = nil
}

// paramIsFull says whether the rank holds chunk c's parameters gathered
// (stages 0-2, persistent chunks) rather than its shard only.
func (st *devState) paramIsFull(c int) bool { return st.full[c] }

// paramFull is the gathered chunk (padded); only when paramIsFull.
func (st *devState) paramFull(c int) gpu.Buffer {
	if !st.full[c] {
		panic(fmt.Sprintf("engine: chunk %d is sharded on rank %d", c, st.r))
	}
	return st.param[c]
}

// paramShard is what the optimizer writes: the rank's slice of a full
// chunk (stage 0: the whole chunk, which every rank updates), or the
// rank's shard.
func (st *devState) paramShard(c int) gpu.Buffer {
	if !st.full[c] {
		return st.param[c]
	}
	o := st.e.chunks[c].opt
	return st.param[c].Slice(st.r*o.stride, o.elems)
}

// gradShard is the reduced gradient the optimizer reads: stage 0 the whole
// chunk, stage 1 the rank's slice of the full buffer, stages 2-3 the shard
// (gradPath.shard).
func (st *devState) gradShard(c int) gpu.Buffer { return st.e.grads.shard(st, c) }

// optElems is the length of a rank's optimizer state of chunk c (and of
// its reduced gradient): stage 0 the whole padded chunk, else its shard;
// optOffset is where rank r's starts in the padded chunk (chunkPlan.opt,
// laid out in New).
func (e *Engine) optElems(c int) int { return e.chunks[c].opt.elems }

func (e *Engine) optOffset(c, r int) int { return r * e.chunks[c].opt.stride }

// deviceOpt returns the device optimizer's buffers of chunk c: the fp32
// weights Adam updates (master, or the params in fp32 mode), m, v, and the
// bf16 output (nil in fp32 mode).
func (st *devState) deviceOpt(c int) (param, m, v, out gpu.Buffer) {
	if st.e.precision == gpu.F32 {
		return st.paramShard(c), st.m[c], st.v[c], nil
	}
	return st.master[c], st.m[c], st.v[c], st.paramShard(c)
}

// byte views of host memory (little-endian, as the copies are).

func f32s(b []byte) []float32 { return dtype.Float32s(b) }
func u16s(b []byte) []uint16  { return dtype.Uint16s(b) }
func f64s(b []byte) []float64 { return dtype.Float64s(b) }

// encode returns v as fresh bytes of dtype dt (bf16: rounded to nearest even).
func encode(v []float32, dt gpu.DType) []byte {
	return encodeInto(nil, v, dt)
}

// encodeInto is encode into buf when it has room, else into fresh bytes;
// it returns the bytes written.
func encodeInto(buf []byte, v []float32, dt gpu.DType) []byte {
	n := len(v) * dt.Size()
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	b := buf[:n]
	switch dt {
	case gpu.F32:
		copy(f32s(b), v)
	case gpu.BF16, gpu.F16:
		dtype.Narrow(dt, u16s(b), v)
	default:
		panic(fmt.Sprintf("engine: encode as %s", dt))
	}
	return b
}

// decode widens bytes of dtype dt to float32.
func decode(b []byte, dt gpu.DType) []float32 {
	switch dt {
	case gpu.F32:
		return append([]float32(nil), f32s(b)...)
	case gpu.BF16, gpu.F16:
		out := make([]float32, len(b)/2)
		dtype.Widen(dt, out, u16s(b))
		return out
	}
	panic(fmt.Sprintf("engine: decode of %s", dt))
}
