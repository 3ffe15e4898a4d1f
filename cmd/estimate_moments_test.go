package cmd

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestEstimateMoments: --moments (and a config's
// strata.optimizer_state.moments) changes the optimizer state's bytes: 12
// B/param fp32, 8 bf16, about 6.03 int8 (scales of 256-element blocks),
// in the table's formula and the JSON; narrow moments on the device are
// one usage error.
func TestEstimateMoments(t *testing.T) {
	cfg := writeFile(t, "cfg.json", `{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}},
		"strata": {"model": "medium", "optimizer_state": {"moments": "bf16"}}}`)
	for _, c := range []struct {
		args    []string
		formula string
		bytes   float64
	}{
		{[]string{"--model", "medium", "--stage", "3", "--offload-optimizer", "nvme"}, "12Ψ", 12},
		{[]string{"--model", "medium", "--stage", "3", "--offload-optimizer", "nvme", "--moments", "bf16"}, "8Ψ", 8},
		{[]string{"--model", "medium", "--stage", "3", "--offload-optimizer", "nvme", "--moments", "int8"}, "6.031Ψ", 6.03125},
		{[]string{"--config", cfg}, "8Ψ", 8},
	} {
		out, _, err := run(t, append([]string{"estimate"}, c.args...)...)
		if err != nil {
			t.Fatalf("%q: %v", c.args, err)
		}
		if !strings.Contains(out, " "+c.formula+"\n") {
			t.Errorf("%q: no nvme formula %s:\n%s", c.args, c.formula, out)
		}
		js, _, err := run(t, append([]string{"estimate", "--json"}, c.args...)...)
		var v struct {
			Bytes float64 `json:"optimizer_state_bytes_per_param"`
		}
		if err != nil || json.Unmarshal([]byte(js), &v) != nil || v.Bytes != c.bytes {
			t.Errorf("%q --json: optimizer_state_bytes_per_param %v, want %v (%v)", c.args, v.Bytes, c.bytes, err)
		}
	}
	if _, _, err := run(t, "estimate", "--model", "medium", "--moments", "int8"); err == nil || !strings.Contains(err.Error(), "--moments int8 needs --offload-optimizer cpu or nvme") {
		t.Errorf("int8 on the device: %v", err)
	}
}
