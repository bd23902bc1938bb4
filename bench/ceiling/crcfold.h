// crcfold.h: CRC-32 (IEEE, reflected; zlib's crc32 semantics) by folding
// with carry-less multiplication, four 512-bit registers at a time
// (AVX-512 VPCLMULQDQ): 256 bytes a step, the folded remainder and the
// tail (under 64 bytes) through zlib. The fold constants are x^(D+32) and
// x^(D-32) mod P, bit-reflected and shifted left by one, for a fold
// distance of D bits (computed in GF(2)[x]); the same
// form as the 128-bit folding constants the Linux kernel uses (D = 512:
// 0x154442bd4, 0x1c6e41596). Checked against zlib by `ceil crccheck`.
#include <immintrin.h>
#include <stdint.h>
#include <zlib.h>

#define CRCFOLD_TARGET __attribute__((target("avx512f,avx512bw,vpclmulqdq,pclmul")))

CRCFOLD_TARGET static inline __m512i crcfold_k(uint64_t lo, uint64_t hi) {
	return _mm512_broadcast_i32x4(_mm_set_epi64x((long long)hi, (long long)lo));
}

CRCFOLD_TARGET static inline __m512i crcfold_step(__m512i x, __m512i k) {
	return _mm512_xor_si512(_mm512_clmulepi64_epi128(x, k, 0x00), _mm512_clmulepi64_epi128(x, k, 0x11));
}

CRCFOLD_TARGET static inline __m128i crcfold_step128(__m128i x, uint64_t lo, uint64_t hi) {
	__m128i k = _mm_set_epi64x((long long)hi, (long long)lo);
	return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

// crcfold: crc32(crc, p, n) as zlib computes it.
CRCFOLD_TARGET static uint32_t crcfold(uint32_t crc, const void *buf, size_t n) {
	const uint8_t *p = buf;
	if (n < 512)
		return (uint32_t)crc32(crc, p, (uInt)n);
	__m512i x0 = _mm512_loadu_si512(p), x1 = _mm512_loadu_si512(p + 64);
	__m512i x2 = _mm512_loadu_si512(p + 128), x3 = _mm512_loadu_si512(p + 192);
	// the register, inverted as zlib does, enters as the first 4 bytes' XOR
	x0 = _mm512_xor_si512(x0, _mm512_castsi128_si512(_mm_cvtsi32_si128((int)~crc)));
	p += 256, n -= 256;
	const __m512i k2048 = crcfold_k(0x11542778aULL, 0x1322d1430ULL);
	while (n >= 256) {
		x0 = _mm512_xor_si512(crcfold_step(x0, k2048), _mm512_loadu_si512(p));
		x1 = _mm512_xor_si512(crcfold_step(x1, k2048), _mm512_loadu_si512(p + 64));
		x2 = _mm512_xor_si512(crcfold_step(x2, k2048), _mm512_loadu_si512(p + 128));
		x3 = _mm512_xor_si512(crcfold_step(x3, k2048), _mm512_loadu_si512(p + 192));
		p += 256, n -= 256;
	}
	const __m512i k512 = crcfold_k(0x154442bd4ULL, 0x1c6e41596ULL);
	x1 = _mm512_xor_si512(x1, crcfold_step(x0, k512));
	x2 = _mm512_xor_si512(x2, crcfold_step(x1, k512));
	x3 = _mm512_xor_si512(x3, crcfold_step(x2, k512));
	while (n >= 64) {
		x3 = _mm512_xor_si512(crcfold_step(x3, k512), _mm512_loadu_si512(p));
		p += 64, n -= 64;
	}
	// the four 128-bit lanes of x3, folded into the last
	__m128i a0 = _mm512_extracti32x4_epi32(x3, 0), a1 = _mm512_extracti32x4_epi32(x3, 1);
	__m128i a2 = _mm512_extracti32x4_epi32(x3, 2), a3 = _mm512_extracti32x4_epi32(x3, 3);
	a3 = _mm_xor_si128(a3, crcfold_step128(a0, 0x3db1ecdcULL, 0x174359406ULL));
	a3 = _mm_xor_si128(a3, crcfold_step128(a1, 0xf1da05aaULL, 0x15a546366ULL));
	a3 = _mm_xor_si128(a3, crcfold_step128(a2, 0x1751997d0ULL, 0xccaa009eULL));
	// a3 followed by the tail has the CRC of the whole (register zero)
	uint8_t r[16];
	_mm_storeu_si128((__m128i *)r, a3);
	uint32_t c = (uint32_t)crc32(0xffffffffu, r, 16); // zlib's ~0 in = register 0
	return (uint32_t)crc32(c, p, (uInt)n);
}
