package engine

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/internal/bf16"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/nvme/nvmetest"
)

// chunkValues is a ChunkSource over chunks in memory that records the
// order it is read in and can fail at one chunk.
type chunkValues struct {
	shape  model.Shape
	chunks [][]float32
	read   []int
	failAt int // -1: never
}

func (s *chunkValues) Shape() model.Shape { return s.shape }

func (s *chunkValues) ReadChunk(c int, dst []float32) error {
	s.read = append(s.read, c)
	if c == s.failAt {
		return errors.New("disk on fire")
	}
	if len(dst) != len(s.chunks[c]) {
		return errors.New("wrong length")
	}
	copy(dst, s.chunks[c])
	return nil
}

// sourceFor is a source of chunks unlike the seeded initialisation of
// cfg's shape (a different seed, every value distinct from it).
func sourceFor(t *testing.T, cfg *config.Config) *chunkValues {
	t.Helper()
	l, err := model.NewLayout(model.Shape(*cfg.Shape()))
	if err != nil {
		t.Fatal(err)
	}
	chunks := l.Init(99)
	for c := range chunks {
		for i := range chunks[c] {
			chunks[c][i] += 0.001 * float32(i%7) // gains and biases too
		}
	}
	return &chunkValues{shape: l.Shape, chunks: chunks, failAt: -1}
}

// TestInitFromSource checks that an engine given Options.Init holds the
// source's values, each chunk read once and in order, in every place the
// model state can live: device buffers at stages 0-3, the host optimizer,
// fp32 mode, and the tier store with params and optimizer on NVMe. The
// master weights are the source's values bit for bit; the bf16 params are
// them rounded to nearest even.
func TestInitFromSource(t *testing.T) {
	type setup struct {
		name string
		cfg  func(t *testing.T) (*config.Config, Options)
		n    int
	}
	var setups []setup
	for _, s := range []runSpec{
		{stage: 0, n: 2, micro: 1, accum: 1},
		{stage: 3, n: 2, micro: 1, accum: 1},
		{stage: 3, n: 2, offload: true, micro: 1, accum: 1},
		{stage: 3, n: 3, micro: 1, accum: 1, fp32: true},
	} {
		setups = append(setups, setup{s.String(), func(t *testing.T) (*config.Config, Options) {
			opts := Options{Corpus: model.Tokens(testTokens), OptimizerThreads: 2}
			if s.fp32 {
				opts.Precision = gpu.F32
			}
			return testConfig(t, s.configJSON()), opts
		}, s.n})
	}
	nv := tierSpec{n: 2, param: "nvme", opt: "nvme", shapeJSON: deepShapeJSON}
	setups = append(setups, setup{nv.String(), func(t *testing.T) (*config.Config, Options) {
		nvmetest.Require(t)
		return testConfig(t, nv.configJSON(nvmetest.Dir(t))), Options{Corpus: model.Tokens(testTokens), OptimizerThreads: 2}
	}, nv.n})
	for _, s := range setups {
		t.Run(s.name, func(t *testing.T) {
			cfg, opts := s.cfg(t)
			src := sourceFor(t, cfg)
			opts.Init = src
			devs, comms, err := cpu.New(cpu.Options{Devices: s.n, HBMBytes: 256 << 20})
			if err != nil {
				t.Fatal(err)
			}
			e, err := startEngine(t, cfg, cpu.Devices(devs), comms, opts)
			if err != nil {
				t.Fatal(err)
			}
			for i, c := range src.read {
				if c != i || len(src.read) != len(src.chunks) {
					t.Fatalf("chunks read in the order %v", src.read)
				}
			}
			master, err := e.Master()
			if err != nil {
				t.Fatal(err)
			}
			params, err := e.Params()
			if err != nil {
				t.Fatal(err)
			}
			for c, want := range src.chunks {
				for i, v := range want {
					if math.Float32bits(master[c][i]) != math.Float32bits(v) {
						t.Fatalf("master chunk %d element %d: %v, the source has %v", c, i, master[c][i], v)
					}
					p := v
					if opts.Precision != gpu.F32 {
						p = bf16.Round(v)
					}
					if math.Float32bits(params[c][i]) != math.Float32bits(p) {
						t.Fatalf("param chunk %d element %d: %v, want %v (the source's %v)", c, i, params[c][i], p, v)
					}
				}
			}
			trainFor(t, e, 1) // and it trains
		})
	}
}

// TestInitFromSourceTrainsAsSeeded checks that a run whose source holds
// the seeded initialisation ends bit-identical to the seeded run (stage 3,
// host optimizer, 3 steps).
func TestInitFromSourceTrainsAsSeeded(t *testing.T) {
	s := runSpec{stage: 3, n: 2, offload: true, micro: 1, accum: 1, clip: 1}
	want, _ := runEngine(t, s, 3)
	cfg := testConfig(t, s.configJSON())
	l, _ := model.NewLayout(model.Shape(*cfg.Shape()))
	src := &chunkValues{shape: l.Shape, chunks: l.Init(testSeed), failAt: -1}
	devs, comms, err := cpu.New(cpu.Options{Devices: s.n, HBMBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	e, err := startEngine(t, cfg, cpu.Devices(devs), comms, Options{Corpus: model.Tokens(testTokens), OptimizerThreads: 2, Init: src})
	if err != nil {
		t.Fatal(err)
	}
	got := trainFor(t, e, 3)
	for i := range got {
		if got[i] != want.losses[i] {
			t.Fatalf("step %d: loss %v, the seeded run's %v", i+1, got[i], want.losses[i])
		}
	}
	master, _ := e.Master()
	for c := range master {
		for i := range master[c] {
			if math.Float32bits(master[c][i]) != math.Float32bits(want.master[c][i]) {
				t.Fatalf("after 3 steps, master chunk %d element %d: %v, the seeded run's %v", c, i, master[c][i], want.master[c][i])
			}
		}
	}
}

// TestInitFromSourceRefuses: a source of another shape is refused before
// anything is allocated, and a failing read ends New naming the chunk.
func TestInitFromSourceRefuses(t *testing.T) {
	s := runSpec{stage: 3, n: 2, micro: 1, accum: 1}
	cfg := testConfig(t, s.configJSON())
	src := sourceFor(t, cfg)
	other := src.shape
	other.Layers = 3
	other.Name = "other"
	devs, comms, err := cpu.New(cpu.Options{Devices: s.n, HBMBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	_, err = startEngine(t, cfg, cpu.Devices(devs), comms, Options{Corpus: model.Tokens(testTokens), Init: &chunkValues{shape: other}})
	if err == nil || !strings.Contains(err.Error(), "the initial weights are of shape other (L=3") {
		t.Errorf("a source of another shape: %v", err)
	}
	src.failAt = 2
	_, err = startEngine(t, cfg, cpu.Devices(devs), comms, Options{Corpus: model.Tokens(testTokens), Init: src})
	if err == nil || !strings.Contains(err.Error(), "initial weights of chunk 2 (block 1): disk on fire") {
		t.Errorf("a failing source: %v", err)
	}
}
