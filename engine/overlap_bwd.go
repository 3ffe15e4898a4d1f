package engine

import (
	"fmt"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/units"
)

// The host update during the backward (strata.update_in_backward): its
// rules, the undo copy that keeps a non-finite step from updating
// anything, and why it stays deterministic are in docs/DESIGN.md ("The
// host optimizer's schedules").

// noteBwd tells the user once what the update during the backward costs,
// or why strata.update_in_backward does nothing.
func (e *Engine) noteBwd() {
	if e.cfg.Strata.UpdateInBackward && !e.bwdEnabled() {
		e.notes = append(e.notes, "strata.update_in_backward needs overlap \"exact\", the optimizer on the host and no NVMe: the update runs after the backward")
	}
	if !e.bwdEnabled() {
		return
	}
	clip := ""
	if e.cfg.GradientClipping > 0 {
		clip = "; a clipped step undoes it and updates after the backward, and so does the step after it"
	}
	e.notes = append(e.notes, fmt.Sprintf("update_in_backward: each chunk's cpu adam starts during the backward, as if the step were not clipped; up to %s of host memory per rank keeps master, m and v to undo a step that turns out non-finite or clipped%s",
		units.FormatBytes(e.undoBytes()), clip))
}

// undoBytes is one rank's undo copy at most (0 without the update in the
// backward): master, m, v as stored, a remainder master's params.
func (e *Engine) undoBytes() int64 {
	var b int64
	for c, p := range e.chunks {
		if n := e.optElems(c); e.bwdEnabled() && !e.paramTiered(c) && !p.frozen {
			b += e.masters.undoBytes(n) + 2*e.moments.Bytes(n)
		}
	}
	return b
}

// handBackward hands chunk c's update to the step's run during the
// backward, once its gradient's copy to host memory (ev) is enqueued.
func (r *rank) handBackward(c int, ev gpu.Event) error {
	run := r.next
	if run == nil || r.e.paramTiered(c) {
		return nil
	}
	ls, err := r.leaseHost(c, true)
	run.chunks[c].handed = true
	if err != nil {
		run.chunks[c].reported = true // the backward returns it
	}
	run.jobs <- hostJob{c: c, ls: ls, err: err, ev: ev, keep: true}
	r.bwdChunks++
	return err
}

// saveUndo copies chunk c's master, m and v (leased in ls), and a
// remainder master's params, before cpuadam writes them.
func (r *rank) saveUndo(c int, ls hostLeases) {
	if r.undo == nil {
		r.undo = make([][]byte, len(r.e.chunks))
	}
	u := r.undo[c][:0]
	for _, l := range ls.optState() {
		u = append(u, l.Bytes()...)
	}
	r.undo[c] = append(u, r.e.masters.params(r, c)...)
}

// restoreUndo copies chunk c's saved state back.
func (r *rank) restoreUndo(c int, ls hostLeases) {
	u := r.undo[c]
	for _, l := range ls.optState() {
		u = u[copy(l.Bytes(), u):]
	}
	copy(r.e.masters.params(r, c), u)
}

// commitNext (the step is finite): the updates of the backward give their
// leases back once done, the other chunks are leased and handed over in
// forward order, and the run is pending (r.run).
func (r *rank) commitNext() error {
	run := r.next
	if run == nil {
		return nil
	}
	r.next = nil
	run.jobs <- hostJob{c: -1, release: true}
	return r.leaseRest(run)
}

// abortNext (the step failed): it waits for the updates of the backward,
// undoes them and gives their leases back; nothing of the run reaches the
// devices.
func (r *rank) abortNext() {
	run := r.next
	if run == nil {
		return
	}
	run.closeJobs()
	run.wait()
	for c, cu := range run.chunks {
		if cu.handed && cu.err == nil {
			r.restoreUndo(c, cu.held)
		}
		r.doneLeases(cu.held)
	}
	r.retire(run, runAborted)
}
