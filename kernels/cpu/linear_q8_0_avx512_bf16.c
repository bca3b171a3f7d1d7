/*
 * linear_q8_0_avx512_bf16.c - the q8_0 prefill matmul on VNNI (vpdpbusd,
 * _mm512_dpbusd_epi32: 64 int8 MACs per instruction): the one q8_0 tile whose
 * instructions differ from linear_q8_0_simd.h, so it is written by hand
 * (docs/ARCHITECTURE.md "ISA dispatch"). The avx512_bf16 level includes VNNI (Zen
 * 4/5, Sapphire Rapids); every other q8_0 slot is inherited from avx512.
 *
 * vpdpbusd multiplies unsigned by signed bytes. The weights are made unsigned
 * by w + 128 (one XOR with 0x80 per 64-byte weight line, shared by every token
 * of the tile), so per block the int32 lane holds dot(w, x) + 128 * sum(x);
 * the activation block's sum (k_act_q8_block.sum) takes the offset back out
 * exactly. Per token and k-quad that leaves one broadcast and one vpdpbusd for
 * 16 rows x 4 k, against four instructions on the vpmaddubsw path.
 *
 * The driver is linear_panel_simd.h's: a panel's blocks stay in L1/L2 while
 * the token tiles pass; each weight byte leaves DRAM once per call. Accuracy vs k_matmul_q8_0_ref: the same exact int32
 * block dots; FP32 scaling by fma in the same block order (NMSE ~1e-14).
 */
#include "kernels/cpu/simd_avx512.h"

/* The block primitive of linear_panel_simd.h (16 rows = one zmm): acc[t] +=
 * (dot(w, x_t) + 128 sum(x_t) - 128 sum(x_t)) * d_w d_x for token t's
 * activation block x[t * xs]; each weight line is offset once for all T. */
static inline __attribute__((always_inline)) void
q8_0_block(const uint8_t *pb, const k_act_q8_block *x, size_t xs, int T, vf (*acc)[1])
{
    const __m512i off = _mm512_set1_epi8((char)0x80);
    __m512i ia[12];
#pragma GCC unroll 12
    for (int t = 0; t < T; t++) ia[t] = _mm512_set1_epi32(-128 * x[(size_t)t * xs].sum);
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        __m512i w = _mm512_xor_si512(_mm512_loadu_si512((const void *)(pb + K_Q8P_Q + 64 * j)), off);
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) {
            int32_t xq;
            memcpy(&xq, x[(size_t)t * xs].q + 4 * j, 4);
            ia[t] = _mm512_dpbusd_epi32(ia[t], w, _mm512_set1_epi32(xq));
        }
    }
    __m512 dw = vf_load_h((const uint16_t *)pb);
#pragma GCC unroll 12
    for (int t = 0; t < T; t++)
        acc[t][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t]), _mm512_mul_ps(dw, _mm512_set1_ps(x[(size_t)t * xs].d)),
                                    acc[t][0]);
}

/* Tile: 16 rows x 12 tokens = 12 int32 + 12 FP32 accumulators. */
#define PD_FMT q8_0
#define PD_SFX _avx512_bf16
#define PD_TT 12
#include "kernels/cpu/linear_panel_simd.h"
