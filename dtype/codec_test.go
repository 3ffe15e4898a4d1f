package dtype

import (
	"testing"

	"github.com/strata-ai/strata/internal/absmax8"
	"github.com/strata-ai/strata/internal/nf4"
)

// TestBlockFormatBytes: NF4's and INT8's sizes are their codecs' (nf4.Bytes,
// absmax8.Bytes), so a tier extent and a codec's buffer always agree.
func TestBlockFormatBytes(t *testing.T) {
	for _, n := range []int{0, 1, 63, 64, 65, 127, 4096, 1 << 20} {
		if NF4.Bytes(n) != nf4.Bytes(n) {
			t.Errorf("n %d: NF4.Bytes %d, nf4.Bytes %d", n, NF4.Bytes(n), nf4.Bytes(n))
		}
		if INT8.Bytes(n) != absmax8.Bytes(n) {
			t.Errorf("n %d: INT8.Bytes %d, absmax8.Bytes %d", n, INT8.Bytes(n), absmax8.Bytes(n))
		}
	}
}
