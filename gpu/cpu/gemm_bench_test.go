package cpu_test

import (
	"fmt"
	"testing"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/internal/units"
)

// BenchmarkGemm times the GEMM kernels at two GPT-2 124M shapes (1024
// rows): go test -run '^$' -bench Gemm ./gpu/cpu/. `strata bench gemm`
// covers every shape and prints the ratio to the machine's peak.
func BenchmarkGemm(b *testing.B) {
	shapes := []struct {
		name    string
		tA, tB  bool
		m, n, k int
	}{
		{"fc-forward", false, true, 1024, 3072, 768},
		{"fc-backward-weight", true, false, 3072, 768, 1024},
	}
	for _, kernel := range kernels() {
		for _, sh := range shapes {
			b.Run(fmt.Sprintf("%s/%s", kernel, sh.name), func(b *testing.B) {
				devs, _, err := cpu.New(cpu.Options{HBMBytes: units.GiB, Kernel: kernel})
				if err != nil {
					b.Fatal(err)
				}
				d := devs[0]
				tag := gpu.Tag{Kind: gpu.Workspace, Purpose: "bench"}
				x, _ := d.Alloc(sh.m*sh.k, gpu.F32, tag)
				w, _ := d.Alloc(sh.k*sh.n, gpu.F32, tag)
				y, _ := d.Alloc(sh.m*sh.n, gpu.F32, tag)
				s := d.DefaultStream()
				d.Ops().Fill(s, x, 0.5)
				d.Ops().Fill(s, w, 0.25)
				b.ResetTimer()
				for range b.N {
					d.Ops().Gemm(s, sh.tA, sh.tB, sh.m, sh.n, sh.k, 1, x, w, 0, y)
					if err := s.Synchronize(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(2*float64(sh.m*sh.n*sh.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}
