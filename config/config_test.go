package config_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/model"
)

func lookup(name string) (config.Shape, error) {
	s, err := model.Lookup(name)
	return config.Shape(s), err
}

func load(t *testing.T, name string) (*config.Config, error) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "testdata", "configs", name))
	if err != nil {
		t.Fatal(err)
	}
	return config.Parse(data, name, config.Options{LookupShape: lookup})
}

// Every bad config gives exactly this message: where, which key, why.
func TestBadConfigs(t *testing.T) {
	cases := map[string]string{
		"bad_syntax_trailing_comma.json": `config: bad_syntax_trailing_comma.json:3:36: malformed JSON: invalid character '}' looking for beginning of object key string`,
		"bad_syntax_eof.json":            `config: bad_syntax_eof.json:3:36: malformed JSON: unexpected end of input (a missing } or ]?)`,
		// A UTF-8 byte order mark is skipped; columns count from after it.
		"bad_bom_trailing_comma.json":   `config: bad_bom_trailing_comma.json:1:38: malformed JSON: invalid character '}' looking for beginning of object key string`,
		"bad_misspelled_key.json":       `config: bad_misspelled_key.json:3:3: unknown key "train_micro_batch_size_per_gp"; did you mean "train_micro_batch_size_per_gpu"?`,
		"bad_nested_typo.json":          `config: bad_nested_typo.json:5:27: unknown key "zero_optimization.offload_optimizer.devise"; did you mean "zero_optimization.offload_optimizer.device"?`,
		"bad_misplaced_key.json":        `config: bad_misplaced_key.json:3:3: unknown key "stage"; did you mean "zero_optimization.stage"?`,
		"bad_stage.json":                `config: bad_stage.json:3:34: zero_optimization.stage: 4 is not 0, 1, 2 or 3`,
		"bad_batch_arithmetic.json":     `config: bad_batch_arithmetic.json:2:3: train_batch_size 16 != train_micro_batch_size_per_gpu 2 × gradient_accumulation_steps 4 × devices 1 = 8 (train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps from bad_batch_arithmetic.json; devices 1 from strata.devices in bad_batch_arithmetic.json)`,
		"bad_batch_not_divisible.json":  `config: bad_batch_not_divisible.json:2:3: train_batch_size 12 is not a multiple of train_micro_batch_size_per_gpu 8 × devices 1 = 8, so gradient_accumulation_steps cannot be derived (train_batch_size, train_micro_batch_size_per_gpu from bad_batch_not_divisible.json; devices 1 is the default (no --devices, no strata.devices))`,
		"bad_type.json":                 `config: bad_type.json:3:24: gradient_clipping: want a number, got string "1.0"`,
		"bad_fp16.json":                 `config: bad_fp16.json:4:23: bf16.enabled: true with fp16.enabled true: enable one of them (DeepSpeed refuses both too)`,
		"bad_offload_param_stage2.json": `config: bad_offload_param_stage2.json:5:23: zero_optimization.offload_param.device: "cpu" needs stage 3 (parameters are sharded only at stage 3), but stage is 2`,
		"bad_nvme_without_path.json":    `config: bad_nvme_without_path.json:5:27: zero_optimization.offload_optimizer.device: "nvme" needs nvme_path (a directory on the NVMe drive, or a list of them)`,
		"bad_auto_steps_per_print.json": `config: bad_auto_steps_per_print.json:3:22: steps_per_print: "auto" is not accepted here: write a value (Strata fills in "auto" for the batch, optimizer, scheduler, gradient_clipping, bf16/fp16 and bucket keys)`,
		"bad_duplicate_key.json":        `config: bad_duplicate_key.json:4:3: duplicate key "zero_optimization" (first at line 3)`,
		"bad_unknown_model.json":        `config: bad_unknown_model.json:3:23: strata.model: model: unknown shape "gpt3" (known: ` + strings.Join(model.Names(), ", ") + `)`,
		"bad_optimizer_type.json":       `config: bad_optimizer_type.json:3:25: optimizer.type: "Lamb" is not supported: Strata implements "Adam" and "AdamW"`,
		"bad_device_name.json":          `config: bad_device_name.json:3:65: zero_optimization.offload_param.device: "nvm" is not "none", "cpu" or "nvme"; did you mean "nvme"?`,
		"bad_freeze_glob.json":          `config: bad_freeze_glob.json:3:49: strata.freeze[1]: "h.[0-3.*" is not a valid glob (path.Match: syntax error in pattern)`,
		"bad_several.json": `4 problems:
config: bad_several.json:2:37: train_micro_batch_size_per_gpu: 0 must be at least 1
config: bad_several.json:3:59: optimizer.params.betas[1]: 1.5 is not in [0, 1)
config: bad_several.json:4:52: scheduler.params: WarmupDecayLR needs total_num_steps
config: bad_several.json:4:68: scheduler.params.warmup_type: "cosine" is not "log" or "linear"`,
	}
	files, _ := filepath.Glob(filepath.Join("..", "testdata", "configs", "bad_*.json"))
	if len(files) != len(cases) {
		t.Errorf("%d bad_*.json files but %d cases: every bad config needs its expected message", len(files), len(cases))
	}
	for name, want := range cases {
		t.Run(name, func(t *testing.T) {
			c, err := load(t, name)
			if err == nil {
				t.Fatalf("parsed without error: %s", c.JSON())
			}
			if err.Error() != want {
				t.Errorf("got:\n%s\nwant:\n%s", err, want)
			}
			var ce *config.Error
			if !errors.As(err, &ce) {
				t.Errorf("error %T does not hold a *config.Error", err)
			}
		})
	}
}

func TestGoodConfigs(t *testing.T) {
	t.Run("minimal", func(t *testing.T) {
		c, err := load(t, "good_minimal.json")
		if err != nil {
			t.Fatal(err)
		}
		// DeepSpeed's defaults and Strata's.
		def := config.Default()
		if c.TrainBatchSize != 2 || c.TrainMicroBatchSizePerGPU != 2 || c.GradientAccumulationSteps != 1 {
			t.Errorf("batch %d/%d/%d, want 2/2/1", c.TrainBatchSize, c.TrainMicroBatchSizePerGPU, c.GradientAccumulationSteps)
		}
		if !reflect.DeepEqual(c.Optimizer, def.Optimizer) || c.ZeRO.Stage != 0 || c.Strata.Model.Name != "tiny" || c.Strata.Devices != 1 {
			t.Errorf("defaults not applied: %s", c.JSON())
		}
		want := []string{"bf16 is not set: Strata trains in bf16 mixed precision (DeepSpeed would train in fp32)"}
		if !reflect.DeepEqual(c.Ignored(), want) {
			t.Errorf("notices %q, want %q", c.Ignored(), want)
		}
	})
	t.Run("bom", func(t *testing.T) {
		// Saved by an editor that writes a UTF-8 byte order mark.
		c, err := load(t, "good_bom_minimal.json")
		if err != nil {
			t.Fatal(err)
		}
		plain, err := load(t, "good_minimal.json")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(c.JSON(), plain.JSON()) {
			t.Errorf("with a BOM:\n%s\nwithout:\n%s", c.JSON(), plain.JSON())
		}
	})
	t.Run("tiny_stage3", func(t *testing.T) {
		c, err := load(t, "good_tiny_stage3.json")
		if err != nil {
			t.Fatal(err)
		}
		if c.GradientAccumulationSteps != 2 || c.Strata.Devices != 4 {
			t.Errorf("accumulation %d devices %d, want 2 and 4", c.GradientAccumulationSteps, c.Strata.Devices)
		}
		if c.Strata.HBMBytes != 64<<20 || c.Strata.Seed != 7 || c.Strata.SeqLen != 64 || c.Strata.Steps != 20 {
			t.Errorf("strata block: %+v", c.Strata)
		}
		if sh := c.Shape(); sh == nil || sh.Dim != 32 || sh.Layers != 2 {
			t.Errorf("shape not resolved: %+v", sh)
		}
		if !c.Optimizer.DecoupledWeightDecay() || c.Optimizer.Params.Betas != [2]float64{0.9, 0.95} || c.Optimizer.Params.WeightDecay != 0.1 {
			t.Errorf("optimizer %+v", c.Optimizer)
		}
		if len(c.Ignored()) != 0 {
			t.Errorf("unexpected notices %q", c.Ignored())
		}
	})
	t.Run("zero_infinity_nvme", func(t *testing.T) {
		c, err := load(t, "good_zero_infinity_nvme.json")
		if err != nil {
			t.Fatal(err)
		}
		z := c.ZeRO
		if c.TrainMicroBatchSizePerGPU != 4 || z.Stage != 3 || z.OffloadParam.Device != "nvme" || z.OffloadOptimizer.Device != "nvme" {
			t.Errorf("got %s", c.JSON())
		}
		if !reflect.DeepEqual(z.OffloadParam.NVMePath, []string{"/mnt/nvme0", "/mnt/nvme1"}) || !reflect.DeepEqual(z.OffloadOptimizer.NVMePath, []string{"/mnt/nvme0"}) {
			t.Errorf("nvme paths %q %q", z.OffloadParam.NVMePath, z.OffloadOptimizer.NVMePath)
		}
		if c.AIO.ThreadCount != 2 || c.AIO.QueueDepth != 16 || z.ReduceBucketSize != 500_000_000 {
			t.Errorf("aio %+v reduce bucket %d", c.AIO, z.ReduceBucketSize)
		}
		if c.Strata.HostBudgetBytes != 8<<30 || c.Strata.HBMBytes != 4<<30 {
			t.Errorf("budgets %d %d", c.Strata.HostBudgetBytes, c.Strata.HBMBytes)
		}
		if !c.Optimizer.DecoupledWeightDecay() {
			t.Error("Adam with adam_w_mode true must decouple weight decay")
		}
		notices := strings.Join(c.Ignored(), "\n")
		for _, k := range []string{"zero_optimization.overlap_comm", "zero_optimization.offload_param.buffer_size", "aio.single_submit", "wall_clock_breakdown"} {
			if !strings.Contains(notices, k+" is accepted but not used") {
				t.Errorf("no notice for %s in:\n%s", k, notices)
			}
		}
	})
	t.Run("hf_auto", func(t *testing.T) {
		c, err := load(t, "good_hf_auto.json")
		if err != nil {
			t.Fatal(err)
		}
		// "auto" batch keys are derived; "auto" bucket sizes follow the hidden size 512.
		if c.TrainBatchSize != 4 || c.GradientAccumulationSteps != 1 {
			t.Errorf("batch %d accumulation %d", c.TrainBatchSize, c.GradientAccumulationSteps)
		}
		z := c.ZeRO
		if z.ReduceBucketSize != 512*512 || z.Stage3PrefetchBucketSize != 512*512*9/10 || z.Stage3ParamPersistenceThreshold != 5120 {
			t.Errorf("auto sizes %d %d %d", z.ReduceBucketSize, z.Stage3PrefetchBucketSize, z.Stage3ParamPersistenceThreshold)
		}
		if c.Strata.Model.Name != "" || c.Shape().Name != "custom" || c.Shape().MaxSeq != 512 {
			t.Errorf("explicit shape %+v", c.Strata.Model)
		}
	})
}

// A printed config parses back into the same run.
func TestJSONRoundTrip(t *testing.T) {
	for _, name := range []string{"good_minimal.json", "good_tiny_stage3.json", "good_zero_infinity_nvme.json", "good_hf_auto.json"} {
		c, err := load(t, name)
		if err != nil {
			t.Fatal(err)
		}
		out := c.JSON()
		back, err := config.Parse(out, "printed", config.Options{LookupShape: lookup})
		if err != nil {
			t.Fatalf("%s: printed config does not parse: %v\n%s", name, err, out)
		}
		if !reflect.DeepEqual(back.JSON(), out) {
			t.Errorf("%s: round trip differs:\n%s\nvs\n%s", name, out, back.JSON())
		}
	}
}

func TestDefaultValidates(t *testing.T) {
	c := config.Default()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.ZeRO.Stage = 5
	c.ZeRO.OffloadParam.Device = "cpu"
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "zero_optimization.stage 5 is not 0, 1, 2 or 3") || !strings.Contains(err.Error(), "offload_param needs stage 3") {
		t.Errorf("Validate: %v", err)
	}
}

func TestSetDevices(t *testing.T) {
	c, err := load(t, "good_tiny_stage3.json") // train 16, micro 2, strata.devices 4
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetDevices(2); err != nil {
		t.Fatal(err)
	}
	if c.GradientAccumulationSteps != 4 || c.TrainBatchSize != 16 {
		t.Errorf("2 devices: accumulation %d batch %d, want 4 and 16", c.GradientAccumulationSteps, c.TrainBatchSize)
	}
	// --devices decides: strata.devices (4) is a default, not a cap.
	if err := c.SetDevices(8); err != nil || c.GradientAccumulationSteps != 1 || c.Strata.Devices != 8 {
		t.Errorf("8 devices: %v, accumulation %d", err, c.GradientAccumulationSteps)
	}
	c, err = config.Parse([]byte(`{"train_batch_size": 12, "train_micro_batch_size_per_gpu": 2}`), "", config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := "config: with 4 devices: train_batch_size 12 is not a multiple of train_micro_batch_size_per_gpu 2 × devices 4 = 8, so gradient_accumulation_steps cannot be derived (train_batch_size, train_micro_batch_size_per_gpu from the config; devices 4 from --devices)"
	if err := c.SetDevices(4); err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
	if c.Strata.Devices != 1 || c.GradientAccumulationSteps != 6 {
		t.Errorf("a failed SetDevices changed the config: devices %d accumulation %d", c.Strata.Devices, c.GradientAccumulationSteps)
	}
	if err := c.SetDevices(3); err != nil || c.GradientAccumulationSteps != 2 {
		t.Errorf("3 devices: %v, accumulation %d", err, c.GradientAccumulationSteps)
	}
	d := config.Default() // built in code: micro 4 kept, batch grows
	if err := d.SetDevices(2); err != nil || d.TrainBatchSize != 8 {
		t.Errorf("default on 2 devices: %v, batch %d", err, d.TrainBatchSize)
	}
}

// DeepSpeed's rules: any two of the three batch keys determine the third.
func TestBatchDerivation(t *testing.T) {
	cases := []struct {
		json          string
		tb, mb, ga    int
		errorContains string
	}{
		{`{"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "strata": {"devices": 2}}`, 32, 4, 4, ""},
		{`{"train_batch_size": 32, "gradient_accumulation_steps": 4, "strata": {"devices": 2}}`, 32, 4, 4, ""},
		{`{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4, "strata": {"devices": 2}}`, 32, 4, 4, ""},
		{`{"train_batch_size": 32, "strata": {"devices": 2}}`, 32, 16, 1, ""},
		{`{"train_micro_batch_size_per_gpu": 3, "strata": {"devices": 2}}`, 6, 3, 1, ""},
		{`{"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": "auto"}`, 3, 3, 1, ""},
		{`{"gradient_accumulation_steps": 4}`, 0, 0, 0, "set train_batch_size or train_micro_batch_size_per_gpu"},
		{`{"train_batch_size": 30, "gradient_accumulation_steps": 4, "strata": {"devices": 2}}`, 0, 0, 0,
			"train_batch_size 30 is not a multiple of gradient_accumulation_steps 4 × devices 2 = 8, so train_micro_batch_size_per_gpu cannot be derived"},
		{`{"train_batch_size": 5, "strata": {"devices": 2}}`, 0, 0, 0, "train_batch_size 5 is not a multiple of devices 2"},
	}
	for _, tc := range cases {
		c, err := config.Parse([]byte(tc.json), "", config.Options{})
		if tc.errorContains != "" {
			if err == nil || !strings.Contains(err.Error(), tc.errorContains) {
				t.Errorf("%s: got %v, want error containing %q", tc.json, err, tc.errorContains)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.json, err)
			continue
		}
		if c.TrainBatchSize != tc.tb || c.TrainMicroBatchSizePerGPU != tc.mb || c.GradientAccumulationSteps != tc.ga {
			t.Errorf("%s: got %d/%d/%d, want %d/%d/%d", tc.json, c.TrainBatchSize, c.TrainMicroBatchSizePerGPU, c.GradientAccumulationSteps, tc.tb, tc.mb, tc.ga)
		}
	}
}

// Inline cases for messages the files do not cover.
func TestMessages(t *testing.T) {
	cases := []struct{ json, want string }{
		{`[1]`, `config: line 1 column 1: the config must be a JSON object, got array`},
		{"{\n\"train_micro_batch_size_per_gpu\": 2.5}", `config: line 2 column 35: train_micro_batch_size_per_gpu: 2.5 is not a whole number`},
		{`{"train_micro_batch_size_per_gpu": 1, "aio": {"thread_count": 2, "intra_op_parallelism": 4}}`,
			`config: line 1 column 66: aio.intra_op_parallelism: 4 disagrees with aio.thread_count 2 (they name the same knob)`},
		{`{"train_micro_batch_size_per_gpu": 1, "aio": {"block_size": 1000}}`,
			`config: line 1 column 61: aio.block_size: 1000 is not a positive multiple of 4096 (O_DIRECT alignment)`},
		{`{"train_micro_batch_size_per_gpu": 1, "strata": {"hbm_bytes": "12 parsecs"}}`,
			`config: line 1 column 63: strata.hbm_bytes: byte size "12 parsecs": unknown suffix (use K, M, G or T; binary)`},
		{`{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu", "bogus": 1}}}`,
			`config: line 1 column 112: unknown key "zero_optimization.offload_optimizer.bogus" (zero_optimization.offload_optimizer takes device, nvme_path, pin_memory, buffer_count, fast_init, pipeline_read, pipeline_write, ratio)`},
		{`{"train_micro_batch_size_per_gpu": 1, "zero_optimization": 3}`,
			`config: line 1 column 60: zero_optimization: want an object, got number 3`},
		{`{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"cpu_offload": true}}`,
			`config: line 1 column 76: zero_optimization.cpu_offload: is DeepSpeed's old spelling: write "offload_optimizer": {"device": "cpu"}`},
		{`{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": false}}`,
			`config: line 1 column 59: bf16.enabled: false is not supported without fp16: Strata trains in bf16 or fp16 mixed precision (fp32 master weights and moments); set "fp16": {"enabled": true} for fp16`},
		{`{"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": true, "hysterisis": 2}}`,
			`config: line 1 column 65: unknown key "fp16.hysterisis"; did you mean "fp16.hysteresis"?`},
		{`{"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": true, "loss_scale": -1}}`,
			`config: line 1 column 79: fp16.loss_scale: want 0 (dynamic scaling) or a positive static scale`},
		{`{"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": true, "hysteresis": 0}}`,
			`config: line 1 column 79: fp16.hysteresis: 0: want at least 1 (the overflows tolerated before the scale halves)`},
		{`{"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}}`,
			`config: line 1 column 81: optimizer.params.adam_w_mode: false contradicts type "AdamW" (DeepSpeed would use AdamW anyway); use type "Adam" for L2-style weight decay`},
		{`{"train_micro_batch_size_per_gpu": 1, "strata": {"model": {"n_layer": 2, "n_embd": 30, "n_head": 4, "vocab_size": 256, "max_seq_len": 64}}}`,
			`config: line 1 column 74: strata.model.n_embd: 30 is not a multiple of n_head 4`},
		{`{"train_micro_batch_size_per_gpu": 1, "strata": {"model": {"n_layer": 2}}}`,
			`config: line 1 column 59: strata.model: missing n_embd, n_head, vocab_size, max_seq_len`},
		{`{"train_micro_batch_size_per_gpu": 1, "strata": {"seq_len": 4096}}`,
			`config: line 1 column 50: strata.seq_len: 4096 is longer than the model's max_seq_len 64`},
		{`{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"reduce_bucket_size": "auto"}, "strata": {"model": "gpt2"}}`,
			`config: line 1 column 61: zero_optimization.reduce_bucket_size: "auto" needs the model's hidden size, but strata.model "gpt2" was not looked up`},
		{`{"Train_Batch_Size": 4}`, `config: line 1 column 2: unknown key "Train_Batch_Size"; did you mean "train_batch_size"?`},
		{`{"train_micro_batch_size_per_gpu": 1, "xyzzy": 1}`,
			`config: line 1 column 39: unknown key "xyzzy" (not a DeepSpeed key that Strata reads; Strata's own keys go under "strata")`},
	}
	for _, tc := range cases {
		opts := config.Options{}
		if strings.Contains(tc.json, "seq_len") {
			opts.LookupShape = lookup
		}
		_, err := config.Parse([]byte(tc.json), "", opts)
		if err == nil || err.Error() != tc.want {
			t.Errorf("%s:\n got %v\nwant %s", tc.json, err, tc.want)
		}
	}
}
