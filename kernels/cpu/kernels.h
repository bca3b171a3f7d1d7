/*
 * kernels.h - the CPU kernel table (docs/ARCHITECTURE.md "Layers", "Weight
 * formats", "ISA dispatch").
 *
 * Kernels compute on plain pointers and sizes: no model, no session, no
 * allocation. Two kinds of entries:
 *  - ops (K_CPU_OP_LIST): format-free steps of the forward pass (norms, RoPE,
 *    SwiGLU, KV write, attention). Each has k_<op>_ref (kernels/cpu/ref.c) and
 *    SIMD variants k_<op>_<isa> with the same signature.
 *  - weight read modes (K_READ_MODE_LIST): one row per read mode per level with pack,
 *    matvec and matmul over that format's packed layout, plus one
 *    level-independent k_fmt_info (file type, layout sizes, the activation
 *    formats it reads, its FP32 oracle). Adding a format adds one row and its
 *    kernel files, never new op slots (kernels/README.md lists the files).
 * The op list exists once, here: the struct, the declarations and the
 * describe lines are generated from it. k_cpu_ops_get merges the levels per
 * slot: each op and each format kernel comes from the best level at or below
 * the asked one that has it, so a level only lists what it does differently.
 *
 * Threaded kernels take (ith, nth) and split their rows; no kernel spawns
 * threads. Shapes are row-major. Activations are FP32 unless a format asks for
 * another activation format (K_ACT_*); KV is BF16, or q8_0 ("q8_0 KV cache").
 */
#ifndef KIPP_KERNELS_CPU_H
#define KIPP_KERNELS_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/common.h"
#include "kernels/formats.h"
#include "kernels/qwen3_shape.h"

/* ---- format-free ops ----
 *
 * rmsnorm_f32: RMSNorm of n_rows rows of width n (Zhang & Sennrich 2019; HF
 *   Qwen3RMSNorm): y = x / sqrt(mean(x^2) + eps) * w. x, y: [n_rows][n] f32
 *   (may alias), w: [n] bf16. Also the per-head Q/K norm with n = 128.
 * rope_f32: RoPE, rotate-half pairing (HF apply_rotary_pos_emb, Su et al.
 *   2021) in place on n_head heads of 128: for i < 64, (x[i], x[i+64]) rotated
 *   by pos * theta^(-2i/128). x: [n_head][128] f32; cs: [128] f32 = cos[64]
 *   then sin[64] for this position, from k_rope_table.
 * swiglu_f32: out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)). [n] f32.
 * add_f32: x[i] += y[i], [n] f32 (residual add).
 * embed_bf16: out[c] = table[token][c] widened to f32. table: [vocab][d] bf16.
 * kv_write_bf16: write one position's K and V (each [8][128] f32) into a
 *   layer's paged cache, rounding to BF16. kc, vc: layer bases
 *   [n_blocks*32][8][128] bf16; physical row = block_table[pos >> 5] * 32 + (pos & 31).
 * flash_gqa_bf16: flash-attention walk (Dao et al. 2022, online softmax) of
 *   `group` query vectors that share KV head kvh over positions [p0, p1)
 *   (p1 > p0), each K/V row read once for all of them. The walk CONTINUES the
 *   state it is given (k_attn_init makes a fresh one): per query g, m[g]
 *   running max of scaled scores, l[g] = sum exp(s - m[g]), acc[g][128] = sum
 *   exp(s - m[g]) * v; the output is acc / l. Positions are taken in aligned
 *   chunks of K_ATTN_CHUNK, so walks split at multiples of K_ATTN_CHUNK give
 *   the bitwise result of one walk (row invariance), and a vector's result does
 *   not depend on group (the backends walk a tile's vectors together and a
 *   decode row's alone). q: [group][128] f32
 *   (group may be a whole query tile: tokens x heads); kc, vc: layer bases as
 *   kv_write; scale = 1/sqrt(128).
 * flash_rows_bf16: the walk of one token's query heads for KV heads
 *   [kvh0, kvh1): flash_gqa_bf16 per KV head (bit for bit), but chunk by
 *   chunk with all heads of the range together, positions outer, so the K and
 *   V rows are read in address order. q: [8*group][128] f32 (group query
 *   heads per KV head, in order); m, l: [8*group], acc: [8*group][128] f32;
 *   only the range's heads are touched. pnext: where the caller's next walk
 *   with these heads starts (a decode lane's next page), a hint a walk may
 *   prefetch under its own last chunk since it cannot see past p1; it must
 *   lie inside the block table, or be K_ATTN_NO_NEXT. It never changes a bit
 *   of the result.
 *
 * flash_gqa_dot, flash_rows_dot (k_cpu_ops members outside the list: only
 *   avx512_bf16 has them in SIMD; below it the ref level's scalar model):
 *   flash_gqa_bf16 and flash_rows_bf16 with both products on vdpbf16ps: q
 *   rounded to BF16 (vcvtneps2bf16) for the scores, and per chunk the softmax
 *   weights e rounded to BF16 for the values, l summing the rounded weights.
 *   Same arguments, state, chunking and row invariance. Chosen with the
 *   bf16dot read mode (cpu_backend.c KIPP_BF16_ACT); docs/PERFORMANCE.md
 *   "BF16 activations" gives its accuracy.
 *
 * Lanes: the backends split every query's walk over [0, pos] into
 * K_ATTN_LANES walks, one per page parity (k_attn_lane), each from a fresh
 * state, and fold them with k_attn_merge in lane order. Decode runs the two
 * lanes on two workers, each reading whole pages; prefill tiles walk both
 * lanes too, so a token's attention rounds the same in either (row invariance).
 */
#define K_CPU_OP_LIST(X)                                                                          \
    X(rmsnorm_f32, (const float *x, const kipp_bf16 *w, float *y, size_t n_rows, size_t n,         \
                    float eps))                                                                   \
    X(rope_f32, (float *x, size_t n_head, const float *cs))                                       \
    X(swiglu_f32, (const float *gate, const float *up, float *out, size_t n))                     \
    X(add_f32, (float *x, const float *y, size_t n))                                              \
    X(embed_bf16, (const kipp_bf16 *table, uint32_t token, float *out, size_t d))                 \
    X(kv_write_bf16, (kipp_bf16 *kc, kipp_bf16 *vc, const uint32_t *block_table, uint32_t pos,     \
                      const float *k, const float *v))                                            \
    X(flash_gqa_bf16, (const float *q, size_t group, const kipp_bf16 *kc, const kipp_bf16 *vc,     \
                       uint32_t kvh, const uint32_t *block_table, uint32_t p0, uint32_t p1,       \
                       float scale, float *m, float *l, float *acc))                              \
    X(flash_rows_bf16, (const float *q, size_t group, const kipp_bf16 *kc, const kipp_bf16 *vc,    \
                        const uint32_t *block_table, uint32_t kvh0, uint32_t kvh1, uint32_t p0,    \
                        uint32_t p1, uint32_t pnext, float scale, float *m, float *l, float *acc))

#define K_OP_TYPEDEF(name, params) typedef void(*k_##name##_fn) params;
K_CPU_OP_LIST(K_OP_TYPEDEF)
#undef K_OP_TYPEDEF

/* ---- activation formats ----
 * What a format's matvec and matmul read as their input x. F32: [n] float as
 * the forward pass holds it. Q8: per 32 values one k_act_q8_block (seed 002:
 * "activations quantized to int8 per 32-block"), the operand of the integer
 * dot of the q8_0 and affine4 formats. A quantizer converts one row of n values
 * (n a multiple of the format's block). X(ID, name, values per block, bytes per block).
 * BF16: [n] bf16, each value rounded as vcvtneps2bf16 does (RNE; a denormal
 * input becomes a zero of its sign; a NaN stays a quiet NaN), so a 32-bit
 * load at 2k is the pair (x[2k], x[2k+1]) that vdpbf16ps multiplies with a
 * packed bf16 weight line. Only the bf16dot read mode uses it; decode and
 * prefill round a row alike because both read this one format (row
 * invariance).
 */
#define K_ACT_LIST(X)  \
    X(F32, f32, 1, 4)  \
    X(Q8, q8, 32, 48)  \
    X(BF16, bf16, 32, 64)

/**
 * One Q8 activation block: x[i] ~= d * q[i] for 32 consecutive values, except
 * one outlier kept in FP32. Outlier (k_q8_outlier): the block's largest |x[i]|
 * (bit patterns, first index on ties) when it is finite and more than
 * K_Q8_OUTLIER_RATIO times the second largest; then io = its index, xo = x[io],
 * and the quantization below sees x[io] as 0; else io = -1, xo = 0. Then
 * amax = max |x[i]| (taken on the bit patterns, so NaN and Inf order
 * deterministically); id = 127 / amax when 1e-30 < amax < Inf, else 0;
 * q[i] = x86 cvtps2dq(x[i] * id) (RNE; NaN or out of range -> INT32_MIN),
 * saturated to int8; d = amax / 127; sum = sum of q[i]. Finite inputs give
 * q in [-127, 127]. sum serves the unsigned-offset VNNI dot and the affine
 * (affine4) min term. The integer dot kernels read q, d and sum only; the
 * format's outlier_fix (k_fmt_info) adds W[r][32b + io] * xo after them.
 */
typedef struct {
    int8_t q[32];
    float d;
    int32_t sum;
    float xo;      /* the outlier's value (0 when io < 0) */
    int32_t io;    /* its index in the block, -1 when none */
} k_act_q8_block;

/** A Q8 block's outlier is more than K_Q8_OUTLIER_RATIO = 2^K_Q8_OUTLIER_LOG2 times the
 *  block's second largest |x| (a power of two: the AVX2 quantizer tests it on the bits). */
#define K_Q8_OUTLIER_LOG2 2
#define K_Q8_OUTLIER_RATIO ((float)(1u << K_Q8_OUTLIER_LOG2))

/** Panels ahead that outlier_fix prefetches while it walks one column. */
#define K_FIX_PF 8

/** The index of the outlier of 32 values x (k_act_q8_block), or -1. */
static inline int k_q8_outlier(const float *x)
{
    uint32_t a1 = 0, a2 = 0;
    int i1 = -1;
    for (int i = 0; i < 32; i++) {
        uint32_t u;
        __builtin_memcpy(&u, &x[i], 4);
        u &= 0x7fffffffu;
        if (u > a1) a2 = a1, a1 = u, i1 = i;
        else if (u > a2) a2 = u;
    }
    float f1, f2;
    __builtin_memcpy(&f1, &a1, 4);
    __builtin_memcpy(&f2, &a2, 4);
    return a1 < 0x7f800000u && f1 > K_Q8_OUTLIER_RATIO * f2 ? i1 : -1;
}

#define K_ACT_ENUM(ID, name, block, bytes) K_ACT_##ID,
typedef enum { K_ACT_LIST(K_ACT_ENUM) K_ACT_COUNT } k_act;
#undef K_ACT_ENUM

/** Quantize an activation row: x [n] f32 -> xa [n] in the act format. */
typedef void (*k_act_fn)(const float *x, void *xa, size_t n);

/** Bytes of one activation row of n values in format a (n a multiple of its block). */
size_t k_act_row_bytes(k_act a, size_t n);
/** Name of an activation format: "f32", "q8", "bf16". */
const char *k_act_name(k_act a);

/* ---- weight formats and read modes ----
 * K_READ_MODE_LIST names what a row of kernels reads: a packed layout of one
 * file format read against one activation format (k_fmt_info.act). Every
 * file format of kernels/formats.h has one read mode of its own name (bf16,
 * q8_0, affine4); a file format may have more, which k_fmt_from_gguf never
 * returns and a backend picks per projection: bf16dot, a second read mode of
 * bf16 files. The entries:
 *
 * bf16: GGUF type 30 in the file ([rows][cols] bf16 row-major). Packed layout,
 *   panels of 16 rows with k-pairs interleaved inside a panel:
 *     wp[(r/16)*16*cols + ((c/2)*16 + r%16)*2 + c%2] = w[r][c]
 *   i.e. [rows/16][cols/2][16][2] bf16, the same byte count as w. One 64-byte
 *   load gives 16 rows x 2 k: vdpbf16ps against a broadcast activation pair
 *   with no horizontal reduction, or two FP32 FMAs after a shift and a mask.
 *   Concatenating the packed buffers of matrices with the same cols is the
 *   packing of their row concatenation (fused Q|K|V, Gate|Up).
 *   rows % 16 == 0, cols % 32 == 0. matvec and matmul read F32 activations
 *   (weights are widened in registers: accuracy equals FP32).
 *
 * q8_0: GGUF type 8 in the file (GGML Q8_0: per 32 weights an fp16 d and 32
 *   int8 q, 34 bytes, w = d * q; row-major blocks). Packed layout "q8p16", per
 *   16-row panel P and 32-column block b, 544 bytes at (P * cols/32 + b) * 544:
 *     fp16 d[16]                      the 16 rows' scales, the file's fp16
 *                                     (widened in registers, exact)
 *     int8  q[8][16][4]               q[j][i][k] = w[16P + i][32b + 4j + k]
 *   so one 64-byte load gives 16 rows x 4 k: the operand of vpdpbusd (or of
 *   vpmaddubsw + vpmaddwd) against a 32-bit broadcast of 4 activation bytes,
 *   with no horizontal reduction. The same bytes as the file (FP32 scales
 *   made it 1.06x); the q lines sit 32 bytes off the cache lines in every
 *   other block, which 256-bit loads and Zen's double-pumped 512-bit loads
 *   do not split. Panels are
 *   contiguous, so concatenating packed matrices packs their row
 *   concatenation. rows % 16 == 0, cols % 32 == 0. matvec and matmul read Q8
 *   activations; per block the int32 dot is scaled by d_w * d_x in FP32.
 *
 * affine4 (scheme affine4_gs32): GGUF type 3 in the file, GGML's Q4_1 block (per 32
 *   weights fp16 d, fp16 m and 16 bytes of nibbles, byte j = q[j] | q[j+16] << 4,
 *   20 bytes, w = d * q + m). Packed layout "q4p16", per 16-row panel P and
 *   32-column block b, 320 bytes at (P * cols/32 + b) * 320:
 *     fp16 d[16], fp16 m[16]          the 16 rows' scales and minima, the file's
 *                                     fp16 (widened in registers: one vcvtph2ps
 *                                     per block, exact)
 *     uint8 q[4][16][4]               low nibble  q[j][i][k] = q(w[16P+i][32b+4j+k]),
 *                                     high nibble the same for quad j + 4
 *   so one 64-byte load gives two k-quads of 16 rows x 4 k after a mask and a
 *   shift, and every line stays 64-byte aligned. The same bytes as the file:
 *   decode reads 5 bits per weight (FP32 scales and minima made it 6).
 *   rows % 16 == 0, cols % 32 == 0.
 *   Reads Q8 activations; per block y += d_w d_x dot(q_w, q_x) + m_w d_x sum(q_x),
 *   q_w unsigned (vpmaddubsw / vpdpbusd need no sign trick).
 *
 * bf16dot (read mode, not a file format): a second read mode of the bf16 file type (k_fmt_from_gguf never
 *   returns it; a backend picks it per projection, see k_fmt_native): the
 *   same packed layout and packer as bf16, read with BF16 activations by
 *   vdpbf16ps (one instruction per 16 rows x 2 k, against two FMAs and two
 *   widening ops), so prefill runs at the BF16-dot peak, twice the FP32 FMA
 *   peak on Zen 4/5. The price is one BF16 rounding of each activation
 *   (unit roundoff 2^-8): per projection NMSE ~2e-6 against FP32
 *   activations (kcheck matmul_f32 rows). Per row lane one vdpbf16ps chain,
 *   k-pairs in column order from zero, in matvec and matmul (accumulate = 0)
 *   alike.
 *   Only the avx512_bf16 level has SIMD kernels for it; ref has the scalar
 *   emulation (kernels/cpu/ref_bf16dot.c) that the checks compare against.

 */
/* The file formats' own read modes first, in KIPP_FMT_LIST order, then the extra read modes. */
#define K_READ_MODE_LIST(X) X(BF16, bf16) X(Q8_0, q8_0) X(AFFINE4, affine4) X(BF16DOT, bf16dot)

#define K_FMT_ENUM(ID, name) K_FMT_##ID,
typedef enum { K_READ_MODE_LIST(K_FMT_ENUM) K_FMT_COUNT } k_fmt;
#undef K_FMT_ENUM

/** Pack w (file layout of the format) into wp (its packed layout); this thread's share of panels. */
typedef void (*k_pack_fn)(const void *w, void *wp, size_t rows, size_t cols, int ith, int nth);

/**
 * Decode matvec: y[r] = sum_c W[r][c] * x[c] for this thread's share of rows.
 * wp: packed [rows][cols]; x: [cols] in the format's act; y: [rows] f32.
 *
 * Row invariance: at every level, y equals row t of the same
 * level's matmul (accumulate = 0) on x = xa[t], bit for bit, whatever n_tok,
 * the tile a row falls in and the thread split: both read the same
 * activation format and run the same per-row accumulation order. So a
 * token's logits do not depend on whether it was decoded, prefilled or
 * batched. kcheck's rowinv rows gate it per format and level.
 */
typedef void (*k_matvec_fn)(const void *wp, const void *x, float *y, size_t rows, size_t cols,
                            int ith, int nth);

/**
 * Prefill matmul: y[t][r] = (accumulate ? y[t][r] : 0) + sum_c W[r][c] * xa[t][c]
 * for t < n_tok and this thread's share of rows. wp: packed [rows][cols];
 * xa: [n_tok][cols] in the format's act; y: [n_tok][rows] f32 (row stride
 * rows). Each weight byte leaves DRAM once per call (L1-tiled, seed 002).
 */
typedef void (*k_matmul_fn)(const void *wp, const void *xa, float *y, size_t rows, size_t cols,
                            size_t n_tok, int accumulate, int ith, int nth);

/**
 * The format's oracle over the FILE layout with FP32 activations, as the ref
 * backend computes (seed 000 "type-dispatched matvec"): y[t][r] = sum_c
 * W[r][c] * x[t][c], FP32 accumulation in column order. w: [rows][cols] as in
 * the file; x: [n_tok][cols] f32; y: [n_tok][rows] f32.
 */
typedef void (*k_linear_ref_fn)(const void *w, const float *x, float *y, size_t rows,
                                size_t cols, size_t n_tok, int ith, int nth);

/** A level's kernels for one format (NULL: inherit from the level below). */
typedef struct {
    k_pack_fn pack;
    k_matvec_fn matvec;
    k_matmul_fn matmul;
} k_fmt_kernels;

/** Level-independent facts of a format: every level reads the same packed layout. */
typedef struct {
    const char *name;        /* "bf16" */
    const kipp_fmt_facts *file; /* its file format: GGUF type, block, bytes (kernels/formats.h) */
    size_t row_align;        /* rows % row_align == 0 for the packed layout */
    size_t col_align;        /* cols % col_align == 0 */
    size_t (*packed_bytes)(size_t rows, size_t cols); /* bytes of the packed copy */
    k_act act;               /* activations matvec and matmul read (one format: row invariance) */
    k_linear_ref_fn linear_ref;
    /** FP32 weights w [rows][cols] -> the file layout (what the converter writes), for checks. */
    void (*from_f32)(const float *w, void *out, size_t rows, size_t cols);
    /** Q8-activation formats (NULL otherwise): after matvec or matmul over xa [n_tok] rows of Q8
     *  blocks, y[t][r] += w(r, 32b + io) * xo for every block b of token t that holds an outlier
     *  (k_act_q8_block), blocks in column order, w(r, c) the dequantized weight in FP32; rows
     *  [r0, r1) of k_split_rows(rows, ith, nth, 16), the rows the matvec and matmul give thread ith.
     *  Scalar and level-independent: the same bits after the matvec and the matmul (row invariance). */
    void (*outlier_fix)(const void *wp, const void *xa, float *y, size_t rows, size_t cols, size_t n_tok,
                        int ith, int nth);
} k_fmt_info;

/** Bytes of a [rows][cols] weight of format fi in the file. */
static inline size_t k_fmt_file_bytes(const k_fmt_info *fi, size_t rows, size_t cols)
{
    return kipp_fmt_file_bytes(fi->file, rows, cols);
}

/** Facts of format f (f < K_FMT_COUNT). */
const k_fmt_info *k_fmt_get(k_fmt f);

/** The format whose file type is gguf_type; -1 when no format reads it. */
int k_fmt_from_gguf(uint32_t gguf_type);

/** A prepared weight: its format, its packed data and shape. */
typedef struct {
    k_fmt fmt;
    const void *data; /* packed [rows][cols] in fmt's layout, owned by the backend */
    size_t rows, cols;
} k_weight;

/* ---- the scalar drivers of the reference kernels (ref_linear.c) ----
 * A format's ref file supplies the per-row and per-block arithmetic; these
 * run it over the rows (this thread's share), the tokens and accumulate. */

/** Row r of packed weights wp [rows][cols] against one activation row x (the format's act). */
typedef float (*k_row_dot_fn)(const void *wp, size_t r, size_t cols, const void *x);
/** One row of the FILE layout (w_row: that row's bytes) against x [cols] f32, FP32 in column order. */
typedef float (*k_file_row_dot_fn)(const void *w_row, const float *x, size_t cols);
/** Scatter one file block (32 columns of one row) into its packed panel block pb at row lane 0..15. */
typedef void (*k_pack_block_fn)(const uint8_t *blk, uint8_t *pb, unsigned lane);

/** k_matvec_fn over a row dot. */
void k_ref_matvec(k_row_dot_fn dot, const void *wp, const void *x, float *y, size_t rows, size_t cols, int ith,
                  int nth);
/** k_matmul_fn over a row dot; token t's activations start at t * k_act_row_bytes(act, cols). */
void k_ref_matmul(k_row_dot_fn dot, k_act act, const void *wp, const void *xa, float *y, size_t rows, size_t cols,
                  size_t n_tok, int accumulate, int ith, int nth);
/** Define k_matvec_<fmt>_ref and k_matmul_<fmt>_ref over the row dot `dot` reading activation format act. */
#define K_REF_ROW_KERNELS(fmt, dot, act)                                                                  \
    void k_matvec_##fmt##_ref(const void *wp, const void *x, float *y, size_t rows, size_t cols, int ith, \
                              int nth)                                                                    \
    {                                                                                                     \
        k_ref_matvec(dot, wp, x, y, rows, cols, ith, nth);                                               \
    }                                                                                                     \
    void k_matmul_##fmt##_ref(const void *wp, const void *xa, float *y, size_t rows, size_t cols,         \
                              size_t n_tok, int accumulate, int ith, int nth)                             \
    {                                                                                                     \
        k_ref_matmul(dot, act, wp, xa, y, rows, cols, n_tok, accumulate, ith, nth);                      \
    }
/** k_linear_ref_fn over a file-layout row dot; row r starts at r * row_bytes. */
void k_ref_linear(k_file_row_dot_fn dot, size_t row_bytes, const void *w, const float *x, float *y, size_t rows,
                  size_t cols, size_t n_tok, int ith, int nth);
/** k_pack_fn of a 16-row-panel block layout: file blocks of file_block bytes, panel blocks of packed_block. */
void k_ref_pack16(k_pack_block_fn pack, size_t file_block, size_t packed_block, const void *w, void *wp,
                  size_t rows, size_t cols, int ith, int nth);

/**
 * A 32-column block format with Q8 activations and a 16-row panel layout
 * (q8_0, affine4): the few primitives that differ per format. One set of scalar
 * walkers (ref_linear.c) runs them for the oracle, the packer, the row dot of
 * matvec and matmul, and outlier_fix, so each walk is written once.
 * A panel block opens with fp16 d[16] (and, affine, fp16 m[16]), the row
 * lanes' scales and minima as the file stores them; w = d q, or w = d q + m
 * when affine.
 */
typedef struct {
    size_t file_block;  /* bytes of one 32-weight block in the file */
    size_t panel_block; /* bytes of one packed 16-row x 32-column panel block */
    int affine;         /* w = d q + m: m[16] follows d[16], and the row dot adds m d_x sum(q_x) */
    /** Dequantize one file block as the oracle does: w[c], column c of the block, in FP32. */
    void (*file_f32)(const uint8_t *blk, float w[32]);
    /** Scatter one file block into panel block pb at row lane 0..15. */
    k_pack_block_fn pack;
    /** Row lane `lane` of panel block pb: its 32 integer weights in column order. */
    void (*lane_q)(const uint8_t *pb, unsigned lane, int32_t q[32]);
    /** Column c (0..31) of panel block pb: the 16 row lanes' integer weights. */
    void (*col_q)(const uint8_t *pb, unsigned c, int32_t q[16]);
    /** Offset in a panel block of the 64 bytes that hold column c's weights (a cache line, or two when misaligned). */
    size_t (*q_line)(unsigned c);
} k_block_fmt;

/** File-layout row dot (k_file_row_dot_fn) of a block format: per block, dequantize then FP32 in column order. */
float k_block_file_row_dot(const k_block_fmt *f, const void *w_row, const float *x, size_t cols);
/** Packed row dot (k_row_dot_fn) against one row of Q8 blocks: per block the exact int32 dot times
 *  (d_w * d_x), then, affine, + m_w * (d_x * sum(q_x)), summed in FP32 in column order. */
float k_block_row_dot(const k_block_fmt *f, const void *wp, size_t r, size_t cols, const void *xq);
/** k_fmt_info.outlier_fix of a block format: walks each outlier's column down the thread's panels. */
void k_block_outlier_fix(const k_block_fmt *f, const void *wp, const void *xa, float *y, size_t rows, size_t cols,
                         size_t n_tok, int ith, int nth);
/** Define a block format's reference kernels over its k_block_fmt F (file row ID of
 *  KIPP_FMT_LIST): k_linear_<fmt>_ref, k_pack_<fmt>_ref, k_matvec_<fmt>_ref, k_matmul_<fmt>_ref
 *  and k_fmt_info_<fmt>, whose encoder is the file's static <fmt>_from_f32. */
#define K_REF_BLOCK_KERNELS(fmt, ID, F)                                                                    \
    static size_t fmt##_packed_bytes(size_t rows, size_t cols) { return rows / 16 * (cols / 32) * F.panel_block; } \
    static float fmt##_file_row_dot(const void *w_row, const float *x, size_t cols)                        \
    {                                                                                                      \
        return k_block_file_row_dot(&F, w_row, x, cols);                                                   \
    }                                                                                                      \
    void k_linear_##fmt##_ref(const void *w, const float *x, float *y, size_t rows, size_t cols,           \
                              size_t n_tok, int ith, int nth)                                              \
    {                                                                                                      \
        k_ref_linear(fmt##_file_row_dot, cols / 32 * F.file_block, w, x, y, rows, cols, n_tok, ith, nth); \
    }                                                                                                      \
    void k_pack_##fmt##_ref(const void *w, void *wp, size_t rows, size_t cols, int ith, int nth)           \
    {                                                                                                      \
        k_ref_pack16(F.pack, F.file_block, F.panel_block, w, wp, rows, cols, ith, nth);                    \
    }                                                                                                      \
    static float fmt##_row_dot(const void *wp, size_t r, size_t cols, const void *xq)                      \
    {                                                                                                      \
        return k_block_row_dot(&F, wp, r, cols, xq);                                                       \
    }                                                                                                      \
    K_REF_ROW_KERNELS(fmt, fmt##_row_dot, K_ACT_Q8)                                                        \
    static void fmt##_outlier_fix(const void *wp, const void *xa, float *y, size_t rows, size_t cols,      \
                                  size_t n_tok, int ith, int nth)                                          \
    {                                                                                                      \
        k_block_outlier_fix(&F, wp, xa, y, rows, cols, n_tok, ith, nth);                                   \
    }                                                                                                      \
    const k_fmt_info k_fmt_info_##fmt = {.name = #fmt, .file = &kipp_fmts[KIPP_FMT_##ID], .row_align = 16, \
        .col_align = 32, .packed_bytes = fmt##_packed_bytes, .act = K_ACT_Q8, .linear_ref = k_linear_##fmt##_ref, \
        .from_f32 = fmt##_from_f32, .outlier_fix = fmt##_outlier_fix};

/** The fp16 at p (a file block's scale or minimum), widened. */
static inline float k_f16_at(const uint8_t *p)
{
    uint16_t h;
    __builtin_memcpy(&h, p, 2);
    return kipp_f16_to_f32(h);
}

/* ---- q8_0 KV cache (kipp_model_options.kv_type, docs/ARCHITECTURE.md "KV cache") ----
 *
 * A layer's paged K (or V) cache of the q8_0 KV type is [n_blocks*32] rows of
 * K_KVQ8_ROW bytes, one row per position (physical row block_table[pos >> 5]
 * * 32 + (pos & 31), as the BF16 layout): int8 q[8][128] (the 8 KV heads),
 * then fp16 d[8][4], one scale per 32 values of a head (llama.cpp's q8_0
 * block: 34 bytes per 32 values against BF16's 64). Value (h, i) = d[h][i/32]
 * * q[h][i], exact in FP32 (8 x 11 significant bits).
 *
 * kv_write_q8_0: write one position's K and V ([8][128] f32 each): per 32
 *   values amax = max |x|, d = amax / 127, id = d ? 1/d : 0 (FP32), q =
 *   roundf(x * id) clamped to [-127, 127], d stored as fp16 (RNE); as
 *   ggml's quantize_row_q8_0_ref. NaN inputs store q 0; a non-finite amax a
 *   non-finite scale (the BF16 cache keeps such values too).
 * flash_gqa_q8_0, flash_rows_q8_0: flash_gqa_bf16 and flash_rows_bf16 (same
 *   arguments, state, chunking, lanes and row invariance) over the q8_0
 *   layout, reading the dequantized values. flash_rows_q8_0 is flash_gqa_q8_0
 *   per KV head, bit for bit.
 */
#define K_KVQ8_Q (KIPP_N_KV_HEAD * KIPP_HEAD_DIM)                  /* int8 bytes of a row: 1024 */
#define K_KVQ8_ROW (K_KVQ8_Q + KIPP_N_KV_HEAD * KIPP_HEAD_DIM / 32 * 2) /* + fp16 scales: 1088 */

/** Byte offset of position pos's row in a layer's q8_0 K or V cache. */
static inline size_t k_kvq8_off(const uint32_t *block_table, uint32_t pos)
{
    return ((size_t)block_table[pos / KIPP_KV_BLOCK] * KIPP_KV_BLOCK + pos % KIPP_KV_BLOCK) * K_KVQ8_ROW;
}

typedef void (*k_kv_write_q8_0_fn)(uint8_t *kc, uint8_t *vc, const uint32_t *block_table, uint32_t pos,
                                   const float *k, const float *v);
typedef void (*k_flash_gqa_q8_0_fn)(const float *q, size_t group, const uint8_t *kc, const uint8_t *vc,
                                    uint32_t kvh, const uint32_t *block_table, uint32_t p0, uint32_t p1,
                                    float scale, float *m, float *l, float *acc);
typedef void (*k_flash_rows_q8_0_fn)(const float *q, size_t group, const uint8_t *kc, const uint8_t *vc,
                                     const uint32_t *block_table, uint32_t kvh0, uint32_t kvh1, uint32_t p0,
                                     uint32_t p1, uint32_t pnext, float scale, float *m, float *l, float *acc);

/* ref (kernels/cpu/ref_kvq8.c) has all three; avx2 and avx512 the walks (attention_q8_simd.h) */
void k_kv_write_q8_0_ref(uint8_t *kc, uint8_t *vc, const uint32_t *block_table, uint32_t pos, const float *k,
                         const float *v);
#define K_FLASH_Q8_DECL(sfx)                                                                             \
    void k_flash_gqa_q8_0_##sfx(const float *q, size_t group, const uint8_t *kc, const uint8_t *vc,     \
                                uint32_t kvh, const uint32_t *block_table, uint32_t p0, uint32_t p1,    \
                                float scale, float *m, float *l, float *acc);                           \
    void k_flash_rows_q8_0_##sfx(const float *q, size_t group, const uint8_t *kc, const uint8_t *vc,    \
                                 const uint32_t *block_table, uint32_t kvh0, uint32_t kvh1, uint32_t p0, \
                                 uint32_t p1, uint32_t pnext, float scale, float *m, float *l, float *acc);
K_FLASH_Q8_DECL(ref)
K_FLASH_Q8_DECL(avx2)
K_FLASH_Q8_DECL(avx512)
#undef K_FLASH_Q8_DECL

/* ---- the table ---- */

#define K_OP_MEMBER(name, params) k_##name##_fn name;
/** The kernels of one ISA level, merged per slot with the levels below it. */
typedef struct {
    const char *isa; /* level asked for: "ref", "avx2", "avx512", "avx512_bf16" */
    K_CPU_OP_LIST(K_OP_MEMBER)
    k_flash_gqa_bf16_fn flash_gqa_dot;   /* BF16-dot attention (flash_gqa_dot above) */
    k_flash_rows_bf16_fn flash_rows_dot;
    k_kv_write_q8_0_fn kv_write_q8_0;      /* q8_0 KV (above) */
    k_flash_gqa_q8_0_fn flash_gqa_q8_0;
    k_flash_rows_q8_0_fn flash_rows_q8_0;
    k_fmt_kernels fmt[K_FMT_COUNT]; /* one row per weight format */
    k_act_fn act[K_ACT_COUNT];      /* activation quantizers (F32: NULL, no conversion) */
} k_cpu_ops;
#undef K_OP_MEMBER

/** Which level each slot of a merged table came from (for describe and tests). */
typedef struct {
#define K_OP_SRC(name, params) kipp_isa name;
    K_CPU_OP_LIST(K_OP_SRC)
#undef K_OP_SRC
    kipp_isa flash_gqa_dot, flash_rows_dot;
    kipp_isa kv_write_q8_0, flash_gqa_q8_0, flash_rows_q8_0;
    kipp_isa fmt[K_FMT_COUNT][3]; /* pack, matvec, matmul */
    kipp_isa act[K_ACT_COUNT];
} k_cpu_src;

/** The merged table for level isa, capped at what this CPU runs (never an illegal instruction). */
const k_cpu_ops *k_cpu_ops_get(kipp_isa isa);

/**
 * The merged table of level isa without the CPU cap: only for the SIMDe
 * emulation test (tests/kcheck.c built with KIPP_SIMDE_EMU), where the
 * AVX-512 entries are portable C. src (may be NULL) gets each slot's level.
 */
const k_cpu_ops *k_cpu_ops_table(kipp_isa isa, k_cpu_src *src);

/** One line per slot of the table for level isa: "k_<op>_<level>", for `kipp inspect --kernels`. */
void k_cpu_ops_describe(kipp_isa isa, char *out, size_t outlen);

/**
 * 1 when table k runs format f's matvec and matmul in SIMD kernels of its
 * own level family rather than inheriting the scalar ref ones: what a backend
 * asks before it picks a read mode such as bf16dot that only some levels
 * accelerate (a scalar bf16dot on avx2 would be correct but ~30x slower).
 */
int k_fmt_native(const k_cpu_ops *k, k_fmt f);

/* ---- declarations of every variant, from the lists ---- */

#define K_OP_DECL(name, params, sfx) void k_##name##_##sfx params;
#define K_OP_DECL_REF(name, params) K_OP_DECL(name, params, ref)
#define K_OP_DECL_AVX2(name, params) K_OP_DECL(name, params, avx2)
#define K_OP_DECL_AVX512(name, params) K_OP_DECL(name, params, avx512)
K_CPU_OP_LIST(K_OP_DECL_REF)
K_CPU_OP_LIST(K_OP_DECL_AVX2)
K_CPU_OP_LIST(K_OP_DECL_AVX512)
#undef K_OP_DECL_REF
#undef K_OP_DECL_AVX2
#undef K_OP_DECL_AVX512
#undef K_OP_DECL

/* bf16 format (kernels/cpu/ref_bf16.c, linear_simd.h via linear_avx2.c and linear_avx512.c) */
void k_pack_bf16_ref(const void *w, void *wp, size_t rows, size_t cols, int ith, int nth);
/** Bytes of a [rows][cols] bf16 matrix, file and packed layout alike (bf16 and bf16dot). */
size_t k_bf16_bytes(size_t rows, size_t cols);
/** FP32 [rows][cols] -> bf16, RNE (torch's .to(bfloat16), tools/convert_to_gguf.py); for checks. */
void k_bf16_from_f32(const float *w, void *out, size_t rows, size_t cols);
void k_linear_bf16_ref(const void *w, const float *x, float *y, size_t rows, size_t cols,
                       size_t n_tok, int ith, int nth);
#define K_BF16_DECL(sfx)                                                                          \
    void k_matvec_bf16_##sfx(const void *wp, const void *x, float *y, size_t rows, size_t cols,   \
                             int ith, int nth);                                                   \
    void k_matmul_bf16_##sfx(const void *wp, const void *xa, float *y, size_t rows, size_t cols,  \
                             size_t n_tok, int accumulate, int ith, int nth);
K_BF16_DECL(ref)
K_BF16_DECL(avx2)
K_BF16_DECL(avx512)
#undef K_BF16_DECL

/* The 32-column block formats with Q8 activations: the ref kernels and
 * k_fmt_info come from K_REF_BLOCK_KERNELS in kernels/cpu/ref_<fmt>.c; the
 * SIMD ones from linear_<fmt>_simd.h via linear_<fmt>_avx2.c and
 * linear_<fmt>_avx512.c, and linear_<fmt>_avx512_bf16.c's VNNI prefill tile. */
#define K_BLOCK_FMT_DECL(fmt)                                                                        \
    void k_pack_##fmt##_ref(const void *w, void *wp, size_t rows, size_t cols, int ith, int nth);    \
    void k_linear_##fmt##_ref(const void *w, const float *x, float *y, size_t rows, size_t cols,     \
                              size_t n_tok, int ith, int nth);                                       \
    K_BLOCK_LINEAR_DECL(fmt, ref)                                                                    \
    K_BLOCK_LINEAR_DECL(fmt, avx2)                                                                   \
    K_BLOCK_LINEAR_DECL(fmt, avx512)                                                                 \
    void k_matmul_##fmt##_avx512_bf16(const void *wp, const void *xa, float *y, size_t rows, size_t cols, \
                                     size_t n_tok, int accumulate, int ith, int nth);
#define K_BLOCK_LINEAR_DECL(fmt, sfx)                                                                \
    void k_matvec_##fmt##_##sfx(const void *wp, const void *x, float *y, size_t rows, size_t cols,   \
                                int ith, int nth);                                                   \
    void k_matmul_##fmt##_##sfx(const void *wp, const void *xa, float *y, size_t rows, size_t cols,  \
                                size_t n_tok, int accumulate, int ith, int nth);
#define K_Q8P_BLOCK 544u /* q8_0: bytes of one packed 16-row x 32-column panel block */
#define K_Q8P_Q 32u      /* q8_0: offset of the int8 weights in a panel block, after fp16 d[16] */
#define K_PANEL_BYTES_q8_0 K_Q8P_BLOCK /* the same, by format name (linear_panel_simd.h) */
K_BLOCK_FMT_DECL(q8_0)
#define K_Q4P_BLOCK 320u /* affine4: bytes of one packed 16-row x 32-column panel block */
#define K_Q4P_Q 64u      /* affine4: offset of the nibbles in a panel block, after fp16 d[16] and m[16] */
#define K_PANEL_BYTES_affine4 K_Q4P_BLOCK
K_BLOCK_FMT_DECL(affine4)
#undef K_BLOCK_FMT_DECL
#undef K_BLOCK_LINEAR_DECL

/* BF16-dot attention (flash_gqa_dot above): the scalar model (ref_bf16dot.c)
 * and the avx512_bf16 walks (attention_avx512_bf16.c) */
#define K_FLASH_DOT_DECL(sfx)                                                                          \
    void k_flash_gqa_dot_##sfx(const float *q, size_t group, const kipp_bf16 *kc, const kipp_bf16 *vc,  \
                               uint32_t kvh, const uint32_t *block_table, uint32_t p0, uint32_t p1,    \
                               float scale, float *m, float *l, float *acc);                           \
    void k_flash_rows_dot_##sfx(const float *q, size_t group, const kipp_bf16 *kc, const kipp_bf16 *vc, \
                                const uint32_t *block_table, uint32_t kvh0, uint32_t kvh1, uint32_t p0, \
                                uint32_t p1, uint32_t pnext, float scale, float *m, float *l, float *acc);
K_FLASH_DOT_DECL(ref)
K_FLASH_DOT_DECL(avx512_bf16)
#undef K_FLASH_DOT_DECL

/* bf16dot read mode of bf16 weights (kernels/cpu/ref_bf16dot.c: facts, the
 * scalar vdpbf16ps emulation and the BF16 quantizer; linear_bf16dot_avx512_bf16.c) */
#define K_BF16DOT_DECL(sfx)                                                                       \
    void k_matvec_bf16dot_##sfx(const void *wp, const void *x, float *y, size_t rows, size_t cols, \
                                int ith, int nth);                                                \
    void k_matmul_bf16dot_##sfx(const void *wp, const void *xa, float *y, size_t rows,            \
                                size_t cols, size_t n_tok, int accumulate, int ith, int nth);
K_BF16DOT_DECL(ref)
K_BF16DOT_DECL(avx512_bf16)
#undef K_BF16DOT_DECL

/* activation quantizers (the Q8 one is written for AVX2 and inherited by avx512,
 * the BF16 one is vcvtneps2bf16 at avx512_bf16) */
void k_quant_q8_ref(const float *x, void *xq, size_t n);
void k_quant_q8_avx2(const float *x, void *xq, size_t n);
void k_quant_bf16_ref(const float *x, void *xb, size_t n);
void k_quant_bf16_avx512_bf16(const float *x, void *xb, size_t n);

/* ---- helpers every level shares ---- */

/** Index of w[r][c] inside the bf16 packed layout (for tests and the references). */
static inline size_t k_packed_index(size_t r, size_t c, size_t cols)
{
    return (r / 16) * 16 * cols + ((c / 2) * 16 + r % 16) * 2 + c % 2;
}

/** Positions per attention chunk: walks cut [p0, p1) at multiples of it. */
#define K_ATTN_CHUNK 16u
/** flash_rows' pnext when no walk follows. */
#define K_ATTN_NO_NEXT UINT32_MAX

/** Element offset of (position pos, KV head kvh) in a layer's paged K or V
 * cache [n_blocks*32][8][128] bf16: physical row block_table[pos >> 5] * 32 +
 * (pos & 31) (kv_write_bf16's layout). */
static inline size_t k_kv_off(const uint32_t *block_table, uint32_t pos, uint32_t kvh)
{
    return ((size_t)block_table[pos / KIPP_KV_BLOCK] * KIPP_KV_BLOCK + pos % KIPP_KV_BLOCK) * KIPP_N_KV_HEAD *
               KIPP_HEAD_DIM +
           (size_t)kvh * KIPP_HEAD_DIM;
}

/** Positions of the aligned K_ATTN_CHUNK chunk at p, cut to p1 (p < p1). */
static inline uint32_t k_attn_chunk_len(uint32_t p, uint32_t p1)
{
    uint32_t n = K_ATTN_CHUNK - p % K_ATTN_CHUNK;
    return p1 - p < n ? p1 - p : n;
}

/** Prefetch (into L2) KV head kvh's K and V rows at positions [p0, p1) of a
 * layer's paged cache: a caller that walks page after page issues the next
 * page's first chunk while the current one computes, since a walk can only
 * prefetch inside its own range. Generic C: __builtin_prefetch. */
static inline void k_kv_prefetch(const kipp_bf16 *kc, const kipp_bf16 *vc, uint32_t kvh, const uint32_t *block_table,
                                 uint32_t p0, uint32_t p1)
{
    for (uint32_t p = p0; p < p1; p++) {
        size_t off = k_kv_off(block_table, p, kvh);
        for (size_t b = 0; b < KIPP_HEAD_DIM * sizeof(kipp_bf16); b += 64) {
            __builtin_prefetch((const char *)(kc + off) + b, 0, 2);
            __builtin_prefetch((const char *)(vc + off) + b, 0, 2);
        }
    }
}

/** A fresh flash-attention state for n query vectors: m = -inf, l = 0, acc [n][128] = 0. */
static inline void k_attn_init(size_t n, float *m, float *l, float *acc)
{
    for (size_t i = 0; i < n; i++) {
        m[i] = -__builtin_inff();
        l[i] = 0.0f;
    }
    for (size_t i = 0; i < n * KIPP_HEAD_DIM; i++) acc[i] = 0.0f;
}

/** Walks per query: one per page parity (kernels.h "Lanes"). */
#define K_ATTN_LANES 2u

/** The lane (0 or 1) that walks position pos: the parity of its 32-position page (pos >> 5). */
static inline uint32_t k_attn_lane(uint32_t pos) { return (pos / KIPP_KV_BLOCK) % K_ATTN_LANES; }

/**
 * Folds a second walk's state (m1, l1, acc1; other positions of the same n
 * query vectors) into (m, l, acc): the online-softmax merge (Milakov and
 * Gimelshein 2018; Dao et al. 2022 section 3.1), in one fixed order, so every
 * path that splits walks the same way rounds the same. m, l, m1, l1: [n] f32
 * (running max of scaled scores, sum of exp(s - m)); acc, acc1: [n][128] f32
 * unnormalized outputs. Caller-owned; the second state is only read. An empty
 * state (m = -inf) contributes exp(-inf) = 0; two empty states stay empty.
 * No error cases: any finite or empty states merge.
 */
static inline void k_attn_merge(size_t n, float *m, float *l, float *acc, const float *m1, const float *l1,
                                const float *acc1)
{
    for (size_t g = 0; g < n; g++) {
        float mx = m1[g] > m[g] ? m1[g] : m[g];
        if (mx == -__builtin_inff()) continue;
        float a = __builtin_expf(m[g] - mx), b = __builtin_expf(m1[g] - mx);
        m[g] = mx;
        l[g] = l[g] * a + l1[g] * b;
        for (size_t i = g * KIPP_HEAD_DIM; i < (g + 1) * KIPP_HEAD_DIM; i++) acc[i] = acc[i] * a + acc1[i] * b;
    }
}

/**
 * RoPE table: cs[pos][128] = cos(pos*inv[i]) for i<64 then sin(pos*inv[i]),
 * inv[i] = theta^(-2i/128), computed in double then rounded to f32 (HF computes
 * inv_freq in f32 and the angle in f32; see k_rope_table for the exact recipe).
 * cs: [n_pos][128] f32, caller-owned.
 */
void k_rope_table(float *cs, size_t n_pos, double theta);

/**
 * k_rope_table with YaRN: inv_freq blends interpolation (inv/factor) and
 * extrapolation per dimension along transformers' linear ramp between the
 * beta_fast/beta_slow correction dims (truncated: floor/ceil), and every
 * cos/sin is multiplied by 0.1 ln(factor) + 1, as HF
 * modeling_rope_utils._compute_yarn_parameters and Qwen3RotaryEmbedding do
 * (f32 throughout, like k_rope_table). y NULL or y->factor 0: exactly
 * k_rope_table. cs: [n_pos][128] f32, caller-owned.
 */
void k_rope_table_yarn(float *cs, size_t n_pos, double theta, const k_rope_yarn *y);

/** Row range [*r0, *r1) of thread ith out of nth for rows rows, in multiples of align rows. */
static inline void k_split_rows(size_t rows, int ith, int nth, size_t align, size_t *r0, size_t *r1)
{
    size_t units = (rows + align - 1) / align;
    size_t per = units / (size_t)nth, extra = units % (size_t)nth, i = (size_t)ith;
    size_t u0 = i * per + (i < extra ? i : extra), u1 = u0 + per + (i < extra ? 1 : 0);
    *r0 = u0 * align < rows ? u0 * align : rows;
    *r1 = u1 * align < rows ? u1 * align : rows;
}

#endif
