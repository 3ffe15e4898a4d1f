// Shared by adam_amd64.s and moments_amd64.s: the kconsts row offsets, the
// kernel flags and the steps of the update that every Adam kernel repeats.
// Offsets and flags come from the Go constants (go_asm.h), so they cannot
// drift from ref.go and kernels_amd64.go.

#include "go_asm.h"

// Row r of kconsts (ref.go) is 8 copies of one 32-bit value at r*32.
#define kGS      (const_kGradScale*32)
#define kB1      (const_kBeta1*32)
#define kOMB1    (const_kOneMinusB1*32)
#define kB2      (const_kBeta2*32)
#define kOMB2    (const_kOneMinusB2*32)
#define kNEG     (const_kNegStep*32)
#define kINV     (const_kInvSqrtBC2*32)
#define kEPS     (const_kEps*32)
#define kDECAY   (const_kDecay*32)
#define kL2      (const_kL2*32)
#define kI7FFF   (const_kI7FFF*32)
#define kI1      (const_kI1*32)
#define kI40     (const_kI40*32)
#define kAbs     (const_kAbs*32)
#define kI7F     (const_kI7F*32)
#define kI80     (const_kI80*32)
#define kSign    (const_kSign*32)
#define kMMag    (const_kMMag*32)
#define kSubCode (const_kSubCode*32)
#define kMDec    (const_kMDec*32)
#define kVDec    (const_kVDec*32)
#define kVMax    (const_kVMax*32)
#define kOne     (const_kOne*32)
#define kExp     (const_kExp*32)
#define kMFmin   (const_kMFmin*32)
#define kVFmin   (const_kVFmin*32)
#define kK257    (const_kK257*32)
#define kMBase   (const_kMBase*32)
#define kVBase   (const_kVBase*32)
#define kI80W    (const_kI80W*32)
#define kPerm    (const_kPerm*32)
#define kMSubTab (const_kMSubTab*32)
#define kVSubTab (const_kVSubTab*32)

// flags (kernels_amd64.go)
#define fGradBF16 const_fGradBF16
#define fOut      const_fOut
#define fL2       const_fL2
#define fOutNT    const_fOutNT
#define fMomBF16  const_fMomBF16
#define fGradF16  const_fGradF16
#define fOutF16   const_fOutF16

// CONSTS_Z broadcasts the scalars of kconsts at AX into Z16..Z28, where
// ADAM_Z and BF16_Z expect them.
#define CONSTS_Z \
	VBROADCASTSS kGS(AX), Z16;    \
	VBROADCASTSS kB1(AX), Z17;    \
	VBROADCASTSS kOMB1(AX), Z18;  \
	VBROADCASTSS kB2(AX), Z19;    \
	VBROADCASTSS kOMB2(AX), Z20;  \
	VBROADCASTSS kNEG(AX), Z21;   \
	VBROADCASTSS kINV(AX), Z22;   \
	VBROADCASTSS kEPS(AX), Z23;   \
	VBROADCASTSS kDECAY(AX), Z24; \
	VBROADCASTSS kL2(AX), Z25;    \
	VPBROADCASTD kI7FFF(AX), Z26; \
	VPBROADCASTD kI1(AX), Z27;    \
	VPBROADCASTD kI40(AX), Z28

// ADAM_Z is the update of scalars.one after the gradient is scaled (and
// the L2 term added), 16 lanes: from x Z0, g Z1, m Z2, v Z3 it leaves the
// new x in Z0, m in Z4, v in Z5; Z6 and Z7 are scratch.
//
//	m = fma32(b1, m, omb1*g)
//	v = fma32(b2, v, (omb2*g)*g)
//	d = fma32(sqrt(v), invSqrtBC2, eps)
//	x = fma32(negStep, m/d, x*decay)
#define ADAM_Z \
	VMULPS      Z18, Z1, Z4; \
	VFMADD231PS Z17, Z2, Z4; \
	VMULPS      Z20, Z1, Z5; \
	VMULPS      Z1, Z5, Z5;  \
	VFMADD231PS Z19, Z3, Z5; \
	VSQRTPS     Z5, Z6;      \
	VFMADD213PS Z23, Z22, Z6; \
	VDIVPS      Z6, Z4, Z7;  \
	VMULPS      Z24, Z0, Z0; \
	VFMADD231PS Z21, Z7, Z0

// ADAM_Y is ADAM_Z on 8 lanes (Y registers, scalars from the rows at AX).
#define ADAM_Y \
	VMULPS      kOMB1(AX), Y1, Y4; \
	VFMADD231PS kB1(AX), Y2, Y4;   \
	VMULPS      kOMB2(AX), Y1, Y5; \
	VMULPS      Y1, Y5, Y5;        \
	VFMADD231PS kB2(AX), Y3, Y5;   \
	VSQRTPS     Y5, Y6;            \
	VMOVUPS     kINV(AX), Y7;      \
	VFMADD213PS kEPS(AX), Y7, Y6;  \
	VDIVPS      Y6, Y4, Y7;        \
	VMULPS      kDECAY(AX), Y0, Y0; \
	VFMADD231PS kNEG(AX), Y7, Y0

// BF16_Z sets the 32-bit lanes of dst to bf16.FromFloat32 of src's lanes:
// round to nearest even, NaN -> (bits>>16)|0x40; tmp and K2 are scratch.
#define BF16_Z(src, dst, tmp) \
	VPSRLD    $16, src, dst;    \
	VPANDD    Z27, dst, dst;    \
	VPADDD    Z26, dst, dst;    \
	VPADDD    src, dst, dst;    \
	VPSRLD    $16, dst, dst;    \
	VCMPPS    $3, src, src, K2; \
	VPSRLD    $16, src, tmp;    \
	VPORD     Z28, tmp, tmp;    \
	VMOVDQA32 tmp, K2, dst

// BF16_Y is BF16_Z on 8 lanes; tmp and mask are scratch.
#define BF16_Y(src, dst, tmp, mask) \
	VPSRLD    $16, src, dst;         \
	VPAND     kI1(AX), dst, dst;     \
	VPADDD    kI7FFF(AX), dst, dst;  \
	VPADDD    src, dst, dst;         \
	VPSRLD    $16, dst, dst;         \
	VCMPPS    $3, src, src, mask;    \
	VPSRLD    $16, src, tmp;         \
	VPOR      kI40(AX), tmp, tmp;    \
	VBLENDVPS mask, tmp, dst, dst

// STORE16_Y stores the 8 lanes of y (each at most 0xffff; x is its low
// half, tx scratch) as 8 uint16 at mem.
#define STORE16_Y(y, x, tx, mem) \
	VEXTRACTI128 $1, y, tx; \
	VPACKUSDW    tx, x, x;  \
	VMOVDQU      x, mem

// MAXU32_Z leaves in r the largest of the 16 unsigned lanes of z (y and x
// are its low halves; ty, tx scratch); z is overwritten.
#define MAXU32_Z(z, y, x, ty, tx, r) \
	VEXTRACTI64X4 $1, z, ty; \
	VPMAXUD       ty, y, y;  \
	MAXU32_Y(y, x, tx, r)

// MAXU32_Y is MAXU32_Z on 8 lanes.
#define MAXU32_Y(y, x, tx, r) \
	VEXTRACTI128 $1, y, tx;  \
	VPMAXUD      tx, x, x;   \
	VPSHUFD      $0x4e, x, tx; \
	VPMAXUD      tx, x, x;   \
	VPSHUFD      $0xb1, x, tx; \
	VPMAXUD      tx, x, x;   \
	VMOVD        x, r
