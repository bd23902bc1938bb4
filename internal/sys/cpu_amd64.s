//go:build !race

#include "textflag.h"

// func movsb(dst, src unsafe.Pointer, n int)
TEXT ·movsb(SB), NOSPLIT, $0-24
	MOVQ	dst+0(FP), DI
	MOVQ	src+8(FP), SI
	MOVQ	n+16(FP), CX
	REP;	MOVSB
	RET

// func storeRel64(p *uint64, v uint64)
TEXT ·storeRel64(SB), NOSPLIT, $0-16
	MOVQ	p+0(FP), AX
	MOVQ	v+8(FP), BX
	MOVQ	BX, (AX)
	RET

// func rdtsc() int64
TEXT ·rdtsc(SB), NOSPLIT, $0-8
	RDTSC
	SHLQ	$32, DX
	ORQ	DX, AX
	MOVQ	AX, ret+0(FP)
	RET

// func cpuid(eax, ecx uint32) (a, b, c, d uint32)
TEXT ·cpuid(SB), NOSPLIT, $0-24
	MOVL	eax+0(FP), AX
	MOVL	ecx+4(FP), CX
	CPUID
	MOVL	AX, a+8(FP)
	MOVL	BX, b+12(FP)
	MOVL	CX, c+16(FP)
	MOVL	DX, d+20(FP)
	RET

// func copyAVX512(dst, src unsafe.Pointer, n int)
// n is a positive multiple of 256.
TEXT ·copyAVX512(SB), NOSPLIT, $0-24
	MOVQ	dst+0(FP), DI
	MOVQ	src+8(FP), SI
	MOVQ	n+16(FP), CX
loop:
	VMOVDQU64	0(SI), Z0
	VMOVDQU64	64(SI), Z1
	VMOVDQU64	128(SI), Z2
	VMOVDQU64	192(SI), Z3
	VMOVDQU64	Z0, 0(DI)
	VMOVDQU64	Z1, 64(DI)
	VMOVDQU64	Z2, 128(DI)
	VMOVDQU64	Z3, 192(DI)
	ADDQ	$256, SI
	ADDQ	$256, DI
	SUBQ	$256, CX
	JNZ	loop
	VZEROUPPER
	RET
