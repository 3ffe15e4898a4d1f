package cpuadam

import (
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/strata-ai/strata/internal/bf16"
	"github.com/strata-ai/strata/internal/leaktest"
)

func allISAs(t testing.TB) []ISA { return append(vectorISAs(t), ISAGo) }

// TestOptimizerSameBitsAnyThreads: the pool gives the reference's bits for
// every ISA, thread count and tile size, on slices whose start is not
// 64-byte aligned.
func TestOptimizerSameBitsAnyThreads(t *testing.T) {
	r := rand.New(rand.NewPCG(12, 13))
	const n = 5000 + 13
	s := randState(r, n+3)
	s = state{s.param[3:], s.grad[3:], s.m[3:], s.v[3:], s.gradH[3:]} // misaligned starts
	for _, c := range allConfigs() {
		p := randParams(r, c.mode)
		want := state{clone(s.param), nil, clone(s.m), clone(s.v), nil}
		wantOut := make([]uint16, n)
		if c.gradBF16 {
			refStepBF16(p, want.param, s.gradH, want.m, want.v, wantOut)
		} else {
			refStepF32(p, want.param, s.grad, want.m, want.v, wantOut)
		}
		for _, isa := range allISAs(t) {
			for _, threads := range []int{1, 2, 3, 7} {
				o, err := New(Options{Threads: threads, ISA: isa, MinTileLen: 100})
				if err != nil {
					t.Fatal(err)
				}
				got := state{clone(s.param), nil, clone(s.m), clone(s.v), nil}
				var out []uint16
				if c.out {
					out = make([]uint16, n)
				}
				if c.gradBF16 {
					o.StepBF16(p, got.param, s.gradH, got.m, got.v, out)
				} else {
					o.StepF32(p, got.param, s.grad, got.m, got.v, out)
				}
				for i := range n {
					if !sameF32(got.param[i], want.param[i]) || !sameF32(got.m[i], want.m[i]) || !sameF32(got.v[i], want.v[i]) ||
						(c.out && !sameBF16(out[i], wantOut[i])) {
						t.Fatalf("%v threads=%d %v: element %d differs from the reference", isa, threads, c, i)
					}
				}
				if err := o.Close(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

func TestOptimizerReductionsSameBitsAnyThreads(t *testing.T) {
	r := rand.New(rand.NewPCG(14, 15))
	n := 5*sumBlockLen + 77
	x := make([]float32, n)
	xh := make([]uint16, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(13)-6)))
		xh[i] = bf16.FromFloat32(x[i])
	}
	want, wantH := sumSquares(ISAGo, x, nil), sumSquares(ISAGo, nil, xh)
	if SumSquares(x) != want || SumSquaresBF16(xh) != wantH {
		t.Fatalf("plain SumSquares %v %v, reference %v %v", SumSquares(x), SumSquaresBF16(xh), want, wantH)
	}
	for _, isa := range allISAs(t) {
		for _, threads := range []int{1, 2, 3, 7} {
			o, err := New(Options{Threads: threads, ISA: isa, MinTileLen: 1000})
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range []int{0, 1, 100, sumBlockLen + 1, n} {
				w, wh := sumSquares(ISAGo, x[:m], nil), sumSquares(ISAGo, nil, xh[:m])
				if got, gotH := o.SumSquares(x[:m]), o.SumSquaresBF16(xh[:m]); got != w || gotH != wh {
					t.Fatalf("%v threads=%d n=%d: sum of squares %v %v, reference %v %v", isa, threads, m, got, gotH, w, wh)
				}
			}
			if o.NonFinite(x) || o.NonFiniteBF16(xh) || o.NonFinite(nil) || o.NonFiniteBF16(nil) {
				t.Fatalf("%v threads=%d: finite data reported non-finite", isa, threads)
			}
			for _, pos := range []int{0, n / 3, n - 1} {
				x[pos], xh[pos] = float32(math.Inf(-1)), 0x7fc1
				if !o.NonFinite(x) || !o.NonFiniteBF16(xh) {
					t.Fatalf("%v threads=%d: non-finite at %d not seen", isa, threads, pos)
				}
				x[pos], xh[pos] = 1, 0x3f80
			}
			o.Close()
		}
	}
}

func TestOptimizerOptions(t *testing.T) {
	if err := (Options{Threads: -1}).Validate(); err == nil {
		t.Fatal("threads -1 accepted")
	}
	if err := (Options{Threads: maxThreads + 1}).Validate(); err == nil {
		t.Fatal("too many threads accepted")
	}
	if err := (Options{ISA: isaCount}).Validate(); err == nil {
		t.Fatal("unknown isa accepted")
	}
	o, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := o.Options(); got.Threads != runtime.GOMAXPROCS(0) || got.ISA != Best() {
		t.Fatalf("defaults %v", got)
	}
	o.Close()
	o.Close() // twice is fine
	defer func() {
		if recover() == nil {
			t.Fatal("use after Close did not panic")
		}
	}()
	o.StepF32(Params{LR: 1, Beta1: .9, Beta2: .9, Eps: 1, Step: 1, GradScale: 1}, []float32{1}, []float32{1}, []float32{0}, []float32{0}, nil)
}

func TestISANames(t *testing.T) {
	for i := ISAAuto; i < isaCount; i++ {
		if j, err := ParseISA(i.String()); err != nil || j != i {
			t.Fatalf("ParseISA(%q) = %v, %v", i.String(), j, err)
		}
	}
	if _, err := ParseISA("sse"); err == nil {
		t.Fatal("sse accepted")
	}
	if !ISAGo.Supported() || !Best().Supported() {
		t.Fatal("go or best unsupported")
	}
	t.Logf("best isa here: %v", Best())
}

func TestLengthMismatchPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	StepF32(Params{}, make([]float32, 3), make([]float32, 2), make([]float32, 3), make([]float32, 3), nil)
}

// FuzzKernels compares every ISA with the reference on arbitrary bit
// patterns (NaN, Inf, subnormals included) and arbitrary lengths, with
// fp32 moments and then with bf16 and int8 ones (fuzzNarrow). Its seeds
// run under plain go test.
func FuzzKernels(f *testing.F) {
	f.Add([]byte{}, uint8(0), 1e-3, 0.01, uint16(1))
	f.Add([]byte("\x00\x00\x80\x7f\x01\x00\xc0\x7f\x00\x00\x80\x3f\xff\xff\x7f\x7f\x01\x00\x00\x00"), uint8(3), 0.1, 0.0, uint16(7))
	f.Add(make([]byte, 16*17*2+5), uint8(6), 1e-4, 0.1, uint16(1000))
	seed := make([]byte, 1200)
	for i := range seed {
		seed[i] = byte(i*131 + i/7)
	}
	f.Add(seed, uint8(5), 3e-3, 1e-2, uint16(42))
	long := make([]byte, 16*(2*QuantBlock+21)) // two int8 blocks and a partial one
	for i := range long {
		long[i] = byte(i*37 + i/16*11 + i/97)
	}
	f.Add(long, uint8(2), 1e-3, 1e-1, uint16(9))
	f.Fuzz(func(t *testing.T, data []byte, variant uint8, lr, wd float64, step uint16) {
		c := allConfigs()[int(variant)%len(allConfigs())]
		n := len(data) / 16
		p := Params{LR: math.Abs(lr), Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: math.Abs(wd), Step: int64(step) + 1, GradScale: 0.5, Mode: c.mode}
		if p.Validate() != nil {
			return
		}
		s := state{make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n), make([]uint16, n)}
		mw, vw := make([]uint32, n), make([]uint32, n)
		for i := range n {
			w := func(j int) uint32 {
				b := data[16*i+4*j:]
				return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
			}
			s.param[i], s.grad[i], s.m[i] = math.Float32frombits(w(0)), math.Float32frombits(w(1)), math.Float32frombits(w(2))
			s.v[i] = math.Float32frombits(w(3) &^ (1 << 31)) // v >= 0 (or NaN) as Adam keeps it
			s.gradH[i] = uint16(w(1) >> 16)
			mw[i], vw[i] = w(2), w(3)
		}
		for _, isa := range vectorISAs(t) {
			runCase(t, isa, c, p, s, offsets{int(variant) % 16, int(step) % 16, 1, 2, int(step) % 32})
		}
		fuzzNarrow(t, c, p, s, mw, vw, variant, step)
		fuzzRemainder(t, c, p, s)
		x := s.grad
		want := sumSquares(ISAGo, x, nil)
		for _, isa := range vectorISAs(t) {
			if got := sumSquares(isa, x, nil); got != want && !(got != got && want != want) {
				t.Fatalf("%v: sum of squares %v, reference %v", isa, got, want)
			}
			if isa.maxAbsF32(x) != maxAbsGoF32(x) || isa.maxAbsBF16(s.gradH) != maxAbsGoBF16(s.gradH) {
				t.Fatalf("%v: non-finite check differs", isa)
			}
		}
	})
}

// TestCloseStopsWorkers: Close stops every worker goroutine of the
// optimizers, whatever their thread count and ISA, and twice is harmless.
func TestCloseStopsWorkers(t *testing.T) {
	leaktest.Check(t)
	for _, isa := range allISAs(t) {
		for _, threads := range []int{1, 2, 5} {
			o, err := New(Options{Threads: threads, ISA: isa, MinTileLen: 16})
			if err != nil {
				t.Fatal(err)
			}
			n := 1000
			param, grad, m, v := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
			for i := range grad {
				grad[i] = float32(i%7) - 3
			}
			o.StepF32(Params{LR: 1e-3, Beta1: .9, Beta2: .999, Eps: 1e-8, Step: 1, GradScale: 1}, param, grad, m, v, nil)
			if err := o.Close(); err != nil {
				t.Fatal(err)
			}
			if err := o.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
}
