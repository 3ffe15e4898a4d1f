package config_test

import (
	"strings"
	"testing"

	"github.com/strata-ai/strata/config"
)

// TestOptimizerStateKey: strata.optimizer_state.moments picks the stored
// precision of the offloaded moments (DeepSpeed's bf16_optimizer_states is
// the same as "bf16") and .master the master's, both written back by
// Config.JSON, and each mistake is one error naming the key and what to
// write.
func TestOptimizerStateKey(t *testing.T) {
	const offload = `"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}`
	parse := func(js string) (*config.Config, error) {
		return config.Parse([]byte(js), "f.json", config.Options{LookupShape: lookup})
	}
	for _, c := range []struct{ js, want string }{
		{`{` + offload + `}`, "fp32"},
		{`{` + offload + `, "strata": {"optimizer_state": {"moments": "int8"}}}`, "int8"},
		{`{` + offload + `, "strata": {"optimizer_state": {"moments": "bf16", "master": "fp32"}}}`, "bf16"},
		{`{` + offload + `, "strata": {"optimizer_state": {"moments": "int8", "master": "bf16+remainder"}}}`, "int8"},
		{`{` + offload + `, "bf16": {"enabled": true, "bf16_optimizer_states": true}}`, "bf16"},
		{`{"train_micro_batch_size_per_gpu": 1, "bf16": {"bf16_optimizer_states": false}}`, "fp32"},
	} {
		cfg, err := parse(c.js)
		if err != nil {
			t.Fatalf("%s: %v", c.js, err)
		}
		if got := cfg.Strata.OptimizerState.Moments; got != c.want {
			t.Fatalf("%s: moments %q, want %q", c.js, got, c.want)
		}
		again, err := parse(string(cfg.JSON()))
		if err != nil || again.Strata.OptimizerState != cfg.Strata.OptimizerState {
			t.Fatalf("%s: printed config reads back as %+v (%v)", c.js, again.Strata.OptimizerState, err)
		}
	}
	for _, c := range []struct{ js, want string }{
		{`{` + offload + `, "strata": {"optimizer_state": {"moments": "int4"}}}`, `strata.optimizer_state.moments: "int4" is not "fp32", "bf16" or "int8"`},
		{`{"train_micro_batch_size_per_gpu": 1, "strata": {"optimizer_state": {"moments": "int8"}}}`, `strata.optimizer_state.moments: "int8" needs the optimizer offloaded`},
		{`{"train_micro_batch_size_per_gpu": 1, "strata": {"optimizer_state": {"master": "bf16+remainder"}}}`, `strata.optimizer_state.master: "bf16+remainder" needs the optimizer offloaded`},
		{`{` + offload + `, "bf16": {"enabled": false}, "fp16": {"enabled": true}, "strata": {"optimizer_state": {"master": "bf16+remainder"}}}`, `strata.optimizer_state.master: "bf16+remainder" needs bf16 params`},
		{`{` + offload + `, "strata": {"optimizer_state": {"master": "bf16"}}}`, `strata.optimizer_state.master: "bf16" is not "fp32" or "bf16+remainder"`},
		{`{` + offload + `, "bf16": {"bf16_optimizer_states": true}, "strata": {"optimizer_state": {"moments": "int8"}}}`, `strata.optimizer_state.moments: "int8" contradicts bf16.bf16_optimizer_states`},
		{`{` + offload + `, "bf16": {"bf16_master_weights_and_grads": true}}`, `bf16.bf16_master_weights_and_grads: true is not supported`},
		{`{` + offload + `, "strata": {"optimizer_state": {"moment": "int8"}}}`, `strata.optimizer_state.moment`},
	} {
		_, err := parse(c.js)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: error %v, want one containing %q", c.js, err, c.want)
		}
	}
}

// TestMasterFormatDefault: an unset strata.optimizer_state.master is the
// remainder with the optimizer on NVMe in bf16 and fp32 elsewhere (fp16,
// host RAM, the device), a written one is kept, and the printed config
// reads back unset, so that it resolves the same way.
func TestMasterFormatDefault(t *testing.T) {
	const nvme = `"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp/x"}}`
	for _, c := range []struct{ js, want string }{
		{`{"train_micro_batch_size_per_gpu": 1, ` + nvme + `}`, "bf16+remainder"},
		{`{"train_micro_batch_size_per_gpu": 1, ` + nvme + `, "strata": {"optimizer_state": {"master": "fp32"}}}`, "fp32"},
		{`{"train_micro_batch_size_per_gpu": 1, ` + nvme + `, "bf16": {"enabled": false}, "fp16": {"enabled": true}}`, "fp32"},
		{`{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}`, "fp32"},
		{`{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}, "strata": {"optimizer_state": {"master": "bf16+remainder"}}}`, "bf16+remainder"},
		{`{"train_micro_batch_size_per_gpu": 1}`, "fp32"},
	} {
		cfg, err := config.Parse([]byte(c.js), "f.json", config.Options{LookupShape: lookup})
		if err != nil {
			t.Fatalf("%s: %v", c.js, err)
		}
		if got := cfg.MasterFormat(); got != c.want || cfg.RemainderMaster() != (c.want == config.MasterBF16Remainder) {
			t.Errorf("%s: master %q (remainder %v), want %q", c.js, got, cfg.RemainderMaster(), c.want)
		}
		again, err := config.Parse(cfg.JSON(), "f.json", config.Options{LookupShape: lookup})
		if err != nil || again.Strata.OptimizerState != cfg.Strata.OptimizerState || again.MasterFormat() != c.want {
			t.Errorf("%s: printed config reads back as %+v (%v)", c.js, again.Strata.OptimizerState, err)
		}
	}
	if got := config.Default().MasterFormat(); got != config.MasterFP32 {
		t.Errorf("Default's master %q", got)
	}
}
