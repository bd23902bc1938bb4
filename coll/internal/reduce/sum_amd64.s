#include "textflag.h"

// Element-wise sums with AVX: d[i] = a[i] + b[i], 32 (float32) or 16
// (float64) elements per iteration, then 8 or 4, then one at a time. The
// first operand of every addition is a's element, as in the Go loop (x86
// returns the first operand's NaN when both are NaN), so the bits are
// those of the portable kernel. d may be a or b.

// func addF32AVX(d, a, b *float32, n int)
TEXT ·addF32AVX(SB), NOSPLIT, $0-32
	MOVQ d+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX

f32by32:
	CMPQ    CX, $32
	JLT     f32by8
	VMOVUPS 0(SI), Y0
	VMOVUPS 32(SI), Y1
	VMOVUPS 64(SI), Y2
	VMOVUPS 96(SI), Y3
	VADDPS  0(DX), Y0, Y0
	VADDPS  32(DX), Y1, Y1
	VADDPS  64(DX), Y2, Y2
	VADDPS  96(DX), Y3, Y3
	VMOVUPS Y0, 0(DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	ADDQ    $128, SI
	ADDQ    $128, DX
	ADDQ    $128, DI
	SUBQ    $32, CX
	JMP     f32by32

f32by8:
	CMPQ    CX, $8
	JLT     f32by1
	VMOVUPS 0(SI), Y0
	VADDPS  0(DX), Y0, Y0
	VMOVUPS Y0, 0(DI)
	ADDQ    $32, SI
	ADDQ    $32, DX
	ADDQ    $32, DI
	SUBQ    $8, CX
	JMP     f32by8

f32by1:
	TESTQ  CX, CX
	JEQ    f32done
	VMOVSS 0(SI), X0
	VADDSS 0(DX), X0, X0
	VMOVSS X0, 0(DI)
	ADDQ   $4, SI
	ADDQ   $4, DX
	ADDQ   $4, DI
	DECQ   CX
	JMP    f32by1

f32done:
	VZEROUPPER
	RET

// func addF64AVX(d, a, b *float64, n int)
TEXT ·addF64AVX(SB), NOSPLIT, $0-32
	MOVQ d+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX

f64by16:
	CMPQ    CX, $16
	JLT     f64by4
	VMOVUPD 0(SI), Y0
	VMOVUPD 32(SI), Y1
	VMOVUPD 64(SI), Y2
	VMOVUPD 96(SI), Y3
	VADDPD  0(DX), Y0, Y0
	VADDPD  32(DX), Y1, Y1
	VADDPD  64(DX), Y2, Y2
	VADDPD  96(DX), Y3, Y3
	VMOVUPD Y0, 0(DI)
	VMOVUPD Y1, 32(DI)
	VMOVUPD Y2, 64(DI)
	VMOVUPD Y3, 96(DI)
	ADDQ    $128, SI
	ADDQ    $128, DX
	ADDQ    $128, DI
	SUBQ    $16, CX
	JMP     f64by16

f64by4:
	CMPQ    CX, $4
	JLT     f64by1
	VMOVUPD 0(SI), Y0
	VADDPD  0(DX), Y0, Y0
	VMOVUPD Y0, 0(DI)
	ADDQ    $32, SI
	ADDQ    $32, DX
	ADDQ    $32, DI
	SUBQ    $4, CX
	JMP     f64by4

f64by1:
	TESTQ  CX, CX
	JEQ    f64done
	VMOVSD 0(SI), X0
	VADDSD 0(DX), X0, X0
	VMOVSD X0, 0(DI)
	ADDQ   $8, SI
	ADDQ   $8, DX
	ADDQ   $8, DI
	DECQ   CX
	JMP    f64by1

f64done:
	VZEROUPPER
	RET
