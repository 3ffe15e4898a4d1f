package run

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/engine"
	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/monitor"
	"github.com/strata-ai/strata/plan"
	"github.com/strata-ai/strata/shard"
)

// trainLoop runs the steps of a run: one line of steps.jsonl per step, the
// progress bar or a line per steps_per_print steps, the checkpoints of
// --save-every, and a stop after the step in progress on a signal (with a
// checkpoint of it under --out).
type trainLoop struct {
	o      *Options
	ctx    context.Context
	onStep func(Step) error
	e      *engine.Engine
	cfg    *config.Config
	start  int64 // the step the run resumes after
	steps  int   // the last step: cfg's, or the one a stop ended the run after
	stderr io.Writer
	jsonl  io.Writer                // steps.jsonl; nil without Out
	mon    *monitors                // DeepSpeed's monitors (process 0); nil when none is on
	bar    *progressbar.ProgressBar // nil without a progress bar
	runID  string                   // the run's id (Out), in every checkpoint it saves
	data   *Data                    // the held-out data and how often it is evaluated
	// dataIDs identify the training data, in every checkpoint it saves.
	dataIDs []checkpoint.DataFile

	firstEval, lastEval *EvalLine // the run's first and last evaluations
	// prefetch and links sum the steps' tier figures (with a tier store):
	// the progress line's hit rate and NVMe bytes over the run so far.
	prefetch report.PrefetchCounts
	links    [shard.LinkCount]int64

	t0          time.Time
	first, last report.StepStats
	secs        []float64    // every step's time, for the median beside strata plan's prediction
	machine     plan.Machine // this machine, to find its profile
	hbmBytes    int64        // a device's memory, for the prediction
	moved       int64        // bytes, all links, since the run started
	stopped     error        // the cause of the stop after a step
	stoppedAt   string       // its checkpoint
	saved       string       // the newest checkpoint the run saved
	fails       saveFails    // the saves and steps.jsonl lines the disk refused
}

// run trains from l.start to l.steps; a stop is no error.
func (l *trainLoop) run() error {
	if l.o.ProgressBar {
		l.bar = progressbar.NewOptions(l.steps, progressbar.OptionSetWriter(l.stderr), progressbar.OptionShowCount(),
			progressbar.OptionSetWidth(24), progressbar.OptionSetDescription("train"),
			progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionSetRenderBlankState(true))
		if l.start > 0 {
			l.bar.Set(int(l.start))
		}
	}
	l.t0 = time.Now()
	// The run's context is looked at in l.step, at the end of each step,
	// where a cancel saves the step (Train's protocol); the engine's own
	// check, before a step, would stop it without a checkpoint.
	err := l.e.Run(context.Background(), l.steps-int(l.start), l.step)
	if l.bar != nil {
		l.bar.Finish()
		fmt.Fprintln(l.stderr)
	}
	if errors.Is(err, errStopped) {
		// Stopped after a whole step: the summary and weights
		// that follow are those of that step, and the run can go on.
		err = nil
		l.steps = int(l.last.Step)
	}
	return err
}

// step is Engine.Run's callback: it records and shows st, saves a
// checkpoint when one is due, and stops the run when a signal asked to.
func (l *trainLoop) step(st report.StepStats) error {
	if l.first.Step == 0 {
		l.first = st
	}
	l.last = st
	l.secs = append(l.secs, st.Duration.Seconds())
	m := st.Moved
	l.moved += m.HostToDevice + m.DeviceToHost + m.DeviceToDevice + m.Collective
	var ev *EvalLine
	if l.data.evalDue(st.Step, l.steps) {
		if l.bar != nil {
			l.bar.Clear()
		}
		var err error
		if ev, err = evalHeldOut(l.e, l.data, st.Step, l.stderr); err != nil {
			return err
		}
		if l.firstEval == nil {
			l.firstEval = ev
		}
		l.lastEval = ev
	}
	if err := l.writeLine(st, ev); err != nil {
		return err
	}
	if err := l.mon.write(l, st, ev); err != nil {
		return err
	}
	l.show(st)
	if err := l.o.hook("step"); err != nil {
		return err
	}
	sig := l.boundary(st.Step)
	if l.o.Job != nil {
		// Every process stops after the same step, whichever was asked to.
		var err error
		if sig, err = l.o.Job.AnyStop(sig); err != nil {
			return err
		}
		if sig != nil && st.Step < int64(l.steps) && l.o.Out != "" {
			if l.bar != nil {
				l.bar.Clear()
			}
			fmt.Fprintf(l.stderr, "strata: the job stops after step %d: saving its checkpoint\n", st.Step)
		}
	}
	if sig != nil && st.Step == int64(l.steps) {
		sig = nil // the last step: the run ends as usual
	}
	saved := ""
	every, last := l.o.SaveEvery, st.Step == int64(l.steps)
	// Every run with --out ends with a checkpoint (with --save-every N or
	// without): what export, eval, generate and --resume read.
	if (every > 0 && st.Step%int64(every) == 0) || (l.o.Out != "" && (last || sig != nil)) {
		// After the step's JSONL line, so that a resumed run finds it.
		path, err := l.save(st)
		if err != nil && l.o.leader() {
			// A save the disk refused (full, read-only): the run goes on
			// and the next save retries; that of the last step (or of a
			// stop) fails the run once its outputs are written (savefail.go).
			path, err = l.saveFailed(st, err, sig != nil || st.Step == int64(l.steps))
		}
		if l.o.Job != nil {
			path, err = l.o.Job.Follow(path, err) // process 0's verdict
		}
		if err != nil {
			return err
		}
		saved = path
		if path != "" {
			l.saved = path
		}
	}
	if l.onStep != nil {
		if err := l.onStep(Step{StepStats: st, Eval: ev, Checkpoint: saved}); err != nil {
			return err
		}
	}
	if sig != nil {
		l.stopped, l.stoppedAt = sig, saved
		return errStopped
	}
	return nil
}

// boundary records the end of step (Status) and says whether the run's
// context asks to stop (its cause; nil when not), at one instant under
// Options.Boundary.
func (l *trainLoop) boundary(step int64) error {
	if b := l.o.Boundary; b != nil {
		b.Lock()
		defer b.Unlock()
	}
	if s := l.o.Status; s != nil {
		s.checked.Store(step)
	}
	if l.ctx.Err() == nil {
		return nil
	}
	return context.Cause(l.ctx)
}

// writeLine appends st (and the evaluation after it, if any) to
// steps.jsonl (with --out).
func (l *trainLoop) writeLine(st report.StepStats, ev *EvalLine) error {
	if l.jsonl == nil {
		return nil
	}
	m := st.Moved
	line := StepLine{Step: st.Step, Loss: Number(st.Loss), LR: st.LR, GradNorm: Number(st.GradNorm), ClipCoef: st.ClipCoef, RouterLoss: st.RouterLoss, Skipped: st.Skipped,
		StepSeconds: st.Duration.Seconds(), TokensPerSecond: st.TokensPer,
		HostToDevice: m.HostToDevice, DeviceToHost: m.DeviceToHost, DeviceToDevice: m.DeviceToDevice, CollectiveBytes: m.Collective,
		ElapsedSeconds: time.Since(l.t0).Seconds(), TokensThisStep: st.Tokens, GlobalBatchLines: l.cfg.TrainBatchSize,
		OptimizerSeconds: st.OptimizerTime.Seconds(), Goroutines: runtime.NumGoroutine(), EvalLine: ev, TierLine: newTierLine(st.Tier), HostOptLine: newHostOptLine(l.e, st.HostOpt)}
	if l.e.Precision() == gpu.F16 {
		line.LossScale = st.LossScale
	}
	b, err := json.Marshal(line)
	if err != nil {
		return fmt.Errorf("train: steps.jsonl line of step %d: %w", st.Step, err)
	}
	return l.appendLine(st.Step, append(b, '\n'))
}

// show moves the progress bar, or prints a line every steps_per_print
// steps and at the last.
func (l *trainLoop) show(st report.StepStats) {
	tiers := ""
	if t := st.Tier; t != nil {
		// Over the run so far, as the summary counts them at its end.
		l.prefetch.Add(t.PrefetchCounts, nil)
		for k, n := range t.LinkBytes {
			l.links[k] += n
		}
		tiers = fmt.Sprintf("  hits %.1f%%", 100*l.prefetch.HitRate)
		if t.BudgetBytes[shard.NVMe] > 0 {
			tiers += fmt.Sprintf("  nvme read %s written %s", units.FormatBytes(l.links[shard.NVMeToHost]), units.FormatBytes(l.links[shard.HostToNVMe]))
		}
	}
	if l.e.Precision() == gpu.F16 {
		// fp16: the scale the step ran with, and the steps skipped so far.
		scale := fmt.Sprintf("  scale %g", st.LossScale)
		if n := l.e.SkippedSteps(); n > 0 {
			scale += fmt.Sprintf(" (%d skipped)", n)
		}
		tiers = scale + tiers
	}
	rate, speed := fmt.Sprintf("%s tok/s", units.FormatSize(int64(st.TokensPer))), fmt.Sprintf("%.0f tok/s", st.TokensPer)
	if st.Skipped {
		// An fp16 overflow: the step updated nothing (not "0 tok/s").
		rate, speed = "skipped (fp16 overflow)", "skipped (fp16 overflow)"
	}
	if l.bar != nil {
		l.bar.Describe(fmt.Sprintf("loss %.4f  %s  moved %s%s", st.Loss, rate, units.FormatBytes(l.moved), tiers))
		l.bar.Add(1)
	} else if st.Step%int64(l.cfg.StepsPerPrint) == 0 || st.Step == int64(l.steps) {
		fmt.Fprintf(l.stderr, "step %d: loss %.4f lr %.3g grad norm %.3f, %s, moved %s%s\n",
			st.Step, st.Loss, st.LR, st.GradNorm, speed, units.FormatBytes(l.moved), tiers)
	}
}

// save writes a training checkpoint of the step just run under
// --out DIR/checkpoints/ and returns its directory.
func (l *trainLoop) save(st report.StepStats) (string, error) {
	ts := time.Now()
	l.setSaving(true)
	l.fails.saves++
	path, err := l.e.SaveCheckpoint(filepath.Join(l.o.Out, "checkpoints"), checkpoint.Options{Keep: l.o.Keep, RunID: l.runID, Source: l.o.Source, Data: l.dataIDs, ChatTemplate: l.data.ChatTemplate(), Hook: l.o.hook})
	l.setSaving(false)
	if err != nil {
		return "", fmt.Errorf("train: save checkpoint: %w", err)
	}
	if l.bar != nil {
		l.bar.Clear()
	}
	fmt.Fprintf(l.stderr, "saved checkpoint of step %d to %s in %s\n", st.Step, path, time.Since(ts).Round(time.Millisecond))
	return path, nil
}

func (l *trainLoop) setSaving(b bool) {
	if s := l.o.Status; s != nil {
		s.saving.Store(b)
	}
}

// outputsOnly writes the outputs of the resumed run's last step (a run
// killed after its last checkpoint, before them): model.safetensors and
// summary.json, from the loaded checkpoint; in a job, process 0 writes and
// the others send their shards.
func (l *trainLoop) outputsOnly() (*Result, error) {
	res := &Result{Start: l.start, Last: l.start, Summary: l.e.Summary()}
	if !l.o.leader() {
		if err := l.e.MasterChunks(func(int, []float32) error { return nil }); err != nil {
			return nil, fmt.Errorf("train: --out: %w", err)
		}
		return res, nil
	}
	if err := WriteOutputs(context.WithoutCancel(l.ctx), l.o.Out, l.e, res.Summary, 0, nil, StepTime{}, l.o.Report); err != nil {
		return nil, err
	}
	fmt.Fprintf(l.o.Report, "the run ended at step %d; its outputs are written\n", l.start)
	return res, nil
}

// report prints the run's summary, writes summary.json and the trained
// weights under Out, and for a stopped run returns the error that says
// how to go on.
func (l *trainLoop) report() (*Result, error) {
	stdout := l.o.Report
	elapsed := time.Since(l.t0)
	sum := l.e.Summary()
	if sum.Tier != nil && l.last.Tier != nil {
		// The steps' accesses, as the progress line counts them: not the
		// checkpoint saves' (every --out run ends with one).
		sum.Tier.PrefetchCounts = l.prefetch
	}
	ran := l.steps - int(l.start)
	from := ""
	if l.start > 0 {
		from = fmt.Sprintf(" (steps %d-%d, resumed)", l.start+1, l.steps)
	}
	if l.e.Precision() == gpu.F16 {
		if n := l.e.SkippedSteps(); n > 0 {
			from += fmt.Sprintf(" (%d skipped for fp16 overflow, the weights unchanged)", n)
		}
	}
	fmt.Fprintf(stdout, "trained %d steps%s in %s: loss %.4f -> %.4f, %.0f tokens/s, %s moved\n",
		ran, from, elapsed.Round(time.Millisecond), l.first.Loss, l.last.Loss,
		float64(ran*l.e.TokensPerStep())/elapsed.Seconds(), units.FormatBytes(l.moved))
	switch {
	case l.firstEval == nil:
	case l.firstEval == l.lastEval:
		fmt.Fprintf(stdout, "eval loss %.4f over %d tokens of --eval-data (one evaluation)\n", l.lastEval.Loss, l.lastEval.Tokens)
	default:
		fmt.Fprintf(stdout, "eval loss %.4f -> %.4f over %d tokens of --eval-data\n", l.firstEval.Loss, l.lastEval.Loss, l.lastEval.Tokens)
	}
	fmt.Fprint(stdout, FormatSummary(sum))
	st := l.stepTime()
	switch {
	case st.Predicted > 0:
		fmt.Fprintf(stdout, "step time: median %.3f s over steps %d-%d; strata plan predicted %.3f s (%+.0f%%, profile %s)\n",
			st.Measured, st.From, l.last.Step, st.Predicted, 100*st.PredictionError(), st.Profile)
	case st.Note != "":
		fmt.Fprintf(stdout, "step time: median %.3f s over steps %d-%d; no prediction: %s\n", st.Measured, st.From, l.last.Step, st.Note)
	}
	l.fails.report(stdout)
	l.mon.report(stdout)
	res := &Result{Start: l.start, Last: l.last.Step, Summary: sum, Elapsed: elapsed.Seconds(), FirstEval: l.firstEval, LastEval: l.lastEval,
		StepTime: st, Checkpoint: l.saved}
	if !l.o.leader() {
		if l.o.Out != "" { // process 0 writes the weights: send this process's shards
			if err := l.e.MasterChunks(func(int, []float32) error { return nil }); err != nil {
				return nil, fmt.Errorf("train: --out: %w", err)
			}
		}
		return res, nil
	}
	if dir := l.o.Out; dir != "" {
		if err := l.o.hook("outputs"); err != nil {
			return nil, err
		}
		if err := WriteOutputs(context.WithoutCancel(l.ctx), dir, l.e, sum, elapsed, l.lastEval, st, stdout); err != nil {
			if serr := l.lastSaveError(); serr != nil {
				// The disk refused the last checkpoint too: say which survives.
				return nil, &FinalSaveError{Msg: fmt.Sprintf("%v; and %s", err, strings.TrimPrefix(serr.Error(), "train: "))}
			}
			return nil, err
		}
	}
	if err := l.lastSaveError(); err != nil {
		return res, err
	}
	if l.stopped == nil {
		if err := l.e.FP16NoUpdate(); err != nil {
			return res, fmt.Errorf("train: %w", err)
		}
		return res, nil
	}
	return res, l.stoppedError()
}

// stoppedError is the error of a run stopped after a step.
func (l *trainLoop) stoppedError() *StoppedError {
	total := l.cfg.Strata.Steps
	e := &StoppedError{Started: true, Step: l.last.Step, Total: total, Checkpoint: l.stoppedAt, Cause: l.stopped}
	if l.stoppedAt != "" {
		e.GoOn = l.o.goOn(l.o.Args, l.o.Out, total)
	}
	return e
}

// monitors are a run's DeepSpeed monitors (config "tensorboard",
// "csv_monitor"), written by process 0 after each step's steps.jsonl line.
// A step the disk refuses is left out of that writer (cut back off, no
// torn row or record), warned about once per run of failures and counted,
// as steps.jsonl's lines (savefail.go): the run goes on. A nil *monitors
// writes nothing.
type monitors struct {
	ws []monitorWriter
}

type monitorWriter struct {
	name   string // the config's key
	w      monitor.Writer
	failed int  // steps not written
	inRow  bool // the last step was not written either
}

// openMonitors opens the monitors cfg enables (nil when none), in the
// directories their output_path and job_name name (a relative output_path
// inside out, the run's --out). resumeX is the x of the step a resumed run
// goes on after (0 for a new run): the CSV files drop their later rows.
func openMonitors(cfg *config.Config, out string, resumeX int64, stderr io.Writer) (*monitors, error) {
	m := &monitors{}
	open := func(name string, c *config.Monitor, o func(dir string) (monitor.Writer, error)) error {
		if c == nil {
			return nil
		}
		w, err := o(c.Dir(out))
		if err != nil {
			return fmt.Errorf("train: %w (the directory is the config's %s.output_path/job_name; a relative output_path is inside --out)", err, name)
		}
		m.ws = append(m.ws, monitorWriter{name: name, w: w})
		return nil
	}
	err := open("tensorboard", cfg.TensorBoard, func(dir string) (monitor.Writer, error) { return monitor.OpenTensorBoard(dir) })
	if err == nil {
		err = open("csv_monitor", cfg.CSVMonitor, func(dir string) (monitor.Writer, error) { return monitor.OpenCSV(dir, resumeX) })
	}
	if err != nil {
		m.close(stderr)
		return nil, err
	}
	if len(m.ws) == 0 {
		return nil, nil
	}
	return m, nil
}

// stepEvents are st's scalars for the monitors, at x = the samples trained
// (DeepSpeed's global_samples): DeepSpeed's tags, then Strata's, named
// after steps.jsonl's keys (README's "Monitors").
func (l *trainLoop) stepEvents(st report.StepStats, ev *EvalLine) []monitor.Event {
	x := st.Step * int64(l.cfg.TrainBatchSize)
	var es []monitor.Event
	add := func(tag string, v float64) { es = append(es, monitor.Event{Tag: tag, Value: v, X: x}) }
	add(monitor.TrainLoss, st.Loss)
	add(monitor.LR, st.LR)
	if l.e.Precision() == gpu.F16 {
		add(monitor.LossScale, st.LossScale)
	}
	if ev != nil {
		add(monitor.EvalLoss, ev.Loss)
	}
	add("Strata/grad_norm", st.GradNorm)
	add("Strata/step_s", st.Duration.Seconds())
	add("Strata/tokens_per_s", st.TokensPer)
	add("Strata/optimizer_s", st.OptimizerTime.Seconds())
	if l.e.HostOptimizer() {
		add("Strata/adam_exposed_s", st.HostOpt.AdamExposed.Seconds())
		add("Strata/opt_io_exposed_s", st.HostOpt.IOExposed.Seconds())
	}
	add("Strata/bytes_host_to_device", float64(st.Moved.HostToDevice))
	add("Strata/bytes_device_to_host", float64(st.Moved.DeviceToHost))
	if t := st.Tier; t != nil && t.BudgetBytes[shard.NVMe] > 0 {
		add("Strata/bytes_nvme_to_host", float64(t.LinkBytes[shard.NVMeToHost]))
		add("Strata/bytes_host_to_nvme", float64(t.LinkBytes[shard.HostToNVMe]))
	}
	return es
}

// write hands st's events to every monitor; a step the disk refuses is
// warned about (the first of a run of failures) and counted.
func (m *monitors) write(l *trainLoop, st report.StepStats, ev *EvalLine) error {
	if m == nil {
		return nil
	}
	events := l.stepEvents(st, ev)
	for i := range m.ws {
		mw := &m.ws[i]
		err := mw.w.WriteEvents(events)
		if err == nil {
			mw.inRow = false
			continue
		}
		if !diskError(err) {
			return fmt.Errorf("train: %w", err)
		}
		mw.failed++
		if !mw.inRow {
			if l.bar != nil {
				l.bar.Clear()
			}
			fmt.Fprintf(l.stderr, "warning: %s: the events of step %d were not written to %s: %s; training goes on (the steps the disk refuses are left out and counted)\n",
				mw.name, st.Step, mw.w.Path(), cause(err))
		}
		mw.inRow = true
	}
	return nil
}

// report says in the run's summary which steps' events the disk refused.
func (m *monitors) report(w io.Writer) {
	if m == nil {
		return
	}
	for _, mw := range m.ws {
		switch {
		case mw.failed == 1:
			fmt.Fprintf(w, "%s: the events of 1 step were not written to %s (the disk refused them)\n", mw.name, mw.w.Path())
		case mw.failed > 1:
			fmt.Fprintf(w, "%s: the events of %d steps were not written to %s (the disk refused them)\n", mw.name, mw.failed, mw.w.Path())
		}
	}
}

// close closes the monitors (every step is written already); a failure
// is a warning.
func (m *monitors) close(stderr io.Writer) {
	if m == nil {
		return
	}
	for _, mw := range m.ws {
		if err := mw.w.Close(); err != nil {
			fmt.Fprintf(stderr, "warning: %s: %v\n", mw.name, err)
		}
	}
}
