package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/engine"
	"github.com/strata-ai/strata/gpu/backend"
	"github.com/strata-ai/strata/hf"
	trainrun "github.com/strata-ai/strata/run"
	"github.com/strata-ai/strata/timeline"
)

// trainCommand trains a model with ZeRO across the local devices.
func trainCommand() *cli.Command {
	return &cli.Command{
		Name:      "train",
		Usage:     "train a model with ZeRO stages 0-3 across the local devices (DeepSpeed-style config)",
		UsageText: "strata train [--config ds_config.json [--lr X] [--micro-batch N] [--warmup-steps N]] [--data FILE [--epochs N] [--no-shuffle] [--chat-template PATH]] [--eval-data FILE [--eval-every N]] [--devices N] [--backend cpu|cuda] [--steps N] [--out DIR [--save-every N [--keep K]] [--overwrite]] [--resume PATH [--allow-data-change] | --init PATH] [--trace FILE] [--profile FILE]",
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
			"(recorded in run.json); a second one aborts the save (the previous complete checkpoint survives).\n" +
			"A run of 3 steps or more ends with its median step time past the first two and the step strata plan predicts\n" +
			"for its placement from the machine's profile (--profile FILE, else $STRATA_PROFILE, else\n" +
			"~/.config/strata/profile.json), with the prediction's error; without a prediction, one line says where it\n" +
			"looked and why (no profile there, one of another machine, no step of this model at this batch: the\n" +
			"strata plan command that measures it). summary.json records both.",
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
			&cli.StringFlag{Name: "profile", Usage: "the strata plan profile the median step is compared with at the end (default $STRATA_PROFILE, else ~/.config/strata/profile.json)"},
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

// demoSteps is the length of the demonstration.
const demoSteps = trainrun.DemoSteps

// runTrain is `strata train`: the flags and the config make a plan, the
// plan the options of trainrun.Train, which runs the steps (progress,
// checkpoints) and writes the outputs; here the signals and the job of
// several processes. A signal before the first step ends the run there,
// every start-up path closing what it opened (the engine's Close removes
// its swap files).
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
	sigs := &trainSignals{status: &trainrun.Status{}, job: j, out: f.out, args: f.args}
	intr := watchInterrupts(stderr, sigs.first, sigs.second, removeSwapFiles)
	stderr = intr.stderr
	defer intr.stop() // through the outputs: a signal there does not cut them short
	ctx, cancel := context.WithCancelCause(intr.ctx)
	defer cancel(nil)
	intr.mu.Lock() // first reads it under in.mu
	sigs.cancel = cancel
	intr.mu.Unlock()
	if j != nil {
		// mpirun answers Ctrl-C with SIGTERM to every process and SIGKILL
		// a second later (odls_base_sigkill_timeout): too soon for a step
		// and its checkpoint. SIGUSR1 it passes on alone.
		intr.also(syscall.SIGUSR1)
	}
	// The tokenizing stops on in.ctx, which the watcher cancels after the
	// first signal's explanation (as it always did); ctx, cancelled with
	// the signal inside that explanation, stops the run where it says.
	p, err := planTrain(intr.ctx, c, stderr)
	if err != nil {
		if s := intr.requested(); s != nil && errors.Is(err, context.Canceled) {
			// The first signal stopped the tokenizing of the data.
			return interruptedError{msg: fmt.Sprintf("train: %v: stopped before the first step; nothing was written", s), status: exitStatus(s)}
		}
		return err
	}
	defer p.close()
	if j != nil {
		// The job's ranks: every process's --devices.
		if err := p.cfg.SetDevices(c.Int("devices") * j.procs()); err != nil {
			return fmt.Errorf("train: %s: %w", j.place, err)
		}
	}
	sigs.steps = p.cfg.Strata.Steps
	tr, trFile, err := openTrainTrace(f.tracePath)
	if err != nil {
		return err
	}
	opts := trainrun.Options{Config: p.cfg, Out: f.out, SaveEvery: f.saveEvery, Keep: f.keep, Overwrite: f.overwrite, Data: p.data,
		Adapter: p.adapter, Source: p.source, Args: f.args, GoOn: goOn, Progress: stderr, Report: stdout, ProgressBar: f.progress,
		ProfilePath: c.String("profile"), Trace: tr, Boundary: &intr.mu, Status: sigs.status, Hook: testPoint}
	if p.resume != nil {
		opts.Resume = &trainrun.Resume{Manifest: p.resume, Dir: p.resumeDir, AllowDataChange: c.Bool("allow-data-change")}
		if c.IsSet("config") {
			opts.Resume.ConfigDiff = trainrun.ConfigDiff(p.resume.Config, p.cfg.JSON())
		}
	}
	if p.init != nil {
		opts.Init, opts.InitName = p.init.src, p.init.describe()
	}
	if j != nil {
		opts.Job = &trainJob{j: j, key: func() runKey { return trainRunKey(c, p) }}
	}
	made := false
	if tr != nil {
		// Written on every way out once the engine exists, a failed step
		// included (the timeline shows what it was doing).
		opts.Closing = func(e *engine.Engine) error {
			made = true
			return writeTrace(trFile, e, tr, stdout)
		}
	}
	_, err = trainrun.Train(ctx, opts, nil)
	if trFile != nil && !made { // nothing to write: no empty file left behind
		trFile.Close()
		os.Remove(trFile.Name())
	}
	return runError(err, j != nil)
}

// runError is err of the run package as the command reports it: a stop
// on a signal with the signal's status, bad input as bad usage (exit 2).
func runError(err error, alone ...bool) error {
	if se := stoppedError(err, len(alone) > 0 && alone[0]); se != nil {
		return se
	}
	var ie *trainrun.InputError
	if errors.As(err, &ie) {
		return usageError{err.Error()}
	}
	return err
}

// trainJob is what trainrun.Train needs of the job of several processes.
type trainJob struct {
	j   *job
	key func() runKey // the run's key (agree.go), once its config is resolved
}

func (t *trainJob) Leader() bool          { return t.j.leader() }
func (t *trainJob) Procs() engine.Procs   { return t.j.engineProcs() }
func (t *trainJob) NodeProcs() int        { return t.j.nodeProcs() }
func (t *trainJob) Agree() error          { return t.j.agree(t.key(), nil) }
func (t *trainJob) Launcher() string      { return t.j.launcher() }
func (t *trainJob) Ended(err error) error { return t.j.ended(runError(err, true)) }
func (t *trainJob) Follow(path string, err error) (string, error) {
	return t.j.follow(path, err)
}

func (t *trainJob) OpenDevices(name string, n int, hbmBytes int64, deterministic bool) (*backend.Devices, error) {
	return t.j.openDevices(name, n/t.j.procs(), hbmBytes, deterministic)
}

func (t *trainJob) AnyStop(mine error) (error, error) {
	var sig os.Signal
	if mine != nil {
		sig = signalOf(mine)
	}
	s, err := t.j.anySignal(sig)
	if s == nil || err != nil {
		return nil, err
	}
	return signalStop{s.(syscall.Signal)}, nil
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
	data      *trainrun.Data       // the training data (nil train: the synthetic corpus) and --eval-data
	init      *initModel           // --init: the model the run starts from; nil for the seeded initialisation
	adapter   *hf.PEFTAdapter      // --adapter: the LoRA adapter the run continues; nil for fresh adapters
	// source is where the run's weights came from (--init, or the
	// resumed checkpoint's record of it): its tokenizer is
	// source.TokenizerPath(). nil for a run from the seeded weights.
	source *hf.Source
	// dataIDs identify the training data, in every checkpoint (trainrun.Data.Identity).
	dataIDs []checkpoint.DataFile
}

// close closes what the plan opened: the initial weights, the adapter,
// the data.
func (p *trainPlan) close() {
	p.init.close()
	p.data.Close()
	if p.adapter != nil {
		p.adapter.Close()
	}
}

// planTrain resolves the config (--config, else the checkpoint of
// --resume, else the demonstration) with the flags applied, prints its
// notes, and opens the training text (ctx, the first signal, stops its
// tokenizing); trainrun.Train checks a resumed run against --steps, --out and
// its data.
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
		var note string
		p.resume, p.resumeDir, note, err = trainrun.ResolveResume(ctx, path)
		printNote(stderr, note)
		if err != nil {
			return nil, err
		}
		p.source = p.resume.Source
	}
	if path := c.String("init"); path != "" {
		if p.init, err = probeInit(path); err != nil {
			return nil, err
		}
	}
	req := configRequest(c, p)
	cfg, err := trainrun.Resolve(ctx, req)
	if err != nil {
		return nil, runError(err)
	}
	if p.init != nil {
		if err := p.init.open(); err != nil {
			return nil, err
		}
		p.source = p.init.source
	}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	if dir := c.String("adapter"); dir != "" {
		var note string
		p.adapter, p.source, note, err = trainrun.OpenAdapter(ctx, dir, cfg, p.init.m, c.Bool("allow-other-base"))
		printNote(stderr, note)
		if err != nil {
			return nil, err
		}
	}
	if p.data, err = openRunData(ctx, c, cfg, p.source, stderr); err != nil {
		return nil, err
	}
	p.dataIDs = p.data.Identity()
	if c.IsSet("epochs") {
		var n int
		if cfg, n, err = trainrun.ResolveEpochs(ctx, req, cfg, p.data, c.Int("epochs")); err != nil {
			return nil, runError(err)
		}
		fmt.Fprintf(stderr, "note: --epochs %d: %d steps of %d rows\n", c.Int("epochs"), n, cfg.TrainBatchSize)
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
	return p, nil
}

// configRequest is the request of the config that c's flags say
// (trainrun.Resolve), for the checkpoint and model p resolved.
func configRequest(c *cli.Context, p *trainPlan) trainrun.ConfigRequest {
	req := trainrun.ConfigRequest{ConfigPath: c.String("config"), Resume: p.resume, ResumeDir: p.resumeDir,
		Data: c.String("data"), DataColumns: c.String("data-columns"), Backend: c.String("backend")}
	if p.init != nil {
		req.Init = p.init.m
	}
	ints := map[string]**int{"devices": &req.Devices, "steps": &req.Steps, "micro-batch": &req.MicroBatch, "warmup-steps": &req.WarmupSteps}
	for name, v := range ints {
		if c.IsSet(name) {
			n := c.Int(name)
			*v = &n
		}
	}
	if c.IsSet("lr") {
		lr := c.Float64("lr")
		req.LR = &lr
	}
	return req
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
