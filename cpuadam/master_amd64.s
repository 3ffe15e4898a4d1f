//go:build amd64 && !noasm && !purego

#include "textflag.h"

// The join and split of a Remainder (master.go's joinRef and splitRef),
// eight masters at a time with AVX2; n is a multiple of 8.

// upBits<>: lane i holds 1<<i, the up bit of master i in its byte.
DATA upBits<>+0(SB)/4, $1
DATA upBits<>+4(SB)/4, $2
DATA upBits<>+8(SB)/4, $4
DATA upBits<>+12(SB)/4, $8
DATA upBits<>+16(SB)/4, $16
DATA upBits<>+20(SB)/4, $32
DATA upBits<>+24(SB)/4, $64
DATA upBits<>+28(SB)/4, $128
GLOBL upBits<>(SB), RODATA|NOPTR, $32

// lowHalves<>: VPSHUFB's control that gathers the low 16 bits of each
// dword of a 128-bit lane into the lane's low 8 bytes.
DATA lowHalves<>+0(SB)/8, $0x0d0c090805040100
DATA lowHalves<>+8(SB)/8, $0x8080808080808080
DATA lowHalves<>+16(SB)/8, $0x0d0c090805040100
DATA lowHalves<>+24(SB)/8, $0x8080808080808080
GLOBL lowHalves<>(SB), RODATA|NOPTR, $32

// func joinAVX2(dst *float32, param, lo *uint16, up *uint8, n int)
//
//	for i := range n {
//		dst[i] = (uint32(param[i]) - up bit i) << 16 | uint32(lo[i])
//	}
TEXT ·joinAVX2(SB), NOSPLIT, $0-40
	MOVQ    dst+0(FP), DI
	MOVQ    param+8(FP), SI
	MOVQ    lo+16(FP), DX
	MOVQ    up+24(FP), BX
	MOVQ    n+32(FP), CX
	VMOVDQU upBits<>(SB), Y3

joinLoop:
	CMPQ         CX, $8
	JB           joinDone
	VPMOVZXWD    (SI), Y0
	VPMOVZXWD    (DX), Y1
	MOVBLZX      (BX), AX
	VMOVD        AX, X2
	VPBROADCASTD X2, Y2
	VPAND        Y3, Y2, Y2
	VPCMPEQD     Y3, Y2, Y2 // -1 where the param was rounded up
	VPADDD       Y2, Y0, Y0
	VPSLLD       $16, Y0, Y0
	VPOR         Y1, Y0, Y0
	VMOVDQU      Y0, (DI)
	ADDQ         $32, DI
	ADDQ         $16, SI
	ADDQ         $16, DX
	INCQ         BX
	SUBQ         $8, CX
	JMP          joinLoop

joinDone:
	VZEROUPPER
	RET

// func splitAVX2(src *float32, param, lo *uint16, up *uint8, n int)
//
//	for i := range n {
//		lo[i] = uint16(src[i]'s bits)
//		up bit i = src[i]'s bits >> 16 != param[i]
//	}
TEXT ·splitAVX2(SB), NOSPLIT, $0-40
	MOVQ    src+0(FP), DI
	MOVQ    param+8(FP), SI
	MOVQ    lo+16(FP), DX
	MOVQ    up+24(FP), BX
	MOVQ    n+32(FP), CX
	VMOVDQU lowHalves<>(SB), Y3

splitLoop:
	CMPQ      CX, $8
	JB        splitDone
	VMOVDQU   (DI), Y0
	VPSRLD    $16, Y0, Y1
	VPMOVZXWD (SI), Y2
	VPCMPEQD  Y2, Y1, Y1 // -1 where the high half is the param
	VMOVMSKPS Y1, AX
	XORL      $0xff, AX
	MOVB      AX, (BX)
	VPSHUFB   Y3, Y0, Y0
	VPERMQ    $0x08, Y0, Y0 // the two lanes' low halves side by side
	VMOVDQU   X0, (DX)
	ADDQ      $32, DI
	ADDQ      $16, SI
	ADDQ      $16, DX
	INCQ      BX
	SUBQ      $8, CX
	JMP       splitLoop

splitDone:
	VZEROUPPER
	RET

// func joinAVX512(dst *float32, param, lo *uint16, up *uint8, n int)
//
// joinAVX2 sixteen at a time: two bytes of up bits are a mask.
TEXT ·joinAVX512(SB), NOSPLIT, $0-40
	MOVQ         dst+0(FP), DI
	MOVQ         param+8(FP), SI
	MOVQ         lo+16(FP), DX
	MOVQ         up+24(FP), BX
	MOVQ         n+32(FP), CX
	VPTERNLOGD   $0xff, Z3, Z3, Z3 // -1 in every lane

join512Loop:
	CMPQ      CX, $16
	JB        join512Done
	VPMOVZXWD (SI), Z0
	VPMOVZXWD (DX), Z1
	KMOVW     (BX), K1
	VPADDD    Z3, Z0, K1, Z0 // the rounded-up params less one
	VPSLLD    $16, Z0, Z0
	VPORD     Z1, Z0, Z0
	VMOVDQU32 Z0, (DI)
	ADDQ      $64, DI
	ADDQ      $32, SI
	ADDQ      $32, DX
	ADDQ      $2, BX
	SUBQ      $16, CX
	JMP       join512Loop

join512Done:
	VZEROUPPER
	RET

// func splitAVX512(src *float32, param, lo *uint16, up *uint8, n int)
//
// splitAVX2 sixteen at a time: the comparison's mask is the two bytes of
// up bits, VPMOVDW stores the low halves.
TEXT ·splitAVX512(SB), NOSPLIT, $0-40
	MOVQ src+0(FP), DI
	MOVQ param+8(FP), SI
	MOVQ lo+16(FP), DX
	MOVQ up+24(FP), BX
	MOVQ n+32(FP), CX

split512Loop:
	CMPQ      CX, $16
	JB        split512Done
	VMOVDQU32 (DI), Z0
	VPSRLD    $16, Z0, Z1
	VPMOVZXWD (SI), Z2
	VPCMPD    $4, Z2, Z1, K1 // not equal: rounded up
	KMOVW     K1, (BX)
	VPMOVDW   Z0, (DX)
	ADDQ      $64, DI
	ADDQ      $32, SI
	ADDQ      $32, DX
	ADDQ      $2, BX
	SUBQ      $16, CX
	JMP       split512Loop

split512Done:
	VZEROUPPER
	RET
