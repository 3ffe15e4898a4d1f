package engine

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/strata-ai/strata/engine/report"
)

// TestRunCancelled: a context cancelled during step 2 (by the step's
// callback) stops Run before step 3, with ctx.Err() naming that step; a
// context done before Run takes no step at all.
func TestRunCancelled(t *testing.T) {
	e := newTestEngine(t, runSpec{stage: 3, n: 2, offload: true, micro: 1, accum: 1})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var seen []int64
	err := e.Run(ctx, 5, func(st report.StepStats) error {
		seen = append(seen, st.Step)
		if st.Step == 2 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "before step 3") {
		t.Fatalf("Run after cancel: %v, want context.Canceled before step 3", err)
	}
	if len(seen) != 2 || e.StepCount() != 2 {
		t.Fatalf("steps run %v (StepCount %d), want [1 2]", seen, e.StepCount())
	}
	if err := e.Run(ctx, 1, nil); !errors.Is(err, context.Canceled) || e.StepCount() != 2 {
		t.Fatalf("Run with a done context: %v, StepCount %d; want context.Canceled and no step", err, e.StepCount())
	}
	// The engine is at a whole step: it goes on with a live context.
	if err := e.Run(t.Context(), 1, nil); err != nil || e.StepCount() != 3 {
		t.Fatalf("Run after the stop: %v, StepCount %d; want step 3", err, e.StepCount())
	}
}

// TestEvalCancelled: Eval with a done context evaluates nothing and
// returns ctx.Err(); the engine goes on.
func TestEvalCancelled(t *testing.T) {
	e := newTestEngine(t, runSpec{stage: 2, n: 2, offload: true, micro: 1, accum: 1})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	st, err := e.Eval(ctx, heldOutSet(t))
	if !errors.Is(err, context.Canceled) || st.Tokens != 0 {
		t.Fatalf("Eval with a done context: %v (%d tokens), want context.Canceled and none", err, st.Tokens)
	}
	if _, err := e.Eval(t.Context(), heldOutSet(t)); err != nil {
		t.Fatalf("Eval after the stop: %v", err)
	}
}
