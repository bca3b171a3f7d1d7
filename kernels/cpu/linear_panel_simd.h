/*
 * linear_panel_simd.h - the one decode and prefill driver of the 16-row-panel
 * formats with Q8 activations (q8_0's "q8p16", affine4's "q4p16"; kernels.h
 * "weight formats"), written once over a per-format block primitive and
 * included by each format's kernel file after simd_<level>.h:
 *
 *   #define PD_FMT    the format's name, e.g. q8_0: the driver calls the block
 *             primitive PD_FMT##_block and defines k_matvec_<fmt><PD_SFX> and
 *             k_matmul_<fmt><PD_SFX> over K_PANEL_BYTES_<fmt>-byte panel blocks
 *   <fmt>_block(pb, x, xs, T, acc): acc[t][v] += the scaled dot of packed
 *             panel block pb with activation block x[t * xs], t < T; an
 *             always_inline function, so T is a constant once inlined
 *   #define PD_PF     the decode prefetch distance in bytes; without it no matvec
 *   #define PD_MM_PF  the prefill tile's prefetch distance in bytes (default
 *             K_PANEL_MM_PF), issued by the first token tile of each panel only
 *   #define PD_SFX    the name suffix (default: the level's, K_SFX)
 *   #define PD_RV     row vectors per 16-row panel (default: the level's K_PANEL_RV)
 *   #define PD_TT     prefill tokens per tile: 4, 8 or 12 (tile_switch.h;
 *             default: the level's K_PANEL_TT)
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
#ifndef PD_SFX
#define PD_SFX K_SFX()
#endif
#ifndef PD_MM_PF
#define PD_MM_PF K_PANEL_MM_PF
#endif
#ifndef PD_FMT
#error "define PD_FMT first"
#endif
#define PD_CAT_(a, b) a##b
#define PD_CAT(a, b) PD_CAT_(a, b)
#define PD_BLOCK PD_CAT(PD_FMT, _block)
#define PD_BYTES PD_CAT(K_PANEL_BYTES_, PD_FMT)
#define PD_MATMUL PD_CAT(PD_CAT(k_matmul_, PD_FMT), PD_SFX)

#include "kernels/cpu/tile_switch.h"

#ifdef PD_PF
/* ---- decode: y = W x, DRAM-bound; each weight byte read once, in one stream ---- */
void PD_CAT(PD_CAT(k_matvec_, PD_FMT), PD_SFX)(const void *wpv, const void *xv, float *y, size_t rows, size_t cols, int ith, int nth)
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
            /* every line the block touches: q8p16's 544-byte blocks end mid-line */
            for (unsigned q = 0; q < (PD_BYTES + 63) / 64; q++) k_prefetch(p + PD_PF + 64 * q);
            PD_BLOCK(p, &xq[b], 1, 1, acc);
        }
        for (int v = 0; v < PD_RV; v++) vf_store(y + r + (size_t)v * VF_LANES, acc[0][v]);
    }
}
#endif

/* ---- prefill: a 16-row panel x T tokens; each block unpacked once per token tile ----
 * The first token tile of a panel brings its blocks in from DRAM (later tiles
 * find them in L1/L2), so it prefetches pf bytes ahead (0: none): a batched
 * decode step is one tile per panel, and without it every panel waited on
 * its lines as the bf16dot tile did (linear_bf16dot_avx512_bf16.c DM_PF).
 * Prefetches change no bit of y. */

static inline __attribute__((always_inline)) void
pd_tile(const uint8_t *panel, size_t nb, const k_act_q8_block *xa, float *y, size_t ldy, int T, int load, size_t pf)
{
    vf acc[PD_TT][PD_RV];
#pragma GCC unroll 12
    for (int t = 0; t < T; t++)
        for (int v = 0; v < PD_RV; v++)
            acc[t][v] = load ? vf_load(y + (size_t)t * ldy + (size_t)v * VF_LANES) : vf_zero();
    for (size_t b = 0; b < nb; b++) {
        if (pf)
            for (unsigned q = 0; q < (PD_BYTES + 63) / 64; q++) k_prefetch(panel + b * PD_BYTES + pf + 64 * q);
        PD_BLOCK(panel + b * PD_BYTES, xa + b, nb, T, acc);
    }
#pragma GCC unroll 12
    for (int t = 0; t < T; t++)
        for (int v = 0; v < PD_RV; v++) vf_store(y + (size_t)t * ldy + (size_t)v * VF_LANES, acc[t][v]);
}

static void pd_tile_any(const uint8_t *panel, size_t nb, const k_act_q8_block *xa, float *y, size_t ldy, int T,
                        int load, size_t pf)
{
#define PD_TILE(n) pd_tile(panel, nb, xa, y, ldy, n, load, pf)
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
            pd_tile_any(panel, nb, xa + t * nb, y + t * rows + r, rows, T, accumulate, t == 0 ? PD_MM_PF : 0);
        }
    }
}

#undef PD_FMT
#undef PD_PF
#undef PD_MM_PF
#undef PD_SFX
#undef PD_RV
#undef PD_TT
#undef PD_CAT_
#undef PD_CAT
#undef PD_BLOCK
#undef PD_BYTES
#undef PD_MATMUL
