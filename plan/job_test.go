package plan

import (
	"math"
	"strings"
	"testing"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/estimate"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
)

// TestParseJob: --job, --lora and --base-dtype as strata plan reads them,
// the targets defaulting as strata.lora's, one error each for bad input.
func TestParseJob(t *testing.T) {
	s, err := model.Lookup("gpt2")
	if err != nil {
		t.Fatal(err)
	}
	j, err := ParseJob("qlora", "r=8,targets=all-linear", "", s)
	if err != nil || j.LoRA.R != 8 || j.LoRA.Alpha != 16 || j.LoRA.BaseDType != config.BaseNF4 || strings.Join(j.LoRA.Targets, ",") != "all-linear" {
		t.Fatalf("qlora r=8: %+v, %v", j.LoRA, err)
	}
	if back, err := ParseJob("lora", strings.Fields(j.Flags())[3], strings.Fields(j.Flags())[5], s); err != nil || back.Flags() != j.Flags() {
		t.Errorf("flags %q read back as %+v, %v", j.Flags(), back.LoRA, err)
	}
	if j.Name() != "QLoRA (nf4 base) r 8 on all-linear" || j.computeKey() != "lora r=8 targets=all-linear" {
		t.Errorf("name %q, key %q", j.Name(), j.computeKey())
	}
	if j, err := ParseJob("lora", "", "", s); err != nil || j.LoRA.BaseDType != config.BaseBF16 || strings.Join(j.LoRA.Targets, ",") != "c_attn" {
		t.Errorf("lora defaults: %+v, %v", j.LoRA, err)
	}
	for _, c := range []struct{ kind, lora, base, want string }{
		{"full", "r=8", "", "--lora and --base-dtype describe a LoRA job"},
		{"adapter", "", "", `--job "adapter": full, lora or qlora`},
		{"lora", "r=0", "", "the rank is at least 1"},
		{"lora", "rank=4", "", "unknown key"},
		{"lora", "", "fp8", `--base-dtype "fp8"`},
		{"qlora", "", "bf16", "a bf16 base is --job lora"},
		{"lora", "targets=q_proj", "", "--lora:"}, // GPT-2 has no q_proj
	} {
		if _, err := ParseJob(c.kind, c.lora, c.base, s); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %q %q: %v, want %q", c.kind, c.lora, c.base, err, c.want)
		}
	}
}

// TestPredictJobs: a LoRA job's placements, terms and config. The
// adapters are what CPU Adam updates and the copies move up and down;
// a frozen base that does not stay on the devices comes up twice a step
// as stored (nf4: 0.5625 B a param) and is decoded there; a coded base
// lists no placement with the params on the devices; the written config
// carries strata.lora and parses.
func TestPredictJobs(t *testing.T) {
	p := testProfile(Machine{CPU: "x"})
	p.SetDecodeRate(Decode{Format: config.BaseNF4, ParamsPerS: 1e9})
	in := inputs(t, "gpt2")
	job, err := ParseJob("qlora", "r=8", "", in.Shape)
	if err != nil {
		t.Fatal(err)
	}
	in.Job = job
	p.SetCompute(Compute{Model: "gpt2", Job: job.computeKey(), Devices: 1, Batch: 2, Seq: 64, FwdBwdSeconds: 1, DeviceAdamSeconds: 0.001, CheckpointFwdBwdSeconds: 1.25})
	if _, err := Predict(p, Inputs{Model: "gpt2", Shape: in.Shape, Devices: 1, Batch: 2, Seq: 64}); err == nil {
		t.Fatal("the full fine-tune predicted from the LoRA job's step")
	}
	preds, err := Predict(p, in)
	if err != nil {
		t.Fatal(err)
	}
	if len(preds) != 6 { // params on host, optimizer on NVMe + params on host, both on NVMe; each checkpointed
		t.Fatalf("%d placements, want 6", len(preds))
	}
	psi := float64(in.Shape.ParamCount())
	l, _ := model.NewLayout(in.Shape)
	la, _ := l.WithLoRA(*job.modelLoRA())
	ad := float64(la.ParamCount()) - psi
	nf4 := float64(estimate.BaseDType(config.BaseNF4).Bytes(1<<20)) / (1 << 20)
	for _, pr := range preds {
		if pr.Params == shard.HBM {
			t.Errorf("%s: a coded base with the params on the devices", pr.Name)
		}
		near := func(what string, got, want float64) {
			t.Helper()
			if math.Abs(got-want) > 1e-9*math.Max(1, want) {
				t.Errorf("%s %s: %v, want %v", pr.Name, what, got, want)
			}
		}
		near("adam (the adapters)", pr.Terms["adam"], ad/1e9)
		// gpt2 fits the device's spare memory: only the adapters move.
		near("copies", pr.Terms["copy"], 4*ad/10e9)
		near("decode", pr.Terms["decode"], 0)
	}
	// A device without room for the base: up twice a step as stored,
	// decoded twice, read twice from NVMe.
	small := in
	small.HBMBytes = preds[0].DeviceBytes + int64(psi)
	sp, err := Predict(p, small)
	if err != nil {
		t.Fatal(err)
	}
	for _, pr := range sp {
		near := func(what string, got, want float64) {
			t.Helper()
			if math.Abs(got-want) > 1e-9*math.Max(1, want) {
				t.Errorf("%s %s: %v, want %v", pr.Name, what, got, want)
			}
		}
		near("copies, base not staged", pr.Terms["copy"], (4*ad+2*(2*ad+nf4*psi))/10e9)
		near("decode", pr.Terms["decode"], 2*psi/1e9)
		if pr.Params == shard.NVMe && pr.Optimizer == shard.NVMe {
			st := pr.optOptions().OptimizerBytesPerParam() * ad
			near("disk", pr.Terms["disk"], (st+2*(2*ad+nf4*psi))/2e9+(st+2*ad)/1e9)
		}
	}
	// The engine's NVMe efficiency, measured on this path, slows the disk.
	cm, _ := p.Compute("gpt2", job, 1, 2, 64)
	cm.NVMeEfficiency, cm.NVMePath = 0.5, in.NVMePath
	p.SetCompute(cm)
	sh, _ := Predict(p, small)
	for i, pr := range sh {
		for _, o := range sp {
			if o.Name == pr.Name && math.Abs(pr.Terms["disk"]-2*o.Terms["disk"]) > 1e-12 {
				t.Errorf("%s: disk %v at efficiency 0.5, %v at 1", pr.Name, pr.Terms["disk"], o.Terms["disk"])
			}
		}
		_ = i
	}
	cfg, err := config.Parse([]byte(ConfigJSON(preds[0].Config, in)), "plan", config.Options{LookupShape: model.LookupConfigShape})
	if err != nil {
		t.Fatal(err)
	}
	if l := cfg.Strata.LoRA; l == nil || l.R != 8 || l.BaseDType != config.BaseNF4 {
		t.Fatalf("written config's strata.lora: %+v", l)
	}
	if secs, err := PredictRun(p, cfg, in.Shape, 2*64, in.HBMBytes); err != nil || math.Abs(secs-preds[0].StepSeconds) > 1e-9 {
		t.Errorf("PredictRun of the written config: %v s, %v; plan predicted %v s", secs, err, preds[0].StepSeconds)
	}
}
