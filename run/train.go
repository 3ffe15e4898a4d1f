package run

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/engine"
	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu/backend"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/internal/durable"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/plan"
	"github.com/strata-ai/strata/safetensors"
)

// Train trains the run opts describes: it checks a resumed run against
// its steps and data, claims opts.Out, opens the devices and the engine,
// runs the steps from the resumed one (or 1) to the config's
// strata.steps, and writes the outputs. onStep, when set, is called after
// each step (its steps.jsonl line, evaluation and checkpoint done); an
// error from it ends the run.
//
// A cancelled ctx stops the run at the next step boundary: that step is
// saved (with Out) and its outputs written as at the end, and Train
// returns the Result with a *StoppedError (errors.Is context.Canceled). A
// ctx cancelled before the first step ends the run there, with nothing
// written.
func Train(ctx context.Context, opts Options, onStep func(Step) error) (res *Result, err error) {
	o := &opts
	if err := o.defaults(); err != nil {
		return nil, err
	}
	if o.Data == nil && o.Config.Strata.Data != "" {
		// strata.data without OpenData's options: read as the defaults say.
		if o.Data, err = OpenData(ctx, o.Config, DataOptions{Out: o.Out, Source: o.Source, DataGiven: true}, o.Progress); err != nil {
			return nil, err
		}
		defer o.Data.Close()
	}
	p, err := newRunPlan(o)
	if err != nil {
		return nil, err
	}
	cfg := p.cfg
	var rd *runDir
	if o.Out != "" && o.leader() {
		if rd, err = claimOut(o.Out, p.resume, p.resumeDir, o.Overwrite, o.GoOn); err != nil {
			return nil, err
		}
		rd.args = o.Args
		defer rd.close()
	}
	if o.Job != nil {
		// The first collective after this is the devices' opening.
		if err := o.Job.Agree(); err != nil {
			return nil, err
		}
	}
	var devs *backend.Devices
	if o.Job != nil {
		devs, err = o.Job.OpenDevices(cfg.Strata.Backend, cfg.Strata.Devices, cfg.Strata.HBMBytes, cfg.Strata.Deterministic)
	} else {
		devs, err = backend.Open(cfg.Strata.Backend, cfg.Strata.Devices, cfg.Strata.HBMBytes, cfg.Strata.Deterministic)
	}
	if err != nil {
		return nil, err
	}
	defer devs.Close()
	eo := engine.Options{Init: o.Init, Trace: o.Trace, HostRegistrar: devs.Registrar, Collectives: devs.Collectives}
	if o.Adapter != nil {
		eo.InitAdapters = o.Adapter
	}
	if o.Job != nil {
		eo.Procs, eo.NodeProcs = o.Job.Procs(), o.Job.NodeProcs()
	}
	if o.Data != nil && o.Data.train != nil {
		eo.UseData(o.Data.train)
	}
	e, err := engine.New(cfg, devs.Devs, devs.Comms, eo)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	if o.Job != nil {
		// Before e.Close, which waits for the devices' collectives.
		defer func() { err = o.Job.Ended(err) }()
	}
	if o.Closing != nil {
		// On every way out once the engine exists, a failed step included
		// (a timeline shows what it was doing).
		defer func() {
			if cerr := o.Closing(e); cerr != nil && err == nil {
				err = cerr
			}
		}()
	}
	if err := o.hook("start-up"); err != nil {
		return nil, err
	}
	if err := p.startEngine(e, o, devs); err != nil {
		return nil, err
	}
	l := &trainLoop{o: o, ctx: ctx, onStep: onStep, e: e, cfg: cfg, start: p.start, steps: cfg.Strata.Steps, stderr: o.Progress,
		data: o.Data, dataIDs: p.dataIDs, machine: plan.ThisMachine(cfg.Strata.Backend, devs.Devs[0].Name()),
		hbmBytes: devs.Devs[0].MemStats().BudgetBytes}
	if cause := l.started(); cause != nil {
		return nil, &StoppedError{Step: p.start, Total: cfg.Strata.Steps, Cause: cause}
	}
	if rd != nil {
		file, err := rd.open(cfg, p, o.Progress)
		if err != nil {
			return nil, err
		}
		defer file.Close()
		l.jsonl, l.runID = file, rd.id
	}
	if p.outputsOnly {
		return l.outputsOnly()
	}
	if o.leader() {
		// Closed on every way out: each step's events are written already.
		if l.mon, err = openMonitors(cfg, o.Out, p.start*int64(cfg.TrainBatchSize), o.Progress); err != nil {
			return nil, err
		}
		defer l.mon.close(o.Progress)
	}
	if err := l.run(); err != nil {
		return nil, err
	}
	return l.report()
}

// started marks the run started in Status, under Options.Boundary, and
// returns the cause of a stop asked for before (nil when none).
func (l *trainLoop) started() error {
	if b := l.o.Boundary; b != nil {
		b.Lock()
		defer b.Unlock()
	}
	if s := l.o.Status; s != nil {
		s.checked.Store(l.start)
		s.started.Store(true)
	}
	if l.ctx.Err() == nil {
		return nil
	}
	return context.Cause(l.ctx)
}

// runPlan is the run to do.
type runPlan struct {
	cfg       *config.Config
	resume    *checkpoint.Manifest // the checkpoint to continue from; nil for a new run
	resumeDir string               // its directory
	start     int64                // the step the run resumes after
	// source is where the run's weights came from: its tokenizer is
	// source.TokenizerPath(). nil for a run from the seeded weights.
	source *hf.Source
	// dataIDs identify the training data, in every checkpoint (dataid.go).
	dataIDs []checkpoint.DataFile
	// outputsOnly: the resumed checkpoint is the run's last step, whose
	// outputs (model.safetensors, summary.json) a killed run did not
	// write: the run writes them and trains nothing.
	outputsOnly bool
	initName    string
	adapter     *hf.PEFTAdapter
}

// newRunPlan checks a resumed run against its steps, its Out and its
// data, and notes what the schedule does with the steps.
func newRunPlan(o *Options) (*runPlan, error) {
	p := &runPlan{cfg: o.Config, source: o.Source, dataIDs: o.Data.Identity(), initName: o.InitName, adapter: o.Adapter}
	if r := o.Resume; r != nil {
		p.resume, p.resumeDir = r.Manifest, r.Dir
		if err := p.checkResume(o); err != nil {
			return nil, err
		}
		if err := checkData(r, p.dataIDs, o.Progress); err != nil {
			return nil, err
		}
	}
	for _, n := range []string{lrPastSchedule(p.cfg), lrHeldAtMin(p.cfg)} {
		if n != "" {
			fmt.Fprintf(o.Progress, "note: %s\n", n)
		}
	}
	return p, nil
}

// checkResume refuses a resumed run with nothing to train, and notes how
// its config differs from the checkpoint's config.
func (p *runPlan) checkResume(o *Options) error {
	p.start = p.resume.Step
	steps := p.cfg.Strata.Steps
	if p.start == int64(steps) && outputsMissing(o.Out, p) {
		p.outputsOnly = true
		fmt.Fprintf(o.Progress, "note: --resume: %s is the run's last step, %d, and %s lacks the outputs of it (the run was stopped before it wrote them): writing them; nothing to train\n",
			p.resumeDir, p.start, o.Out)
		return nil
	}
	if p.start >= int64(steps) {
		return inputf("train: --resume: %s is at step %d, and --steps (the total, counted from step 1) is %d: nothing to train; raise --steps above %d to continue",
			p.resumeDir, p.start, steps, p.start)
	}
	if d := o.Resume.ConfigDiff; d != "" {
		fmt.Fprintf(o.Progress, "note: --config differs from the config %s was saved with: %s\n", p.resumeDir, d)
	}
	return nil
}

// outputsMissing says whether out is the directory of the run p resumes
// (its checkpoint is one of out's) and lacks the outputs of its step:
// model.safetensors of that step, or summary.json.
func outputsMissing(out string, p *runPlan) bool {
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

// startEngine loads the checkpoint of a resumed run into e and prints the
// run's header: the devices, the engine's notes, the model and the batch.
func (p *runPlan) startEngine(e *engine.Engine, o *Options, devs *backend.Devices) error {
	cfg, stderr := p.cfg, o.Progress
	if devs.Backend != "cpu" {
		fmt.Fprintf(stderr, "devices: %s\n", devs.Describe)
	}
	if p.resume != nil {
		if err := e.LoadCheckpoint(p.resumeDir); err != nil {
			return fmt.Errorf("train: --resume: %w", err)
		}
		p.start = e.StepCount()
	}
	for _, n := range e.Notes() {
		fmt.Fprintf(stderr, "note: %s\n", n)
	}
	data := "synthetic corpus"
	if cfg.Strata.Data != "" {
		data = cfg.Strata.Data
	}
	sum := e.Summary()
	procs := ""
	if sum.Processes > 1 {
		procs = fmt.Sprintf(" in %d processes", sum.Processes)
	}
	fmt.Fprintf(stderr, "strata train: %s, %s params, ZeRO stage %d on %d %s device(s)%s, optimizer on the %s, overlap %s\n",
		sum.Model, units.FormatSize(sum.Params), sum.Stage, sum.Devices, cfg.Strata.Backend, procs, sum.Optimizer, sum.Overlap)
	fmt.Fprintf(stderr, "  global batch %d rows = %d devices × %d micro-batches × %d rows of %d tokens; data: %s; %d steps\n",
		cfg.TrainBatchSize, sum.Devices, sum.Accum, sum.Micro, sum.Seq, data, cfg.Strata.Steps)
	if p.resume != nil {
		fmt.Fprintf(stderr, "resumed from step %d (%s)\n", p.start, p.resumeDir)
	}
	if p.initName != "" {
		fmt.Fprintf(stderr, "initial weights: %s\n", p.initName)
	}
	if a := p.adapter; a != nil {
		fmt.Fprintf(stderr, "initial adapter: %s (r %d, alpha %g, target_modules %s; base_model_name_or_path %q)\n", a.Dir, a.LoRA.R, a.LoRA.Alpha, fmt.Sprint(a.LoRA.Targets), a.BaseModel)
	}
	return nil
}

// WriteOutputs writes the outputs of a run into dir: the trained weights (fp32 master weights, gathered
// from every rank's shards and tier, streamed one chunk at a time) as one
// safetensors file, then summary.json (with the last evaluation, when there
// was one), each atomically under dir: the weights first, so that a disk
// that fills loses the small summary, not them; a failure names what was
// written and what was not. sum is e's summary (the run's figures),
// elapsed the run's time, ev its last evaluation (nil for none), st its
// step time; the files written are said on stdout. Train calls it at the
// end of a run; a caller that drives an engine itself may too. ctx is
// looked at before each file.
func WriteOutputs(ctx context.Context, dir string, e *engine.Engine, sum report.Summary, elapsed time.Duration, ev *EvalLine, st StepTime, stdout io.Writer) error {
	if err := ctx.Err(); err != nil {
		return err
	}
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
	if err := ctx.Err(); err != nil {
		return err
	}
	js := NewSummary(sum, elapsed)
	if ev != nil {
		js.EvalLoss, js.EvalTokens = &ev.Loss, &ev.Tokens
	}
	if st.Measured > 0 {
		js.MeasuredStepSeconds = st.Measured // the median past the first two steps
	}
	if st.Predicted > 0 {
		js.PredictedStepSecs, js.PredictedBy = st.Predicted, "strata plan, profile "+st.Profile
		e := st.PredictionError()
		js.StepTimeError = &e
	}
	js.PredictionNote = st.Note
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

// StepTime is a run's median step and, when the profile of strata plan
// holds this machine's step of this model at this batch, the step it
// predicts for the run's placement; without one, why not.
type StepTime struct {
	Measured  float64 // the median step past the first two (the planner's warm-up), all when fewer
	From      int64   // the first step of the median
	Predicted float64 // 0: no prediction (Note says why)
	Profile   string  // the profile that predicted it
	// Note is why there is no prediction, naming where the run looked for
	// the profile and what measures one; "" when there is a prediction, or
	// when the run had fewer than 3 steps (no median past the warm-up).
	Note string
}

// PredictionError is the prediction's error as a fraction:
// Predicted/Measured − 1 (0 without a prediction).
func (st StepTime) PredictionError() float64 {
	if st.Predicted <= 0 || st.Measured <= 0 {
		return 0
	}
	return st.Predicted/st.Measured - 1
}

// stepTime is l's: what strata plan's profile (l.o.ProfilePath, else
// $STRATA_PROFILE, else the default) predicts for the run's placement
// beside the median it measured. No profile there, one of another machine
// or without this model's step is no prediction, and a note that says so
// (a run does not measure the machine: strata plan does).
func (l *trainLoop) stepTime() StepTime {
	var st StepTime
	secs, from := l.secs, l.first.Step
	warm := len(secs) > 2
	if warm {
		secs, from = secs[2:], from+2
	}
	if len(secs) == 0 {
		return st
	}
	s := append([]float64(nil), secs...)
	slices.Sort(s)
	st.Measured, st.From = s[len(s)/2], from
	if len(s)%2 == 0 {
		st.Measured = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	secsPredicted, path, note := l.predict()
	if note == "" {
		st.Predicted, st.Profile = secsPredicted, path
	} else if warm {
		st.Note = note
	}
	return st
}

// predict is the step strata plan's profile predicts for l's run and the
// profile's path, or a note of one line saying why there is none.
func (l *trainLoop) predict() (seconds float64, path, note string) {
	path, from, err := plan.ProfilePath(l.o.ProfilePath)
	if err != nil {
		return 0, "", strings.TrimPrefix(err.Error(), "plan: ")
	}
	name := l.cfg.Strata.Model.Name
	p, err := plan.Load(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		switch from {
		case "--profile":
			return 0, path, fmt.Sprintf("no profile at %s (--profile; strata plan --model %s --profile %s writes one)", path, name, path)
		case plan.ProfileEnv:
			return 0, path, fmt.Sprintf("no profile at %s (%s; strata plan --model %s writes one there)", path, plan.ProfileEnv, name)
		}
		return 0, path, fmt.Sprintf("no profile at %s (%s; --profile FILE or %s name another; strata plan --model %s writes one)", path, from, plan.ProfileEnv, name)
	case err != nil: // Load names the file
		return 0, path, strings.TrimPrefix(err.Error(), "plan: ")
	}
	if err := p.Check(l.machine); err != nil {
		// Check's fix is strata plan's flag: name the command.
		rows := l.cfg.Strata.Devices * l.cfg.TrainMicroBatchSizePerGPU
		in := plan.Inputs{Model: name, Devices: l.cfg.Strata.Devices, Batch: l.cfg.TrainMicroBatchSizePerGPU, Seq: l.e.TokensPerStep() / max(rows, 1)}
		probe := fmt.Sprintf("(%s --probe)", l.planCommand(in, path, from))
		msg := strings.Replace(strings.TrimPrefix(err.Error(), "plan: "), "(--probe)", probe, 1)
		if errors.Is(err, plan.ErrOtherMachine) { // "the profile was measured on another machine (...)"
			return 0, path, fmt.Sprintf("the profile %s %s", path, strings.TrimPrefix(msg, "the profile "))
		}
		return 0, path, fmt.Sprintf("the profile %s: %s", path, msg)
	}
	secs, err := plan.PredictRun(p, l.cfg, l.e.Layout().Shape, l.e.TokensPerStep(), l.hbmBytes)
	if me := (*plan.MeasurementError)(nil); errors.As(err, &me) {
		return 0, path, fmt.Sprintf("the profile %s %s (%s measures it)", path, me.Lacks, l.planCommand(me.Inputs, path, from))
	}
	if err != nil {
		return 0, path, strings.TrimPrefix(err.Error(), "plan: ")
	}
	return secs, path, ""
}

// planCommand is the strata plan command that measures what the profile
// at path (found by from) lacks for in.
func (l *trainLoop) planCommand(in plan.Inputs, path, from string) string {
	c := "strata plan --model " + in.Model
	if in.Devices > 1 {
		c += fmt.Sprintf(" --devices %d", in.Devices)
	}
	c += fmt.Sprintf(" --batch %d --seq %d", in.Batch, in.Seq)
	if in.Accum > 1 {
		c += fmt.Sprintf(" --accum %d", in.Accum)
	}
	c += in.Job.Flags()
	if in.NVMePath != "" {
		c += " --nvme-path " + in.NVMePath
	}
	if b := l.cfg.Strata.Backend; b != "" && b != "cpu" {
		c += " --backend " + b
	}
	if from != "the default" {
		c += " --profile " + path // a variable set here may not be set there
	}
	return c
}
