//go:build amd64 && !noasm && !purego

#include "textflag.h"
#include "adam_amd64.h"

// The int8 maps of moments.go, vectorized.
//
// Decode (decodeM, decodeV): from t, the code's magnitude (m: without its
// sign bit 7) shifted left by 20, a normal code's value has the bits t +
// decodeBias; a subnormal one (magnitude under 8) is its fraction (the
// code's low 3 bits) times the quantum, looked up in an 8-entry table
// (VPERMPS), so no float32 subnormal is formed (they are slow operands on
// some CPUs). m's sign is then copied from bit 7, and the value multiplied
// by the block's scale.
//
// Encode (encodeMag) by exponent, both branches at once: see ENCE_Y.

// DECT_Y: Y12 = value of the magnitudes t in Y10 (dec: the map's
// decodeBias row), the subnormal ones from the table tab indexed by the
// low 3 bits (the fraction) of idx's lanes; Y11, Y13 scratch.
#define DECT_Y(dec, tab, idx) \
	VPADDD    dec(AX), Y10, Y11;      \
	VPERMPS   tab(AX), idx, Y12;      \
	VPCMPGTD  kSubCode(AX), Y10, Y13; \
	VBLENDVPS Y13, Y11, Y12, Y12

// DECT_Z is DECT_Y on 16 lanes (VPERMPS indexes 16 lanes by the low 4
// bits: a subnormal code's bit 3 is 0, so the table's first 8 lanes, and
// the next row fills the other 8); K2 is scratch.
#define DECT_Z(dec, tab, idx) \
	VPADDD.BCST   dec(AX), Z10, Z11;     \
	VPERMPS       tab(AX), idx, Z12;     \
	VPCMPGTD.BCST kSubCode(AX), Z10, K2; \
	VMOVDQA32     Z11, K2, Z12

// ENCE_Y: code = the code of r's magnitude in a map
// (fmin: its smallest normal's bits, an exponent field e0<<23; base:
// -(e0<<3); maxc: its largest code), without m's sign; t is scratch, Y10
// holds kK257. With E the exponent field of r and E' = max(E, e0), r ×
// 2^(3-(E'-127)) is exact (a power of two) and lies in [8, 16] when r is a
// normal code's (E >= e0), in [0, 8] when it is a subnormal one's;
// VCVTPS2DQ rounds it to nearest even (the default MXCSR) into k, the
// rounded 1.fff (8 + the fraction, 16 when it rounds up into the next
// binade) or the subnormal code, so the code is (E'-e0)·8 + |k|: the
// nearest, ties to even, of both branches of encodeMag at once. k may be
// negative (r is signed: m, and a v that a corrupt scale made negative,
// whose code is its magnitude's too) and is 0x80000000 for a NaN r, which
// VPABSD keeps, so that its code exceeds maxc before the unsigned min.
#define ENCE_Y(r, code, t, fmin, base, maxc) \
	VPAND     kExp(AX), r, t;       \
	VPMAXUD   fmin(AX), t, t;       \
	VPSUBD    t, Y10, code;         \
	VMULPS    code, r, code;        \
	VCVTPS2DQ code, code;           \
	VPABSD    code, code;           \
	VPSRLD    $20, t, t;            \
	VPADDD    t, code, code;        \
	VPADDD    base(AX), code, code; \
	VPMINUD   maxc(AX), code, code

// ENCE_Z is ENCE_Y on 16 lanes, kK257 in Z31.
#define ENCE_Z(r, code, t, fmin, base, maxc) \
	VPANDD.BCST   kExp(AX), r, t;       \
	VPMAXUD.BCST  fmin(AX), t, t;       \
	VPSUBD        t, Z31, code;         \
	VMULPS        code, r, code;        \
	VCVTPS2DQ.RN_SAE code, code;        \
	VPABSD        code, code;           \
	VPSRLD        $20, t, t;            \
	VPADDD        t, code, code;        \
	VPADDD.BCST   base(AX), code, code; \
	VPMINUD.BCST  maxc(AX), code, code

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
//			param[i], mi, vi = one(param[i], grad[i], mi, vi) // adamAVX512's loop body (grad: fp32, bf16 or fp16)
//			if flags&fOut != 0 { out[i] = bf16.FromFloat32(param[i]) } // fp16.FromFloat32 when flags&fOutF16
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
// the running largest |m|, |v| bits (then Z31 holds kK257 for the
// encoding); R13 the index in the block, R12 the
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
	TESTQ $(fGradBF16|fGradF16), BX
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
	TESTQ      $fGradF16, BX
	JNZ        q5gf16
	VMOVUPS.Z  (DX), K1, Z1 // g
	JMP        q5gok

q5gf16:
	// As adamAVX512: the words under the mask, packed back, widened.
	VPMOVZXWD.Z (DX), K1, Z1
	VPMOVDW     Z1, Y1
	VCVTPH2PS   Y1, Z1
	JMP         q5gok

q5gbf16:
	VPMOVZXWD.Z (DX), K1, Z1
	VPSLLD      $16, Z1, Z1

q5gok:
	VPMOVZXBD.Z     (R8)(R13*1), K1, Z13 // m codes
	VPSLLD          $20, Z13, Z10
	VPANDD.BCST     kMMag(AX), Z10, Z10
	DECT_Z(kMDec, kMSubTab, Z13)
	VPSLLD          $24, Z13, Z13
	VPTERNLOGD.BCST $0xf8, kSign(AX), Z13, Z12 // Z12 |= Z13 & sign
	VMULPS          Z29, Z12, Z2               // m
	VPMOVZXBD.Z     (R9)(R13*1), K1, Z13       // v codes
	VPSLLD          $20, Z13, Z10
	DECT_Z(kVDec, kVSubTab, Z13)
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
	TESTQ       $fOutF16, BX
	JNZ         q5outf16
	BF16_Z(Z0, Z8, Z9)

q5outst:
	TESTQ       $fOutNT, BX
	JZ          q5outmask
	CMPQ        R12, $16
	JB          q5outmask
	VPMOVDW     Z8, Y8
	VMOVNTDQ    Y8, (DI) // DI is 32-byte aligned under fOutNT
	JMP         q5next

q5outmask:
	VPMOVDW Z8, K1, (DI)
	JMP     q5next

q5outf16:
	VCVTPS2PH $0, Z0, Y8 // round to nearest even
	VPMOVZXWD Y8, Z8
	JMP       q5outst

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
	VPBROADCASTD kK257(AX), Z31
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
	ENCE_Z(Z0, Z1, Z2, kMFmin, kMBase, kI7F)
	VPSRLD          $24, Z0, Z3
	VPTERNLOGD.BCST $0xf8, kI80(AX), Z3, Z1 // Z1 |= Z3 & 0x80: m's sign
	VPMOVDB     Z1, K1, (R8)(R13*1)
	VMOVUPS     (const_QuantBlock*4)(R14)(R13*4), Z0
	VDIVPS      Z30, Z0, Z0 // r = v/dv
	ENCE_Z(Z0, Z1, Z2, kVFmin, kVBase, kVMax)
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
// The loop of adamQ8AVX512, 8 lanes at a time (the encoding 16: two
// vectors of m and two of v, their codes packed to bytes together and
// stored as 16 of each); n must be a multiple of QuantBlock (the Go caller
// runs a last, shorter block through refNarrow, which gives the same
// bits). The block's m and v scales wait broadcast in scratch after the
// moments (Y12 and Y13 then hold the divisors, Y10 kK257 and Y11 kPerm);
// Y14, Y15: the running largest |m|, |v| bits; R13: the index in the
// block.
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
	TESTQ $(fGradBF16|fGradF16), BX
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
	TESTQ      $fGradF16, BX
	JNZ        q2gf16
	VMOVUPS    (DX), Y1
	JMP        q2gok

q2gf16:
	VCVTPH2PS (DX), Y1 // F16C
	JMP       q2gok

q2gbf16:
	VPMOVZXWD (DX), Y1
	VPSLLD    $16, Y1, Y1

q2gok:
	VPMOVSXBD (R8)(R13*1), Y8 // m codes, sign-extended
	VPSLLD    $20, Y8, Y9     // bit 31: m's sign; bits 26..20: the magnitude
	VPAND     kMMag(AX), Y9, Y10
	DECT_Y(kMDec, kMSubTab, Y8)
	VPAND     kSign(AX), Y9, Y9
	VPOR      Y9, Y12, Y2
	VMULPS    (const_QuantBlock*8)(R14), Y2, Y2 // m
	VPMOVZXBD (R9)(R13*1), Y8 // v codes
	VPSLLD    $20, Y8, Y10
	DECT_Y(kVDec, kVSubTab, Y8)
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
	TESTQ   $fOutF16, BX
	JNZ     q2outf16
	BF16_Y(Y0, Y8, Y10, Y9)
	STORE16_Y(Y8, X8, X9, (DI))
	JMP     q2next

q2outf16:
	VCVTPS2PH $0, Y0, X8 // F16C, round to nearest even
	VMOVDQU   X8, (DI)

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
	ENCE_Y(Y0, Y1, Y2, kMFmin, kMBase, kI7F)
	VMOVUPS   32(R14)(R13*4), Y3
	VDIVPS    Y12, Y3, Y3 // 8..15
	ENCE_Y(Y3, Y4, Y2, kMFmin, kMBase, kI7F)
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
