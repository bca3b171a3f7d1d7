/* probe_avx2.c - AVX2 read-bandwidth and FP32 FMA peak loops (kernels/cpu/probe.h). */
#include <immintrin.h>

#include "kernels/cpu/probe.h"

uint64_t kipp_prof_read_avx2(const void *p, size_t n)
{
    const __m256i *v = p;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n / 32; i += 8) { /* 256 B per step: four lines' worth of loads */
        a0 = _mm256_xor_si256(a0, _mm256_load_si256(v + i));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256(v + i + 2));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256(v + i + 4));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256(v + i + 6));
        a0 = _mm256_xor_si256(a0, _mm256_load_si256(v + i + 1));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256(v + i + 3));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256(v + i + 5));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256(v + i + 7));
    }
    __m256i s = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    return (uint64_t)_mm256_extract_epi64(s, 0) ^ (uint64_t)_mm256_extract_epi64(s, 3);
}

float kipp_prof_fma_avx2(long iters, float seed)
{
    __m256 a[12];
    const __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps(seed + (float)i);
    for (long it = 0; it < iters; it++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = _mm256_fmadd_ps(a[i], b, c);
    }
    __m256 s = a[0];
    for (int i = 1; i < 12; i++) s = _mm256_add_ps(s, a[i]);
    return _mm256_cvtss_f32(s);
}
