/*
 * vmath_avx512.h - helpers for the AVX-512 kernels (included only by
 * *_avx512.c, compiled with -mavx512f/bw/vl/dq/bf16). With KIPP_SIMDE_EMU the
 * same sources build against SIMDe's portable AVX-512 so the kernel tests can
 * run the AVX-512 path on CPUs without it (tests/test_kernels.c, make
 * test-avx512-emu).
 */
#ifndef KIPP_VMATH_AVX512_H
#define KIPP_VMATH_AVX512_H

#include <stdint.h>
#include <string.h>

#ifdef KIPP_SIMDE_EMU
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
/* SIMDe 0.7.4 lacks these five; portable lane loops with the same semantics
 * (the masked forms touch only the lanes whose mask bit is set). */
static inline __m512i kemu_cvtepu16_epi32(__m256i v)
{
    uint16_t s[16];
    uint32_t d[16];
    __m512i r;
    memcpy(s, &v, sizeof s);
    for (int i = 0; i < 16; i++) d[i] = s[i];
    memcpy(&r, d, sizeof r);
    return r;
}
static inline __m256i kemu_cvtepi32_epi16(__m512i v)
{
    uint32_t s[16];
    uint16_t d[16];
    __m256i r;
    memcpy(s, &v, sizeof s);
    for (int i = 0; i < 16; i++) d[i] = (uint16_t)s[i];
    memcpy(&r, d, sizeof r);
    return r;
}
static inline float kemu_reduce_add_ps(__m512 v)
{
    float s[16];
    memcpy(s, &v, sizeof s);
    for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) s[i] += s[i + w];
    return s[0];
}
static inline __m512 kemu_maskz_loadu_ps(__mmask16 k, const float *p)
{
    float d[16];
    __m512 r;
    for (int i = 0; i < 16; i++) d[i] = (k >> i) & 1 ? p[i] : 0.0f;
    memcpy(&r, d, sizeof r);
    return r;
}
static inline void kemu_mask_storeu_ps(float *p, __mmask16 k, __m512 v)
{
    float s[16];
    memcpy(s, &v, sizeof s);
    for (int i = 0; i < 16; i++)
        if ((k >> i) & 1) p[i] = s[i];
}
#define _mm512_cvtepu16_epi32 kemu_cvtepu16_epi32
#define _mm512_cvtepi32_epi16 kemu_cvtepi32_epi16
#define _mm512_reduce_add_ps kemu_reduce_add_ps
#define _mm512_maskz_loadu_ps kemu_maskz_loadu_ps
#define _mm512_mask_storeu_ps kemu_mask_storeu_ps
#else
#include <immintrin.h>
#endif

/* expf: n = round(x / ln2), r = x - n ln2, degree-6 Cephes polynomial,
 * 2^n applied with vscalefps (handles the under/overflow edges). ~2 ulp on
 * [-87, 88]; x <= -104 (and -inf) gives 0. */
static inline __m512 k_exp16(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    x = _mm512_min_ps(x, _mm512_set1_ps(88.7f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500E-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* 16 bf16 -> 16 f32 (exact). */
static inline __m512 k_widen16(const uint16_t *p)
{
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

/* Packed pairs: lane j holds (w[2j] low half, w[2j+1] high half). */
static inline __m512 k_even16(__m512i v) { return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)); }
static inline __m512 k_odd16(__m512i v)
{
    return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u)));
}

/* RNE to BF16 in integer arithmetic, equal to kipp_f32_to_bf16 bit for bit
 * (vcvtneps2bf16 would flush denormals). 16 lanes -> 16 x u16. */
static inline __m256i k_cvt16_bf16(__m512 f)
{
    __m512i u = _mm512_castps_si512(f);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    __mmask16 nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
}

/* Reinterpret 32 packed bf16 for vdpbf16ps (a no-op on hardware). */
static inline __m512bh k_as_bh(__m512i v)
{
    __m512bh r;
    memcpy(&r, &v, sizeof r);
    return r;
}

#endif
