package bench

import (
	"strings"
	"testing"

	"github.com/strata-ai/strata/gpu"
)

// TestGemmTiny runs the benchmark's code path on the tiny shape and checks
// what it reports, not how fast it is.
func TestGemmTiny(t *testing.T) {
	r, err := RunGemm(GemmOptions{Shape: "tiny", Rows: 33, MinSeconds: 1e-9, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Cases) != 2*len(GemmLayers)*3 {
		t.Fatalf("%d cases, want %d", len(r.Cases), 2*len(GemmLayers)*3)
	}
	for _, c := range r.Cases {
		if c.Reps < 1 || !(c.GFLOPS > 0) || c.M*c.N*c.K == 0 {
			t.Errorf("case %+v", c)
		}
		if c.Layer == "head" && c.Pass == "forward" && (c.M != 33 || c.N != 256 || c.K != 32 || !c.TransB) {
			t.Errorf("head forward: %+v", c)
		}
		if c.Pass == "backward-weight" && (!c.TransA || c.K != 33) {
			t.Errorf("backward-weight: %+v", c)
		}
	}
	if r.Peak.Cores != min(2, r.Peak.Cores) || r.Peak.LanesF32 < 1 || r.Peak.FMAUnits < 1 {
		t.Errorf("peak %+v", r.Peak)
	}
	if r.Peak.MHz > 0 && !(r.Cases[0].Ratio > 0) {
		t.Errorf("ratio %v with a peak of %v", r.Cases[0].Ratio, r.Peak.GFLOPS)
	}
	if s := r.String(); !strings.Contains(s, "peak:") || !strings.Contains(s, "head") {
		t.Errorf("table:\n%s", s)
	}
	for _, bad := range []GemmOptions{{Shape: "gpt-9z"}, {Layers: []string{"mlp"}}, {DTypes: []gpu.DType{gpu.I32}}, {Rows: -1}} {
		if _, err := RunGemm(bad); err == nil {
			t.Errorf("RunGemm(%+v): no error", bad)
		}
	}
}
