package cmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/engine"
	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/backend"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/internal/durable"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/plan"
	"github.com/strata-ai/strata/safetensors"
	"github.com/strata-ai/strata/shard"
	"github.com/strata-ai/strata/timeline"
)

// trainCommand trains a model with ZeRO across the local devices.
func trainCommand() *cli.Command {
	return &cli.Command{
		Name:      "train",
		Usage:     "train a model with ZeRO stages 0-3 across the local devices (DeepSpeed-style config)",
		UsageText: "strata train [--config ds_config.json [--lr X] [--micro-batch N] [--warmup-steps N]] [--data FILE [--epochs N] [--no-shuffle] [--chat-template PATH]] [--eval-data FILE [--eval-every N]] [--devices N] [--backend cpu|cuda] [--steps N] [--out DIR [--save-every N [--keep K]] [--overwrite]] [--resume PATH [--allow-data-change] | --init PATH] [--trace FILE]",
		Description: "Without --config, runs a short demonstration: the small model, ZeRO stage 3 on 2 devices,\n" +
			"on a built-in synthetic corpus (or --data). Prints a progress bar on stderr and, at the end,\n" +
			"each device's measured peak of model-state bytes next to the ZeRO formula.\n" +
			"--out DIR writes config.json (the resolved config), steps.jsonl (one line per step), summary.json, model.safetensors (the trained fp32 weights)\n" +
			"and a training checkpoint of the last step (params, fp32 master weights, Adam moments, step) under DIR/checkpoints/, which export, eval,\n" +
			"generate and --resume read; --save-every N also writes one every N steps (crash-safe; the last --keep kept). --resume PATH continues a run from a\n" +
			"checkpoint directory, a directory of checkpoints (its latest) or a run's --out directory (its checkpoints' latest):\n" +
			"--steps is the total counted from step 1, the config is the checkpoint's unless --config is given, a different\n" +
			"--devices reshards it, and the continuation is bit-identical to an uninterrupted run on the same devices; a resume on\n" +
			"training data that changed since the checkpoint (its size, or the SHA-256 of its bytes or samples) is refused unless --allow-data-change.\n" +
			"--init PATH starts a new run (step 1, a new optimizer) from the weights at PATH: a Hugging Face model directory\n" +
			"(config.json and safetensors: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, GPT2LMHeadModel), or a Strata\n" +
			"checkpoint named as for --resume, of which only the weights are taken, not its optimizer state or step. The model's\n" +
			"shape comes from PATH (a --config without strata.model takes it; one with another shape is refused); the weights\n" +
			"stream one chunk at a time into every rank's shards, in HBM, host RAM or NVMe, and the run records PATH's tokenizer.json.\n" +
			"A run directory belongs to one run: locked while it runs; a new run into a non-empty --out is refused unless\n" +
			"--overwrite; --keep prunes only this run's checkpoints. Ctrl-C or SIGTERM stops after the step in progress and\n" +
			"saves it (exit 130, SIGTERM 143) and prints the command that goes on with the run, with every flag it was given\n" +
			"(recorded in run.json); a second one aborts the save (the previous complete checkpoint survives).",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "config", Usage: "DeepSpeed-style JSON config (default: the demonstration)"},
			&cli.IntFlag{Name: "devices", Usage: "local devices to use; decides over strata.devices (as DeepSpeed's launcher decides) (default: from the config, strata.devices; the demonstration: 2)"},
			&cli.StringFlag{Name: "backend", Usage: "device backend: cpu or cuda (default: strata.backend, cpu)"},
			&cli.IntFlag{Name: "steps", Usage: "optimizer steps, counted from step 1; also fills scheduler total_num_steps \"auto\" (default: strata.steps)"},
			&cli.Float64Flag{Name: "lr", Usage: "fills optimizer.params.lr \"auto\" (and warmup_max_lr \"auto\") (default 1e-3)"},
			&cli.IntFlag{Name: "micro-batch", Usage: "fills train_micro_batch_size_per_gpu \"auto\" (default 4 when no batch key is given)"},
			&cli.IntFlag{Name: "warmup-steps", Usage: "fills scheduler warmup_num_steps \"auto\" (default 0)"},
			&cli.StringFlag{Name: "out", Usage: "directory for config.json, steps.jsonl, summary.json, model.safetensors and a checkpoint of the last step (checkpoints/)"},
			&cli.BoolFlag{Name: "no-progress", Usage: "no progress bar; print one line per steps_per_print steps instead (as when stderr is not a terminal: a log file gets no redrawn frames)"},
			&cli.IntFlag{Name: "save-every", Usage: "also write a training checkpoint every N steps under --out DIR/checkpoints/ (every --out run saves its last step)"},
			&cli.IntFlag{Name: "keep", Value: 2, Usage: "checkpoints kept under DIR/checkpoints/ (the newest)"},
			&cli.StringFlag{Name: "trace", Usage: "write a Chrome trace-event timeline (open in ui.perfetto.dev or chrome://tracing) to FILE, and print the exposed transfer time"},
			&cli.StringFlag{Name: "resume", Usage: "continue from a checkpoint: its directory, a checkpoints directory (latest) or a run's --out directory"},
			&cli.StringFlag{Name: "init", Usage: "start from the weights (only) of a Hugging Face model directory or a Strata checkpoint/run directory; the shape comes from it"},
			&cli.StringFlag{Name: "adapter", Usage: "with --init: continue training the PEFT LoRA adapter in this directory (adapter_config.json, adapter_model.safetensors) on that base; strata.lora comes from it"},
			&cli.BoolFlag{Name: "allow-other-base", Usage: "with --adapter: apply an adapter whose adapter_config.json names another base model than --init (a copy or a conversion of it); without it such a run is refused"},
			&cli.BoolFlag{Name: "allow-data-change", Usage: "with --resume: go on although the training data differs from what the checkpoint recorded (its size or SHA-256; without it such a resume is refused)"},
			&cli.BoolFlag{Name: "overwrite", Usage: "let a new run take an --out that holds another run's files (replaces its config.json, steps.jsonl, summary.json, model.safetensors; its checkpoints stay)"},
		}, append(dataFlags(), jobFlags()...)...),
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
	Step     int64   `json:"step"`
	Loss     number  `json:"loss"`
	LR       float64 `json:"lr"`
	GradNorm number  `json:"grad_norm"`
	ClipCoef float64 `json:"clip_coef"`
	// LossScale is the fp16 loss scale the step ran with, Skipped whether
	// it overflowed and updated nothing (its grad_norm is then null).
	LossScale        float64 `json:"loss_scale,omitempty"`
	Skipped          bool    `json:"skipped,omitempty"`
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
	Goroutines       int     `json:"goroutines"` // when the line is written: flat over a run (bench/soak.sh)
	*EvalLine                // after an evaluation of --eval-data
	*TierLine                // with the tier store (offload_param, NVMe offload)
	*HostOptLine             // with the host optimizer
}

// number is a float64 that JSON writes as null when it is not finite (the
// gradient norm of a step an fp16 overflow skipped).
type number float64

func (n number) MarshalJSON() ([]byte, error) {
	if f := float64(n); math.IsNaN(f) || math.IsInf(f, 0) {
		return []byte("null"), nil
	}
	return json.Marshal(float64(n))
}

// HostOptLine is the host optimizer's time of the runs completed in a step
// (report.HostOptStats): cpu adam and its exposed part (no compute stream
// busy), the waits for its state and their exposed part.
type HostOptLine struct {
	AdamSeconds        float64 `json:"adam_s"`
	AdamExposedSeconds float64 `json:"adam_exposed_s"`
	IOSeconds          float64 `json:"opt_io_s"`
	IOExposedSeconds   float64 `json:"opt_io_exposed_s"`
}

func newHostOptLine(e *engine.Engine, h report.HostOptStats) *HostOptLine {
	if !e.HostOptimizer() {
		return nil
	}
	return &HostOptLine{h.Adam.Seconds(), h.AdamExposed.Seconds(), h.IOWait.Seconds(), h.IOExposed.Seconds()}
}

// TierLine is a step's tier figures: prefetch hits, the time the devices
// waited for shards per access tier, bytes per link, peak bytes per tier.
type TierLine struct {
	HitRate         float64 `json:"prefetch_hit_rate"`
	Accesses        int64   `json:"prefetch_accesses"`
	Late            int64   `json:"prefetch_late"`
	Misses          int64   `json:"prefetch_misses"`
	Dependent       int64   `json:"prefetch_dependent"`
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

func newTierLine(t *report.TierStats) *TierLine {
	if t == nil {
		return nil
	}
	return &TierLine{HitRate: t.HitRate, Accesses: t.Accesses, Late: t.Late, Misses: t.Misses, Dependent: t.Dependent,
		StallHBM: t.Stall[shard.HBM].Seconds(), StallHost: t.Stall[shard.Host].Seconds(),
		BytesNVMeToHost: t.LinkBytes[shard.NVMeToHost], BytesHostToHBM: t.LinkBytes[shard.HostToHBM],
		BytesHBMToHost: t.LinkBytes[shard.HBMToHost], BytesHostToNVMe: t.LinkBytes[shard.HostToNVMe],
		PeakHBM: t.PeakBytes[shard.HBM], PeakHost: t.PeakBytes[shard.Host], PeakNVMe: t.PeakBytes[shard.NVMe],
		BudgetHBM: t.BudgetBytes[shard.HBM], BudgetHost: t.BudgetBytes[shard.Host], BudgetNVMe: t.BudgetBytes[shard.NVMe]}
}

// runTrain is `strata train`: the flags and the config make a plan, the
// plan an engine on the devices, the engine runs the steps (progress,
// checkpoints, signals), and the summary and outputs close the run. A
// signal before the first step ends the run there, every start-up path
// closing what it opened (the engine's Close removes its swap files).
func runTrain(c *cli.Context) (err error) {
	f, err := parseTrainFlags(c)
	if err != nil {
		return err
	}
	if err := checkAddressSpace("train"); err != nil {
		return err
	}
	j, err := openJob(c)
	if err != nil {
		return err
	}
	if j != nil {
		afterReport = append(afterReport, j.close)
		// Every way out of a job: a start-up failure is sent to the other
		// processes; a later one of this process alone aborts the job.
		defer func() { err = j.ended(err) }()
	}
	stdout, stderr := j.quiet(c.App.Writer), j.quiet(c.App.ErrWriter)
	if !j.leader() {
		f.tracePath = "" // process 0's timeline only
	}
	intr := watchInterrupts(stderr, func(os.Signal) string { return "stopping before training starts; nothing is written" },
		func(os.Signal) string { return "stopping at once" }, removeSwapFiles)
	stderr = intr.stderr
	defer intr.stop() // through the outputs: a signal there does not cut them short
	if j != nil {
		// mpirun answers Ctrl-C with SIGTERM to every process and SIGKILL
		// a second later (odls_base_sigkill_timeout): too soon for a step
		// and its checkpoint. SIGUSR1 it passes on alone.
		intr.also(syscall.SIGUSR1)
	}
	p, err := planTrain(intr.ctx, c, stderr)
	if err != nil {
		if s := intr.requested(); s != nil && errors.Is(err, context.Canceled) {
			// The first signal stopped the tokenizing of the data.
			return interruptedError{msg: fmt.Sprintf("train: %v: stopped before the first step; nothing was written", s), status: exitStatus(s)}
		}
		return err
	}
	if j != nil {
		// The job's ranks: every process's --devices.
		if err := p.cfg.SetDevices(c.Int("devices") * j.procs()); err != nil {
			return fmt.Errorf("train: %s: %w", j.place, err)
		}
	}
	var opts engine.Options
	opts.Procs, opts.NodeProcs = j.engineProcs(), j.nodeProcs()
	if p.init != nil {
		defer p.init.close()
		opts.Init = p.init.src
	}
	if p.adapter != nil {
		defer p.adapter.Close()
		opts.InitAdapters = p.adapter
	}
	defer p.data.Close()
	if p.data.train != nil {
		opts.UseData(p.data.train)
	}
	var rd *runDir
	if f.out != "" && j.leader() {
		if rd, err = claimOut(f.out, p.resume, p.resumeDir, f.overwrite); err != nil {
			return err
		}
		rd.args = f.args
		defer rd.close()
	}
	cfg := p.cfg
	if j != nil {
		// The first collective after this is the devices' opening.
		if err := j.agree(trainRunKey(c, p), nil); err != nil {
			return err
		}
	}
	devs, err := j.openDevices(cfg.Strata.Backend, cfg.Strata.Devices/j.procs(), cfg.Strata.HBMBytes, cfg.Strata.Deterministic)
	if err != nil {
		return err
	}
	defer devs.Close()
	tr, trFile, err := openTrainTrace(f.tracePath)
	if err != nil {
		return err
	}
	if trFile != nil {
		defer trFile.Close()
	}
	opts.Trace, opts.HostRegistrar, opts.Collectives = tr, devs.Registrar, devs.Collectives
	e, err := engine.New(cfg, devs.Devs, devs.Comms, opts)
	if err != nil {
		if trFile != nil { // nothing to write: no empty file left behind
			trFile.Close()
			os.Remove(trFile.Name())
		}
		return err
	}
	defer e.Close()
	if j != nil {
		// Before e.Close, which waits for the devices' collectives.
		defer func() { err = j.ended(err) }()
	}
	if tr != nil {
		// Written on every way out once the engine exists, a failed step
		// included (the timeline shows what it was doing).
		defer func() {
			if werr := writeTrace(trFile, e, tr, stdout); werr != nil && err == nil {
				err = werr
			}
		}()
	}
	if err := testPoint("start-up"); err != nil {
		return err
	}
	if err := startTrain(e, p, devs, stderr); err != nil {
		return err
	}
	l := &trainLoop{job: j, e: e, cfg: cfg, flags: f, start: p.start, steps: cfg.Strata.Steps, stderr: stderr, intr: intr, source: p.source, data: p.data, dataIDs: p.dataIDs,
		machine: plan.ThisMachine(cfg.Strata.Backend, devs.Devs[0].Name())}
	l.checked = p.start
	if s := intr.explain(l.stopping, l.aborting); s != nil {
		return interruptedError{msg: fmt.Sprintf("train: %v: stopped before the first step; nothing was written", s), status: exitStatus(s), alone: j != nil}
	}
	if rd != nil {
		file, err := rd.open(cfg, p, stderr)
		if err != nil {
			return err
		}
		defer file.Close()
		l.jsonl, l.runID = file, rd.id
	}
	if p.outputsOnly {
		return l.outputsOnly(stdout)
	}
	if j.leader() {
		// Closed on every way out: each step's events are written already.
		if l.mon, err = openMonitors(cfg, f.out, p.start*int64(cfg.TrainBatchSize), stderr); err != nil {
			return err
		}
		defer l.mon.close(stderr)
	}
	if err := l.run(); err != nil {
		return err
	}
	return l.report(stdout)
}

// trainFlags are the flags of `strata train` that act around the config:
// where the run writes, how often it saves, what it shows.
type trainFlags struct {
	out       string // --out DIR; "" for none
	saveEvery int    // --save-every N; 0 for none
	keep      int    // --keep K
	progress  bool   // a progress bar (stderr a terminal), else a line per steps_per_print steps
	tracePath string // --trace FILE; "" for none
	overwrite bool   // --overwrite: a new run may take a directory holding another run's files
	// args are the flags the run was given (givenFlags: before --epochs
	// sets --steps), recorded in run.json; goOn repeats them.
	args []string
}

// parseTrainFlags reads and checks the flags that need no config.
func parseTrainFlags(c *cli.Context) (trainFlags, error) {
	if c.Args().Present() {
		return trainFlags{}, usagef("train: unexpected argument %q: train takes only flags (see 'strata train --help')", c.Args().First())
	}
	f := trainFlags{out: c.String("out"), saveEvery: c.Int("save-every"), keep: c.Int("keep"),
		progress: !c.Bool("no-progress") && isTerminal(c.App.ErrWriter), tracePath: c.String("trace"), overwrite: c.Bool("overwrite"),
		args: givenFlags(c)}
	switch {
	case f.saveEvery < 0:
		return f, usagef("train: --save-every %d: need a positive number of steps", f.saveEvery)
	case f.saveEvery > 0 && f.out == "":
		return f, usagef("train: --save-every needs --out DIR (checkpoints go to DIR/checkpoints/)")
	case f.keep < 1:
		return f, usagef("train: --keep %d: need at least 1", f.keep)
	case c.IsSet("keep") && f.out == "":
		return f, usagef("train: --keep needs --out DIR (it bounds the checkpoints under DIR/checkpoints/)")
	case c.Bool("allow-data-change") && c.String("resume") == "":
		return f, usagef("train: --allow-data-change needs --resume PATH (it lets a resumed run go on with training data that changed since its checkpoint)")
	case f.out != "" && c.String("init") != "" && sameDir(f.out, c.String("init")):
		return f, usagef("train: --out %s is the --init directory: the run would replace the files it starts from (config.json, model.safetensors); write the run to another --out", f.out)
	case f.out != "" && c.String("adapter") != "" && sameDir(f.out, c.String("adapter")):
		return f, usagef("train: --out %s is the --adapter directory: write the run to another --out", f.out)
	case c.Bool("allow-other-base") && c.String("adapter") == "":
		return f, usagef("train: --allow-other-base needs --adapter DIR (it applies an adapter made for another base)")
	case f.overwrite && f.out == "":
		return f, usagef("train: --overwrite needs --out DIR (it lets this run take a directory that holds another run's files)")
	}
	return f, nil
}

// trainPlan is the run to do.
type trainPlan struct {
	cfg       *config.Config
	resume    *checkpoint.Manifest // the checkpoint to continue from; nil for a new run
	resumeDir string               // its directory
	start     int64                // the step the run resumes after
	data      *runData             // the training data (nil train: the synthetic corpus) and --eval-data
	init      *initModel           // --init: the model the run starts from; nil for the seeded initialisation
	adapter   *hf.PEFTAdapter      // --adapter: the LoRA adapter the run continues; nil for fresh adapters
	// source is where the run's weights came from (--init, or the
	// resumed checkpoint's record of it): its tokenizer is
	// source.TokenizerPath(). nil for a run from the seeded weights.
	source *hf.Source
	// dataIDs identify the training data, in every checkpoint (dataid.go).
	dataIDs []checkpoint.DataFile
	// outputsOnly: the resumed checkpoint is the run's last step, whose
	// outputs (model.safetensors, summary.json) a killed run did not
	// write: the run writes them and trains nothing.
	outputsOnly bool
}

// planTrain resolves the config (--config, else the checkpoint of
// --resume, else the demonstration) with the flags applied, prints its
// notes, checks a resumed run against --steps and --out, and opens the
// training text (ctx, the first signal, stops its tokenizing).
func planTrain(ctx context.Context, c *cli.Context, stderr io.Writer) (_ *trainPlan, err error) {
	if err := checkDataFlags(c); err != nil {
		return nil, err
	}
	p := &trainPlan{}
	if c.String("init") != "" && c.String("resume") != "" {
		return nil, usagef("train: --init starts a new run from a model's weights, --resume continues a run: give one of them")
	}
	if c.String("adapter") != "" && c.String("init") == "" {
		return nil, usagef("train: --adapter continues a PEFT adapter on its base model: name the base with --init")
	}
	if path := c.String("resume"); path != "" {
		var err error
		if p.resume, p.resumeDir, err = resolveResume(path, stderr); err != nil {
			return nil, err
		}
		p.source = p.resume.Source
	}
	if path := c.String("init"); path != "" {
		var err error
		if p.init, err = probeInit(path); err != nil {
			return nil, err
		}
	}
	cfg, err := trainConfig(c, p.resume, p.resumeDir, p.init)
	if err != nil {
		return nil, err
	}
	if err := applyTrainFlags(c, cfg); err != nil {
		return nil, err
	}
	if p.init != nil {
		if err := p.init.apply(cfg); err != nil {
			return nil, err
		}
		if err := p.init.open(); err != nil {
			return nil, err
		}
		p.source = p.init.source
	}
	defer func() {
		if err != nil {
			p.init.close()
			p.data.Close()
			if p.adapter != nil {
				p.adapter.Close()
			}
		}
	}()
	if dir := c.String("adapter"); dir != "" {
		if p.adapter, p.source, err = openAdapter(dir, cfg, p.init, c.Bool("allow-other-base"), stderr); err != nil {
			return nil, err
		}
	}
	identifyRunData(p, cfg)
	if p.data, err = openRunData(ctx, c, cfg, p.source, stderr); err != nil {
		return nil, err
	}
	if c.IsSet("epochs") {
		if cfg, err = epochConfig(c, p, cfg, stderr); err != nil {
			return nil, err
		}
	}
	p.cfg = cfg
	if c.IsSet("config") || p.resume == nil {
		// Not for the checkpoint's config: it is the resolved config, which
		// names every knob, so each would read as set by the user (the run
		// that saved it printed the notes of the config it was given).
		printConfigNotes(stderr, cfg.Ignored())
		if ch := cfg.AutoChosen(); len(ch) > 0 {
			fmt.Fprintf(stderr, "note: \"auto\" values filled in (written to --out's config.json): %s\n", strings.Join(ch, "; "))
		}
	}
	if p.resume != nil {
		if err := checkResume(c, p, stderr); err != nil {
			return nil, err
		}
		if err := checkData(c, p, stderr); err != nil {
			return nil, err
		}
	}
	for _, n := range []string{lrPastSchedule(cfg), lrHeldAtMin(cfg)} {
		if n != "" {
			fmt.Fprintf(stderr, "note: %s\n", n)
		}
	}
	return p, nil
}

// openAdapter opens the PEFT adapter of --adapter for the run's base
// shape and sets cfg's strata.lora from it; a strata.lora of the config
// that says otherwise is refused, as are an adapter that --init already
// holds (ownAdapter) and one made for another base (adapterBase; a note
// with allowOther or when its base cannot be resolved). It returns the
// adapter and the run's source with the adapter recorded (hf.Source.Adapter).
func openAdapter(dir string, cfg *config.Config, im *initModel, allowOther bool, stderr io.Writer) (*hf.PEFTAdapter, *hf.Source, error) {
	if cfg.Shape() == nil {
		return nil, nil, fmt.Errorf("train: --adapter %s: the run's model has no shape", dir)
	}
	a, err := hf.OpenPEFT(dir, model.Shape(*cfg.Shape()))
	if err != nil {
		return nil, nil, fmt.Errorf("train: --adapter: %w", err)
	}
	note, err := "", ownAdapter(a, im)
	if err == nil {
		note, err = adapterBase(a, im, allowOther)
	}
	if err != nil {
		a.Close()
		return nil, nil, err
	}
	if note != "" {
		fmt.Fprintf(stderr, "note: %s\n", note)
	}
	o := &config.LoRA{R: a.LoRA.R, Alpha: a.LoRA.Alpha, Dropout: a.LoRA.Dropout, TargetModules: a.LoRA.Targets, UseRSLoRA: a.LoRA.RSLoRA}
	if have := cfg.Strata.LoRA; have != nil {
		got, _ := json.Marshal(have)
		want, _ := json.Marshal(o)
		if string(got) != string(want) {
			a.Close()
			return nil, nil, fmt.Errorf("train: --adapter %s is r %d, alpha %g, target_modules %v, use_rslora %t; the config's strata.lora %s says otherwise: leave strata.lora out (it comes from the adapter) or make it the same",
				dir, o.R, o.Alpha, o.TargetModules, o.UseRSLoRA, got)
		}
	}
	cfg.Strata.LoRA = o
	src := *im.source
	src.Adapter, _ = filepath.Abs(dir)
	return a, &src, nil
}

// epochConfig is the config of a run of --epochs: the steps the epochs
// take (epochSteps), given as --steps is (strata.steps, and a scheduler
// total_num_steps written "auto").
func epochConfig(c *cli.Context, p *trainPlan, cfg *config.Config, stderr io.Writer) (*config.Config, error) {
	n, err := epochSteps(p.data, cfg, c.Int("epochs"))
	if err != nil {
		return nil, err
	}
	if err := c.Set("steps", strconv.Itoa(n)); err != nil {
		return nil, fmt.Errorf("train: --epochs: %w", err)
	}
	again, err := trainConfig(c, p.resume, p.resumeDir, p.init)
	if err == nil {
		err = applyTrainFlags(c, again)
	}
	if err == nil && p.init != nil {
		err = p.init.apply(again)
	}
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(stderr, "note: --epochs %d: %d steps of %d rows\n", c.Int("epochs"), n, again.TrainBatchSize)
	return again, nil
}

// trainConfig is the config the run starts from: --config, else the one
// the checkpoint of --resume was saved with (for --devices devices when
// given), else the demonstration's; with --init (im), of its model.
func trainConfig(c *cli.Context, resume *checkpoint.Manifest, resumeDir string, im *initModel) (*config.Config, error) {
	if c.String("config") == "" {
		for _, name := range []string{"lr", "micro-batch", "warmup-steps"} {
			if c.IsSet(name) {
				return nil, usagef("train: --%s fills the \"auto\" values of a --config file; without --config, write the value in a config", name)
			}
		}
	}
	switch {
	case c.String("config") != "":
		opts, err := configOptions(c)
		if err != nil {
			return nil, err
		}
		if im != nil {
			return im.loadConfig(c.String("config"), opts)
		}
		if resume != nil {
			return loadResumeConfig(c.String("config"), opts, resume, resumeDir)
		}
		return config.Load(c.String("config"), opts)
	case resume != nil:
		// The run goes on with the config it was saved with.
		if len(resume.Config) == 0 {
			return nil, fmt.Errorf("train: --resume %s: the checkpoint holds no config; pass --config", resumeDir)
		}
		saved := []byte(resume.Config)
		if c.IsSet("devices") {
			saved = forDevices(saved, c.Int("devices"))
		}
		cfg, err := config.Parse(saved, filepath.Join(resumeDir, "manifest.json"), config.Options{LookupShape: lookupShape})
		if err != nil {
			return nil, resumeDevicesError(resume, resumeDir, c, err)
		}
		return cfg, nil
	}
	steps := demoSteps
	if c.IsSet("steps") {
		steps = max(1, c.Int("steps"))
	}
	cfg := demoConfig(steps)
	if im != nil {
		im.demo(cfg)
	}
	if !c.IsSet("devices") {
		if err := cfg.SetDevices(2); err != nil {
			return nil, err
		}
	}
	return cfg, nil
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
		saved, err := config.Parse(resume.Config, filepath.Join(resumeDir, checkpoint.ManifestName), config.Options{LookupShape: lookupShape})
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

// configOptions are the parse options of --config: --devices decides the
// device count, and --lr, --micro-batch, --warmup-steps and --steps fill the
// keys written "auto".
func configOptions(c *cli.Context) (config.Options, error) {
	opts := config.Options{LookupShape: lookupShape}
	for _, name := range []string{"devices", "micro-batch", "steps"} {
		if c.IsSet(name) && c.Int(name) < 1 {
			return opts, usagef("train: --%s %d: need at least 1", name, c.Int(name))
		}
	}
	if c.IsSet("warmup-steps") && c.Int("warmup-steps") < 0 {
		return opts, usagef("train: --warmup-steps %d: need 0 or more", c.Int("warmup-steps"))
	}
	if c.IsSet("lr") && !(c.Float64("lr") > 0) {
		return opts, usagef("train: --lr %v: need a positive learning rate", c.Float64("lr"))
	}
	opts.Devices = c.Int("devices")
	opts.Auto = config.Auto{LR: c.Float64("lr"), MicroBatch: c.Int("micro-batch"), WarmupSteps: c.Int("warmup-steps"), Steps: c.Int("steps")}
	return opts, nil
}

// resumeDevicesError explains a checkpoint's config that does not fit the
// --devices of the resumed run: the saved batch, the new device count, and
// how to go on (the checkpoint itself reshards to any device count).
func resumeDevicesError(m *checkpoint.Manifest, dir string, c *cli.Context, err error) error {
	if !c.IsSet("devices") || c.Int("devices") == m.Devices {
		return fmt.Errorf("train: --resume: %w", err)
	}
	var saved struct {
		Train int `json:"train_batch_size"`
		Micro int `json:"train_micro_batch_size_per_gpu"`
	}
	n := c.Int("devices")
	if json.Unmarshal(m.Config, &saved) != nil || saved.Micro < 1 || saved.Train%(saved.Micro*n) == 0 {
		return fmt.Errorf("train: --resume: %w", err)
	}
	return fmt.Errorf("train: --resume %s: the run was saved on %d devices with train_batch_size %d (micro-batch %d); on --devices %d that global batch does not split: %d is not a multiple of micro-batch %d × %d devices. "+
		"The checkpoint reshards to any device count: pick --devices so that %d × devices divides %d, or pass --config with a batch for %d devices (a different global batch changes the run)",
		dir, m.Devices, saved.Train, saved.Micro, n, saved.Train, saved.Micro, n, saved.Micro, saved.Train, n)
}

// applyTrainFlags sets what --devices, --steps, --data and --backend say
// on cfg.
func applyTrainFlags(c *cli.Context, cfg *config.Config) error {
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
		// Absolute: a run resumed from another directory reads the same file.
		cfg.Strata.Data = absPath(c.String("data"))
	}
	if c.IsSet("data-columns") {
		cfg.Strata.DataColumns = c.String("data-columns")
	}
	if cfg.Shape() == nil {
		return fmt.Errorf("train: strata.model %q has no shape", cfg.Strata.Model.Name)
	}
	if c.IsSet("backend") {
		if b := c.String("backend"); !slices.Contains(backend.Names, b) {
			return usagef("train: --backend %q is not one of %s", b, strings.Join(backend.Names, ", "))
		}
		cfg.Strata.Backend = c.String("backend")
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

// checkResume refuses a resumed run with nothing to train, and notes how --config differs from the
// checkpoint's config.
func checkResume(c *cli.Context, p *trainPlan, stderr io.Writer) error {
	p.start = p.resume.Step
	steps := p.cfg.Strata.Steps
	if p.start == int64(steps) && outputsMissing(c.String("out"), p) {
		p.outputsOnly = true
		fmt.Fprintf(stderr, "note: --resume: %s is the run's last step, %d, and %s lacks the outputs of it (the run was stopped before it wrote them): writing them; nothing to train\n",
			p.resumeDir, p.start, c.String("out"))
		return nil
	}
	if p.start >= int64(steps) {
		return usagef("train: --resume: %s is at step %d, and --steps (the total, counted from step 1) is %d: nothing to train; raise --steps above %d to continue",
			p.resumeDir, p.start, steps, p.start)
	}
	if c.IsSet("config") {
		if d := configDiff(p.resume.Config, p.cfg.JSON()); d != "" {
			fmt.Fprintf(stderr, "note: --config differs from the config %s was saved with: %s\n", p.resumeDir, d)
		}
	}
	return nil
}

// outputsMissing says whether out is the directory of the run p resumes
// (its checkpoint is one of out's) and lacks the outputs of its step:
// model.safetensors of that step, or summary.json.
func outputsMissing(out string, p *trainPlan) bool {
	if out == "" || !sameDir(filepath.Dir(p.resumeDir), filepath.Join(out, "checkpoints")) {
		return false
	}
	if _, err := os.Stat(filepath.Join(out, "summary.json")); err != nil {
		return true
	}
	f, err := safetensors.Open(filepath.Join(out, "model.safetensors"))
	if err != nil {
		return true
	}
	defer f.Close()
	return f.Header.Metadata[hf.MetaStep] != strconv.FormatInt(p.start, 10)
}

// openTrainTrace makes the tracer of --trace and creates its file now, so
// that a path that cannot be written fails before the training rather than
// after it. Without --trace: nil, nil.
func openTrainTrace(path string) (*timeline.Tracer, *os.File, error) {
	if path == "" {
		return nil, nil, nil
	}
	tr, err := timeline.NewTracer(timeline.Options{})
	if err != nil {
		return nil, nil, err
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, nil, fmt.Errorf("train: --trace: %w", err)
	}
	return tr, f, nil
}

// writeRunOut writes the trained weights (fp32 master weights, gathered
// from every rank's shards and tier, streamed one chunk at a time) as one
// safetensors file, then summary.json (with the last evaluation, when there
// was one), each atomically under dir: the weights first, so that a disk
// that fills loses the small summary, not them; a failure names what was
// written and what was not.
func writeRunOut(dir string, e *engine.Engine, sum report.Summary, elapsed time.Duration, ev *EvalLine, st stepTime, stdout io.Writer) error {
	path := filepath.Join(dir, "model.safetensors")
	// A run killed while writing it left .model.safetensors.tmp-PID-*.
	stale, err := durable.RemoveStale(dir, "model.safetensors")
	for _, n := range stale {
		fmt.Fprintf(stdout, "note: %s\n", n)
	}
	if err != nil {
		return fmt.Errorf("train: --out: %w", err)
	}
	werr := hf.ExportStream(path, e.Layout(), hf.ExportOptions{Step: e.StepCount()}, func(w *hf.ExportWriter) error {
		return e.MasterChunks(w.F32)
	})
	if werr == nil {
		fmt.Fprintf(stdout, "wrote %s (fp32 weights; `strata inspect` lists them)\n", path)
	}
	js := summaryJSON(sum, elapsed)
	if ev != nil {
		js["eval_loss"], js["eval_tokens"] = ev.Loss, ev.Tokens
	}
	if st.Measured > 0 {
		js["measured_step_s"] = st.Measured // the median past the first two steps
	}
	if st.Predicted > 0 {
		js["predicted_step_s"], js["predicted_by"] = st.Predicted, "strata plan, profile "+st.Profile
	}
	b, _ := json.MarshalIndent(js, "", "  ")
	serr := durable.WriteFile(filepath.Join(dir, "summary.json"), 64<<10, func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	})
	switch {
	case werr != nil && serr != nil:
		return fmt.Errorf("train: --out: neither the weights nor the summary were written: %v; %v", werr, cause(serr))
	case werr != nil:
		return fmt.Errorf("train: --out: the weights were not written (summary.json was): %w", werr)
	case serr != nil:
		return fmt.Errorf("train: --out: summary.json was not written: %s (the weights of step %d are in %s)", cause(serr), e.StepCount(), path)
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

// lrHeldAtMin says when a warm-up of fewer than 2 steps still holds the
// first updates at warmup_min_lr: DeepSpeed warms up over max(2,
// warmup_num_steps), so with warmup_num_steps 0 (or 1) updates 1 and 2 run
// at warmup_min_lr (0 by default), the progress line's "lr 0".
func lrHeldAtMin(cfg *config.Config) string {
	sc := cfg.Scheduler
	if sc.Type == "" || sc.Params.WarmupNumSteps >= 2 || slices.ContainsFunc(cfg.AutoChosen(), func(s string) bool {
		return strings.HasPrefix(s, "scheduler.params.warmup_num_steps =") // the "auto" note says it
	}) {
		return ""
	}
	var held []string
	for step := 1; step <= min(cfg.Strata.Steps, 2); step++ {
		if lr := cfg.LR(step - 1); lr == sc.Params.WarmupMinLR {
			held = append(held, fmt.Sprint(step))
		}
	}
	if len(held) == 0 {
		return ""
	}
	return fmt.Sprintf("scheduler %s: warmup_num_steps %d warms up over 2 steps as DeepSpeed does (max(2, warmup_num_steps)): step(s) %s run at warmup_min_lr %g; for no warm-up, leave the scheduler out (a constant optimizer.params.lr), or set warmup_min_lr to warmup_max_lr",
		sc.Type, sc.Params.WarmupNumSteps, strings.Join(held, ", "), sc.Params.WarmupMinLR)
}

func summaryJSON(s report.Summary, elapsed time.Duration) map[string]any {
	var devs []deviceJSON
	for _, d := range s.PerDevice {
		devs = append(devs, deviceJSON{d.Device, d.ModelStatePeakBytes, d.Formula, d.FormulaBytes, d.PaddingBytes, d.PersistentBytes,
			d.EstimateBytes, d.FormulaRatio, d.EstimateRatio, d.TierHBMBytes,
			d.GatheredPeakBytes, d.BucketPeakBytes, d.WorkspacePeakBytes, d.ActivationPeakBytes, d.ActivationEstimateBytes, d.ActivationRatio, d.PeakBytes,
			d.WorkspaceRingBytes, d.TierSlotBytes, d.Driver.Allocs, d.Driver.Frees, d.DeviceAllocsAfterStep1,
			d.Moved.HostToDevicePageable, d.Moved.DeviceToHostPageable})
	}
	regs := []registrationJSON{}
	for _, h := range s.HostRegistration {
		regs = append(regs, registrationJSON{h.Pool, h.Bytes, h.Outcome, h.RegisteredBytes, h.Error})
	}
	prec := "bf16"
	switch s.Precision {
	case gpu.F32:
		prec = "fp32"
	case gpu.F16:
		prec = "fp16"
	}
	out := map[string]any{
		"model": s.Model, "params": s.Params, "devices": s.Devices, "processes": s.Processes, "stage": s.Stage, "precision": prec,
		"optimizer": s.Optimizer, "overlap": s.Overlap, "steps": s.Steps, "elapsed_s": elapsed.Seconds(),
		"per_device": devs, "host_model_state_bytes": s.HostBytes, "host_formula_bytes": s.HostFormula,
		"host_staging_bytes": s.HostStagingBytes, "host_undo_bytes": s.HostUndoBytes, "notes": s.Notes, "tier": tierJSON(s.Tier),
		"host_registration": regs,
		"activations":       s.Activations, "activation_host_bytes": s.ActivationHostBytes,
		"collectives": s.Collectives,
		"host_optimizer": map[string]any{"adam_s": s.HostOpt.Adam.Seconds(), "adam_exposed_s": s.HostOpt.AdamExposed.Seconds(),
			"adam_exposed_fraction": s.HostOpt.AdamExposedFraction(), "opt_io_s": s.HostOpt.IOWait.Seconds(), "opt_io_exposed_s": s.HostOpt.IOExposed.Seconds()},
	}
	if s.FrozenParams > 0 {
		out["frozen"] = frozenJSON(s)
	}
	if s.Precision == gpu.F16 {
		out["skipped_steps"], out["loss_scale"] = s.SkippedSteps, s.LossScale // the scale the next step would run with
	}
	return out
}

// removeSwapFiles removes the names of this process's swap files before a
// second signal ends it without closing the engine (the kernel frees their
// space at exit), and says which.
func removeSwapFiles() string {
	removed := engine.RemoveSwapFiles()
	if len(removed) == 0 {
		return ""
	}
	return fmt.Sprintf("removed the swap files %s", strings.Join(removed, ", "))
}
