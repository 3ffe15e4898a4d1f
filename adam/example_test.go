package adam_test

import (
	"fmt"

	"github.com/strata-ai/strata/adam"
)

// Example validates one AdamW step's hyper-parameters and derives the
// constants every implementation uses: the bias corrections of step 1.
func Example() {
	p := adam.Params{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, Step: 1, GradScale: 1, Mode: adam.W}
	if err := p.Validate(); err != nil {
		fmt.Println(err)
		return
	}
	s := p.Scalars()
	fmt.Printf("%v step %d: step size %.4g, decay %.6f\n", p.Mode, p.Step, -s.NegStep, s.Decay)
	p.Step = 0
	fmt.Println("step 0 refused:", p.Validate() != nil)
	// Output:
	// adamw step 1: step size 0.01, decay 0.999990
	// step 0 refused: true
}
