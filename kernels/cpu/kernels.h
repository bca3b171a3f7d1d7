/*
 * kernels.h - CPU kernel signatures (ARCHITECTURE.md "Layers", "ISA dispatch").
 *
 * Kernels compute on plain pointers and sizes: no model, no session, no
 * allocation. Each op has a scalar `_ref` version (kernels/cpu/ref.c) and
 * optional `_avx2` / `_avx512` variants with the same signature; the table
 * k_cpu_ops is filled once from CPUID (kernels/cpu/dispatch.c). Threaded
 * kernels take (ith, nth) and split their rows; no kernel spawns threads.
 *
 * Shapes are row-major. Activations are FP32; weights and KV are BF16.
 */
#ifndef KIPP_KERNELS_CPU_H
#define KIPP_KERNELS_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/common.h"
#include "kernels/qwen3_shape.h"

/* ---- linear algebra ---- */

/**
 * Decode matvec: y[r] = sum_c w[r][c] * x[c] for rows r in this thread's share
 * of [0, rows). w: [rows][cols] bf16, x: [cols] f32, y: [rows] f32.
 * cols % 32 == 0. FP32 accumulation.
 */
typedef void (*k_matvec_bf16_fn)(const kipp_bf16 *w, const float *x, float *y, size_t rows,
                                 size_t cols, int ith, int nth);

/**
 * Prefill matmul: y[t][r] = sum_c w[r][c] * x[t][c] for t < n_tok and rows r in
 * this thread's share. w: [rows][cols] bf16, x: [n_tok][cols] f32,
 * y: [n_tok][rows] f32 (row stride = rows). cols % 32 == 0.
 */
typedef void (*k_matmul_bf16_fn)(const kipp_bf16 *w, const float *x, float *y, size_t rows,
                                 size_t cols, size_t n_tok, int ith, int nth);

/* ---- elementwise / normalisation ---- */

/**
 * RMSNorm of n_rows rows of width n (Zhang & Sennrich 2019; HF Qwen3RMSNorm):
 * y = x / sqrt(mean(x^2) + eps) * w. x, y: [n_rows][n] f32 (may alias),
 * w: [n] bf16. Also the per-head Q/K norm with n = 128.
 */
typedef void (*k_rmsnorm_f32_fn)(const float *x, const kipp_bf16 *w, float *y, size_t n_rows,
                                 size_t n, float eps);

/**
 * RoPE, rotate-half pairing (HF apply_rotary_pos_emb, Su et al. 2021) in place
 * on n_head heads of 128: for i < 64, (x[i], x[i+64]) rotated by angle
 * pos * theta^(-2i/128). x: [n_head][128] f32; cs: [128] f32 = cos[64] then
 * sin[64] for this position, from k_rope_table.
 */
typedef void (*k_rope_f32_fn)(float *x, size_t n_head, const float *cs);

/** out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)). [n] f32. */
typedef void (*k_swiglu_f32_fn)(const float *gate, const float *up, float *out, size_t n);

/** x[i] += y[i], [n] f32 (residual add). */
typedef void (*k_add_f32_fn)(float *x, const float *y, size_t n);

/** Embedding gather: out[c] = table[token][c] widened to f32. table: [vocab][d] bf16. */
typedef void (*k_embed_bf16_fn)(const kipp_bf16 *table, uint32_t token, float *out, size_t d);

/* ---- KV cache and attention (paged: 32-position blocks) ---- */

/**
 * Write one position's K and V (each [8][128] f32) into a layer's paged cache,
 * rounding to BF16. kc, vc: layer bases [n_blocks*32][8][128] bf16;
 * physical row = block_table[pos >> 5] * 32 + (pos & 31).
 */
typedef void (*k_kv_write_bf16_fn)(kipp_bf16 *kc, kipp_bf16 *vc, const uint32_t *block_table,
                                   uint32_t pos, const float *k, const float *v);

/**
 * Flash-attention partial (Dao et al. 2022, online softmax) for one query token
 * and one KV head over positions [p0, p1) (p1 > p0): the `group` query heads
 * that share KV head kvh read each K/V row once.
 * q: [group][128] f32; kc, vc: layer bases [n_blocks*32][8][128] bf16;
 * scale = 1/sqrt(128). Outputs, per query head g: m[g] running max of scaled
 * scores, l[g] = sum exp(s - m[g]), acc[g][128] = sum exp(s - m[g]) * v.
 * Final output = acc / l after merging partials with k_attn_merge.
 */
typedef void (*k_flash_gqa_bf16_fn)(const float *q, size_t group, const kipp_bf16 *kc,
                                    const kipp_bf16 *vc, uint32_t kvh,
                                    const uint32_t *block_table, uint32_t p0, uint32_t p1,
                                    float scale, float *m, float *l, float *acc);

/**
 * Decode flash attention of one token over all 8 KV heads for positions
 * [p0, p1): the same partials as k_flash_gqa_bf16 called for kvh = 0..7, but
 * a fast variant walks the cache page by page, all heads of a page together,
 * so K and V are read as contiguous 2 KB rows (one KV head alone reads 256 B
 * of every 2 KB, which streams at a third of the DRAM bandwidth).
 * q: [8*group][128] f32 (query heads in order, group per KV head); kc, vc, bt
 * as k_flash_gqa_bf16; m, l: [8*group], acc: [8*group][128] f32 partials.
 */
typedef void (*k_flash_rows_bf16_fn)(const float *q, size_t group, const kipp_bf16 *kc,
                                     const kipp_bf16 *vc, const uint32_t *block_table,
                                     uint32_t p0, uint32_t p1, float scale, float *m, float *l,
                                     float *acc);

/* ---- packed BF16 weights (prefill at the BF16 dot peak, decode at bandwidth) ----
 *
 * A backend may repack each [rows][cols] bf16 weight once at model creation
 * (it owns the copy, ARCHITECTURE.md "Ownership"). Layout, panels of 16 rows,
 * k-pairs interleaved inside a panel:
 *   wp[(r/16)*16*cols + ((c/2)*16 + r%16)*2 + c%2] = w[r][c]
 * i.e. [rows/16][cols/2][16][2] bf16, the same byte count as w. One 64-byte load
 * gives 16 rows x 2 k, which feeds vdpbf16ps against a broadcast activation pair
 * with no horizontal reduction (the classic GEMM microkernel). Concatenating the
 * packed buffers of matrices with the same cols is the packing of their row
 * concatenation (e.g. fused Q|K|V or gate|up). rows % 16 == 0, cols % 32 == 0.
 */

/** Pack w [rows][cols] bf16 into wp (layout above); this thread packs its share of panels. */
typedef void (*k_pack_bf16_fn)(const kipp_bf16 *w, kipp_bf16 *wp, size_t rows, size_t cols,
                               int ith, int nth);

/** Activation rounding for the packed matmul: xb[i] = bf16(x[i]), RNE as kipp_f32_to_bf16. [n]. */
typedef void (*k_cvt_bf16_fn)(const float *x, kipp_bf16 *xb, size_t n);

/**
 * Packed decode matvec: y[r] = sum_c w[r][c] * x[c] for this thread's share of
 * 16-row panels. wp: packed [rows][cols] bf16, x: [cols] f32 (FP32 activations:
 * weights are widened in registers, so accuracy equals k_matvec_bf16), y: [rows] f32.
 */
typedef void (*k_matvec_bf16p_fn)(const kipp_bf16 *wp, const float *x, float *y, size_t rows,
                                  size_t cols, int ith, int nth);

/**
 * Packed prefill matmul on BF16 activations: y[t][r] = (accumulate ? y[t][r] : 0)
 * + sum_c w[r][c] * xb[t][c] for t < n_tok and this thread's share of 16-row panels.
 * wp: packed [rows][cols] bf16; xb: [n_tok][cols] bf16 (from k_cvt_bf16, rounding
 * costs NMSE ~1e-6 per matmul; for more accuracy call again with accumulate = 1
 * on the residual xlo = bf16(x - xhi)); y: [n_tok][rows] f32 (row stride = rows).
 * Each weight byte comes from DRAM once per call: a block of panels stays in L1
 * while every token passes over it (AVX-512: 32 rows x 256 k; AVX2: 64 rows x 128 k).
 */
typedef void (*k_matmul_bf16p_fn)(const kipp_bf16 *wp, const kipp_bf16 *xb, float *y,
                                  size_t rows, size_t cols, size_t n_tok, int accumulate,
                                  int ith, int nth);

/** The dispatch table: one function per op, filled once at startup. */
typedef struct {
    const char *isa;               /* "ref", "avx2", "avx512" */
    k_matvec_bf16_fn matvec_bf16;
    k_matmul_bf16_fn matmul_bf16;
    k_rmsnorm_f32_fn rmsnorm_f32;
    k_rope_f32_fn rope_f32;
    k_swiglu_f32_fn swiglu_f32;
    k_add_f32_fn add_f32;
    k_embed_bf16_fn embed_bf16;
    k_kv_write_bf16_fn kv_write_bf16;
    k_flash_gqa_bf16_fn flash_gqa_bf16;
    /* packed-weight ops (appended; see the layout above) */
    k_pack_bf16_fn pack_bf16;
    k_cvt_bf16_fn cvt_bf16;
    k_matvec_bf16p_fn matvec_bf16p;
    k_matmul_bf16p_fn matmul_bf16p;
    k_flash_rows_bf16_fn flash_rows_bf16; /* appended: decode attention, all KV heads */
} k_cpu_ops;

/* Scalar references (kernels/cpu/ref.c): the oracle for every variant. */
void k_matvec_bf16_ref(const kipp_bf16 *w, const float *x, float *y, size_t rows, size_t cols,
                       int ith, int nth);
void k_matmul_bf16_ref(const kipp_bf16 *w, const float *x, float *y, size_t rows, size_t cols,
                       size_t n_tok, int ith, int nth);
void k_rmsnorm_f32_ref(const float *x, const kipp_bf16 *w, float *y, size_t n_rows, size_t n,
                       float eps);
void k_rope_f32_ref(float *x, size_t n_head, const float *cs);
void k_swiglu_f32_ref(const float *gate, const float *up, float *out, size_t n);
void k_add_f32_ref(float *x, const float *y, size_t n);
void k_embed_bf16_ref(const kipp_bf16 *table, uint32_t token, float *out, size_t d);
void k_kv_write_bf16_ref(kipp_bf16 *kc, kipp_bf16 *vc, const uint32_t *block_table, uint32_t pos,
                         const float *k, const float *v);
void k_flash_gqa_bf16_ref(const float *q, size_t group, const kipp_bf16 *kc, const kipp_bf16 *vc,
                          uint32_t kvh, const uint32_t *block_table, uint32_t p0, uint32_t p1,
                          float scale, float *m, float *l, float *acc);

void k_flash_rows_bf16_ref(const float *q, size_t group, const kipp_bf16 *kc, const kipp_bf16 *vc,
                           const uint32_t *block_table, uint32_t p0, uint32_t p1, float scale,
                           float *m, float *l, float *acc);

void k_pack_bf16_ref(const kipp_bf16 *w, kipp_bf16 *wp, size_t rows, size_t cols, int ith,
                     int nth);
void k_cvt_bf16_ref(const float *x, kipp_bf16 *xb, size_t n);
void k_matvec_bf16p_ref(const kipp_bf16 *wp, const float *x, float *y, size_t rows, size_t cols,
                        int ith, int nth);
void k_matmul_bf16p_ref(const kipp_bf16 *wp, const kipp_bf16 *xb, float *y, size_t rows,
                        size_t cols, size_t n_tok, int accumulate, int ith, int nth);

/** Index of w[r][c] inside the packed layout (for tests and the references). */
static inline size_t k_packed_index(size_t r, size_t c, size_t cols)
{
    return (r / 16) * 16 * cols + ((c / 2) * 16 + r % 16) * 2 + c % 2;
}

/**
 * Merge a partial (m2, l2, acc2) into (m, l, acc) for `group` heads of 128
 * (the split-K combine of flash decoding). Scalar; cheap next to the partials.
 */
void k_attn_merge(size_t group, float *m, float *l, float *acc, const float *m2, const float *l2,
                  const float *acc2);

/**
 * RoPE table: cs[pos][128] = cos(pos*inv[i]) for i<64 then sin(pos*inv[i]),
 * inv[i] = theta^(-2i/128), computed in double then rounded to f32 (HF computes
 * inv_freq in f32 and the angle in f32; see k_rope_table for the exact recipe).
 * cs: [n_pos][128] f32, caller-owned.
 */
void k_rope_table(float *cs, size_t n_pos, double theta);

/** Row range [*r0, *r1) of thread ith out of nth for rows rows, in multiples of align rows. */
static inline void k_split_rows(size_t rows, int ith, int nth, size_t align, size_t *r0, size_t *r1)
{
    size_t units = (rows + align - 1) / align;
    size_t per = units / (size_t)nth, extra = units % (size_t)nth, i = (size_t)ith;
    size_t u0 = i * per + (i < extra ? i : extra), u1 = u0 + per + (i < extra ? 1 : 0);
    *r0 = u0 * align < rows ? u0 * align : rows;
    *r1 = u1 * align < rows ? u1 * align : rows;
}

/** The kernel table for isa (a level this CPU has; see kipp_isa_select). */
const k_cpu_ops *k_cpu_ops_get(kipp_isa isa);

#endif
