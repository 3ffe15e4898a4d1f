package cmd

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/urfave/cli/v2"

	"github.com/strata-ai/strata/bench"
	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/engine"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/shard"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/tier"
)

// trainCommand trains a model with ZeRO across the local devices.
func trainCommand() *cli.Command {
	return &cli.Command{
		Name:      "train",
		Usage:     "train a model with ZeRO stages 0-3 across the local devices (DeepSpeed-style config)",
		UsageText: "strata train [--config ds_config.json] [--data FILE] [--devices N] [--backend cpu|cuda] [--steps N] [--out DIR [--save-every N [--keep K]]] [--resume PATH] [--trace FILE]",
		Description: "Without --config, runs a short demonstration: the small model, ZeRO stage 3 on 2 devices,\n" +
			"on a built-in synthetic corpus (or --data). Prints a progress bar on stderr and, at the end,\n" +
			"each device's measured peak of model-state bytes next to the ZeRO formula.\n" +
			"--out DIR writes config.json (the resolved config), steps.jsonl (one line per step), summary.json and model.safetensors (the trained fp32 weights).\n" +
			"--save-every N also writes a training checkpoint (params, fp32 master weights, Adam moments, step) every N steps and\n" +
			"after the last one under DIR/checkpoints/ (crash-safe; the last --keep kept). --resume PATH continues a run from a\n" +
			"checkpoint directory, a directory of checkpoints (its latest) or a run's --out directory (its checkpoints' latest):\n" +
			"--steps is the total counted from step 1, the config is the checkpoint's unless --config is given, a different\n" +
			"--devices reshards it, and the continuation is bit-identical to an uninterrupted run on the same devices.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "config", Usage: "DeepSpeed-style JSON config (default: the demonstration)"},
			&cli.StringFlag{Name: "data", Usage: "training text, any file, one token per byte (default: strata.data, else a built-in synthetic corpus)"},
			&cli.IntFlag{Name: "devices", Usage: "local devices to use (default: strata.devices)"},
			&cli.StringFlag{Name: "backend", Usage: "device backend: cpu or cuda (default: strata.backend, cpu)"},
			&cli.IntFlag{Name: "steps", Usage: "optimizer steps (default: strata.steps)"},
			&cli.StringFlag{Name: "out", Usage: "directory for config.json, steps.jsonl, summary.json and model.safetensors"},
			&cli.BoolFlag{Name: "no-progress", Usage: "no progress bar; print one line per steps_per_print steps instead"},
			&cli.IntFlag{Name: "save-every", Usage: "write a training checkpoint every N steps and after the last, under --out DIR/checkpoints/"},
			&cli.IntFlag{Name: "keep", Value: 2, Usage: "checkpoints kept under DIR/checkpoints/ (the newest)"},
			&cli.StringFlag{Name: "trace", Usage: "write a Chrome trace-event timeline (open in ui.perfetto.dev or chrome://tracing) to FILE, and print the exposed transfer time"},
			&cli.StringFlag{Name: "resume", Usage: "continue from a checkpoint: its directory, a checkpoints directory (latest) or a run's --out directory"},
		},
		Action: runTrain,
	}
}

func lookupShape(name string) (config.Shape, error) {
	s, err := model.Lookup(name)
	return config.Shape(s), err
}

// demoConfig is the run of `strata train` without --config: the small
// model (0.86M params), ZeRO stage 3 on 2 devices, linear warmup then decay.
func demoConfig(steps int) *config.Config {
	cfg := config.Default()
	s, _ := model.Lookup("small")
	cfg.ResolveModel(config.Shape(s))
	cfg.Strata.Model.Name = "small" // so that config.json and checkpoints read back as this shape
	cfg.ZeRO.Stage = 3
	cfg.ZeRO.Stage3ParamPersistenceThreshold = 1000 // shard every chunk but ln_f
	cfg.Optimizer.Params.LR = 2e-3
	cfg.Optimizer.Params.Betas = [2]float64{0.9, 0.95}
	cfg.Scheduler = config.Scheduler{Type: "WarmupDecayLR", Params: config.SchedulerParams{
		WarmupMinLR: 2e-4, WarmupMaxLR: 2e-3, WarmupNumSteps: min(8, steps/4+1), WarmupType: "linear", TotalNumSteps: steps}}
	cfg.GradientClipping = 1
	cfg.Strata.SeqLen = 64
	cfg.Strata.Steps = steps
	cfg.StepsPerPrint = 10
	return cfg
}

// demoSteps is the length of the demonstration.
const demoSteps = 60

// stepLine is one line of steps.jsonl.
type stepLine struct {
	Step             int64   `json:"step"`
	Loss             float64 `json:"loss"`
	LR               float64 `json:"lr"`
	GradNorm         float64 `json:"grad_norm"`
	ClipCoef         float64 `json:"clip_coef"`
	StepSeconds      float64 `json:"step_s"`
	TokensPerSecond  float64 `json:"tokens_per_s"`
	HostToDevice     int64   `json:"bytes_host_to_device"`
	DeviceToHost     int64   `json:"bytes_device_to_host"`
	DeviceToDevice   int64   `json:"bytes_device_to_device"`
	CollectiveBytes  int64   `json:"bytes_collective"`
	ModelStatePeak   []int64 `json:"model_state_peak_bytes,omitempty"` // per device, on the last line
	ElapsedSeconds   float64 `json:"elapsed_s"`
	TokensThisStep   int     `json:"tokens"`
	GlobalBatchLines int     `json:"global_batch_rows"`
	OptimizerSeconds float64 `json:"optimizer_s"`
	*TierLine                // with the tier store (offload_param, NVMe offload)
}

// TierLine is a step's tier figures: prefetch hits, the time the devices
// waited for shards per access tier, bytes per link, peak bytes per tier.
type TierLine struct {
	HitRate         float64 `json:"prefetch_hit_rate"`
	Accesses        int64   `json:"prefetch_accesses"`
	Late            int64   `json:"prefetch_late"`
	Misses          int64   `json:"prefetch_misses"`
	StallHBM        float64 `json:"stall_hbm_s"`
	StallHost       float64 `json:"stall_host_s"`
	BytesNVMeToHost int64   `json:"bytes_nvme_to_host"`
	BytesHostToHBM  int64   `json:"bytes_host_to_hbm"`
	BytesHBMToHost  int64   `json:"bytes_hbm_to_host"`
	BytesHostToNVMe int64   `json:"bytes_host_to_nvme"`
	PeakHBM         int64   `json:"peak_hbm_bytes"`
	PeakHost        int64   `json:"peak_host_bytes"`
	PeakNVMe        int64   `json:"peak_nvme_bytes"`
	BudgetHBM       int64   `json:"budget_hbm_bytes"`
	BudgetHost      int64   `json:"budget_host_bytes"`
	BudgetNVMe      int64   `json:"budget_nvme_bytes"`
}

func newTierLine(t *engine.TierStats) *TierLine {
	if t == nil {
		return nil
	}
	return &TierLine{HitRate: t.HitRate, Accesses: t.Accesses, Late: t.Late, Misses: t.Misses,
		StallHBM: t.Stall[shard.HBM].Seconds(), StallHost: t.Stall[shard.Host].Seconds(),
		BytesNVMeToHost: t.LinkBytes[tier.NVMeToHost], BytesHostToHBM: t.LinkBytes[tier.HostToHBM],
		BytesHBMToHost: t.LinkBytes[tier.HBMToHost], BytesHostToNVMe: t.LinkBytes[tier.HostToNVMe],
		PeakHBM: t.PeakBytes[shard.HBM], PeakHost: t.PeakBytes[shard.Host], PeakNVMe: t.PeakBytes[shard.NVMe],
		BudgetHBM: t.BudgetBytes[shard.HBM], BudgetHost: t.BudgetBytes[shard.Host], BudgetNVMe: t.BudgetBytes[shard.NVMe]}
}

func runTrain(c *cli.Context) (err error) {
	if c.Args().Present() {
		return usagef("train: unexpected argument %q (flags go before arguments; see strata train --help)", c.Args().First())
	}
	stdout, stderr := c.App.Writer, c.App.ErrWriter
	out := c.String("out")
	saveEvery, keep := c.Int("save-every"), c.Int("keep")
	switch {
	case saveEvery < 0:
		return usagef("train: --save-every %d: need a positive number of steps", saveEvery)
	case saveEvery > 0 && out == "":
		return usagef("train: --save-every needs --out DIR (checkpoints go to DIR/checkpoints/)")
	case keep < 1:
		return usagef("train: --keep %d: need at least 1", keep)
	case c.IsSet("keep") && saveEvery == 0:
		return usagef("train: --keep needs --save-every N (it bounds the checkpoints that writes)")
	}
	var resume *checkpoint.Manifest // the checkpoint to continue from
	var resumeDir string
	if path := c.String("resume"); path != "" {
		var err error
		if resume, resumeDir, err = resolveResume(path); err != nil {
			return err
		}
	}
	var cfg *config.Config
	if path := c.String("config"); path != "" {
		var err error
		if cfg, err = config.Load(path, config.Options{LookupShape: lookupShape}); err != nil {
			return err
		}
	} else if resume != nil {
		// The run goes on with the config it was saved with.
		if len(resume.Config) == 0 {
			return fmt.Errorf("train: --resume %s: the checkpoint holds no config; pass --config", resumeDir)
		}
		saved := []byte(resume.Config)
		if c.IsSet("devices") {
			saved = forDevices(saved, c.Int("devices"))
		}
		var err error
		if cfg, err = config.Parse(saved, filepath.Join(resumeDir, "manifest.json"), config.Options{LookupShape: lookupShape}); err != nil {
			return fmt.Errorf("train: --resume: %w", err)
		}
	} else {
		steps := demoSteps
		if c.IsSet("steps") {
			steps = max(1, c.Int("steps"))
		}
		cfg = demoConfig(steps)
		if !c.IsSet("devices") {
			if err := cfg.SetDevices(2); err != nil {
				return err
			}
		}
	}
	if c.IsSet("devices") {
		if err := cfg.SetDevices(c.Int("devices")); err != nil {
			return err
		}
	}
	if c.IsSet("steps") {
		if c.Int("steps") < 1 {
			return usagef("train: --steps %d: need at least 1", c.Int("steps"))
		}
		cfg.Strata.Steps = c.Int("steps")
	}
	if c.IsSet("data") {
		cfg.Strata.Data = c.String("data")
	}
	if cfg.Shape() == nil {
		return fmt.Errorf("train: strata.model %q has no shape", cfg.Strata.Model.Name)
	}
	if c.IsSet("backend") {
		if b := c.String("backend"); !slices.Contains(bench.Backends, b) {
			return usagef("train: --backend %q is not one of %s", b, strings.Join(bench.Backends, ", "))
		}
		cfg.Strata.Backend = c.String("backend")
	}
	if c.IsSet("config") || resume == nil {
		// Not for the checkpoint's config: it is the resolved config, which
		// names every knob, so each would read as set by the user (the run
		// that saved it printed the notes of the config it was given).
		for _, n := range cfg.Ignored() {
			fmt.Fprintf(stderr, "note: %s\n", n)
		}
	}
	var start int64 // the step the run resumes after
	if resume != nil {
		start = resume.Step
		if start >= int64(cfg.Strata.Steps) {
			return usagef("train: --resume: %s is at step %d, and --steps (the total, counted from step 1) is %d: nothing to train; raise --steps above %d to continue",
				resumeDir, start, cfg.Strata.Steps, start)
		}
		if later, err := laterCheckpoints(out, start); err != nil {
			return err
		} else if len(later) > 0 {
			return usagef("train: --resume: %s already holds checkpoints past step %d (%s): this run would mix with them; resume from the latest, or write this run to another --out",
				filepath.Join(out, "checkpoints"), start, strings.Join(later, ", "))
		}
		if c.IsSet("config") {
			if d := configDiff(resume.Config, cfg.JSON()); d != "" {
				fmt.Fprintf(stderr, "note: --config differs from the config %s was saved with: %s\n", resumeDir, d)
			}
		}
	}
	if n := lrPastSchedule(cfg); n != "" {
		fmt.Fprintf(stderr, "note: %s\n", n)
	}
	var tokens []int32
	if cfg.Strata.Data != "" {
		var err error
		if tokens, err = engine.LoadCorpus(cfg.Strata.Data); err != nil {
			return err
		}
	}

	devs, err := bench.OpenDevices(cfg.Strata.Backend, cfg.Strata.Devices, cfg.Strata.HBMBytes)
	if err != nil {
		return err
	}
	defer devs.Close()
	var tr *engine.Tracer
	var trFile *os.File
	if path := c.String("trace"); path != "" {
		if tr, err = engine.NewTracer(engine.TraceOptions{}); err != nil {
			return err
		}
		// Created now, so that a path that cannot be written fails before
		// the training rather than after it.
		if trFile, err = os.Create(path); err != nil {
			return fmt.Errorf("train: --trace: %w", err)
		}
		defer trFile.Close()
	}
	e, err := engine.New(cfg, devs.Devs, devs.Comms, engine.Options{Tokens: tokens, Trace: tr, HostRegistrar: devs.Registrar})
	if err != nil {
		if trFile != nil { // nothing to write: no empty file left behind
			trFile.Close()
			os.Remove(trFile.Name())
		}
		return err
	}
	defer e.Close()
	if tr != nil {
		// Written on every way out once the engine exists, a failed step
		// included (the timeline shows what it was doing).
		defer func() {
			if werr := writeTrace(trFile, e, tr, stdout); werr != nil && err == nil {
				err = werr
			}
		}()
	}
	if devs.Backend != "cpu" {
		fmt.Fprintf(stderr, "devices: %s\n", devs.Describe)
	}
	if resume != nil {
		if err := e.LoadCheckpoint(resumeDir); err != nil {
			return fmt.Errorf("train: --resume: %w", err)
		}
		start = e.StepCount()
	}
	for _, n := range e.Notes() {
		fmt.Fprintf(stderr, "note: %s\n", n)
	}
	data := "synthetic corpus"
	if cfg.Strata.Data != "" {
		data = cfg.Strata.Data
	}
	sum := e.Summary()
	fmt.Fprintf(stderr, "strata train: %s, %s params, ZeRO stage %d on %d %s device(s), optimizer on the %s, overlap %s\n",
		sum.Model, units.FormatSize(sum.Params), sum.Stage, sum.Devices, cfg.Strata.Backend, sum.Optimizer, sum.Overlap)
	fmt.Fprintf(stderr, "  global batch %d rows = %d devices × %d micro-batches × %d rows of %d tokens; data: %s; %d steps\n",
		cfg.TrainBatchSize, sum.Devices, sum.Accum, sum.Micro, sum.Seq, data, cfg.Strata.Steps)
	if resume != nil {
		fmt.Fprintf(stderr, "resumed from step %d (%s)\n", start, resumeDir)
	}

	var jsonl io.Writer
	if out != "" {
		f, err := openOut(out, cfg, start)
		if err != nil {
			return err
		}
		defer f.Close()
		jsonl = f
	}

	steps := cfg.Strata.Steps
	var bar *progressbar.ProgressBar
	if !c.Bool("no-progress") {
		bar = progressbar.NewOptions(steps, progressbar.OptionSetWriter(stderr), progressbar.OptionShowCount(),
			progressbar.OptionSetWidth(24), progressbar.OptionSetDescription("train"),
			progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionSetRenderBlankState(true))
		if start > 0 {
			bar.Set(int(start))
		}
	}
	ckDir := filepath.Join(out, "checkpoints")
	t0 := time.Now()
	var first, last engine.StepStats
	var moved int64
	intr := watchInterrupts()
	defer intr.stop()
	var stopped os.Signal // the signal that stopped the run after a step
	var stoppedAt string  // its checkpoint
	err = e.Run(steps-int(start), func(st engine.StepStats) error {
		if first.Step == 0 {
			first = st
		}
		last = st
		m := st.Moved
		moved += m.HostToDevice + m.DeviceToHost + m.DeviceToDevice + m.Collective
		if jsonl != nil {
			line := stepLine{Step: st.Step, Loss: st.Loss, LR: st.LR, GradNorm: st.GradNorm, ClipCoef: st.ClipCoef,
				StepSeconds: st.Duration.Seconds(), TokensPerSecond: st.TokensPer,
				HostToDevice: m.HostToDevice, DeviceToHost: m.DeviceToHost, DeviceToDevice: m.DeviceToDevice, CollectiveBytes: m.Collective,
				ElapsedSeconds: time.Since(t0).Seconds(), TokensThisStep: st.Tokens, GlobalBatchLines: cfg.TrainBatchSize,
				OptimizerSeconds: st.OptimizerTime.Seconds(), TierLine: newTierLine(st.Tier)}
			b, _ := json.Marshal(line)
			if _, err := fmt.Fprintf(jsonl, "%s\n", b); err != nil {
				return fmt.Errorf("train: write steps.jsonl: %w", err)
			}
		}
		tiers := ""
		if t := st.Tier; t != nil {
			tiers = fmt.Sprintf("  hits %.1f%%  nvme %s/%s", 100*t.HitRate, units.FormatBytes(t.LinkBytes[tier.NVMeToHost]), units.FormatBytes(t.LinkBytes[tier.HostToNVMe]))
		}
		if bar != nil {
			bar.Describe(fmt.Sprintf("loss %.4f  %s tok/s  moved %s%s", st.Loss, units.FormatSize(int64(st.TokensPer)), units.FormatBytes(moved), tiers))
			bar.Add(1)
		} else if st.Step%int64(cfg.StepsPerPrint) == 0 || st.Step == int64(steps) {
			fmt.Fprintf(stderr, "step %d: loss %.4f lr %.3g grad norm %.3f, %.0f tok/s, moved %s%s\n",
				st.Step, st.Loss, st.LR, st.GradNorm, st.TokensPer, units.FormatBytes(moved), tiers)
		}
		sig := intr.requested()
		if sig != nil && st.Step == int64(steps) {
			sig = nil // the last step: the run ends as usual
		}
		saved := ""
		if (saveEvery > 0 && (st.Step%int64(saveEvery) == 0 || st.Step == int64(steps))) || (sig != nil && out != "") {
			// After the step's JSONL line, so that a resumed run finds it.
			ts := time.Now()
			path, err := e.SaveCheckpoint(ckDir, checkpoint.Options{Keep: keep})
			if err != nil {
				return fmt.Errorf("train: save checkpoint: %w", err)
			}
			if bar != nil {
				bar.Clear()
			}
			fmt.Fprintf(stderr, "saved checkpoint of step %d to %s in %s\n", st.Step, path, time.Since(ts).Round(time.Millisecond))
			saved = path
		}
		if sig != nil {
			stopped, stoppedAt = sig, saved
			return errStopped
		}
		return nil
	})
	if bar != nil {
		bar.Finish()
		fmt.Fprintln(stderr)
	}
	if errors.Is(err, errStopped) {
		// Stopped on a signal after a whole step: the summary and weights
		// below are those of that step, and the run can go on.
		err = nil
		steps = int(last.Step)
	}
	if err != nil {
		return err
	}
	elapsed := time.Since(t0)
	sum = e.Summary()
	ran := steps - int(start)
	from := ""
	if start > 0 {
		from = fmt.Sprintf(" (steps %d-%d, resumed)", start+1, steps)
	}
	fmt.Fprintf(stdout, "trained %d steps%s in %s: loss %.4f -> %.4f, %.0f tokens/s, %s moved\n",
		ran, from, elapsed.Round(time.Millisecond), first.Loss, last.Loss,
		float64(ran*e.TokensPerStep())/elapsed.Seconds(), units.FormatBytes(moved))
	fmt.Fprint(stdout, sum.String())
	if dir := out; dir != "" {
		b, _ := json.MarshalIndent(summaryJSON(sum, elapsed), "", "  ")
		if err := os.WriteFile(filepath.Join(dir, "summary.json"), append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("train: %w", err)
		}
		// The trained weights (fp32 master weights, gathered from every
		// rank's shards and tier) as one safetensors file, streamed one
		// chunk at a time.
		path := filepath.Join(dir, "model.safetensors")
		err := checkpoint.ExportStream(path, e.Layout(), checkpoint.ExportOptions{Step: e.StepCount()}, func(w *checkpoint.ExportWriter) error {
			return e.MasterChunks(w.F32)
		})
		if err != nil {
			return fmt.Errorf("train: --out: %w", err)
		}
		fmt.Fprintf(stdout, "wrote %s (fp32 weights; `strata inspect` lists them)\n", path)
	}
	if stopped != nil {
		if stoppedAt == "" {
			return interruptedError{fmt.Sprintf("train: %v: stopped after step %d of %d; no --out, so nothing was saved to resume from", stopped, last.Step, cfg.Strata.Steps)}
		}
		return interruptedError{fmt.Sprintf("train: %v: stopped after step %d of %d, checkpoint %s; go on with: strata train --resume %s --out %s --steps %d",
			stopped, last.Step, cfg.Strata.Steps, stoppedAt, out, out, cfg.Strata.Steps)}
	}
	return nil
}

// errStopped ends Engine.Run after a step when a signal asked to stop.
var errStopped = errors.New("stopped on a signal")

// lrPastSchedule says when the run goes past the end of a WarmupDecayLR
// schedule (a resumed run whose --steps outgrew the saved config, whose
// total_num_steps it keeps): the steps after it run at warmup_min_lr.
func lrPastSchedule(cfg *config.Config) string {
	sc := cfg.Scheduler
	if sc.Type != "WarmupDecayLR" || cfg.Strata.Steps <= sc.Params.TotalNumSteps {
		return ""
	}
	return fmt.Sprintf("scheduler WarmupDecayLR ends at total_num_steps %d: steps %d-%d run at warmup_min_lr %g (a --config with a larger scheduler.params.total_num_steps decays over the whole run)",
		sc.Params.TotalNumSteps, sc.Params.TotalNumSteps+1, cfg.Strata.Steps, sc.Params.WarmupMinLR)
}

// openOut creates dir, writes the resolved config and opens steps.jsonl:
// a new file, or for a run resumed after step start the existing one
// without its lines past start (a run that went on after its last
// checkpoint), ready to append to.
func openOut(dir string, cfg *config.Config, start int64) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("train: --out: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), append(cfg.JSON(), '\n'), 0o644); err != nil {
		return nil, fmt.Errorf("train: --out: %w", err)
	}
	path := filepath.Join(dir, "steps.jsonl")
	var kept []byte
	if start > 0 {
		old, err := os.ReadFile(path)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("train: --out: %w", err)
		}
		for line := range bytes.Lines(old) {
			var l struct {
				Step int64 `json:"step"`
			}
			if json.Unmarshal(line, &l) == nil && l.Step >= 1 && l.Step <= start && bytes.HasSuffix(line, []byte("\n")) {
				kept = append(kept, line...)
			}
		}
	}
	f, err := os.Create(path)
	if err == nil {
		_, err = f.Write(kept)
	}
	if err != nil {
		return nil, fmt.Errorf("train: --out: %w", err)
	}
	return f, nil
}

// resolveResume finds the checkpoint --resume names: a checkpoint
// directory, a directory of checkpoints (its latest), or a run's --out
// directory (its checkpoints' latest). It returns the manifest and the
// checkpoint's directory.
func resolveResume(path string) (*checkpoint.Manifest, string, error) {
	m, dir, err := checkpoint.ReadManifest(path)
	if err != nil {
		sub := filepath.Join(path, "checkpoints")
		if _, serr := os.Stat(sub); serr == nil {
			m, dir, err = checkpoint.ReadManifest(sub)
		}
	}
	if err != nil {
		return nil, "", fmt.Errorf("train: --resume %s: %w", path, err)
	}
	return m, dir, nil
}

// forDevices rewrites a saved (resolved) config for n devices: the global
// batch and the micro-batch stay, gradient_accumulation_steps is left for
// the config to derive (train_batch_size / (micro × n)), and strata.devices
// (the most the config allows) becomes n. A config that does not decode is
// returned as is, for Parse to report.
func forDevices(saved []byte, n int) []byte {
	var m map[string]any
	if json.Unmarshal(saved, &m) != nil {
		return saved
	}
	delete(m, "gradient_accumulation_steps")
	if st, ok := m["strata"].(map[string]any); ok {
		st["devices"] = n
	}
	b, err := json.Marshal(m)
	if err != nil {
		return saved
	}
	return b
}

// configDiff lists the settings where two configs (JSON) differ, but the
// total step count: "optimizer.params.lr 0.003 -> 0.001, ..." ("" when
// none).
func configDiff(saved, now []byte) string {
	var a, b any
	if json.Unmarshal(saved, &a) != nil || json.Unmarshal(now, &b) != nil {
		return ""
	}
	fa, fb := map[string]string{}, map[string]string{}
	flatten("", a, fa)
	flatten("", b, fb)
	keys := map[string]bool{}
	for k := range fa {
		keys[k] = true
	}
	for k := range fb {
		keys[k] = true
	}
	var diffs []string
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		if k != "strata.steps" && fa[k] != fb[k] {
			diffs = append(diffs, fmt.Sprintf("%s %s -> %s", k, orNone(fa[k]), orNone(fb[k])))
		}
	}
	if len(diffs) > 6 {
		diffs = append(diffs[:6], fmt.Sprintf("and %d more", len(diffs)-6))
	}
	return strings.Join(diffs, ", ")
}

func flatten(prefix string, v any, out map[string]string) {
	if m, ok := v.(map[string]any); ok {
		for k, x := range m {
			if prefix != "" {
				k = prefix + "." + k
			}
			flatten(k, x, out)
		}
		return
	}
	b, _ := json.Marshal(v)
	out[prefix] = string(b)
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

type deviceJSON struct {
	Device              string  `json:"device"`
	ModelStatePeakBytes int64   `json:"model_state_peak_bytes"`
	Formula             string  `json:"formula"`
	FormulaBytes        int64   `json:"formula_bytes"`
	PaddingBytes        int64   `json:"padding_bytes"`
	PersistentBytes     int64   `json:"persistent_bytes"`
	EstimateBytes       int64   `json:"estimate_bytes"`
	FormulaRatio        float64 `json:"ratio_formula"`
	EstimateRatio       float64 `json:"ratio_estimate"`
	TierHBMBytes        int64   `json:"tier_hbm_peak_bytes"`
	GatheredPeakBytes   int64   `json:"gathered_chunks_peak_bytes"`
	BucketPeakBytes     int64   `json:"grad_buckets_peak_bytes"`
	WorkspacePeakBytes  int64   `json:"workspace_peak_bytes"`
	ActivationPeakBytes int64   `json:"activation_peak_bytes"`
	PeakBytes           int64   `json:"peak_bytes"`
}

func summaryJSON(s engine.Summary, elapsed time.Duration) map[string]any {
	var devs []deviceJSON
	for _, d := range s.PerDevice {
		devs = append(devs, deviceJSON{d.Device, d.ModelStatePeakBytes, d.Formula, d.FormulaBytes, d.PaddingBytes, d.PersistentBytes,
			d.EstimateBytes, d.FormulaRatio, d.EstimateRatio, d.TierHBMBytes,
			d.GatheredPeakBytes, d.BucketPeakBytes, d.WorkspacePeakBytes, d.ActivationPeakBytes, d.PeakBytes})
	}
	prec := "bf16"
	if s.Precision == gpu.F32 {
		prec = "fp32"
	}
	return map[string]any{
		"model": s.Model, "params": s.Params, "devices": s.Devices, "stage": s.Stage, "precision": prec,
		"optimizer": s.Optimizer, "overlap": s.Overlap, "steps": s.Steps, "elapsed_s": elapsed.Seconds(),
		"per_device": devs, "host_model_state_bytes": s.HostBytes, "host_formula_bytes": s.HostFormula,
		"host_staging_bytes": s.HostStagingBytes, "notes": s.Notes, "tier": s.Tier,
	}
}

// laterCheckpoints names the checkpoints under the run directory out
// (none without one) saved after step.
func laterCheckpoints(out string, step int64) ([]string, error) {
	if out == "" {
		return nil, nil
	}
	dir := filepath.Join(out, "checkpoints")
	l, err := checkpoint.List(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("train: --resume: %w", err)
	}
	var later []string
	for _, name := range l.Checkpoints {
		m, _, err := checkpoint.ReadManifest(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("train: --resume: %w", err)
		}
		if m.Step > step {
			later = append(later, name)
		}
	}
	return later, nil
}
