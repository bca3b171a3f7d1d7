/*
 * kcase_table.c - the kernel cases (kcase.h): one row per case, driving both
 * its check (`make test`, every level this CPU has and, emulated, the ones it
 * lacks) and, where bench = 1, its benchmark (`make bench`). Shapes are the
 * registry's real ones (0.6B: d_model 1024, d_ff 3072, A 2048; 1.7B: 2048 /
 * 6144; 4B: 2560 / 9728) plus odd sizes that exercise the tails and splits.
 * Bounds: kcase_linear.c and kcase_ops.c say why.
 */
#include <stdlib.h>
#include <string.h>

#include "base/hugepage.h"
#include "kernels/cpu/check/kcase.h"

#define ORDER 1e-9   /* FP32 sums in another order, polynomial exp */
#define DOT 1e-7     /* ORDER, plus BF16 softmax weights that may round either way (flash_*_dot rows) */
/* Q8 activations against the FP32 oracle: x uniform in [-1, 1] is quantized
 * per 32-block with step d = amax/127 ~ 1/127, error uniform in +-d/2, so the
 * input NMSE is (d^2/12) / (1/3) ~ 1.6e-5 and the output's the same order
 * (y's error is sum_c w_c e_c, independent e_c). Bound 1e-4: 6x margin; a wrong
 * scale or a lost block gives NMSE >= 1e-3. */
#define Q8ACT 1e-4
#define EXACT 0.0
/* BF16 activations against the FP32 oracle (bf16dot): RNE to 8 significand
 * bits leaves a relative error uniform in +-2^-9 .. +-2^-8 per value, input
 * NMSE ~2e-6, and y's error is sum_c w_c e_c with independent e_c, the same
 * order. Bound 2e-5: ~10x margin; a swapped pair or a lost k-block gives NMSE
 * >= 1e-2. */
#define BF16ACT 2e-5

const kcase kcase_rows[] = {
    /* bf16 weights: matvec (decode) */
    {"matvec", K_FMT_BF16, {1024, 1024, 1, 0}, ORDER, 2, 0},
    {"matvec", K_FMT_BF16, {3072, 1024, 64, 0}, ORDER, 2, 1}, /* bench: 64 copies = 384 MiB, past the LLC */
    {"matvec", K_FMT_BF16, {1024, 3072, 1, 0}, ORDER, 2, 0},
    {"matvec", K_FMT_BF16, {8192, 1024, 1, 0}, ORDER, 3, 0},
    {"matvec", K_FMT_BF16, {2048, 1024, 1, 0}, ORDER, 7, 0},    /* uneven shares, as the head over the pool */
    {"matvec", K_FMT_BF16, {151936, 1024, 1, 0}, ORDER, 2, 1},  /* the output head */
    /* bf16 weights: matmul (prefill), the path's activations */
    {"matmul", K_FMT_BF16, {1024, 1024, 1, 0}, ORDER, 3, 0},
    {"matmul", K_FMT_BF16, {1024, 1024, 7, 0}, ORDER, 3, 0},
    {"matmul", K_FMT_BF16, {1024, 1024, 64, 0}, ORDER, 3, 0},
    {"matmul", K_FMT_BF16, {1024, 1024, 130, 0}, ORDER, 3, 0},
    {"matmul", K_FMT_BF16, {3072, 1024, 13, 0}, ORDER, 3, 0},
    {"matmul", K_FMT_BF16, {1024, 3072, 13, 0}, ORDER, 3, 0},
    {"matmul", K_FMT_BF16, {1040, 1024, 5, 0}, ORDER, 3, 0},
    {"matmul", K_FMT_BF16, {1056, 1056, 15, 0}, ORDER, 3, 0},
    {"matmul", K_FMT_BF16, {512, 1024, 2, 1}, ORDER, 2, 0},     /* accumulate onto y */
    {"matmul", K_FMT_BF16, {1056, 1056, 25, 1}, ORDER, 2, 0},
    {"matmul", K_FMT_BF16, {1040, 1056, 27, 0}, ORDER, 3, 0},   /* small-M tile: token tiles and a tail, a 16-row tail */
    {"matmul", K_FMT_BF16, {4096, 1024, 8, 0}, ORDER, 2, 1},    /* 0.6B Q|K|V, batched decode B = 8 (small-M tile) */
    {"matmul", K_FMT_BF16, {6144, 1024, 512, 0}, ORDER, 2, 1},  /* 0.6B gate|up, pp512 */
    {"matmul", K_FMT_BF16, {1024, 3072, 512, 0}, ORDER, 2, 1},  /* 0.6B down, pp512 */
    /* the four 0.6B projections at the CPU backend's round of 256 tokens (KIPP_CPU_ROUND_TOKENS) */
    {"matmul", K_FMT_BF16, {4096, 1024, 256, 0}, ORDER, 2, 1}, /* QKV */
    {"matmul", K_FMT_BF16, {1024, 2048, 256, 0}, ORDER, 2, 1}, /* O */
    {"matmul", K_FMT_BF16, {6144, 1024, 256, 0}, ORDER, 2, 1}, /* gate|up */
    {"matmul", K_FMT_BF16, {1024, 3072, 256, 0}, ORDER, 2, 1}, /* down */
    /* bf16 weights: the matmul against the FP32 oracle (FP32 activations: no rounding) */
    {"matmul_f32", K_FMT_BF16, {1024, 1024, 7, 0}, ORDER, 2, 0},
    {"matmul_f32", K_FMT_BF16, {3072, 1024, 13, 0}, ORDER, 2, 0},
    /* row invariance, every format: matmul rows == matvec, bit for bit, over
     * tile tails, odd panel counts and thread splits */
    {"rowinv", K_FMT_BF16, {1040, 1056, 25, 0}, EXACT, 3, 0},
    {"rowinv", K_FMT_BF16, {1024, 3072, 13, 0}, EXACT, 2, 0},
    {"rowinv", K_FMT_BF16, {1040, 1056, 9, 0}, EXACT, 3, 0},  /* small-M tile: a 1-token tail tile, a 16-row tail */
    {"rowinv", K_FMT_BF16, {1056, 1024, 32, 0}, EXACT, 2, 0}, /* small-M tile at its widest (K_SM_MAX) */
    {"rowinv", K_FMT_BF16, {1056, 1024, 33, 0}, EXACT, 2, 0}, /* the widened path just past it */
    {"rowinv", K_FMT_Q8_0, {1040, 1056, 25, 0}, EXACT, 3, 0},
    {"rowinv", K_FMT_Q8_0, {1024, 3072, 13, 0}, EXACT, 2, 0},
    {"rowinv", K_FMT_AFFINE4, {1040, 1056, 25, 0}, EXACT, 3, 0},
    {"rowinv", K_FMT_AFFINE4, {1024, 3072, 13, 0}, EXACT, 2, 0},
    {"pack", K_FMT_BF16, {48, 96, 0, 0}, EXACT, 2, 0},
    {"pack", K_FMT_BF16, {3072, 1024, 0, 0}, EXACT, 3, 0},
    /* q8_0 weights, Q8 activations (integer dot). matvec and matmul_f32 against
     * the FP32 dequantizing oracle (Q8ACT), matmul against the scalar integer
     * kernel on the same activations (ORDER: exact int32 block dots, FP32
     * scaling in another rounding order) */
    {"matvec", K_FMT_Q8_0, {1024, 1024, 1, 0}, Q8ACT, 2, 0},
    {"matvec", K_FMT_Q8_0, {3072, 1024, 64, 0}, Q8ACT, 2, 1}, /* bench: 64 copies = 216 MiB, past the LLC */
    {"matvec", K_FMT_Q8_0, {1024, 3072, 1, 0}, Q8ACT, 2, 0},
    {"matvec", K_FMT_Q8_0, {2048, 1024, 1, 0}, Q8ACT, 7, 0},  /* uneven shares */
    {"matvec", K_FMT_Q8_0, {6144, 2048, 16, 0}, Q8ACT, 2, 1}, /* 1.7B gate|up; bench: 16 copies = 204 MiB */
    {"matmul", K_FMT_Q8_0, {1024, 1024, 1, 0}, ORDER, 3, 0},
    {"matmul", K_FMT_Q8_0, {1024, 1024, 7, 0}, ORDER, 3, 0},
    {"matmul", K_FMT_Q8_0, {1024, 1024, 64, 0}, ORDER, 3, 0},
    {"matmul", K_FMT_Q8_0, {3072, 1024, 13, 0}, ORDER, 3, 0},
    {"matmul", K_FMT_Q8_0, {1024, 3072, 13, 0}, ORDER, 3, 0},
    {"matmul", K_FMT_Q8_0, {1040, 1056, 25, 1}, ORDER, 2, 0}, /* accumulate onto y, odd panel count */
    {"matmul", K_FMT_Q8_0, {6144, 1024, 512, 0}, ORDER, 2, 1}, /* 0.6B gate|up, pp512 */
    {"matmul", K_FMT_Q8_0, {1024, 3072, 512, 0}, ORDER, 2, 1}, /* 0.6B down, pp512 */
    {"matmul_f32", K_FMT_Q8_0, {1024, 1024, 7, 0}, Q8ACT, 2, 0},
    {"matmul_f32", K_FMT_Q8_0, {3072, 1024, 13, 0}, Q8ACT, 2, 0},
    {"matmul_outl", K_FMT_Q8_0, {1024, 1024, 7, 0}, Q8ACT, 2, 0}, /* one FP32 outlier per block (outlier_fix) */
    {"matmul_outl", K_FMT_Q8_0, {3072, 1024, 13, 0}, Q8ACT, 3, 0},
    {"pack", K_FMT_Q8_0, {48, 96, 0, 0}, EXACT, 2, 0},
    {"pack", K_FMT_Q8_0, {3072, 1024, 0, 0}, EXACT, 3, 0},
    {"act", -1, {4128, K_ACT_Q8, 0, 0}, EXACT, 2, 0},
    {"act", -1, {512 * 3072, K_ACT_Q8, 0, 0}, EXACT, 2, 1},
    /* affine4 weights (affine4_gs32), Q8 activations: the same bounds and reasons as q8_0
     * (the affine term adds one exact-int sum per block) */
    {"matvec", K_FMT_AFFINE4, {1024, 1024, 1, 0}, Q8ACT, 2, 0},
    {"matvec", K_FMT_AFFINE4, {3072, 1024, 64, 0}, Q8ACT, 2, 1}, /* bench: 64 copies = 144 MiB */
    {"matvec", K_FMT_AFFINE4, {1024, 3072, 1, 0}, Q8ACT, 2, 0},
    {"matvec", K_FMT_AFFINE4, {2048, 1024, 1, 0}, Q8ACT, 7, 0},
    {"matvec", K_FMT_AFFINE4, {6144, 2048, 16, 0}, Q8ACT, 2, 1}, /* 1.7B gate|up; bench: 16 copies = 144 MiB */
    {"matmul", K_FMT_AFFINE4, {1024, 1024, 1, 0}, ORDER, 3, 0},
    {"matmul", K_FMT_AFFINE4, {1024, 1024, 7, 0}, ORDER, 3, 0},
    {"matmul", K_FMT_AFFINE4, {1024, 1024, 64, 0}, ORDER, 3, 0},
    {"matmul", K_FMT_AFFINE4, {3072, 1024, 13, 0}, ORDER, 3, 0},
    {"matmul", K_FMT_AFFINE4, {1024, 3072, 13, 0}, ORDER, 3, 0},
    {"matmul", K_FMT_AFFINE4, {1040, 1056, 25, 1}, ORDER, 2, 0},
    {"matmul", K_FMT_AFFINE4, {6144, 1024, 512, 0}, ORDER, 2, 1},
    {"matmul", K_FMT_AFFINE4, {1024, 3072, 512, 0}, ORDER, 2, 1},
    {"matmul_f32", K_FMT_AFFINE4, {1024, 1024, 7, 0}, Q8ACT, 2, 0},
    {"matmul_f32", K_FMT_AFFINE4, {3072, 1024, 13, 0}, Q8ACT, 2, 0},
    {"matmul_outl", K_FMT_AFFINE4, {1024, 1024, 7, 0}, Q8ACT, 2, 0},
    {"matmul_outl", K_FMT_AFFINE4, {3072, 1024, 13, 0}, Q8ACT, 3, 0},
    {"pack", K_FMT_AFFINE4, {48, 96, 0, 0}, EXACT, 2, 0},
    {"pack", K_FMT_AFFINE4, {3072, 1024, 0, 0}, EXACT, 3, 0},
    /* bf16 weights read by vdpbf16ps with BF16 activations (bf16dot): matvec and
     * matmul_f32 against the FP32 oracle (BF16ACT), matmul against the scalar
     * vdpbf16ps model on the same activations (ORDER), rowinv bitwise */
    {"matvec", K_FMT_BF16DOT, {1024, 1024, 1, 0}, BF16ACT, 2, 0},
    {"matvec", K_FMT_BF16DOT, {3072, 1024, 64, 0}, BF16ACT, 2, 1},
    {"matvec", K_FMT_BF16DOT, {2048, 1024, 1, 0}, BF16ACT, 7, 0},
    {"matvec", K_FMT_BF16DOT, {1040, 3072, 1, 0}, BF16ACT, 3, 0},
    {"matmul", K_FMT_BF16DOT, {1024, 1024, 1, 0}, ORDER, 3, 0},
    {"matmul", K_FMT_BF16DOT, {1024, 1024, 7, 0}, ORDER, 3, 0},
    {"matmul", K_FMT_BF16DOT, {1024, 1024, 64, 0}, ORDER, 3, 0},
    {"matmul", K_FMT_BF16DOT, {3072, 1024, 13, 0}, ORDER, 3, 0},
    {"matmul", K_FMT_BF16DOT, {1024, 3072, 13, 0}, ORDER, 3, 0},
    {"matmul", K_FMT_BF16DOT, {1040, 1056, 25, 1}, ORDER, 2, 0}, /* accumulate, odd panel count, k tail */
    {"matmul", K_FMT_BF16DOT, {6144, 1024, 512, 0}, ORDER, 2, 1}, /* 0.6B gate|up, pp512 */
    {"matmul", K_FMT_BF16DOT, {1024, 3072, 512, 0}, ORDER, 2, 1}, /* 0.6B down, pp512 */
    {"matmul_f32", K_FMT_BF16DOT, {1024, 1024, 7, 0}, BF16ACT, 2, 0},
    {"matmul_f32", K_FMT_BF16DOT, {3072, 1024, 13, 0}, BF16ACT, 2, 0},
    {"rowinv", K_FMT_BF16DOT, {1040, 1056, 25, 0}, EXACT, 3, 0},
    {"rowinv", K_FMT_BF16DOT, {1024, 3072, 13, 0}, EXACT, 2, 0},
    {"act", -1, {4128, K_ACT_BF16, 0, 0}, EXACT, 2, 0},
    {"act", -1, {512 * 3072, K_ACT_BF16, 0, 0}, EXACT, 2, 1},
    /* format-free ops */
    {"rmsnorm", -1, {7, 1024, 0, 0}, ORDER, 2, 0},
    {"rmsnorm", -1, {3, 2560, 1, 0}, ORDER, 2, 0},
    {"rmsnorm", -1, {16, 128, 1, 0}, ORDER, 2, 0},
    {"rmsnorm", -1, {8, 128, 0, 0}, ORDER, 1, 0},
    {"rmsnorm", -1, {512, 1024, 0, 0}, ORDER, 2, 1},
    {"rope", -1, {16, 0, 0, 0}, EXACT, 2, 0},
    {"rope", -1, {16, 1, 0, 0}, EXACT, 2, 0},
    {"rope", -1, {16, 31, 0, 0}, EXACT, 2, 0},
    {"rope", -1, {16, 32, 0, 0}, EXACT, 2, 0},
    {"rope", -1, {16, 4095, 0, 0}, EXACT, 2, 1},
    {"rope", -1, {16, 39999, 0, 0}, EXACT, 2, 0},
    {"swiglu", -1, {3079, 0, 0, 0}, ORDER, 2, 0},
    {"swiglu", -1, {512 * 3072, 0, 0, 0}, ORDER, 2, 1},
    {"add", -1, {2563, 0, 0, 0}, EXACT, 2, 0},
    {"add", -1, {512 * 1024, 0, 0, 0}, EXACT, 2, 1},
    {"embed", -1, {2563, 50, 37, 0}, EXACT, 1, 0},
    {"kv_write", -1, {4, 0, 0, 0}, EXACT, 2, 0},
    /* attention over scrambled pages: groups 2/4/8 (1.7B/0.6B/4B... shapes), 5 and 12 for the passes, 16+ the tile walk (TILE_MIN) */
    {"flash_gqa", -1, {2, 0, 1, 0}, ORDER, 2, 0},
    {"flash_gqa", -1, {2, 0, 45, 0}, ORDER, 2, 0},
    {"flash_gqa", -1, {2, 4095, 4096, 0}, ORDER, 2, 0},
    {"flash_gqa", -1, {4, 3, 100, 0}, ORDER, 2, 0},
    {"flash_gqa", -1, {5, 37, 300, 0}, ORDER, 2, 0},
    {"flash_gqa", -1, {8, 31, 33, 0}, ORDER, 2, 0},
    {"flash_gqa", -1, {12, 5, 200, 0}, ORDER, 2, 0},  /* two GMAX passes of the chunk walk */
    {"flash_gqa", -1, {16, 0, 384, 0}, ORDER, 2, 0},
    {"flash_gqa", -1, {37, 5, 200, 0}, ORDER, 2, 0},  /* tile walk: odd block tails, unaligned start */
    {"flash_gqa", -1, {128, 0, 96, 0}, ORDER, 2, 0},  /* a 64-token prefill tile of group 2 */
    {"flash_gqa", -1, {2, 0, 4096, 8}, ORDER, 2, 1},  /* bench: 8 layers of a 4k KV = 256 MiB */
    {"flash_gqa", -1, {4, 0, 4096, 8}, ORDER, 2, 1},
    {"flash_gqa", -1, {16, 0, 4096, 1}, ORDER, 2, 1},
    {"flash_gqa", -1, {128, 0, 4096, 1}, ORDER, 2, 1}, /* bench: a prefill tile's prefix walk (compute-bound) */
    {"flash_rows", -1, {2, 0, 1, 0}, ORDER, 1, 0},
    {"flash_rows", -1, {2, 3, 100, 0}, ORDER, 1, 0},
    {"flash_rows", -1, {4, 37, 300, 0}, ORDER, 1, 0},
    {"flash_rows", -1, {5, 37, 300, 0}, ORDER, 1, 0},
    {"flash_rows", -1, {8, 31, 33, 0}, ORDER, 1, 0},
    {"flash_rows", -1, {8, 64, 96, 0}, ORDER, 1, 0},
    {"flash_rows", -1, {2, 0, 4096, 8}, ORDER, 1, 1},
    {"flash_rows", -1, {4, 0, 4096, 8}, ORDER, 1, 1},
    {"flash_rows", -1, {2, 0, 512, 1}, ORDER, 1, 1},
    /* BF16-dot walks (avx512_bf16; the ref model below it): against k_flash_gqa_dot_ref, same split and
     * invariance checks; one code path for every group size. DOT: a softmax weight whose SIMD exp and
     * expf round to different BF16 values moves the output by up to 2^-8 of its share (measured
     * 1e-14 to 1e-9 on these rows) */
    {"flash_gqa_dot", -1, {2, 0, 1, 0}, DOT, 2, 0},
    {"flash_gqa_dot", -1, {2, 0, 45, 0}, DOT, 2, 0},
    {"flash_gqa_dot", -1, {2, 4095, 4096, 0}, DOT, 2, 0},
    {"flash_gqa_dot", -1, {3, 3, 100, 0}, DOT, 2, 0},   /* blocks of 2 and 1 */
    {"flash_gqa_dot", -1, {5, 37, 300, 0}, DOT, 2, 0},
    {"flash_gqa_dot", -1, {8, 31, 33, 0}, DOT, 2, 0},
    {"flash_gqa_dot", -1, {37, 5, 200, 0}, DOT, 2, 0},
    {"flash_gqa_dot", -1, {15, 5, 200, 0}, DOT, 2, 0},  /* a block of 15: values in 4s, then a 2 at offset 12, then a 1 */
    {"flash_gqa_dot", -1, {130, 0, 96, 0}, DOT, 2, 0},  /* past one 64-vector segment */
    {"flash_gqa_dot", -1, {9, 0, 2048, 0}, DOT, 2, 0},  /* an odd block's last vector (block_scores1) over a long walk:
                                                          a last-bit score change shows only where a max moves (review) */
    {"flash_gqa_dot", -1, {2, 0, 4096, 8}, DOT, 2, 1},
    {"flash_gqa_dot", -1, {4, 0, 4096, 8}, DOT, 2, 1},
    {"flash_gqa_dot", -1, {128, 0, 4096, 1}, DOT, 2, 1},
    {"flash_rows_dot", -1, {2, 0, 1, 0}, DOT, 1, 0},
    {"flash_rows_dot", -1, {2, 3, 100, 0}, DOT, 1, 0},
    {"flash_rows_dot", -1, {4, 37, 300, 0}, DOT, 1, 0},
    {"flash_rows_dot", -1, {1, 3, 100, 0}, DOT, 1, 0},  /* heads_walk: 8 vectors, one REDUCE16 set half empty */
    {"flash_rows_dot", -1, {5, 37, 300, 0}, DOT, 1, 0}, /* 40 vectors: sets of 16 straddle the heads (the 14B group) */
    {"flash_rows_dot", -1, {7, 0, 45, 0}, DOT, 1, 0},   /* 56 vectors: HEADS_MAX */
    {"flash_rows_dot", -1, {8, 64, 96, 0}, DOT, 1, 0},
    {"flash_rows_dot", -1, {2, 0, 4096, 8}, DOT, 1, 1},
    {"flash_rows_dot", -1, {4, 0, 4096, 8}, DOT, 1, 1},
    /* q8_0 KV cache: the write against the q8_0 rule (bitwise), the walks against k_flash_gqa_q8_0_ref
     * (ORDER: same dequantized values, another summation order and exp) and bitwise invariant */
    {"kv_write_q8_0", -1, {4, 0, 0, 0}, EXACT, 2, 0},
    {"flash_gqa_q8_0", -1, {2, 0, 1, 0}, ORDER, 2, 0},
    {"flash_gqa_q8_0", -1, {2, 0, 45, 0}, ORDER, 2, 0},
    {"flash_gqa_q8_0", -1, {2, 4095, 4096, 0}, ORDER, 2, 0},
    {"flash_gqa_q8_0", -1, {4, 3, 100, 0}, ORDER, 2, 0},
    {"flash_gqa_q8_0", -1, {5, 37, 300, 0}, ORDER, 2, 0},
    {"flash_gqa_q8_0", -1, {37, 5, 200, 0}, ORDER, 2, 0},
    {"flash_gqa_q8_0", -1, {128, 0, 96, 0}, ORDER, 2, 0},
    {"flash_gqa_q8_0", -1, {2, 0, 4096, 8}, ORDER, 2, 1},
    {"flash_gqa_q8_0", -1, {128, 0, 4096, 1}, ORDER, 2, 1},
    {"flash_rows_q8_0", -1, {2, 0, 1, 0}, ORDER, 1, 0},
    {"flash_rows_q8_0", -1, {2, 3, 100, 0}, ORDER, 1, 0},
    {"flash_rows_q8_0", -1, {4, 37, 300, 0}, ORDER, 1, 0},
    {"flash_rows_q8_0", -1, {8, 31, 33, 0}, ORDER, 1, 0},
    {"flash_rows_q8_0", -1, {2, 0, 4096, 8}, ORDER, 1, 1},
    {"flash_rows_q8_0", -1, {4, 0, 4096, 8}, ORDER, 1, 1},
    {NULL, 0, {0, 0, 0, 0}, 0, 0, 0},
};

extern const kcase_kind kcase_kind_matvec, kcase_kind_matmul, kcase_kind_matmul_f32, kcase_kind_matmul_outl,
    kcase_kind_rowinv, kcase_kind_pack,
    kcase_kind_act, kcase_kind_rmsnorm, kcase_kind_rope, kcase_kind_swiglu, kcase_kind_add,
    kcase_kind_embed, kcase_kind_kv_write, kcase_kind_flash_gqa, kcase_kind_flash_rows,
    kcase_kind_flash_gqa_dot, kcase_kind_flash_rows_dot, kcase_kind_kv_write_q8_0, kcase_kind_flash_gqa_q8_0,
    kcase_kind_flash_rows_q8_0;

static const kcase_kind *const kinds[] = {
    &kcase_kind_matvec, &kcase_kind_matmul, &kcase_kind_matmul_f32, &kcase_kind_matmul_outl, &kcase_kind_rowinv,
    &kcase_kind_pack, &kcase_kind_act,
    &kcase_kind_rmsnorm, &kcase_kind_rope, &kcase_kind_swiglu, &kcase_kind_add, &kcase_kind_embed,
    &kcase_kind_kv_write, &kcase_kind_flash_gqa, &kcase_kind_flash_rows, &kcase_kind_flash_gqa_dot,
    &kcase_kind_flash_rows_dot, &kcase_kind_kv_write_q8_0, &kcase_kind_flash_gqa_q8_0, &kcase_kind_flash_rows_q8_0,
};

const kcase_kind *kcase_kind_find(const char *op)
{
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (!strcmp(kinds[i]->op, op)) return kinds[i];
    return NULL;
}

const char *kcase_kind_names(void)
{
    static char buf[512];
    if (!buf[0])
        for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
            if (i) strncat(buf, " ", sizeof buf - strlen(buf) - 1);
            strncat(buf, kinds[i]->op, sizeof buf - strlen(buf) - 1);
        }
    return buf;
}

/* ---- helpers ---- */

static uint64_t rng_state = 0x5eed5eedULL;
static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL); /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static float rng_unif(float lo, float hi) { return lo + (hi - lo) * (float)(rng_next() >> 40) / 16777216.0f; }

float *kc_rand_f32(size_t n, float lo, float hi)
{
    float *p = kipp_aligned_alloc(n * sizeof(float) + 64);
    if (p)
        for (size_t i = 0; i < n; i++) p[i] = rng_unif(lo, hi);
    return p;
}

kipp_bf16 *kc_rand_bf16(size_t n, float amp)
{
    kipp_bf16 *p = kipp_aligned_alloc(n * sizeof(kipp_bf16) + 64);
    if (p)
        for (size_t i = 0; i < n; i++) p[i] = kipp_f32_to_bf16(rng_unif(-amp, amp));
    return p;
}

void *kc_alloc_big(size_t bytes) { return kipp_huge_alloc(bytes); }

double kc_nmse(const float *a, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    double e = den > 0 ? num / den : num;
    return e == e ? e : 1e30; /* NaN output fails every bound */
}
