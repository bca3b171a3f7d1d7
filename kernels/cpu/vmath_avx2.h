/*
 * vmath_avx2.h - vector exp for the AVX2 kernels (included only by *_avx2.c,
 * which are compiled with -mavx2 -mfma).
 *
 * Cephes-style expf: n = round(x / ln2), r = x - n ln2 (two-part ln2), degree-6
 * polynomial, scale by 2^n through the exponent bits. Max relative error ~2 ulp
 * on [-87.3, 88.3]; x < -87.3 (including -inf) gives exactly 0, x > 88.3 gives
 * ~FLT_MAX-scale values (callers only pass x <= 0 or bounded gate values).
 */
#ifndef KIPP_VMATH_AVX2_H
#define KIPP_VMATH_AVX2_H

#include <immintrin.h>
#include <stdint.h>

static inline __m256 k_exp8(__m256 x)
{
    const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-87.3f);
    __m256 zero_mask = _mm256_cmp_ps(x, lo, _CMP_LT_OQ); /* also catches -inf */
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500E-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(zero_mask, y);
}

/* 8 bf16 -> 8 f32 (exact). */
static inline __m256 k_widen8(const uint16_t *p)
{
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

static inline float k_hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* RNE to BF16 with integer arithmetic, equal to kipp_f32_to_bf16 bit for bit
 * (denormals kept, NaN quieted); 8 lanes -> 8 x u16. */
static inline __m128i k_cvt8_bf16(__m256 f)
{
    __m256i u = _mm256_castps_si256(f);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
    __m256i qn = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, qn, nan);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

#endif
