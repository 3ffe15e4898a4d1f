package cpu

import (
	"strings"
	"testing"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/units"
)

// TestDequantizeUnknownFormat: the kernel behind the checks refuses a
// format that has no codec in dtype.Codecs (Q8 here: a block format, but
// not a frozen base's) with an error on the stream, instead of decoding
// it as another format; the checked front end panics before it.
func TestDequantizeUnknownFormat(t *testing.T) {
	devs, _, err := New(Options{Devices: 1, HBMBytes: 16 * units.MiB})
	if err != nil {
		t.Fatal(err)
	}
	d := devs[0]
	const n = 128
	src, _ := d.Alloc(int(dtype.NF4.Bytes(n)), gpu.U8, gpu.Tag{Purpose: "src"})
	dst, _ := d.Alloc(n, gpu.F32, gpu.Tag{Purpose: "dst"})
	s := d.newStream()
	(&kernels{d: d}).Dequantize(s, dtype.Q8, src.(*Buffer), dst.(*Buffer), n)
	if err := s.Synchronize(); err == nil || !strings.Contains(err.Error(), "not a coded base format") {
		t.Fatalf("dequantize of q8: %v, want the codec table's refusal", err)
	}
	func() {
		defer func() {
			if r := recover(); r == nil {
				t.Error("the checked Dequantize of q8 did not panic")
			}
		}()
		d.Ops().Dequantize(d.NewStream(), dtype.Q8, src, dst, n)
	}()
}
