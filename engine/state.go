package engine

import (
	"fmt"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/bf16"
	"github.com/strata-ai/strata/internal/dtype"
	"github.com/strata-ai/strata/pinned"
)

// stateStore is the one place a rank reaches its model state: parameter
// shards, gradients and the optimizer's master weights and moments, per
// (chunk, state). Everything else in the engine asks it for buffers, so
// that the tier store of ZeRO-Infinity can take over where each state
// lives without touching the step.
//
// Layout per chunk c (S = ShardElems, padded chunk = N·S, rank r's slice is
// [r·S, (r+1)·S)):
//
//	param   stages 0-2 and persistent stage-3 chunks: the full padded chunk
//	        (bf16, or f32 in fp32 mode); stage 3: the rank's shard, S
//	grad    stages 0-1: the full padded chunk; stages 2-3: the rank's shard
//	master, m, v (f32)
//	        device optimizer: stage 0 the full chunk, else the rank's shard;
//	        no master in fp32 mode (the params are the master weights).
//	        Host optimizer: the rank's shard in host memory, with the reduced
//	        gradient shard and the parameter upload staging in pinned memory.
//
// Every device allocation here is tagged gpu.ModelState and lives from New
// to Close, so the device's model-state peak is exactly their sum.
type stateStore struct {
	e      *Engine
	r      int
	dev    gpu.Device
	full   []bool
	param  []gpu.Buffer
	grad   []gpu.Buffer
	master []gpu.Buffer // nil entries in fp32 mode or with the host optimizer
	m, v   []gpu.Buffer // nil with the host optimizer
	allocs []gpu.Buffer

	// host optimizer
	hMaster, hM, hV [][]float32
	hGrad, hUpload  [][]byte         // per chunk: the gradient shard and the parameter upload (pinned); no hGrad when the tier store holds it
	gradPins        []*pinned.Buffer // per chunk; nil where the tier store holds the gradient shard
	upPins          []*pinned.Buffer // per chunk; nil where the tier store holds the params
	pins            []*pinned.Buffer // all of them
	hostBytes       int64            // master, m, v and the gradient shard: model state on the host
	stagingBytes    int64            // the upload staging
}

func newStateStore(e *Engine, r int, dev gpu.Device) (*stateStore, error) {
	st := &stateStore{e: e, r: r, dev: dev}
	nc := len(e.chunks)
	st.full = make([]bool, nc)
	st.param, st.grad = make([]gpu.Buffer, nc), make([]gpu.Buffer, nc)
	st.master, st.m, st.v = make([]gpu.Buffer, nc), make([]gpu.Buffer, nc), make([]gpu.Buffer, nc)
	pt := e.precision
	alloc := func(n int, dt gpu.DType, purpose string, c int) (gpu.Buffer, error) {
		b, err := dev.Alloc(n, dt, gpu.Tag{Kind: gpu.ModelState, Purpose: purpose})
		if err != nil {
			return nil, fmt.Errorf("%s of chunk %d: %w", purpose, c, err)
		}
		st.allocs = append(st.allocs, b)
		return b, nil
	}
	var err error
	for c, p := range e.chunks {
		padded := e.n * p.shard
		st.full[c] = e.stage < 3 || p.persistent
		switch {
		case st.full[c]:
			st.param[c], err = alloc(padded, pt, "param", c)
		case e.paramTiered(c):
			// in the tier store
		default:
			st.param[c], err = alloc(p.shard, pt, "param shard", c)
		}
		if err != nil {
			st.free()
			return nil, err
		}
		switch {
		case e.stage < 2:
			st.grad[c], err = alloc(padded, pt, "grad", c)
		case e.gradTiered:
			// allocated for the reduction, freed once copied to the tier store
		default:
			st.grad[c], err = alloc(p.shard, pt, "grad shard", c)
		}
		if err != nil {
			st.free()
			return nil, err
		}
		if e.offload {
			continue
		}
		on := st.optElems(c)
		if pt == gpu.BF16 {
			if st.master[c], err = alloc(on, gpu.F32, "master", c); err != nil {
				st.free()
				return nil, err
			}
		}
		if st.m[c], err = alloc(on, gpu.F32, "adam m", c); err != nil {
			st.free()
			return nil, err
		}
		if st.v[c], err = alloc(on, gpu.F32, "adam v", c); err != nil {
			st.free()
			return nil, err
		}
	}
	if e.offload {
		if err := st.allocHost(); err != nil {
			st.free()
			return nil, err
		}
	}
	return st, nil
}

// allocHost takes the host optimizer's state: fp32 master, m and v in host
// memory (without the tier store), and per chunk a pinned buffer for the
// reduced gradient shard and one for the parameter upload (for chunks whose
// params the tier store does not hold).
func (st *stateStore) allocHost() error {
	e := st.e
	sz := e.precision.Size()
	var elems, up int
	st.hGrad = make([][]byte, len(e.chunks))
	st.hUpload = make([][]byte, len(e.chunks))
	st.gradPins = make([]*pinned.Buffer, len(e.chunks))
	st.upPins = make([]*pinned.Buffer, len(e.chunks))
	get := func(n int, purpose string, c int) (*pinned.Buffer, error) {
		b, err := e.pool.Get(int64(n), fmt.Sprintf("rank %d %s", st.r, purpose))
		if err != nil {
			return nil, fmt.Errorf("host %s of chunk %d: %w", purpose, c, err)
		}
		st.pins = append(st.pins, b)
		return b, nil
	}
	for c, p := range e.chunks {
		nb := p.shard * sz
		if !e.gradTiered { // else the tier store holds the gradient shard
			elems += p.shard
			b, err := get(nb, "grad shard", c)
			if err != nil {
				return err
			}
			st.gradPins[c], st.hGrad[c] = b, b.Bytes()[:nb:nb]
		}
		if !e.paramTiered(c) {
			var b *pinned.Buffer
			var err error
			up += p.shard
			if b, err = get(nb, "param upload", c); err != nil {
				return err
			}
			st.upPins[c], st.hUpload[c] = b, b.Bytes()[:nb:nb]
		}
		if e.tiered {
			continue // master, m and v are in the tier store
		}
		st.hMaster = append(st.hMaster, make([]float32, p.shard))
		st.hM = append(st.hM, make([]float32, p.shard))
		st.hV = append(st.hV, make([]float32, p.shard))
	}
	st.hostBytes = int64(elems) * int64(sz)
	if !e.tiered {
		st.hostBytes += int64(elems) * 12
	}
	st.stagingBytes = int64(up) * int64(sz)
	return nil
}

func (st *stateStore) free() {
	for _, b := range st.allocs {
		st.dev.Free(b)
	}
	st.allocs = nil
	for _, b := range st.pins {
		st.e.pool.Put(b)
	}
	st.pins = nil
}

// paramIsFull says whether the rank holds chunk c's parameters gathered
// (stages 0-2, persistent chunks) rather than its shard only.
func (st *stateStore) paramIsFull(c int) bool { return st.full[c] }

// paramFull is the gathered chunk (padded); only when paramIsFull.
func (st *stateStore) paramFull(c int) gpu.Buffer {
	if !st.full[c] {
		panic(fmt.Sprintf("engine: chunk %d is sharded on rank %d", c, st.r))
	}
	return st.param[c]
}

// paramShard is what the optimizer writes: the rank's slice (stage 0: the
// whole chunk, which every rank updates).
func (st *stateStore) paramShard(c int) gpu.Buffer {
	switch {
	case st.e.stage == 0:
		return st.param[c]
	case st.full[c]:
		s := st.e.chunks[c].shard
		return st.param[c].Slice(st.r*s, s)
	}
	return st.param[c]
}

// gradFull is the full gradient buffer of stages 0 and 1.
func (st *stateStore) gradFull(c int) gpu.Buffer {
	if st.e.stage >= 2 {
		panic(fmt.Sprintf("engine: stage %d keeps no full gradient of chunk %d", st.e.stage, c))
	}
	return st.grad[c]
}

// gradShard is the reduced gradient the optimizer reads: stage 0 the whole
// chunk, stage 1 the rank's slice of the full buffer, stages 2-3 the shard.
func (st *stateStore) gradShard(c int) gpu.Buffer {
	if st.e.stage == 1 {
		s := st.e.chunks[c].shard
		return st.grad[c].Slice(st.r*s, s)
	}
	return st.grad[c]
}

// optElems is the length of the rank's optimizer state of chunk c, and
// optOffset where it starts in the padded chunk.
func (st *stateStore) optElems(c int) int {
	if st.e.stage == 0 {
		return st.e.n * st.e.chunks[c].shard
	}
	return st.e.chunks[c].shard
}

func (st *stateStore) optOffset(c int) int {
	if st.e.stage == 0 {
		return 0
	}
	return st.r * st.e.chunks[c].shard
}

// deviceOpt returns the device optimizer's buffers of chunk c: the fp32
// weights Adam updates (master, or the params in fp32 mode), m, v, and the
// bf16 output (nil in fp32 mode).
func (st *stateStore) deviceOpt(c int) (param, m, v, out gpu.Buffer) {
	if st.e.precision == gpu.F32 {
		return st.paramShard(c), st.m[c], st.v[c], nil
	}
	return st.master[c], st.m[c], st.v[c], st.paramShard(c)
}

// hostOpt returns the host optimizer's state of chunk c (without the tier
// store).
func (st *stateStore) hostOpt(c int) (master, m, v []float32, grad, upload []byte) {
	return st.hMaster[c], st.hM[c], st.hV[c], st.hGrad[c], st.hUpload[c]
}

// byte views of host memory (little-endian, as the copies are).

func f32s(b []byte) []float32 { return dtype.Float32s(b) }
func u16s(b []byte) []uint16  { return dtype.Uint16s(b) }
func f64s(b []byte) []float64 { return dtype.Float64s(b) }

// encode returns v as fresh bytes of dtype dt (bf16: rounded to nearest even).
func encode(v []float32, dt gpu.DType) []byte {
	switch dt {
	case gpu.F32:
		b := make([]byte, 4*len(v))
		copy(f32s(b), v)
		return b
	case gpu.BF16:
		b := make([]byte, 2*len(v))
		bf16.FromFloat32s(u16s(b), v)
		return b
	}
	panic(fmt.Sprintf("engine: encode as %s", dt))
}

// decode widens bytes of dtype dt to float32.
func decode(b []byte, dt gpu.DType) []float32 {
	switch dt {
	case gpu.F32:
		return append([]float32(nil), f32s(b)...)
	case gpu.BF16:
		out := make([]float32, len(b)/2)
		bf16.ToFloat32s(out, u16s(b))
		return out
	}
	panic(fmt.Sprintf("engine: decode of %s", dt))
}
