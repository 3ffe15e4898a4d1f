//go:build amd64 && !noasm && !purego

#include "textflag.h"
#include "adam_amd64.h"

// func adamAVX512(k *kconsts, param *float32, grad, m, v unsafe.Pointer, out *uint16, n int, flags uintptr)
//
// It computes, 16 lanes at a time, the last vector under a mask in K1 (no
// access past element n-1), exactly this Go loop (scalars.one in ref.go;
// with flags&fMomBF16 it is refNarrow's loop for bf16 moments):
//
//	for i := 0; i < n; i++ {
//		g := grad[i] * gs                      // grad widened from bf16 when flags&fGradBF16, from fp16 when flags&fGradF16
//		if flags&fL2 != 0 { g = fma32(l2, param[i], g) }
//		mi, vi := m[i], v[i]                   // widened from bf16 when flags&fMomBF16
//		mi = fma32(b1, mi, omb1*g)
//		vi = fma32(b2, vi, (omb2*g)*g)
//		d := fma32(sqrt(vi), invSqrtBC2, eps)  // VSQRTPS: exact IEEE square root
//		param[i] = fma32(negStep, mi/d, param[i]*decay)
//		m[i], v[i] = mi, vi                    // bf16.FromFloat32 of each when flags&fMomBF16
//		if flags&fOut != 0 { out[i] = bf16.FromFloat32(param[i]) } // fp16.FromFloat32 when flags&fOutF16
//	}
//
// The fp16 conversions are VCVTPH2PS (exact) and VCVTPS2PH with imm8 0
// (round to nearest even, from the instruction, not MXCSR): IEEE's, which
// internal/fp16 computes too (kernels_test.go checks every kernel against
// the Go reference, NaN, Inf, subnormals and ties included).
TEXT ·adamAVX512(SB), NOSPLIT, $0-64
	MOVQ k+0(FP), AX
	MOVQ param+8(FP), SI
	MOVQ grad+16(FP), DX
	MOVQ m+24(FP), R8
	MOVQ v+32(FP), R9
	MOVQ out+40(FP), DI
	MOVQ n+48(FP), CX
	MOVQ flags+56(FP), BX
	CONSTS_Z

	// R10, R12: bytes of gradient and of each moment per 16 elements.
	MOVQ  $64, R10
	TESTQ $(fGradBF16|fGradF16), BX
	JZ    a5gstride
	MOVQ  $32, R10

a5gstride:
	MOVQ  $64, R12
	TESTQ $fMomBF16, BX
	JZ    a5start
	MOVQ  $32, R12

a5start:
	TESTQ CX, CX
	JLE   a5done

a5loop:
	CMPQ CX, $16
	JAE  a5full
	MOVL $1, R11
	SHLL CX, R11
	DECL R11
	KMOVW R11, K1
	JMP  a5body

a5full:
	KXNORW K1, K1, K1

a5body:
	// Software prefetch 1 KiB ahead in each input stream (never faults,
	// even past the end): +15% on one core over the hardware prefetchers
	// alone (bench/README-adam.md).
	PREFETCHT0 1024(SI)
	PREFETCHT0 1024(DX)
	PREFETCHT0 1024(R8)
	PREFETCHT0 1024(R9)
	VMOVUPS.Z  (SI), K1, Z0 // x
	TESTQ     $fGradBF16, BX
	JNZ       a5gbf16
	TESTQ     $fGradF16, BX
	JNZ       a5gf16
	VMOVUPS.Z (DX), K1, Z1 // g
	JMP       a5gok

a5gf16:
	// The words under the mask (a masked word load that cannot fault past
	// n), packed back into 16 halves, widened.
	VPMOVZXWD.Z (DX), K1, Z1
	VPMOVDW     Z1, Y1
	VCVTPH2PS   Y1, Z1
	JMP         a5gok

a5gbf16:
	VPMOVZXWD.Z (DX), K1, Z1
	VPSLLD      $16, Z1, Z1

a5gok:
	TESTQ     $fMomBF16, BX
	JNZ       a5mbf16
	VMOVUPS.Z (R8), K1, Z2 // m
	VMOVUPS.Z (R9), K1, Z3 // v
	JMP       a5mok

a5mbf16:
	VPMOVZXWD.Z (R8), K1, Z2
	VPSLLD      $16, Z2, Z2
	VPMOVZXWD.Z (R9), K1, Z3
	VPSLLD      $16, Z3, Z3

a5mok:
	VMULPS    Z16, Z1, Z1  // g = g*gs
	TESTQ     $fL2, BX
	JZ        a5nol2
	VFMADD231PS Z25, Z0, Z1 // g = x*l2 + g

a5nol2:
	ADAM_Z
	VMOVUPS Z0, K1, (SI)
	TESTQ   $fMomBF16, BX
	JNZ     a5smbf16
	VMOVUPS Z4, K1, (R8)
	VMOVUPS Z5, K1, (R9)
	JMP     a5smok

a5smbf16:
	BF16_Z(Z4, Z8, Z9)
	VPMOVDW Z8, K1, (R8)
	BF16_Z(Z5, Z8, Z9)
	VPMOVDW Z8, K1, (R9)

a5smok:
	TESTQ       $fOut, BX
	JZ          a5next
	TESTQ       $fOutF16, BX
	JNZ         a5outf16
	BF16_Z(Z0, Z8, Z9)
	TESTQ     $fOutNT, BX
	JZ        a5outmask
	CMPQ      CX, $16
	JB        a5outmask
	VPMOVDW   Z8, Y8
	VMOVNTDQ  Y8, (DI) // DI is 32-byte aligned under fOutNT
	JMP       a5next

a5outmask:
	VPMOVDW Z8, K1, (DI)
	JMP     a5next

a5outf16:
	VCVTPS2PH $0, Z0, Y8 // round to nearest even
	TESTQ     $fOutNT, BX
	JZ        a5outf16mask
	CMPQ      CX, $16
	JB        a5outf16mask
	VMOVNTDQ  Y8, (DI)
	JMP       a5next

a5outf16mask:
	VPMOVZXWD Y8, Z8
	VPMOVDW   Z8, K1, (DI)

a5next:
	ADDQ $64, SI
	ADDQ R10, DX
	ADDQ R12, R8
	ADDQ R12, R9
	ADDQ $32, DI
	SUBQ $16, CX
	JG   a5loop

a5done:
	TESTQ $fOutNT, BX
	JZ    a5ret
	SFENCE

a5ret:
	VZEROUPPER
	RET

// func adamAVX2(k *kconsts, param *float32, grad, m, v unsafe.Pointer, out *uint16, n int, flags uintptr)
//
// The loop of adamAVX512, 8 lanes at a time; n must be a multiple of 8 (the
// Go caller runs the last n%8 elements through scalars.one, which gives the
// same bits).
TEXT ·adamAVX2(SB), NOSPLIT, $0-64
	MOVQ k+0(FP), AX
	MOVQ param+8(FP), SI
	MOVQ grad+16(FP), DX
	MOVQ m+24(FP), R8
	MOVQ v+32(FP), R9
	MOVQ out+40(FP), DI
	MOVQ n+48(FP), CX
	MOVQ flags+56(FP), BX

	MOVQ  $32, R10
	TESTQ $(fGradBF16|fGradF16), BX
	JZ    a2gstride
	MOVQ  $16, R10

a2gstride:
	MOVQ  $32, R12
	TESTQ $fMomBF16, BX
	JZ    a2start
	MOVQ  $16, R12

a2start:
	TESTQ CX, CX
	JLE   a2done

a2loop:
	PREFETCHT0 1024(SI)
	PREFETCHT0 1024(DX)
	PREFETCHT0 1024(R8)
	PREFETCHT0 1024(R9)
	VMOVUPS    (SI), Y0
	TESTQ   $fGradBF16, BX
	JNZ     a2gbf16
	TESTQ   $fGradF16, BX
	JNZ     a2gf16
	VMOVUPS (DX), Y1
	JMP     a2gok

a2gf16:
	VCVTPH2PS (DX), Y1 // F16C
	JMP       a2gok

a2gbf16:
	VPMOVZXWD (DX), Y1
	VPSLLD    $16, Y1, Y1

a2gok:
	TESTQ   $fMomBF16, BX
	JNZ     a2mbf16
	VMOVUPS (R8), Y2
	VMOVUPS (R9), Y3
	JMP     a2mok

a2mbf16:
	VPMOVZXWD (R8), Y2
	VPSLLD    $16, Y2, Y2
	VPMOVZXWD (R9), Y3
	VPSLLD    $16, Y3, Y3

a2mok:
	VMULPS  kGS(AX), Y1, Y1
	TESTQ   $fL2, BX
	JZ      a2nol2
	VFMADD231PS kL2(AX), Y0, Y1

a2nol2:
	ADAM_Y
	VMOVUPS Y0, (SI)
	TESTQ   $fMomBF16, BX
	JNZ     a2smbf16
	VMOVUPS Y4, (R8)
	VMOVUPS Y5, (R9)
	JMP     a2smok

a2smbf16:
	BF16_Y(Y4, Y8, Y10, Y9)
	STORE16_Y(Y8, X8, X9, (R8))
	BF16_Y(Y5, Y8, Y10, Y9)
	STORE16_Y(Y8, X8, X9, (R9))

a2smok:
	TESTQ $fOut, BX
	JZ    a2next
	TESTQ $fOutF16, BX
	JNZ   a2outf16
	BF16_Y(Y0, Y8, Y10, Y9)
	STORE16_Y(Y8, X8, X9, (DI))
	JMP   a2next

a2outf16:
	VCVTPS2PH $0, Y0, X8 // F16C, round to nearest even
	VMOVDQU   X8, (DI)

a2next:
	ADDQ $32, SI
	ADDQ R10, DX
	ADDQ R12, R8
	ADDQ R12, R9
	ADDQ $16, DI
	SUBQ $8, CX
	JG   a2loop

a2done:
	VZEROUPPER
	RET

// func sumSqAVX512(x unsafe.Pointer, n int, bf16 bool, acc *[16]float64)
//
//	for i := 0; i < n; i++ {
//		f := float64(x[i])                // x widened from bf16 when bf16
//		acc[i%16] = math.FMA(f, f, acc[i%16]) // the square is exact; one rounding
//	}
TEXT ·sumSqAVX512(SB), NOSPLIT, $0-32
	MOVQ    x+0(FP), SI
	MOVQ    n+8(FP), CX
	MOVBLZX bf16+16(FP), BX
	MOVQ    acc+24(FP), DI
	VMOVUPD (DI), Z4
	VMOVUPD 64(DI), Z5
	MOVQ    $64, R10
	TESTQ   BX, BX
	JZ      s5start
	MOVQ    $32, R10

s5start:
	TESTQ CX, CX
	JLE   s5done

s5loop:
	CMPQ CX, $16
	JAE  s5full
	MOVL $1, R11
	SHLL CX, R11
	DECL R11
	KMOVW R11, K1
	JMP  s5body

s5full:
	KXNORW K1, K1, K1

s5body:
	TESTQ BX, BX
	JNZ   s5bf16
	VMOVUPS.Z (SI), K1, Z0
	JMP   s5ok

s5bf16:
	VPMOVZXWD.Z (SI), K1, Z0
	VPSLLD      $16, Z0, Z0

s5ok:
	VEXTRACTF64X4 $1, Z0, Y1
	VCVTPS2PD     Y0, Z2
	VCVTPS2PD     Y1, Z3
	VFMADD231PD   Z2, Z2, Z4
	VFMADD231PD   Z3, Z3, Z5
	ADDQ          R10, SI
	SUBQ          $16, CX
	JG            s5loop

s5done:
	VMOVUPD Z4, (DI)
	VMOVUPD Z5, 64(DI)
	VZEROUPPER
	RET

// func sumSqAVX2(x unsafe.Pointer, n int, bf16 bool, acc *[16]float64)
//
// The loop of sumSqAVX512; n must be a multiple of 16 (the Go caller adds
// the rest in the same lanes).
TEXT ·sumSqAVX2(SB), NOSPLIT, $0-32
	MOVQ    x+0(FP), SI
	MOVQ    n+8(FP), CX
	MOVBLZX bf16+16(FP), BX
	MOVQ    acc+24(FP), DI
	VMOVUPD (DI), Y4
	VMOVUPD 32(DI), Y5
	VMOVUPD 64(DI), Y6
	VMOVUPD 96(DI), Y7
	TESTQ   CX, CX
	JLE     s2done
	TESTQ   BX, BX
	JNZ     s2bf16

s2f32:
	VCVTPS2PD   (SI), Y0
	VCVTPS2PD   16(SI), Y1
	VCVTPS2PD   32(SI), Y2
	VCVTPS2PD   48(SI), Y3
	VFMADD231PD Y0, Y0, Y4
	VFMADD231PD Y1, Y1, Y5
	VFMADD231PD Y2, Y2, Y6
	VFMADD231PD Y3, Y3, Y7
	ADDQ        $64, SI
	SUBQ        $16, CX
	JG          s2f32
	JMP         s2done

s2bf16:
	VPMOVZXWD    (SI), Y8
	VPMOVZXWD    16(SI), Y9
	VPSLLD       $16, Y8, Y8
	VPSLLD       $16, Y9, Y9
	VEXTRACTF128 $1, Y8, X10
	VEXTRACTF128 $1, Y9, X11
	VCVTPS2PD    X8, Y0
	VCVTPS2PD    X10, Y1
	VCVTPS2PD    X9, Y2
	VCVTPS2PD    X11, Y3
	VFMADD231PD  Y0, Y0, Y4
	VFMADD231PD  Y1, Y1, Y5
	VFMADD231PD  Y2, Y2, Y6
	VFMADD231PD  Y3, Y3, Y7
	ADDQ         $32, SI
	SUBQ         $16, CX
	JG           s2bf16

s2done:
	VMOVUPD Y4, (DI)
	VMOVUPD Y5, 32(DI)
	VMOVUPD Y6, 64(DI)
	VMOVUPD Y7, 96(DI)
	VZEROUPPER
	RET

// func maxAbsAVX512(x unsafe.Pointer, n int, bf16 bool) uint32
//
//	var mx uint32
//	for i := 0; i < n; i++ {
//		b := math.Float32bits(x[i]) & 0x7fffffff // x widened from bf16 when bf16
//		mx = max(mx, b)
//	}
//	return mx // >= 0x7f800000 exactly when some x[i] is Inf or NaN
TEXT ·maxAbsAVX512(SB), NOSPLIT, $0-28
	MOVQ    x+0(FP), SI
	MOVQ    n+8(FP), CX
	MOVBLZX bf16+16(FP), BX
	MOVL    $0x7fffffff, R11
	VPBROADCASTD R11, Z6
	VPXORD  Z4, Z4, Z4
	MOVQ    $64, R10
	TESTQ   BX, BX
	JZ      m5start
	MOVQ    $32, R10

m5start:
	TESTQ CX, CX
	JLE   m5done

m5loop:
	CMPQ CX, $16
	JAE  m5full
	MOVL $1, R11
	SHLL CX, R11
	DECL R11
	KMOVW R11, K1
	JMP  m5body

m5full:
	KXNORW K1, K1, K1

m5body:
	TESTQ BX, BX
	JNZ   m5bf16
	VMOVDQU32.Z (SI), K1, Z0
	JMP   m5ok

m5bf16:
	VPMOVZXWD.Z (SI), K1, Z0
	VPSLLD      $16, Z0, Z0

m5ok:
	VPANDD  Z6, Z0, Z0
	VPMAXUD Z0, Z4, Z4
	ADDQ    R10, SI
	SUBQ    $16, CX
	JG      m5loop

m5done:
	VEXTRACTI64X4 $1, Z4, Y5
	VPMAXUD       Y5, Y4, Y4
	VEXTRACTI128  $1, Y4, X5
	VPMAXUD       X5, X4, X4
	VPSHUFD       $0x4e, X4, X5
	VPMAXUD       X5, X4, X4
	VPSHUFD       $0xb1, X4, X5
	VPMAXUD       X5, X4, X4
	VMOVD         X4, AX
	MOVL          AX, ret+24(FP)
	VZEROUPPER
	RET

// func maxAbsAVX2(x unsafe.Pointer, n int, bf16 bool) uint32
//
// The loop of maxAbsAVX512, 8 lanes at a time; n must be a multiple of 8.
TEXT ·maxAbsAVX2(SB), NOSPLIT, $0-28
	MOVQ    x+0(FP), SI
	MOVQ    n+8(FP), CX
	MOVBLZX bf16+16(FP), BX
	MOVL    $0x7fffffff, R11
	MOVD    R11, X6
	VPBROADCASTD X6, Y6
	VPXOR   Y4, Y4, Y4
	MOVQ    $32, R10
	TESTQ   BX, BX
	JZ      m2start
	MOVQ    $16, R10

m2start:
	TESTQ CX, CX
	JLE   m2done

m2loop:
	TESTQ BX, BX
	JNZ   m2bf16
	VMOVDQU (SI), Y0
	JMP   m2ok

m2bf16:
	VPMOVZXWD (SI), Y0
	VPSLLD    $16, Y0, Y0

m2ok:
	VPAND   Y6, Y0, Y0
	VPMAXUD Y0, Y4, Y4
	ADDQ    R10, SI
	SUBQ    $8, CX
	JG      m2loop

m2done:
	VEXTRACTI128 $1, Y4, X5
	VPMAXUD      X5, X4, X4
	VPSHUFD      $0x4e, X4, X5
	VPMAXUD      X5, X4, X4
	VPSHUFD      $0xb1, X4, X5
	VPMAXUD      X5, X4, X4
	VMOVD        X4, AX
	MOVL         AX, ret+24(FP)
	VZEROUPPER
	RET

// func r4w3AVX512(a, b, c, d *float32, n int)
//
// The roofline anchor: the r4w3 loop of membw.c (the team's memory-bandwidth roofline, $MEMBW in bench/adam-vs-membw.sh) (read four
// streams, write three, in place), 16 lanes at a time, masked tail:
//
//	for i := 0; i < n; i++ {
//		p, g, m, v := a[i], b[i], c[i], d[i]
//		m = 0.9*m + 0.1*g
//		v = 0.999*v + 0.001*g*g
//		a[i], c[i], d[i] = p-1e-9*m, m, v
//	}
TEXT ·r4w3AVX512(SB), NOSPLIT, $0-40
	MOVQ a+0(FP), SI
	MOVQ b+8(FP), DX
	MOVQ c+16(FP), R8
	MOVQ d+24(FP), R9
	MOVQ n+32(FP), CX
	MOVL $0x3f666666, R11 // 0.9
	VPBROADCASTD R11, Z16
	MOVL $0x3dcccccd, R11 // 0.1
	VPBROADCASTD R11, Z17
	MOVL $0x3f7fbe77, R11 // 0.999
	VPBROADCASTD R11, Z18
	MOVL $0x3a83126f, R11 // 0.001
	VPBROADCASTD R11, Z19
	MOVL $0xb089705f, R11 // -1e-9 (negated for the FMA)
	VPBROADCASTD R11, Z20
	TESTQ CX, CX
	JLE   r5done

r5loop:
	CMPQ CX, $16
	JAE  r5full
	MOVL $1, R11
	SHLL CX, R11
	DECL R11
	KMOVW R11, K1
	JMP  r5body

r5full:
	KXNORW K1, K1, K1

r5body:
	VMOVUPS.Z   (SI), K1, Z0
	VMOVUPS.Z   (DX), K1, Z1
	VMOVUPS.Z   (R8), K1, Z2
	VMOVUPS.Z   (R9), K1, Z3
	VMULPS      Z17, Z1, Z4
	VFMADD231PS Z16, Z2, Z4
	VMULPS      Z19, Z1, Z5
	VMULPS      Z1, Z5, Z5
	VFMADD231PS Z18, Z3, Z5
	VFMADD231PS Z20, Z4, Z0
	VMOVUPS     Z0, K1, (SI)
	VMOVUPS     Z4, K1, (R8)
	VMOVUPS     Z5, K1, (R9)
	ADDQ        $64, SI
	ADDQ        $64, DX
	ADDQ        $64, R8
	ADDQ        $64, R9
	SUBQ        $16, CX
	JG          r5loop

r5done:
	VZEROUPPER
	RET

// func r4w3AVX2(a, b, c, d *float32, n int)
//
// The loop of r4w3AVX512, 8 lanes at a time; n must be a multiple of 8.
TEXT ·r4w3AVX2(SB), NOSPLIT, $0-40
	MOVQ a+0(FP), SI
	MOVQ b+8(FP), DX
	MOVQ c+16(FP), R8
	MOVQ d+24(FP), R9
	MOVQ n+32(FP), CX
	MOVL $0x3f666666, R11
	MOVD R11, X10
	VPBROADCASTD X10, Y10
	MOVL $0x3dcccccd, R11
	MOVD R11, X11
	VPBROADCASTD X11, Y11
	MOVL $0x3f7fbe77, R11
	MOVD R11, X12
	VPBROADCASTD X12, Y12
	MOVL $0x3a83126f, R11
	MOVD R11, X13
	VPBROADCASTD X13, Y13
	MOVL $0xb089705f, R11
	MOVD R11, X14
	VPBROADCASTD X14, Y14
	TESTQ CX, CX
	JLE   r2done

r2loop:
	VMOVUPS     (SI), Y0
	VMOVUPS     (DX), Y1
	VMOVUPS     (R8), Y2
	VMOVUPS     (R9), Y3
	VMULPS      Y11, Y1, Y4
	VFMADD231PS Y10, Y2, Y4
	VMULPS      Y13, Y1, Y5
	VMULPS      Y1, Y5, Y5
	VFMADD231PS Y12, Y3, Y5
	VFMADD231PS Y14, Y4, Y0
	VMOVUPS     Y0, (SI)
	VMOVUPS     Y4, (R8)
	VMOVUPS     Y5, (R9)
	ADDQ        $32, SI
	ADDQ        $32, DX
	ADDQ        $32, R8
	ADDQ        $32, R9
	SUBQ        $8, CX
	JG          r2loop

r2done:
	VZEROUPPER
	RET
