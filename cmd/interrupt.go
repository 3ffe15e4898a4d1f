package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/strata-ai/strata/checkpoint"
	trainrun "github.com/strata-ai/strata/run"
)

// interrupts turns the first SIGINT or SIGTERM of a long command into a
// request to stop at the next safe point (train: after the current step,
// with a checkpoint), and says at once what will happen; a second one says
// what survives and ends the process at once with the signal's status (130
// for SIGINT, 143 for SIGTERM, as an uncaught signal would).
type interrupts struct {
	sig    chan os.Signal
	done   chan struct{}
	stderr io.Writer
	// ctx is cancelled by the first signal: work before the first step
	// that takes long (tokenizing the data, data.Options.Context) stops.
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex // guards got and the explanations, and runs in's callbacks
	got    os.Signal
	first  func(os.Signal) string // what the first signal will do
	second func(os.Signal) string // what a second one aborts and what survives
	// atExit runs before a second signal ends the process: what must not
	// outlive it (train: the swap files, engine.RemoveSwapFiles).
	atExit func() string
}

// watchInterrupts starts watching with the explanations of the first
// phase (explain changes them); the command writes to in.stderr from then
// on (its messages and the command's own lines do not interleave).
func watchInterrupts(stderr io.Writer, first, second func(os.Signal) string, atExit func() string) *interrupts {
	in := &interrupts{sig: make(chan os.Signal, 2), done: make(chan struct{}), stderr: &syncWriter{w: stderr},
		first: first, second: second, atExit: atExit}
	in.ctx, in.cancel = context.WithCancel(context.Background())
	signal.Notify(in.sig, os.Interrupt, syscall.SIGTERM)
	go in.watch()
	return in
}

// also watches sigs too, as SIGINT and SIGTERM are watched.
func (in *interrupts) also(sigs ...os.Signal) { signal.Notify(in.sig, sigs...) }

func (in *interrupts) watch() {
	var s os.Signal
	select {
	case <-in.done:
		return
	case s = <-in.sig:
	}
	in.mu.Lock()
	in.got = s
	msg := in.first(s)
	in.mu.Unlock()
	in.cancel()
	fmt.Fprintf(in.stderr, "\nstrata: %v: %s\n", s, msg)
	select {
	case <-in.done:
	case s = <-in.sig:
		in.mu.Lock()
		msg := in.second(s)
		in.mu.Unlock()
		if in.atExit != nil {
			if done := in.atExit(); done != "" {
				msg += "; " + done
			}
		}
		fmt.Fprintf(in.stderr, "\nstrata: %v again: %s\n", s, msg)
		os.Exit(exitStatus(s))
	}
}

// explain sets what the first signal will do and what a second one
// aborts, and returns the signal already received (nil when none), both at
// one instant: a signal is explained by the text of the phase that acts
// on it.
func (in *interrupts) explain(first, second func(os.Signal) string) os.Signal {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.first, in.second = first, second
	return in.got
}

// requested returns the signal that asked to stop, or nil; fn (if any)
// runs at the same instant, under the lock the explanations run under.
func (in *interrupts) requested(fn ...func()) os.Signal {
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, f := range fn {
		f()
	}
	return in.got
}

// syncWriter serializes the writes of the command and of the signal
// watcher.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// stop restores the default handling.
func (in *interrupts) stop() {
	signal.Stop(in.sig)
	close(in.done)
	in.cancel()
}

// again names the way to send a second signal.
func again(s os.Signal) string {
	if s == syscall.SIGTERM {
		return "another SIGTERM"
	}
	return "Ctrl-C again"
}

// exitStatus is the shell's status of a process ended by s: 128 + its
// number (SIGINT 130, SIGTERM 143).
func exitStatus(s os.Signal) int {
	if n, ok := s.(syscall.Signal); ok {
		return 128 + int(n)
	}
	return 130
}

// interruptedError ends a command that stopped early on a signal, with
// the signal's status.
type interruptedError struct {
	msg    string
	status int
	// alone: this process stopped where the others of its job go on (at
	// start-up, before the first step's agreement to stop): the job ends
	// with MPI_Abort (job.ended).
	alone bool
}

func (e interruptedError) Error() string { return e.msg }
func (e interruptedError) ExitCode() int { return e.status }

// trainSignals says what a signal does to a run of `strata train`:
// before its first step, the first signal stops it with nothing written
// and a second ends the process; once it started (trainrun.Status), the first
// cancels the run's context, which stops it after the step in progress
// and saves it, and a second aborts the save. Its methods run under
// in.mu, the run's trainrun.Options.Boundary.
type trainSignals struct {
	status *trainrun.Status
	cancel context.CancelCauseFunc // the run's context, with the signal (signalStop)
	job    *job
	out    string
	args   []string
	steps  int // the run's, once its config is resolved
}

// first cancels the run's context and says what happens.
func (t *trainSignals) first(s os.Signal) string {
	// Before the run's context exists, the watcher's own cancel of
	// in.ctx, its parent, stops what runs.
	if sig, ok := s.(syscall.Signal); ok && t.cancel != nil {
		t.cancel(signalStop{sig})
	} else if t.cancel != nil {
		t.cancel(nil)
	}
	if !t.status.Started() {
		return "stopping before training starts; nothing is written"
	}
	return t.stopping(s)
}

// second says what a second signal aborts.
func (t *trainSignals) second(s os.Signal) string {
	if !t.status.Started() {
		return "stopping at once"
	}
	return t.aborting(s)
}

// stopping says what the first signal during training does: the step it
// stops after (the one in progress, or the next when this step's end has
// looked already), and where the checkpoint goes.
func (t *trainSignals) stopping(s os.Signal) string {
	step := min(t.status.Checked()+1, int64(t.steps))
	if t.job != nil {
		// A job's processes stop after the first step whose end any of
		// them saw a signal at (anyOf): it may be this one or the one
		// before, so the step is said once they agree (step).
		if t.out == "" {
			return fmt.Sprintf("stopping after the step every process of the job agrees on (step %d at the latest); nothing is saved (no --out)", step)
		}
		msg := fmt.Sprintf("stopping after the step every process of the job agrees on (step %d at the latest), then saving a checkpoint to %s", step, filepath.Join(t.out, "checkpoints"))
		if s != syscall.SIGUSR1 {
			// mpirun turns Ctrl-C into SIGTERM to every process and SIGKILL
			// one second later (odls_base_sigkill_timeout).
			msg += fmt.Sprintf("; under mpirun, SIGKILL follows a second later: a longer step or save does not survive it (%s); kill -USR1 <mpirun's pid> stops a job without that limit",
				t.survivesNow())
		}
		return msg
	}
	if t.out == "" {
		return fmt.Sprintf("stopping after step %d; nothing is saved (no --out); %s stops at once", step, again(s))
	}
	return fmt.Sprintf("stopping after step %d, then saving a checkpoint to %s, summary.json and model.safetensors; %s aborts the save",
		step, filepath.Join(t.out, "checkpoints"), again(s))
}

// survivesNow names the newest complete checkpoint of the run (it reads
// only the disk).
func (t *trainSignals) survivesNow() string {
	if m, dir, err := checkpoint.ReadManifest(filepath.Join(t.out, "checkpoints")); err == nil {
		return fmt.Sprintf("the newest complete checkpoint is step %d, %s", m.Step, dir)
	}
	return "no complete checkpoint of this run exists yet"
}

// aborting says what a second signal aborts and what survives: the newest
// complete checkpoint ("latest"; a save cut short never replaces it).
func (t *trainSignals) aborting(os.Signal) string {
	what := "stopping at once"
	if t.status.Saving() {
		what = "the checkpoint being saved is aborted"
	}
	if t.out == "" {
		return what + "; nothing was saved (no --out)"
	}
	ck := filepath.Join(t.out, "checkpoints")
	if m, dir, err := checkpoint.ReadManifest(ck); err == nil {
		return fmt.Sprintf("%s; what survives is the complete checkpoint of step %d, %s (resume from it: %s)",
			what, m.Step, dir, t.job.launcher()+goOn(t.args, t.out, t.steps))
	}
	return what + "; no complete checkpoint of this run survives in " + ck
}

// signalOf is the signal a run's stop was caused by (signalStop), SIGINT
// for another cause.
func signalOf(cause error) os.Signal {
	var s signalStop
	if errors.As(cause, &s) {
		return s.sig
	}
	return os.Interrupt
}

// stoppedError is the error of a run stopped on a signal (trainrun.StoppedError,
// trainrun.FinalSaveError), with the signal's status; nil for another error.
// alone: this process of a job stopped before the first step.
func stoppedError(err error, alone bool) error {
	var fe *trainrun.FinalSaveError
	if errors.As(err, &fe) {
		if fe.Stopped == nil {
			return jobError{msg: fe.Msg} // the others ended the run with process 0's verdict (job.follow)
		}
		s := signalOf(fe.Stopped.Cause)
		return interruptedError{msg: fmt.Sprintf("%s; %v: stopped after step %d of %d; go on with: %s", fe.Msg, s, fe.Stopped.Step,
			fe.Stopped.Total, fe.Stopped.GoOn), status: exitStatus(s)}
	}
	var se *trainrun.StoppedError
	if !errors.As(err, &se) {
		return nil
	}
	s := signalOf(se.Cause)
	switch {
	case !se.Started:
		return interruptedError{msg: fmt.Sprintf("train: %v: stopped before the first step; nothing was written", s), status: exitStatus(s), alone: alone}
	case se.Checkpoint == "":
		return interruptedError{msg: fmt.Sprintf("train: %v: stopped after step %d of %d; no --out, so nothing was saved to resume from", s, se.Step, se.Total), status: exitStatus(s)}
	}
	status := exitStatus(s)
	if s == syscall.SIGUSR1 {
		// A job's asked-for stop, saved: no failure (mpirun would print
		// its "job aborted" banner under a non-zero status).
		status = 0
	}
	return interruptedError{msg: fmt.Sprintf("train: %v: stopped after step %d of %d, checkpoint %s; go on with: %s",
		s, se.Step, se.Total, se.Checkpoint, se.GoOn), status: status}
}

// testHook, for tests, is called at named points of a run ("start-up",
// "step" at the end of each step, before it looks for a signal;
// "outputs" before the weights and summary.json of --out)
// and of its checkpoint saves (checkpoint.Options.Hook); nil otherwise.
var testHook func(point string) error

func testPoint(point string) error {
	if testHook == nil {
		return nil
	}
	return testHook(point)
}
