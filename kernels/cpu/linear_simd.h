/*
 * linear_simd.h - the bf16 format's decode matvec and FP32-FMA prefill matmul
 * over the packed layout [rows/16][cols/2][16][2] (kernels.h "weight
 * formats"), written once over simd_<level>.h and compiled per level by
 * linear_<level>.c. The avx512_bf16 level inherits both; its vdpbf16ps
 * kernels read the same packed bytes with BF16 activations as a separate read
 * mode, bf16dot (linear_bf16dot_avx512_bf16.c), which the backend picks per
 * projection.
 *
 * A weight pair is widened to FP32 in registers (a BF16 is the top half of an
 * FP32: a shift or a mask) and multiplied with FMA against FP32 activations,
 * so accuracy equals FP32: vs the *_ref kernels the same products, summed with
 * fused rounding, NMSE ~1e-12 (kcheck). Activations are never rounded to
 * BF16: that rounding would be the main error against FP64, and it would
 * differ between decode and prefill unless both rounded alike (the bf16dot
 * read mode rounds them alike and is opt-in).
 */
#ifndef K_SFX
#error "include kernels/cpu/simd_<level>.h first"
#endif

#include "kernels/cpu/tile_switch.h"

/* ---- decode: y = W x, DRAM-bound ----
 *
 * Row invariance (kernels.h): every row lane runs ONE FMA chain, k-pair by
 * k-pair in column order, even element then odd, from zero: exactly the chain
 * of the prefill tile below, so a token's projection is bitwise the same in
 * decode and in prefill. How many panels are walked together (MV_NP, each
 * panel its own stream, MV_NP * MV_NV independent chains) leaves every chain
 * as it is; it trades latency hiding against DRAM streams per thread.
 *
 * AVX-512 walks one panel (K_MV_PANELS 1): a single chain of 2 FMAs per
 * 64 bytes still outruns a core's DRAM share, and one stream per thread reads
 * faster than several (docs/PERFORMANCE.md "Kernel design measurements").
 * AVX2 keeps 4 panels: 8 chains of ymm to hide the FMA latency. */

/* No software prefetch: the panels are sequential streams the hardware
 * prefetchers follow; a software prefetch of every line 2 KB ahead only
 * competes with them and reads slower (docs/PERFORMANCE.md "Kernel design
 * measurements"). */
#define MV_NV (16 / VF_LANES)  /* vectors per 16-row panel line (k-pair) */
#define MV_NP K_MV_PANELS  /* panels walked together */

/* NP panels starting at p (panel stride ps elements) into y[0, 16*NP). */
static inline __attribute__((always_inline)) void
mv_panels(const kipp_bf16 *p, size_t ps, const float *x, float *y, size_t cols, int NP)
{
    vf a[MV_NP][MV_NV];
#pragma GCC unroll 8
    for (int j = 0; j < NP; j++)
#pragma GCC unroll 2
        for (int v = 0; v < MV_NV; v++) a[j][v] = vf_zero();
    for (size_t c = 0; c < cols; c += 16, p += 256) { /* eight k-pairs = 512 B per panel per step */
#pragma GCC unroll 8
        for (int h = 0; h < 8; h++) {
            vf xe = vf_bcast(x + c + 2 * (size_t)h), xo = vf_bcast(x + c + 2 * (size_t)h + 1);
#pragma GCC unroll 8
            for (int j = 0; j < NP; j++)
#pragma GCC unroll 2
                for (int v = 0; v < MV_NV; v++) {
                    vi w = vi_load(p + (size_t)j * ps + 32 * h + 2 * VF_LANES * v);
                    a[j][v] = vf_fma(vf_even(w), xe, a[j][v]);
                    a[j][v] = vf_fma(vf_odd(w), xo, a[j][v]);
                }
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < NP; j++)
#pragma GCC unroll 2
        for (int v = 0; v < MV_NV; v++) vf_store(y + 16 * (size_t)j + (size_t)v * VF_LANES, a[j][v]);
}

void K_SFX(k_matvec_bf16)(const void *wpv, const void *xv, float *y, size_t rows, size_t cols, int ith, int nth)
{
    const float *x = xv;
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    const kipp_bf16 *wp = wpv;
    const size_t ps = 16 * cols; /* elements per panel */
    size_t r = r0;
    for (; r + 16 * MV_NP <= r1; r += 16 * MV_NP) mv_panels(wp + r * cols, ps, x, y + r, cols, MV_NP);
    for (; r < r1; r += 16) mv_panels(wp + r * cols, ps, x, y + r, cols, 1); /* tail panels, one at a time */
}

/* ---- prefill: FP32 FMA on pre-widened weights and FP32 activations ----
 *
 * Per group of MM_GROUP rows and block of MM_KB k, the block's weights are
 * widened once to FP32 (wf: per row tile, [k][tile rows]) and then reused by
 * every token tile, so the inner loop is loads, broadcasts and FMAs only (the
 * shift-and-mask widening per token tile cost FMA-port slots). Each row
 * lane's chain is the matvec's: k in column order from zero, so the block
 * sizes change no bit of y (y holds the chain between blocks, exactly).
 *
 * The block sizes are per level (simd_<level>.h). AVX2 keeps wf in L2
 * (128 rows x 256 k x 4 B = 128 KB) and the token tile's x (6 x 256 floats)
 * in L1: each x line fetched from L3 then feeds 128 rows, not 32 as with an
 * L1-sized wf (32 rows x 128 k), where every group streams all of x from L3
 * (docs/PERFORMANCE.md "Kernel design measurements"). A wf stream from L2 is
 * 2 vectors per 12 FMAs, sequential, well inside L2's rate. AVX-512 keeps
 * the L1 block (32 x 128). */

#define MM_RV 2                /* row vectors per micro-tile: 16 rows on AVX2, 32 on AVX-512 */
#define MM_KB K_MM_KB          /* k per block */
#define MM_GROUP K_MM_GROUP    /* rows per group: a multiple of MM_RV * VF_LANES */
_Static_assert(MM_GROUP % (MM_RV * VF_LANES) == 0, "MM_GROUP must hold whole row tiles");

/* Element offset of row vector 1 from row vector 0 in the packed layout: the
 * second half of the same 64-byte panel line (8 lanes), or the next panel (16). */
#define MM_HI_OFF(cols) (VF_LANES == 16 ? 16 * (cols) : 2 * (size_t)VF_LANES)

/* Widen one row tile (RV row vectors) over k-pairs [0, kp) of the packed
 * layout at p into wf[2 kp][RV * VF_LANES] f32 (exact). The widening is the one
 * read of these weights from DRAM: it prefetches MM_PF elements ahead, since
 * the hardware streamers restart at every 4 KB page and a few-token matmul
 * (batched decode) otherwise waits on each line. */
#define MM_PF 1024u
static void mm_widen(const kipp_bf16 *p, size_t hi_off, size_t kp, int RV, float *wf)
{
    const size_t ld = (size_t)RV * VF_LANES;
    for (size_t k = 0; k < kp; k++, p += 32, wf += 2 * ld) {
        k_prefetch(p + MM_PF);
        if (RV > 1 && VF_LANES == 16) k_prefetch(p + hi_off + MM_PF);
        vi lo = vi_load(p);
        vf_store(wf, vf_even(lo));
        vf_store(wf + ld, vf_odd(lo));
        if (RV > 1) {
            vi hi = vi_load(p + hi_off);
            vf_store(wf + VF_LANES, vf_even(hi));
            vf_store(wf + ld + VF_LANES, vf_odd(hi));
        }
    }
}

/* RV row vectors x T tokens over k [0, kn); wf: [kn][RV * VF_LANES] widened
 * weights; x: token rows of ldx floats. Live set: RV*T accumulators + RV
 * weights + 1 broadcast. */
static inline __attribute__((always_inline)) void
mm_tile(const float *wf, const float *x, size_t ldx, size_t kn, float *y, size_t ldy, int T, int RV, int load)
{
    vf a[K_MM_TT][MM_RV];
#pragma GCC unroll 12
    for (int t = 0; t < T; t++)
#pragma GCC unroll 2
        for (int v = 0; v < RV; v++)
            a[t][v] = load ? vf_load(y + (size_t)t * ldy + (size_t)v * VF_LANES) : vf_zero();
    const size_t ld = (size_t)RV * VF_LANES;
    for (size_t k = 0; k < kn; k++, wf += ld) {
        vf w0 = vf_load(wf), w1 = RV > 1 ? vf_load(wf + VF_LANES) : w0;
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) {
            vf xk = vf_bcast(x + (size_t)t * ldx + k);
            a[t][0] = vf_fma(w0, xk, a[t][0]);
            if (RV > 1) a[t][1] = vf_fma(w1, xk, a[t][1]);
        }
    }
#pragma GCC unroll 12
    for (int t = 0; t < T; t++)
#pragma GCC unroll 2
        for (int v = 0; v < RV; v++) vf_store(y + (size_t)t * ldy + (size_t)v * VF_LANES, a[t][v]);
}

/* Constant T and RV per call, so every tile shape is fully unrolled. */
static void mm_tile_any(const float *wf, const float *x, size_t ldx, size_t kn, float *y, size_t ldy, int T, int RV,
                        int load)
{
#define MM_T(n)                                                   \
    if (RV > 1) mm_tile(wf, x, ldx, kn, y, ldy, n, 2, load);      \
    else mm_tile(wf, x, ldx, kn, y, ldy, n, 1, load)
    K_TILE_SWITCH(T, K_MM_TT, MM_T)
#undef MM_T
}

/* Widen the group's row tiles [rg, re) over k-block [k0, k0 + kn) into wf. */
static void mm_widen_group(const kipp_bf16 *wp, size_t cols, size_t rg, size_t re, size_t k0, size_t kn, float *wf)
{
    const size_t tile_rows = MM_RV * VF_LANES, hi_off = MM_HI_OFF(cols);
    for (size_t r = rg; r < re; r += tile_rows) {
        int RV = r + tile_rows <= re ? MM_RV : (int)((re - r) / VF_LANES);
        mm_widen(wp + r * cols + k0 * 16, hi_off, kn / 2, RV, wf + (r - rg) * kn);
    }
}

/* ---- batched decode: a few tokens against the packed weights as they lie ----
 *
 * Up to K_SM_MAX tokens (a batched decode step, a short prefill tail) skip the
 * widening: there wf is written and read back once per token tile, and the
 * widening pass is where the weights come from DRAM, so the read and the FMAs
 * ran one after the other (perf, 0.6B batch8: half of Q|K|V's samples on the
 * widening's stores and prefetches). The tile below widens each 64-byte line
 * in registers between its loads and its FMAs, so the loads of later lines
 * overlap the FMAs of this one. Each row lane's chain is the matvec's and
 * mm_tile's: k-pair by k-pair in column order, the even element's FMA then
 * the odd one's, from zero, so y is bitwise the widened path's. Chosen from
 * one-thread kernel timings (4096 x 1024, 16 copies past the LLC, both paths
 * in one process, loaded machine): at 4/8/16/32 tokens the small tile took
 * 0.79/0.65/0.78/0.92 of the widened path's median time on AVX-512 and
 * 0.49/0.74/0.91/0.98 on AVX2; prefill rounds (256 tokens) keep the widened
 * path. Live set:
 * SM_TT * RV accumulators + 2 * RV widened weights + 2 broadcasts (+ the odd
 * mask) of 32 zmm / 16 ymm. */
#define SM_TT K_SM_TT     /* tokens per small-M tile */
#define SM_KB 256u        /* k per block: a 32-row block is 16 KB of packed weights, in L1 for the next token tile */

static inline __attribute__((always_inline)) void
sm_tile(const kipp_bf16 *p, size_t hi_off, const float *x, size_t ldx, size_t kn, float *y, size_t ldy, int T, int RV,
        int load, size_t pf)
{
    vf a[SM_TT][MM_RV];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
#pragma GCC unroll 2
        for (int v = 0; v < RV; v++)
            a[t][v] = load ? vf_load(y + (size_t)t * ldy + (size_t)v * VF_LANES) : vf_zero();
    for (size_t k = 0; k < kn; k += 2, p += 32) {
        k_prefetch(p + pf);
        if (RV > 1 && VF_LANES == 16) k_prefetch(p + hi_off + pf);
        vi lo = vi_load(p), hi = RV > 1 ? vi_load(p + hi_off) : lo;
        vf e0 = vf_even(lo), o0 = vf_odd(lo), e1 = vf_even(hi), o1 = vf_odd(hi);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            vf xe = vf_bcast(x + (size_t)t * ldx + k), xo = vf_bcast(x + (size_t)t * ldx + k + 1);
            a[t][0] = vf_fma(e0, xe, a[t][0]);
            a[t][0] = vf_fma(o0, xo, a[t][0]);
            if (RV > 1) {
                a[t][1] = vf_fma(e1, xe, a[t][1]);
                a[t][1] = vf_fma(o1, xo, a[t][1]);
            }
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
#pragma GCC unroll 2
        for (int v = 0; v < RV; v++) vf_store(y + (size_t)t * ldy + (size_t)v * VF_LANES, a[t][v]);
}

static void sm_tile_any(const kipp_bf16 *p, size_t hi_off, const float *x, size_t ldx, size_t kn, float *y,
                        size_t ldy, int T, int RV, int load, size_t pf)
{
#define SM_T(n)                                                           \
    if (RV > 1) sm_tile(p, hi_off, x, ldx, kn, y, ldy, n, 2, load, pf);   \
    else sm_tile(p, hi_off, x, ldx, kn, y, ldy, n, 1, load, pf)
    K_TILE_SWITCH(T, SM_TT, SM_T)
#undef SM_T
}

/* The small-M matmul: linear_kblock_simd.h's driver over sm_tile, one row
 * tile per group; the first token tile of a block prefetches MM_PF ahead (the
 * DRAM read), later ones find the block in L1. */
#define KB_MATMUL K_SFX(k_matmul_bf16_small)
#define KB_XT float
#define KB_GROUP (MM_RV * VF_LANES)
#define KB_KB SM_KB
#define KB_TT SM_TT
#define KB_RV MM_RV
#define KB_RV_ROWS VF_LANES
#define KB_SCRATCH const size_t hi_off = MM_HI_OFF(cols);
#define KB_PREP(rg, re, k0, kn) (void)0
#define KB_TILE(r, xt, yt, T, RV) \
    sm_tile_any(wp + (r) * cols + k0 * 16, hi_off, xt, cols, kn, yt, rows, T, RV, load, t == 0 ? MM_PF : 0)
#include "kernels/cpu/linear_kblock_simd.h"

/* The driver is linear_kblock_simd.h's; the block's weights are widened once
 * into wf (per k-block, before its token tiles). wf lives on the stack:
 * 128 KB at most, well inside a thread's default stack (glibc: RLIMIT_STACK,
 * 8 MB here). */
#define KB_MATMUL K_SFX(k_matmul_bf16_wide)
#define KB_XT float
#define KB_GROUP MM_GROUP
#define KB_KB MM_KB
#define KB_TT K_MM_TT
#define KB_RV MM_RV
#define KB_RV_ROWS VF_LANES
#define KB_SCRATCH float wf[MM_GROUP * MM_KB] __attribute__((aligned(64)));
#define KB_PREP(rg, re, k0, kn) mm_widen_group(wp, cols, rg, re, k0, kn, wf)
#define KB_TILE(r, xt, yt, T, RV) mm_tile_any(wf + ((r) - rg) * kn, xt, cols, kn, yt, rows, T, RV, load)
#include "kernels/cpu/linear_kblock_simd.h"

/* Few tokens (batched decode): the small-M tile; more: the widened blocks
 * (the widening is amortised over the token tiles). Both run the same chain
 * per row lane, so the cut changes no bit. */
void K_SFX(k_matmul_bf16)(const void *wpv, const void *xav, float *y, size_t rows, size_t cols, size_t n_tok,
                          int accumulate, int ith, int nth)
{
    if (n_tok <= K_SM_MAX)
        K_SFX(k_matmul_bf16_small)(wpv, xav, y, rows, cols, n_tok, accumulate, ith, nth);
    else
        K_SFX(k_matmul_bf16_wide)(wpv, xav, y, rows, cols, n_tok, accumulate, ith, nth);
}
