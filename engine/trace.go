package engine

import (
	"errors"
	"io"
)

// The engine's side of its timeline (package timeline): each rank's
// timeline.Recorder (rank.tr, made in newRank; nil without Options.Trace
// and without the host optimizer) records its streams' spans, the tier
// runners report their moves and stalls to it (newRunner), and WriteTrace
// writes the Tracer's JSON once every span has landed.

// WriteTrace waits for every rank's streams, lets the moves in flight
// complete (as Params does), and writes the timeline recorded so far
// (Tracer.WriteJSON), also after a failed step; it fails when the engine
// runs without Options.Trace. Call it between steps (or after Close), from
// the goroutine that calls Step.
func (e *Engine) WriteTrace(w io.Writer) error {
	t := e.opts.Trace
	if t == nil {
		return errors.New("engine: write trace: the engine runs without Options.Trace")
	}
	e.flushTrace()
	return t.WriteJSON(w)
}

// flushTrace brings every span that has happened into the tracer. It
// ignores the streams' and the runners' errors: a failed step has
// returned them already, and its timeline is worth writing.
func (e *Engine) flushTrace() {
	if e.closed || e.opts.Trace == nil {
		return
	}
	e.settle() // the pending host updates' cpuadam spans belong in it
	e.parallel(func(r *rank) error { return r.sync() })
	for _, r := range e.ranks {
		r.tr.Flush()
	}
	e.tiers.cycle()
}
