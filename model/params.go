package model

import (
	"fmt"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/shard"
)

// Params is how the model reaches parameter and gradient memory, which it
// does not own: the caller (Resident here, the ZeRO engine elsewhere)
// implements it. Every call names the stream the model enqueues on; the
// implementation makes that stream wait for whatever it needs (a gather, an
// upload) and records events after Release and GradReady to learn when the
// model's work on a chunk is done.
//
// The model calls the methods in exactly the order AccessOrder lists, from
// one goroutine, for every micro-batch (Forward then Backward). With the
// output head tied to the token embedding (GPT-2, and a Llama-family shape
// with TieEmbeddings):
//
//	forward:   Acquire(0) Release(0)                 embedding
//	           Acquire(c) Release(c)  c = 1..L       blocks
//	           Acquire(L+1) Release(L+1)             final norm
//	           Acquire(0) Release(0)                 tied output head: logits and loss
//	backward:  Acquire(0) Grad(0) Release(0)         head: dlogits, d lnf, dwte +=
//	           Acquire(L+1) Grad(L+1) Release(L+1) GradReady(L+1)
//	           Acquire(c) Grad(c) Release(c) GradReady(c)   c = L..1
//	           GradReady(0)                          after the embedding backward (dwte, dwpe +=)
//
// Grad(0) is called once, at the head, and its buffer stays in use until
// GradReady(0): the embedding backward at the end of the pass accumulates
// into it without acquiring the parameters again.
//
// With an untied head (lm_head in the final chunk) the forward ends with
// the final chunk and never comes back to chunk 0, and the embedding's
// gradient is asked for only when the embedding backward needs it:
//
//	forward:   Acquire(0) Release(0)                 embedding
//	           Acquire(c) Release(c)  c = 1..L       blocks
//	           Acquire(L+1) Release(L+1)             final norm, lm_head: logits and loss
//	backward:  Acquire(L+1) Grad(L+1) Release(L+1) GradReady(L+1)   head and final norm
//	           Acquire(c) Grad(c) Release(c) GradReady(c)   c = L..1
//	           Grad(0) GradReady(0)                  embedding backward (d embed_tokens +=),
//	                                                 which reads no parameter
//
// Errors: Acquire, Grad and GradReady may fail (a fetch that failed, device
// memory exhausted). The model then enqueues nothing more and makes no
// further call: Forward or Backward returns that error as it is (it is the
// implementation's own, already named), and the accesses after it in
// AccessOrder are never made. An implementation that must keep something in
// step with the missing calls (collectives with other devices) does so
// itself, from AccessOrder. Release cannot fail: it only marks the end of a
// use.
type Params interface {
	// Acquire returns chunk c's parameters (F32 or BF16, Layout.Chunks[c].Len
	// elements), usable by work enqueued on s after the call.
	Acquire(s gpu.Stream, c int, pass shard.Phase) (gpu.Buffer, error)
	// Release says the model has enqueued its last use of chunk c for this
	// pass on s.
	Release(s gpu.Stream, c int, pass shard.Phase)
	// Grad returns chunk c's gradient buffer (F32 or BF16, the chunk's
	// length); the model accumulates (+=) into it.
	Grad(s gpu.Stream, c int) (gpu.Buffer, error)
	// GradReady says chunk c's gradient contribution of this micro-batch is
	// fully enqueued on s.
	GradReady(s gpu.Stream, c int) error
}

// InputStore is the optional interface of a Params through which a model
// with ActivationOptions.Offload (cpu_checkpointing) keeps the inputs of
// its checkpointed blocks off the device between their forward and their
// backward: the ZeRO engine implements it with the tier store (the input
// goes to pinned host memory and the planner brings it back ahead of the
// block's backward, as it brings params). The model calls it in the order
// AccessOrderWith lists (Chunk = BlockChunk(l)), from the goroutine that
// calls the other methods: a checkpointed block's forward is
//
//	Acquire(c) Release(c) SaveInput(c)
//
// and its backward
//
//	Acquire(c) Grad(c) RestoreInput(c) Release(c) ReleaseInput(c) GradReady(c)
//
// SaveInput and RestoreInput may fail like Acquire (the model then stops
// the pass and returns the error); ReleaseInput cannot.
type InputStore interface {
	// SaveInput takes block l's input x (B·T·C of the activation dtype),
	// written by work enqueued on s before the call; the implementation
	// makes its copy wait for that work. The model does not write x again
	// until the returned event has completed (nil: the copy is already
	// ordered on s), so the copy can overlap the next blocks' compute.
	SaveInput(s gpu.Stream, l int, x gpu.Buffer) (gpu.Event, error)
	// RestoreInput returns a device buffer holding block l's input as the
	// forward saved it, readable by work enqueued on s after the call until
	// ReleaseInput.
	RestoreInput(s gpu.Stream, l int) (gpu.Buffer, error)
	// ReleaseInput says the model has enqueued its last read of block l's
	// restored input on s.
	ReleaseInput(s gpu.Stream, l int)
}

//go:generate go tool stringer -type=AccessKind -linecomment -output=accesskind_string.go

// AccessKind is one of the Params calls: the four of Params and the three
// of InputStore.
type AccessKind uint8

const (
	AccessAcquire      AccessKind = iota // acquire
	AccessRelease                        // release
	AccessGrad                           // grad
	AccessGradReady                      // grad-ready
	AccessSaveInput                      // save-input
	AccessRestoreInput                   // restore-input
	AccessReleaseInput                   // release-input
)

// Access is one Params call: what, which chunk, and in which pass.
type Access struct {
	Kind  AccessKind
	Chunk int
	Pass  shard.Phase
}

func (a Access) String() string { return fmt.Sprintf("%s %s %d", a.Pass, a.Kind, a.Chunk) }

// AccessOrder lists the Params calls of one micro-batch (Forward then
// Backward) of a model of shape s, in the order the model makes them (the
// two orders of the Params doc, by Shape.TiedHead). The planner may rely
// on it. Activation checkpointing does not change it: a checkpointed
// block's recompute uses the parameters its backward acquires.
func AccessOrder(s Shape) []Access { return AccessOrderWith(s, ActivationOptions{}) }

// AccessOrderWith is AccessOrder for a model whose activations are kept as
// o says: with o.Offload, the InputStore calls of each checkpointed block
// (see InputStore) come among its Params calls. A mixture of experts'
// sparse block is followed in the forward by each of its experts'
// chunks (Layout.ExpertChunk, ascending: Acquire, Release) and preceded
// in the backward by them (Acquire, Grad, Release, GradReady), whether a
// token reached the expert or not (moe.go).
func AccessOrderWith(s Shape, o ActivationOptions) []Access {
	var a []Access
	use := func(c int, p shard.Phase) {
		off := c >= 1 && c <= s.Layers && o.offloaded(c-1, s.Layers)
		a = append(a, Access{AccessAcquire, c, p})
		if p == shard.Backward {
			a = append(a, Access{AccessGrad, c, p})
			if off {
				a = append(a, Access{AccessRestoreInput, c, p})
			}
		}
		a = append(a, Access{AccessRelease, c, p})
		if off {
			kind := AccessSaveInput
			if p == shard.Backward {
				kind = AccessReleaseInput
			}
			a = append(a, Access{kind, c, p})
		}
	}
	final := s.Layers + 1
	for c := 0; c <= final; c++ {
		use(c, shard.Forward)
		for e := 0; c >= 1 && c <= s.Layers && s.SparseLayer(c-1) && e < s.Experts; e++ { // after a sparse block, its experts
			use(expertChunk(s, c-1, e), shard.Forward)
		}
	}
	if s.TiedHead() {
		use(EmbeddingChunk, shard.Forward)
		use(EmbeddingChunk, shard.Backward)
	}
	for c := final; c >= 1; c-- {
		for e := 0; c <= s.Layers && s.SparseLayer(c-1) && e < s.Experts; e++ { // a sparse block's experts before it
			x := expertChunk(s, c-1, e)
			use(x, shard.Backward)
			a = append(a, Access{AccessGradReady, x, shard.Backward})
		}
		use(c, shard.Backward)
		a = append(a, Access{AccessGradReady, c, shard.Backward})
	}
	if !s.TiedHead() {
		a = append(a, Access{AccessGrad, EmbeddingChunk, shard.Backward})
	}
	return append(a, Access{AccessGradReady, EmbeddingChunk, shard.Backward})
}

// AccessOrder is the Params calls of one micro-batch of a model laid out
// by l with activations o: AccessOrderWith(l.Shape, o), and with LoRA each
// block's adapter chunk a = AdapterChunk(l) acquired and released right
// before its block is (in both passes), and in the backward its Grad(a)
// GradReady(a) right after the block's GradReady (the block's backward
// accumulates the adapters' gradient in the model's workspace; Grad(a)
// adds it in).
func (l *Layout) AccessOrder(o ActivationOptions) []Access {
	base := AccessOrderWith(l.Shape, o)
	if l.LoRA == nil {
		return base
	}
	var out []Access
	loaded := map[[2]int]bool{} // (layer, pass) whose adapters are in
	for _, a := range base {
		isBlock := a.Chunk >= BlockChunk(0) && a.Chunk < BlockChunk(l.Shape.Layers)
		layer := a.Chunk - BlockChunk(0)
		if l.IsExpert(a.Chunk) { // a sparse layer's experts: their backward comes before the block's
			layer = l.expertLayer(a.Chunk)
		}
		ad := l.AdapterChunk(layer)
		if (isBlock || l.IsExpert(a.Chunk)) && a.Kind == AccessAcquire && !loaded[[2]int{layer, int(a.Pass)}] {
			loaded[[2]int{layer, int(a.Pass)}] = true
			out = append(out, Access{AccessAcquire, ad, a.Pass}, Access{AccessRelease, ad, a.Pass})
		}
		out = append(out, a)
		if isBlock && a.Kind == AccessGradReady {
			out = append(out, Access{AccessGrad, ad, a.Pass}, Access{AccessGradReady, ad, a.Pass})
		}
	}
	return out
}

// CheckAccessOrder checks the rules every access order keeps (the
// engine's Model.AccessOrder, AccessOrder, Layout.AccessOrder, StackOrder)
// for a layout of chunks chunks: the forward makes only Acquire and
// Release calls (and InputStore's), acquires every chunk and comes before
// the backward; at most one chunk is acquired at a time, Release naming
// the chunk and pass of the Acquire before it; every chunk gets exactly
// one Grad, in the backward, and one GradReady after it; at most two
// chunks are between Grad and GradReady at once.
func CheckAccessOrder(order []Access, chunks int) error {
	var (
		held     = -1 // the chunk between Acquire and Release
		heldPass shard.Phase
		backward bool
		open     int // chunks between Grad and GradReady
		grads    = make([]int, chunks)
		readies  = make([]int, chunks)
		read     = make([]bool, chunks)
	)
	for i, a := range order {
		if a.Kind > AccessReleaseInput {
			return fmt.Errorf("access order, call %d: unknown kind %d", i, a.Kind)
		}
		at := fmt.Sprintf("access order, call %d (%v)", i, a)
		if a.Kind >= AccessSaveInput { // model.InputStore's calls: the hooks check their own order
			if a.Chunk < 0 || a.Chunk >= chunks {
				return fmt.Errorf("%s: chunk %d is outside the layout's %d chunks", at, a.Chunk, chunks)
			}
			continue
		}
		switch {
		case a.Chunk < 0 || a.Chunk >= chunks:
			return fmt.Errorf("%s: chunk %d is outside the layout's %d chunks", at, a.Chunk, chunks)
		case a.Pass != shard.Forward && a.Pass != shard.Backward:
			return fmt.Errorf("%s: the pass is neither forward nor backward", at)
		case a.Pass == shard.Forward && backward:
			return fmt.Errorf("%s: a forward call after the backward began", at)
		case a.Pass == shard.Forward && (a.Kind == AccessGrad || a.Kind == AccessGradReady):
			return fmt.Errorf("%s: gradients are handed out in the backward only", at)
		}
		backward = a.Pass == shard.Backward
		switch a.Kind {
		case AccessAcquire:
			if held >= 0 {
				return fmt.Errorf("%s: chunk %d is still acquired (at most one chunk at a time: release it first)", at, held)
			}
			held, heldPass = a.Chunk, a.Pass
			if a.Pass == shard.Forward {
				read[a.Chunk] = true
			}
		case AccessRelease:
			if held != a.Chunk || heldPass != a.Pass {
				return fmt.Errorf("%s: not the chunk and pass of the Acquire before it", at)
			}
			held = -1
		case AccessGrad:
			if grads[a.Chunk]++; grads[a.Chunk] > 1 {
				return fmt.Errorf("%s: chunk %d's gradient is asked for twice", at, a.Chunk)
			}
			if open++; open > 2 {
				return fmt.Errorf("%s: three gradients open at once (at most two chunks between Grad and GradReady)", at)
			}
		case AccessGradReady:
			if grads[a.Chunk] != 1 || readies[a.Chunk] > 0 {
				return fmt.Errorf("%s: GradReady of chunk %d needs one Grad before it and comes once", at, a.Chunk)
			}
			readies[a.Chunk]++
			open--
		}
	}
	if held >= 0 {
		return fmt.Errorf("access order: chunk %d is never released", held)
	}
	for c := range chunks {
		switch {
		case !read[c]:
			return fmt.Errorf("access order: chunk %d is never acquired in the forward (the engine brings each chunk's update to the devices at its first forward Acquire)", c)
		case readies[c] != 1:
			return fmt.Errorf("access order: chunk %d has no Grad and GradReady in the backward (every chunk trains; freeze one with strata.freeze)", c)
		}
	}
	return nil
}

// Resident keeps every chunk's parameters and gradients allocated on one
// device for the whole run: the Params of the plain training loop and the
// tests. Acquire and Grad return the same buffers every time and never
// fail; Release and GradReady do nothing because there is no other stream
// to tell. Freeze marks chunks frozen (FrozenParams): the backward then
// leaves their gradients as they were.
type Resident struct {
	dev    gpu.Device
	layout *Layout
	params []gpu.Buffer
	grads  []gpu.Buffer
	frozen []bool
}

// Freeze marks chunk c frozen.
func (r *Resident) Freeze(c int) {
	if r.frozen == nil {
		r.frozen = make([]bool, len(r.params))
	}
	r.frozen[c] = true
}

// Frozen implements FrozenParams.
func (r *Resident) Frozen(c int) bool { return r.frozen != nil && r.frozen[c] }

// NewResident allocates params and grads of dtype dt (F32, BF16 or F16)
// for every chunk of layout on dev, zeroed, tagged gpu.ModelState.
func NewResident(dev gpu.Device, layout *Layout, dt gpu.DType) (*Resident, error) {
	if dt != gpu.F32 && !dt.Half() {
		return nil, fmt.Errorf("model: parameter dtype %s is not f32, bf16 or f16", dt)
	}
	r := &Resident{dev: dev, layout: layout}
	for _, ch := range layout.Chunks {
		p, err := dev.Alloc(ch.Len, dt, gpu.Tag{Kind: gpu.ModelState, Purpose: "param"})
		if err != nil {
			r.Free()
			return nil, fmt.Errorf("model: params of chunk %d: %w", ch.Index, err)
		}
		r.params = append(r.params, p)
		g, err := dev.Alloc(ch.Len, dt, gpu.Tag{Kind: gpu.ModelState, Purpose: "grad"})
		if err != nil {
			r.Free()
			return nil, fmt.Errorf("model: grads of chunk %d: %w", ch.Index, err)
		}
		r.grads = append(r.grads, g)
	}
	return r, nil
}

// Free releases all buffers; the streams that used them must have completed.
func (r *Resident) Free() {
	for _, b := range r.params {
		r.dev.Free(b)
	}
	for _, b := range r.grads {
		r.dev.Free(b)
	}
	r.params, r.grads = nil, nil
}

// Param returns chunk c's parameter buffer.
func (r *Resident) Param(c int) gpu.Buffer { return r.params[c] }

// GradBuffer returns chunk c's gradient buffer.
func (r *Resident) GradBuffer(c int) gpu.Buffer { return r.grads[c] }

// Acquire implements Params.
func (r *Resident) Acquire(_ gpu.Stream, c int, _ shard.Phase) (gpu.Buffer, error) {
	return r.params[c], nil
}

// Release implements Params.
func (r *Resident) Release(gpu.Stream, int, shard.Phase) {}

// Grad implements Params.
func (r *Resident) Grad(_ gpu.Stream, c int) (gpu.Buffer, error) { return r.grads[c], nil }

// GradReady implements Params.
func (r *Resident) GradReady(gpu.Stream, int) error { return nil }

// Load enqueues the upload of host parameters (one []float32 per chunk, as
// Layout.Init returns) on s, rounding to bf16 on the host when the params
// are BF16. The host data is copied before Load returns.
func (r *Resident) Load(s gpu.Stream, chunks [][]float32) {
	if len(chunks) != len(r.params) {
		panic(fmt.Sprintf("model: Load got %d chunks, layout has %d", len(chunks), len(r.params)))
	}
	for c, v := range chunks {
		upload(r.dev, s, r.params[c], v)
	}
}

// ZeroGrads enqueues zeroing every gradient buffer on s.
func (r *Resident) ZeroGrads(s gpu.Stream) {
	ops := r.dev.Ops()
	for _, g := range r.grads {
		ops.Fill(s, g, 0)
	}
}

// ReadParams synchronizes s and returns every chunk's parameters as float32.
func (r *Resident) ReadParams(s gpu.Stream) ([][]float32, error) {
	return download(r.dev, s, r.params)
}

// ReadGrads synchronizes s and returns every chunk's gradients as float32.
func (r *Resident) ReadGrads(s gpu.Stream) ([][]float32, error) {
	return download(r.dev, s, r.grads)
}

// upload enqueues copying v (converted to dst's dtype) into dst on s. The
// staging bytes are a fresh allocation that nothing else touches, so the
// caller may reuse v at once.
func upload(dev gpu.Device, s gpu.Stream, dst gpu.Buffer, v []float32) {
	if dst.Len() != len(v) {
		panic(fmt.Sprintf("model: upload of %d values into a buffer of %d", len(v), dst.Len()))
	}
	if len(v) == 0 {
		return
	}
	var b []byte
	switch dst.DType() {
	case gpu.F32:
		b = make([]byte, 4*len(v))
		copy(f32View(b), v)
	case gpu.BF16, gpu.F16:
		b = make([]byte, 2*len(v))
		dtype.Narrow(dst.DType(), u16View(b), v)
	default:
		panic(fmt.Sprintf("model: upload into a %s buffer", dst.DType()))
	}
	dev.CopyHostToDevice(s, dst, 0, b)
}

// download copies bufs to the host, synchronizes s and widens to float32.
func download(dev gpu.Device, s gpu.Stream, bufs []gpu.Buffer) ([][]float32, error) {
	raw := make([][]byte, len(bufs))
	for i, b := range bufs {
		raw[i] = make([]byte, b.Bytes())
		if b.Len() > 0 {
			dev.CopyDeviceToHost(s, raw[i], b, 0)
		}
	}
	if err := s.Synchronize(); err != nil {
		return nil, fmt.Errorf("model: download: %w", err)
	}
	out := make([][]float32, len(bufs))
	for i, b := range bufs {
		out[i] = make([]float32, b.Len())
		switch b.DType() {
		case gpu.F32:
			copy(out[i], f32View(raw[i]))
		case gpu.BF16, gpu.F16:
			dtype.Widen(b.DType(), out[i], u16View(raw[i]))
		default:
			panic(fmt.Sprintf("model: download of a %s buffer", b.DType()))
		}
	}
	return out, nil
}

// f32View, u16View, i32View and f64View reinterpret host bytes
// (little-endian, as the copies are) in place.
func f32View(b []byte) []float32 { return dtype.Float32s(b) }
func u16View(b []byte) []uint16  { return dtype.Uint16s(b) }
func i32View(b []byte) []int32   { return dtype.Int32s(b) }
func f64View(b []byte) []float64 { return dtype.Float64s(b) }
