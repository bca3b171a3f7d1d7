/*
 * ref_affine4.c - the affine4 weight format (GGML Q4_1, GGUF type 3; scheme
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

/* Nibble c (0..31) of a file block: byte c % 16, low half for c < 16. */
static unsigned nib(const uint8_t *blk, unsigned c)
{
    uint8_t b = blk[4 + c % 16];
    return c < 16 ? b & 15u : b >> 4;
}

/* The converter's encoder (tools/quant_blocks.py encode_affine4): m = fp16(min),
 * d = fp16((max - m) / 15), q = round((w - m) / d) half away from zero, clamped
 * to [0, 15]; 0 when d is 0. */
static void affine4_from_f32(const float *w, void *out, size_t rows, size_t cols)
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

/* The oracle: w = d * q + m dequantized per block inside an FP32 matvec, FP32
 * activations, FP32 accumulation in column order (k_block_file_row_dot). */
static void affine4_file_f32(const uint8_t *blk, float w[32])
{
    float d = k_f16_at(blk), m = k_f16_at(blk + 2);
    for (unsigned c = 0; c < QK; c++) w[c] = d * (float)nib(blk, c) + m;
}

/* The packed layout "q4p16" (kernels.h): the file's fp16 d and m, then the nibbles. */
static void affine4_pack_block(const uint8_t *blk, uint8_t *pb, unsigned lane)
{
    memcpy(pb + 2 * lane, blk, 2);
    memcpy(pb + 32 + 2 * lane, blk + 2, 2);
    for (unsigned j = 0; j < 4; j++)
        for (unsigned k = 0; k < 4; k++)
            pb[K_Q4P_Q + (j * 16 + lane) * 4 + k] = (uint8_t)(nib(blk, 4 * j + k) | nib(blk, 4 * (j + 4) + k) << 4);
}

/* q of row lane i, column c of block pb in the packed layout. */
static int32_t packed_q(const uint8_t *pb, unsigned i, unsigned c)
{
    unsigned j = c / 4, k = c % 4;
    uint8_t b = pb[K_Q4P_Q + ((j % 4) * 16 + i) * 4 + k];
    return j < 4 ? b & 15 : b >> 4;
}

static void affine4_lane_q(const uint8_t *pb, unsigned lane, int32_t q[32])
{
    for (unsigned c = 0; c < QK; c++) q[c] = packed_q(pb, lane, c);
}

static void affine4_col_q(const uint8_t *pb, unsigned c, int32_t q[16])
{
    for (unsigned i = 0; i < 16; i++) q[i] = packed_q(pb, i, c);
}

static size_t affine4_q_line(unsigned c) { return K_Q4P_Q + (c / 4 % 4) * 64; }

static const k_block_fmt q4p16 = {.file_block = Q4_1_BYTES, .panel_block = K_Q4P_BLOCK, .affine = 1,
    .file_f32 = affine4_file_f32, .pack = affine4_pack_block, .lane_q = affine4_lane_q, .col_q = affine4_col_q,
    .q_line = affine4_q_line};

K_REF_BLOCK_KERNELS(affine4, Q4_1, q4p16)

