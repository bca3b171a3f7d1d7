/*
 * linear_affine4_simd.h - the affine4 format's (scheme affine4_gs32) block
 * primitive over the packed layout "q4p16" (kernels.h "weight formats") with
 * Q8 activations (seed 002: weights stay quantized, int8 activations, integer
 * dot), written once over simd_<level>.h; the decode matvec and the prefill
 * matmul are linear_panel_simd.h's driver around it. Compiled by
 * linear_affine4_avx2.c and linear_affine4_avx512.c; the avx512_bf16 level (VNNI)
 * replaces only the matmul (linear_affine4_avx512_bf16.c: its own primitive, the
 * same driver).
 *
 * A 64-byte line of a panel block holds two k-quads of 16 rows x 4 k as
 * nibbles: a mask gives quad j, a shift and a mask quad j + 4, already
 * unsigned, so vpmaddubsw (weights as the unsigned operand) needs no sign
 * trick. Per block and row lane: acc += dot * (d_w * d_x), then
 * acc += m_w * (d_x * sum(q_x)). Accuracy vs the *_ref kernels: exact int32
 * dots, FP32 rounded in another order (fma).
 */
/* The block primitive of linear_panel_simd.h: acc[t][v] += the exact int32
 * dots of panel block pb with token t's activation block x[t * xs] times
 * d_w * d_x, then m_w * (d_x * sum(q_x)). Each weight line is loaded and
 * split into its two nibble quads once for all T tokens. */
static inline __attribute__((always_inline)) void
affine4_block(const uint8_t *pb, const k_act_q8_block *x, size_t xs, int T, vf (*acc)[K_PANEL_RV])
{
    vi iacc[K_PANEL_TT][K_PANEL_RV] = {0}; /* the T rows used; the rest is dead once T is constant */
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        vi wl[K_PANEL_RV], wh[K_PANEL_RV];
        for (int v = 0; v < K_PANEL_RV; v++) {
            vi w = vi_load(pb + K_Q4P_Q + 64 * j + 4 * VF_LANES * v);
            wl[v] = vi_nib_lo(w);
            wh[v] = vi_nib_hi(w);
        }
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) {
            const int8_t *xq = x[(size_t)t * xs].q;
            vi xlo = vi_bcast4(xq + 4 * j), xhi = vi_bcast4(xq + 4 * (j + 4));
            for (int v = 0; v < K_PANEL_RV; v++) {
                iacc[t][v] = vi_dot4u(iacc[t][v], wl[v], xlo);
                iacc[t][v] = vi_dot4u(iacc[t][v], wh[v], xhi);
            }
        }
    }
    vf dw[K_PANEL_RV], mw[K_PANEL_RV];
    for (int v = 0; v < K_PANEL_RV; v++) {
        dw[v] = vf_load_h((const uint16_t *)pb + v * VF_LANES);
        mw[v] = vf_load_h((const uint16_t *)pb + 16 + v * VF_LANES);
    }
#pragma GCC unroll 12
    for (int t = 0; t < T; t++) {
        const k_act_q8_block *xt = &x[(size_t)t * xs];
        vf dx = vf_set1(xt->d), ms = vf_set1(xt->d * (float)xt->sum);
        for (int v = 0; v < K_PANEL_RV; v++) {
            acc[t][v] = vf_fma(vf_from_vi(iacc[t][v]), vf_mul(dw[v], dx), acc[t][v]);
            acc[t][v] = vf_fma(mw[v], ms, acc[t][v]);
        }
    }
}

#define PD_FMT affine4
#define PD_PF 1536u /* decode prefetch distance in bytes */
#include "kernels/cpu/linear_panel_simd.h"

