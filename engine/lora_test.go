package engine

import (
	"strings"
	"testing"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
)

// loraKeys is the strata.lora of the LoRA runs: every linear of deepShapeJSON's
// GPT-2 blocks, rank 4, adapter dropout 0.1.
const loraKeys = `"lora": {"r": 4, "alpha": 8, "dropout": 0.1, "target_modules": ["c_attn", "c_proj", "c_fc"]}`

// TestLoRAEquivalence: a LoRA run (the base frozen, an adapter chunk per
// block training, its inputs dropped out) on N = 2 devices gives the same bits — losses, every
// chunk's params — whatever the stage and wherever the state lives, as
// the resident run (stage 0, everything on the devices), the base on NVMe
// among them; the base ends at its initial bits and every adapter chunk
// trains. (overlap dpu updates from one step late by design: its runs
// equal a dpu reference, as TestFreezeEquivalence checks for frozen
// chunks.)
func TestLoRAEquivalence(t *testing.T) {
	const steps, n = 4, 2
	ref := runFrozenJSON(t, withStrata(freezeSpec{stage: 0, n: n, opt: "none", param: "none"}.configJSON(t), loraKeys), n, steps, nil)
	l := ref.e.layout
	if l.LoRA == nil || len(l.Chunks) != 8+6 {
		t.Fatalf("layout: LoRA %v, %d chunks; want 8 base chunks and 6 adapter chunks", l.LoRA, len(l.Chunks))
	}
	for c := range l.Chunks {
		p0, _ := initialParams(ref.e, c)
		changed := sameBits(ref.res.params[c], p0) != 0
		if changed != l.IsAdapter(c) {
			t.Errorf("chunk %d (%s): changed %v, adapter %v", c, l.Chunks[c].Name, changed, l.IsAdapter(c))
		}
	}
	noDrop := runFrozenJSON(t, withStrata(freezeSpec{stage: 0, n: n, opt: "none", param: "none"}.configJSON(t), strings.Replace(loraKeys, `"dropout": 0.1`, `"dropout": 0`, 1)), n, steps, nil)
	if sameBits(noDrop.res.params[l.AdapterChunk(0)], ref.res.params[l.AdapterChunk(0)]) == 0 {
		t.Error("dropout 0.1 trained the adapters as dropout 0 does: no input was dropped")
	}
	specs := []freezeSpec{
		{stage: 1, n: n, opt: "cpu", param: "none"},
		{stage: 2, n: n, opt: "none", param: "none"},
		{stage: 3, n: n, opt: "none", param: "none"},
		{stage: 3, n: n, opt: "cpu", param: "cpu"},
		{stage: 3, n: n, opt: "nvme", param: "nvme"},
		{stage: 2, n: n, opt: "cpu", param: "none", extra: `"update_in_backward": true`},
		{stage: 1, n: n, opt: "cpu", param: "none", extra: `"overlap": "serial"`},
	}
	for _, s := range specs {
		t.Run(s.String(), func(t *testing.T) {
			got := runFrozenJSON(t, withStrata(s.configJSON(t), loraKeys), n, steps, nil)
			for i := range steps {
				if got.res.losses[i] != ref.res.losses[i] {
					t.Errorf("step %d: loss %v, resident run %v", i, got.res.losses[i], ref.res.losses[i])
				}
			}
			for c := range l.Chunks {
				if m := sameBits(got.res.params[c], ref.res.params[c]); m != 0 {
					t.Errorf("chunk %d (%s): %d params differ from the resident run's", c, l.Chunks[c].Name, m)
				}
			}
		})
	}
}

// TestLoRAResume: a LoRA run saved after k steps and resumed gives the
// bits of the run that never stopped (checkResume), the base on NVMe; a
// checkpoint of a LoRA run refuses a run without strata.lora, and one of
// a full run refuses a LoRA run, each naming the way out.
func TestLoRAResume(t *testing.T) {
	s := freezeSpec{stage: 3, n: 2, opt: "nvme", param: "nvme"}
	js := withStrata(s.configJSON(t), loraKeys)
	checkResume(t, func(t *testing.T) *Engine { return newEngineJSON(t, js, 2) }, 3)

	dir := t.TempDir()
	lora := newEngineJSON(t, js, 2)
	if _, err := lora.Step(); err != nil {
		t.Fatal(err)
	}
	path, err := lora.SaveCheckpoint(dir, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	full := newEngineJSON(t, s.configJSON(t), 2)
	if err := full.LoadCheckpoint(path); err == nil || !strings.Contains(err.Error(), "saved with LoRA adapters (r 4, c_attn, c_proj, c_fc), this run has no strata.lora") {
		t.Errorf("full run from a LoRA checkpoint: %v", err)
	}
	fullPath, err := full.SaveCheckpoint(t.TempDir(), checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := newEngineJSON(t, js, 2).LoadCheckpoint(fullPath); err == nil || !strings.Contains(err.Error(), "saved without LoRA, this run trains LoRA adapters") {
		t.Errorf("LoRA run from a full checkpoint: %v", err)
	}
}

// codedSource is the seeded initialisation of layout l with every base
// chunk as its coding (dt: NF4, INT8) gives it back (quantized and
// decoded, per rank shard as the engine quantizes them): the initial
// values of a bf16 base that equals the coded base on the device.
type codedSource struct {
	l      *model.Layout
	seed   uint64
	shards []int // per chunk: the rank shard's elements
	dt     dtype.DType
}

func (s codedSource) Shape() model.Shape { return s.l.Shape }

func (s codedSource) ReadChunk(c int, dst []float32) error {
	s.l.InitChunkInto(s.seed, c, dst)
	if s.l.IsAdapter(c) {
		return nil
	}
	n := s.shards[c]
	padded := make([]float32, (len(dst)+n-1)/n*n)
	copy(padded, dst)
	for lo := 0; lo < len(padded); lo += n {
		dequantize(s.dt, padded[lo:lo+n], quantize(s.dt, padded[lo:lo+n]))
	}
	copy(dst, padded)
	return nil
}

// TestLoRACodedBase: a LoRA run whose frozen base streams from NVMe (and
// from host RAM) in NF4 (and in INT8) trains bit for bit as a bf16-base run started
// from the same weights quantized and decoded (the device decodes the NF4
// shards to exactly those bf16 values), resumes bit-identically, and moves
// fewer bytes host to device (the base in NF4; the tiny model's adapters
// and saved inputs weigh as much as its base, so the ratio is measured on
// gpt2 by bench step, bench/README-step.md).
func TestLoRACodedBase(t *testing.T) {
	const steps, n = 4, 2
	for _, c := range []struct {
		base, param string
		dt          dtype.DType
	}{{"nf4", "nvme", dtype.NF4}, {"nf4", "cpu", dtype.NF4}, {"int8", "nvme", dtype.INT8}} {
		nf4Keys := strings.Replace(loraKeys, `"dropout": 0.1,`, `"dropout": 0.1, "base_dtype": "`+c.base+`",`, 1)
		param := c.param
		t.Run(c.base+"/"+param, func(t *testing.T) {
			s := freezeSpec{stage: 3, n: n, opt: "nvme", param: param}
			if param == "cpu" {
				s.opt = "cpu"
			}
			js := s.configJSON(t)
			got := runFrozenJSON(t, withStrata(js, nf4Keys), n, steps, nil)
			l := got.e.layout
			shards := make([]int, len(l.Chunks))
			for c := range shards {
				shards[c] = got.e.chunks[c].shard
			}
			devs, comms, err := cpu.New(cpu.Options{Devices: n, HBMBytes: 256 << 20})
			if err != nil {
				t.Fatal(err)
			}
			ref, err := startEngine(t, testConfig(t, withStrata(js, loraKeys)), cpu.Devices(devs), comms,
				Options{Corpus: model.Tokens(testTokens), OptimizerThreads: 2, Init: codedSource{l, got.e.cfg.Strata.Seed, shards, c.dt}})
			if err != nil {
				t.Fatal(err)
			}
			refRun := frozenRun{e: ref}
			for range steps {
				st, err := ref.Step()
				if err != nil {
					t.Fatal(err)
				}
				refRun.res.losses = append(refRun.res.losses, st.Loss)
			}
			if refRun.res.params, err = ref.Params(); err != nil {
				t.Fatal(err)
			}
			for i := range steps {
				if got.res.losses[i] != refRun.res.losses[i] {
					t.Errorf("step %d: loss %v with the %s base, %v with its decoded values in bf16", i, got.res.losses[i], c.base, refRun.res.losses[i])
				}
			}
			for c := range l.Chunks {
				if m := sameBits(got.res.params[c], refRun.res.params[c]); m != 0 {
					t.Errorf("chunk %d (%s): %d params differ", c, l.Chunks[c].Name, m)
				}
			}
			link := func(e *Engine, k shard.Link) int64 { return e.Summary().Tier.LinkBytes[k] }
			base, coded := link(ref, shard.HostToHBM), link(got.e, shard.HostToHBM)
			if !(coded < base) {
				t.Errorf("host->hbm %d bytes with the %s base, %d with bf16", coded, c.base, base)
			}
			t.Logf("%s: host->hbm %.3f of the bf16 base's, nvme->host %d vs %d", param, float64(coded)/float64(base), link(got.e, shard.NVMeToHost), link(ref, shard.NVMeToHost))
		})
	}
	for _, base := range []string{"nf4", "int8"} {
		s := freezeSpec{stage: 3, n: n, opt: "nvme", param: "nvme"}
		js := withStrata(s.configJSON(t), strings.Replace(loraKeys, `"dropout": 0.1,`, `"dropout": 0.1, "base_dtype": "`+base+`",`, 1))
		checkResume(t, func(t *testing.T) *Engine { return newEngineJSON(t, js, 2) }, 3)
	}
}
