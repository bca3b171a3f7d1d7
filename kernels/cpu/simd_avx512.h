/*
 * simd_avx512.h - the vector vocabulary of the shared kernel sources for
 * AVX-512 F/BW/VL/DQ: the same names as simd_avx2.h over 16 lanes. Included
 * first by every *_avx512.c (compiled with -mavx512f/bw/vl/dq) and by the
 * hand-written *_avx512_bf16.c tiles. With KIPP_SIMDE_EMU the same sources build
 * against SIMDe's portable AVX-512 (libsimde-dev), so the kernel checks run
 * these levels on CPUs without them (make: build/bin/kcheck_emu).
 */
#ifndef KIPP_SIMD_H
#define KIPP_SIMD_H

#include <stdint.h>
#include <string.h>

#include "kernels/cpu/kernels.h"

#ifdef KIPP_SIMDE_EMU
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
/* SIMDe 0.7.4 lacks these; portable lane loops with the same semantics. */
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
static inline float kemu_reduce_max_ps(__m512 v)
{
    float s[16];
    memcpy(s, &v, sizeof s);
    for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) s[i] = s[i] > s[i + w] ? s[i] : s[i + w];
    return s[0];
}
static inline __m512 kemu_cvtepi32_ps(__m512i v)
{
    int32_t s[16];
    float d[16];
    __m512 r;
    memcpy(s, &v, sizeof s);
    for (int i = 0; i < 16; i++) d[i] = (float)s[i];
    memcpy(&r, d, sizeof r);
    return r;
}
static inline __m512 kemu_cvtph_ps(__m256i v)
{
    uint16_t s[16];
    float d[16];
    __m512 r;
    memcpy(s, &v, sizeof s);
    for (int i = 0; i < 16; i++) d[i] = kipp_f16_to_f32(s[i]);
    memcpy(&r, d, sizeof r);
    return r;
}
static inline __m512i kemu_cvtepi8_epi32(__m128i v)
{
    int8_t s[16];
    int32_t d[16];
    __m512i r;
    memcpy(s, &v, sizeof s);
    for (int i = 0; i < 16; i++) d[i] = s[i];
    memcpy(&r, d, sizeof r);
    return r;
}
#define _mm512_cvtepi32_ps kemu_cvtepi32_ps
#undef _mm512_cvtepi8_epi32
#define _mm512_cvtepi8_epi32 kemu_cvtepi8_epi32
#undef _mm512_cvtph_ps
#define _mm512_cvtph_ps kemu_cvtph_ps
#define _mm512_cvtepu16_epi32 kemu_cvtepu16_epi32
#define _mm512_cvtepi32_epi16 kemu_cvtepi32_epi16
#define _mm512_reduce_add_ps kemu_reduce_add_ps
#define _mm512_reduce_max_ps kemu_reduce_max_ps
/* defined, not aliased, in 0.7.4; clang's avx512fintrin.h (through immintrin.h)
 * defines a native macro of this name, which needs avx512f: replace either */
#undef _mm512_shuffle_f32x4
#define _mm512_shuffle_f32x4 simde_mm512_shuffle_f32x4
/* SIMDe 0.7.4 aliases _mm512_madd_epi16 to the 4-argument mask form. */
#undef _mm512_madd_epi16
#define _mm512_madd_epi16 simde_mm512_madd_epi16
#else
#include <immintrin.h>
#endif

#define VF_LANES 16
#define K_SFX(name) name##_avx512
#define K_LEVEL_NAME "avx512"
#define K_MM_TT 12 /* prefill tile tokens: 2 x 12 accumulators + 2 weights + 1 broadcast of 32 zmm */
#define K_PANEL_TT 8 /* q8_0/affine4 prefill tile tokens (linear_panel_simd.h) */
#define K_PANEL_RV 1 /* row vectors per 16-row panel */
#define K_PANEL_MM_PF 2048u /* q8_0/affine4 prefill: first-tile prefetch distance in bytes (linear_panel_simd.h) */
#define K_MV_PANELS 1 /* bf16 decode matvec: 16-row panels walked together (linear_simd.h) */
#define K_MM_KB 128u     /* bf16 FP32-FMA matmul: k per block (linear_simd.h) */
#define K_MM_GROUP 32u   /* bf16 FP32-FMA matmul: rows per group, 16 KB of widened weights in L1 */
#define K_SM_TT 8        /* bf16 FP32-FMA small-M tile tokens (linear_simd.h sm_tile) */
#define K_SM_MAX 32u     /* bf16 FP32-FMA matmul: up to this many tokens (batched decode) take the small-M tile */

typedef __m512 vf;
typedef __m512i vi;

static inline vf vf_zero(void) { return _mm512_setzero_ps(); }
static inline vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
/** VF_LANES IEEE fp16 values widened to FP32 (exact: every fp16 is an FP32). */
static inline vf vf_load_h(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline void vf_store(float *p, vf v) { _mm512_storeu_ps(p, v); }
static inline vf vf_set1(float x) { return _mm512_set1_ps(x); }
static inline vf vf_bcast(const float *p) { return _mm512_set1_ps(*p); }
static inline vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vf_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vf_div(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline vf vf_max(vf a, vf b) { return _mm512_max_ps(a, b); }
/** a * b + c, one rounding. */
static inline vf vf_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vi vi_load(const void *p) { return _mm512_loadu_si512(p); }
/* A macro, not a static inline function: GCC 12 found such a wrapper free of
 * side effects and dropped its calls, so no prefetch reached the binary. A
 * caller that wraps it must be always_inline for the same reason. */
#define k_prefetch(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
/** Sum of the lanes by a pairwise tree (lane i + lane i + w for w = 8, 4, 2,
 * 1), spelled out so every compiler rounds alike: attention_simd.h's tile
 * walk reproduces this tree with vertical adds. */
static inline float vf_hsum(vf v)
{
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline float vf_hmax(vf v) { return _mm512_reduce_max_ps(v); }

static inline vf vf_min(vf a, vf b) { return _mm512_min_ps(a, b); }
/** c - a * b, one rounding. */
static inline vf vf_fnma(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }
static inline vf vf_round(vf x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/** p * 2^n (vscalefps). */
static inline vf vf_ldexp(vf p, vf n) { return _mm512_scalef_ps(p, n); }
/** y where x >= lo, else exactly 0 (NaN x gives 0 too). */
static inline vf vf_keep_ge(vf x, vf lo, vf y) { return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ), y); }

/** VF_LANES int8 at p widened to f32 (exact). */
static inline vf vf_from_i8(const int8_t *p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p))); }

/** 2 x VF_LANES int8 at p as f32 (exact): the even elements into *e, the odd into *o (vf_even/vf_odd's order). */
static inline void vf_i8_eo(const int8_t *p, vf *e, vf *o)
{
#ifdef KIPP_SIMDE_EMU /* SIMDe 0.7.4 has no _mm512_srai_epi32: the same lanes by a loop */
    float fe[16], fo[16];
    for (int i = 0; i < 16; i++) fe[i] = p[2 * i], fo[i] = p[2 * i + 1];
    memcpy(e, fe, sizeof fe);
    memcpy(o, fo, sizeof fo);
#else
    __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)p));
    *e = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(w, 16), 16));
    *o = _mm512_cvtepi32_ps(_mm512_srai_epi32(w, 16));
#endif
}

/** VF_LANES bf16 -> VF_LANES f32 (exact). */
static inline vf vf_widen(const kipp_bf16 *p)
{
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

/** Store VF_LANES lanes rounded to BF16 in integer arithmetic, equal to
 * kipp_f32_to_bf16 bit for bit (vcvtneps2bf16 would flush denormals). */
static inline void vf_store_bf16(kipp_bf16 *p, vf f)
{
    __m512i u = _mm512_castps_si512(f);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    __mmask16 nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(r));
}

/* Packed pairs: 32-bit lane j holds (w[2j] low half, w[2j+1] high half). */
static inline vf vf_even(vi v) { return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)); }
static inline vf vf_odd(vi v) { return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u))); }
static inline vf vf_odd_shift(vi v) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_srli_epi32(v, 16), 16)); }
/** Split 2*VF_LANES consecutive floats (a, then b) into their even and odd
 * elements, in order: the lane order of vf_even/vf_odd of one vi load. */
static inline void vf_deint(vf a, vf b, vf *e, vf *o)
{
    const __m512i ie = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    *e = _mm512_permutex2var_ps(a, ie, b);
    *o = _mm512_permutex2var_ps(a, _mm512_add_epi32(ie, _mm512_set1_epi32(1)), b);
}
/** In-place transpose of the VF_LANES x VF_LANES block whose rows are r[0..VF_LANES):
 * 4x4 transposes inside the 128-bit lanes, then the 4x4 grid of lanes
 * (row 4g + i's lane k is output row 4k + i's lane g). */
static inline void vf_transpose(vf r[VF_LANES])
{
    for (int g = 0; g < VF_LANES; g += 4) {
        vf t0 = _mm512_unpacklo_ps(r[g], r[g + 1]), t1 = _mm512_unpackhi_ps(r[g], r[g + 1]);
        vf t2 = _mm512_unpacklo_ps(r[g + 2], r[g + 3]), t3 = _mm512_unpackhi_ps(r[g + 2], r[g + 3]);
        r[g] = _mm512_shuffle_ps(t0, t2, 0x44);
        r[g + 1] = _mm512_shuffle_ps(t0, t2, 0xee);
        r[g + 2] = _mm512_shuffle_ps(t1, t3, 0x44);
        r[g + 3] = _mm512_shuffle_ps(t1, t3, 0xee);
    }
    for (int i = 0; i < 4; i++) {
        vf u0 = _mm512_shuffle_f32x4(r[i], r[4 + i], 0x44), u1 = _mm512_shuffle_f32x4(r[i], r[4 + i], 0xee);
        vf u2 = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0x44), u3 = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0xee);
        r[i] = _mm512_shuffle_f32x4(u0, u2, 0x88);
        r[4 + i] = _mm512_shuffle_f32x4(u0, u2, 0xdd);
        r[8 + i] = _mm512_shuffle_f32x4(u1, u3, 0x88);
        r[12 + i] = _mm512_shuffle_f32x4(u1, u3, 0xdd);
    }
}
/** Inverse of vf_deint. */
static inline void vf_inter(vf e, vf o, vf *a, vf *b)
{
    const __m512i ia = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    *a = _mm512_permutex2var_ps(e, ia, o);
    *b = _mm512_permutex2var_ps(e, _mm512_add_epi32(ia, _mm512_set1_epi32(8)), o);
}

/* ---- int8 dot (q8 formats): 32-bit lane j sums 4 adjacent int8 products ---- */
static inline vi vi_zero(void) { return _mm512_setzero_si512(); }
/** The 4 bytes at p in every 32-bit lane. */
static inline vi vi_bcast4(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}
/** |x| per int8 lane, read as uint8 by vi_dot4 (|-128| = 128). */
static inline vi vi_abs8(vi x) { return _mm512_abs_epi8(x); }
/** acc + per 32-bit lane sum of the 4 int8 products w*x; ax = vi_abs8(x). AVX-512BW
 * has no vpsignb: w is negated under x's sign mask, then vpmaddubsw + vpmaddwd. */
static inline vi vi_dot4(vi acc, vi w, vi x, vi ax)
{
    vi sw = _mm512_mask_sub_epi8(w, _mm512_movepi8_mask(x), _mm512_setzero_si512(), w);
    vi p = _mm512_maddubs_epi16(ax, sw);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(p, _mm512_set1_epi16(1)));
}
/** acc + per 32-bit lane sum of the 4 products w*x, w uint8 (q4 nibbles), x int8. */
static inline vi vi_dot4u(vi acc, vi w, vi x)
{
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1)));
}
/** Low and high nibbles of every byte, as bytes 0..15. */
static inline vi vi_nib_lo(vi v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0f)); }
static inline vi vi_nib_hi(vi v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0f)); }
static inline vf vf_from_vi(vi v) { return _mm512_cvtepi32_ps(v); }

#include "kernels/cpu/simd_exp.h"

#endif
