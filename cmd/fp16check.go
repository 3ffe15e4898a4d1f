package cmd

import (
	"fmt"

	"github.com/strata-ai/strata/engine"
)

// fp16NoUpdate is the error of an fp16 run none of whose steps brought a
// gradient to the weights (engine.FP16NoUpdate: every step skipped for an
// overflow, or every gradient flushed to zero), once the run's outputs
// are written: such a run trained nothing and must not end as a success.
func fp16NoUpdate(e *engine.Engine) error {
	if err := e.FP16NoUpdate(); err != nil {
		return fmt.Errorf("train: %w", err)
	}
	return nil
}
