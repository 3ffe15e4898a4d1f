package cmd

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestEstimateMoments: --moments (and a config's
// strata.optimizer_state.moments) changes the optimizer state's bytes: 12
// B/param fp32, 8 bf16, about 6.03 int8 (scales of 256-element blocks),
// with an fp32 master, in the table's formula and the JSON; unset, the
// master on NVMe is the remainder (10.125 B/param with fp32 moments);
// narrow moments on the device are one usage error.
func TestEstimateMoments(t *testing.T) {
	cfg := writeFile(t, "cfg.json", `{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}},
		"strata": {"model": "medium", "optimizer_state": {"moments": "bf16", "master": "fp32"}}}`)
	for _, c := range []struct {
		args    []string
		formula string
		bytes   float64
	}{
		{[]string{"--model", "medium", "--stage", "3", "--offload-optimizer", "nvme", "--master", "fp32"}, "12Ψ", 12},
		{[]string{"--model", "medium", "--stage", "3", "--offload-optimizer", "nvme", "--master", "fp32", "--moments", "bf16"}, "8Ψ", 8},
		{[]string{"--model", "medium", "--stage", "3", "--offload-optimizer", "nvme", "--master", "fp32", "--moments", "int8"}, "6.031Ψ", 6.03125},
		{[]string{"--model", "medium", "--stage", "3", "--offload-optimizer", "nvme"}, "10.12Ψ", 10.125},
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

// TestEstimateNodes: --nodes N --devices D is a job of N·D ranks whose
// host and NVMe bytes are counted per node (D ranks' each).
func TestEstimateNodes(t *testing.T) {
	out, _, err := run(t, "estimate", "--model", "gpt2", "--nodes", "2", "--devices", "4", "--stage", "3", "--offload-optimizer", "nvme", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var js struct {
		Devices, Nodes int
		DevicesPerNode int `json:"devices_per_node"`
		Stages         []struct {
			HostBytes     int64 `json:"host_bytes"`
			NVMeBytes     int64 `json:"nvme_bytes"`
			HostNodeBytes int64 `json:"host_bytes_per_node"`
			NVMeNodeBytes int64 `json:"nvme_bytes_per_node"`
		}
	}
	if err := json.Unmarshal([]byte(out), &js); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if js.Devices != 8 || js.Nodes != 2 || js.DevicesPerNode != 4 || len(js.Stages) != 1 {
		t.Fatalf("devices %d nodes %d per node %d, %d stages; want 8, 2, 4, 1", js.Devices, js.Nodes, js.DevicesPerNode, len(js.Stages))
	}
	s := js.Stages[0]
	if s.NVMeBytes == 0 || 2*s.NVMeNodeBytes != s.NVMeBytes || 2*s.HostNodeBytes != s.HostBytes {
		t.Errorf("per node host %d nvme %d, all ranks %d %d: want half", s.HostNodeBytes, s.NVMeNodeBytes, s.HostBytes, s.NVMeBytes)
	}
	table, _, err := run(t, "estimate", "--model", "gpt2", "--nodes", "2", "--devices", "4", "--stage", "3", "--offload-optimizer", "nvme", "--master", "fp32")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"N = 8 devices (2 nodes × 4)", "host (per node)", "nvme (per node)", "6Ψ"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	if _, _, err := run(t, "estimate", "--model", "gpt2", "--nodes", "0"); err == nil || !strings.Contains(err.Error(), "--nodes 0") {
		t.Errorf("--nodes 0: %v", err)
	}
}

// TestEstimateMasterDefault: a config that does not name the master gets
// the remainder where the optimizer ends on NVMe, after the flags move it
// (--offload-optimizer), and fp32 elsewhere, in fp16, or when written.
func TestEstimateMasterDefault(t *testing.T) {
	const nvme = `"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}}`
	const host = `"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}`
	cfg := func(zero, more string) string {
		return writeFile(t, "cfg.json", `{"train_micro_batch_size_per_gpu": 1, `+zero+more+`, "strata": {"model": "medium"}}`)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", cfg(nvme, "")}, "bf16+remainder"},
		{[]string{"--config", cfg(nvme, ""), "--offload-optimizer", "none"}, "fp32"},
		{[]string{"--config", cfg(nvme, ""), "--offload-optimizer", "cpu"}, "fp32"},
		{[]string{"--config", cfg(host, ""), "--offload-optimizer", "nvme"}, "bf16+remainder"},
		{[]string{"--config", cfg(nvme, `, "bf16": {"enabled": false}, "fp16": {"enabled": true}`)}, "fp32"},
		{[]string{"--config", cfg(nvme, ""), "--master", "fp32"}, "fp32"},
		{[]string{"--model", "medium", "--stage", "3", "--offload-optimizer", "nvme"}, "bf16+remainder"},
	} {
		js, _, err := run(t, append([]string{"estimate", "--json"}, c.args...)...)
		var v struct {
			Master string `json:"master"`
		}
		if err != nil || json.Unmarshal([]byte(js), &v) != nil || v.Master != c.want {
			t.Errorf("%q: master %q, want %q (%v)", c.args, v.Master, c.want, err)
		}
	}
}
