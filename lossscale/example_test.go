package lossscale_test

import (
	"fmt"

	"github.com/strata-ai/strata/lossscale"
)

// ExampleScaler runs DeepSpeed's dynamic loss scaler from 2^4 with a window
// of 2: an overflow halves the scale, two clean steps after it double it.
func ExampleScaler() {
	c := lossscale.Defaults()
	c.InitialPower, c.Window, c.Hysteresis = 4, 2, 1
	s := lossscale.New(c)
	for _, overflow := range []bool{false, true, false, false} {
		if err := s.Update(overflow); err != nil {
			panic(err)
		}
		fmt.Println(s.Scale())
	}
	// Output:
	// 16
	// 8
	// 8
	// 16
}
