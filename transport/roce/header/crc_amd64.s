#include "textflag.h"

// CRC-32 (IEEE, reflected) by folding with carry-less multiplication in
// four 512-bit registers (AVX-512 VPCLMULQDQ), 256 bytes a step. Each
// 128-bit lane of a register is folded across D bits of the message by
// lo·K1 ^ hi·K2, with K1 = x^(D+32) and K2 = x^(D-32) mod P, bit-reflected
// and shifted left by one (the form of the kernel's 128-bit constants;
// D = 512 gives its 0x154442bd4 and 0x1c6e41596). What is left is one
// 128-bit remainder whose CRC, followed by the unfolded tail, is the CRC
// of the whole (crc_amd64.go finishes it).

DATA k2048<>+0(SB)/8, $0x11542778a
DATA k2048<>+8(SB)/8, $0x1322d1430
GLOBL k2048<>(SB), RODATA|NOPTR, $16

DATA k512<>+0(SB)/8, $0x154442bd4
DATA k512<>+8(SB)/8, $0x1c6e41596
GLOBL k512<>(SB), RODATA|NOPTR, $16

DATA k384<>+0(SB)/8, $0x3db1ecdc
DATA k384<>+8(SB)/8, $0x174359406
GLOBL k384<>(SB), RODATA|NOPTR, $16

DATA k256<>+0(SB)/8, $0xf1da05aa
DATA k256<>+8(SB)/8, $0x15a546366
GLOBL k256<>(SB), RODATA|NOPTR, $16

DATA k128<>+0(SB)/8, $0x1751997d0
DATA k128<>+8(SB)/8, $0xccaa009e
GLOBL k128<>(SB), RODATA|NOPTR, $16

// func foldAVX512(p *byte, n int, reg uint32, out *[16]byte)
// n >= 256 and a multiple of 64; reg is the CRC register (inverted CRC).
TEXT ·foldAVX512(SB), NOSPLIT, $0-32
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	MOVL reg+16(FP), AX
	MOVQ out+24(FP), DI

	VMOVDQU64 0(SI), Z0
	VMOVDQU64 64(SI), Z1
	VMOVDQU64 128(SI), Z2
	VMOVDQU64 192(SI), Z3
	VMOVD     AX, X4
	VPXORQ    Z4, Z0, Z0
	ADDQ      $256, SI
	SUBQ      $256, CX
	VBROADCASTI32X4 k2048<>(SB), Z5

by256:
	CMPQ       CX, $256
	JLT        fold4
	VPCLMULQDQ $0x00, Z5, Z0, Z6
	VPCLMULQDQ $0x11, Z5, Z0, Z0
	VPCLMULQDQ $0x00, Z5, Z1, Z7
	VPCLMULQDQ $0x11, Z5, Z1, Z1
	VPCLMULQDQ $0x00, Z5, Z2, Z8
	VPCLMULQDQ $0x11, Z5, Z2, Z2
	VPCLMULQDQ $0x00, Z5, Z3, Z9
	VPCLMULQDQ $0x11, Z5, Z3, Z3
	VPTERNLOGQ $0x96, 0(SI), Z6, Z0
	VPTERNLOGQ $0x96, 64(SI), Z7, Z1
	VPTERNLOGQ $0x96, 128(SI), Z8, Z2
	VPTERNLOGQ $0x96, 192(SI), Z9, Z3
	ADDQ       $256, SI
	SUBQ       $256, CX
	JMP        by256

fold4:
	VBROADCASTI32X4 k512<>(SB), Z5
	VPCLMULQDQ      $0x00, Z5, Z0, Z6
	VPCLMULQDQ      $0x11, Z5, Z0, Z0
	VPTERNLOGQ      $0x96, Z6, Z0, Z1
	VPCLMULQDQ      $0x00, Z5, Z1, Z6
	VPCLMULQDQ      $0x11, Z5, Z1, Z1
	VPTERNLOGQ      $0x96, Z6, Z1, Z2
	VPCLMULQDQ      $0x00, Z5, Z2, Z6
	VPCLMULQDQ      $0x11, Z5, Z2, Z2
	VPTERNLOGQ      $0x96, Z6, Z2, Z3

by64:
	CMPQ       CX, $64
	JLT        lanes
	VPCLMULQDQ $0x00, Z5, Z3, Z6
	VPCLMULQDQ $0x11, Z5, Z3, Z3
	VPTERNLOGQ $0x96, 0(SI), Z6, Z3
	ADDQ       $64, SI
	SUBQ       $64, CX
	JMP        by64

lanes:
	VEXTRACTI32X4 $0, Z3, X0
	VEXTRACTI32X4 $1, Z3, X1
	VEXTRACTI32X4 $2, Z3, X2
	VEXTRACTI32X4 $3, Z3, X3
	VMOVDQU       k384<>(SB), X4
	VPCLMULQDQ    $0x00, X4, X0, X5
	VPCLMULQDQ    $0x11, X4, X0, X6
	VPXOR         X5, X3, X3
	VPXOR         X6, X3, X3
	VMOVDQU       k256<>(SB), X4
	VPCLMULQDQ    $0x00, X4, X1, X5
	VPCLMULQDQ    $0x11, X4, X1, X6
	VPXOR         X5, X3, X3
	VPXOR         X6, X3, X3
	VMOVDQU       k128<>(SB), X4
	VPCLMULQDQ    $0x00, X4, X2, X5
	VPCLMULQDQ    $0x11, X4, X2, X6
	VPXOR         X5, X3, X3
	VPXOR         X6, X3, X3
	VMOVDQU       X3, 0(DI)
	VZEROUPPER
	RET
