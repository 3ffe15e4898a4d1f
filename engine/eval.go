package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/model"
)

// Eval runs the model's forward pass, and nothing else, over every row of
// set and returns the mean loss over its target tokens. The ranks read
// the rows in rounds: in round k rank r evaluates the B rows from
// (k·N + r)·B (rows past set.Len() are padding, without targets), through
// the same hooks as a training step's forward (at stage 3 the chunks are
// gathered as there), with no gradient, no reduction and no update.
//
// It first completes the pending host update (as Params does), so it
// evaluates the parameters of the last Step (under dpu: those the devices
// hold, the step before's). Nothing of the training state changes: the
// steps after it are bit-identical to a run without it. Its transfers are
// not counted in the next step's figures; with tier-store params the
// planner sees the pass as accesses beside its trace, and the next step
// re-records its trace (served on demand where it differs). ctx is checked
// between rounds: once it is done, Eval ends the pass and returns ctx.Err()
// wrapped, naming the rows it stopped before.
func (e *Engine) Eval(ctx context.Context, set EvalSet) (report.EvalStats, error) {
	if e.closed {
		panic("engine: Eval after Close")
	}
	start := time.Now()
	st := report.EvalStats{Rows: set.Len()}
	if set.Seq() != e.seq {
		return st, fmt.Errorf("engine: eval: the set's rows are %d tokens, the run's seq_len is %d", set.Seq(), e.seq)
	}
	if err := e.settle(); err != nil {
		return st, err
	}
	per := int64(e.n * e.micro)
	rounds := (st.Rows + per - 1) / per
	var sum float64
	var runErr error
	errs := make([]error, e.n)
	for k := range rounds {
		if err := ctx.Err(); err != nil {
			runErr = fmt.Errorf("engine: eval stopped before rows %d..%d: %w", k*per, k*per+per-1, err)
			break
		}
		bs, counts, err := e.evalBatches(set, k*per)
		if err != nil {
			runErr = fmt.Errorf("engine: eval: rows %d..%d: %w", k*per, k*per+per-1, err)
			break
		}
		losses := make([]float64, e.n)
		e.parallel(func(r *rank) error {
			var err error
			losses[r.idx], err = r.evalMicro(bs[r.idx])
			if err != nil && errs[r.idx] == nil {
				errs[r.idx] = err
			}
			return nil
		})
		if err := e.shareF64(losses, 1); err != nil { // the other processes' ranks'
			runErr = fmt.Errorf("engine: eval: %w", err)
			break
		}
		for r, n := range counts {
			if n > 0 { // a batch of padding only has no mean
				sum += losses[r] * float64(n)
				st.Tokens += n
			}
		}
	}
	err := e.parallel(func(r *rank) error {
		err := r.evalEnd()
		if err == nil {
			err = errs[r.idx]
		}
		return err
	})
	// The pass's transfers are not the next step's.
	e.lastCount = e.counters()
	e.tiers.markStepEnd()
	if runErr != nil {
		return st, runErr
	}
	if err != nil {
		return st, fmt.Errorf("engine: eval: %w", err)
	}
	if st.Tokens > 0 {
		st.Loss = sum / float64(st.Tokens)
	}
	st.Duration = time.Since(start)
	return st, nil
}

// evalBatches reads every rank's rows of an eval round starting at row
// first, checks them, and counts their targets.
func (e *Engine) evalBatches(set EvalSet, first int64) ([]model.Batch, []int64, error) {
	bs := make([]model.Batch, e.n)
	counts := make([]int64, e.n)
	for r := range e.n {
		b, err := set.Rows(first+int64(r*e.micro), e.micro)
		if err == nil {
			err = e.checkBatch(b)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("rank %d: %w", r, err)
		}
		for _, t := range b.Targets {
			if t != model.IgnoreTarget {
				counts[r]++
			}
		}
		bs[r] = b
	}
	return bs, counts, nil
}

// evalMicro runs one forward-only micro-batch and returns its mean loss.
// After a hook's failure (in this or an earlier round) the rank only
// issues its peers' collectives (hooks.drain), as a failed step does.
func (r *rank) evalMicro(b model.Batch) (float64, error) {
	r.h.beginEval()
	var loss float64
	var err error
	if r.h.err == nil {
		if err = r.model.Forward(r.s, r.h, b); err == nil {
			var ls []float64
			if ls, err = r.model.Losses(r.s); err == nil && len(ls) != 1 {
				err = fmt.Errorf("engine: rank %d: the model gave %d losses for one micro-batch (Instance.Losses returns one per Forward)", r.idx, len(ls))
			}
			if err == nil {
				loss = ls[0]
			}
		}
	}
	r.h.drain(r.s)
	r.h.end()
	return loss, err
}

// evalEnd ends an Eval on the rank: it waits for its streams, frees the
// gathered chunks, gives back the tier store's leases, and returns the
// pass's failure.
func (r *rank) evalEnd() error {
	err := r.sync()
	r.h.freeAll()
	if derr := r.e.tiers.settle(r.loc); err == nil {
		err = derr
	}
	if herr := r.h.takeErr(); herr != nil {
		return herr
	}
	return err
}
