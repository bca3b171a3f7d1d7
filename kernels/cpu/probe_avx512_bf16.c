/* probe_avx512_bf16.c - the BF16 dot (vdpbf16ps) and int8 VNNI dot
 * (vpdpbusd) peak loops of kernels/cpu/probe.h, compiled for the avx512_bf16
 * level (which includes VNNI). `make profile` and the planner's probe both
 * run them, so the plan's peaks are on the profile's scale. */
#include "kernels/cpu/simd_avx512.h"

#include "kernels/cpu/probe.h"

/* vdpbf16ps against BF16 pairs (1.0, 1.0) and (6e-8, 6e-8) */
#define K_PROBE_BF16(v) \
    _mm512_dpbf16_ps(v, (__m512bh)_mm512_set1_epi32(0x3f803f80), (__m512bh)_mm512_set1_epi32(0x33803380))
K_PEAK_F32_FN(kipp_prof_bf16_avx512, 30, K_PROBE_BF16)
#undef K_PROBE_BF16

float kipp_prof_int8_avx512(long iters, float seed)
{
    /* 16 chains (4-5 cycles latency x 2 per cycle at most is < 16 in flight):
     * with 30, GCC 12 keeps the __m512i array in memory, a store per
     * vpdpbusd, and the loop measures the store port. */
    __m512i a[16];
    const __m512i x = _mm512_set1_epi8(1), y = _mm512_set1_epi8(-1); /* sums stay far from int32 overflow per call */
    for (int i = 0; i < 16; i++) a[i] = _mm512_set1_epi32((int)seed + i);
    for (long it = 0; it < iters; it++) {
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) a[i] = _mm512_dpbusd_epi32(a[i], x, y);
    }
    __m512i s = a[0];
    for (int i = 1; i < 16; i++) s = _mm512_add_epi32(s, a[i]);
    return (float)_mm512_reduce_add_epi32(s);
}
