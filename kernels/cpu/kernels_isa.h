/*
 * kernels_isa.h - the AVX2 and AVX-512 variants of every op in kernels.h, with
 * the same signatures (ARCHITECTURE.md "ISA dispatch"). Only dispatch.c, the
 * kernel tests and the kernel benchmarks include this; backends go through
 * k_cpu_ops_get().
 */
#ifndef KIPP_KERNELS_ISA_H
#define KIPP_KERNELS_ISA_H

#include "kernels/cpu/kernels.h"

#define K_DECLARE_ISA(sfx)                                                                     \
    void k_matvec_bf16_##sfx(const kipp_bf16 *w, const float *x, float *y, size_t rows,        \
                             size_t cols, int ith, int nth);                                   \
    void k_matmul_bf16_##sfx(const kipp_bf16 *w, const float *x, float *y, size_t rows,        \
                             size_t cols, size_t n_tok, int ith, int nth);                     \
    void k_rmsnorm_f32_##sfx(const float *x, const kipp_bf16 *w, float *y, size_t n_rows,      \
                             size_t n, float eps);                                             \
    void k_rope_f32_##sfx(float *x, size_t n_head, const float *cs);                           \
    void k_swiglu_f32_##sfx(const float *gate, const float *up, float *out, size_t n);         \
    void k_add_f32_##sfx(float *x, const float *y, size_t n);                                  \
    void k_embed_bf16_##sfx(const kipp_bf16 *table, uint32_t token, float *out, size_t d);     \
    void k_kv_write_bf16_##sfx(kipp_bf16 *kc, kipp_bf16 *vc, const uint32_t *block_table,      \
                               uint32_t pos, const float *k, const float *v);                  \
    void k_flash_gqa_bf16_##sfx(const float *q, size_t group, const kipp_bf16 *kc,             \
                                const kipp_bf16 *vc, uint32_t kvh, const uint32_t *block_table, \
                                uint32_t p0, uint32_t p1, float scale, float *m, float *l,     \
                                float *acc);                                                   \
    void k_cvt_bf16_##sfx(const float *x, kipp_bf16 *xb, size_t n);                            \
    void k_matvec_bf16p_##sfx(const kipp_bf16 *wp, const float *x, float *y, size_t rows,      \
                              size_t cols, int ith, int nth);                                  \
    void k_matmul_bf16p_##sfx(const kipp_bf16 *wp, const kipp_bf16 *xb, float *y, size_t rows, \
                              size_t cols, size_t n_tok, int accumulate, int ith, int nth); \
    void k_flash_rows_bf16_##sfx(const float *q, size_t group, const kipp_bf16 *kc,            \
                                 const kipp_bf16 *vc, const uint32_t *block_table, uint32_t p0, \
                                 uint32_t p1, float scale, float *m, float *l, float *acc);

K_DECLARE_ISA(avx2)
K_DECLARE_ISA(avx512)

/**
 * The table of level isa without the CPU cap of k_cpu_ops_get: only for the
 * emulated AVX-512 kernel test (SIMDe build, tests/test_kernels.c), where the
 * "avx512" functions are portable C. Calling a native AVX-512 entry on a CPU
 * without it faults.
 */
const k_cpu_ops *k_cpu_ops_table(kipp_isa isa);

#endif
