package plan

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
)

func testProfile(m Machine) *Profile {
	p := NewProfile(m)
	p.CopyBytesPerS, p.AdamParamsPerS, p.AdamThreads = 10e9, 1e9, 2
	p.SetAdamRate(AdamState{Moments: NarrowMoments, Master: NarrowMaster, ParamsPerS: 0.5e9})
	p.SetDisk(Disk{Path: "/nvme", ReadBytesPerS: 2e9, WriteBytesPerS: 1e9})
	return p
}

func inputs(t *testing.T, name string) Inputs {
	s, err := model.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return Inputs{Model: name, Shape: s, Devices: 1, Batch: 2, Seq: 64, HBMBytes: 8 * units.GiB, HostBytes: 16 * units.GiB,
		NVMePath: "/nvme", NVMeFreeBytes: 100 * units.GiB, SharedCores: true}
}

// TestPredictTerms: each placement's terms are its bytes and parameters
// over the profile's rates, as the package doc writes them, and the
// placements that fit come fastest first.
func TestPredictTerms(t *testing.T) {
	p := testProfile(Machine{CPU: "x"})
	in := inputs(t, "gpt2")
	psi := float64(in.Shape.ParamCount())
	p.SetCompute(Compute{Model: "gpt2", Devices: 1, Batch: 2, Seq: 64, FwdBwdSeconds: 1, DeviceAdamSeconds: 0})
	if old, err := Predict(p, in); err != nil || len(old) != 14 {
		t.Fatalf("a profile without the checkpointed step: %d placements (want the 14 without checkpointing), %v", len(old), err)
	}
	p.SetCompute(Compute{Model: "gpt2", Devices: 1, Batch: 2, Seq: 64, FwdBwdSeconds: 1, DeviceAdamSeconds: 0, CheckpointFwdBwdSeconds: 1.25})
	preds, err := Predict(p, in)
	if err != nil {
		t.Fatal(err)
	}
	if len(preds) != 28 {
		t.Fatalf("%d placements, want 28 (4 resident, 3 ZeRO-Offload, params on host, 2 on NVMe; the 4 offloaded at stage 3 with narrow state too; each again with activation checkpointing)", len(preds))
	}
	byName := map[string]Prediction{}
	for i, pr := range preds {
		byName[pr.Name] = pr
		if i > 0 && pr.Fits && preds[i-1].StepSeconds > pr.StepSeconds {
			t.Fatalf("not fastest first: %s %.3f before %s %.3f", preds[i-1].Name, preds[i-1].StepSeconds, pr.Name, pr.StepSeconds)
		}
	}
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9*math.Max(1, want) {
			t.Errorf("%s: %v, want %v", what, got, want)
		}
	}
	adam := psi / 1e9
	res := byName["stage 0, resident"]
	near("resident compute (the device Adam taken out of the measured step)", res.Terms["compute"], 1-adam)
	near("resident step", res.StepSeconds, 1)
	// Activation checkpointing: the measured recompute on top, fewer
	// activation bytes on the device.
	rc := byName["stage 0, resident"+checkpointName]
	near("checkpointed compute", rc.Terms["compute"], 1-adam+0.25)
	if !rc.Checkpoint || rc.DeviceBytes >= res.DeviceBytes {
		t.Errorf("checkpointed %+v: device %d B, without %d B", rc.Config, rc.DeviceBytes, res.DeviceBytes)
	}
	off := byName["stage 2, optimizer on host"]
	near("offload copies", off.Terms["copy"], 4*psi/10e9)
	near("offload step", off.StepSeconds, 1-adam+adam+4*psi/10e9)
	nv := byName["stage 3, params and optimizer on NVMe"]
	// The params fit the device's spare memory: staged there, only the new
	// params are written to NVMe (and go up with the optimizer's copies).
	near("NVMe disk", nv.Terms["disk"], 12*psi/2e9+14*psi/1e9)
	near("NVMe copies", nv.Terms["copy"], 4*psi/10e9)
	// Two phases: the update's disk work under the forward (a third of
	// the compute, the update, the new params up), then the backward
	// (the rest of the compute, the gradient down).
	fwdCores, bwdCores := (1-adam)/3+adam+2*psi/10e9, (1-adam)*2/3+2*psi/10e9
	// The update's writes beyond the host's staging room wait in the
	// forward; those it holds drain under the backward.
	trail := math.Min(14*psi, float64(nv.stagingBytes))
	if trail <= 0 {
		t.Fatalf("staging room %d B: the test wants writes under the backward", nv.stagingBytes)
	}
	near("NVMe step: the update's reads beside the forward, its writes behind", nv.StepSeconds,
		math.Max(fwdCores, 12*psi/2e9+(14*psi-trail)/1e9)+math.Max(bwdCores, trail/1e9))
	// A device without room for them: read twice a step, up twice.
	small := in
	small.HBMBytes = nv.DeviceBytes + int64(psi)
	sp, _ := Predict(p, small)
	for _, pr := range sp {
		if pr.Name == nv.Name {
			near("NVMe disk, params not staged", pr.Terms["disk"], 16*psi/2e9+14*psi/1e9)
			near("NVMe copies, params not staged", pr.Terms["copy"], 8*psi/10e9)
		}
	}
	// A measured step with the params in host RAM 0.5 s slower than the
	// terms say: every placement with offloaded params pays it, half in
	// each phase; the others do not.
	hp := byName["stage 3, params and optimizer on host"]
	cm, _ := p.Compute("gpt2", Full, 1, 2, 64)
	cm.HostParamsStepSeconds, cm.HostParamsMoments, cm.HostParamsMaster = hp.StepSeconds+0.5, fp32State, fp32State
	p.SetCompute(cm)
	withParams, _ := Predict(p, in)
	for _, pr := range withParams {
		want := byName[pr.Name].StepSeconds
		if pr.Params != shard.HBM && !pr.Checkpoint && pr.Optimizer == shard.Host {
			want += 0.5
		}
		if pr.Params != shard.HBM && math.Abs(pr.Terms["params"]-0.5) > 1e-9 || pr.Params == shard.HBM && pr.Terms["params"] != 0 ||
			(pr.Optimizer != shard.NVMe && !pr.Checkpoint) && math.Abs(pr.StepSeconds-want) > 1e-9 {
			t.Errorf("%s with the params' measured overhead: params %v, step %v (without %v)", pr.Name, pr.Terms["params"], pr.StepSeconds, byName[pr.Name].StepSeconds)
		}
	}
	cm.HostParamsStepSeconds = 0
	p.SetCompute(cm)
	// A drive that reads and writes at once at 2.5 GB/s in all.
	p.SetDisk(Disk{Path: "/nvme", ReadBytesPerS: 2e9, WriteBytesPerS: 1e9, MixedBytesPerS: 2.5e9})
	mp, _ := Predict(p, in)
	for _, pr := range mp {
		if pr.Name == nv.Name {
			near("NVMe disk, reads and writes at once", pr.Terms["disk"], math.Max(14*psi/1e9, 26*psi/2.5e9))
		}
	}
	p.SetDisk(Disk{Path: "/nvme", ReadBytesPerS: 2e9, WriteBytesPerS: 1e9})
	// What the NVMe probe measured the tier store keeping in host RAM
	// between steps moves no more: 4 B a param of the reads, 3 of the
	// writes (fp32 state), 1 and 1 of the narrow state's; with params not
	// staged the kept reads come off the update's first, then the
	// params' passes.
	cm.NVMeKeptReadBytes, cm.NVMeKeptWriteBytes = 4*psi, 3*psi
	cm.NarrowKeptReadBytes, cm.NarrowKeptWriteBytes = 1*psi, 1*psi // the narrow placement's own
	p.SetCompute(cm)
	kp, _ := Predict(p, in)
	ks, _ := Predict(p, small)
	narrowState := 2.125 + 2*(1+4.0/256)
	for _, pr := range kp {
		if pr.Name == nv.Name {
			near("NVMe disk, some state kept in host RAM", pr.Terms["disk"], 8*psi/2e9+11*psi/1e9)
		}
		if pr.Name == nv.Name+narrowName {
			near("narrow NVMe disk, 1 B a param kept", pr.Terms["disk"], (narrowState-1)*psi/2e9+(narrowState+2-1)*psi/1e9)
		}
	}
	for _, pr := range ks {
		if pr.Name == nv.Name+narrowName {
			// reads: the state, the params the remainder completes (2 B)
			// and two passes (4 B); 1 B kept
			near("narrow NVMe disk, params not staged, 1 B kept", pr.Terms["disk"], (narrowState+5)*psi/2e9+(narrowState+2-1)*psi/1e9)
		}
	}
	cm.NVMeKeptReadBytes, cm.NVMeKeptWriteBytes = 0, 0
	cm.NarrowKeptReadBytes, cm.NarrowKeptWriteBytes = 0, 0
	p.SetCompute(cm)
	// The narrow state: int8 moments (1 B and a 4-byte scale per 256) and
	// the master's remainder (2 B and a bit) read and written, at the
	// narrow step's CPU Adam rate; the params' extra read by its update
	// only when they are not staged on the device.
	nn := byName[nv.Name+narrowName]
	state := 2.125 + 2*(1+4.0/256)
	near("narrow NVMe disk", nn.Terms["disk"], state*psi/2e9+(state+2)*psi/1e9)
	near("narrow adam", nn.Terms["adam"], psi/0.5e9)
	if !nn.Narrow() || nn.NVMeBytes >= nv.NVMeBytes/2 || nn.Stage != 3 {
		t.Errorf("narrow placement %+v: NVMe %d B, fp32's %d", nn.Config, nn.NVMeBytes, nv.NVMeBytes)
	}
	for _, pr := range sp {
		if pr.Name == nn.Name {
			near("narrow NVMe disk, params not staged", pr.Terms["disk"], (state+6)*psi/2e9+(state+2)*psi/1e9)
		}
	}
	if nv.Bottleneck != "disk" || res.Bottleneck != "compute" {
		t.Errorf("bottlenecks %q and %q, want disk and compute", nv.Bottleneck, res.Bottleneck)
	}
	// A measured ZeRO-Offload step calibrates the host path's staging.
	p.SetCompute(Compute{Model: "gpt2", Devices: 1, Batch: 2, Seq: 64, FwdBwdSeconds: 1, OffloadStepSeconds: 1.5, CheckpointFwdBwdSeconds: 1.25})
	cal, _ := Predict(p, in)
	for _, pr := range cal {
		switch {
		case pr.Optimizer != shard.HBM:
			near(pr.Name+" staging", pr.Terms["staging"], 0.5-adam-4*psi/10e9)
		case pr.Terms["staging"] != 0:
			t.Errorf("%s: staging %v on the devices", pr.Name, pr.Terms["staging"])
		}
	}
	p.SetCompute(Compute{Model: "gpt2", Devices: 1, Batch: 2, Seq: 64, FwdBwdSeconds: 1, CheckpointFwdBwdSeconds: 1.25})
	// A GPU: the host optimizer of an overlapped schedule beside the compute.
	in.SharedCores = false
	gpu, _ := Predict(p, in)
	for _, pr := range gpu {
		if pr.Name == "stage 2, optimizer on host" {
			near("GPU offload step", pr.StepSeconds, math.Max(1+4*psi/10e9, adam))
		}
	}
}

// TestFitShort: a model that fits nowhere says, per placement, what is
// short and by how much; the NVMe placements fit where there is room.
func TestFitShort(t *testing.T) {
	in := inputs(t, "gpt-7b")
	in.HBMBytes, in.HostBytes = 4*units.GiB, 16*units.GiB
	fits, err := Fit(in)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fits {
		if f.Optimizer == shard.NVMe && f.Params == shard.NVMe {
			if f.Fits != (f.DeviceBytes <= in.HBMBytes && f.HostBytes <= in.HostBytes) {
				t.Errorf("%s: fits %v with %d device, %d host bytes", f.Name, f.Fits, f.DeviceBytes, f.HostBytes)
			}
			continue
		}
		if f.Fits || !strings.Contains(f.Short, "short)") {
			t.Errorf("%s: fits %v, short %q", f.Name, f.Fits, f.Short)
		}
	}
	res := fits[0]
	want := units.FormatBytes(res.DeviceBytes - in.HBMBytes)
	if !strings.Contains(res.Short, "device memory: ") || !strings.Contains(res.Short, want+" short") {
		t.Errorf("resident shortfall %q, want the device's %s short", res.Short, want)
	}
	in.NVMeFreeBytes = units.GiB
	fits, _ = Fit(in)
	last := fits[len(fits)-1]
	if last.Fits || !strings.Contains(last.Short, "NVMe: ") {
		t.Errorf("NVMe with 1 GiB free: fits %v, %q", last.Fits, last.Short)
	}
}

// TestProfileFile: a profile saved reads back; one of other hardware is
// refused naming both machines; a missing compute is an error that says
// to probe.
func TestProfileFile(t *testing.T) {
	m := Machine{CPU: "AMD EPYC", CPUs: 2, RAMBytes: 24 << 30, Backend: "cpu", Device: "cpu:0"}
	p := testProfile(m)
	p.SetCompute(Compute{Model: "tiny", Devices: 1, Batch: 2, Seq: 64, FwdBwdSeconds: 0.1})
	path := filepath.Join(t.TempDir(), "strata", "profile.json")
	if err := p.Save(path); err != nil {
		t.Fatal(err)
	}
	q, err := Load(path)
	if err != nil || q.Check(m) != nil || len(q.Computes) != 1 || q.AdamParamsPerS != 1e9 {
		t.Fatalf("read back %+v, %v, check %v", q, err, q.Check(m))
	}
	other := m
	other.CPU = "Intel Xeon"
	if err := q.Check(other); !errors.Is(err, ErrOtherMachine) || !strings.Contains(err.Error(), "AMD EPYC") || !strings.Contains(err.Error(), "Intel Xeon") {
		t.Fatalf("other machine: %v", err)
	}
	in := inputs(t, "tiny")
	in.Seq = 32
	if _, err := Predict(q, in); err == nil || !strings.Contains(err.Error(), "--probe") {
		t.Fatalf("no compute for seq 32: %v", err)
	}
}

// TestConfigJSONParses: the config of every placement (what --write-config
// writes and --check trains) is a valid config with the placement's stage,
// tiers and optimizer state.
func TestConfigJSONParses(t *testing.T) {
	in := inputs(t, "gpt2")
	lookup := func(name string) (config.Shape, error) {
		s, err := model.Lookup(name)
		return config.Shape(s), err
	}
	for _, c := range Configs(1, true, Full) {
		cfg, err := config.Parse([]byte(ConfigJSON(c, in)), c.Name, config.Options{LookupShape: lookup})
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		st := cfg.Strata.OptimizerState
		if cfg.ZeRO.Stage != c.Stage || st.Moments != c.Moments || st.Master != c.Master || c.Narrow() != (c.Moments == "int8") {
			t.Errorf("%s: stage %d, optimizer state %+v", c.Name, cfg.ZeRO.Stage, st)
		}
		if ac := cfg.ActivationCheckpointing; (ac != nil) != c.Checkpoint || ac != nil && (ac.NumberCheckpoints != 0 || ac.CPUCheckpointing) {
			t.Errorf("%s: activation_checkpointing %+v", c.Name, ac)
		}
	}
}

// TestRanks: placements within TieFraction of their rank's fastest share
// its rank (measured from the rank's fastest, so a chain of near ties does
// not grow one rank without end), placements that do not fit have none,
// and RankLeaders takes the fastest of each rank.
func TestRanks(t *testing.T) {
	steps := []float64{1.0, 1.05, 1.09, 1.12, 1.2, 1.3, 2.0}
	var preds []Prediction
	for i, s := range steps {
		preds = append(preds, Prediction{Config: Config{Name: fmt.Sprint("p", i)}, Fits: true, StepSeconds: s})
	}
	preds = append(preds, Prediction{Config: Config{Name: "short"}})
	rank(preds)
	var got []int
	for _, pr := range preds {
		got = append(got, pr.Rank)
	}
	if want := []int{1, 1, 1, 2, 2, 3, 4, 0}; !slices.Equal(got, want) {
		t.Fatalf("ranks %v, want %v", got, want)
	}
	var names []string
	for _, pr := range RankLeaders(preds, 3) {
		names = append(names, pr.Name)
	}
	if want := []string{"p0", "p3", "p5"}; !slices.Equal(names, want) {
		t.Fatalf("leaders %v, want %v", names, want)
	}
	if n := len(RankLeaders(preds, 10)); n != 4 {
		t.Fatalf("%d leaders of 4 ranks", n)
	}
}

// TestPassShare: a pass of a mixture of experts with offloaded params reads
// the dense params and the experts the devices' tokens reach
// (model.Shape.PassParamCount over batch × seq × devices tokens), full
// fine-tune and QLoRA alike; a dense model's pass reads every param.
func TestPassShare(t *testing.T) {
	moe, err := model.Lookup("qwen3-30b-a3b")
	if err != nil {
		t.Fatal(err)
	}
	dense, err := model.Lookup("llama-3-8b")
	if err != nil {
		t.Fatal(err)
	}
	qlora := Job{LoRA: &JobLoRA{R: 16, Alpha: 32, Targets: []string{"q_proj", "v_proj"}, BaseDType: "nf4"}}
	pr := &Prediction{Config: Config{Stage: 3, Params: shard.NVMe, Optimizer: shard.NVMe}}
	for _, c := range []struct {
		shape model.Shape
		job   Job
	}{{moe, Full}, {moe, qlora}, {dense, Full}} {
		in := Inputs{Shape: c.shape, Job: c.job, Devices: 2, Batch: 1, Seq: 8}
		w, err := workOf(in)
		if err != nil {
			t.Fatal(err)
		}
		psi := float64(c.shape.ParamCount())
		share := c.shape.PassParamCount(16) / psi
		if c.shape.MoE() && !(share > 0.4 && share < 0.7) {
			t.Fatalf("%s: 16 tokens read %.3f of the params, want about half", c.shape.Name, share)
		}
		passBytes, _, _ := paramPasses(pr, in, w)
		want := 2 * psi * share
		if c.job.LoRA != nil {
			want = 2*w.trainable + w.codedBytes*psi*share
		}
		if math.Abs(passBytes-want) > 1 {
			t.Errorf("%s, %s: a pass reads %.4g B, want %.4g B", c.shape.Name, c.job.Name(), passBytes, want)
		}
	}
}
