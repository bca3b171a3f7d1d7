/* probe_avx512.c - AVX-512 F read-bandwidth and FP32 FMA peak loops (the BF16
 * dot is in bench/profile_avx512bf16.c) with 30 independent accumulators (kernels/cpu/probe.h;
 * the team's reference numbers measure peaks the same way). */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/probe.h"

uint64_t kipp_prof_read_avx512(const void *p, size_t n)
{
    const __m512i *v = p;
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n / 64; i += 4) {
        a0 = _mm512_xor_si512(a0, _mm512_load_si512(v + i));
        a1 = _mm512_xor_si512(a1, _mm512_load_si512(v + i + 1));
        a2 = _mm512_xor_si512(a2, _mm512_load_si512(v + i + 2));
        a3 = _mm512_xor_si512(a3, _mm512_load_si512(v + i + 3));
    }
    __m512i s = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
    return (uint64_t)_mm512_reduce_add_epi64(s);
}

float kipp_prof_fma_avx512(long iters, float seed)
{
    __m512 a[30];
    const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 30; i++) a[i] = _mm512_set1_ps(seed + (float)i);
    for (long it = 0; it < iters; it++) {
#pragma GCC unroll 30
        for (int i = 0; i < 30; i++) a[i] = _mm512_fmadd_ps(a[i], b, c);
    }
    __m512 s = a[0];
    for (int i = 1; i < 30; i++) s = _mm512_add_ps(s, a[i]);
    return _mm512_reduce_add_ps(s);
}
