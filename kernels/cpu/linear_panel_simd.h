/*
 * linear_panel_simd.h - the one decode and prefill driver of the 16-row-panel
 * formats with Q8 activations (q8_0's "q8p16", q4_1's "q4p16"; kernels.h
 * "weight formats"), written once over a per-format block primitive and
 * included by each format's kernel file after simd_<level>.h:
 *
 *   #define PD_RV     row vectors per 16-row panel (default: the level's K_PANEL_RV)
 *   PD_BLOCK(pb, x, xs, T, acc): acc[t][v] += the scaled dot of packed panel
 *             block pb with activation block x[t * xs], t < T; an
 *             always_inline function, so T is a constant once inlined
 *   #define PD_BYTES  bytes of one packed panel block
 *   #define PD_TT     prefill tokens per tile: 4, 8 or 12 (tile_switch.h;
 *             default: the level's K_PANEL_TT)
 *   #define PD_MATMUL the matmul's name (k_matmul_fn)
 *   #define PD_MATVEC the matvec's name (k_matvec_fn), optional; with it
 *   #define PD_PF     the decode prefetch distance in bytes
 *
 * and #undef's them all at its end. Row invariance (kernels.h): the matvec is
 * the tile of one token, so a row's chain over the blocks is the same ops in
 * decode and in every prefill tile shape.
 */
#ifndef K_SFX
#error "include kernels/cpu/simd_<level>.h first"
#endif
#ifndef PD_RV
#define PD_RV K_PANEL_RV
#endif
#ifndef PD_TT
#define PD_TT K_PANEL_TT
#endif
#if !defined(PD_BLOCK) || !defined(PD_BYTES) || !defined(PD_MATMUL)
#error "define PD_BLOCK, PD_BYTES and PD_MATMUL first"
#endif

#include "kernels/cpu/tile_switch.h"

#ifdef PD_MATVEC
/* ---- decode: y = W x, DRAM-bound; each weight byte read once, in one stream ---- */
void PD_MATVEC(const void *wpv, const void *xv, float *y, size_t rows, size_t cols, int ith, int nth)
{
    const k_act_q8_block *xq = xv;
    const size_t nb = cols / 32;
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    const uint8_t *p = (const uint8_t *)wpv + r0 / 16 * nb * PD_BYTES;
    for (size_t r = r0; r < r1; r += 16) {
        vf acc[1][PD_RV];
        for (int v = 0; v < PD_RV; v++) acc[0][v] = vf_zero();
        for (size_t b = 0; b < nb; b++, p += PD_BYTES) {
            for (unsigned q = 0; q < PD_BYTES / 64; q++) k_prefetch(p + PD_PF + 64 * q);
            PD_BLOCK(p, &xq[b], 1, 1, acc);
        }
        for (int v = 0; v < PD_RV; v++) vf_store(y + r + (size_t)v * KV_W, acc[0][v]);
    }
}
#endif

/* ---- prefill: a 16-row panel x T tokens; each block unpacked once per token tile ---- */

static inline __attribute__((always_inline)) void
pd_tile(const uint8_t *panel, size_t nb, const k_act_q8_block *xa, float *y, size_t ldy, int T, int load)
{
    vf acc[PD_TT][PD_RV];
#pragma GCC unroll 12
    for (int t = 0; t < T; t++)
        for (int v = 0; v < PD_RV; v++)
            acc[t][v] = load ? vf_load(y + (size_t)t * ldy + (size_t)v * KV_W) : vf_zero();
    for (size_t b = 0; b < nb; b++) PD_BLOCK(panel + b * PD_BYTES, xa + b, nb, T, acc);
#pragma GCC unroll 12
    for (int t = 0; t < T; t++)
        for (int v = 0; v < PD_RV; v++) vf_store(y + (size_t)t * ldy + (size_t)v * KV_W, acc[t][v]);
}

static void pd_tile_any(const uint8_t *panel, size_t nb, const k_act_q8_block *xa, float *y, size_t ldy, int T,
                        int load)
{
#define PD_TILE(n) pd_tile(panel, nb, xa, y, ldy, n, load)
    K_TILE_SWITCH(T, PD_TT, PD_TILE)
#undef PD_TILE
}

/* Loop order: 16-row panel (outer: its weights leave DRAM once per call and
 * stay in L1/L2 while the token tiles pass), token tile, blocks. */
void PD_MATMUL(const void *wpv, const void *xav, float *y, size_t rows, size_t cols, size_t n_tok, int accumulate,
               int ith, int nth)
{
    const k_act_q8_block *xa = xav;
    const size_t nb = cols / 32;
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    for (size_t r = r0; r < r1; r += 16) {
        const uint8_t *panel = (const uint8_t *)wpv + r / 16 * nb * PD_BYTES;
        for (size_t t = 0; t < n_tok; t += PD_TT) {
            int T = (int)(n_tok - t < PD_TT ? n_tok - t : PD_TT);
            pd_tile_any(panel, nb, xa + t * nb, y + t * rows + r, rows, T, accumulate);
        }
    }
}

#undef PD_RV
#undef PD_BLOCK
#undef PD_BYTES
#undef PD_TT
#undef PD_MATMUL
#undef PD_MATVEC
#undef PD_PF
