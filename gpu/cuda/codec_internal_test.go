package cuda

import (
	"slices"
	"testing"

	"github.com/strata-ai/strata/dtype"
)

// TestDequantKernels: every codec of dtype.Codecs has its decoding kernel
// among those kernels.cu defines and the backend loads.
func TestDequantKernels(t *testing.T) {
	for i := range dtype.Codecs {
		if k := dequantKernel(&dtype.Codecs[i]); !slices.Contains(kernelNames, k) {
			t.Errorf("codec %s: no kernel %s in kernelNames", dtype.Codecs[i].Name, k)
		}
	}
}
