package cuda

import (
	"fmt"
	"math"
	"os"
	"strings"

	"github.com/strata-ai/strata/gpu"
)

// EnvTensorCoreAttention set to "off" (or "0", "false") keeps attention on
// the CUDA-core kernels (attn_fwd, attn_bwd_dq, attn_bwd_dkv) where the
// tensor-core ones would run, for comparisons: the _tc kernels have run
// in the CPU emulator, not yet on a GPU.
const EnvTensorCoreAttention = "STRATA_TC_ATTENTION"

// The tile shapes of kernels.cu's attention (checked against its #defines
// by TestLaunchBlockSizes). Head dimensions up to attnMaxHeadDim run
// attn_fwd, attn_bwd_dkv and attn_bwd_dq (or the tensor-core kernels);
// past it, up to attnWideHeadDim (Gemma 2 and 3: 256), the _wide builds
// of the same kernels, with fewer rows a tile so that rows of 257 floats
// stay within 48 KiB of static shared memory. The tensor-core kernels
// take no head dimension past attnMaxHeadDim: a wider one runs the wide
// fp32 kernels (tensorCores).
const (
	attnMaxHeadDim     = 128 // ATT_D
	attnFwdRows        = 32  // AF_BQ: query rows of a forward block (and AF_BK keys a tile)
	attnFwdThreads     = 128 // AF_NT
	attnBwdRows        = 16  // AB_BQ = AB_BK: query and key rows of a backward tile
	attnBwdThreads     = 128 // AB_NT
	attnWideHeadDim    = 256 // ATT_WD: the _wide kernels and attn_cached
	attnWideFwdRows    = 16  // AFW_BQ = AFW_BK
	attnWideFwdThreads = 128 // AFW_NT
	attnWideBwdRows    = 8   // ABW_BQ = ABW_BK
	attnWideBwdThreads = 64  // ABW_NT
	attnTCRows         = 64  // TC_BQ: rows of a tensor-core block (queries; dK/dV: keys), 16 a warp
	attnTCThreads      = 128 // TC_NT
)

// attnShape is the launch arithmetic of one attention call: whether the
// fp32 kernels are the wide ones (head dimension past attnMaxHeadDim),
// the number of query tiles of a forward block (fwdTiles) and of a
// backward tile (bwdTiles) of those kernels, and the grids: forward and
// dQ one block per (batch, head, query tile), dK/dV one block per
// (batch, key/value head, key tile). The tensor-core kernels' blocks
// have attnTCRows rows: tcTiles of them per sequence, tcGrid blocks for
// the forward and dQ, tcKVGrid for dK/dV.
type attnShape struct {
	wide                      bool
	fwdTiles, bwdTiles        int
	fwdGrid, dqGrid, dkvGrid  int
	tcTiles, tcGrid, tcKVGrid int
}

func attnShapes(batch, seq, heads, kvHeads, headDim int) attnShape {
	wide := headDim > attnMaxHeadDim
	fr, br := attnFwdRows, attnBwdRows
	if wide {
		fr, br = attnWideFwdRows, attnWideBwdRows
	}
	ft := (seq + fr - 1) / fr
	bt := (seq + br - 1) / br
	tt := (seq + attnTCRows - 1) / attnTCRows
	return attnShape{wide: wide, fwdTiles: ft, bwdTiles: bt, fwdGrid: batch * heads * ft, dqGrid: batch * heads * bt,
		dkvGrid: batch * kvHeads * bt, tcTiles: tt, tcGrid: batch * heads * tt, tcKVGrid: batch * kvHeads * tt}
}

// tensorCores reports whether attention over qkv (and, for the backward,
// dout) runs the mma.sync kernels: q, k, v (and dout) in one 16-bit float
// type (bf16 or f16), a head dimension that is a multiple of 16 and at
// most attnMaxHeadDim (a wider one, Gemma's 256, runs the wide fp32
// kernels: the tensor-core kernels' fragments of 128 dims already spill
// registers in dK/dV), a device of compute capability 8.0 or later, and
// EnvTensorCoreAttention not off.
func (o *kernels) tensorCores(qkv, dout *Buffer, headDim int) bool {
	t := qkv.DType()
	if t != gpu.BF16 && t != gpu.F16 || headDim%16 != 0 || headDim > attnMaxHeadDim || dout != nil && dout.DType() != t ||
		o.d.g.major < 8 {
		return false
	}
	return !envOff(EnvTensorCoreAttention)
}

// envOff reports whether the environment variable name says "off" (or
// "0", "false"; any case, spaces around): the switches that keep a path
// for comparisons (EnvCublasLt, EnvTensorCoreAttention).
func envOff(name string) bool {
	v := strings.ToLower(strings.TrimSpace(os.Getenv(name)))
	return v == "off" || v == "0" || v == "false"
}

// attnCheck returns the error of an attention call the kernels cannot run
// (a head dimension past ATT_WD, a grid past 2^31-1 blocks, a dimension
// past int32), or nil.
func attnCheck(op string, batch, seq, heads, kvHeads, headDim int) error {
	if headDim > attnWideHeadDim {
		return fmt.Errorf("gpu/cuda: %s: head dimension %d; the kernels take at most %d", op, headDim, attnWideHeadDim)
	}
	sh := attnShapes(batch, seq, heads, kvHeads, headDim)
	if seq > math.MaxInt32 || heads+2*kvHeads > math.MaxInt32 || max(sh.fwdGrid, sh.dqGrid, sh.dkvGrid, sh.tcGrid, sh.tcKVGrid) > math.MaxInt32 {
		return fmt.Errorf("gpu/cuda: %s: batch %d, seq %d, heads %d+%d: the grid is past 2^31-1 blocks", op, batch, seq, heads, kvHeads)
	}
	return nil
}

// attnArgs are the kernels' scale, window and cap arguments of opt (the
// front end has checked it: scale and cap finite and >= 0, window >= 0).
type attnArgs struct {
	scale  float32
	window int32
	cap    float32
}

func attnArgsOf(opt gpu.AttnOptions, headDim int) attnArgs {
	return attnArgs{scale: opt.ScaleFor(headDim), window: int32(min(opt.Window, math.MaxInt32)), cap: opt.SoftCap}
}

// AttentionForward: causal grouped-query attention by the flash-attention
// algorithm (attn_fwd): one block of 128 threads per (batch, head, tile of
// 32 query rows), K and V through shared memory 32 rows at a time, online
// softmax in fp32; writes out and lse. No batch×heads×seq×seq storage.
// Where tensorCores holds, attn_fwd_tc instead: tiles of 64 query rows,
// Q·Kᵀ and P·V on tensor cores (mma.sync), P rounded to qkv's dtype.
// A head dimension past 128 runs attn_fwd_wide: blocks of 16 query rows,
// key tiles of 16. An unsupported shape (head dimension past 256) or a
// position outside
// [0, its column] (check_pos) is an error on the stream and leaves out
// and lse unchanged.
//
// opt's scale multiplies the scores, its window makes the blocks start at
// the first key tile their queries see (O(seq·window)), its soft cap
// caps each score with tanhf; the zero value gives the plain attention's
// bits.
func (o *kernels) AttentionForward(s *Stream, qkv, out, lse, pos *Buffer, batch, seq, heads, kvHeads, headDim int, opt gpu.AttnOptions) {
	if err := attnCheck("attention", batch, seq, heads, kvHeads, headDim); err != nil {
		s.fail(err)
		return
	}
	bad := s.checkPos(pos, batch, seq, codeAttnPos)
	sh := attnShapes(batch, seq, heads, kvHeads, headDim)
	a := attnArgsOf(opt, headDim)
	switch {
	case o.tensorCores(qkv, nil, headDim):
		s.launch("attn_fwd_tc", uint32(sh.tcGrid), attnTCThreads, qkv.p(), dt(qkv), out.p(), dt(out), lse.p(), optP(pos),
			int32(seq), int32(heads), int32(kvHeads), int32(headDim), int32(sh.tcTiles), a.scale, a.window, a.cap, bad)
	case sh.wide:
		s.launch("attn_fwd_wide", uint32(sh.fwdGrid), attnWideFwdThreads, qkv.p(), dt(qkv), out.p(), dt(out), lse.p(),
			optP(pos), int32(seq), int32(heads), int32(kvHeads), int32(headDim), int32(sh.fwdTiles), a.scale, a.window, a.cap, bad)
	default:
		s.launch("attn_fwd", uint32(sh.fwdGrid), attnFwdThreads, qkv.p(), dt(qkv), out.p(), dt(out), lse.p(), optP(pos),
			int32(seq), int32(heads), int32(kvHeads), int32(headDim), int32(sh.fwdTiles), a.scale, a.window, a.cap, bad)
	}
}

// AttentionBackward writes dqkv as FlashAttention-2 does, deterministic
// and without atomics: attn_bwd_rowdot computes D_i = rowsum(dout∘out)
// into scratch (batch×heads×seq floats, outside the budget); attn_bwd_dkv
// (one block per (batch, key/value head, tile of 16 keys)) recomputes P
// from lse for each query tile that can see the keys, for the group's
// query heads in order, and writes dK and dV; attn_bwd_dq (one block per
// (batch, head, tile of 16 queries)) loops over the key tiles and writes
// dQ. Where tensorCores holds (dout of qkv's dtype too), attn_bwd_dkv_tc
// and attn_bwd_dq_tc instead: blocks of 64 keys or queries, the products
// on tensor cores, P and dS rounded to qkv's dtype before them. A head
// dimension past 128 runs attn_bwd_dkv_wide and attn_bwd_dq_wide: tiles
// of 8 keys and queries, blocks of 64 threads. dqkv may not alias qkv,
// dout or out. A position outside [0, its
// column] (check_pos) is an error on the stream and leaves dqkv unchanged.
// With opt's window the dK/dV blocks stop at the last query tile that
// sees their keys and the dQ blocks start at the first key tile their
// queries see (O(seq·window)); with its soft cap dS is multiplied by
// 1 - (s/cap)². opt must be the forward's (lse depends on it).
func (o *kernels) AttentionBackward(s *Stream, dout, qkv, out, lse, pos, dqkv *Buffer, batch, seq, heads, kvHeads, headDim int, opt gpu.AttnOptions) {
	if err := attnCheck("attention-backward", batch, seq, heads, kvHeads, headDim); err != nil {
		s.fail(err)
		return
	}
	bad := s.checkPos(pos, batch, seq, codeAttnBwdPos)
	sh := attnShapes(batch, seq, heads, kvHeads, headDim)
	if sh.dkvGrid == 0 && sh.dqGrid == 0 {
		return
	}
	a := attnArgsOf(opt, headDim)
	g := o.d.g
	tc := o.tensorCores(qkv, dout, headDim)
	s.run(func() error {
		n := int64(batch) * int64(heads) * int64(seq)
		drow, free, err := s.scratch(n * 4)
		if err != nil {
			return err
		}
		defer free()
		if err := g.launch(s.h, "attn_bwd_rowdot", g.gridFor(n, 256), 256, 0, dout.p(), dt(dout), out.p(), dt(out), devPtr(drow),
			int32(seq), int32(heads), int32(headDim), n); err != nil {
			return err
		}
		if tc {
			if err := g.launch(s.h, "attn_bwd_dkv_tc", uint32(sh.tcKVGrid), attnTCThreads, 0, dout.p(), dt(dout), qkv.p(), dt(qkv), lse.p(),
				devPtr(drow), optP(pos), dqkv.p(), dt(dqkv), int32(seq), int32(heads), int32(kvHeads), int32(headDim),
				int32(sh.tcTiles), a.scale, a.window, a.cap, bad); err != nil {
				return err
			}
			return g.launch(s.h, "attn_bwd_dq_tc", uint32(sh.tcGrid), attnTCThreads, 0, dout.p(), dt(dout), qkv.p(), dt(qkv), lse.p(),
				devPtr(drow), optP(pos), dqkv.p(), dt(dqkv), int32(seq), int32(heads), int32(kvHeads), int32(headDim),
				int32(sh.tcTiles), a.scale, a.window, a.cap, bad)
		}
		if sh.wide {
			if err := g.launch(s.h, "attn_bwd_dkv_wide", uint32(sh.dkvGrid), attnWideBwdThreads, 0, dout.p(), dt(dout), qkv.p(),
				dt(qkv), lse.p(), devPtr(drow), optP(pos), dqkv.p(), dt(dqkv), int32(seq), int32(heads), int32(kvHeads),
				int32(headDim), int32(sh.bwdTiles), a.scale, a.window, a.cap, bad); err != nil {
				return err
			}
			return g.launch(s.h, "attn_bwd_dq_wide", uint32(sh.dqGrid), attnWideBwdThreads, 0, dout.p(), dt(dout), qkv.p(),
				dt(qkv), lse.p(), devPtr(drow), optP(pos), dqkv.p(), dt(dqkv), int32(seq), int32(heads), int32(kvHeads),
				int32(headDim), int32(sh.bwdTiles), a.scale, a.window, a.cap, bad)
		}
		if err := g.launch(s.h, "attn_bwd_dkv", uint32(sh.dkvGrid), attnBwdThreads, 0, dout.p(), dt(dout), qkv.p(), dt(qkv), lse.p(),
			devPtr(drow), optP(pos), dqkv.p(), dt(dqkv), int32(seq), int32(heads), int32(kvHeads), int32(headDim),
			int32(sh.bwdTiles), a.scale, a.window, a.cap, bad); err != nil {
			return err
		}
		return g.launch(s.h, "attn_bwd_dq", uint32(sh.dqGrid), attnBwdThreads, 0, dout.p(), dt(dout), qkv.p(), dt(qkv), lse.p(),
			devPtr(drow), optP(pos), dqkv.p(), dt(dqkv), int32(seq), int32(heads), int32(kvHeads), int32(headDim),
			int32(sh.bwdTiles), a.scale, a.window, a.cap, bad)
	})
}

// AttentionCached appends the n new tokens' keys and values to the caches
// (kv_append), then attends: with start = 0 and caches of qkv's dtype
// (what the caches hold is qkv's values) by the flash forward attn_fwd on
// the n tokens as one row (attn_fwd_tc where tensorCores holds,
// attn_fwd_wide for a head dimension past 128), its lse
// into stream-ordered scratch; otherwise
// by attn_cached, one block of 256 threads per (new token, head) reading
// the caches (the decode kernel: one token a call; with opt's window only
// the window's rows, O(window) a token). An unsupported shape
// (head dimension past 256, a grid past 2^31-1 blocks) is an error on the
// stream and leaves the caches and out unchanged.
func (o *kernels) AttentionCached(s *Stream, qkv, kc, vc, out *Buffer, start, n, heads, kvHeads, headDim int, opt gpu.AttnOptions) {
	err := attnCheck("attention-cached", 1, start+n, heads, kvHeads, headDim)
	if err == nil && int64(n)*int64(heads) > math.MaxInt32 {
		err = fmt.Errorf("gpu/cuda: attention-cached: %d tokens × %d heads: the grid is past 2^31-1 blocks", n, heads)
	}
	if err != nil {
		s.fail(err)
		return
	}
	if n == 0 || heads == 0 || headDim == 0 {
		return
	}
	a := attnArgsOf(opt, headDim)
	kvN := int64(n) * int64(kvHeads) * int64(headDim)
	s.launchN("kv_append", kvN, qkv.p(), dt(qkv), kc.p(), dt(kc), vc.p(), dt(vc), int32(start), int32(heads), int32(kvHeads),
		int32(headDim), kvN)
	if start > 0 || kc.DType() != qkv.DType() || vc.DType() != qkv.DType() {
		s.launch("attn_cached", uint32(n*heads), rowThreads, qkv.p(), dt(qkv), kc.p(), dt(kc), vc.p(), dt(vc), out.p(), dt(out),
			int32(start), int32(heads), int32(kvHeads), int32(headDim), a.scale, a.window, a.cap)
		return
	}
	sh := attnShapes(1, n, heads, kvHeads, headDim)
	g := o.d.g
	tc := o.tensorCores(qkv, nil, headDim)
	s.run(func() error {
		lse, free, err := s.scratch(int64(heads) * int64(n) * 4)
		if err != nil {
			return err
		}
		defer free()
		if tc {
			return g.launch(s.h, "attn_fwd_tc", uint32(sh.tcGrid), attnTCThreads, 0, qkv.p(), dt(qkv), out.p(), dt(out), devPtr(lse), devPtr(0),
				int32(n), int32(heads), int32(kvHeads), int32(headDim), int32(sh.tcTiles), a.scale, a.window, a.cap, devPtr(0)) // no pos: no check flag
		}
		if sh.wide {
			return g.launch(s.h, "attn_fwd_wide", uint32(sh.fwdGrid), attnWideFwdThreads, 0, qkv.p(), dt(qkv), out.p(), dt(out),
				devPtr(lse), devPtr(0), int32(n), int32(heads), int32(kvHeads), int32(headDim), int32(sh.fwdTiles), a.scale,
				a.window, a.cap, devPtr(0)) // no pos: no check flag
		}
		return g.launch(s.h, "attn_fwd", uint32(sh.fwdGrid), attnFwdThreads, 0, qkv.p(), dt(qkv), out.p(), dt(out), devPtr(lse), devPtr(0),
			int32(n), int32(heads), int32(kvHeads), int32(headDim), int32(sh.fwdTiles), a.scale, a.window, a.cap, devPtr(0)) // no pos: no check flag
	})
}

// ropeFreqs is rope's inverse frequencies as the kernel takes them: by
// value, a struct of gpu.MaxRopeDims/2 floats (kernels.cu's RopeFreqs,
// 1 KiB of the 4 KiB of parameters a launch may pass), so the op needs
// no upload and no scratch, and the caller's slice is copied when the op
// is enqueued.
type ropeFreqs [gpu.MaxRopeDims / 2]float32

// RopeForward rotates the first r.Dims values of the q and k heads of qkv
// in place (rope): one thread per (token, q or k head, pair), angle =
// pos·InvFreq[i] and cos, sin in double in the kernel (no table), times
// r.Scale and rounded to fp32, the rotation in fp32.
func (o *kernels) RopeForward(s *Stream, qkv, pos *Buffer, batch, seq, heads, kvHeads, headDim int, r gpu.Rope) {
	o.rope(s, qkv, pos, batch, seq, heads, kvHeads, headDim, r, 0)
}

// RopeBackward applies the transposed rotation to dqkv in place.
func (o *kernels) RopeBackward(s *Stream, dqkv, pos *Buffer, batch, seq, heads, kvHeads, headDim int, r gpu.Rope) {
	o.rope(s, dqkv, pos, batch, seq, heads, kvHeads, headDim, r, 1)
}

func (o *kernels) rope(s *Stream, qkv, pos *Buffer, batch, seq, heads, kvHeads, headDim int, r gpu.Rope, inverse int32) {
	var inv ropeFreqs
	copy(inv[:], r.InvFreq) // the front end checked len(r.InvFreq) = r.Dims/2 <= len(inv)
	n := int64(batch) * int64(seq) * int64(heads+kvHeads) * int64(r.Dims/2)
	s.launchN("rope", n, qkv.p(), dt(qkv), optP(pos), int32(seq), int32(heads), int32(kvHeads), int32(headDim), &inv,
		r.Scale, int32(r.Dims), inverse, n)
}
