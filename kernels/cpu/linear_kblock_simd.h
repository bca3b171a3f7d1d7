/*
 * linear_kblock_simd.h - the one matmul driver of the bf16 packed layout
 * (linear_simd.h's FP32-FMA tiles, the small-M sm_tile and the widened
 * mm_tile, and the vdpbf16ps tile of linear_bf16dot_avx512_bf16.c),
 * written once over a per-kernel tile and
 * included by each after simd_<level>.h:
 *
 *   #define KB_MATMUL  the matmul's name (k_matmul_fn)
 *   #define KB_XT      the activation element type (float, kipp_bf16)
 *   #define KB_GROUP   rows per group, a multiple of KB_RV * KB_RV_ROWS
 *   #define KB_KB      k per block
 *   #define KB_TT      tokens per tile: 4, 6, 8 or 12 (tile_switch.h)
 *   #define KB_RV      row vectors per tile, KB_RV_ROWS rows each
 *   KB_SCRATCH         declarations the driver holds (may be empty)
 *   KB_PREP(rg, re, k0, kn)   once per group and k-block, before its tiles
 *   KB_TILE(r, xt, yt, T, RV) the tile of rows [r, r + RV * KB_RV_ROWS) and
 *                             tokens [t, t + T): xt, yt point at their x and y
 *
 * Loop order: group of KB_GROUP rows (outer: its weights leave DRAM once),
 * k-block, token tile, row tiles (the token tile's x stays in L1 across
 * them). Row invariance (kernels.h): every row lane runs one chain over k in
 * column order from zero; a k-block boundary stores the FP32 lane in y and
 * reloads it (load), which is exact, so the block sizes change no bit.
 */
#ifndef K_SFX
#error "include kernels/cpu/simd_<level>.h first"
#endif
#if !defined(KB_MATMUL) || !defined(KB_XT) || !defined(KB_GROUP) || !defined(KB_KB) || !defined(KB_TT) || \
    !defined(KB_RV) || !defined(KB_RV_ROWS) || !defined(KB_SCRATCH) || !defined(KB_PREP) || !defined(KB_TILE)
#error "define the KB_* parameters first"
#endif

void KB_MATMUL(const void *wpv, const void *xav, float *y, size_t rows, size_t cols, size_t n_tok, int accumulate,
               int ith, int nth)
{
    const kipp_bf16 *wp = wpv;
    const KB_XT *x = xav;
    const size_t tile_rows = (size_t)KB_RV * KB_RV_ROWS;
    KB_SCRATCH
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    for (size_t rg = r0; rg < r1; rg += KB_GROUP) {
        size_t re = rg + KB_GROUP < r1 ? rg + KB_GROUP : r1;
        for (size_t k0 = 0; k0 < cols; k0 += KB_KB) {
            size_t kn = cols - k0 < KB_KB ? cols - k0 : KB_KB;
            int load = accumulate || k0 > 0;
            KB_PREP(rg, re, k0, kn);
            for (size_t t = 0; t < n_tok; t += KB_TT) {
                int T = (int)(n_tok - t < KB_TT ? n_tok - t : KB_TT);
                for (size_t r = rg; r < re; r += tile_rows) {
                    int RV = r + tile_rows <= re ? KB_RV : (int)((re - r) / KB_RV_ROWS);
                    KB_TILE(r, x + t * cols + k0, y + t * rows + r, T, RV);
                }
            }
        }
    }
}

#undef KB_MATMUL
#undef KB_XT
#undef KB_GROUP
#undef KB_KB
#undef KB_TT
#undef KB_RV
#undef KB_RV_ROWS
#undef KB_SCRATCH
#undef KB_PREP
#undef KB_TILE
