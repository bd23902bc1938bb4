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
