/*
 * linear_affine4_avx512_bf16.c - the affine4 (affine4_gs32) prefill matmul on VNNI
 * (vpdpbusd): the one affine4 tile whose instructions differ from
 * linear_affine4_simd.h, written by hand (docs/ARCHITECTURE.md "ISA dispatch"); the
 * avx512_bf16 level includes VNNI and inherits every other affine4 slot from
 * avx512. The nibbles are already the unsigned operand vpdpbusd wants, so per
 * 64-byte weight line (two k-quads of 16 rows) the tile pays a mask and a
 * shift once and then one vpdpbusd per token and quad, with no offset to undo.
 * The driver is linear_panel_simd.h's. Accuracy vs k_matmul_affine4_ref: exact int32 dots,
 * FP32 scaling by fma in the same block order.
 */
#include "kernels/cpu/simd_avx512.h"

/* The block primitive of linear_panel_simd.h (16 rows = one zmm): acc[t] +=
 * dot(q_w, q_x) d_w d_x + m_w d_x sum(q_x) for token t's activation block
 * x[t * xs]; each weight line is split into its nibble quads once for all T. */
static inline __attribute__((always_inline)) void
affine4_block(const uint8_t *pb, const k_act_q8_block *x, size_t xs, int T, vf (*acc)[1])
{
    const __m512i lo4 = _mm512_set1_epi8(0x0f);
    __m512i ia[12];
#pragma GCC unroll 12
    for (int t = 0; t < T; t++) ia[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        __m512i w = _mm512_loadu_si512((const void *)(pb + K_Q4P_Q + 64 * j));
        __m512i wl = _mm512_and_si512(w, lo4), wh = _mm512_and_si512(_mm512_srli_epi16(w, 4), lo4);
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) {
            int32_t xl, xh;
            memcpy(&xl, x[(size_t)t * xs].q + 4 * j, 4);
            memcpy(&xh, x[(size_t)t * xs].q + 4 * (j + 4), 4);
            ia[t] = _mm512_dpbusd_epi32(ia[t], wl, _mm512_set1_epi32(xl));
            ia[t] = _mm512_dpbusd_epi32(ia[t], wh, _mm512_set1_epi32(xh));
        }
    }
    __m512 dw = vf_load_h((const uint16_t *)pb), mw = vf_load_h((const uint16_t *)pb + 16);
#pragma GCC unroll 12
    for (int t = 0; t < T; t++) {
        const k_act_q8_block *xt = &x[(size_t)t * xs];
        acc[t][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t]), _mm512_mul_ps(dw, _mm512_set1_ps(xt->d)), acc[t][0]);
        acc[t][0] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xt->d * (float)xt->sum), acc[t][0]);
    }
}

/* Tile: 16 rows x 12 tokens. */
#define PD_FMT affine4
#define PD_SFX _avx512_bf16
#define PD_TT 12
#include "kernels/cpu/linear_panel_simd.h"
