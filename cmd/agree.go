package cmd

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	trainrun "github.com/strata-ai/strata/run"
	"github.com/urfave/cli/v2"
)

// Before the first collective of a job of several processes (the devices'
// opening), every process sends every other what it resolved: the config,
// each flag that matters to the run (what the collectives do when: the
// saves, the evaluations, the data's order; where the run is written), the
// identity of its training and held-out data (size and SHA-256, not the
// path: the same --data may name another file in another working
// directory) — or the error its start-up ended in. Each process then comes
// to the same verdict: the job goes on, or every process ends it, and
// process 0 prints one line naming the process that failed or differs
// and how. A process that fails after that point ends the job with
// MPI_Abort (job.close): its peers may be waiting for it in a collective.
//
// A process that fails before it joins MPI (a usage error) exits without
// it, and mpirun ends the job on its non-zero status.

// runKey is what a process resolved, by name: "config KEY" for each key
// of the resolved config, "--FLAG" for each flag, the data's identities.
type runKey map[string]string

// notCompared are the train flags a process may set alone: what only
// process 0 does (its timeline, its progress display, the profile its
// step time is compared with), or what the
// resolved config already holds (compared there, after --epochs, --steps,
// --lr... applied).
var notCompared = []string{"trace", "no-progress", "profile", "overwrite", "config", "steps", "epochs", "lr", "micro-batch", "warmup-steps",
	"backend", "nnodes", "node-rank", "master"}

// pathFlags are compared by what they resolve to, not as written.
var pathFlags = []string{"data", "eval-data", "chat-template", "out", "resume", "init", "adapter"}

// trainRunKey is the key of the run p that c's flags describe.
func trainRunKey(c *cli.Context, p *trainPlan) runKey {
	k := runKey{}
	var cfg any
	if json.Unmarshal(p.cfg.JSON(), &cfg) == nil {
		for name, v := range trainrun.Flatten(cfg) {
			if name != "strata.data" { // a path: the data's identity below
				k["config "+name] = v
			}
		}
	}
	for _, f := range c.Command.Flags {
		name := f.Names()[0]
		if slices.Contains(notCompared, name) || slices.Contains(pathFlags, name) {
			continue
		}
		k["--"+name] = fmt.Sprint(c.Value(name)) // the value in effect: a default given or not is the same
	}
	k["training data"] = "the synthetic corpus"
	if len(p.dataIDs) > 0 {
		k["training data"] = describeID(p.dataIDs[0].Path, p.dataIDs[0].Size, p.dataIDs[0].SHA256)
	} else if path := p.cfg.Strata.Data; path != "" {
		k["training data"] = path + " (unreadable)"
	}
	k["--eval-data"] = "(not given)"
	if path := c.String("eval-data"); path != "" {
		if id, err := trainrun.IdentifyData("eval-data", path); err == nil {
			k["--eval-data"] = describeID(path, id.Size, id.SHA256)
		} else {
			k["--eval-data"] = path + " (unreadable)"
		}
	}
	k["chat template"] = "(none)"
	if ct := p.data.ChatTemplate(); ct != nil {
		sum := sha256.Sum256([]byte(ct.Text()))
		k["chat template"] = fmt.Sprintf("%s (sha256 %s)", ct.Source(), hex.EncodeToString(sum[:6]))
	}
	for _, name := range []string{"out", "init", "adapter"} {
		k["--"+name] = "(not given)"
		if path := c.String(name); path != "" {
			k["--"+name] = absPath(path)
		}
	}
	k["--resume"] = "(not given)"
	if p.resume != nil {
		k["--resume"] = fmt.Sprintf("%s (step %d of run %s)", absPath(p.resumeDir), p.resume.Step, p.resume.Run)
	}
	return k
}

func describeID(path string, size int64, sha string) string {
	return fmt.Sprintf("%s (%d bytes, sha256 %s)", path, size, sha[:min(12, len(sha))])
}

func absPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

// agreeKey is the key under which a process sends the error its start-up
// ended in instead of its run.
const agreeKey = "\x00error"

// jobError is an error every process of a job ends with alike (a verdict
// of agree, process 0's on a save): no MPI_Abort, and only process 0
// prints it (quiet in the others).
type jobError struct {
	msg    string
	quiet  bool
	status int // the exit status; 0 means 1
}

func (e jobError) Error() string { return e.msg }
func (e jobError) ExitCode() int { return max(e.status, 1) }

// agree exchanges the processes' keys (mine, or failed: this process's
// start-up error) and returns the job's verdict, the same in every
// process: nil, or the error naming each process that failed or differs
// from process 0.
func (j *job) agree(mine runKey, failed error) error {
	j.agreed = true
	if failed != nil {
		mine = runKey{agreeKey: errorLine("train", failed)}
	}
	b, _ := json.Marshal(mine)
	lens := make([]byte, 8*j.place.Size)
	if err := j.mpi.Allgather(binary.LittleEndian.AppendUint64(nil, uint64(len(b))), lens); err != nil {
		return fmt.Errorf("train: %s: %w", j.place, err)
	}
	counts := make([]int, j.place.Size)
	total := 0
	for q := range counts {
		counts[q] = int(binary.LittleEndian.Uint64(lens[8*q:]))
		total += counts[q]
	}
	all := make([]byte, total)
	if err := j.mpi.Allgatherv(b, all, counts); err != nil {
		return fmt.Errorf("train: %s: %w", j.place, err)
	}
	keys := make([]runKey, j.place.Size)
	for q, off := 0, 0; q < len(keys); off, q = off+counts[q], q+1 {
		if err := json.Unmarshal(all[off:off+counts[q]], &keys[q]); err != nil {
			return fmt.Errorf("train: %s: process %d's run: %w", j.place, q, err)
		}
	}
	if v := verdict(keys); v != "" {
		return jobError{msg: "train: " + v, quiet: !j.leader()}
	}
	return nil
}

// verdict names the processes whose start-up failed, else those whose run
// differs from process 0's, with their first differences; "" when all
// agree.
func verdict(keys []runKey) string {
	var failed []string
	for q, k := range keys {
		if e, ok := k[agreeKey]; ok {
			failed = append(failed, fmt.Sprintf("process %d of %d failed at start-up: %s", q, len(keys), strings.TrimPrefix(e, "strata train: ")))
		}
	}
	if len(failed) > 0 {
		return strings.Join(failed, "; ") + "; the job ends (every process must start)"
	}
	var differ []string
	for q := 1; q < len(keys); q++ {
		if d := keyDiff(keys[0], keys[q]); d != "" {
			differ = append(differ, fmt.Sprintf("process %d resolved another run than process 0: %s", q, d))
		}
	}
	if len(differ) == 0 {
		return ""
	}
	return strings.Join(differ, "; ") + "; every process of a job must be given the same config, flags and data (the same files, by content)"
}

// keyDiff says how b differs from a (process 0's): at most 4 names.
func keyDiff(a, b runKey) string {
	var names []string
	for n := range a {
		if a[n] != b[n] {
			names = append(names, n)
		}
	}
	for n := range b {
		if _, ok := a[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	var d []string
	for _, n := range names {
		d = append(d, fmt.Sprintf("%s %s (process 0: %s)", n, orNone(b[n]), orNone(a[n])))
	}
	if len(d) > 4 {
		d = append(d[:4], fmt.Sprintf("and %d more", len(d)-4))
	}
	return strings.Join(d, ", ")
}

// ended is the error runTrain returns in a job (called on its ways out,
// again for the same error is a no-op): before the processes agreed, err
// is this process's start-up failure, sent to the others (agree) and
// answered with the job's verdict. After, an error of this process alone
// (not a jobError, not a stop the processes agreed on) is printed and the
// job ended at once with MPI_Abort — before the engine's Close, which
// waits for the devices' collectives, that is for the other processes,
// which wait for this one.
func (j *job) ended(err error) error {
	if j == nil || err == nil {
		return err
	}
	var je jobError
	var ie interruptedError
	if !j.agreed {
		v := j.agree(nil, err)
		if errors.As(err, &ie) && errors.As(v, &je) {
			// Stopped by a signal before the first step (mpirun passes it
			// to every process): the signal's status.
			je.status = ie.status
			return je
		}
		if v != nil {
			return v
		}
		return err
	}
	if errors.As(err, &je) || (errors.As(err, &ie) && !ie.alone) {
		return err
	}
	status := 1
	var ec exitCoder
	if errors.As(err, &ec) && ec.ExitCode() != 0 {
		status = ec.ExitCode()
	}
	fmt.Fprintf(os.Stderr, "%s\n", errorLine("train", err))
	fmt.Fprintf(os.Stderr, "strata train: %s: ending every process of the job (MPI_Abort)\n", j.place)
	j.mpi.Abort(status)
	return err
}
