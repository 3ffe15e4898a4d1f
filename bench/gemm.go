package bench

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/model"
)

// GemmOptions configure `strata bench gemm`: the CPU backend's GEMM at the
// shapes of one training step of a model, against the machine's peak.
type GemmOptions struct {
	Shape      string      // a named model shape; default "gpt2" (124M)
	Rows       int         // B*T, the rows of the activations; default 1024
	DTypes     []gpu.DType // storage of A, B and C; default fp32 and bf16
	Layers     []string    // a subset of GemmLayers; default all
	Workers    int         // CPU backend workers; default GOMAXPROCS
	MinSeconds float64     // timed repetitions run until this much time has passed; default 0.5
	Kernel     string      // CPU backend GEMM kernel: auto (default), avx512 or gonum
}

// GemmLayers are the linear layers of a GPT-2 block and the head.
var GemmLayers = []string{"qkv", "attn-proj", "fc", "fc-proj", "head"}

// WithDefaults fills the zero fields.
func (o GemmOptions) WithDefaults() GemmOptions {
	if o.Shape == "" {
		o.Shape = "gpt2"
	}
	if o.Rows == 0 {
		o.Rows = 1024
	}
	if len(o.DTypes) == 0 {
		o.DTypes = []gpu.DType{gpu.F32, gpu.BF16}
	}
	if len(o.Layers) == 0 {
		o.Layers = GemmLayers
	}
	if o.Workers == 0 {
		o.Workers = runtime.GOMAXPROCS(0)
	}
	if o.MinSeconds == 0 {
		o.MinSeconds = 0.5
	}
	o.Kernel = cpu.Options{Kernel: o.Kernel}.WithDefaults().Kernel
	return o
}

// Validate says what is wrong with o (after defaults).
func (o GemmOptions) Validate() error {
	if _, err := model.Lookup(o.Shape); err != nil {
		return fmt.Errorf("bench: gemm: %w", err)
	}
	for _, l := range o.Layers {
		if !slices.Contains(GemmLayers, l) {
			return fmt.Errorf("bench: gemm: unknown layer %q (want %s)", l, strings.Join(GemmLayers, ", "))
		}
	}
	for _, dt := range o.DTypes {
		if dt != gpu.F32 && dt != gpu.BF16 {
			return fmt.Errorf("bench: gemm: dtype %s: want fp32 or bf16", dt)
		}
	}
	if err := (cpu.Options{Kernel: o.Kernel}).WithDefaults().Validate(); err != nil {
		return fmt.Errorf("bench: gemm: %w", err)
	}
	switch {
	case o.Rows < 1 || o.Rows > 1<<20:
		return fmt.Errorf("bench: gemm: rows %d out of range", o.Rows)
	case o.Workers < 1:
		return fmt.Errorf("bench: gemm: workers %d must be >= 1", o.Workers)
	case !(o.MinSeconds >= 0):
		return fmt.Errorf("bench: gemm: min seconds %v must be >= 0", o.MinSeconds)
	}
	return nil
}

// GemmCase is one measured GEMM: C (m×n) = op(A) · op(B) over k.
type GemmCase struct {
	Layer  string  `json:"layer"`
	Pass   string  `json:"pass"` // forward (Y = X·Wᵀ), backward-input (dX = dY·W), backward-weight (dW += dYᵀ·X)
	M      int     `json:"m"`
	N      int     `json:"n"`
	K      int     `json:"k"`
	TransA bool    `json:"trans_a"`
	TransB bool    `json:"trans_b"`
	DType  string  `json:"dtype"`
	Reps   int     `json:"reps"`
	Secs   float64 `json:"seconds_per_gemm"` // the fastest repetition
	GFLOPS float64 `json:"gflops"`           // 2mnk / Secs / 1e9
	Ratio  float64 `json:"ratio_to_peak"`    // GFLOPS / Peak.GFLOPS
}

// GemmResult is what `strata bench gemm` reports.
type GemmResult struct {
	Shape   string     `json:"shape"`
	Rows    int        `json:"rows"`
	Workers int        `json:"workers"`
	Kernel  string     `json:"kernel"`
	Peak    CPUPeak    `json:"peak"`
	Cases   []GemmCase `json:"cases"`
	// Per dtype: total flops of all cases over their total time (the
	// weighted GEMM rate of one step's linear layers) and its ratio to peak.
	TotalGFLOPS map[string]float64 `json:"total_gflops"`
	TotalRatio  map[string]float64 `json:"total_ratio_to_peak"`
}

// gemmLayerDims returns (in, out) features of a layer.
func gemmLayerDims(s model.Shape, layer string) (int, int) {
	c := s.Dim
	switch layer {
	case "qkv":
		return c, 3 * c
	case "attn-proj":
		return c, c
	case "fc":
		return c, 4 * c
	case "fc-proj":
		return 4 * c, c
	}
	return c, s.Vocab // head: logits = x · wteᵀ
}

// RunGemm measures every (layer, pass, dtype) on one CPU device.
func RunGemm(o GemmOptions) (*GemmResult, error) {
	o = o.WithDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	shape, _ := model.Lookup(o.Shape)
	devs, _, err := cpu.New(cpu.Options{Devices: 1, HBMBytes: 64 * units.GiB, Workers: o.Workers, Kernel: o.Kernel})
	if err != nil {
		return nil, fmt.Errorf("bench: gemm: %w", err)
	}
	dev := devs[0]
	res := &GemmResult{Shape: shape.Name, Rows: o.Rows, Workers: o.Workers, Kernel: dev.Kernel(), Peak: DetectCPUPeak(o.Workers),
		TotalGFLOPS: map[string]float64{}, TotalRatio: map[string]float64{}}
	for _, dt := range o.DTypes {
		var flops, secs float64
		for _, layer := range o.Layers {
			in, out := gemmLayerDims(shape, layer)
			r := o.Rows
			passes := []GemmCase{
				{Pass: "forward", M: r, N: out, K: in, TransB: true},
				{Pass: "backward-input", M: r, N: in, K: out},
				{Pass: "backward-weight", M: out, N: in, K: r, TransA: true},
			}
			for _, c := range passes {
				c.Layer, c.DType = layer, dt.String()
				if err := gemmMeasure(dev, &c, dt, o.MinSeconds); err != nil {
					return nil, err
				}
				if res.Peak.GFLOPS > 0 {
					c.Ratio = c.GFLOPS / res.Peak.GFLOPS
				}
				res.Cases = append(res.Cases, c)
				flops += 2 * float64(c.M) * float64(c.N) * float64(c.K)
				secs += c.Secs
			}
		}
		res.TotalGFLOPS[dt.String()] = flops / secs / 1e9
		if res.Peak.GFLOPS > 0 {
			res.TotalRatio[dt.String()] = res.TotalGFLOPS[dt.String()] / res.Peak.GFLOPS
		}
	}
	return res, nil
}

// gemmMeasure times c on dev: one untimed warm-up when a GEMM is short,
// then repetitions until minSeconds have passed (at least one); the
// fastest repetition counts.
func gemmMeasure(dev *cpu.Device, c *GemmCase, dt gpu.DType, minSeconds float64) error {
	sizes := []int{c.M * c.K, c.K * c.N, c.M * c.N}
	bufs := make([]gpu.Buffer, 3)
	rng := rand.New(rand.NewPCG(uint64(c.M), uint64(c.N)))
	s, ops := dev.DefaultStream(), dev.Ops()
	for i, n := range sizes {
		b, err := dev.Alloc(n, dt, gpu.Tag{Kind: gpu.Workspace, Purpose: "bench gemm"})
		if err != nil {
			return fmt.Errorf("bench: gemm: %w", err)
		}
		defer dev.Free(b)
		host := make([]byte, 4*n)
		for j := 0; j < len(host); j += 4 {
			// Values in [0.5, 1): exponent 0x7e, random mantissa.
			v := rng.Uint32()
			host[j], host[j+1], host[j+2], host[j+3] = byte(v), byte(v>>8), byte(v>>16)&0x7f, 0x3f
		}
		f32, err := dev.Alloc(n, gpu.F32, gpu.Tag{Kind: gpu.Workspace, Purpose: "bench gemm staging"})
		if err != nil {
			return fmt.Errorf("bench: gemm: %w", err)
		}
		dev.CopyHostToDevice(s, f32, 0, host)
		ops.Cast(s, b, f32)
		if err := s.Synchronize(); err != nil {
			return fmt.Errorf("bench: gemm: %w", err)
		}
		dev.Free(f32)
		bufs[i] = b
	}
	beta := float32(0)
	if c.Pass == "backward-weight" {
		beta = 1 // gradients accumulate
	}
	flops := 2 * float64(c.M) * float64(c.N) * float64(c.K)
	run := func() (float64, error) {
		t0 := time.Now()
		ops.Gemm(s, c.TransA, c.TransB, c.M, c.N, c.K, 1, bufs[0], bufs[1], beta, bufs[2])
		if err := s.Synchronize(); err != nil {
			return 0, fmt.Errorf("bench: gemm: %w", err)
		}
		return time.Since(t0).Seconds(), nil
	}
	if flops < 20e9 {
		if _, err := run(); err != nil {
			return err
		}
	}
	var total float64
	best := 0.0
	for c.Reps == 0 || total < minSeconds {
		sec, err := run()
		if err != nil {
			return err
		}
		c.Reps++
		total += sec
		if best == 0 || sec < best {
			best = sec
		}
	}
	c.Secs = best
	c.GFLOPS = flops / best / 1e9
	return nil
}

// String prints the result as a table.
func (r *GemmResult) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "gemm: shape %s, %d rows (B*T), CPU backend with %d workers, %s kernel\n", r.Shape, r.Rows, r.Workers, r.Kernel)
	fmt.Fprintf(&b, "peak: %s\n", r.Peak)
	fmt.Fprintf(&b, "%-10s %-16s %-5s %6s %6s %6s %-6s %5s %10s %9s %7s\n", "layer", "pass", "dtype", "m", "n", "k", "op", "reps", "ms/gemm", "GFLOP/s", "ratio")
	for _, c := range r.Cases {
		op := map[[2]bool]string{{false, false}: "NN", {false, true}: "NT", {true, false}: "TN", {true, true}: "TT"}[[2]bool{c.TransA, c.TransB}]
		fmt.Fprintf(&b, "%-10s %-16s %-5s %6d %6d %6d %-6s %5d %10.2f %9.2f %7.4f\n", c.Layer, c.Pass, c.DType, c.M, c.N, c.K, op, c.Reps, c.Secs*1e3, c.GFLOPS, c.Ratio)
	}
	for _, dt := range []string{"f32", "bf16"} {
		if g, ok := r.TotalGFLOPS[dt]; ok {
			fmt.Fprintf(&b, "all %s GEMMs of a step's linear layers: %.2f GFLOP/s, ratio to peak %.4f\n", dt, g, r.TotalRatio[dt])
		}
	}
	return b.String()
}
