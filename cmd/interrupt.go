package cmd

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/strata-ai/strata/checkpoint"
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

// stopping says what the first signal during training does: the step it
// stops after (the one in progress, or the next when this step's end has
// looked already), and where the checkpoint goes. It runs under in.mu.
func (l *trainLoop) stopping(s os.Signal) string {
	step := min(l.checked+1, int64(l.cfg.Strata.Steps))
	if l.job != nil {
		// A job's processes stop after the first step whose end any of
		// them saw a signal at (anyOf): it may be this one or the one
		// before, so the step is said once they agree (step).
		if l.flags.out == "" {
			return fmt.Sprintf("stopping after the step every process of the job agrees on (step %d at the latest); nothing is saved (no --out)", step)
		}
		msg := fmt.Sprintf("stopping after the step every process of the job agrees on (step %d at the latest), then saving a checkpoint to %s", step, filepath.Join(l.flags.out, "checkpoints"))
		if s != syscall.SIGUSR1 {
			// mpirun turns Ctrl-C into SIGTERM to every process and SIGKILL
			// one second later (odls_base_sigkill_timeout).
			msg += fmt.Sprintf("; under mpirun, SIGKILL follows a second later: a longer step or save does not survive it (%s); kill -USR1 <mpirun's pid> stops a job without that limit",
				l.survivesNow())
		}
		return msg
	}
	if l.flags.out == "" {
		return fmt.Sprintf("stopping after step %d; nothing is saved (no --out); %s stops at once", step, again(s))
	}
	return fmt.Sprintf("stopping after step %d, then saving a checkpoint to %s, summary.json and model.safetensors; %s aborts the save",
		step, filepath.Join(l.flags.out, "checkpoints"), again(s))
}

// survivesNow names the newest complete checkpoint of the run (under
// in.mu: it reads only the disk).
func (l *trainLoop) survivesNow() string {
	if m, dir, err := checkpoint.ReadManifest(filepath.Join(l.flags.out, "checkpoints")); err == nil {
		return fmt.Sprintf("the newest complete checkpoint is step %d, %s", m.Step, dir)
	}
	return "no complete checkpoint of this run exists yet"
}

// aborting says what a second signal aborts and what survives: the newest
// complete checkpoint ("latest"; a save cut short never replaces it).
func (l *trainLoop) aborting(os.Signal) string {
	what := "stopping at once"
	if l.saving.Load() {
		what = "the checkpoint being saved is aborted"
	}
	if l.flags.out == "" {
		return what + "; nothing was saved (no --out)"
	}
	ck := filepath.Join(l.flags.out, "checkpoints")
	if m, dir, err := checkpoint.ReadManifest(ck); err == nil {
		return fmt.Sprintf("%s; what survives is the complete checkpoint of step %d, %s (resume from it: %s)",
			what, m.Step, dir, l.job.launcher()+goOn(l.flags.args, l.flags.out, l.cfg.Strata.Steps))
	}
	return what + "; no complete checkpoint of this run survives in " + ck
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
