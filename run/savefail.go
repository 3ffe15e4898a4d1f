package run

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/engine/report"
)

// A save the disk refuses (ENOSPC, EDQUOT, a read-only filesystem, an I/O
// error: any error of a file operation) does not end the run: the training
// state is whole, only its copy on disk is missing. The periodic save
// prints one warning line naming the cause and the run goes on; the next
// save retries ("latest" stays at the newest complete checkpoint: a save
// cut short never replaces it); the summary says how many saves failed.
// The save of the last step, or of a stop on a signal, failing is an
// error once the run's outputs are written (summary.json and the weights,
// which hold no optimizer state): the user must know that the last state
// is not saved. A steps.jsonl line the disk refuses is cut back off (no
// torn line), warned about once per run of failures and counted. An error
// that is not the disk's (a device's, while the engine gathers the state)
// still ends the run.

// saveFails counts what the disk refused during a run.
type saveFails struct {
	saves  int   // checkpoint saves tried
	failed int   // of them, refused by the disk
	last   error // the save of the last step (or of a stop) refused
	lastAt int64 // its step
	lines  int   // steps.jsonl lines not written
	inRow  bool  // the last line was not written either
}

// diskError says whether err is the disk's: a file operation's error.
func diskError(err error) bool {
	var pe *fs.PathError
	var le *os.LinkError
	var se *os.SyscallError
	return errors.As(err, &pe) || errors.As(err, &le) || errors.As(err, &se) ||
		errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EROFS) || errors.Is(err, syscall.EDQUOT) || errors.Is(err, syscall.EIO)
}

// cause is the file operation err failed in ("write PATH: no space left on
// device"), else err.
func cause(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Error()
	}
	return err.Error()
}

// saveFailed handles the failed save of st: an error not the disk's ends
// the run (returned); a periodic save warns and the run goes on; a final
// one is kept for report (lastSaveError). A save that completed (latest
// names it) and failed after, in its pruning, returns its directory.
func (l *trainLoop) saveFailed(st report.StepStats, err error, final bool) (string, error) {
	if !diskError(err) {
		return "", err
	}
	ck := filepath.Join(l.o.Out, "checkpoints")
	if m, dir, merr := checkpoint.ReadManifest(ck); merr == nil && m.Step == st.Step && m.Run == l.runID {
		// Complete and latest: what failed came after (the pruning).
		if l.bar != nil {
			l.bar.Clear()
		}
		fmt.Fprintf(l.stderr, "warning: saved the checkpoint of step %d to %s, but cleaning up after it failed: %s\n", st.Step, dir, cause(err))
		return dir, nil
	}
	l.fails.failed++
	if final {
		l.fails.last, l.fails.lastAt = err, st.Step
		return "", nil
	}
	if l.bar != nil {
		l.bar.Clear()
	}
	next := ""
	if every := int64(l.o.SaveEvery); every > 0 {
		next = fmt.Sprintf(" (step %d)", min(st.Step+every, int64(l.steps)))
	}
	fmt.Fprintf(l.stderr, "warning: the checkpoint of step %d was not saved: %s; training goes on and the next save%s retries; %s\n",
		st.Step, cause(err), next, l.survives())
	return "", nil
}

// survives names the newest complete checkpoint of the run's directory.
func (l *trainLoop) survives() string {
	ck := filepath.Join(l.o.Out, "checkpoints")
	if m, dir, err := checkpoint.ReadManifest(ck); err == nil {
		return fmt.Sprintf("the newest complete checkpoint is step %d, %s", m.Step, dir)
	}
	return "no complete checkpoint of this run is in " + ck
}

// lastSaveError is the error of a run whose last save the disk refused
// (with the signal's status for a run stopped on one), nil otherwise.
func (l *trainLoop) lastSaveError() error {
	if l.fails.last == nil {
		return nil
	}
	msg := fmt.Sprintf("train: the checkpoint of the last step %d was not saved: %s; %s (the weights of step %d are in %s, without the optimizer state)",
		l.fails.lastAt, cause(l.fails.last), l.survives(), l.fails.lastAt, filepath.Join(l.o.Out, "model.safetensors"))
	fe := &FinalSaveError{Msg: msg} // the others ended the run with process 0's verdict (Job.Follow)
	if l.stopped != nil {
		fe.Stopped = l.stoppedError()
		fe.Stopped.Checkpoint, fe.Stopped.GoOn = "", l.o.goOn(l.o.Args, l.o.Out, l.cfg.Strata.Steps)
	}
	return fe
}

// appendLine appends one line of steps.jsonl; a line the disk refuses is
// cut back off, warned about (the first of a run of them) and counted.
func (l *trainLoop) appendLine(step int64, line []byte) error {
	f, isFile := l.jsonl.(*os.File)
	var off int64
	if isFile {
		var err error
		if off, err = f.Seek(0, io.SeekCurrent); err != nil {
			isFile = false
		}
	}
	_, err := l.jsonl.Write(line)
	if err == nil {
		l.fails.inRow = false
		return nil
	}
	if !diskError(err) {
		return fmt.Errorf("train: write steps.jsonl: %w", err)
	}
	if isFile { // no torn line for the next one to follow
		f.Truncate(off)
		f.Seek(off, io.SeekStart)
	}
	l.fails.lines++
	if !l.fails.inRow {
		if l.bar != nil {
			l.bar.Clear()
		}
		fmt.Fprintf(l.stderr, "warning: steps.jsonl: the line of step %d was not written: %s; training goes on (the lines the disk refuses are left out and counted)\n",
			step, cause(err))
	}
	l.fails.inRow = true
	return nil
}

// report says in the run's summary what the disk refused.
func (f *saveFails) report(w io.Writer) {
	if f.failed > 0 {
		fmt.Fprintf(w, "%d of %d checkpoint saves failed (see the warnings)\n", f.failed, f.saves)
	}
	if f.lines > 0 {
		fmt.Fprintf(w, "%d lines of steps.jsonl were not written (the disk refused them)\n", f.lines)
	}
}
