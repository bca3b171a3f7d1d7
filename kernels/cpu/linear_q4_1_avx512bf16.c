/*
 * linear_q4_1_avx512bf16.c - the q4_1 (affine4_gs32) prefill matmul on VNNI
 * (vpdpbusd): the one q4_1 tile whose instructions differ from
 * linear_q4_1_simd.h, written by hand (ARCHITECTURE.md "ISA dispatch"); the
 * avx512_bf16 level includes VNNI and inherits every other q4_1 slot from
 * avx512. The nibbles are already the unsigned operand vpdpbusd wants, so per
 * 64-byte weight line (two k-quads of 16 rows) the tile pays a mask and a
 * shift once and then one vpdpbusd per token and quad, with no offset to undo.
 * Tile: 16 rows x 12 tokens. Accuracy vs k_matmul_q4_1_ref: exact int32 dots,
 * FP32 scaling by fma in the same block order.
 */
#include "kernels/cpu/simd_avx512.h"

#define TT_VNNI 12

static inline __attribute__((always_inline)) void
mk_q4(const uint8_t *panel, size_t nb, const k_act_q8_block *xa, float *y, size_t ldy, int T, int load)
{
    const __m512i lo4 = _mm512_set1_epi8(0x0f);
    __m512 acc[TT_VNNI];
#pragma GCC unroll 12
    for (int t = 0; t < T; t++) acc[t] = load ? _mm512_loadu_ps(y + (size_t)t * ldy) : _mm512_setzero_ps();
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *pb = panel + b * K_Q4P_BLOCK;
        __m512i ia[TT_VNNI];
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) ia[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            __m512i w = _mm512_loadu_si512((const void *)(pb + 128 + 64 * j));
            __m512i wl = _mm512_and_si512(w, lo4), wh = _mm512_and_si512(_mm512_srli_epi16(w, 4), lo4);
#pragma GCC unroll 12
            for (int t = 0; t < T; t++) {
                int32_t xl, xh;
                memcpy(&xl, xa[(size_t)t * nb + b].q + 4 * j, 4);
                memcpy(&xh, xa[(size_t)t * nb + b].q + 4 * (j + 4), 4);
                ia[t] = _mm512_dpbusd_epi32(ia[t], wl, _mm512_set1_epi32(xl));
                ia[t] = _mm512_dpbusd_epi32(ia[t], wh, _mm512_set1_epi32(xh));
            }
        }
        __m512 dw = _mm512_loadu_ps((const float *)pb), mw = _mm512_loadu_ps((const float *)(pb + 64));
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) {
            const k_act_q8_block *x = &xa[(size_t)t * nb + b];
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t]), _mm512_mul_ps(dw, _mm512_set1_ps(x->d)), acc[t]);
            acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(x->d * (float)x->sum), acc[t]);
        }
    }
#pragma GCC unroll 12
    for (int t = 0; t < T; t++) _mm512_storeu_ps(y + (size_t)t * ldy, acc[t]);
}

#define MK_CASE(n) case n: mk_q4(panel, nb, xa, y, ldy, n, load); break;

static void mk_q4_any(const uint8_t *panel, size_t nb, const k_act_q8_block *xa, float *y, size_t ldy, int T, int load)
{
    switch (T) {
        MK_CASE(1) MK_CASE(2) MK_CASE(3) MK_CASE(4) MK_CASE(5) MK_CASE(6)
        MK_CASE(7) MK_CASE(8) MK_CASE(9) MK_CASE(10) MK_CASE(11)
    default: mk_q4(panel, nb, xa, y, ldy, TT_VNNI, load);
    }
}
#undef MK_CASE

void k_matmul_q4_1_avx512bf16(const void *wpv, const void *xav, float *y, size_t rows, size_t cols,
                              size_t n_tok, int accumulate, int ith, int nth)
{
    const k_act_q8_block *xa = xav;
    const size_t nb = cols / 32;
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    for (size_t r = r0; r < r1; r += 16) {
        const uint8_t *panel = (const uint8_t *)wpv + r / 16 * nb * K_Q4P_BLOCK;
        for (size_t t = 0; t < n_tok; t += TT_VNNI) {
            int T = (int)(n_tok - t < TT_VNNI ? n_tok - t : TT_VNNI);
            mk_q4_any(panel, nb, xa + t * nb, y + t * rows + r, rows, T, accumulate);
        }
    }
}
