//go:build amd64 && !noasm && !purego

#include "textflag.h"
#include "adam_amd64.h"

// The int8 maps of moments.go, vectorized.
//
// Decode (decodeM, decodeV): from t, the code's magnitude (m: without its
// sign bit 7) shifted left by 20, a normal code's value has the bits t +
// decodeBias; a subnormal one (magnitude under 8) is float32(t) × 2^-20 ×
// the quantum, exactly (no float32 subnormal is formed: they are slow
// operands on some CPUs). m's sign is then copied from bit 7.
//
// Encode (encodeMag): from a = |r| bits, the normal code is
// (a + fracRoundBias + (a>>20)&1)>>20 - biasCode; as a >= minNormal =
// (biasCode+8)<<20 in that branch, the subtraction can come before the
// shift without a borrow: (a + kRnd + (a>>20)&1)>>20 with kRnd =
// fracRoundBias - biasCode<<20 (mod 2^32), then the unsigned min with the
// largest code (NaN). The subnormal code is |r| × subScale (exact)
// converted with VCVTPS2DQ, which rounds to nearest even like
// math.RoundToEven. a > minNormal-1 picks the normal one.

// DEC8_Z: Z12 = value of the magnitudes t in Z10 (dec, subq: the map's
// rows); Z11 and K2 are scratch.
#define DEC8_Z(dec, subq) \
	VPADDD.BCST   dec(AX), Z10, Z11;     \
	VCVTDQ2PS     Z10, Z12;              \
	VMULPS.BCST   subq(AX), Z12, Z12;    \
	VPCMPGTD.BCST kSubCode(AX), Z10, K2; \
	VMOVDQA32     Z11, K2, Z12

// DEC8_Y is DEC8_Z on 8 lanes: Y12 = value of the t in Y10; Y11, Y13
// scratch.
#define DEC8_Y(dec, subq) \
	VPADDD    dec(AX), Y10, Y11;      \
	VCVTDQ2PS Y10, Y12;               \
	VMULPS    subq(AX), Y12, Y12;     \
	VPCMPGTD  kSubCode(AX), Y10, Y13; \
	VBLENDVPS Y13, Y11, Y12, Y12

// ENC8_Z: Z1 = code of |Z0| in a map (subTop, rnd, subS, maxc: its rows),
// without a sign; Z2, Z3 and K2 are scratch.
#define ENC8_Z(subTop, rnd, subS, maxc) \
	VPANDD.BCST    kAbs(AX), Z0, Z1;     \
	VPCMPGTD.BCST  subTop(AX), Z1, K2;   \
	VPSRLD         $20, Z1, Z2;          \
	VPANDD         Z27, Z2, Z2;          \
	VPADDD         Z1, Z2, Z2;           \
	VPADDD.BCST    rnd(AX), Z2, Z2;      \
	VPSRLD         $20, Z2, Z2;          \
	VPMINUD.BCST   maxc(AX), Z2, Z2;     \
	VMULPS.BCST    subS(AX), Z1, Z1;     \
	VCVTPS2DQ.RN_SAE Z1, Z1;             \
	VMOVDQA32      Z2, K2, Z1

// ENC8_Y is ENC8_Z on 8 lanes: Y1 = code of |Y0|; Y2, Y3, Y4 scratch.
#define ENC8_Y(subTop, rnd, subS, maxc) \
	VPAND     kAbs(AX), Y0, Y1;     \
	VPCMPGTD  subTop(AX), Y1, Y4;   \
	VPSRLD    $20, Y1, Y2;          \
	VPAND     kI1(AX), Y2, Y2;      \
	VPADDD    Y1, Y2, Y2;           \
	VPADDD    rnd(AX), Y2, Y2;      \
	VPSRLD    $20, Y2, Y2;          \
	VPMINUD   maxc(AX), Y2, Y2;     \
	VMULPS    subS(AX), Y1, Y3;     \
	VCVTPS2DQ Y3, Y3;               \
	VBLENDVPS Y4, Y2, Y3, Y1

// ENCE_Y is the AVX2 encoding: code = the code of r's magnitude in a map
// (fmin: its smallest normal's bits, an exponent field e0<<23; base:
// -(e0<<3); maxc: its largest code), without m's sign; t is scratch, Y10
// holds kK257. With E the exponent field of r and E' = max(E, e0), r ×
// 2^(3-(E'-127)) is exact (a power of two) and lies in [8, 16] when r is a
// normal code's (E >= e0), in [0, 8] when it is a subnormal one's;
// VCVTPS2DQ rounds it to nearest even (the default MXCSR) into k, the
// rounded 1.fff (8 + the fraction, 16 when it rounds up into the next
// binade) or the subnormal code, so the code is (E'-e0)·8 + k: the
// nearest, ties to even, of both branches of encodeMag at once. k may be
// negative (m) and is 0x80000000 for a NaN r, whose code then exceeds
// maxc before the unsigned min.
// ENCE_Y runs ENCE_K and ENCE_C; m's encoding takes |k| between them.
#define ENCE_Y(r, code, t, fmin, base, maxc) \
	ENCE_K(r, code, t, fmin); \
	ENCE_C(code, t, base, maxc)

// ENCE_K: code = k, t = E'<<23.
#define ENCE_K(r, code, t, fmin) \
	VPAND     kExp(AX), r, t;      \
	VPMAXUD   fmin(AX), t, t;      \
	VPSUBD    t, Y10, code;        \
	VMULPS    code, r, code;       \
	VCVTPS2DQ code, code

// ENCE_C: code = (E'-e0)·8 + k, at most maxc.
#define ENCE_C(code, t, base, maxc) \
	VPSRLD    $20, t, t;           \
	VPADDD    t, code, code;       \
	VPADDD    base(AX), code, code; \
	VPMINUD   maxc(AX), code, code

// STORE8_Y stores the 8 lanes of y (each at most 0xff; x its low half, tx
// scratch) as 8 bytes at mem.
#define STORE8_Y(y, x, tx, mem) \
	VEXTRACTI128 $1, y, tx; \
	VPACKUSDW    tx, x, x;  \
	VPACKUSWB    x, x, x;   \
	VMOVQ        x, mem

// func adamQ8AVX512(k *kconsts, param *float32, grad unsafe.Pointer, mc, vc *uint8, ms, vs *float32, out *uint16, n int, flags uintptr, scratch *q8Scratch)
//
// Int8 moments: refNarrow's loop (moments.go) over n elements, block after
// block of QuantBlock (the last may be shorter), 16 lanes at a time, the
// last vector under a mask (no access past element n-1). The new moments
// of a block wait in scratch (m, then v) while their largest magnitudes
// are reduced:
//
//	for lo := 0; lo < n; lo += QuantBlock {
//		b, hi := lo/QuantBlock, min(lo+QuantBlock, n)
//		var mx, vx uint32
//		for i := lo; i < hi; i++ {
//			mi := decodeM(mc[i]) * ms[b]
//			vi := decodeV(vc[i]) * vs[b]
//			param[i], mi, vi = one(param[i], grad[i], mi, vi) // adamAVX512's loop body
//			if flags&fOut != 0 { out[i] = bf16.FromFloat32(param[i]) }
//			scratch[i-lo], scratch[QuantBlock+i-lo] = mi, vi
//			mx = max(mx, math.Float32bits(mi)&absMask)
//			vx = max(vx, math.Float32bits(vi)&absMask)
//		}
//		ms[b], vs[b] = math.Float32frombits(mx), math.Float32frombits(vx)
//		dm, dv := ms[b], vs[b] // 1 where 0
//		for i := lo; i < hi; i++ {
//			mc[i] = encodeM(scratch[i-lo] / dm)            // VDIVPS: correctly rounded
//			vc[i] = encodeV(scratch[QuantBlock+i-lo] / dv)
//		}
//	}
//
// Registers: Z29, Z30 the block's m and v scales, then divisors; Z31, Z14
// the running largest |m|, |v| bits; R13 the index in the block, R12 the
// elements left in it, R15 its length; ms and vs advance in their
// argument slots.
TEXT ·adamQ8AVX512(SB), NOSPLIT, $0-88
	MOVQ k+0(FP), AX
	MOVQ param+8(FP), SI
	MOVQ grad+16(FP), DX
	MOVQ mc+24(FP), R8
	MOVQ vc+32(FP), R9
	MOVQ out+56(FP), DI
	MOVQ n+64(FP), CX
	MOVQ flags+72(FP), BX
	MOVQ scratch+80(FP), R14
	CONSTS_Z

	// K3: the lanes of the last partial vector (n%16 of them), the only
	// vector that is not full.
	MOVQ  CX, R15
	ANDL  $15, CX
	MOVL  $1, R11
	SHLL  CX, R11
	DECL  R11
	KMOVW R11, K3
	MOVQ  R15, CX

	MOVQ  $64, R10
	TESTQ $fGradBF16, BX
	JZ    q5start
	MOVQ  $32, R10

q5start:
	TESTQ CX, CX
	JLE   q5done

q5block:
	MOVQ         $const_QuantBlock, R15
	CMPQ         CX, R15
	CMOVQLT      CX, R15
	MOVQ         ms+40(FP), R11
	VBROADCASTSS (R11), Z29
	MOVQ         vs+48(FP), R11
	VBROADCASTSS (R11), Z30
	VPXORD       Z31, Z31, Z31
	VPXORD       Z14, Z14, Z14
	XORQ         R13, R13
	MOVQ         R15, R12
	PREFETCHT0   (const_QuantBlock)(R8) // the next block's codes
	PREFETCHT0   (const_QuantBlock+64)(R8)
	PREFETCHT0   (const_QuantBlock+128)(R8)
	PREFETCHT0   (const_QuantBlock+192)(R8)
	PREFETCHT0   (const_QuantBlock)(R9)
	PREFETCHT0   (const_QuantBlock+64)(R9)
	PREFETCHT0   (const_QuantBlock+128)(R9)
	PREFETCHT0   (const_QuantBlock+192)(R9)

q5upd:
	KXNORW K1, K1, K1
	CMPQ   R12, $16
	JAE    q5updgo
	KMOVW  K3, K1

q5updgo:
	PREFETCHT0 1024(SI)
	PREFETCHT0 1024(DX)
	VMOVUPS.Z  (SI), K1, Z0 // x
	TESTQ      $fGradBF16, BX
	JNZ        q5gbf16
	VMOVUPS.Z  (DX), K1, Z1 // g
	JMP        q5gok

q5gbf16:
	VPMOVZXWD.Z (DX), K1, Z1
	VPSLLD      $16, Z1, Z1

q5gok:
	VPMOVZXBD.Z     (R8)(R13*1), K1, Z13 // m codes
	VPSLLD          $20, Z13, Z10
	VPANDD.BCST     kMMag(AX), Z10, Z10
	DEC8_Z(kMDec, kMSubQ)
	VPSLLD          $24, Z13, Z13
	VPTERNLOGD.BCST $0xf8, kSign(AX), Z13, Z12 // Z12 |= Z13 & sign
	VMULPS          Z29, Z12, Z2               // m
	VPMOVZXBD.Z     (R9)(R13*1), K1, Z10       // v codes
	VPSLLD          $20, Z10, Z10
	DEC8_Z(kVDec, kVSubQ)
	VMULPS          Z30, Z12, Z3 // v
	VMULPS      Z16, Z1, Z1         // g = g*gs
	TESTQ       $fL2, BX
	JZ          q5nol2
	VFMADD231PS Z25, Z0, Z1 // g = x*l2 + g

q5nol2:
	ADAM_Z
	VMOVUPS     Z0, K1, (SI)
	VMOVUPS     Z4, (R14)(R13*4)
	VMOVUPS     Z5, (const_QuantBlock*4)(R14)(R13*4)
	VPANDD.BCST kAbs(AX), Z4, Z10
	VPMAXUD     Z10, Z31, K1, Z31
	VPANDD.BCST kAbs(AX), Z5, Z10
	VPMAXUD     Z10, Z14, K1, Z14
	TESTQ       $fOut, BX
	JZ          q5next
	BF16_Z(Z0, Z8, Z9)
	TESTQ       $fOutNT, BX
	JZ          q5outmask
	CMPQ        R12, $16
	JB          q5outmask
	VPMOVDW     Z8, Y8
	VMOVNTDQ    Y8, (DI) // DI is 32-byte aligned under fOutNT
	JMP         q5next

q5outmask:
	VPMOVDW Z8, K1, (DI)

q5next:
	ADDQ $64, SI
	ADDQ R10, DX
	ADDQ $32, DI
	ADDQ $16, R13
	SUBQ $16, R12
	JG   q5upd

	// The block's scales: its largest |m| and |v| bits; divisors 1 where 0.
	VMOVDQA32    Z31, Z10
	MAXU32_Z(Z10, Y10, X10, Y11, X11, R11)
	MOVQ         ms+40(FP), R12
	MOVL         R11, (R12)
	ADDQ         $4, ms+40(FP)
	TESTL        R11, R11
	CMOVLEQ      kOne(AX), R11
	VPBROADCASTD R11, Z29
	VMOVDQA32    Z14, Z10
	MAXU32_Z(Z10, Y10, X10, Y11, X11, R11)
	MOVQ         vs+48(FP), R12
	MOVL         R11, (R12)
	ADDQ         $4, vs+48(FP)
	TESTL        R11, R11
	CMOVLEQ      kOne(AX), R11
	VPBROADCASTD R11, Z30
	XORQ         R13, R13
	MOVQ         R15, R12

q5enc:
	KXNORW K1, K1, K1
	CMPQ   R12, $16
	JAE    q5encgo
	KMOVW  K3, K1

q5encgo:
	VMOVUPS     (R14)(R13*4), Z0
	VDIVPS      Z29, Z0, Z0 // r = m/dm
	ENC8_Z(kMSubTop, kMRnd, kMSubS, kI7F)
	VPSRLD      $24, Z0, Z3
	VPANDD.BCST kI80(AX), Z3, Z3
	VPORD       Z3, Z1, Z1 // m's sign
	VPMOVDB     Z1, K1, (R8)(R13*1)
	VMOVUPS     (const_QuantBlock*4)(R14)(R13*4), Z0
	VDIVPS      Z30, Z0, Z0 // r = v/dv
	ENC8_Z(kVSubTop, kVRnd, kVSubS, kVMax)
	VPMOVDB     Z1, K1, (R9)(R13*1)
	ADDQ        $16, R13
	SUBQ        $16, R12
	JG          q5enc

	ADDQ R15, R8
	ADDQ R15, R9
	SUBQ R15, CX
	JG   q5block

q5done:
	TESTQ $fOutNT, BX
	JZ    q5ret
	SFENCE

q5ret:
	VZEROUPPER
	RET

// func adamQ8AVX2(k *kconsts, param *float32, grad unsafe.Pointer, mc, vc *uint8, ms, vs *float32, out *uint16, n int, flags uintptr, scratch *q8Scratch)
//
// The loop of adamQ8AVX512, 8 lanes at a time; n must be a multiple of
// QuantBlock (the Go caller runs a last, shorter block through refNarrow,
// which gives the same bits). The block's m and v scales wait broadcast in
// scratch after the moments (Y12 and Y13 then hold the divisors); Y14, Y15:
// the running largest |m|, |v| bits; R13: the index in the block.
TEXT ·adamQ8AVX2(SB), NOSPLIT, $0-88
	MOVQ k+0(FP), AX
	MOVQ param+8(FP), SI
	MOVQ grad+16(FP), DX
	MOVQ mc+24(FP), R8
	MOVQ vc+32(FP), R9
	MOVQ out+56(FP), DI
	MOVQ n+64(FP), CX
	MOVQ flags+72(FP), BX
	MOVQ scratch+80(FP), R14

	MOVQ  $32, R10
	TESTQ $fGradBF16, BX
	JZ    q2start
	MOVQ  $16, R10

q2start:
	TESTQ CX, CX
	JLE   q2done

q2block:
	MOVQ         ms+40(FP), R11
	VBROADCASTSS (R11), Y12
	VMOVUPS      Y12, (const_QuantBlock*8)(R14)
	MOVQ         vs+48(FP), R11
	VBROADCASTSS (R11), Y13
	VMOVUPS      Y13, (const_QuantBlock*8+32)(R14)
	VPXOR        Y14, Y14, Y14
	VPXOR        Y15, Y15, Y15
	XORQ         R13, R13
	PREFETCHT0   (const_QuantBlock)(R8) // the next block's codes
	PREFETCHT0   (const_QuantBlock+64)(R8)
	PREFETCHT0   (const_QuantBlock+128)(R8)
	PREFETCHT0   (const_QuantBlock+192)(R8)
	PREFETCHT0   (const_QuantBlock)(R9)
	PREFETCHT0   (const_QuantBlock+64)(R9)
	PREFETCHT0   (const_QuantBlock+128)(R9)
	PREFETCHT0   (const_QuantBlock+192)(R9)

q2upd:
	PREFETCHT0 1024(SI)
	PREFETCHT0 1024(DX)
	VMOVUPS    (SI), Y0
	TESTQ      $fGradBF16, BX
	JNZ        q2gbf16
	VMOVUPS    (DX), Y1
	JMP        q2gok

q2gbf16:
	VPMOVZXWD (DX), Y1
	VPSLLD    $16, Y1, Y1

q2gok:
	VPMOVZXBD (R8)(R13*1), Y8 // m codes
	VPSLLD    $20, Y8, Y10
	VPAND     kMMag(AX), Y10, Y10
	DEC8_Y(kMDec, kMSubQ)
	VPSLLD    $24, Y8, Y8
	VPAND     kSign(AX), Y8, Y8
	VPOR      Y8, Y12, Y2
	VMULPS    (const_QuantBlock*8)(R14), Y2, Y2 // m
	VPMOVZXBD (R9)(R13*1), Y10 // v codes
	VPSLLD    $20, Y10, Y10
	DEC8_Y(kVDec, kVSubQ)
	VMULPS    (const_QuantBlock*8+32)(R14), Y12, Y3 // v
	VMULPS    kGS(AX), Y1, Y1
	TESTQ     $fL2, BX
	JZ        q2nol2
	VFMADD231PS kL2(AX), Y0, Y1

q2nol2:
	ADAM_Y
	VMOVUPS Y0, (SI)
	VMOVUPS Y4, (R14)(R13*4)
	VMOVUPS Y5, (const_QuantBlock*4)(R14)(R13*4)
	VPAND   kAbs(AX), Y4, Y4
	VPMAXUD Y4, Y14, Y14
	VPAND   kAbs(AX), Y5, Y5
	VPMAXUD Y5, Y15, Y15
	TESTQ   $fOut, BX
	JZ      q2next
	BF16_Y(Y0, Y8, Y10, Y9)
	STORE16_Y(Y8, X8, X9, (DI))

q2next:
	ADDQ $32, SI
	ADDQ R10, DX
	ADDQ $16, DI
	ADDQ $8, R13
	CMPQ R13, $const_QuantBlock
	JB   q2upd

	// The block's scales and divisors.
	MAXU32_Y(Y14, X14, X10, R11)
	MOVQ         ms+40(FP), R12
	MOVL         R11, (R12)
	ADDQ         $4, ms+40(FP)
	TESTL        R11, R11
	CMOVLEQ      kOne(AX), R11
	MOVD         R11, X12
	VPBROADCASTD X12, Y12
	MAXU32_Y(Y15, X15, X10, R11)
	MOVQ         vs+48(FP), R12
	MOVL         R11, (R12)
	ADDQ         $4, vs+48(FP)
	TESTL        R11, R11
	CMOVLEQ      kOne(AX), R11
	MOVD         R11, X13
	VPBROADCASTD X13, Y13
	VMOVDQU      kK257(AX), Y10
	VMOVDQU      kPerm(AX), Y11
	XORQ         R13, R13

q2enc:
	VMOVUPS   (R14)(R13*4), Y0
	VDIVPS    Y12, Y0, Y0 // r = m/dm, elements 0..7
	ENCE_K(Y0, Y1, Y2, kMFmin)
	VPABSD    Y1, Y1
	ENCE_C(Y1, Y2, kMBase, kI7F)
	VMOVUPS   32(R14)(R13*4), Y3
	VDIVPS    Y12, Y3, Y3 // 8..15
	ENCE_K(Y3, Y4, Y2, kMFmin)
	VPABSD    Y4, Y4
	ENCE_C(Y4, Y2, kMBase, kI7F)
	VPACKUSDW Y4, Y1, Y1 // the 16 m codes as words (lanes interleaved)
	VPACKSSDW Y3, Y0, Y0 // their r, saturated: a negative r's word has bit 15
	VPSRLW    $8, Y0, Y0
	VPAND     kI80W(AX), Y0, Y0
	VPOR      Y0, Y1, Y1 // m's sign
	VMOVUPS   (const_QuantBlock*4)(R14)(R13*4), Y0
	VDIVPS    Y13, Y0, Y0 // r = v/dv
	ENCE_Y(Y0, Y5, Y2, kVFmin, kVBase, kVMax)
	VMOVUPS   (const_QuantBlock*4+32)(R14)(R13*4), Y3
	VDIVPS    Y13, Y3, Y3
	ENCE_Y(Y3, Y4, Y2, kVFmin, kVBase, kVMax)
	VPACKUSDW Y4, Y5, Y5
	VPACKUSWB Y5, Y1, Y1 // 4-byte groups: m 0-3, 8-11, v 0-3, 8-11 | m 4-7, 12-15, v 4-7, 12-15
	VPERMD    Y1, Y11, Y1 // m 0-15 | v 0-15
	VMOVDQU   X1, (R8)(R13*1)
	VEXTRACTI128 $1, Y1, (R9)(R13*1)
	ADDQ      $16, R13
	CMPQ      R13, $const_QuantBlock
	JB        q2enc

	ADDQ $const_QuantBlock, R8
	ADDQ $const_QuantBlock, R9
	SUBQ $const_QuantBlock, CX
	JG   q2block

q2done:
	VZEROUPPER
	RET
