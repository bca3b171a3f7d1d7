/*
 * linear_q8_0_avx512bf16.c - the q8_0 prefill matmul on VNNI (vpdpbusd,
 * _mm512_dpbusd_epi32: 64 int8 MACs per instruction): the one q8_0 tile whose
 * instructions differ from linear_q8_0_simd.h, so it is written by hand
 * (ARCHITECTURE.md "ISA dispatch"). The avx512_bf16 level includes VNNI (Zen
 * 4/5, Sapphire Rapids); every other q8_0 slot is inherited from avx512.
 *
 * vpdpbusd multiplies unsigned by signed bytes. The weights are made unsigned
 * by w + 128 (one XOR with 0x80 per 64-byte weight line, shared by every token
 * of the tile), so per block the int32 lane holds dot(w, x) + 128 * sum(x);
 * the activation block's sum (k_act_q8_block.sum) takes the offset back out
 * exactly. Per token and k-quad that leaves one broadcast and one vpdpbusd for
 * 16 rows x 4 k, against four instructions on the vpmaddubsw path.
 *
 * Tile: 16 rows x 12 tokens = 12 int32 + 12 FP32 accumulators. A panel's
 * blocks stay in L1/L2 while the token tiles pass; each weight byte leaves
 * DRAM once per call. Accuracy vs k_matmul_q8_0_ref: the same exact int32
 * block dots; FP32 scaling by fma in the same block order (NMSE ~1e-14).
 */
#include "kernels/cpu/simd_avx512.h"

#define TT_VNNI 12

static inline __attribute__((always_inline)) void
mk_q8(const uint8_t *panel, size_t nb, const k_act_q8_block *xa, float *y, size_t ldy, int T, int load)
{
    const __m512i off = _mm512_set1_epi8((char)0x80);
    __m512 acc[TT_VNNI];
#pragma GCC unroll 12
    for (int t = 0; t < T; t++) acc[t] = load ? _mm512_loadu_ps(y + (size_t)t * ldy) : _mm512_setzero_ps();
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *pb = panel + b * K_Q8P_BLOCK;
        __m512i ia[TT_VNNI];
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) ia[t] = _mm512_set1_epi32(-128 * xa[(size_t)t * nb + b].sum);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m512i w = _mm512_xor_si512(_mm512_loadu_si512((const void *)(pb + 64 + 64 * j)), off);
#pragma GCC unroll 12
            for (int t = 0; t < T; t++) {
                int32_t xq;
                memcpy(&xq, xa[(size_t)t * nb + b].q + 4 * j, 4);
                ia[t] = _mm512_dpbusd_epi32(ia[t], w, _mm512_set1_epi32(xq));
            }
        }
        __m512 dw = _mm512_loadu_ps((const float *)pb);
#pragma GCC unroll 12
        for (int t = 0; t < T; t++)
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t]), _mm512_mul_ps(dw, _mm512_set1_ps(xa[(size_t)t * nb + b].d)), acc[t]);
    }
#pragma GCC unroll 12
    for (int t = 0; t < T; t++) _mm512_storeu_ps(y + (size_t)t * ldy, acc[t]);
}

#define MK_CASE(n) case n: mk_q8(panel, nb, xa, y, ldy, n, load); break;

static void mk_q8_any(const uint8_t *panel, size_t nb, const k_act_q8_block *xa, float *y, size_t ldy, int T, int load)
{
    switch (T) {
        MK_CASE(1) MK_CASE(2) MK_CASE(3) MK_CASE(4) MK_CASE(5) MK_CASE(6)
        MK_CASE(7) MK_CASE(8) MK_CASE(9) MK_CASE(10) MK_CASE(11)
    default: mk_q8(panel, nb, xa, y, ldy, TT_VNNI, load);
    }
}
#undef MK_CASE

void k_matmul_q8_0_avx512bf16(const void *wpv, const void *xav, float *y, size_t rows, size_t cols,
                              size_t n_tok, int accumulate, int ith, int nth)
{
    const k_act_q8_block *xa = xav;
    const size_t nb = cols / 32;
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    for (size_t r = r0; r < r1; r += 16) {
        const uint8_t *panel = (const uint8_t *)wpv + r / 16 * nb * K_Q8P_BLOCK;
        for (size_t t = 0; t < n_tok; t += TT_VNNI) {
            int T = (int)(n_tok - t < TT_VNNI ? n_tok - t : TT_VNNI);
            mk_q8_any(panel, nb, xa + t * nb, y + t * rows + r, rows, T, accumulate);
        }
    }
}
