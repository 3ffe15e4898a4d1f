package bench

import (
	"os"
	"strings"
	"testing"

	"github.com/strata-ai/strata/nvme/nvmetest"
	"github.com/strata-ai/strata/shard"
)

// TestStep runs `strata bench step`'s workload on a tiny model: every mode
// trains, the offloaded modes end with params bit-identical to the resident
// one, the NVMe mode moves bytes over the NVMe links, and the JSON has the
// keys the issue names.
func TestStep(t *testing.T) {
	dir := nvmetest.Dir(t)
	res, err := Step(StepOptions{Model: "tiny", Batch: 1, Seq: 16, Steps: 2, Warmup: 1, NVMePath: dir, NVMeOptimizer: true, Threads: 1, ProbeBytes: 64 << 20})
	if err != nil {
		t.Fatal(err) // the directory does direct I/O: any error is a failure
	}
	t.Log("\n" + res.String())
	for _, m := range res.Modes {
		if !m.ParamsIdentical {
			t.Errorf("%s: params differ from the resident mode's", m.Mode)
		}
		if len(m.Steps) != 2 || m.MedianStep <= 0 {
			t.Errorf("%s: steps %v", m.Mode, m.Steps)
		}
	}
	// Over the whole run (the initial placement included): this model's
	// state fits the host budget after the first steps, and write-back
	// caching then need not write it back before a checkpoint.
	if nv := res.Mode("nvme"); nv == nil || nv.Summary.Tier.LinkBytes[shard.HostToNVMe] == 0 || nv.Summary.Tier.LinkBytes[shard.NVMeToHost] == 0 {
		t.Errorf("the nvme mode moved nothing over a NVMe link")
	}
	js := res.JSON()
	for _, k := range []string{"step_s_resident", "step_s_host", "step_s_nvme", "ratio_nvme_host", "ratio_host_resident"} {
		if v, ok := js[k].(float64); !ok || v <= 0 {
			t.Errorf("json %s = %v", k, js[k])
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("swap left behind: %v", ents)
	}
}

// TestStepOverlap: `--overlap serial,exact` builds an engine per offloaded
// mode and schedule (the resident mode once), steps them in blocks, ends
// every schedule bit-identical, reports cpu adam time for both with serial
// exposed whole, the ratio to serial, and the JSON keys the issue names.
func TestStepOverlap(t *testing.T) {
	res, err := Step(StepOptions{Model: "tiny", Batch: 1, Seq: 16, Steps: 4, Warmup: 1, Block: 3, Threads: 1,
		Modes: []string{"resident", "host"}, Overlaps: []string{"serial", "exact"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + res.String())
	var names []string
	for _, m := range res.Modes {
		names = append(names, m.Name())
		if !m.ParamsIdentical {
			t.Errorf("%s: params differ from the resident mode's", m.Name())
		}
		if len(m.Steps) != 4 {
			t.Errorf("%s: %d measured steps, want 4", m.Name(), len(m.Steps))
		}
		if m.Overlap == "" {
			continue
		}
		if h := m.HostOpt; h.Adam <= 0 || h.AdamExposed > h.Adam {
			t.Errorf("%s: cpu adam %v, exposed %v", m.Name(), h.Adam, h.AdamExposed)
		}
		if m.RatioSerial <= 0 {
			t.Errorf("%s: no ratio to serial", m.Name())
		}
	}
	if want := "resident host/serial host/exact"; strings.Join(names, " ") != want {
		t.Errorf("runs %q, want %q", strings.Join(names, " "), want)
	}
	if h := res.Modes[1].HostOpt; h.AdamExposed != h.Adam {
		t.Errorf("serial: exposed %v of %v cpu adam, want all of it (nothing runs on the device during the update)", h.AdamExposed, h.Adam)
	}
	runs, _ := res.JSON()["runs"].([]map[string]any)
	if len(runs) != 3 {
		t.Fatalf("json runs: %v", res.JSON()["runs"])
	}
	for _, r := range runs[1:] {
		for _, k := range []string{"overlap", "step_s", "adam_s", "adam_exposed_s", "ratio_serial"} {
			if _, ok := r[k]; !ok {
				t.Errorf("json run %v has no %s", r, k)
			}
		}
	}
}

// TestStepDPU: the offload mode (params on the device, optimizer state in
// host RAM) and the host mode (params in host RAM too) run the delayed
// parameter update next to serial, its warm-up steps exact.
func TestStepDPU(t *testing.T) {
	res, err := Step(StepOptions{Model: "tiny", Batch: 1, Seq: 16, Steps: 3, Warmup: 1, Block: 2, Threads: 1,
		Modes: []string{"offload", "host"}, Overlaps: []string{"serial", "dpu"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + res.String())
	var names []string
	for _, m := range res.Modes {
		names = append(names, m.Name())
		if h := m.HostOpt; h.Adam <= 0 || h.AdamExposed > h.Adam {
			t.Errorf("%s: cpu adam %v, exposed %v", m.Name(), h.Adam, h.AdamExposed)
		}
	}
	if want := "offload/serial offload/dpu host/serial host/dpu"; strings.Join(names, " ") != want {
		t.Errorf("runs %q, want %q", strings.Join(names, " "), want)
	}
	for _, i := range []int{1, 3} {
		if res.Modes[i].ParamsIdentical {
			t.Errorf("%s ended with offload/serial's params: the update was not delayed", res.Modes[i].Name())
		}
	}
	if !res.Modes[2].ParamsIdentical {
		t.Error("host/serial's params differ from offload/serial's")
	}
}

// TestStepMoments: --moments runs each offloaded mode with each moments
// precision, and with the optimizer state on NVMe the int8 run moves at
// most 0.6x the fp32 run's NVMe bytes per step (master 4 B, m and v 2 B
// instead of 8, read and written; the params 2 B both ways).
func TestStepMoments(t *testing.T) {
	dir := nvmetest.Dir(t)
	res, err := Step(StepOptions{Model: "small", Batch: 1, Seq: 16, Steps: 2, Warmup: 1, Threads: 1, NVMePath: dir, NVMeOptimizer: true, ProbeBytes: 64 << 20,
		Modes: []string{"nvme"}, Moments: []string{"fp32", "int8"}})
	if err != nil {
		t.Fatal(err)
	}
	out := res.String()
	t.Log("\n" + out)
	if len(res.Modes) != 2 || res.Modes[0].Name() != "nvme/exact" || res.Modes[1].Name() != "nvme/exact/int8" {
		t.Fatalf("runs %+v", res.Modes)
	}
	nb := func(m StepModeResult) int64 { return m.LinkBytes[shard.NVMeToHost] + m.LinkBytes[shard.HostToNVMe] }
	f, q := nb(res.Modes[0]), nb(res.Modes[1])
	if f == 0 || float64(q) > 0.6*float64(f) {
		t.Errorf("nvme bytes per step: int8 %d, fp32 %d (want <= 0.6x)", q, f)
	}
	if !strings.Contains(out, "nvme/exact/int8 / nvme/exact: step ") || !strings.Contains(out, "nvme bytes per step") {
		t.Errorf("no ratio line:\n%s", out)
	}
}
