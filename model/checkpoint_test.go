package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/shard"
)

// hostInputs is an InputStore for the tests: SaveInput copies the input to
// host memory on a stream of its own (after the model's work on s), so
// that a model that overwrote a ring slot before the copy read it would
// hand back other bits; RestoreInput copies it into a fresh device buffer.
// It logs its calls into the recorder's log.
type hostInputs struct {
	*recorder
	dev    gpu.Device
	cs     gpu.Stream
	saved  map[int][]byte
	back   map[int]gpu.Buffer
	dtype  gpu.DType
	copies int
}

func newHostInputs(dev gpu.Device, r *recorder) *hostInputs {
	return &hostInputs{recorder: r, dev: dev, cs: dev.NewStream(), saved: map[int][]byte{}, back: map[int]gpu.Buffer{}}
}

func (h *hostInputs) SaveInput(s gpu.Stream, l int, x gpu.Buffer) (gpu.Event, error) {
	h.log = append(h.log, Access{AccessSaveInput, BlockChunk(l), shard.Forward})
	if err := h.fail(); err != nil {
		return nil, err
	}
	ev := h.dev.NewEvent()
	s.Record(ev)
	h.cs.Wait(ev)
	b := make([]byte, x.Bytes())
	h.dev.CopyDeviceToHost(h.cs, b, x, 0)
	done := h.dev.NewEvent()
	h.cs.Record(done)
	h.saved[l], h.dtype = b, x.DType()
	h.copies++
	return done, nil
}

func (h *hostInputs) RestoreInput(s gpu.Stream, l int) (gpu.Buffer, error) {
	h.log = append(h.log, Access{AccessRestoreInput, BlockChunk(l), shard.Backward})
	if err := h.fail(); err != nil {
		return nil, err
	}
	if err := h.cs.Synchronize(); err != nil {
		return nil, err
	}
	b := h.saved[l]
	buf, err := h.dev.Alloc(len(b)/h.dtype.Size(), h.dtype, gpu.Tag{Kind: gpu.Activation, Purpose: "restored input"})
	if err != nil {
		return nil, err
	}
	h.dev.CopyHostToDevice(s, buf, 0, b)
	h.back[l] = buf
	return buf, nil
}

func (h *hostInputs) ReleaseInput(s gpu.Stream, l int) {
	h.log = append(h.log, Access{AccessReleaseInput, BlockChunk(l), shard.Backward})
	s.Synchronize()
	h.dev.Free(h.back[l])
	delete(h.back, l)
}

// ckptResult is one micro-batch's loss and gradients.
type ckptResult struct {
	loss  float64
	grads [][]float32
	log   []Access
}

// runPass runs Forward and Backward of b on a model of shape with options
// o, params p (dtype dt), through a hostInputs when o.Offload.
func runPass(t *testing.T, dev gpu.Device, shape Shape, p [][]float32, dt gpu.DType, o ActivationOptions, b Batch) ckptResult {
	t.Helper()
	s := dev.DefaultStream()
	l, err := NewLayout(shape)
	if err != nil {
		t.Fatal(err)
	}
	res, err := NewResident(dev, l, dt)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Free()
	res.Load(s, p)
	res.ZeroGrads(s)
	m, err := NewWith(dev, l, b.Rows, b.Seq, o)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	rec := &recorder{Resident: res}
	var params Params = rec
	if o.Offload {
		params = newHostInputs(dev, rec)
	}
	// Two micro-batches: the second Forward reuses the ring and the work
	// set after a whole pass, and the gradient accumulates over both.
	for range 2 {
		if err := m.Forward(s, params, b); err != nil {
			t.Fatal(err)
		}
		if err := m.Backward(s, params, 0.5); err != nil {
			t.Fatal(err)
		}
	}
	loss, err := m.Loss(s)
	if err != nil {
		t.Fatal(err)
	}
	g, err := res.ReadGrads(s)
	if err != nil {
		t.Fatal(err)
	}
	return ckptResult{loss, g, rec.log}
}

// sameBits says where two sets of chunks first differ in their bits.
func sameBits(a, b [][]float32) error {
	for c := range a {
		for i := range a[c] {
			if math.Float32bits(a[c][i]) != math.Float32bits(b[c][i]) {
				return fmt.Errorf("chunk %d [%d]: %v vs %v", c, i, a[c][i], b[c][i])
			}
		}
	}
	return nil
}

// TestCheckpointingBitIdentical: recomputing the checkpointed blocks in
// the backward gives the loss and every gradient bit for bit, for GPT-2,
// Llama (GQA, untied head) and Qwen2 (biases, tied head) on packed rows
// with ignored targets, in fp32 and with bf16 params and activations, with
// every block, one block or half of them checkpointed, their inputs kept
// on the device or handed to an InputStore (whose calls come in
// AccessOrderWith's order).
func TestCheckpointingBitIdentical(t *testing.T) {
	dev := newDevice(t)
	rng := rand.New(rand.NewPCG(8, 9))
	for _, gc := range gradCases(rng) {
		shape := gc.shape
		shape.Layers = 4 // checkpoint some blocks and not others
		l, _ := NewLayout(shape)
		p := perturbedParams(l, 3)
		for _, dt := range []gpu.DType{gpu.F32, gpu.BF16} {
			want := runPass(t, dev, shape, p, dt, ActivationOptions{DType: dt}, gc.batch)
			for _, o := range []ActivationOptions{{DType: dt, Checkpoint: 4}, {DType: dt, Checkpoint: 1}, {DType: dt, Checkpoint: 2},
				{DType: dt, Checkpoint: 4, Offload: true}, {DType: dt, Checkpoint: 2, Offload: true}} {
				t.Run(fmt.Sprintf("%s/%s/ckpt%d/offload%t", gc.name, dt, o.Checkpoint, o.Offload), func(t *testing.T) {
					got := runPass(t, dev, shape, p, dt, o, gc.batch)
					if math.Float64bits(got.loss) != math.Float64bits(want.loss) {
						t.Errorf("loss %v, without checkpointing %v", got.loss, want.loss)
					}
					if err := sameBits(got.grads, want.grads); err != nil {
						t.Errorf("gradients: %v", err)
					}
					order := AccessOrderWith(shape, o)
					if wantLog := append(slices.Clone(order), order...); !slices.Equal(got.log, wantLog) {
						t.Errorf("calls %v\nwant %v", got.log, wantLog)
					}
				})
			}
		}
	}
}

// TestCheckpointingChangesWhatIsKept: the device holds what
// ActivationBytesWith says for each option, and checkpointing every block
// of a 4-block model keeps less than half of what no checkpointing keeps.
func TestCheckpointingChangesWhatIsKept(t *testing.T) {
	dev := newDevice(t)
	shape, _ := Lookup("small")
	l, _ := NewLayout(shape)
	var none int64
	for _, o := range []ActivationOptions{{DType: gpu.BF16}, {DType: gpu.BF16, Checkpoint: 4}, {DType: gpu.BF16, Checkpoint: 2},
		{DType: gpu.BF16, Checkpoint: 4, Offload: true}, {DType: gpu.F32, Checkpoint: 4}} {
		before := dev.MemStats().InUseByKind[gpu.Activation]
		m, err := NewWith(dev, l, 2, 64, o)
		if err != nil {
			t.Fatal(err)
		}
		got := dev.MemStats().InUseByKind[gpu.Activation] - before
		want := ActivationBytesWith(shape, 2, 64, o)
		// The device rounds each allocation up to its granularity (64
		// bytes on gpu/cpu, below 1 KiB on any backend).
		if got < want || got > want+int64(len(planActivations(shape, 2, 64, o, nil)))*1024 {
			t.Errorf("%v: device holds %d activation bytes, ActivationBytesWith %d", o, got, want)
		}
		m.Free()
		if o.Checkpoint == 0 {
			none = want
		} else if o.Checkpoint == 4 && o.DType == gpu.BF16 && 2*want > none {
			t.Errorf("%v: %d bytes, more than half of %d without checkpointing", o, want, none)
		}
	}
}

// TestChunkedLossMatchesWhole: with the loss chunk made small enough that
// the 32 tokens go in 3 slices (11, 11, 10), the loss and the gradients
// match the one-slice pass. Tolerance: the per-token losses are the same
// computation; the head's weight gradient is the sum over tokens in three
// GEMMs (beta 1) instead of one, another fp32 grouping of at most 32
// terms: 1e-6 of the largest gradient.
func TestChunkedLossMatchesWhole(t *testing.T) {
	dev := newDevice(t)
	rng := rand.New(rand.NewPCG(3, 4))
	for _, shape := range []Shape{checkShape, checkLlama} {
		l, _ := NewLayout(shape)
		p := perturbedParams(l, 5)
		b := Batch{Rows: 4, Seq: 8, IDs: randomTokens(rng, 32, 256), Targets: randomTokens(rng, 32, 256)}
		whole := runPass(t, dev, shape, p, gpu.F32, ActivationOptions{}, b)
		saved := lossChunkMaxBytes
		lossChunkMaxBytes = 11 * 256 * 4
		if r := lossRows(32, 256); r != 11 {
			t.Fatalf("lossRows %d, want 11", r)
		}
		sliced := runPass(t, dev, shape, p, gpu.F32, ActivationOptions{}, b)
		lossChunkMaxBytes = saved
		if math.Abs(sliced.loss-whole.loss) > 1e-6*whole.loss {
			t.Errorf("%s: loss %v in slices, %v whole", shape.Name, sliced.loss, whole.loss)
		}
		var scale, worst float64
		for c := range whole.grads {
			for i, g := range whole.grads[c] {
				scale = max(scale, math.Abs(float64(g)))
				worst = max(worst, math.Abs(float64(g-sliced.grads[c][i])))
			}
		}
		if worst > 1e-6*scale {
			t.Errorf("%s: gradients differ by %g (largest %g)", shape.Name, worst, scale)
		}
		t.Logf("%s: loss %v vs %v, worst gradient difference %.2e of the largest", shape.Name, sliced.loss, whole.loss, worst/scale)
	}
}

// TestOffloadNeedsInputStore: a model that offloads its checkpointed
// inputs refuses Params without InputStore, naming the interface.
func TestOffloadNeedsInputStore(t *testing.T) {
	dev := newDevice(t)
	s := dev.DefaultStream()
	l, _ := NewLayout(checkShape)
	res, _ := NewResident(dev, l, gpu.F32)
	defer res.Free()
	m, err := NewWith(dev, l, 1, 4, ActivationOptions{Checkpoint: 2, Offload: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	if err := m.Forward(s, res, Batch{IDs: []int32{1, 2, 3, 4}, Targets: []int32{2, 3, 4, 5}}); err == nil {
		t.Error("forward with a Resident: no error")
	} else if want := "InputStore"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not name %s", err, want)
	}
	if _, err := NewWith(dev, l, 1, 4, ActivationOptions{Offload: true}); err == nil {
		t.Error("offload without checkpointing accepted")
	}
	if _, err := NewWith(dev, l, 1, 4, ActivationOptions{Checkpoint: 3}); err == nil {
		t.Error("3 checkpoints of a 2-block model accepted")
	}
}
