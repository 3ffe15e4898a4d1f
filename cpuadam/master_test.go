package cpuadam

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/internal/bf16"
)

// remainderOf is masters x split against their bf16 params (returned).
func remainderOf(x []float32) (Remainder, []uint16) {
	n := len(x)
	r := RemainderView(n, make([]byte, dtype.Rem16.Bytes(n)))
	p := make([]uint16, n)
	bf16.FromFloat32s(p, x)
	r.Split(x, p)
	return r, p
}

// TestRemainderJoinsEveryMaster: for every bf16 high half (all 65,536, so
// both signs, zeros, subnormals, the largest finite values that round to
// infinity, infinities and NaNs) with the low halves around the ties and
// at the ends, Split then Join gives the master's bits back on every ISA,
// at every length mod 8; a signalling NaN (quiet bit clear) comes back a
// NaN. The ties are where sixteen bits would not do: without the up bit
// (Up cleared), the masters just above an even param's tie come back as
// the other tie.
func TestRemainderJoinsEveryMaster(t *testing.T) {
	los := []uint32{0, 1, 0x7fff, 0x8000, 0x8001, 0xfffe, 0xffff, 0x1234}
	var x []float32
	for hi := range uint32(1 << 16) {
		for _, lo := range los {
			x = append(x, math.Float32frombits(hi<<16|lo))
		}
	}
	for _, isa := range allISAs(t) {
		for _, n := range []int{len(x), len(x) - 1, len(x) - 7, 13} {
			x := x[:n]
			r, p := remainderOf(x)
			isa.splitMasters(x, p, r.Lo, r.Up) // each ISA's split, not only Best's
			got := make([]float32, n)
			isa.joinMasters(got, p, r.Lo, r.Up)
			for i := range x {
				b, g := math.Float32bits(x[i]), math.Float32bits(got[i])
				if b != g && !(x[i] != x[i] && b&0x00400000 == 0 && got[i] != got[i]) {
					t.Fatalf("%v n=%d: master %#08x (param %#04x) joined as %#08x", isa, n, b, p[i], g)
				}
			}
		}
	}
	tie := []float32{math.Float32frombits(0x3f808000), math.Float32frombits(0x3f818000)}
	r, p := remainderOf(tie)
	// 0x3f80_8000 is the tie between 0x3f80 (even) and 0x3f81: it rounds
	// to 0x3f80, down; 0x3f81_8000 between 0x3f81 and 0x3f82 (even) rounds
	// up to 0x3f82. Their low halves are the same.
	if p[0] != 0x3f80 || p[1] != 0x3f82 || r.Lo[0] != r.Lo[1] || r.Up[0] != 0b10 {
		t.Fatalf("ties: params %#04x %#04x, low %#04x %#04x, up %#b", p[0], p[1], r.Lo[0], r.Lo[1], r.Up[0])
	}
	alone := []float32{math.Float32frombits(0x3f7f8000), math.Float32frombits(0x3f808000)} // both round to 0x3f80
	r, p = remainderOf(alone)
	if p[0] != p[1] || r.Lo[0] != r.Lo[1] {
		t.Fatalf("two masters with the same param and low half: %#04x %#04x, %#04x %#04x", p[0], p[1], r.Lo[0], r.Lo[1])
	}
	r.Up[0] = 0
	got := make([]float32, 2)
	r.Join(got, p)
	if got[0] == alone[0] {
		t.Fatal("the up bit is not needed: the test does not test it")
	}
}

// TestStepRemainderSameBitsAsF32: a shard whose master is a Remainder
// steps to the bits of the same shard with an fp32 master (the masters
// joined, the params, the moments), for every moment precision, gradient
// dtype, mode and ISA, at lengths around the join's blocks and the bitmap's
// bytes, on one thread and on an Optimizer's four, for ten steps in a row.
func TestStepRemainderSameBitsAsF32(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, isa := range allISAs(t) {
		o, err := New(Options{Threads: 4, ISA: isa, MinTileLen: 300})
		if err != nil {
			t.Fatal(err)
		}
		defer o.Close()
		for _, mo := range []Moments{MomentsF32, MomentsBF16, MomentsInt8} {
			for _, c := range allConfigs() {
				if !c.out {
					continue // the params are the masters' high halves: always written
				}
				for _, n := range []int{1, 7, 8, 9, 255, 1023, 1024, 1025, 2051, 5000} {
					t.Run(fmt.Sprintf("%v/%v/%v/n=%d", isa, mo, c, n), func(t *testing.T) {
						stepRemainderCase(t, r, isa, o, mo, c, n)
					})
				}
			}
		}
	}
}

func stepRemainderCase(t *testing.T, r *rand.Rand, isa ISA, o *Optimizer, mo Moments, c config, n int) {
	s := randState(r, n)
	want := narrowShard(mo, clone(s.param), nil, s.m, s.v, make([]uint16, n))
	got := Shard{M: cloneMoment(want.M), V: cloneMoment(want.V)}
	got.Rem, got.Out = remainderOf(s.param)
	for _, sh := range []*Shard{&want, &got} {
		if c.gradBF16 {
			sh.Grad, sh.Grad16 = nil, s.gradH
		} else {
			sh.Grad = s.grad
		}
	}
	for step := range 10 {
		p := randParams(r, c.mode)
		var k kconsts = makeConsts(p)
		isa.adamShard(&k, p.Mode, want)
		if step%2 == 0 {
			isa.adamShard(&k, p.Mode, got)
		} else {
			o.Step(p, got)
		}
		joined := make([]float32, n)
		got.Rem.Join(joined, got.Out)
		for i := range n {
			if !sameF32(joined[i], want.Param[i]) || got.Out[i] != want.Out[i] {
				t.Fatalf("step %d element %d: master %#08x param %#04x, want %#08x %#04x", step, i,
					math.Float32bits(joined[i]), got.Out[i], math.Float32bits(want.Param[i]), want.Out[i])
			}
		}
		gm, wm := make([]float32, n), make([]float32, n)
		got.M.Decode(gm)
		want.M.Decode(wm)
		gv, wv := make([]float32, n), make([]float32, n)
		got.V.Decode(gv)
		want.V.Decode(wv)
		for i := range n {
			if !sameF32(gm[i], wm[i]) || !sameF32(gv[i], wv[i]) {
				t.Fatalf("step %d element %d: moments differ", step, i)
			}
		}
	}
}

// TestShardRemainderRefused: a Remainder shard without its params, with
// an fp32 master too, or in fp16, is a programming error.
func TestShardRemainderRefused(t *testing.T) {
	n := 16
	s := randState(rand.New(rand.NewPCG(1, 2)), n)
	base := func() Shard {
		sh := narrowShard(MomentsF32, s.param, s.grad, s.m, s.v, nil)
		sh.Param = nil
		sh.Rem, sh.Out = remainderOf(s.param)
		return sh
	}
	for name, bad := range map[string]func(*Shard){
		"no params":   func(sh *Shard) { sh.Out = nil },
		"fp32 master": func(sh *Shard) { sh.Param = s.param },
		"fp16":        func(sh *Shard) { sh.F16 = true },
		"short up":    func(sh *Shard) { sh.Rem.Up = sh.Rem.Up[:1] },
	} {
		sh := base()
		bad(&sh)
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			Step(Params{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, Step: 1, GradScale: 1}, sh)
		}()
	}
}

// BenchmarkStepRemainder times Step with an fp32 master and with a
// Remainder (bf16 gradients, bf16 params written: the engine's bf16 step),
// one thread, per ISA and moment precision, in cache and streaming.
func BenchmarkStepRemainder(b *testing.B) {
	for _, n := range []int{1 << 14, 1 << 23} {
		inputs := sync.OnceValue(func() state { return randState(rand.New(rand.NewPCG(3, uint64(n))), n) })
		for _, isa := range allISAs(b) {
			for _, mo := range []Moments{MomentsF32, MomentsInt8} {
				for _, rem := range []bool{false, true} {
					b.Run(fmt.Sprintf("n=%d/%v/%v/remainder=%v", n, isa, mo, rem), func(b *testing.B) {
						o, err := New(Options{Threads: 1, ISA: isa})
						if err != nil {
							b.Fatal(err)
						}
						defer o.Close()
						s := inputs()
						sh := narrowShard(mo, clone(s.param), nil, s.m, s.v, make([]uint16, n))
						sh.Grad16 = s.gradH
						if rem {
							sh.Rem, sh.Out = remainderOf(sh.Param)
							sh.Param = nil
						}
						p := Params{LR: 1e-3, Beta1: .9, Beta2: .999, Eps: 1e-8, WeightDecay: .01, Step: 1, GradScale: 1}
						for b.Loop() {
							o.Step(p, sh)
						}
						b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "Gparams/s")
					})
				}
			}
		}
	}
}

// fuzzRemainder is FuzzKernels' check of remainder masters on any bits:
// on every ISA, split then join gives every master back (a signalling NaN
// a NaN), and a step of the remainder shard has the fp32 master's bits
// (masters, params, moments; NaNs equal whatever their payload).
func fuzzRemainder(t *testing.T, c config, p Params, s state) {
	n := len(s.param)
	for _, isa := range allISAs(t) {
		r, out := remainderOf(s.param)
		isa.splitMasters(s.param, out, r.Lo, r.Up)
		got := make([]float32, n)
		isa.joinMasters(got, out, r.Lo, r.Up)
		for i := range n {
			if !sameF32(got[i], s.param[i]) {
				t.Fatalf("%v: master %#08x joined as %#08x", isa, math.Float32bits(s.param[i]), math.Float32bits(got[i]))
			}
		}
		if !c.out {
			continue
		}
		want := Shard{Param: clone(s.param), M: Moment{F32: clone(s.m)}, V: Moment{F32: clone(s.v), Second: true}, Out: make([]uint16, n)}
		rem := Shard{Rem: r, Out: out, M: Moment{F32: clone(s.m)}, V: Moment{F32: clone(s.v), Second: true}}
		for _, sh := range []*Shard{&want, &rem} {
			if c.gradBF16 {
				sh.Grad16 = s.gradH
			} else {
				sh.Grad = s.grad
			}
		}
		k := makeConsts(p)
		isa.adamShard(&k, p.Mode, want)
		isa.adamShard(&k, p.Mode, rem)
		rem.Rem.Join(got, rem.Out)
		for i := range n {
			if !sameF32(got[i], want.Param[i]) || !sameBF16(rem.Out[i], want.Out[i]) || !sameF32(rem.M.F32[i], want.M.F32[i]) || !sameF32(rem.V.F32[i], want.V.F32[i]) {
				t.Fatalf("%v %v element %d: the remainder's step differs from the fp32 master's", isa, c, i)
			}
		}
	}
}
