package plan

import (
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/model"
)

// TestProfilePath: --profile wins, then $STRATA_PROFILE, then the file in
// the user's config directory; each says where it came from, and
// DefaultPath is the same file without a flag.
func TestProfilePath(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(dir, "xdg"))
	t.Setenv(ProfileEnv, "")
	xdg := filepath.Join(dir, "xdg", "strata", "profile.json")
	env := filepath.Join(dir, "env.json")
	for _, c := range []struct {
		flag, env        string
		wantPath, wantBy string
	}{
		{"", "", xdg, "the default"},
		{"", env, env, "STRATA_PROFILE"},
		{"flag.json", env, "flag.json", "--profile"},
		{"flag.json", "", "flag.json", "--profile"},
	} {
		t.Setenv(ProfileEnv, c.env)
		path, from, err := ProfilePath(c.flag)
		if err != nil || path != c.wantPath || from != c.wantBy {
			t.Errorf("flag %q, %s=%q: %s from %q (%v); want %s from %q", c.flag, ProfileEnv, c.env, path, from, err, c.wantPath, c.wantBy)
		}
		if c.flag == "" {
			if d, err := DefaultPath(); err != nil || d != c.wantPath {
				t.Errorf("%s=%q: DefaultPath %s (%v), want %s", ProfileEnv, c.env, d, err, c.wantPath)
			}
		}
	}
}

// TestPredictRunErrors: PredictRun predicts a placement plan ranks from a
// profile that measured it, and says why it does not otherwise: a
// *MeasurementError (ErrNoMeasurement) naming the model, devices, batch
// and sequence the profile lacks, or ErrNotModelled with the part of the
// job the predictor does not model.
func TestPredictRunErrors(t *testing.T) {
	s, err := model.Lookup("tiny")
	if err != nil {
		t.Fatal(err)
	}
	in := Inputs{Model: "tiny", Shape: s, Devices: 1, Batch: 2, Seq: 64, HBMBytes: 1 << 30, HostBytes: 1 << 30, SharedCores: true}
	p := testProfile(Machine{CPU: "x"})
	p.SetCompute(Compute{Model: "tiny", Devices: 1, Batch: 2, Seq: 64, FwdBwdSeconds: 0.1, DeviceAdamSeconds: 0.01})
	resident := Configs(1, false, Full)[0]
	parse := func(c Config) *config.Config {
		t.Helper()
		cfg, err := config.Parse([]byte(ConfigJSON(c, in)), c.Name, config.Options{LookupShape: func(name string) (config.Shape, error) {
			s, err := model.Lookup(name)
			return config.Shape(s), err
		}})
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	tokens := in.Devices * in.Batch * in.Seq
	secs, err := PredictRun(p, parse(resident), s, tokens, in.HBMBytes)
	if err != nil || !(secs > 0) {
		t.Fatalf("%s: %g s, %v", resident.Name, secs, err)
	}

	_, err = PredictRun(p, parse(resident), s, tokens/2, in.HBMBytes)
	var me *MeasurementError
	if !errors.Is(err, ErrNoMeasurement) || !errors.As(err, &me) || me.Inputs.Seq != 32 || me.Inputs.Batch != 2 ||
		me.Lacks != "has no step of tiny on 1 device(s) at batch 2 × 32 tokens" {
		t.Errorf("half the tokens: %v (%+v)", err, me)
	}
	ckpt := resident
	ckpt.Checkpoint = true
	if _, err := PredictRun(p, parse(ckpt), s, tokens, in.HBMBytes); !errors.Is(err, ErrNoMeasurement) || !strings.Contains(err.Error(), "with activation checkpointing") {
		t.Errorf("checkpointed, the profile without its step: %v", err)
	}

	// Accumulation: each micro-batch's forward and backward, one update.
	acc := parse(resident)
	acc.GradientAccumulationSteps = 4
	secs4, err := PredictRun(p, acc, s, 4*tokens, in.HBMBytes)
	a := float64(s.ParamCount()) / p.AdamParamsPerS // the CPU backend's device Adam, taken out of the measured step
	if want := 4*(0.1+0.01-a) + a; err != nil || math.Abs(secs4-want) > 1e-9*want {
		t.Errorf("4 micro-batches: %g s, %v (want 4 × the measured fwd+bwd + the update, %g s)", secs4, err, want)
	}
	// LoRA is its own step: the profile's full fine-tune does not predict it.
	lora := parse(resident)
	lora.Strata.LoRA = &config.LoRA{R: 4, Alpha: 8}
	if _, err := PredictRun(p, lora, s, tokens, in.HBMBytes); !errors.Is(err, ErrNoMeasurement) || !strings.Contains(err.Error(), "tiny (LoRA r 4 on") {
		t.Errorf("LoRA without its step in the profile: %v", err)
	}

	for _, c := range []struct {
		edit func(cfg *config.Config)
		want string
	}{
		{func(cfg *config.Config) { cfg.Strata.Freeze = []string{"block 0"} }, "(frozen chunks"},
		{func(cfg *config.Config) {
			cfg.ActivationCheckpointing = &config.ActivationCheckpointing{CPUCheckpointing: true}
		}, "(activation checkpoints in host RAM"},
		{func(cfg *config.Config) { cfg.ZeRO.OffloadOptimizer.Device = "disk" }, `(offload_optimizer: shard: unknown tier "disk"`},
	} {
		cfg := parse(resident)
		c.edit(cfg)
		_, err := PredictRun(p, cfg, s, tokens, in.HBMBytes)
		if !errors.Is(err, ErrNotModelled) || errors.Is(err, ErrNoMeasurement) || !strings.HasPrefix(err.Error(), "plan: strata plan does not model this job "+c.want) {
			t.Errorf("got %v, want ErrNotModelled %s", err, c.want)
		}
	}
}
