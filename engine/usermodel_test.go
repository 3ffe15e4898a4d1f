package engine_test

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/engine"
	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/estimate"
	"github.com/strata-ai/strata/examples/bytemlp"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/internal/leaktest"
	"github.com/strata-ai/strata/model"
)

// The tests of a library model: bytemlp.Model (examples/bytemlp), trained through
// engine.Options.Model with nothing but the engine's exported API.

var userText = []byte(strings.Repeat("pack my box with five dozen liquor jugs. ", 100))

// userConfig is stage on 2 devices, the optimizer on the device or the
// host, every chunk sharded at stage 3, no clipping: the settings under
// which the engine promises the same bits at every stage (A = 1).
func userConfig(t testing.TB, stage int, offload bool, extra string) *config.Config {
	t.Helper()
	dev := "none"
	if offload {
		dev = "cpu"
	}
	js := fmt.Sprintf(`{
  "train_micro_batch_size_per_gpu": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-2, "weight_decay": 0.01}},
  "zero_optimization": {"stage": %d, "stage3_param_persistence_threshold": 0, "offload_optimizer": {"device": %q}},
  "strata": {"devices": 2, "seq_len": 16, "seed": 3%s}
}`, stage, dev, extra)
	cfg, err := config.Parse([]byte(js), "user.json", config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// newUserEngine starts an engine of m under cfg on 2 CPU devices, closed
// (and checked for leaks) when the test ends.
func newUserEngine(t testing.TB, cfg *config.Config, m engine.Model) (*engine.Engine, error) {
	t.Helper()
	leaktest.Check(t)
	devs, comms, err := cpu.New(cpu.Options{Devices: 2, HBMBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(cfg, cpu.Devices(devs), comms, engine.Options{Model: m, Corpus: model.Tokens(model.Encode(userText)), OptimizerThreads: 2})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return e, nil
}

func mustByteMLP(t testing.TB, dim, hid int) *bytemlp.Model {
	t.Helper()
	m, err := bytemlp.New(dim, hid)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

type userRun struct {
	losses         []float64
	params, master [][]float32
}

// runUser trains steps steps and reads the losses, params and master weights.
func runUser(t testing.TB, e *engine.Engine, steps int) userRun {
	t.Helper()
	var r userRun
	if err := e.Run(t.Context(), steps, func(st report.StepStats) error { r.losses = append(r.losses, st.Loss); return nil }); err != nil {
		t.Fatal(err)
	}
	var err error
	if r.params, err = e.Params(); err != nil {
		t.Fatal(err)
	}
	if r.master, err = e.Master(); err != nil {
		t.Fatal(err)
	}
	return r
}

// sameBits says where a and b first differ, bit for bit ("" when nowhere).
func sameBits(a, b userRun) string {
	for i := range a.losses {
		if math.Float64bits(a.losses[i]) != math.Float64bits(b.losses[i]) {
			return fmt.Sprintf("step %d loss %v vs %v", i+1, a.losses[i], b.losses[i])
		}
	}
	for _, s := range []struct {
		name string
		x, y [][]float32
	}{{"params", a.params, b.params}, {"master", a.master, b.master}} {
		for c := range s.x {
			for i := range s.x[c] {
				if math.Float32bits(s.x[c][i]) != math.Float32bits(s.y[c][i]) {
					return fmt.Sprintf("%s chunk %d element %d: %v vs %v", s.name, c, i, s.x[c][i], s.y[c][i])
				}
			}
		}
	}
	return ""
}

// TestUserModelStages: a library model trains to the same bits at ZeRO
// stages 0-3, with the optimizer on the devices or on the host (stages
// 1-3): the guarantee the engine gives the built-in models (one
// micro-batch per step, no clipping) holds for any model that keeps the
// Model contract. The loss falls, so the runs compared are real training.
func TestUserModelStages(t *testing.T) {
	const steps = 12
	var ref userRun
	var refName string
	for stage := range 4 {
		for _, offload := range []bool{false, true} {
			if stage == 0 && offload {
				continue // the host optimizer needs a sharded optimizer state (stages 1-3)
			}
			name := fmt.Sprintf("stage%d/offload=%v", stage, offload)
			cfg, m := userConfig(t, stage, offload, ""), mustByteMLP(t, 16, 32)
			e, err := newUserEngine(t, cfg, m)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			got := runUser(t, e, steps)
			// The estimate from the model's chunks is what each device held.
			mo, err := estimate.OptionsFromConfig(cfg, m.Layout())
			if err != nil {
				t.Fatal(err)
			}
			est, err := estimate.Memory(mo)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range e.Summary().PerDevice {
				if d.ModelStatePeakBytes != est.DeviceBytes() || d.EstimateBytes != est.DeviceBytes() {
					t.Errorf("%s: %s: model-state peak %d bytes, summary's estimate %d, estimate.Memory %d", name, d.Device, d.ModelStatePeakBytes, d.EstimateBytes, est.DeviceBytes())
				}
			}
			if refName == "" {
				ref, refName = got, name
				if !(got.losses[steps-1] < got.losses[0]-0.5) {
					t.Fatalf("%s: losses %v: the model does not learn", name, got.losses)
				}
				continue
			}
			if d := sameBits(ref, got); d != "" {
				t.Errorf("%s differs from %s: %s", name, refName, d)
			}
		}
	}
}

// TestUserModelFreeze: strata.freeze names a library model's tensors; the
// frozen chunk ends as it began, the others train.
func TestUserModelFreeze(t *testing.T) {
	m := mustByteMLP(t, 16, 32)
	e, err := newUserEngine(t, userConfig(t, 3, true, `, "freeze": ["embed."]`), m)
	if err != nil {
		t.Fatal(err)
	}
	before, err := e.Params()
	if err != nil {
		t.Fatal(err)
	}
	after := runUser(t, e, 4).params
	if !slices.Equal(before[0], after[0]) || slices.Equal(before[1], after[1]) || slices.Equal(before[2], after[2]) {
		t.Errorf("frozen embedding changed %v, hidden changed %v, head changed %v",
			!slices.Equal(before[0], after[0]), !slices.Equal(before[1], after[1]), !slices.Equal(before[2], after[2]))
	}
}

// TestUserModelCheckpoint: a library model's checkpoint records its name
// and every chunk's tensors; restored into a new engine of the same model
// (at another stage) training continues to the same bits; restored into
// another version of the model, or into a decoder of package model, it is
// refused; its weights export under the model's own tensor names, and a
// Hugging Face export is refused.
func TestUserModelCheckpoint(t *testing.T) {
	dir := t.TempDir()
	a, err := newUserEngine(t, userConfig(t, 1, false, ""), mustByteMLP(t, 16, 32))
	if err != nil {
		t.Fatal(err)
	}
	runUser(t, a, 3)
	path, err := a.SaveCheckpoint(dir, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := runUser(t, a, 3)

	m, _, err := checkpoint.ReadManifest(path)
	if err != nil {
		t.Fatal(err)
	}
	if m.Model != "byte-mlp" || m.Shape != (model.Shape{}) || len(m.Chunks) != 3 {
		t.Fatalf("manifest: model %q shape %v, %d chunks", m.Model, m.Shape, len(m.Chunks))
	}
	if h := m.Chunks[1].Tensors; len(h) != 2 || h[0].Name != "hidden.weight" || !slices.Equal(h[0].Shape, []int{32, 16}) || h[1].Name != "hidden.bias" {
		t.Errorf("manifest chunk 1 tensors %+v", h)
	}

	b, err := newUserEngine(t, userConfig(t, 3, true, ""), mustByteMLP(t, 16, 32))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.LoadCheckpoint(dir); err != nil {
		t.Fatal(err)
	}
	got := runUser(t, b, 3)
	if d := sameBits(want, got); d != "" {
		t.Errorf("resumed at stage 3 differs from the run that saved: %s", d)
	}

	other, err := newUserEngine(t, userConfig(t, 1, false, ""), mustByteMLP(t, 16, 48))
	if err != nil {
		t.Fatal(err)
	}
	if err := other.LoadCheckpoint(dir); err == nil || !strings.Contains(err.Error(), `model "byte-mlp": chunk 1 saved as "hidden"`) || !strings.Contains(err.Error(), "hidden.weight [48 16]") {
		t.Errorf("checkpoint of hidden 32 into hidden 48: %v", err)
	}

	tiny := userConfig(t, 1, false, `, "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 256, "max_seq_len": 16}`)
	builtin, err := newUserEngine(t, tiny, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := builtin.LoadCheckpoint(dir); err == nil || !strings.Contains(err.Error(), `saved for the custom model "byte-mlp", this run trains shape`) {
		t.Errorf("checkpoint of byte-mlp into a GPT-2: %v", err)
	}

	out := filepath.Join(t.TempDir(), "w.safetensors")
	if _, err := checkpoint.ExportCheckpoint(t.Context(), out, dir, hf.ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	l := mustByteMLP(t, 16, 32).Layout()
	chunks, h, err := hf.Import(out, l, hf.ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h.Metadata[hf.MetaModel] != "byte-mlp" {
		t.Errorf("export metadata %v", h.Metadata)
	}
	saved, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer saved.Close()
	for c, v := range chunks {
		master := make([]float32, len(v))
		if err := saved.ReadChunk(c, master); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(v, master) {
			t.Errorf("exported chunk %d is not the checkpoint's master weights", c)
		}
	}
	if _, err := checkpoint.ExportCheckpoint(t.Context(), out, dir, hf.ExportOptions{Names: hf.NamesHF}); err == nil || !strings.Contains(err.Error(), "custom model") {
		t.Errorf("export under Hugging Face names: %v", err)
	}
	if _, _, err := checkpoint.ExportHF(t.Context(), filepath.Join(t.TempDir(), "hf"), dir, hf.DirOptions{}); err == nil || !strings.Contains(err.Error(), "a Hugging Face config.json cannot describe") {
		t.Errorf("Hugging Face export: %v", err)
	}
}

// TestUserModelRefused: what New refuses of a library model, each with an
// error that names the problem.
func TestUserModelRefused(t *testing.T) {
	m := mustByteMLP(t, 16, 32)
	bad := func(order []model.Access) engine.Model { return orderedMLP{m, order} }
	stack := model.StackOrder(3)
	cases := []struct {
		name  string
		cfg   *config.Config
		model engine.Model
		want  string
	}{
		{"strata.model names another", userConfig(t, 1, false, `, "model": "gpt2"`), m, `strata.model names "gpt2", but Options.Model is "byte-mlp"`},
		{"strata.model is a shape", userConfig(t, 1, false, `, "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 256, "max_seq_len": 16}`), m, "strata.model is a shape"},
		{"a chunk never read in the forward", userConfig(t, 1, false, ""), bad(slices.Delete(slices.Clone(stack), 2, 4)), "chunk 1 is never acquired in the forward"},
		{"two chunks acquired", userConfig(t, 1, false, ""), bad(slices.Concat(stack[:1], stack[2:3], stack[1:2], stack[3:])), "chunk 0 is still acquired"},
		{"a chunk without gradient", userConfig(t, 1, false, ""), bad(stack[:len(stack)-4]), "chunk 0 has no Grad and GradReady"},
		{"forward after backward", userConfig(t, 1, false, ""), bad(slices.Concat(stack, stack[:2])), "a forward call after the backward began"},
		{"chunk out of range", userConfig(t, 1, false, ""), bad(slices.Concat(stack[:6], []model.Access{{Kind: model.AccessAcquire, Chunk: 3}}, stack[6:])), "chunk 3 is outside the layout's 3 chunks"},
		{"a decoder's layout", userConfig(t, 1, false, ""), decoderMLP{m}, "has a layout of package model"},
	}
	// The model names itself in strata.model: accepted.
	named := userConfig(t, 1, false, `, "model": "byte-mlp"`)
	if _, err := newUserEngine(t, named, m); err != nil {
		t.Errorf("strata.model naming the model: %v", err)
	}
	if e, err := newUserEngine(t, named, m); err == nil && e.Config().Strata.Model.Name != "byte-mlp" {
		t.Errorf("the engine's config names %q", e.Config().Strata.Model.Name)
	}
	for _, tc := range cases {
		if _, err := newUserEngine(t, tc.cfg, tc.model); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	devs, comms, err := cpu.New(cpu.Options{Devices: 2})
	if err != nil {
		t.Fatal(err)
	}
	_, err = engine.New(userConfig(t, 1, false, ""), cpu.Devices(devs), comms, engine.Options{Model: m, Init: fakeSource{}})
	if err == nil || !strings.Contains(err.Error(), "Options.Init and Options.Model") {
		t.Errorf("Init with a library model: %v", err)
	}
}

// orderedMLP is bytemlp.Model declaring another access order.
type orderedMLP struct {
	*bytemlp.Model
	order []model.Access
}

func (m orderedMLP) AccessOrder() []model.Access { return m.order }

// decoderMLP is bytemlp.Model claiming a decoder's layout.
type decoderMLP struct{ *bytemlp.Model }

func (decoderMLP) Layout() *model.Layout {
	s, _ := model.Lookup("tiny")
	l, err := model.NewLayout(s)
	if err != nil {
		panic(err)
	}
	return l
}

// fakeSource is a ChunkSource New must refuse before reading it.
type fakeSource struct{}

func (fakeSource) Shape() model.Shape             { return model.Shape{} }
func (fakeSource) ReadChunk(int, []float32) error { panic("read") }
