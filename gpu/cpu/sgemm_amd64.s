//go:build amd64 && !noasm && !purego

#include "textflag.h"

// func sgemmKernel6x32(kc int, a, b, c *float32)
//
// The Go loop it computes (a: kc×6 packed, a[p*6+i]; b: kc×32 packed,
// b[p*32+j]; c: 6×32 row-major, overwritten):
//
//	for i := range 6 { for j := range 32 {
//		var s float32
//		for p := range kc { s = fma(a[p*6+i], b[p*32+j], s) }
//		c[i*32+j] = s
//	}}
//
// Z0..Z11 hold the 6×32 accumulators (two registers per row), Z12 and
// Z13 one row of b, Z14..Z19 the broadcast elements of a.
TEXT ·sgemmKernel6x32(SB), NOSPLIT, $0-32
	MOVQ kc+0(FP), CX
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DI
	MOVQ c+24(FP), DX
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	VPXORD Z8, Z8, Z8
	VPXORD Z9, Z9, Z9
	VPXORD Z10, Z10, Z10
	VPXORD Z11, Z11, Z11
	TESTQ CX, CX
	JEQ store
loop:
	VMOVUPS (DI), Z12
	VMOVUPS 64(DI), Z13
	VBROADCASTSS 0(SI), Z14
	VBROADCASTSS 4(SI), Z15
	VBROADCASTSS 8(SI), Z16
	VBROADCASTSS 12(SI), Z17
	VBROADCASTSS 16(SI), Z18
	VBROADCASTSS 20(SI), Z19
	VFMADD231PS Z12, Z14, Z0
	VFMADD231PS Z13, Z14, Z1
	VFMADD231PS Z12, Z15, Z2
	VFMADD231PS Z13, Z15, Z3
	VFMADD231PS Z12, Z16, Z4
	VFMADD231PS Z13, Z16, Z5
	VFMADD231PS Z12, Z17, Z6
	VFMADD231PS Z13, Z17, Z7
	VFMADD231PS Z12, Z18, Z8
	VFMADD231PS Z13, Z18, Z9
	VFMADD231PS Z12, Z19, Z10
	VFMADD231PS Z13, Z19, Z11
	ADDQ $24, SI
	ADDQ $128, DI
	DECQ CX
	JNE loop
store:
	VMOVUPS Z0, 0(DX)
	VMOVUPS Z1, 64(DX)
	VMOVUPS Z2, 128(DX)
	VMOVUPS Z3, 192(DX)
	VMOVUPS Z4, 256(DX)
	VMOVUPS Z5, 320(DX)
	VMOVUPS Z6, 384(DX)
	VMOVUPS Z7, 448(DX)
	VMOVUPS Z8, 512(DX)
	VMOVUPS Z9, 576(DX)
	VMOVUPS Z10, 640(DX)
	VMOVUPS Z11, 704(DX)
	VZEROUPPER
	RET
