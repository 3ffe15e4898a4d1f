package bench

import (
	"os"
	"testing"

	"github.com/strata-ai/strata/nvme/nvmetest"
)

// TestStep runs `strata bench step`'s workload on a tiny model: every mode
// trains, the offloaded modes end with params bit-identical to the resident
// one, the NVMe mode moves bytes over the NVMe links, and the JSON has the
// keys the issue names.
func TestStep(t *testing.T) {
	dir := nvmetest.Dir(t)
	res, err := Step(StepOptions{Model: "tiny", Batch: 1, Seq: 16, Steps: 2, Warmup: 1, NVMePath: dir, NVMeOptimizer: true, Threads: 1})
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
	if nv := res.Mode("nvme"); nv == nil || nv.LinkBytes[3] == 0 {
		t.Errorf("the nvme mode wrote nothing to NVMe")
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
