package config_test

import (
	"strings"
	"testing"

	"github.com/strata-ai/strata/config"
)

// TestLoRAKey: strata.lora's keys, its defaults and Config.JSON's round
// trip, and each mistake one error naming the key.
func TestLoRAKey(t *testing.T) {
	const base = `"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}}`
	parse := func(js string) (*config.Config, error) {
		return config.Parse([]byte(js), "f.json", config.Options{LookupShape: lookup})
	}
	cfg, err := parse(`{` + base + `, "strata": {"lora": {"r": 16, "alpha": 32, "dropout": 0.05, "target_modules": ["q_proj", "v_proj"], "use_rslora": true, "base_dtype": "nf4", "bias": "none"}}}`)
	if err != nil {
		t.Fatal(err)
	}
	want := config.LoRA{R: 16, Alpha: 32, Dropout: 0.05, TargetModules: []string{"q_proj", "v_proj"}, UseRSLoRA: true, BaseDType: "nf4"}
	if o := cfg.Strata.LoRA; o == nil || o.R != want.R || o.Alpha != want.Alpha || o.Dropout != want.Dropout || strings.Join(o.TargetModules, ",") != "q_proj,v_proj" || !o.UseRSLoRA || o.BaseDType != "nf4" {
		t.Fatalf("lora %+v, want %+v", cfg.Strata.LoRA, want)
	}
	again, err := parse(string(cfg.JSON()))
	if err != nil || again.Strata.LoRA == nil || again.Strata.LoRA.BaseDType != "nf4" || again.Strata.LoRA.R != 16 {
		t.Fatalf("printed config reads back as %+v (%v)", again.Strata.LoRA, err)
	}
	def, err := parse(`{` + base + `, "strata": {"lora": {}}}`)
	if err != nil || def.Strata.LoRA.R != 8 || def.Strata.LoRA.Alpha != 8 || len(def.Strata.LoRA.TargetModules) != 0 {
		t.Fatalf("defaults: %+v (%v)", def.Strata.LoRA, err)
	}
	for _, c := range []struct{ js, want string }{
		{`{` + base + `, "strata": {"lora": {"r": 0}}}`, "strata.lora.r"},
		{`{` + base + `, "strata": {"lora": {"alpha": -1}}}`, "strata.lora.alpha: -1 must be > 0"},
		{`{` + base + `, "strata": {"lora": {"dropout": 1}}}`, "strata.lora.dropout: 1 is not in [0, 1)"},
		{`{` + base + `, "strata": {"lora": {"target_modules": []}}}`, "strata.lora.target_modules: the list is empty"},
		{`{` + base + `, "strata": {"lora": {"bias": "all"}}}`, `strata.lora.bias: only "none" is built`},
		{`{` + base + `, "strata": {"lora": {"base_dtype": "int4"}}}`, `strata.lora.base_dtype: "int4" is not "bf16", "nf4" or "int8"`},
		{`{"train_micro_batch_size_per_gpu": 1, "strata": {"lora": {"base_dtype": "nf4"}}}`, `strata.lora.base_dtype "nf4": the base streams from host RAM or NVMe`},
		{`{` + base + `, "strata": {"freeze": ["wte"], "lora": {}}}`, "strata.freeze with strata.lora"},
		{`{` + base + `, "strata": {"lora": {"rank": 8}}}`, `strata.lora.rank`},
	} {
		_, err := parse(c.js)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.js, err, c.want)
		}
	}
}
