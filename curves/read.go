package curves

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
)

// StepsName is the file of a run directory that Read reads: one JSON
// object a step, as `strata train --out` writes it.
const StepsName = "steps.jsonl"

// maxLineBytes bounds one line of steps.jsonl (a line of a run is well
// under 4 KiB).
const maxLineBytes = 1 << 20

// Run is one training run's steps.
type Run struct {
	Name  string // the legend's name: the run directory's base name
	Dir   string // the run directory, as given to Read
	Steps []Step // one per step, ascending
}

// Step is one step of a run. A figure the line does not have is NaN,
// which Draw leaves out.
type Step struct {
	Step int64
	// Loss is the step's training loss; NaN where steps.jsonl has null (a
	// step an fp16 overflow skipped).
	Loss float64
	// LR is the learning rate the step's update used.
	LR float64
	// EvalLoss is the loss on --eval-data evaluated after the step; NaN
	// on a step with no evaluation.
	EvalLoss float64
	// NVMeBytes is the bytes the tier store read from and wrote to NVMe
	// in the step; NaN in a run without a tier store.
	NVMeBytes float64
}

// line is the part of a steps.jsonl line that a Step holds.
type line struct {
	Step       *int64   `json:"step"`
	Loss       *float64 `json:"loss"`
	LR         float64  `json:"lr"`
	EvalLoss   *float64 `json:"eval_loss"`
	NVMeToHost *int64   `json:"bytes_nvme_to_host"`
	HostToNVMe *int64   `json:"bytes_host_to_nvme"`
}

func (l line) step() Step {
	s := Step{Step: *l.Step, Loss: math.NaN(), LR: l.LR, EvalLoss: math.NaN(), NVMeBytes: math.NaN()}
	if l.Loss != nil {
		s.Loss = *l.Loss
	}
	if l.EvalLoss != nil {
		s.EvalLoss = *l.EvalLoss
	}
	if l.NVMeToHost != nil || l.HostToNVMe != nil {
		var n int64
		for _, b := range []*int64{l.NVMeToHost, l.HostToNVMe} {
			if b != nil {
				n += *b
			}
		}
		s.NVMeBytes = float64(n)
	}
	return s
}

// Read reads the steps.jsonl of run directory dir; dir may also name the
// file itself.
func Read(dir string) (Run, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return Run{}, fmt.Errorf("curves: %w: pass a run directory that strata train --out wrote", err)
	}
	path := filepath.Join(dir, StepsName)
	switch {
	case fi.Mode().IsRegular():
		path, dir = dir, filepath.Dir(dir)
	case !fi.IsDir(): // a FIFO's open would wait for a writer
		return Run{}, fmt.Errorf("curves: %s is not a run directory: pass one that strata train --out wrote", dir)
	}
	name := filepath.Base(absDir(dir)) // "run", not "." or ".."
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Run{}, fmt.Errorf("curves: %s has no %s: pass a run directory that strata train --out wrote", dir, StepsName)
	}
	if err != nil {
		return Run{}, fmt.Errorf("curves: %w", err)
	}
	defer f.Close()
	steps, err := readSteps(f)
	if err != nil {
		return Run{}, fmt.Errorf("curves: %s: %w", path, err)
	}
	if len(steps) == 0 {
		return Run{}, fmt.Errorf("curves: %s has no steps: the run wrote none yet", path)
	}
	return Run{Name: name, Dir: dir, Steps: steps}, nil
}

// readSteps reads the lines of steps.jsonl from r: the last line of each
// step, in step order. A last line without its newline that does not
// parse is one the run is writing, left out.
func readSteps(r io.Reader) ([]Step, error) {
	br := bufio.NewReaderSize(r, maxLineBytes)
	at := map[int64]int{} // step -> index in steps
	var steps []Step
	for lineNo := 1; ; lineNo++ {
		b, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, fmt.Errorf("line %d is longer than %d bytes", lineNo, maxLineBytes)
		}
		if err != nil && err != io.EOF {
			return nil, err
		}
		partial := err == io.EOF
		if b = bytes.TrimSpace(b); len(b) > 0 {
			var l line
			perr := json.Unmarshal(b, &l)
			if perr == nil && l.Step == nil {
				perr = errors.New(`no "step"`)
			}
			switch {
			case perr != nil && partial:
				// the run is writing it
			case perr != nil:
				return nil, fmt.Errorf("line %d: %w", lineNo, perr)
			default:
				s := l.step()
				if i, ok := at[s.Step]; ok {
					steps[i] = s // a resumed run's second line of the step
				} else {
					at[s.Step] = len(steps)
					steps = append(steps, s)
				}
			}
		}
		if partial {
			break
		}
	}
	slices.SortFunc(steps, func(a, b Step) int { return cmp.Compare(a.Step, b.Step) })
	return steps, nil
}
