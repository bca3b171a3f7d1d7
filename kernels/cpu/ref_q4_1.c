/*
 * ref_q4_1.c - the q4_1 weight format (GGML Q4_1, GGUF type 3; scheme
 * affine4_gs32 of seed 000 "Weight quantization"): its level-independent
 * facts (k_fmt_info), FP32 oracle over the file layout, encoder, and the
 * scalar pack/matvec/matmul every SIMD level is checked against (kernels.h
 * "weight formats"). Activations are Q8 (kernels/cpu/ref_q8_0.c quantizes).
 *
 * Scalar arithmetic per output: for each 32-block in column order,
 * acc += (float)dot(q_w, q_x) * (d_w * d_x), then acc += m_w * (d_x * sum(q_x)):
 * the affine weight w = d q + m against x = d_x q_x, with the int32 dot exact.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/kernels.h"

#define QK 32u
#define Q4_1_BYTES 20u /* fp16 d, fp16 m, 16 bytes of nibbles */

static size_t q4_1_packed_bytes(size_t rows, size_t cols) { return rows / 16 * (cols / QK) * K_Q4P_BLOCK; }

static float fp16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return kipp_f16_to_f32(h);
}

/* Nibble c (0..31) of a file block: byte c % 16, low half for c < 16. */
static unsigned nib(const uint8_t *blk, unsigned c)
{
    uint8_t b = blk[4 + c % 16];
    return c < 16 ? b & 15u : b >> 4;
}

/* The converter's encoder (tools/quant_blocks.py encode_q4_1): m = fp16(min),
 * d = fp16((max - m) / 15), q = round((w - m) / d) half away from zero, clamped
 * to [0, 15]; 0 when d is 0. */
static void q4_1_from_f32(const float *w, void *out, size_t rows, size_t cols)
{
    uint8_t *o = out;
    for (size_t r = 0; r < rows; r++)
        for (size_t b = 0; b < cols / QK; b++, o += Q4_1_BYTES) {
            const float *wb = w + r * cols + b * QK;
            float lo = wb[0], hi = wb[0];
            for (unsigned i = 1; i < QK; i++) {
                lo = wb[i] < lo ? wb[i] : lo;
                hi = wb[i] > hi ? wb[i] : hi;
            }
            uint16_t mh = kipp_f32_to_f16(lo);
            float m = kipp_f16_to_f32(mh);
            uint16_t dh = kipp_f32_to_f16((hi - m) / 15.0f);
            float d = kipp_f16_to_f32(dh);
            memcpy(o, &dh, 2);
            memcpy(o + 2, &mh, 2);
            uint8_t q[32];
            for (unsigned i = 0; i < QK; i++) {
                float v = d == 0.0f ? 0.0f : roundf((wb[i] - m) / d);
                q[i] = (uint8_t)(v < 0.0f ? 0.0f : v > 15.0f ? 15.0f : v);
            }
            for (unsigned j = 0; j < 16; j++) o[4 + j] = (uint8_t)(q[j] | q[j + 16] << 4);
        }
}

static void q4_1_outlier_fix(const void *wp, const void *xav, float *y, size_t rows, size_t cols, size_t n_tok,
                             int ith, int nth);

const k_fmt_info k_fmt_info_q4_1 = {.name = "q4_1", .file = &kipp_fmts[KIPP_FMT_Q4_1], .row_align = 16,
    .col_align = 32, .packed_bytes = q4_1_packed_bytes, .act = K_ACT_Q8, .linear_ref = k_linear_q4_1_ref,
    .from_f32 = q4_1_from_f32, .outlier_fix = q4_1_outlier_fix};

/* The oracle: w = d * q + m dequantized per block inside an FP32 matvec, FP32
 * activations, FP32 accumulation in column order. */
static float q4_1_file_row_dot(const void *wv, const float *x, size_t cols)
{
    const uint8_t *blk = wv;
    float acc = 0.0f;
    for (size_t b = 0; b < cols / QK; b++, blk += Q4_1_BYTES) {
        float d = fp16_at(blk), m = fp16_at(blk + 2);
        for (unsigned c = 0; c < QK; c++) acc += (d * (float)nib(blk, c) + m) * x[b * QK + c];
    }
    return acc;
}

void k_linear_q4_1_ref(const void *w, const float *x, float *y, size_t rows, size_t cols, size_t n_tok, int ith,
                       int nth)
{
    k_ref_linear(q4_1_file_row_dot, cols / QK * Q4_1_BYTES, w, x, y, rows, cols, n_tok, ith, nth);
}

static void q4_1_pack_block(const uint8_t *blk, uint8_t *pb, unsigned lane)
{
    float d = fp16_at(blk), m = fp16_at(blk + 2);
    memcpy(pb + 4 * lane, &d, 4);
    memcpy(pb + 64 + 4 * lane, &m, 4);
    for (unsigned j = 0; j < 4; j++)
        for (unsigned k = 0; k < 4; k++)
            pb[128 + (j * 16 + lane) * 4 + k] = (uint8_t)(nib(blk, 4 * j + k) | nib(blk, 4 * (j + 4) + k) << 4);
}

void k_pack_q4_1_ref(const void *w, void *wp, size_t rows, size_t cols, int ith, int nth)
{
    k_ref_pack16(q4_1_pack_block, Q4_1_BYTES, K_Q4P_BLOCK, w, wp, rows, cols, ith, nth);
}

/* q of row r, column c of block pb in the packed layout. */
static unsigned packed_q(const uint8_t *pb, size_t r, unsigned c)
{
    unsigned j = c / 4, k = c % 4;
    uint8_t b = pb[128 + ((j % 4) * 16 + r % 16) * 4 + k];
    return j < 4 ? b & 15u : b >> 4;
}

/* outlier_fix over the packed layout "q4p16": w(r, c) = d_w * q + m_w, as the oracle. */
static void q4_1_outlier_fix(const void *wp, const void *xav, float *y, size_t rows, size_t cols, size_t n_tok,
                             int ith, int nth)
{
    const size_t nb = cols / QK;
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    for (size_t t = 0; t < n_tok; t++) {
        const k_act_q8_block *xq = (const k_act_q8_block *)xav + t * nb;
        float *yt = y + t * rows;
        for (size_t b = 0; b < nb; b++) {
            if (xq[b].io < 0) continue;
            unsigned c = (unsigned)xq[b].io;
            float xo = xq[b].xo;
            for (size_t P = r0 / 16; P < r1 / 16; P++) { /* one column: two lines per panel, prefetched ahead */
                const uint8_t *pb = (const uint8_t *)wp + (P * nb + b) * K_Q4P_BLOCK;
                __builtin_prefetch(pb + K_FIX_PF * nb * K_Q4P_BLOCK);
                __builtin_prefetch(pb + K_FIX_PF * nb * K_Q4P_BLOCK + 64);
                __builtin_prefetch(pb + K_FIX_PF * nb * K_Q4P_BLOCK + 128 + (c / 4 % 4) * 64);
                for (unsigned i = 0; i < 16; i++) {
                    float dw, mw;
                    memcpy(&dw, pb + 4 * i, 4);
                    memcpy(&mw, pb + 64 + 4 * i, 4);
                    float w = dw * (float)packed_q(pb, i, c) + mw;
                    yt[16 * P + i] += w * xo;
                }
            }
        }
    }
}

static float q4_row_dot(const void *wpv, size_t r, size_t cols, const void *xv)
{
    const k_act_q8_block *xq = xv;
    const size_t nb = cols / QK;
    const uint8_t *panel = (const uint8_t *)wpv + (r / 16) * nb * K_Q4P_BLOCK;
    float acc = 0.0f;
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *pb = panel + b * K_Q4P_BLOCK;
        float dw, mw;
        memcpy(&dw, pb + 4 * (r % 16), 4);
        memcpy(&mw, pb + 64 + 4 * (r % 16), 4);
        int32_t isum = 0;
        for (unsigned c = 0; c < QK; c++) isum += (int32_t)packed_q(pb, r, c) * xq[b].q[c];
        acc += (float)isum * (dw * xq[b].d);
        acc += mw * (xq[b].d * (float)xq[b].sum);
    }
    return acc;
}

K_REF_ROW_KERNELS(q4_1, q4_row_dot, K_ACT_Q8)
