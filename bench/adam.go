package bench

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/strata-ai/strata/cpuadam"
	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/internal/bf16"
	"github.com/strata-ai/strata/internal/fp16"
)

// AdamOptions configure `strata bench adam`: one AdamW step over Params
// parameters, timed Rounds times, alternating with the r4w3 roofline
// (the memory anchor) on the same arrays and threads when Roofline is set.
type AdamOptions struct {
	Params   int             // parameters per step; default 100M (see WithDefaults)
	Threads  int             // kernel threads; default 1
	GradBF16 bool            // bf16 gradients instead of fp32
	GradF16  bool            // fp16 gradients (fp16 mixed precision: the output, with BF16Out, is fp16 too)
	BF16Out  bool            // also write the new params as bf16 (fp16 with GradF16)
	Moments  cpuadam.Moments // stored m and v; narrow ones also time the fp32 step, alternately
	// Remainder keeps the master as the bf16 params (Out: BF16Out is
	// needed) plus a cpuadam.Remainder, and times the fp32 step too,
	// alternately.
	Remainder bool
	ISA       cpuadam.ISA // ISAAuto: the best of this CPU
	Roofline  bool        // measure the r4w3 bandwidth in the same run
	Rounds    int         // timed steps (and roofline passes); default 7
	// Progress, when set, is told after each round; cmd prints it to
	// stderr on long runs.
	Progress func(round, rounds int, elapsed time.Duration)
}

// WithDefaults returns o with its zero fields set to the defaults. Callers
// apply it only to what the user left unset (cmd uses the flags it was
// given), so that an explicit 0 reaches Validate and is refused.
func (o AdamOptions) WithDefaults() AdamOptions {
	if o.Params == 0 {
		o.Params = 100_000_000
	}
	if o.Threads == 0 {
		o.Threads = 1
	}
	if o.Rounds == 0 {
		o.Rounds = 7
	}
	return o
}

// Validate checks o as given; it changes nothing (see WithDefaults).
func (o AdamOptions) Validate() error {
	switch {
	case o.Params < 1 || o.Params > 1<<34:
		return fmt.Errorf("bench: adam: --params %d: want 1 .. %d", o.Params, int64(1)<<34)
	case o.Threads < 1 || o.Threads > 1024:
		return fmt.Errorf("bench: adam: --threads %d: want 1 .. 1024", o.Threads)
	case o.Rounds < 1:
		return fmt.Errorf("bench: adam: --rounds %d: want >= 1", o.Rounds)
	case o.GradBF16 && o.GradF16:
		return errors.New("bench: adam: bf16 and fp16 gradients at once")
	case o.Moments > cpuadam.MomentsInt8:
		return fmt.Errorf("bench: adam: --moments %v: want fp32, bf16 or int8", o.Moments)
	case o.Remainder && (!o.BF16Out || o.GradF16):
		return errors.New("bench: adam: --master bf16+remainder needs --bf16-out (the params are the masters' high halves) and no fp16 gradients")
	case !o.ISA.Supported():
		return fmt.Errorf("bench: adam: --isa %v not supported by this CPU or build (best: %v)", o.ISA, cpuadam.Best())
	}
	return nil
}

// BytesPerParam is the memory traffic one step moves per parameter, as
// counted by the bench: read and write the fp32 param (8), read the
// gradient (4 fp32 or 2 bf16), read and write m and v in their precision
// (fp32 16, bf16 8, int8 4 plus their fp32 scales, 2×2×4 B per block of
// 256: 0.0625), plus 2 for the bf16 output. fp32 gradients: 28, 20 and
// 16.0625 B. A remainder master reads the bf16 params too and reads and
// writes its 2.125 B instead of the fp32 param: 6.25 instead of 8.
func (o AdamOptions) BytesPerParam() float64 {
	n := int64(o.Params)
	b := float64(8+4) + 2*float64(2*o.Moments.Bytes(o.Params))/float64(n)
	if o.Remainder {
		b += 2 + 2*float64(dtype.Rem16.Bytes(o.Params))/float64(n) - 8
	}
	if o.GradBF16 || o.GradF16 {
		b -= 2
	}
	if o.BF16Out {
		b += 2
	}
	return b
}

// AdamResult is what `strata bench adam` reports (--json keeps these names).
type AdamResult struct {
	ISA           string  `json:"isa"`
	Threads       int     `json:"threads"`
	Params        int     `json:"params"`
	Grad          string  `json:"grad"`
	BF16Out       bool    `json:"bf16_out"`
	Moments       string  `json:"moments"` // the precision of m and v actually stored (int8 under 4096 params: fp32)
	Master        string  `json:"master"`  // fp32 or bf16+remainder
	Rounds        int     `json:"rounds"`
	StepSeconds   float64 `json:"step_seconds_median"`
	ParamsPerS    float64 `json:"params_per_s"`
	BytesPerParam float64 `json:"bytes_per_param"`
	GBps          float64 `json:"gbps"`      // median step: BytesPerParam × Params / time, 1 GB = 1e9 B
	GBpsBest      float64 `json:"gbps_best"` // fastest step
	// FP32ParamsPerS is the median speed of the fp32-moment, fp32-master
	// step timed alternately with a narrow one or a remainder master (0
	// otherwise); SpeedupVsFP32 is ParamsPerS / FP32ParamsPerS.
	FP32ParamsPerS float64 `json:"fp32_params_per_s,omitempty"`
	FP32GBps       float64 `json:"fp32_gbps,omitempty"`
	SpeedupVsFP32  float64 `json:"speedup_vs_fp32,omitempty"`
	// RooflineGBps is the median r4w3 bandwidth (28 B per element) measured
	// alternately with the steps; 0 without --roofline.
	RooflineGBps     float64 `json:"roofline_gbps"`
	RooflineGBpsBest float64 `json:"roofline_gbps_best"`
	RooflineISA      string  `json:"roofline_isa,omitempty"`
	Ratio            float64 `json:"ratio_to_roofline"` // GBps / RooflineGBps
}

// RunAdam (o must pass Validate: apply WithDefaults to what the user left
// unset first) allocates the state (param, grad, m, v and the bf16 output;
// with narrow moments also m and v in their precision), runs one untimed
// step of each kind to fault the pages in, then Rounds timed rounds: the
// step, then with narrow moments the fp32 step over the same param and
// gradient, then one r4w3 pass over the same param, grad (fp32), m and v
// (fp32) when Roofline is set; it reports medians.
func RunAdam(o AdamOptions) (AdamResult, error) {
	if err := o.Validate(); err != nil {
		return AdamResult{}, err
	}
	opt, err := cpuadam.New(cpuadam.Options{Threads: o.Threads, ISA: o.ISA})
	if err != nil {
		return AdamResult{}, fmt.Errorf("bench: adam: %w", err)
	}
	defer opt.Close()
	var roof *cpuadam.Optimizer
	if o.Roofline {
		// The anchor always runs the widest vector kernel, so it measures
		// the memory, whatever --isa says.
		if roof, err = cpuadam.New(cpuadam.Options{Threads: o.Threads}); err != nil {
			return AdamResult{}, fmt.Errorf("bench: adam: %w", err)
		}
		defer roof.Close()
	}
	st := newAdamState(o)
	p := cpuadam.Params{LR: 1e-4, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, GradScale: 1, Mode: cpuadam.AdamW}
	narrowStep := func(s int64) time.Duration {
		p.Step = s
		t0 := time.Now()
		opt.Step(p, st.shard)
		return time.Since(t0)
	}
	step := func(s int64) time.Duration {
		p.Step = s
		t0 := time.Now()
		st.step(opt, p, o)
		return time.Since(t0)
	}
	stream := func() time.Duration {
		t0 := time.Now()
		roof.StreamR4W3(st.param, st.gradF, st.m, st.v)
		return time.Since(t0)
	}
	step(1) // first touch of every page; not timed
	if st.narrow {
		narrowStep(1)
	}
	if roof != nil {
		stream()
	}
	var steps, fp32Steps, streams []float64
	start := time.Now()
	for r := range o.Rounds {
		if st.narrow {
			steps = append(steps, narrowStep(int64(r+2)).Seconds())
			fp32Steps = append(fp32Steps, step(int64(r+2)).Seconds())
		} else {
			steps = append(steps, step(int64(r+2)).Seconds())
		}
		if roof != nil {
			streams = append(streams, stream().Seconds())
		}
		if o.Progress != nil {
			o.Progress(r+1, o.Rounds, time.Since(start))
		}
	}
	if cpuadam.NonFinite(st.param) {
		return AdamResult{}, errors.New("bench: adam: params became non-finite (bench bug)")
	}
	res := adamResult(o, opt, st.narrow, steps, fp32Steps)
	if roof != nil {
		med, best := medianMin(streams)
		n := o.Params
		res.RooflineGBps = float64(n) * 28 / med / 1e9
		res.RooflineGBpsBest = float64(n) * 28 / best / 1e9
		res.RooflineISA = roof.Options().ISA.String()
		res.Ratio = res.GBps / res.RooflineGBps
	}
	return res, nil
}

// adamState is RunAdam's state: param, grad (fp32, and bf16 or fp16),
// m, v and the bf16 output; with narrow moments or a remainder master
// also shard, the state in their precision over the same param and
// gradient.
type adamState struct {
	param, m, v, gradF []float32
	gradH, out         []uint16
	narrow             bool
	shard              cpuadam.Shard
}

// newAdamState allocates o's state and fills it with realistic
// magnitudes.
func newAdamState(o AdamOptions) *adamState {
	n := o.Params
	st := &adamState{param: make([]float32, n), m: make([]float32, n), v: make([]float32, n)}
	half := o.GradBF16 || o.GradF16
	if !half || o.Roofline {
		st.gradF = make([]float32, n)
	}
	if half {
		st.gradH = make([]uint16, n)
	}
	st.narrow = o.Moments.For(n) != cpuadam.MomentsF32 || o.Remainder
	if o.BF16Out {
		st.out = make([]uint16, n)
	}
	// Realistic magnitudes; a cheap generator so setup stays short.
	x := uint32(12345)
	for i := range n {
		x = x*1664525 + 1013904223
		f := float32(int32(x)) * 0x1p-31 // [-1, 1)
		st.param[i], st.m[i], st.v[i] = f, f*1e-3, f*f*1e-6
		if st.gradF != nil {
			st.gradF[i] = f * 1e-2
		}
		if st.gradH != nil && o.GradBF16 {
			st.gradH[i] = bf16.FromFloat32(f * 1e-2)
		}
		if st.gradH != nil && o.GradF16 {
			st.gradH[i] = fp16.FromFloat32(f * 1e-2)
		}
	}
	if st.narrow {
		st.shard = narrowShard(o, st, half)
	}
	return st
}

// narrowShard is the state of o's narrow moments (and remainder master)
// over st's param and gradient.
func narrowShard(o AdamOptions, st *adamState, half bool) cpuadam.Shard {
	n := o.Params
	sh := cpuadam.Shard{Param: st.param, Grad: st.gradF, Out: st.out,
		M: o.Moments.View(n, make([]byte, o.Moments.Bytes(n)), false),
		V: o.Moments.View(n, make([]byte, o.Moments.Bytes(n)), true)}
	if half {
		sh.Grad, sh.Grad16, sh.F16 = nil, st.gradH, o.GradF16
	}
	sh.M.Encode(st.m)
	sh.V.Encode(st.v)
	if o.Remainder {
		sh.Out = make([]uint16, n) // not the fp32 step's
		bf16.FromFloat32s(sh.Out, st.param)
		sh.Rem = cpuadam.RemainderView(n, make([]byte, dtype.Rem16.Bytes(n)))
		sh.Rem.Split(st.param, sh.Out)
		sh.Param = nil
	}
	return sh
}

// step runs the fp32-moment step of o's gradient form.
func (st *adamState) step(opt *cpuadam.Optimizer, p cpuadam.Params, o AdamOptions) {
	switch {
	case o.GradF16: // the Shard form: fp16 gradients, fp16 out
		opt.Step(p, cpuadam.Shard{Param: st.param, Grad16: st.gradH, M: cpuadam.Moment{F32: st.m}, V: cpuadam.Moment{F32: st.v, Second: true}, Out: st.out, F16: true})
	case o.GradBF16:
		opt.StepBF16(p, st.param, st.gradH, st.m, st.v, st.out)
	default:
		opt.StepF32(p, st.param, st.gradF, st.m, st.v, st.out)
	}
}

// adamResult is the result of the timed steps (and with narrow state the
// fp32 steps timed alternately with them).
func adamResult(o AdamOptions, opt *cpuadam.Optimizer, narrow bool, steps, fp32Steps []float64) AdamResult {
	n := o.Params
	res := AdamResult{
		ISA: opt.Options().ISA.String(), Threads: opt.Options().Threads, Params: n, Grad: "fp32", BF16Out: o.BF16Out,
		Moments: o.Moments.For(n).String(), Master: "fp32", Rounds: o.Rounds, BytesPerParam: o.BytesPerParam(),
	}
	if o.GradBF16 {
		res.Grad = "bf16"
	}
	if o.Remainder {
		res.Master = "bf16+remainder"
	}
	if o.GradF16 {
		res.Grad = "fp16"
	}
	med, best := medianMin(steps)
	res.StepSeconds = med
	res.ParamsPerS = float64(n) / med
	res.GBps = float64(n) * res.BytesPerParam / med / 1e9
	res.GBpsBest = float64(n) * res.BytesPerParam / best / 1e9
	if narrow {
		fo := o
		fo.Moments, fo.Remainder = cpuadam.MomentsF32, false
		fmed, _ := medianMin(fp32Steps)
		res.FP32ParamsPerS = float64(n) / fmed
		res.FP32GBps = float64(n) * fo.BytesPerParam() / fmed / 1e9
		res.SpeedupVsFP32 = res.ParamsPerS / res.FP32ParamsPerS
	}
	return res
}

func medianMin(xs []float64) (median, minimum float64) {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		median = s[len(s)/2]
	} else {
		median = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	if math.IsNaN(median) {
		return 0, 0
	}
	return median, s[0]
}
