package cmd

import (
	"fmt"
	"io"
	"os"

	"github.com/strata-ai/strata/engine"
	"github.com/strata-ai/strata/timeline"
)

// writeTrace writes e's timeline to f (created before the training, closed
// here) and prints the exposed transfer time it shows (steps after the
// first, which records the access trace).
func writeTrace(f *os.File, e *engine.Engine, tr *timeline.Tracer, w io.Writer) error {
	path := f.Name()
	if err := e.WriteTrace(f); err != nil {
		f.Close()
		return fmt.Errorf("train: --trace: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("train: --trace: %w", err)
	}
	fmt.Fprintln(w, overlapLine(path, timeline.Overlap(tr.Events()), 1))
	if n := tr.Dropped(); n > 0 {
		fmt.Fprintf(w, "timeline: %d events dropped (the cap: TraceOptions.MaxEvents)\n", n)
	}
	return nil
}

// overlapLine sums the steps after the first skip of ov.
func overlapLine(path string, ov []timeline.StepOverlap, skip int) string {
	if len(ov) > skip {
		ov = ov[skip:]
	}
	t := timeline.TotalOverlap(ov)
	return fmt.Sprintf("timeline %s: exposed transfer time %v of %v busy on the links (%.3f) over %d step(s)",
		path, t.Exposed, t.TransferBusy, t.ExposedFraction, t.Step)
}
