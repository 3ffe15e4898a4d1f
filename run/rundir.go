package run

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
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
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/internal/durable"
	"github.com/strata-ai/strata/internal/flock"
	"github.com/strata-ai/strata/safetensors"
)

// A run directory (--out) belongs to one run:
//
//	DIR/strata.lock   flock(2)ed while a run writes into DIR (internal/flock
//	                  names the holder from /proc/locks)
//	DIR/run.json      the run's id (every checkpoint it saves carries it),
//	                  the source of its weights and the flags it was given
//
// A new run claims an empty directory (or, with --overwrite, one that
// holds another run's files); a resumed run claims the directory of the
// run it continues (a checkpoint with the directory's run id).
const (
	// LockFileName is the run directory's lock file.
	LockFileName = "strata.lock"
	runFileName  = "run.json"
)

// runDir is a claimed --out directory.
type runDir struct {
	path string
	id   string   // this run's id, in run.json and every checkpoint's manifest
	lock *os.File // flock(LOCK_EX) held until close
	// continues is true when the run resumes the run that owns the
	// directory (its checkpoints are this run's history).
	continues bool
	replaced  string                                            // with --overwrite: what the earlier run left (a note)
	args      []string                                          // the run's flags, recorded in run.json
	goOn      func(args []string, out string, total int) string // Options.GoOn
}

// RunFile is run.json.
type RunFile struct {
	Run     string    `json:"run"`
	Started time.Time `json:"started"`
	PID     int       `json:"pid"`
	// Source is where the run's weights came from (--init, or the
	// resumed checkpoint's record of it): the tokenizer.json of a Hugging
	// Face model is Source.TokenizerPath().
	Source *hf.Source `json:"source,omitempty"`
	// Args are the flags the run was started with (givenFlags), as
	// `strata train` takes them: the command that goes on with the run
	// (goOn) repeats them.
	Args []string `json:"args,omitempty"`
}

// claimOut locks the run directory out (created if missing) and decides
// whether this run may write into it: an empty directory, the directory of
// the run that resume (nil for a new run) continues, or, with overwrite,
// any directory. Another run holding the lock is named by its pid.
func claimOut(out string, resume *checkpoint.Manifest, resumeDir string, overwrite bool, goOn func([]string, string, int) string) (*runDir, error) {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, fmt.Errorf("train: --out: %w", err)
	}
	lockPath := filepath.Join(out, LockFileName)
	f, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("train: --out: %w", err)
	}
	if err := flock.TryLock(int(f.Fd())); err != nil {
		holder := strings.TrimPrefix(flock.Holder(int(f.Fd())), "held by ")
		f.Close()
		if errors.Is(err, flock.ErrHeld) {
			return nil, fmt.Errorf("train: --out %s is in use by another run (%s holds %s): wait for it to end, or choose another --out",
				out, holder, lockPath)
		}
		return nil, fmt.Errorf("train: --out: lock %s: %w", lockPath, err)
	}
	rd := &runDir{path: out, lock: f, goOn: goOn}
	if err := rd.decide(resume, resumeDir, overwrite); err != nil {
		rd.close()
		return nil, err
	}
	return rd, nil
}

// decide sets the run's id: the directory's for the run it continues, a
// new one for a new run into an empty directory (or, with overwrite, one
// that holds another run's files); anything else is refused.
func (rd *runDir) decide(resume *checkpoint.Manifest, resumeDir string, overwrite bool) error {
	ents, err := os.ReadDir(rd.path)
	if err != nil {
		return fmt.Errorf("train: --out: %w", err)
	}
	var names []string
	for _, e := range ents {
		if e.Name() != LockFileName {
			names = append(names, e.Name())
		}
	}
	owner, err := ReadRunFile(rd.path)
	if err != nil {
		return err
	}
	inside := resumeDir != "" && sameDir(filepath.Dir(resumeDir), filepath.Join(rd.path, "checkpoints"))
	switch {
	case len(names) == 0:
	case resume != nil && owner != nil && resume.Run == owner.Run:
		rd.id, rd.continues = owner.Run, true
		return nil
	case resume != nil && owner == nil && resume.Run == "" && inside:
		// A run directory written before run ids: its checkpoints are this
		// run's history; new checkpoints carry a new id.
		rd.continues = true
	case overwrite:
		rd.replaced = strings.Join(names, ", ")
	default:
		what := "files of another run"
		if owner == nil {
			what = "files that are not a Strata run's"
		}
		hint := ""
		if owner != nil && slices.Contains(names, "checkpoints") && rd.goOn != nil {
			hint = fmt.Sprintf("resume that run (%s), ", strings.TrimPrefix(rd.goOn(owner.Args, rd.path, 0), "strata train "))
		}
		if len(names) > 6 {
			names = append(names[:6], fmt.Sprintf("and %d more", len(names)-6))
		}
		return inputf("train: --out %s is not empty (%s) and holds %s: a run directory belongs to one run; %schoose an empty --out, or pass --overwrite to replace its config.json, steps.jsonl, summary.json and model.safetensors (its checkpoints stay, never pruned by this run)",
			rd.path, strings.Join(names, ", "), what, hint)
	}
	var b [8]byte
	rand.Read(b[:])
	rd.id = hex.EncodeToString(b[:])
	return nil
}

// ReadRunFile reads dir/run.json; nil, nil without one.
func ReadRunFile(dir string) (*RunFile, error) {
	b, err := os.ReadFile(filepath.Join(dir, runFileName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("train: --out: %w", err)
	}
	var rf RunFile
	if err := json.Unmarshal(b, &rf); err != nil || rf.Run == "" {
		return nil, fmt.Errorf("train: --out: %s is not a run file (%v): remove it or choose another --out", filepath.Join(dir, runFileName), err)
	}
	return &rf, nil
}

// writeRunFile records the run's id, the source of its weights and its
// flags in run.json.
func (rd *runDir) writeRunFile(source *hf.Source) error {
	b, _ := json.MarshalIndent(RunFile{Run: rd.id, Started: time.Now().UTC(), PID: os.Getpid(), Source: source, Args: rd.args}, "", "  ")
	return writeAtomic(filepath.Join(rd.path, runFileName), append(b, '\n'))
}

// writeAtomic replaces path with b whole (a killed run leaves the old file
// or the new one, never a part: run.json cut short would refuse every
// later resume).
func writeAtomic(path string, b []byte) error {
	err := durable.WriteFile(path, 64<<10, func(w io.Writer) error {
		_, err := w.Write(b)
		return err
	})
	if err != nil {
		return fmt.Errorf("train: --out: %w", err)
	}
	return nil
}

// close releases the lock (the file stays: removing it would let a third
// run lock a new file while a second holds the old one).
func (rd *runDir) close() {
	if rd != nil && rd.lock != nil {
		rd.lock.Close()
		rd.lock = nil
	}
}

// sameDir reports whether a and b name the same directory.
func sameDir(a, b string) bool {
	fa, err1 := os.Stat(a)
	fb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(fa, fb)
}

// open makes the directory this run's: for a run resumed from an older
// checkpoint of the directory's own run, "latest" moves back to it and the
// later checkpoints of the run are set aside (said on stderr); then
// run.json, the resolved config, and steps.jsonl: a new file, or for a
// resumed run the existing one without its lines past the resumed step (a
// run that went on after its checkpoint), ready to append to.
func (rd *runDir) open(cfg *config.Config, p *runPlan, stderr io.Writer) (*os.File, error) {
	if rd.replaced != "" {
		fmt.Fprintf(stderr, "note: --overwrite: %s held another run's files (%s): its config.json, steps.jsonl, summary.json and model.safetensors are replaced; its checkpoints stay, and this run never prunes them\n",
			rd.path, rd.replaced)
	}
	ck := filepath.Join(rd.path, "checkpoints")
	if ls, err := checkpoint.List(ck); err == nil && len(ls.Incomplete) > 0 {
		fmt.Fprintf(stderr, "note: %s: ignored incomplete checkpoint directories (a save or a removal cut short; this run's next save removes those without a manifest or of this run): %s\n",
			ck, strings.Join(ls.Incomplete, ", "))
	}
	if rd.continues {
		if err := rd.rewind(p, stderr); err != nil {
			return nil, err
		}
	}
	if rd.continues {
		if err := rd.setAsideLater(p.start, stderr); err != nil {
			return nil, err
		}
	}
	if err := rd.writeRunFile(p.source); err != nil {
		return nil, err
	}
	if err := writeAtomic(filepath.Join(rd.path, "config.json"), append(cfg.JSON(), '\n')); err != nil {
		return nil, err
	}
	path := filepath.Join(rd.path, "steps.jsonl")
	var kept []byte
	if rd.continues && p.start > 0 {
		old, err := os.ReadFile(path)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("train: --out: %w", err)
		}
		for line := range bytes.Lines(old) {
			var l struct {
				Step int64 `json:"step"`
			}
			if json.Unmarshal(line, &l) == nil && l.Step >= 1 && l.Step <= p.start && bytes.HasSuffix(line, []byte("\n")) {
				kept = append(kept, line...)
			}
		}
	}
	// The kept lines replace the file whole (a kill here leaves the old
	// lines or the kept ones, never none), then the run appends.
	if err := writeAtomic(path, kept); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err == nil {
		// At the end, without O_APPEND: appendLine cuts a line the disk
		// refused back off at the offset it started from.
		_, err = f.Seek(0, io.SeekEnd)
	}
	if err != nil {
		return nil, fmt.Errorf("train: --out: %w", err)
	}
	return f, nil
}

// rewind handles a run resumed into its own directory from a checkpoint
// older than the run's newest: when the checkpoint is in the directory,
// latest moves back to it and the later ones are set aside; a copy from
// elsewhere is refused (the two histories would mix).
func (rd *runDir) rewind(p *runPlan, stderr io.Writer) error {
	ck := filepath.Join(rd.path, "checkpoints")
	ls, err := checkpoint.List(ck)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("train: --out: %w", err)
	}
	var later []string
	for _, c := range ls.Complete {
		if c.Run == p.resume.Run && c.Step > p.start {
			later = append(later, c.Name)
		}
	}
	inside := sameDir(filepath.Dir(p.resumeDir), ck)
	if !inside {
		if len(later) > 0 {
			return inputf("train: --resume: %s already holds checkpoints of this run past step %d (%s): this run would mix with them; resume from the latest, or from a checkpoint in %s, or write this run to another --out",
				ck, p.start, strings.Join(later, ", "), ck)
		}
		return nil
	}
	name := filepath.Base(p.resumeDir)
	if ls.Latest == name && len(later) == 0 {
		return nil
	}
	aside, err := checkpoint.Rewind(ck, name)
	if err != nil {
		return fmt.Errorf("train: --resume: %w", err)
	}
	msg := ""
	if len(aside) > 0 {
		msg = fmt.Sprintf("; the later checkpoints of this run are set aside, not loaded or pruned (remove them when you no longer need them): %s", strings.Join(aside, ", "))
	}
	fmt.Fprintf(stderr, "note: %s/latest moved back to %s (step %d)%s\n", ck, name, p.start, msg)
	return nil
}

// setAsideLater keeps what the directory's run finished past step start
// (a run resumed from an earlier checkpoint than its last step: a final
// save that failed, a rewind): its model.safetensors of a later step and
// the steps.jsonl and summary.json that go with it are kept beside
// themselves (model.step-60.safetensors, steps.to-step-60.jsonl,
// summary.step-60.json), not overwritten or cut, and said on stderr.
func (rd *runDir) setAsideLater(start int64, stderr io.Writer) error {
	var later int64
	weights := filepath.Join(rd.path, "model.safetensors")
	if f, err := safetensors.Open(weights); err == nil {
		later, _ = strconv.ParseInt(f.Header.Metadata[hf.MetaStep], 10, 64)
		f.Close()
	}
	last := int64(0)
	jsonl := filepath.Join(rd.path, "steps.jsonl")
	if b, err := os.ReadFile(jsonl); err == nil {
		for line := range bytes.Lines(b) {
			var l struct {
				Step int64 `json:"step"`
			}
			if json.Unmarshal(line, &l) == nil {
				last = max(last, l.Step)
			}
		}
	}
	var moved []string
	move := func(from, to string) error {
		to = freeName(filepath.Join(rd.path, to))
		if err := os.Rename(from, to); err != nil {
			return fmt.Errorf("train: --out: set aside %s: %w", from, err)
		}
		moved = append(moved, filepath.Base(from)+" -> "+filepath.Base(to))
		return nil
	}
	if later > start {
		if err := move(weights, fmt.Sprintf("model.step-%d.safetensors", later)); err != nil {
			return err
		}
		if _, err := os.Stat(filepath.Join(rd.path, "summary.json")); err == nil {
			if err := move(filepath.Join(rd.path, "summary.json"), fmt.Sprintf("summary.step-%d.json", later)); err != nil {
				return err
			}
		}
	}
	if later > start && last > start {
		// Copied, not moved: open keeps its lines up to start. (Without
		// weights of a later step, the lines past start are of steps a
		// killed run did not save: this run does them again.)
		to := freeName(filepath.Join(rd.path, fmt.Sprintf("steps.to-step-%d.jsonl", last)))
		if err := durable.Copy(to, jsonl); err != nil {
			return fmt.Errorf("train: --out: keep %s: %w", jsonl, err)
		}
		moved = append(moved, fmt.Sprintf("steps.jsonl's steps past %d -> %s", start, filepath.Base(to)))
	}
	if len(moved) > 0 {
		fmt.Fprintf(stderr, "note: %s holds what this run wrote past step %d, the step it resumes from; set aside, not overwritten: %s\n",
			rd.path, start, strings.Join(moved, ", "))
	}
	return nil
}

// freeName is path, or path with ".2", ".3"... before its extension when
// that exists already.
func freeName(path string) string {
	ext := filepath.Ext(path)
	base := strings.TrimSuffix(path, ext)
	for i := 2; ; i++ {
		if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
			return path
		}
		path = fmt.Sprintf("%s.%d%s", base, i, ext)
	}
}
