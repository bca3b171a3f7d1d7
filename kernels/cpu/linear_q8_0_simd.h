/*
 * linear_q8_0_simd.h - the q8_0 format's block primitive over the packed
 * layout "q8p16" (kernels.h "weight formats") with Q8 activations (seed 002:
 * weights stay quantized, activations are int8 per 32-block, the dot is an
 * integer dot), written once over simd_<level>.h; the decode matvec and the
 * prefill matmul are linear_panel_simd.h's driver around it. Compiled per
 * level by linear_q8_0_avx2.c and linear_q8_0_avx512.c. The avx512_bf16
 * level (which has VNNI) replaces only the matmul (linear_q8_0_avx512_bf16.c:
 * vpdpbusd in its own primitive, the same driver).
 *
 * One 64-byte line of a panel block holds 16 rows x 4 k, so vi_dot4 against
 * a 32-bit broadcast of 4 activation bytes gives each row lane its partial
 * dot with no horizontal reduction; the 8 lines of a block sum exactly in
 * int32, then one FMA per lane applies d_w * d_x. Accuracy vs the *_ref
 * kernels: the same exact int32 block dots, FP32 scaling and sums rounded in
 * another order (fma), NMSE ~1e-14 (kcheck).
 *
 * The Q8 activation quantizer is written for AVX2 (VF_LANES == 8) only: it is
 * 1/rows of a projection's work, and the avx512 level inherits it.
 */
/* The block primitive of linear_panel_simd.h: acc[t][v] += the exact int32
 * dots of panel block pb with token t's activation block x[t * xs], times
 * d_w * d_x. The 8 weight lines are loaded once for all T tokens. */
static inline __attribute__((always_inline)) void
q8_0_block(const uint8_t *pb, const k_act_q8_block *x, size_t xs, int T, vf (*acc)[K_PANEL_RV])
{
    vi iacc[K_PANEL_TT][K_PANEL_RV] = {0}; /* the T rows used; the rest is dead once T is constant */
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        vi w[K_PANEL_RV];
        for (int v = 0; v < K_PANEL_RV; v++) w[v] = vi_load(pb + K_Q8P_Q + 64 * j + 4 * VF_LANES * v);
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) {
            vi xb = vi_bcast4(x[(size_t)t * xs].q + 4 * j), ax = vi_abs8(xb);
            for (int v = 0; v < K_PANEL_RV; v++) iacc[t][v] = vi_dot4(iacc[t][v], w[v], xb, ax);
        }
    }
    vf dw[K_PANEL_RV];
    for (int v = 0; v < K_PANEL_RV; v++) dw[v] = vf_load_h((const uint16_t *)pb + v * VF_LANES);
#pragma GCC unroll 12
    for (int t = 0; t < T; t++) {
        vf dx = vf_set1(x[(size_t)t * xs].d);
        for (int v = 0; v < K_PANEL_RV; v++) acc[t][v] = vf_fma(vf_from_vi(iacc[t][v]), vf_mul(dw[v], dx), acc[t][v]);
    }
}

#define PD_FMT q8_0
#define PD_PF 2048u /* decode prefetch distance in bytes */
#include "kernels/cpu/linear_panel_simd.h"

/* ---- the Q8 activation quantizer (kernels.h k_act_q8_block), AVX2 only ---- */
#if VF_LANES == 8
/* The largest of 8 int32 lanes. */
static inline uint32_t q8_hmax(__m256i m)
{
    __m128i h = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    h = _mm_max_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_max_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    return (uint32_t)_mm_cvtsi128_si32(h);
}

void k_quant_q8_avx2(const float *x, void *xqv, size_t n)
{
    k_act_q8_block *xq = xqv;
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (size_t b = 0; b < n / 32; b++) {
        const float *xb = x + 32 * b;
        __m256i v[4], a[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_castps_si256(_mm256_loadu_ps(xb + 8 * (size_t)i));
            a[i] = _mm256_and_si256(v[i], absmask);
        }
        __m256i mx = _mm256_max_epi32(_mm256_max_epi32(a[0], a[1]), _mm256_max_epi32(a[2], a[3]));
        uint32_t bits = q8_hmax(mx);
        float amax;
        memcpy(&amax, &bits, 4);
        int io = -1;
        /* k_q8_outlier. Fast no: two lanes of mx (maxima of distinct values) at or above
         * amax / 2^K_Q8_OUTLIER_LOG2, exact on the bits while amax's exponent allows. */
        uint32_t thr = bits - ((uint32_t)K_Q8_OUTLIER_LOG2 << 23);
        int two = bits >= ((uint32_t)(K_Q8_OUTLIER_LOG2 + 1) << 23) &&
                  __builtin_popcount((unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(
                      _mm256_cmpgt_epi32(mx, _mm256_set1_epi32((int)thr - 1))))) >= 2;
        if (bits < 0x7f800000u && !two) {
            /* the first lane holding the largest |x|, against the largest of the other
             * lanes (the largest itself when it occurs twice) */
            __m256i top = _mm256_set1_epi32((int)bits), eq[4];
            uint32_t mask = 0;
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                eq[i] = _mm256_cmpeq_epi32(a[i], top);
                mask |= (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(eq[i])) << (8 * i);
            }
            uint32_t bits2 = __builtin_popcount(mask) > 1
                                 ? bits
                                 : q8_hmax(_mm256_max_epi32(_mm256_max_epi32(_mm256_andnot_si256(eq[0], a[0]),
                                                                              _mm256_andnot_si256(eq[1], a[1])),
                                                            _mm256_max_epi32(_mm256_andnot_si256(eq[2], a[2]),
                                                                             _mm256_andnot_si256(eq[3], a[3]))));
            float a2;
            memcpy(&a2, &bits2, 4);
            if (amax > K_Q8_OUTLIER_RATIO * a2) { /* drop the outlier's lane: the rest take the second largest */
                io = __builtin_ctz(mask);
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) v[i] = _mm256_andnot_si256(eq[i], v[i]);
                bits = bits2;
                memcpy(&amax, &bits, 4);
            }
        }
        xq[b].io = io;
        xq[b].xo = io >= 0 ? xb[io] : 0.0f;
        __m256 id = _mm256_set1_ps(amax > 1e-30f && amax < __builtin_inff() ? 127.0f / amax : 0.0f);
        __m256i q[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_castsi256_ps(v[i]), id));
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        p = _mm256_permutevar8x32_epi32(p, perm);
        _mm256_storeu_si256((__m256i *)xq[b].q, p);
        __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), p), _mm256_set1_epi16(1));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        xq[b].d = amax / 127.0f;
        xq[b].sum = _mm_cvtsi128_si32(s4);
    }
}
#endif

