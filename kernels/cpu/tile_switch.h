/*
 * tile_switch.h - K_TILE_SWITCH(T, TT, TILE): run TILE(n) with n the
 * compile-time constant equal to T, so an always_inline tile whose loops run
 * to T is fully unrolled for every token count of a tail tile.
 * 1 <= T <= TT; TT is one of 4, 6, 8, 12 (a literal or a macro for one);
 * T == TT takes the default case. Shared by the matmul drivers of every
 * format (linear_panel_simd.h, linear_kblock_simd.h).
 */
#ifndef KIPP_KERNELS_CPU_TILE_SWITCH_H
#define KIPP_KERNELS_CPU_TILE_SWITCH_H

#define K_TILE_SWITCH(T, TT, TILE) K_TILE_SWITCH_(T, TT, TILE)
#define K_TILE_SWITCH_(T, TT, TILE)    \
    switch (T) {                       \
        K_TILE_CASES_##TT(TILE)        \
    default: TILE(TT); break;          \
    }
#define K_TILE_C(n, TILE) case n: TILE(n); break;
#define K_TILE_CASES_4(TILE) K_TILE_C(1, TILE) K_TILE_C(2, TILE) K_TILE_C(3, TILE)
#define K_TILE_CASES_6(TILE) K_TILE_CASES_4(TILE) K_TILE_C(4, TILE) K_TILE_C(5, TILE)
#define K_TILE_CASES_8(TILE) K_TILE_CASES_6(TILE) K_TILE_C(6, TILE) K_TILE_C(7, TILE)
#define K_TILE_CASES_12(TILE) \
    K_TILE_CASES_8(TILE) K_TILE_C(8, TILE) K_TILE_C(9, TILE) K_TILE_C(10, TILE) K_TILE_C(11, TILE)

#endif
