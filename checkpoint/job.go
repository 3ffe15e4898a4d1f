package checkpoint

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
)

// Procs is the processes of a job that save one checkpoint together
// (engine.Procs; dist.MPI implements both). Each call is a collective of
// every process.
type Procs interface {
	Procs() int
	Proc() int
	// Allgather: recv (Procs × len(send)) holds every process's send in
	// process order.
	Allgather(send, recv []byte) error
	// Bcast: buf takes process root's bytes.
	Bcast(buf []byte, root int) error
}

// SaveJob is SaveStream for one process of a job of several, each process
// writing the files of its own ranks lo..hi−1 (fill gets, for each chunk
// and state, those ranks' shards side by side) into one temporary
// directory, which every process must see at the same path (a shared
// filesystem, or one node). Process 0 names the checkpoint and makes the
// directory, and once every process has written and fsynced its files it
// writes the manifest (every rank's size and CRC-32C), renames the
// directory and replaces latest, as SaveWith does: a crash of any process
// at any point leaves latest naming a complete checkpoint. A process that
// fails (a full disk) fails the save in every process, with its error;
// every process returns the same outcome. Host memory per process: two
// buffers of its ranks' part of the largest whole.
func SaveJob(dir string, meta *State, lo, hi int, fill ChunkFunc, p Procs, opts Options) error {
	if err := meta.validateMeta(); err != nil {
		return err
	}
	if lo < 0 || hi > meta.Devices || lo >= hi {
		return fmt.Errorf("checkpoint: ranks %d..%d of %d", lo, hi-1, meta.Devices)
	}
	if err := opts.Validate(); err != nil {
		return err
	}
	opts.defaults()
	leader := p.Proc() == 0
	// Process 0 names the checkpoint; the others take the name or its error.
	var name, tmp string
	var err error
	if leader {
		name, tmp, err = prepare(dir, meta, &opts)
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	words, berr := bcastStrings(p, []string{msg, name, tmp})
	if berr != nil {
		return fmt.Errorf("checkpoint: from process 0: %w", berr)
	}
	if words[0] != "" {
		if leader {
			return err
		}
		return fmt.Errorf("checkpoint: process 0: %s", words[0])
	}
	name, tmp = words[1], words[2]
	// Every process its ranks' files; then each one's outcome to all.
	files, err := writeRankFiles(tmp, meta, lo, hi, fill, &opts)
	report := jobReport{Files: files}
	if err != nil {
		report.Err = err.Error()
	}
	reports, gerr := gatherJSON(p, report)
	if gerr != nil {
		return fmt.Errorf("checkpoint: the processes' files: %w", gerr)
	}
	var all []FileInfo
	var errs []error
	for q, r := range reports {
		if r.Err != "" {
			errs = append(errs, fmt.Errorf("process %d: %s", q, r.Err))
		}
		all = append(all, r.Files...)
	}
	fail := errors.Join(errs...)
	if fail != nil && err != nil {
		fail = err // this process's own, with its type (a full disk's *PathError)
	}
	// Process 0 completes it; its outcome is everyone's.
	if leader {
		if fail != nil {
			os.RemoveAll(tmp)
			err = fmt.Errorf("checkpoint: %w", fail)
		} else {
			err = commit(dir, name, tmp, meta, all, &opts)
		}
	}
	msg = ""
	if leader && err != nil {
		msg = err.Error()
	}
	words, berr = bcastStrings(p, []string{msg})
	if berr != nil {
		return fmt.Errorf("checkpoint: process 0's outcome: %w", berr)
	}
	switch {
	case leader:
		return err
	case fail != nil && err != nil:
		return fmt.Errorf("checkpoint: %w", err) // this process's own failure
	case words[0] != "":
		return fmt.Errorf("checkpoint: process 0: %s", words[0])
	}
	return nil
}

// jobReport is one process's part of a SaveJob.
type jobReport struct {
	Files []FileInfo `json:"files"`
	Err   string     `json:"err,omitempty"`
}

// bcastStrings sends process 0's strings to every process.
func bcastStrings(p Procs, s []string) ([]string, error) {
	b, _ := json.Marshal(s)
	n := binary.LittleEndian.AppendUint64(nil, uint64(len(b)))
	if err := p.Bcast(n, 0); err != nil {
		return nil, err
	}
	buf := make([]byte, binary.LittleEndian.Uint64(n))
	copy(buf, b)
	if err := p.Bcast(buf, 0); err != nil {
		return nil, err
	}
	var out []string
	if err := json.Unmarshal(buf, &out); err != nil {
		return nil, fmt.Errorf("process 0 sent %q: %w", buf, err)
	}
	return out, nil
}

// gatherJSON gathers every process's v, in process order (the lengths
// first, then each value padded to the longest).
func gatherJSON(p Procs, v jobReport) ([]jobReport, error) {
	b, _ := json.Marshal(v)
	lens := make([]byte, 8*p.Procs())
	if err := p.Allgather(binary.LittleEndian.AppendUint64(nil, uint64(len(b))), lens); err != nil {
		return nil, err
	}
	most := 0
	for q := range p.Procs() {
		most = max(most, int(binary.LittleEndian.Uint64(lens[8*q:])))
	}
	mine := make([]byte, most)
	copy(mine, b)
	all := make([]byte, most*p.Procs())
	if err := p.Allgather(mine, all); err != nil {
		return nil, err
	}
	out := make([]jobReport, p.Procs())
	for q := range out {
		n := int(binary.LittleEndian.Uint64(lens[8*q:]))
		if err := json.Unmarshal(all[q*most:q*most+n], &out[q]); err != nil {
			return nil, fmt.Errorf("process %d's report: %w", q, err)
		}
	}
	return out, nil
}
