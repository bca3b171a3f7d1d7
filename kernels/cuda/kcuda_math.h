/*
 * kcuda_math.h - the pure index arithmetic and element decoding of the CUDA
 * kernel units, written once as __host__ __device__ inline helpers so that
 * the kernels (nvcc) and a host-only test (tests/test_kcuda_math.c, gcc, no
 * GPU needed) run the very same code: block-table slots, the GGUF Q8_0 and
 * Q4_1 element decode, bf16/f16 bit conversions, tile bounds and the
 * attention split. Every function is a plain function of its arguments.
 *
 * Compiled as C (gcc) or CUDA C++ (nvcc); KC_HD expands to
 * `__host__ __device__` only under nvcc.
 */
#ifndef KIPP_KCUDA_MATH_H
#define KIPP_KCUDA_MATH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define KC_HD __host__ __device__ __forceinline__
#else
#define KC_HD static inline
#endif

#define KC_HEAD_DIM 128u   /* KIPP_HEAD_DIM (kernels/qwen3_shape.h) */
#define KC_KV_BLOCK 32u    /* KIPP_KV_BLOCK: positions per KV page */
#define KC_QBLOCK 32u      /* weights per Q8_0 / Q4_1 block */
#define KC_Q8_0_BYTES 34u  /* fp16 d + 32 int8 */
#define KC_Q4_1_BYTES 20u  /* fp16 d, fp16 m, 16 bytes of nibbles */
#define KC_MATVEC_MAX_ROWS 8u /* kc_linear takes the matvec path up to this many token rows */

/* ---- bit conversions (kernels/common.h semantics, bit for bit) ---- */

typedef union {
    uint32_t u;
    float f;
} kc_bits;

/** Exact widening BF16 -> FP32 (kipp_bf16_to_f32). */
KC_HD float kc_bf16_to_f32(uint16_t h)
{
    kc_bits b;
    b.u = (uint32_t)h << 16;
    return b.f;
}

/** FP32 -> BF16, RNE, NaN stays a quiet NaN (kipp_f32_to_bf16). */
KC_HD uint16_t kc_f32_to_bf16(float f)
{
    kc_bits b;
    b.f = f;
    uint32_t u = b.u;
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/** IEEE half -> FP32, exact (kipp_f16_to_f32): subnormals are man * 2^-24. */
KC_HD float kc_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, ex = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    kc_bits b;
    if (ex == 0) {
        b.f = (float)man * 5.9604644775390625e-8f; /* exact: man < 2^10 */
        b.u |= sign;
    } else if (ex == 31) {
        b.u = sign | 0x7f800000u | (man << 13);
    } else {
        b.u = sign | ((ex + 127u - 15u) << 23) | (man << 13);
    }
    return b.f;
}

/** Little-endian u16 at byte offset off of p (any alignment of 2). */
KC_HD uint16_t kc_u16_at(const uint8_t *p, uint32_t off) { return (uint16_t)(p[off] | (uint16_t)p[off + 1] << 8); }

/* ---- GGUF block decode (kernels/cpu/ref_q8_0.c, ref_affine4.c) ---- */

/** Scale d of a Q8_0 block (34 bytes: fp16 d, int8 q[32]). */
KC_HD float kc_q8_0_d(const uint8_t *blk) { return kc_f16_to_f32(kc_u16_at(blk, 0)); }
/** q[i] of a Q8_0 block, i < 32. */
KC_HD int kc_q8_0_q(const uint8_t *blk, uint32_t i) { return (int)(int8_t)blk[2 + i]; }
/** Weight i of a Q8_0 block: d * q[i], as the oracle rounds it (d * (float)q). */
KC_HD float kc_q8_0_weight(const uint8_t *blk, uint32_t i) { return kc_q8_0_d(blk) * (float)kc_q8_0_q(blk, i); }

/** d and m of a Q4_1 block (20 bytes: fp16 d, fp16 m, 16 bytes of nibbles). */
KC_HD float kc_q4_1_d(const uint8_t *blk) { return kc_f16_to_f32(kc_u16_at(blk, 0)); }
KC_HD float kc_q4_1_m(const uint8_t *blk) { return kc_f16_to_f32(kc_u16_at(blk, 2)); }
/** Nibble q[i] (0..15) of a Q4_1 block: byte 4 + i % 16, low half for i < 16, high for i >= 16. */
KC_HD uint32_t kc_q4_1_q(const uint8_t *blk, uint32_t i)
{
    uint32_t b = blk[4 + i % 16u];
    return i < 16u ? b & 15u : b >> 4;
}
/** Weight i of a Q4_1 block: d * q[i] + m, as the oracle rounds it. */
KC_HD float kc_q4_1_weight(const uint8_t *blk, uint32_t i)
{
    return kc_q4_1_d(blk) * (float)kc_q4_1_q(blk, i) + kc_q4_1_m(blk);
}

/**
 * The kernels read a Q4_1 block's 16 nibble bytes as 4 little-endian words:
 * word k holds file bytes 4k..4k+3, so the code of column 16 h + 4 k + b
 * (h = 0 the low nibbles, columns 0..15; h = 1 the high ones, 16..31) is
 * nibble h of byte b of word k.
 */
KC_HD uint32_t kc_q4_1_word_code(uint32_t word, uint32_t h, uint32_t b) { return (word >> (8u * b + 4u * h)) & 15u; }
/** The kernels read a Q8_0 block's codes as little-endian u16 pairs: pair i holds q[2i] (e = 0) and q[2i+1] (e = 1). */
KC_HD int kc_q8_0_pair_code(uint16_t pair, uint32_t e) { return (int)(int8_t)(uint8_t)(pair >> (8u * e)); }

/** Byte offset of row r's block b in a [rows][cols] file-layout quantized matrix. */
KC_HD size_t kc_qblock_off(size_t r, size_t b, size_t cols, uint32_t block_bytes)
{
    return (r * (cols / KC_QBLOCK) + b) * block_bytes;
}

/* ---- the paged KV cache ---- */

/**
 * Physical slot of position pos of a row whose block table starts at
 * bt[bt_off]: bt[bt_off + pos / 32] * 32 + pos % 32 (kernels.h k_kv_off).
 */
KC_HD size_t kc_kv_slot(const uint32_t *bt, int32_t bt_off, uint32_t pos)
{
    return (size_t)bt[(size_t)bt_off + pos / KC_KV_BLOCK] * KC_KV_BLOCK + pos % KC_KV_BLOCK;
}

/** Element offset of (slot, KV head kvh) in a layer's cache [n_slots][n_kv_head][128]. */
KC_HD size_t kc_kv_elem(size_t slot, uint32_t n_kv_head, uint32_t kvh)
{
    return (slot * n_kv_head + kvh) * KC_HEAD_DIM;
}

/* ---- tiles and splits ---- */

/** Tile i of width tile over [0, n): [*lo, *hi), empty (lo == hi == n) past the end. */
KC_HD void kc_tile(uint32_t n, uint32_t tile, uint32_t i, uint32_t *lo, uint32_t *hi)
{
    uint64_t a = (uint64_t)i * tile, b = a + tile;
    *lo = a < n ? (uint32_t)a : n;
    *hi = b < n ? (uint32_t)b : n;
}

/** Tiles of width tile covering n. */
KC_HD uint32_t kc_n_tiles(uint32_t n, uint32_t tile) { return (n + tile - 1u) / tile; }

/** Minimum 32-position chunks per attention split (each block has 4 warps). */
#define KC_ATTN_MIN_CHUNKS 4u
/** Most splits of one row's position range. */
#define KC_ATTN_MAX_SPLIT 32u
/** Partial states the split attention may hold at once ([rows][q heads][splits]). */
#define KC_ATTN_SCRATCH_STATES 4096u

/**
 * Chunks (32-position pages) of split s out of n_split over a row attending
 * positions [0, len): [*c0, *c1), in whole pages so every chunk is one block
 * table entry. Splits take ceil(chunks / n_split) chunks each, at least
 * KC_ATTN_MIN_CHUNKS, so short contexts use few splits and the rest are
 * empty (c0 == c1). The splits partition [0, chunks) in order.
 */
KC_HD void kc_attn_split(uint32_t len, uint32_t n_split, uint32_t s, uint32_t *c0, uint32_t *c1)
{
    uint32_t chunks = (len + KC_KV_BLOCK - 1u) / KC_KV_BLOCK;
    uint32_t per = (chunks + n_split - 1u) / n_split;
    if (per < KC_ATTN_MIN_CHUNKS) per = KC_ATTN_MIN_CHUNKS;
    kc_tile(chunks, per, s, c0, c1);
}

/**
 * Splits per row for a launch of n_rows rows and n_q_head query heads: enough
 * (row, KV head, split) blocks to fill an H100/H200 (~256) when few rows
 * decode, 1 when the rows alone fill it (prefill), and never more partial
 * states than the static scratch holds.
 */
KC_HD uint32_t kc_attn_n_split(uint32_t n_rows, uint32_t n_kv_head, uint32_t n_q_head)
{
    uint32_t units = n_rows * n_kv_head, n = units >= 256u ? 1u : (256u + units - 1u) / units;
    if (n > KC_ATTN_MAX_SPLIT) n = KC_ATTN_MAX_SPLIT;
    while (n > 1u && (uint64_t)n_rows * n_q_head * n > KC_ATTN_SCRATCH_STATES) n--;
    return n;
}

/* ---- mma.sync m16n8k16 (bf16 in, f32 accumulate) fragment coordinates ----
 * PTX ISA "Matrix fragments for mma.m16n8k16": lane = 4 * group + tig.
 * A (16 x 16, row-major): element e < 8 of a lane (register e / 2, half e % 2)
 * sits at row group + 8 * ((e / 2) % 2), column 2 * tig + e % 2 + 8 * (e / 4).
 * B (16 x 8, k x n): element e < 4 at k = 2 * tig + e % 2 + 8 * (e / 2), n = group.
 * C (16 x 8, f32): element e < 4 at row group + 8 * (e / 2), column 2 * tig + e % 2. */
KC_HD void kc_mma_a_rc(uint32_t lane, uint32_t e, uint32_t *row, uint32_t *col)
{
    *row = lane / 4u + 8u * ((e / 2u) % 2u);
    *col = 2u * (lane % 4u) + e % 2u + 8u * (e / 4u);
}
KC_HD void kc_mma_b_kn(uint32_t lane, uint32_t e, uint32_t *k, uint32_t *n)
{
    *k = 2u * (lane % 4u) + e % 2u + 8u * (e / 2u);
    *n = lane / 4u;
}
KC_HD void kc_mma_c_rc(uint32_t lane, uint32_t e, uint32_t *row, uint32_t *col)
{
    *row = lane / 4u + 8u * (e / 2u);
    *col = 2u * (lane % 4u) + e % 2u;
}

/** Split x into bf16 hi + lo with x - hi - lo ~ 2^-17 |x| (the matmul's near-FP32 operand). */
KC_HD void kc_split_bf16(float x, uint16_t *hi, uint16_t *lo)
{
    *hi = kc_f32_to_bf16(x);
    *lo = kc_f32_to_bf16(x - kc_bf16_to_f32(*hi));
}

#endif
