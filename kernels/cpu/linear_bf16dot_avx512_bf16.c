/*
 * linear_bf16dot_avx512_bf16.c - the bf16dot read mode (kernels.h "weight
 * formats"): bf16 weights in the packed layout [rows/16][cols/2][16][2]
 * against BF16 activations with vdpbf16ps (_mm512_dpbf16_ps: 16 lanes x one
 * k-pair, 64 FLOP per instruction). Written by hand because its instruction
 * exists at this level only (docs/ARCHITECTURE.md "ISA dispatch").
 *
 * One 64-byte panel line is 16 rows x one k-pair, exactly the vdpbf16ps
 * operand; the activation pair (x[2k], x[2k+1]) is one 32-bit broadcast. So
 * the weights are read as they lie, with no widening and no horizontal sum.
 *
 * Row invariance (kernels.h): each row lane runs ONE vdpbf16ps chain over the
 * k-pairs in column order from zero, in the matvec and in every matmul tile
 * (a k-block boundary stores the FP32 lane and reloads it, which is exact),
 * so a row's result does not depend on decode vs prefill or on the tile.
 */
#include "kernels/cpu/simd_avx512.h"
#include "kernels/cpu/tile_switch.h"

/* Under SIMDe each vdpbf16ps is a lane loop; inlined into the fully
 * unrolled tiles below it costs GCC minutes, so the emulated build calls it
 * out of line (same arithmetic). */
#ifdef KIPP_SIMDE_EMU
static __attribute__((noinline)) __m512 dpbf16(__m512 acc, __m512bh a, __m512bh b) { return _mm512_dpbf16_ps(acc, a, b); }
#else
#define dpbf16 _mm512_dpbf16_ps
#endif

static inline __m512bh as_bh(__m512i v)
{
    __m512bh r;
    memcpy(&r, &v, sizeof r);
    return r;
}

/* acc[i] += w[2i] * x0 + w[2i+1] * x1 for the activation pair xp = (x0, x1). */
static inline __attribute__((always_inline)) __m512 dot_line(__m512 acc, const kipp_bf16 *line, const kipp_bf16 *xp)
{
    int32_t pair;
    memcpy(&pair, xp, 4);
    return dpbf16(acc, as_bh(_mm512_loadu_si512((const void *)line)), as_bh(_mm512_set1_epi32(pair)));
}

/* ---- the BF16 activation quantizer: vcvtneps2bf16, 16 values per instruction ----
 * The instruction's own rounding (RNE, denormal inputs to signed zero, quiet
 * NaN), which k_quant_bf16_ref models: the act rows of kcheck compare the two
 * bit for bit, specials included. SIMDe has no vcvtneps2bf16, so under
 * emulation this level takes the scalar model and that check is the model's. */
void k_quant_bf16_avx512_bf16(const float *x, void *xb, size_t n)
{
    kipp_bf16 *o = xb;
    size_t i = 0;
#ifndef KIPP_SIMDE_EMU
    for (; i + 16 <= n; i += 16) {
        __m256bh b = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + i));
        memcpy(o + i, &b, sizeof b);
    }
#endif
    if (i < n) k_quant_bf16_ref(x + i, o + i, n - i);
}

/* ---- decode: y = W x, DRAM-bound ----
 * DV_NP panels walked together, each its own stream, not software-prefetched
 * (as the bf16 matvec: linear_simd.h says why). One panel: its
 * single chain per row lane takes ~6 cycles per 64-byte line, above a core's
 * DRAM share, and more panels at once (more streams a thread) read slower
 * (docs/PERFORMANCE.md "Kernel design measurements"). */
#define DV_NP 1

static inline __attribute__((always_inline)) void
dv_panels(const kipp_bf16 *p, size_t ps, const kipp_bf16 *x, float *y, size_t cols, int NP)
{
    __m512 a[DV_NP];
#pragma GCC unroll 8
    for (int j = 0; j < NP; j++) a[j] = _mm512_setzero_ps();
    for (size_t c = 0; c < cols; c += 16, p += 256) { /* eight k-pairs = 512 B per panel per step */
#pragma GCC unroll 8
        for (int h = 0; h < 8; h++)
#pragma GCC unroll 8
            for (int j = 0; j < NP; j++) a[j] = dot_line(a[j], p + (size_t)j * ps + 32 * h, x + c + 2 * (size_t)h);
    }
#pragma GCC unroll 8
    for (int j = 0; j < NP; j++) _mm512_storeu_ps(y + 16 * (size_t)j, a[j]);
}

void k_matvec_bf16dot_avx512_bf16(const void *wpv, const void *xv, float *y, size_t rows, size_t cols, int ith, int nth)
{
    const kipp_bf16 *wp = wpv, *x = xv;
    const size_t ps = 16 * cols; /* elements per panel */
    size_t r0, r1, r;
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    for (r = r0; r + 16 * DV_NP <= r1; r += 16 * DV_NP) dv_panels(wp + r * cols, ps, x, y + r, cols, DV_NP);
    for (; r < r1; r += 16) dv_panels(wp + r * cols, ps, x, y + r, cols, 1);
}

/* ---- prefill: y[t] = W x[t], compute-bound ----
 * Micro-tile: DM_RV panels (16 rows each) x T tokens <= DM_TT, DM_RV * DM_TT
 * accumulators + DM_RV weight lines + 1 broadcast of 32 zmm. Blocking: a
 * group of DM_GROUP rows (one row tile) and DM_KB k (16 KB of weights, L1) is
 * reused by every token tile; the block's activations (n_tok x DM_KB bf16,
 * 256 KB at 512 tokens) come from L2 per token tile and from L3 once per
 * group (~5 GB/s at the tile's rate: not the limit). */
#define DM_RV 2
#define DM_TT 12
#define DM_KB 256u
#define DM_GROUP 32u
/* The first token tile of a k-block brings its weights in from DRAM (later
 * tiles find them in L1): it prefetches each panel DM_PF elements ahead.
 * Without it a batched decode step (8 tokens, one tile) waited on every
 * weight line: the hardware streamers stop at each 4 KB page and restart
 * slowly under 16 dpbf16 per line pair. 4 KB ahead (2048 elements) rather
 * than 2 KB: one-thread kernel A/B, 4096 x 1024 past the LLC, fastest of 21
 * reps on a loaded machine, 4 tokens 0.217-0.233 ms against 0.270-0.272,
 * 8 tokens 0.332-0.354 against 0.377-0.380 (8 KB: no better). */
#define DM_PF 2048u

static inline __attribute__((always_inline)) void
dm_tile(const kipp_bf16 *p, size_t ps, const kipp_bf16 *x, size_t ldx, size_t kn, float *y, size_t ldy, int T,
        int RV, int load, size_t pf)
{
    __m512 a[DM_TT][DM_RV];
#pragma GCC unroll 12
    for (int t = 0; t < T; t++)
#pragma GCC unroll 2
        for (int v = 0; v < RV; v++)
            a[t][v] = load ? _mm512_loadu_ps(y + (size_t)t * ldy + 16 * (size_t)v) : _mm512_setzero_ps();
    for (size_t k = 0; k < kn; k += 2, p += 32) {
        k_prefetch(p + pf);
        if (RV > 1) k_prefetch(p + ps + pf);
        __m512bh w0 = as_bh(_mm512_loadu_si512((const void *)p));
        __m512bh w1 = RV > 1 ? as_bh(_mm512_loadu_si512((const void *)(p + ps))) : w0;
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) {
            int32_t pair;
            memcpy(&pair, x + (size_t)t * ldx + k, 4);
            __m512bh xb = as_bh(_mm512_set1_epi32(pair));
            a[t][0] = dpbf16(a[t][0], w0, xb);
            if (RV > 1) a[t][1] = dpbf16(a[t][1], w1, xb);
        }
    }
#pragma GCC unroll 12
    for (int t = 0; t < T; t++)
#pragma GCC unroll 2
        for (int v = 0; v < RV; v++) _mm512_storeu_ps(y + (size_t)t * ldy + 16 * (size_t)v, a[t][v]);
}

/* Constant T and RV per call, so every tile shape is fully unrolled; pf:
 * prefetch distance in elements (0: the line being read, a no-op). */
static void dm_tile_any(const kipp_bf16 *p, size_t ps, const kipp_bf16 *x, size_t ldx, size_t kn, float *y,
                        size_t ldy, int T, int RV, int load, size_t pf)
{
#define DM_T(n)                                                       \
    if (RV > 1) dm_tile(p, ps, x, ldx, kn, y, ldy, n, 2, load, pf);   \
    else dm_tile(p, ps, x, ldx, kn, y, ldy, n, 1, load, pf)
    K_TILE_SWITCH(T, DM_TT, DM_T)
#undef DM_T
}

/* The driver is linear_kblock_simd.h's; the tiles read the packed weights as they lie. */
#define KB_MATMUL k_matmul_bf16dot_avx512_bf16
#define KB_XT kipp_bf16
#define KB_GROUP DM_GROUP
#define KB_KB DM_KB
#define KB_TT DM_TT
#define KB_RV DM_RV
#define KB_RV_ROWS 16
#define KB_SCRATCH
#define KB_PREP(rg, re, k0, kn) (void)0
#define KB_TILE(r, xt, yt, T, RV) \
    dm_tile_any(wp + (r) * cols + k0 * 16, 16 * cols, xt, cols, kn, yt, rows, T, RV, load, t == 0 ? DM_PF : 0)
#include "kernels/cpu/linear_kblock_simd.h"
