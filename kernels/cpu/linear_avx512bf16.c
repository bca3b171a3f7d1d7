/*
 * linear_avx512bf16.c - the bf16 prefill matmul on vdpbf16ps (_mm512_dpbf16_ps,
 * 32 MACs per instruction, 2 per cycle on Zen 4/5): the one tile of the bf16
 * format whose instructions differ from the FP32-FMA tile of linear_simd.h, so
 * it is written by hand (ARCHITECTURE.md "ISA dispatch"). Every other slot of
 * the avx512_bf16 level is inherited from avx512.
 *
 * Over the packed layout [rows/16][cols/2][16][2] and BF16 activations the
 * microkernel holds 32 rows x 12 tokens = 24 zmm accumulators, loads 2 zmm of
 * weights per k-pair and feeds each token's activation pair as a 32-bit
 * broadcast, so there is no horizontal reduction. A 32-row x 256-k weight
 * block (16 KB) stays in L1 while all token tiles pass, and the row panel is
 * the outer loop: each weight byte leaves DRAM once per call. NMSE vs
 * k_matmul_bf16_ref ~1e-12 (same BF16 products, FP32 sums in another order).
 */
#include "kernels/cpu/simd_avx512.h"

/* Reinterpret 32 packed bf16 for vdpbf16ps (a no-op on hardware). */
static inline __m512bh as_bh(__m512i v)
{
    __m512bh r;
    memcpy(&r, &v, sizeof r);
    return r;
}

/* (16 * NP) rows x T tokens over k-pairs [0, kp) with vdpbf16ps; NP in {1, 2}. */
static inline __attribute__((always_inline)) void
mk_bf16(const kipp_bf16 *p0, const kipp_bf16 *p1, const kipp_bf16 *xb, size_t ldx, size_t kp,
        float *y, size_t ldy, int T, int NP, int load)
{
    __m512 a[12][2];
#pragma GCC unroll 12
    for (int t = 0; t < T; t++)
#pragma GCC unroll 2
        for (int h = 0; h < NP; h++)
            a[t][h] = load ? _mm512_loadu_ps(y + (size_t)t * ldy + 16 * (size_t)h) : _mm512_setzero_ps();
    for (size_t k = 0; k < kp; k++) {
        __m512bh w0 = as_bh(_mm512_loadu_si512((const void *)(p0 + 32 * k)));
        __m512bh w1 = NP > 1 ? as_bh(_mm512_loadu_si512((const void *)(p1 + 32 * k))) : w0;
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) {
            int32_t pair;
            memcpy(&pair, xb + (size_t)t * ldx + 2 * k, 4);
            __m512bh xv = as_bh(_mm512_set1_epi32(pair));
            a[t][0] = _mm512_dpbf16_ps(a[t][0], w0, xv);
            if (NP > 1) a[t][1] = _mm512_dpbf16_ps(a[t][1], w1, xv);
        }
    }
#pragma GCC unroll 12
    for (int t = 0; t < T; t++)
#pragma GCC unroll 2
        for (int h = 0; h < NP; h++) _mm512_storeu_ps(y + (size_t)t * ldy + 16 * (size_t)h, a[t][h]);
}

#define MK_CASE(n)                                                  \
    case n:                                                         \
        if (NP == 2) mk_bf16(p0, p1, xb, ldx, kp, y, ldy, n, 2, load); \
        else mk_bf16(p0, p1, xb, ldx, kp, y, ldy, n, 1, load);      \
        break;

static void mk_bf16_any(const kipp_bf16 *p0, const kipp_bf16 *p1, const kipp_bf16 *xb, size_t ldx,
                        size_t kp, float *y, size_t ldy, int T, int NP, int load)
{
    switch (T) {
        MK_CASE(1) MK_CASE(2) MK_CASE(3) MK_CASE(4) MK_CASE(5) MK_CASE(6)
        MK_CASE(7) MK_CASE(8) MK_CASE(9) MK_CASE(10) MK_CASE(11)
    default:
        if (NP == 2) mk_bf16(p0, p1, xb, ldx, kp, y, ldy, 12, 2, load);
        else mk_bf16(p0, p1, xb, ldx, kp, y, ldy, 12, 1, load);
    }
}
#undef MK_CASE

#define KB_BF16 256u /* 32 rows x 256 k x 2 B = 16 KB of weights per L1 block */
#define TT_BF16 12

void k_matmul_bf16_avx512bf16(const void *wpv, const void *xav, float *y, size_t rows, size_t cols,
                              size_t n_tok, int accumulate, int ith, int nth)
{
    const kipp_bf16 *wp = wpv, *xb = xav;
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    for (size_t r = r0; r < r1; r += 32) {
        int NP = r + 32 <= r1 ? 2 : 1;
        const kipp_bf16 *p0 = wp + r * cols, *p1 = wp + (r + 16) * cols;
        for (size_t k0 = 0; k0 < cols; k0 += KB_BF16) {
            size_t kn = cols - k0 < KB_BF16 ? cols - k0 : KB_BF16;
            int load = accumulate || k0 > 0;
            for (size_t t = 0; t < n_tok; t += TT_BF16) {
                int T = (int)(n_tok - t < TT_BF16 ? n_tok - t : TT_BF16);
                mk_bf16_any(p0 + k0 * 16, NP == 2 ? p1 + k0 * 16 : p0, xb + t * cols + k0, cols,
                            kn / 2, y + t * rows + r, rows, T, NP, load);
            }
        }
    }
}
