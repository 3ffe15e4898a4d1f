package config_test

import (
	"strings"
	"testing"

	"github.com/strata-ai/strata/config"
)

// TestFP16Key: the fp16 block's keys and DeepSpeed's defaults, "auto"
// between bf16 and fp16, and the config printed back reads the same.
func TestFP16Key(t *testing.T) {
	parse := func(js string) (*config.Config, error) {
		return config.Parse([]byte(js), "f.json", config.Options{LookupShape: lookup})
	}
	const micro = `"train_micro_batch_size_per_gpu": 1`
	defaults := config.FP16{Enabled: true, InitialScalePower: 16, LossScaleWindow: 1000, Hysteresis: 2, MinLossScale: 1}
	for _, c := range []struct {
		js   string
		bf16 bool
		fp16 config.FP16
	}{
		{`{` + micro + `}`, true, config.FP16{InitialScalePower: 16, LossScaleWindow: 1000, Hysteresis: 2, MinLossScale: 1}},
		{`{` + micro + `, "fp16": {"enabled": true}}`, false, defaults},
		{`{` + micro + `, "fp16": {"enabled": true}, "bf16": {"enabled": "auto"}}`, false, defaults},
		{`{` + micro + `, "fp16": {"enabled": true}, "bf16": {"enabled": false}}`, false, defaults},
		{`{` + micro + `, "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}}`, true, config.FP16{InitialScalePower: 16, LossScaleWindow: 1000, Hysteresis: 2, MinLossScale: 1}},
		{`{` + micro + `, "fp16": {"enabled": true, "loss_scale": 128, "initial_scale_power": 12, "loss_scale_window": 50, "hysteresis": 1, "consecutive_hysteresis": true, "min_loss_scale": 0.5, "auto_cast": false}}`, false,
			config.FP16{Enabled: true, LossScale: 128, InitialScalePower: 12, LossScaleWindow: 50, Hysteresis: 1, ConsecutiveHysteresis: true, MinLossScale: 0.5}},
	} {
		cfg, err := parse(c.js)
		if err != nil {
			t.Fatalf("%s: %v", c.js, err)
		}
		if cfg.BF16.Enabled != c.bf16 || cfg.FP16 != c.fp16 {
			t.Fatalf("%s: bf16 %v fp16 %+v; want %v %+v", c.js, cfg.BF16.Enabled, cfg.FP16, c.bf16, c.fp16)
		}
		again, err := parse(string(cfg.JSON()))
		if err != nil || again.FP16 != cfg.FP16 || again.BF16.Enabled != cfg.BF16.Enabled {
			t.Fatalf("%s: printed config reads back as %+v (%v)", c.js, again.FP16, err)
		}
	}
	for _, c := range []struct{ js, want string }{
		{`{` + micro + `, "fp16": {"enabled": true, "fp16_master_weights_and_grads": true}}`, `fp16.fp16_master_weights_and_grads: true is not supported`},
		{`{` + micro + `, "fp16": {"enabled": true, "initial_scale_power": 101}}`, `fp16.initial_scale_power: 101: want 0 to 100`},
		{`{` + micro + `, "fp16": {"enabled": true, "min_loss_scale": 0}}`, `fp16.min_loss_scale: want a positive scale`},
		{`{` + micro + `, "fp16": {"enabled": "yes"}}`, `fp16.enabled: want true or false, got string "yes"`},
	} {
		if _, err := parse(c.js); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", c.js, err, c.want)
		}
	}
}
