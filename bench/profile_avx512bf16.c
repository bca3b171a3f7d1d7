/* profile_avx512bf16.c - the BF16 dot (vdpbf16ps) peak loop with 30 independent
 * accumulators (bench/profile.h), compiled for the avx512_bf16 level. */
#include <immintrin.h>
#include <string.h>

#include "bench/profile.h"

float kipp_prof_bf16_avx512(long iters, float seed)
{
    __m512 a[30];
    __m512bh x, y;
    __m512i xi = _mm512_set1_epi32(0x3f803f80), yi = _mm512_set1_epi32(0x33803380); /* 1.0, 6e-8 */
    memcpy(&x, &xi, sizeof x);
    memcpy(&y, &yi, sizeof y);
    for (int i = 0; i < 30; i++) a[i] = _mm512_set1_ps(seed + (float)i);
    for (long it = 0; it < iters; it++) {
#pragma GCC unroll 30
        for (int i = 0; i < 30; i++) a[i] = _mm512_dpbf16_ps(a[i], x, y);
    }
    __m512 s = a[0];
    for (int i = 1; i < 30; i++) s = _mm512_add_ps(s, a[i]);
    return _mm512_reduce_add_ps(s);
}
