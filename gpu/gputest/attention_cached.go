package gputest

import (
	"fmt"
	"math"
	"testing"

	"github.com/strata-ai/strata/gpu"
)

// cachedCase is one AttentionCached configuration: a sequence of T tokens
// fed to the op in calls of the given sizes (their sum is T), each call
// appending to caches of capacity T+2 rows of cacheDT.
type cachedCase struct {
	T, H, KV, D int
	calls       []int
	cacheDT     gpu.DType // 0: the storage dtype of the test
	opt         gpu.AttnOptions
}

func (c cachedCase) String() string {
	calls := fmt.Sprint(c.calls)
	if len(c.calls) > 8 {
		calls = fmt.Sprintf("[%d then %d calls of 1]", c.calls[0], len(c.calls)-1)
	}
	return fmt.Sprintf("T%d,H%d,KV%d,D%d,calls%s,%+v", c.T, c.H, c.KV, c.D, calls, c.opt)
}

// prefillThenOnes is calls of a first call of p tokens and then single
// tokens up to t.
func prefillThenOnes(p, t int) []int {
	calls := []int{p}
	for range t - p {
		calls = append(calls, 1)
	}
	return calls
}

// testAttentionCached feeds a sequence to AttentionCached in several
// calls (the prompt in one, then a token at a time, as generation does,
// and other splits) and checks every output row against the float64
// causal attention of the whole sequence (attentionRef), with the keys
// and values as the cache stores them, and the caches' rows: the new
// tokens' keys and values exactly as stored, the rows past the sequence
// untouched.
//
// Cases: one token; a prefill of 70 (across 32- and 64-row tiles);
// decoding across tiles of 64, 128 and 256 keys (up to 300 keys, a
// head dimension of 8, and of 128 with 4 query heads on one key/value
// head); calls of several tokens after the first; an odd head dimension;
// fp32 tokens into a bf16 cache; sliding windows shorter than the cache
// (decoding across tiles with the window's start inside one, a window of
// one key, windows spanning several calls), a soft cap and a custom
// scale.
//
// Tolerance: the outputs as AttentionForward's, 1e-5 of attentionRef's
// magnitude bound plus 2^-8|ref| for a bf16 out (the same sums in another
// grouping).
func testAttentionCached(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	r := newRand(21)
	ops := d.Ops()
	cases := []cachedCase{
		{T: 1, H: 1, KV: 1, D: 64, calls: []int{1}},
		{T: 70, H: 4, KV: 2, D: 64, calls: []int{70}},
		{T: 75, H: 4, KV: 1, D: 128, calls: []int{66, 1, 1, 1, 1, 1, 4}},
		{T: 300, H: 2, KV: 2, D: 8, calls: prefillThenOnes(40, 300)},
		{T: 33, H: 8, KV: 2, D: 5, calls: []int{10, 13, 10}},
		{T: 300, H: 2, KV: 1, D: 8, calls: prefillThenOnes(40, 300), opt: gpu.AttnOptions{Window: 100}},
		{T: 70, H: 4, KV: 2, D: 64, calls: []int{50, 1, 1, 18}, opt: gpu.AttnOptions{Window: 30, SoftCap: 3, Scale: 0.1}},
		{T: 20, H: 4, KV: 1, D: 16, calls: []int{8, 1, 1, 10}, opt: gpu.AttnOptions{Window: 1}},
		{T: 33, H: 8, KV: 2, D: 5, calls: []int{10, 13, 10}, opt: gpu.AttnOptions{Window: 12, SoftCap: 2}},
	}
	if dt == gpu.F32 {
		cases = append(cases, cachedCase{T: 20, H: 4, KV: 2, D: 16, calls: []int{12, 1, 7}, cacheDT: gpu.BF16})
	}
	for _, c := range cases {
		cdt := c.cacheDT
		if cdt == 0 {
			cdt = dt
		}
		ac := attnCase{B: 1, T: c.T, H: c.H, KV: c.KV, D: c.D, opt: c.opt}
		W, kvw, capRows := ac.width(), c.KV*c.D, c.T+2
		qkv := stored(randVals(r, c.T*W, 2), dt)
		// What the cache holds: each token's key and value heads.
		kRows, vRows := make([]float64, c.T*kvw), make([]float64, c.T*kvw)
		for i := range c.T {
			copy(kRows[i*kvw:(i+1)*kvw], stored(qkv[i*W+c.H*c.D:][:kvw], cdt))
			copy(vRows[i*kvw:(i+1)*kvw], stored(qkv[i*W+(c.H+c.KV)*c.D:][:kvw], cdt))
		}
		ref := append([]float64(nil), qkv...)
		for i := range c.T {
			copy(ref[i*W+c.H*c.D:], kRows[i*kvw:(i+1)*kvw])
			copy(ref[i*W+(c.H+c.KV)*c.D:], vRows[i*kvw:(i+1)*kvw])
		}
		gq := upload(t, d, s, qkv, dt)
		gk := upload(t, d, s, constVals(capRows*kvw, math.NaN()), cdt)
		gv := upload(t, d, s, constVals(capRows*kvw, math.NaN()), cdt)
		gout := upload(t, d, s, constVals(c.T*c.H*c.D, math.NaN()), dt)
		start := 0
		for _, n := range c.calls {
			ops.AttentionCached(s, gq.Slice(start*W, n*W), gk, gv, gout.Slice(start*c.H*c.D, n*c.H*c.D), start, n, c.H, c.KV, c.D, c.opt)
			start += n
		}
		if start != c.T {
			t.Fatalf("%v: the calls cover %d tokens", c, start)
		}
		out, _, mag, _, _ := attentionRef(ref, ac)
		checkClose(t, c.String()+" out", download(t, d, s, gout), out, mag, dt, rtolF32)
		for _, side := range []struct {
			what string
			buf  gpu.Buffer
			want []float64
		}{{"k cache", gk, kRows}, {"v cache", gv, vRows}} {
			got := download(t, d, s, side.buf)
			if !equalBits(got[:c.T*kvw], side.want) {
				t.Errorf("%v: the %s rows are not the tokens' heads as stored", c, side.what)
			}
			for i, v := range got[c.T*kvw:] {
				if !math.IsNaN(v) {
					t.Errorf("%v: %s element %d past the sequence was written (%v)", c, side.what, c.T*kvw+i, v)
					break
				}
			}
		}
	}
}
