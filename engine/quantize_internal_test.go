package engine

import (
	"testing"

	"github.com/strata-ai/strata/dtype"
)

// TestQuantizeUnknownFormat: the engine's host codec refuses a format with
// no codec in dtype.Codecs instead of coding it as NF4.
func TestQuantizeUnknownFormat(t *testing.T) {
	for _, f := range []func(){
		func() { quantize(dtype.Q8, make([]float32, 64)) },
		func() { dequantize(dtype.BF16, make([]float32, 64), make([]byte, 64)) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Error("a format with no codec was coded")
				}
			}()
			f()
		}()
	}
}
