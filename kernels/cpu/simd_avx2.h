/*
 * simd_avx2.h - the vector vocabulary of the shared kernel sources, for AVX2 +
 * FMA (docs/ARCHITECTURE.md "ISA dispatch"). Included first by every *_avx2.c, which
 * is compiled with -mavx2 -mfma -mf16c; simd_avx512.h defines the same names
 * for 16 lanes. A kernel written once over these (elementwise_simd.h,
 * linear_simd.h, attention_simd.h) is compiled once per level, its names
 * suffixed by K_SFX.
 *
 * vf: VF_LANES float lanes. vi: the same register as 32-bit integers.
 */
#ifndef KIPP_SIMD_H
#define KIPP_SIMD_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/kernels.h"

#define VF_LANES 8
#define K_SFX(name) name##_avx2
#define K_LEVEL_NAME "avx2"
#define K_MM_TT 6 /* prefill tile tokens: 2 x 6 accumulators + 2 weights + 1 broadcast of 16 ymm */
#define K_PANEL_TT 4 /* q8_0/affine4 prefill tile tokens (linear_panel_simd.h) */
#define K_PANEL_RV 2 /* row vectors per 16-row panel */
#define K_PANEL_MM_PF 2048u /* q8_0/affine4 prefill: first-tile prefetch distance in bytes (linear_panel_simd.h) */
#define K_MV_PANELS 4 /* bf16 decode matvec: 16-row panels walked together (linear_simd.h) */
#define K_MM_KB 256u     /* bf16 FP32-FMA matmul: k per block (linear_simd.h) */
#define K_MM_GROUP 128u  /* bf16 FP32-FMA matmul: rows per group, 128 KB of widened weights in L2 */
#define K_SM_TT 4        /* bf16 FP32-FMA small-M tile tokens (linear_simd.h sm_tile) */
#define K_SM_MAX 32u     /* bf16 FP32-FMA matmul: up to this many tokens (batched decode) take the small-M tile */

typedef __m256 vf;
typedef __m256i vi;

static inline vf vf_zero(void) { return _mm256_setzero_ps(); }
static inline vf vf_load(const float *p) { return _mm256_loadu_ps(p); }
/** VF_LANES IEEE fp16 values widened to FP32 (exact: every fp16 is an FP32). */
static inline vf vf_load_h(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline void vf_store(float *p, vf v) { _mm256_storeu_ps(p, v); }
static inline vf vf_set1(float x) { return _mm256_set1_ps(x); }
static inline vf vf_bcast(const float *p) { return _mm256_broadcast_ss(p); }
static inline vf vf_add(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf vf_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf vf_div(vf a, vf b) { return _mm256_div_ps(a, b); }
static inline vf vf_max(vf a, vf b) { return _mm256_max_ps(a, b); }
/** a * b + c, one rounding. */
static inline vf vf_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vi vi_load(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
/* A macro, not a static inline function: GCC 12 found such a wrapper free of
 * side effects and dropped its calls, so no prefetch reached the binary. A
 * caller that wraps it must be always_inline for the same reason. */
#define k_prefetch(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)

/** Sum of the lanes by a pairwise tree (lane i + lane i + w for w = 4, 2, 1):
 * attention_simd.h's tile walk reproduces this tree with vertical adds. */
static inline float vf_hsum(vf v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float vf_hmax(vf v)
{
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

static inline vf vf_min(vf a, vf b) { return _mm256_min_ps(a, b); }
/** c - a * b, one rounding. */
static inline vf vf_fnma(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
static inline vf vf_round(vf x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/** p * 2^n for integral n in [-127, 127], through the exponent bits. */
static inline vf vf_ldexp(vf p, vf n)
{
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
/** y where x >= lo, else exactly 0 (NaN x gives 0 too). */
static inline vf vf_keep_ge(vf x, vf lo, vf y) { return _mm256_and_ps(_mm256_cmp_ps(x, lo, _CMP_GE_OQ), y); }

/** VF_LANES int8 at p widened to f32 (exact). */
static inline vf vf_from_i8(const int8_t *p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))); }

/** 2 x VF_LANES int8 at p as f32 (exact): the even elements into *e, the odd into *o (vf_even/vf_odd's order). */
static inline void vf_i8_eo(const int8_t *p, vf *e, vf *o)
{
    __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    *e = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(w, 16), 16));
    *o = _mm256_cvtepi32_ps(_mm256_srai_epi32(w, 16));
}

/** VF_LANES bf16 -> VF_LANES f32 (exact). */
static inline vf vf_widen(const kipp_bf16 *p)
{
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/** Store VF_LANES lanes rounded to BF16, RNE in integer arithmetic: equal to
 * kipp_f32_to_bf16 bit for bit (denormals kept, NaN quieted). */
static inline void vf_store_bf16(kipp_bf16 *p, vf f)
{
    __m256i u = _mm256_castps_si256(f);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
    __m256i qn = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, qn, nan);
    _mm_storeu_si128((__m128i *)p, _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
}

/* Packed pairs: 32-bit lane j holds (w[2j] low half, w[2j+1] high half). The
 * even element is the low half shifted up, the odd one the high half. */
static inline vf vf_even(vi v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
static inline vf vf_odd(vi v) { return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u))); }
/** Split 2*VF_LANES consecutive floats (a, then b) into their even and odd
 * elements, in order: the lane order of vf_even/vf_odd of one vi load of
 * 2*VF_LANES bf16. */
static inline void vf_deint(vf a, vf b, vf *e, vf *o)
{
    *e = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xd8));
    *o = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xdd)), 0xd8));
}
/** Inverse of vf_deint. */
static inline void vf_inter(vf e, vf o, vf *a, vf *b)
{
    vf lo = _mm256_unpacklo_ps(e, o), hi = _mm256_unpackhi_ps(e, o);
    *a = _mm256_permute2f128_ps(lo, hi, 0x20);
    *b = _mm256_permute2f128_ps(lo, hi, 0x31);
}
/** vf_odd by two shifts, for tiles with no register left for the mask. */
static inline vf vf_odd_shift(vi v) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(v, 16), 16)); }

/** In-place transpose of the VF_LANES x VF_LANES block whose rows are r[0..VF_LANES):
 * 4x4 transposes inside the 128-bit lanes, then the lanes swapped. */
static inline void vf_transpose(vf r[VF_LANES])
{
    for (int g = 0; g < VF_LANES; g += 4) {
        vf t0 = _mm256_unpacklo_ps(r[g], r[g + 1]), t1 = _mm256_unpackhi_ps(r[g], r[g + 1]);
        vf t2 = _mm256_unpacklo_ps(r[g + 2], r[g + 3]), t3 = _mm256_unpackhi_ps(r[g + 2], r[g + 3]);
        r[g] = _mm256_shuffle_ps(t0, t2, 0x44);
        r[g + 1] = _mm256_shuffle_ps(t0, t2, 0xee);
        r[g + 2] = _mm256_shuffle_ps(t1, t3, 0x44);
        r[g + 3] = _mm256_shuffle_ps(t1, t3, 0xee);
    }
    for (int i = 0; i < 4; i++) {
        vf a = r[i], b = r[4 + i];
        r[i] = _mm256_permute2f128_ps(a, b, 0x20);
        r[4 + i] = _mm256_permute2f128_ps(a, b, 0x31);
    }
}

/* ---- int8 dot (q8 formats): 32-bit lane j sums 4 adjacent int8 products ---- */
static inline vi vi_zero(void) { return _mm256_setzero_si256(); }
/** The 4 bytes at p in every 32-bit lane. */
static inline vi vi_bcast4(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}
/** |x| per int8 lane, read as uint8 by vi_dot4 (|-128| = 128). */
static inline vi vi_abs8(vi x) { return _mm256_sign_epi8(x, x); }
/** acc + per 32-bit lane sum of the 4 int8 products w*x; ax = vi_abs8(x). vpmaddubsw
 * on |x| and w with x's sign (int16 pairs, exact for |w| <= 127), vpmaddwd to int32. */
static inline vi vi_dot4(vi acc, vi w, vi x, vi ax)
{
    vi p = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(w, x));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}
/** acc + per 32-bit lane sum of the 4 products w*x, w uint8 (q4 nibbles: pair sums within int16), x int8. */
static inline vi vi_dot4u(vi acc, vi w, vi x)
{
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
}
/** Low and high nibbles of every byte, as bytes 0..15. */
static inline vi vi_nib_lo(vi v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0f)); }
static inline vi vi_nib_hi(vi v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0f)); }
static inline vf vf_from_vi(vi v) { return _mm256_cvtepi32_ps(v); }

#include "kernels/cpu/simd_exp.h"

#endif
