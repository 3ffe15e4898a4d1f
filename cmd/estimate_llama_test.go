package cmd

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestEstimateLlamaOffload: `strata estimate` of the Llama family's named
// shapes prints per-device, host and NVMe bytes with offload. Ψ is the
// published parameter count of each model (the sum of its safetensors
// files' elements: Meta-Llama-3-70B 70,553,706,496; Meta-Llama-3-8B
// 8,030,261,248; Qwen2-7B 7,615,616,512), and at stage 3 on 8 devices
// with params and optimizer on NVMe, nothing stays on a device, the host
// holds the bf16 gradient shards (2Ψ) and NVMe the bf16 params and fp32
// master, m, v (14Ψ; --master fp32, the remainder being the default on
// NVMe); with the optimizer in host RAM, each device keeps
// its bf16 param and gradient shards (4Ψ/N) and the host 14Ψ.
func TestEstimateLlamaOffload(t *testing.T) {
	for _, tc := range []struct {
		model string
		psi   int64
	}{{"llama-3-70b", 70_553_706_496}, {"llama-3-8b", 8_030_261_248}, {"qwen2-7b", 7_615_616_512}} {
		for _, off := range []struct {
			opt, param            string
			device, host, nvme    int64 // in units of Ψ/N (device) and Ψ
			deviceF, hostF, nvmeF string
		}{
			{"nvme", "nvme", 0, 2, 14, "0", "2Ψ", "14Ψ"},
			{"cpu", "none", 4, 14, 0, "4Ψ/N", "14Ψ", "0"},
		} {
			out, _, err := run(t, "estimate", "--model", tc.model, "--devices", "8", "--stage", "3", "--align", "1",
				"--offload-optimizer", off.opt, "--offload-param", off.param, "--master", "fp32", "--json")
			if err != nil {
				t.Fatalf("%s: %v", tc.model, err)
			}
			var doc struct {
				Params int64 `json:"params"`
				Stages []struct {
					Device  int64  `json:"device_bytes"`
					Host    int64  `json:"host_bytes"`
					NVMe    int64  `json:"nvme_bytes"`
					DeviceF string `json:"device_formula"`
					HostF   string `json:"host_formula"`
					NVMeF   string `json:"nvme_formula"`
				} `json:"stages"`
			}
			if err := json.Unmarshal([]byte(out), &doc); err != nil || len(doc.Stages) != 1 {
				t.Fatalf("%s: estimate --json printed %q: %v", tc.model, out, err)
			}
			s := doc.Stages[0]
			if doc.Params != tc.psi {
				t.Errorf("%s: Ψ = %d, published %d", tc.model, doc.Params, tc.psi)
			}
			if s.Device != off.device*tc.psi/8 || s.Host != off.host*tc.psi || s.NVMe != off.nvme*tc.psi ||
				s.DeviceF != off.deviceF || s.HostF != off.hostF || s.NVMeF != off.nvmeF {
				t.Errorf("%s, optimizer %s, params %s: device %d (%s), host %d (%s), nvme %d (%s); want %d, %d, %d bytes",
					tc.model, off.opt, off.param, s.Device, s.DeviceF, s.Host, s.HostF, s.NVMe, s.NVMeF,
					off.device*tc.psi/8, off.host*tc.psi, off.nvme*tc.psi)
			}
		}
	}
	out, _, err := run(t, "estimate", "--model", "llama-3-70b", "--devices", "8", "--offload-optimizer", "nvme", "--offload-param", "nvme", "--master", "fp32")
	if err != nil || !strings.Contains(out, "per device") || !strings.Contains(out, "nvme (all ranks)") || !strings.Contains(out, "919.92 GiB") {
		t.Errorf("estimate's table: %v\n%s", err, out)
	}
}
