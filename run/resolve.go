package run

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/gpu/backend"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/source"
)

// ConfigRequest is what a training run's config is resolved from (the
// inputs of `strata train`): a DeepSpeed-style config file, else the
// config of the checkpoint a run resumes from, else the demonstration's,
// with the model's shape of Init and the values below applied. A nil
// pointer is a value not given. Errors name the command line's flags
// (--steps, --lr ...), which these fields are; an error of the input is
// an *InputError.
type ConfigRequest struct {
	// ConfigPath is the config file (--config); "" for the checkpoint's
	// config (Resume) or the demonstration's (DemoConfig).
	ConfigPath string
	// Init is the model a new run starts from (--init), probed
	// (source.Probe): the config is of its shape. nil for none.
	Init *source.Model
	// Resume is the checkpoint a run continues from (ResolveResume), in
	// ResumeDir; nil for a new run.
	Resume    *checkpoint.Manifest
	ResumeDir string
	// Devices decides the device count over strata.devices (--devices).
	Devices *int
	// Steps is the optimizer steps counted from step 1 (--steps); it also
	// fills a scheduler total_num_steps written "auto".
	Steps *int
	// LR, MicroBatch and WarmupSteps fill the config file's keys written
	// "auto" (--lr, --micro-batch, --warmup-steps); they need ConfigPath.
	LR          *float64
	MicroBatch  *int
	WarmupSteps *int
	// Data is the training data (--data; made absolute) and DataColumns
	// the names of its fields (--data-columns); "" keeps the config's.
	Data        string
	DataColumns string
	// Backend is the device backend (--backend: one of backend.Names); ""
	// keeps the config's.
	Backend string
}

// Resolve is the config a run of req trains with: the one the command
// line's `strata train` resolves from the same inputs (and writes to the
// run's config.json), before --epochs (ResolveEpochs).
func Resolve(ctx context.Context, req ConfigRequest) (*config.Config, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cfg, err := req.base()
	if err != nil {
		return nil, err
	}
	if err := req.apply(cfg); err != nil {
		return nil, err
	}
	if req.Init != nil {
		req.Init.Apply(cfg)
	}
	return cfg, nil
}

// ResolveEpochs is the config of a run of epochs passes over d (opened
// for cfg, the config Resolve made of req): the steps the epochs take
// (Data.EpochSteps), given as req.Steps is (strata.steps, and a
// scheduler total_num_steps written "auto"). It returns the config and
// the steps.
func ResolveEpochs(ctx context.Context, req ConfigRequest, cfg *config.Config, d *Data, epochs int) (*config.Config, int, error) {
	n, err := d.EpochSteps(cfg, epochs)
	if err != nil {
		return nil, 0, err
	}
	req.Steps = &n
	again, err := Resolve(ctx, req)
	if err != nil {
		return nil, 0, err
	}
	return again, n, nil
}

// ResolveResume finds the checkpoint path names (--resume): a checkpoint
// directory, a directory of checkpoints (its latest), or a run's --out
// directory (its checkpoints' latest). It returns the manifest, the
// checkpoint's directory and a note of the resolution ("latest"
// unreadable; "" for none).
func ResolveResume(ctx context.Context, path string) (*checkpoint.Manifest, string, string, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", "", err
	}
	dir, _, note, err := source.FindCheckpoint(path) // the same three forms as inspect and export
	var m *checkpoint.Manifest
	if err == nil {
		m, dir, err = checkpoint.ReadManifest(dir)
	}
	if err != nil {
		return nil, "", note, fmt.Errorf("train: --resume %s: %w", path, err)
	}
	return m, dir, note, nil
}

// base is the config the run starts from: ConfigPath, else the one the
// checkpoint of Resume was saved with (for Devices devices when given),
// else the demonstration's; with Init, of its model.
func (req ConfigRequest) base() (*config.Config, error) {
	if req.ConfigPath == "" {
		for _, f := range []struct {
			name string
			set  bool
		}{{"lr", req.LR != nil}, {"micro-batch", req.MicroBatch != nil}, {"warmup-steps", req.WarmupSteps != nil}} {
			if f.set {
				return nil, inputf("train: --%s fills the \"auto\" values of a --config file; without --config, write the value in a config", f.name)
			}
		}
	}
	switch {
	case req.ConfigPath != "":
		opts, err := req.options()
		if err != nil {
			return nil, err
		}
		if req.Init != nil {
			return loadInitConfig(req.Init, req.ConfigPath, opts)
		}
		if req.Resume != nil {
			return loadResumeConfig(req.ConfigPath, opts, req.Resume, req.ResumeDir)
		}
		return config.Load(req.ConfigPath, opts)
	case req.Resume != nil:
		// The run goes on with the config it was saved with.
		return ResumeConfig(req.Resume, req.ResumeDir, value(req.Devices))
	}
	steps := DemoSteps
	if req.Steps != nil {
		steps = max(1, *req.Steps)
	}
	cfg := DemoConfig(steps)
	if req.Init != nil {
		req.Init.Demo(cfg)
	}
	if req.Devices == nil {
		if err := cfg.SetDevices(2); err != nil {
			return nil, err
		}
	}
	return cfg, nil
}

// value is *p, 0 for nil.
func value[T int | float64](p *T) T {
	if p == nil {
		return 0
	}
	return *p
}

// loadInitConfig parses the config file at path for the model of --init
// (source.Model.LoadConfig): a strata.model of another shape is refused,
// naming both.
func loadInitConfig(im *source.Model, path string, opts config.Options) (*config.Config, error) {
	if _, err := configNamesModel(path); err != nil {
		return nil, err
	}
	cfg, err := im.LoadConfig(path, opts)
	var conflict *source.ShapeConflictError
	if errors.As(err, &conflict) {
		return nil, inputf("%v", err)
	}
	return cfg, err
}

// configNamesModel says whether the config file at path sets
// strata.model (source.ConfigNamesModel).
func configNamesModel(path string) (bool, error) {
	named, err := source.ConfigNamesModel(path)
	if err != nil {
		return false, fmt.Errorf("train: --config: %w", err)
	}
	return named, nil
}

// loadResumeConfig loads the --config of a resumed run: one without
// strata.model is of the checkpoint's model (not the default shape, whose
// vocabulary or layers would not fit the checkpoint).
func loadResumeConfig(path string, opts config.Options, resume *checkpoint.Manifest, resumeDir string) (*config.Config, error) {
	named, err := configNamesModel(path)
	if err != nil {
		return nil, err
	}
	if !named {
		saved, err := config.Parse(resume.Config, filepath.Join(resumeDir, checkpoint.ManifestName), config.Options{LookupShape: model.LookupConfigShape})
		if err == nil && saved.Shape() != nil {
			shape, lookup := *saved.Shape(), opts.LookupShape
			opts.LookupShape = func(name string) (config.Shape, error) {
				if name == config.DefaultModel {
					return shape, nil
				}
				return lookup(name)
			}
		}
	}
	return config.Load(path, opts)
}

// options are the parse options of ConfigPath: Devices decides the
// device count, and LR, MicroBatch, WarmupSteps and Steps fill the keys
// written "auto".
func (req ConfigRequest) options() (config.Options, error) {
	opts := config.Options{LookupShape: model.LookupConfigShape}
	for _, f := range []struct {
		name string
		v    *int
	}{{"devices", req.Devices}, {"micro-batch", req.MicroBatch}, {"steps", req.Steps}} {
		if f.v != nil && *f.v < 1 {
			return opts, inputf("train: --%s %d: need at least 1", f.name, *f.v)
		}
	}
	if req.WarmupSteps != nil && *req.WarmupSteps < 0 {
		return opts, inputf("train: --warmup-steps %d: need 0 or more", *req.WarmupSteps)
	}
	if req.LR != nil && !(*req.LR > 0) {
		return opts, inputf("train: --lr %v: need a positive learning rate", *req.LR)
	}
	opts.Devices = value(req.Devices)
	opts.Auto = config.Auto{LR: value(req.LR), MicroBatch: value(req.MicroBatch), WarmupSteps: value(req.WarmupSteps), Steps: value(req.Steps)}
	return opts, nil
}

// apply sets what Devices, Steps, Data, DataColumns and Backend say on
// cfg.
func (req ConfigRequest) apply(cfg *config.Config) error {
	if req.Devices != nil {
		if err := cfg.SetDevices(*req.Devices); err != nil {
			return err
		}
	}
	if req.Steps != nil {
		if *req.Steps < 1 {
			return inputf("train: --steps %d: need at least 1", *req.Steps)
		}
		cfg.Strata.Steps = *req.Steps
	}
	if req.Data != "" {
		// Absolute: a run resumed from another directory reads the same file.
		cfg.Strata.Data = absPath(req.Data)
	}
	if req.DataColumns != "" {
		cfg.Strata.DataColumns = req.DataColumns
	}
	if cfg.Shape() == nil {
		return fmt.Errorf("train: strata.model %q has no shape", cfg.Strata.Model.Name)
	}
	if b := req.Backend; b != "" {
		if !slices.Contains(backend.Names, b) {
			return inputf("train: --backend %q is not one of %s", b, strings.Join(backend.Names, ", "))
		}
		cfg.Strata.Backend = b
	}
	if cfg.Strata.Backend == "cpu" && cfg.Strata.HBMBytes > 0 {
		// The CPU backend's devices are host RAM: a budget the host cannot
		// hold is refused now, not killed for memory mid-run.
		if err := cpu.CheckHostRAM(cfg.Strata.Devices, cfg.Strata.HBMBytes); err != nil {
			return fmt.Errorf("train: %w", err)
		}
	}
	return nil
}

// absPath is p made absolute (p when it cannot be).
func absPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}
