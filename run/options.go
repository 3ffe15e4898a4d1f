package run

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/engine"
	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu/backend"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/timeline"
)

// Options is a run: its config, its directory, where it starts from, what
// it trains on, and where its lines go. Config is required; every other
// field may be left zero.
type Options struct {
	// Config is the resolved config of the run (config.Load, config.Parse,
	// config.Default): the model, the ZeRO stage, the devices, the steps
	// (strata.steps, the total counted from step 1).
	Config *config.Config
	// Out is the run directory; "" writes nothing (no checkpoints either).
	Out string
	// SaveEvery also saves a checkpoint every SaveEvery steps (0: only the
	// last step, with Out); Keep is how many checkpoints of this run stay
	// (the newest; 0 means 2).
	SaveEvery, Keep int
	// Overwrite lets a new run take an Out that holds another run's files
	// (its config.json, steps.jsonl, summary.json and model.safetensors are
	// replaced; its checkpoints stay).
	Overwrite bool
	// Resume is the checkpoint the run continues; nil for a new run.
	Resume *Resume
	// Data is the training data and the held-out set (OpenData); nil
	// opens the config's strata.data with the default DataOptions (no
	// held-out set), or trains on the synthetic corpus without one.
	Data *Data
	// Init, when set, is the run's initial weights (an imported model),
	// described in the run's header as InitName; Adapter a LoRA adapter
	// the run continues training.
	Init     engine.ChunkSource
	InitName string
	Adapter  *hf.PEFTAdapter
	// Source is where the run's weights came from (Init, or the resumed
	// checkpoint's record of it), recorded in run.json and every
	// checkpoint: its tokenizer is Source.TokenizerPath().
	Source *hf.Source
	// Args are the flags the run was given, recorded in run.json; GoOn,
	// when set, is the command that continues a run from its recorded
	// args to total steps (total 0: its own), which messages name.
	Args []string
	GoOn func(args []string, out string, total int) string
	// Progress receives the run's progress: its header, notes, warnings,
	// a line per steps_per_print steps (or a progress bar, with
	// ProgressBar) and the evaluations; Report the run's report at its
	// end (its summary, the files written). Nil means io.Discard.
	Progress, Report io.Writer
	ProgressBar      bool
	// Trace, when set, records the run's timeline; Closing, when set, runs
	// on every way out once the engine exists, before it closes (the
	// command line writes the timeline there).
	Trace   *timeline.Tracer
	Closing func(e *engine.Engine) error
	// ProfilePath is the strata plan profile the run's median step is
	// compared with at its end (--profile); "" looks where strata plan
	// writes it: $STRATA_PROFILE, else the default (plan.ProfilePath).
	ProfilePath string
	// Job is the job of several processes this one is part of; nil alone.
	Job Job
	// Boundary, when set, is held while the run records the end of a step
	// in Status and looks at its context: a caller that cancels the
	// context holding it knows from Status which step the run stops after.
	Boundary sync.Locker
	// Status, when set, is kept up to date while the run goes on.
	Status *Status
	// Hook, for tests, is called at named points of the run ("start-up",
	// "step" at each step's end, "outputs" before the outputs are
	// written) and of its checkpoint saves (checkpoint.Options.Hook).
	Hook func(point string) error
}

// Resume is the checkpoint a run continues.
type Resume struct {
	Manifest *checkpoint.Manifest // checkpoint.ReadManifest's
	Dir      string               // its directory
	// ConfigDiff, when set, says how the run's config differs from the
	// checkpoint's (a config given for the resumed run): a note.
	ConfigDiff string
	// AllowDataChange lets the run go on although its training data
	// differs from what the checkpoint recorded (else it is refused).
	AllowDataChange bool
}

// Job is what a run needs from the job of several processes it is one of
// (the strata command's Open MPI job). Every method but Leader is a
// collective: every process calls it at the same point of the run.
type Job interface {
	// Leader reports whether this process writes the run directory, the
	// monitors and the outputs (process 0).
	Leader() bool
	// Procs is the engine's handle on the other processes; NodeProcs the
	// job's processes on this node.
	Procs() engine.Procs
	NodeProcs() int
	// Agree is called once the run directory is claimed, before the
	// devices open: an error ends the run in every process.
	Agree() error
	// OpenDevices opens this process's devices, joined with the others'.
	OpenDevices(name string, n int, hbmBytes int64, deterministic bool) (*backend.Devices, error)
	// AnyStop is, in every process, the cause of the lowest process that
	// was asked to stop after this step (mine: this one's, nil when not).
	AnyStop(mine error) (error, error)
	// Follow is process 0's verdict on a checkpoint save, in every
	// process: the checkpoint's directory, or the error that ends the run.
	Follow(path string, err error) (string, error)
	// Ended is called with the run's error (nil on success) on its way
	// out once the engine exists, before the engine closes (which waits
	// for the devices' collectives): it returns the error the run ends
	// with (a job ends the other processes on an error of this one alone).
	Ended(err error) error
	// Launcher is what starts the job again, before the command GoOn
	// names ("mpirun -np 2 ").
	Launcher() string
}

// Status is what a run is doing, for a caller (a signal handler) to read
// while Train runs.
type Status struct {
	checked atomic.Int64
	started atomic.Bool
	saving  atomic.Bool
}

// Started reports whether the run has started its steps: before, a
// cancelled context ends it with nothing written.
func (s *Status) Started() bool { return s != nil && s.started.Load() }

// Checked is the last step whose end looked at the context (the step a
// resumed run starts after, before the first): a cancel now stops the run
// after step Checked()+1.
func (s *Status) Checked() int64 {
	if s == nil {
		return 0
	}
	return s.checked.Load()
}

// Saving reports whether a checkpoint is being written.
func (s *Status) Saving() bool { return s != nil && s.saving.Load() }

// Step is a step of a run, as Train hands it to its callback.
type Step struct {
	report.StepStats
	// Eval is the held-out evaluation after the step; nil when none was due.
	Eval *EvalLine
	// Checkpoint is the checkpoint saved after the step; "" when none.
	Checkpoint string
}

// Result is a run that ended: the steps it ran and its outputs.
type Result struct {
	Start int64 // the step the run resumed after (0 for a new run)
	Last  int64 // the last step run (Start when it trained nothing)
	// Summary is the engine's summary of the run; Elapsed its time.
	Summary report.Summary
	Elapsed float64 // seconds
	// FirstEval and LastEval are the run's first and last evaluations;
	// nil without held-out data.
	FirstEval, LastEval *EvalLine
	// StepTime is the median step and strata plan's prediction of it.
	StepTime StepTime
	// Checkpoint is the run's last checkpoint; "" when none was saved.
	Checkpoint string
}

// StoppedError is the error of a run whose context was cancelled: after
// a step (Started; its checkpoint Checkpoint, "" without Out) or before
// the first (nothing written). It matches context.Canceled and, with
// errors.Is and errors.As, the context's cause.
type StoppedError struct {
	Started    bool
	Step       int64 // the last step run
	Total      int   // the run's steps
	Checkpoint string
	Cause      error // context.Cause of the run's context
	// GoOn is the command that continues the run (Options.GoOn); "" when
	// nothing was saved.
	GoOn string
}

func (e *StoppedError) Error() string {
	switch {
	case !e.Started:
		return "train: stopped before the first step; nothing was written"
	case e.Checkpoint == "":
		return fmt.Sprintf("train: stopped after step %d of %d; no --out, so nothing was saved to resume from", e.Step, e.Total)
	}
	return fmt.Sprintf("train: stopped after step %d of %d, checkpoint %s; go on with: %s", e.Step, e.Total, e.Checkpoint, e.GoOn)
}

// Unwrap is context.Canceled and the context's cause.
func (e *StoppedError) Unwrap() []error { return []error{context.Canceled, e.Cause} }

// InputError is a run refused for its input: a directory that belongs to
// another run, a resume with nothing to train, changed data. A command
// line reports it as bad usage.
type InputError struct{ msg string }

func (e *InputError) Error() string { return e.msg }

func inputf(format string, args ...any) error { return &InputError{fmt.Sprintf(format, args...)} }

// FinalSaveError is the error of a run whose last save the disk refused,
// once its outputs are written (the weights in model.safetensors, without
// the optimizer state): Msg says which checkpoint survives. Stopped is set
// when the run was stopped (its context cancelled) after that step.
type FinalSaveError struct {
	Msg     string
	Stopped *StoppedError
}

func (e *FinalSaveError) Error() string {
	if e.Stopped == nil {
		return e.Msg
	}
	return fmt.Sprintf("%s; stopped after step %d of %d; go on with: %s", e.Msg, e.Stopped.Step, e.Stopped.Total, e.Stopped.GoOn)
}

// Unwrap is the stop, when there was one.
func (e *FinalSaveError) Unwrap() error {
	if e.Stopped == nil {
		return nil
	}
	return e.Stopped
}

// errStopped ends Engine.Run after a step when the context asked to stop.
var errStopped = errors.New("stopped")

// defaults fills the zero fields that have a default and checks the
// others.
func (o *Options) defaults() error {
	if o.Config == nil {
		return errors.New("train: Options.Config is nil: pass a resolved config (config.Load, config.Default)")
	}
	if o.Keep == 0 {
		o.Keep = 2
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Report == nil {
		o.Report = io.Discard
	}
	switch {
	case o.SaveEvery < 0:
		return inputf("train: --save-every %d: need a positive number of steps", o.SaveEvery)
	case o.SaveEvery > 0 && o.Out == "":
		return inputf("train: --save-every needs --out DIR (checkpoints go to DIR/checkpoints/)")
	case o.Keep < 1:
		return inputf("train: --keep %d: need at least 1", o.Keep)
	case o.Overwrite && o.Out == "":
		return inputf("train: --overwrite needs --out DIR (it lets this run take a directory that holds another run's files)")
	}
	return nil
}

// leader reports whether this process writes the run.
func (o *Options) leader() bool { return o.Job == nil || o.Job.Leader() }

// goOn is the command that continues the run of args in out to total.
func (o *Options) goOn(args []string, out string, total int) string {
	if o.GoOn == nil {
		return ""
	}
	launcher := ""
	if o.Job != nil {
		launcher = o.Job.Launcher()
	}
	return launcher + o.GoOn(args, out, total)
}

func (o *Options) hook(point string) error {
	if o.Hook == nil {
		return nil
	}
	return o.Hook(point)
}
