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

// TestFP16ScaleBounds: a min_loss_scale above the scale a run starts at
// (2^initial_scale_power, or a static loss_scale it is written beside) and
// a static loss_scale outside [2^-100, 2^100] (where fp16 holds no real
// gradient) are refused with one error naming the key and its position;
// the bounds themselves are accepted.
func TestFP16ScaleBounds(t *testing.T) {
	parse := func(js string) (*config.Config, error) {
		return config.Parse([]byte(js), "f.json", config.Options{LookupShape: lookup})
	}
	const pre = `{"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": true, `
	for _, c := range []struct{ fp16, want string }{
		{`"initial_scale_power": 4, "min_loss_scale": 32}}`, `f.json:1:91: fp16.min_loss_scale: 32 is above the initial scale 2^4 = 16 (initial_scale_power): the dynamic scale only halves down to min_loss_scale; lower min_loss_scale or raise initial_scale_power`},
		{`"min_loss_scale": 131072}}`, `fp16.min_loss_scale: 131072 is above the initial scale 2^16 = 65536`},
		{`"loss_scale": 8, "min_loss_scale": 16}}`, `fp16.min_loss_scale: 16 is above the static loss_scale 8: a static scale never moves, so min_loss_scale does not apply`},
		{`"loss_scale": 1e38}}`, `f.json:1:79: fp16.loss_scale: 1e+38: want 0 (dynamic scaling) or a static scale from 2^-100 to 2^100`},
		{`"loss_scale": 1e-31}}`, `fp16.loss_scale: 1e-31: want 0 (dynamic scaling) or a static scale from 2^-100 to 2^100`},
		{`"loss_scale": 1e400}}`, `fp16.loss_scale: 1e400 is out of range`},
		{`"initial_scale_power": 128}}`, `fp16.initial_scale_power: 128: want 0 to 100`},
	} {
		_, err := parse(pre + c.fp16)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", c.fp16, err, c.want)
		}
		if err != nil && strings.Count(err.Error(), "fp16.") != 1 {
			t.Errorf("%s: want one error, got %v", c.fp16, err)
		}
	}
	for _, ok := range []string{
		`"initial_scale_power": 4, "min_loss_scale": 16}}`,
		`"loss_scale": 0.5}}`, // a static scale below the default min_loss_scale 1, which does not apply to it
		`"loss_scale": 1e-30}}`,
		`"loss_scale": 1.2676506002282294e30, "min_loss_scale": 1e30}}`, // 2^100
		`"initial_scale_power": 100}}`,
	} {
		if _, err := parse(pre + ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	// Validate says the same of a Config built in code.
	cfg, err := parse(pre + `"initial_scale_power": 4}}`)
	if err != nil {
		t.Fatal(err)
	}
	cfg.FP16.MinLossScale = 32
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "fp16.min_loss_scale 32 is above the initial scale 2^4 = 16") {
		t.Errorf("Validate of min_loss_scale 32 over 2^4: %v", err)
	}
	cfg.FP16.MinLossScale, cfg.FP16.LossScale = 1, 1e38
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "fp16.loss_scale 1e+38: want 0 (dynamic scaling) or a static scale from 2^-100 to 2^100") {
		t.Errorf("Validate of loss_scale 1e38: %v", err)
	}
}
