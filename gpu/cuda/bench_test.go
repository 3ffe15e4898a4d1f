package cuda_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/bf16"
	"github.com/strata-ai/strata/internal/units"
)

// AnchorBF16TFLOPs is the anchor of the GEMM benchmark: an 8192×8192×8192
// bf16 matrix product through PyTorch on an H200 of the device pool, on
// random data (about 790 TFLOP/s; 769-798 over several machines).
const AnchorBF16TFLOPs = 790.0

// BenchmarkGemmBF16 measures C = A·B for 8192×8192×8192 bf16 operands
// (bf16 C, fp32 compute) on random data, and reports TFLOP/s and the ratio
// to the PyTorch anchor. Run: go test -run '^$' -bench GemmBF16 -benchtime 50x ./gpu/cuda
func BenchmarkGemmBF16(b *testing.B) {
	benchGemm(b, 8192, gpu.BF16, AnchorBF16TFLOPs)
}

// BenchmarkGemmF32 is the same product in fp32 (no anchor: ratio against
// the bf16 anchor is not meaningful, so only TFLOP/s).
func BenchmarkGemmF32(b *testing.B) {
	benchGemm(b, 4096, gpu.F32, 0)
}

func benchGemm(b *testing.B, size int, dt gpu.DType, anchor float64) {
	be := newBackend(b, 1, 0)
	d := be.Device(0)
	s := d.DefaultStream()
	r := rand.New(rand.NewPCG(7, 8))
	n := size * size
	bufs := make([]gpu.Buffer, 3)
	for i := range bufs {
		x, err := d.Alloc(n, dt, gpu.Tag{Kind: gpu.Workspace, Purpose: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		defer d.Free(x)
		bufs[i] = x
		if i == 2 {
			continue
		}
		host := make([]byte, x.Bytes())
		for j := 0; j < n; j++ {
			v := float32(r.Float64()*2 - 1)
			if dt == gpu.BF16 {
				h := bf16.FromFloat32(v)
				host[2*j], host[2*j+1] = byte(h), byte(h>>8)
			} else {
				u := *(*[4]byte)(unsafePointer(&v))
				copy(host[4*j:], u[:])
			}
		}
		d.CopyHostToDevice(s, x, 0, host)
		if err := s.Synchronize(); err != nil {
			b.Fatal(err)
		}
	}
	for range 3 { // warm-up: cuBLAS handle, heuristics, clocks
		d.Ops().Gemm(s, false, false, size, size, size, 1, bufs[0], bufs[1], 0, bufs[2])
	}
	if err := s.Synchronize(); err != nil {
		b.Fatal(err)
	}
	// A plain b.N loop, not b.Loop: b.Loop stops the timer when it
	// returns false, before the Synchronize that waits for the GPU.
	b.ResetTimer()
	for range b.N {
		d.Ops().Gemm(s, false, false, size, size, size, 1, bufs[0], bufs[1], 0, bufs[2])
	}
	if err := s.Synchronize(); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	flops := 2 * float64(size) * float64(size) * float64(size)
	tflops := flops * float64(b.N) / b.Elapsed().Seconds() / 1e12
	b.ReportMetric(tflops, "TFLOP/s")
	if anchor > 0 {
		b.ReportMetric(tflops/anchor, "ratio-to-torch")
	}
	msg := fmt.Sprintf("%s %d×%d×%d: %.1f TFLOP/s over %d products (%s of operands)", dt, size, size, size, tflops, b.N, units.FormatBytes(3*bufs[0].Bytes()))
	if anchor > 0 {
		msg += fmt.Sprintf("; anchor %.0f (PyTorch, H200): ratio %.3f", anchor, tflops/anchor)
	}
	b.Log(msg)
}

func unsafePointer(p *float32) unsafe.Pointer { return unsafe.Pointer(p) }
