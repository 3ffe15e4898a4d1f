// Package bytemlp is a language model over bytes, defined outside package model.
//
// It is what a library user writes to train a model of their own.
//
// It implements engine.Model (its layout in chunks, its access order, its
// initial values) and engine.Instance (its passes on one device, through
// gpu.Ops). examples/gomodel trains it at ZeRO stage 3; engine's tests of
// a library model (engine/usermodel_test.go) run it through every stage
// and tier.
package bytemlp

import (
	"encoding/binary"
	"math"
	"math/rand/v2"

	"github.com/strata-ai/strata/engine"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
)

// Model is a language model over bytes defined outside package model: the
// next byte from the current one through a hidden layer,
//
//	x      = embed[id]                    (rows·seq × dim)
//	h      = x·hiddenᵀ + hidden_b         (rows·seq × hid)
//	logits = gelu(h)·headᵀ + head_b       (rows·seq × 256)
//
// in three chunks, the unit the engine shards, gathers and offloads:
// the embedding, the hidden layer and the output head.
type Model struct {
	layout   *model.Layout
	dim, hid int
}

// New is a Model of dim-wide byte embeddings and a hidden layer of hid.
func New(dim, hid int) (*Model, error) {
	l, err := model.CustomLayout("byte-mlp", []model.Chunk{
		{Name: "embedding", Tensors: []model.Tensor{{Name: "embed.weight", Shape: []int{model.ByteVocab, dim}}}},
		{Name: "hidden", Tensors: []model.Tensor{{Name: "hidden.weight", Shape: []int{hid, dim}}, {Name: "hidden.bias", Shape: []int{hid}}}},
		{Name: "head", Tensors: []model.Tensor{{Name: "head.weight", Shape: []int{model.ByteVocab, hid}}, {Name: "head.bias", Shape: []int{model.ByteVocab}}}},
	})
	if err != nil {
		return nil, err
	}
	return &Model{layout: l, dim: dim, hid: hid}, nil
}

// The engine.Model methods.

// Layout is the model's three chunks.
func (m *Model) Layout() *model.Layout { return m.layout }

// AccessOrder is the order the passes read the chunks: the forward reads chunks 0, 1, 2, the backward 2, 1, 0.
func (m *Model) AccessOrder() []model.Access { return model.StackOrder(3) }

// Vocab is the byte vocabulary, 256 ids.
func (m *Model) Vocab() int { return model.ByteVocab }

// MaxSeq bounds a row: the model has no positions, so any length works;
// this bounds the activations.
func (m *Model) MaxSeq() int { return 1024 }

// InitChunk writes chunk c's initial values: matrices N(0, 0.02), biases 0; the values depend only on
// (seed, c), as the engine requires.
func (m *Model) InitChunk(seed uint64, c int, dst []float32) {
	rng := rand.New(rand.NewPCG(seed, uint64(c)))
	for _, t := range m.layout.Chunks[c].Tensors {
		v := dst[t.Offset : t.Offset+t.Len]
		for i := range v {
			v[i] = 0
			if len(t.Shape) == 2 {
				v[i] = float32(0.02 * rng.NormFloat64())
			}
		}
	}
}

// New allocates the model's activations on dev for rows×seq tokens.
func (m *Model) New(dev gpu.Device, rows, seq int) (engine.Instance, error) {
	r := &run{m: m, dev: dev, ops: dev.Ops(), rows: rows, seq: seq, staged: dev.NewEvent()}
	n := rows * seq
	for _, a := range []struct {
		dst   *gpu.Buffer
		elems int
		dt    gpu.DType
	}{
		{&r.ids, n, gpu.I32}, {&r.targets, n, gpu.I32},
		{&r.x, n * m.dim, gpu.F32}, {&r.h, n * m.hid, gpu.F32}, {&r.a, n * m.hid, gpu.F32},
		{&r.logits, n * model.ByteVocab, gpu.F32}, {&r.losses, n, gpu.F32},
		{&r.dx, n * m.dim, gpu.F32}, {&r.da, n * m.hid, gpu.F32},
	} {
		b, err := dev.Alloc(a.elems, a.dt, gpu.Tag{Kind: gpu.Activation, Purpose: "byte-mlp activations"})
		if err != nil {
			r.Free()
			return nil, err
		}
		*a.dst = b
		r.bufs = append(r.bufs, b)
	}
	r.staging = make([]byte, 8*n)
	return r, nil
}

// run is a Model on one device (an engine.Instance): its activations,
// allocated once, and the per-token losses on their way to the host.
type run struct {
	m         *Model
	dev       gpu.Device
	ops       gpu.Ops
	rows, seq int
	bufs      []gpu.Buffer

	ids, targets            gpu.Buffer // I32
	x, h, a, logits, losses gpu.Buffer // F32; backward: logits holds dlogits, a holds dh
	dx, da                  gpu.Buffer // F32 gradients of x and a

	staging []byte    // ids, then targets, for the uploads
	staged  gpu.Event // the uploads from staging
	pending [][]byte  // the per-token losses of each Forward not read yet
	counts  []int     // and their tokens with a target
	counted int       // tokens with a target in the last Forward
}

// view is tensor i of chunk c in buf, that chunk's parameters or gradient.
func (r *run) view(buf gpu.Buffer, c, i int) gpu.Buffer {
	t := r.m.layout.Chunks[c].Tensors[i]
	return buf.Slice(t.Offset, t.Len)
}

func (r *run) Forward(s gpu.Stream, p model.Params, b model.Batch) error {
	n, dim, hid, v := r.rows*r.seq, r.m.dim, r.m.hid, model.ByteVocab
	r.staged.Synchronize() // the last uploads have read the staging bytes
	r.counted = 0
	for i := range n {
		binary.LittleEndian.PutUint32(r.staging[4*i:], uint32(b.IDs[i]))
		binary.LittleEndian.PutUint32(r.staging[4*(n+i):], uint32(b.Targets[i]))
		if b.Targets[i] != model.IgnoreTarget {
			r.counted++
		}
	}
	r.dev.CopyHostToDevice(s, r.ids, 0, r.staging[:4*n])
	r.dev.CopyHostToDevice(s, r.targets, 0, r.staging[4*n:])
	s.Record(r.staged)

	emb, err := p.Acquire(s, 0, shard.Forward)
	if err != nil {
		return err // the engine's error, as it is: stop the pass
	}
	r.ops.EmbeddingForward(s, r.ids, nil, r.view(emb, 0, 0), nil, r.x, r.rows, r.seq, dim)
	p.Release(s, 0, shard.Forward)

	w, err := p.Acquire(s, 1, shard.Forward)
	if err != nil {
		return err
	}
	r.ops.Gemm(s, false, true, n, hid, dim, 1, r.x, r.view(w, 1, 0), 0, r.h)
	r.ops.BiasAdd(s, r.h, r.view(w, 1, 1), n, hid)
	r.ops.GeluForward(s, r.h, r.a, n*hid)
	p.Release(s, 1, shard.Forward)

	w, err = p.Acquire(s, 2, shard.Forward)
	if err != nil {
		return err
	}
	r.ops.Gemm(s, false, true, n, v, hid, 1, r.a, r.view(w, 2, 0), 0, r.logits)
	r.ops.BiasAdd(s, r.logits, r.view(w, 2, 1), n, v)
	r.ops.CrossEntropyForward(s, r.logits, r.targets, r.losses, n, v, 0)
	p.Release(s, 2, shard.Forward)

	host := make([]byte, 4*n)
	r.dev.CopyDeviceToHost(s, host, r.losses, 0)
	r.pending, r.counts = append(r.pending, host), append(r.counts, r.counted)
	return nil
}

func (r *run) Backward(s gpu.Stream, p model.Params, gradScale float32) error {
	n, dim, hid, v := r.rows*r.seq, r.m.dim, r.m.hid, model.ByteVocab
	scale := float32(0) // the mean over the tokens with a target
	if r.counted > 0 {
		scale = gradScale / float32(r.counted)
	}
	w, err := p.Acquire(s, 2, shard.Backward)
	if err != nil {
		return err
	}
	g, err := p.Grad(s, 2)
	if err != nil {
		return err
	}
	dlogits := r.logits
	r.ops.CrossEntropyBackward(s, r.logits, r.targets, dlogits, n, v, scale, 0)
	r.ops.Gemm(s, false, false, n, hid, v, 1, dlogits, r.view(w, 2, 0), 0, r.da) // da = dlogits·head
	r.ops.Gemm(s, true, false, v, hid, n, 1, dlogits, r.a, 1, r.view(g, 2, 0))   // dhead += dlogitsᵀ·a
	r.ops.BiasGrad(s, dlogits, r.view(g, 2, 1), n, v)
	p.Release(s, 2, shard.Backward)
	if err := p.GradReady(s, 2); err != nil {
		return err
	}

	if w, err = p.Acquire(s, 1, shard.Backward); err != nil {
		return err
	}
	if g, err = p.Grad(s, 1); err != nil {
		return err
	}
	dh := r.a // gelu(h) is no longer needed
	r.ops.GeluBackward(s, r.h, r.da, dh, n*hid)
	r.ops.Gemm(s, false, false, n, dim, hid, 1, dh, r.view(w, 1, 0), 0, r.dx) // dx = dh·hidden
	r.ops.Gemm(s, true, false, hid, dim, n, 1, dh, r.x, 1, r.view(g, 1, 0))   // dhidden += dhᵀ·x
	r.ops.BiasGrad(s, dh, r.view(g, 1, 1), n, hid)
	p.Release(s, 1, shard.Backward)
	if err := p.GradReady(s, 1); err != nil {
		return err
	}

	// StackOrder acquires the embedding in the backward too; its backward
	// reads only the ids.
	if _, err = p.Acquire(s, 0, shard.Backward); err != nil {
		return err
	}
	if g, err = p.Grad(s, 0); err != nil {
		return err
	}
	r.ops.EmbeddingBackward(s, r.ids, nil, r.dx, r.view(g, 0, 0), nil, r.rows, r.seq, dim)
	p.Release(s, 0, shard.Backward)
	return p.GradReady(s, 0)
}

func (r *run) Losses(s gpu.Stream) ([]float64, error) {
	if err := s.Synchronize(); err != nil {
		return nil, err
	}
	out := make([]float64, len(r.pending))
	for i, host := range r.pending {
		var sum float64
		for j := 0; j < len(host); j += 4 {
			sum += float64(math.Float32frombits(binary.LittleEndian.Uint32(host[j:])))
		}
		if r.counts[i] > 0 {
			out[i] = sum / float64(r.counts[i])
		}
	}
	r.pending, r.counts = r.pending[:0], r.counts[:0]
	return out, nil
}

func (r *run) Free() {
	for _, b := range r.bufs {
		r.dev.Free(b)
	}
	r.bufs = nil
}
