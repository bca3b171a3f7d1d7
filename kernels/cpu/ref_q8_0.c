/*
 * ref_q8_0.c - the q8_0 weight format (GGML Q8_0, GGUF type 8; seed 000
 * "Weight quantization") and the Q8 activation format (seed 002: int8 per
 * 32-block, integer dot): the format's level-independent facts (k_fmt_info),
 * its FP32 oracle over the file layout, its encoder, and the scalar
 * pack/matvec/matmul and activation quantizer every SIMD level is checked
 * against (kernels.h "weight formats", "activation formats").
 *
 * Scalar arithmetic per output: for each 32-block in column order, the exact
 * int32 dot of the weight and activation int8s, times (d_w * d_x) in FP32,
 * summed in FP32. The SIMD kernels compute the same int32 dots exactly and
 * differ only in FP32 rounding (fma, sum order).
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/kernels.h"

#define QK 32u          /* weights per block */
#define Q8_0_BYTES 34u  /* fp16 d + 32 int8 */

/* Round half away from zero (C roundf), as tools/quant_blocks.py. */
static int8_t q8_round(float v)
{
    float r = roundf(v);
    return (int8_t)(r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r);
}

/* The converter's encoder (tools/quant_blocks.py encode_q8_0): d = fp16(amax / 127),
 * q = round(w / d) against the rounded d, clamped to [-127, 127]; 0 when d is 0. */
static void q8_0_from_f32(const float *w, void *out, size_t rows, size_t cols)
{
    uint8_t *o = out;
    for (size_t r = 0; r < rows; r++)
        for (size_t b = 0; b < cols / QK; b++, o += Q8_0_BYTES) {
            const float *wb = w + r * cols + b * QK;
            float amax = 0.0f;
            for (unsigned i = 0; i < QK; i++) amax = fabsf(wb[i]) > amax ? fabsf(wb[i]) : amax;
            uint16_t h = kipp_f32_to_f16(amax / 127.0f);
            float d = kipp_f16_to_f32(h);
            memcpy(o, &h, 2);
            for (unsigned i = 0; i < QK; i++) o[2 + i] = (uint8_t)(d == 0.0f ? 0 : q8_round(wb[i] / d));
        }
}

/* x86 cvtps2dq: RNE in the default rounding mode; NaN and out-of-range give INT32_MIN. */
static int32_t cvt_i32(float v)
{
    if (!(v >= -2147483648.0f && v < 2147483648.0f)) return INT32_MIN;
    return (int32_t)nearbyintf(v);
}

void k_quant_q8_ref(const float *x, void *xqv, size_t n)
{
    k_act_q8_block *xq = xqv;
    for (size_t b = 0; b < n / QK; b++) {
        const float *xb = x + b * QK;
        float tmp[QK];
        int io = k_q8_outlier(xb);
        xq[b].io = io;
        xq[b].xo = io >= 0 ? xb[io] : 0.0f;
        if (io >= 0) {
            memcpy(tmp, xb, sizeof tmp);
            tmp[io] = 0.0f;
            xb = tmp;
        }
        uint32_t amax_bits = 0;
        for (unsigned i = 0; i < QK; i++) {
            uint32_t u;
            memcpy(&u, &xb[i], 4);
            u &= 0x7fffffffu;
            amax_bits = u > amax_bits ? u : amax_bits;
        }
        float amax;
        memcpy(&amax, &amax_bits, 4);
        float id = amax > 1e-30f && amax < INFINITY ? 127.0f / amax : 0.0f;
        int32_t sum = 0;
        for (unsigned i = 0; i < QK; i++) {
            int32_t q = cvt_i32(xb[i] * id);
            q = q > 127 ? 127 : q < -128 ? -128 : q;
            xq[b].q[i] = (int8_t)q;
            sum += q;
        }
        xq[b].d = amax / 127.0f;
        xq[b].sum = sum;
    }
}

/* The oracle: dequantize each block inside the matvec (seed 000 "The CPU
 * reference dequantizes per block inside a type-dispatched matvec"), FP32
 * activations, FP32 accumulation in column order (k_block_file_row_dot). */
static void q8_0_file_f32(const uint8_t *blk, float w[32])
{
    float d = k_f16_at(blk);
    for (unsigned i = 0; i < QK; i++) w[i] = d * (float)(int8_t)blk[2 + i];
}

/* The packed layout "q8p16" (kernels.h): the file's fp16 d of lane i at byte 2i; q of lane i, column c at
 * byte K_Q8P_Q + ((c / 4) * 16 + i) * 4 + c % 4. */
static void q8_0_pack_block(const uint8_t *blk, uint8_t *pb, unsigned lane)
{
    memcpy(pb + 2 * lane, blk, 2);
    for (unsigned c = 0; c < QK; c++) pb[K_Q8P_Q + ((c / 4) * 16 + lane) * 4 + c % 4] = blk[2 + c];
}

static void q8_0_lane_q(const uint8_t *pb, unsigned lane, int32_t q[32])
{
    for (unsigned c = 0; c < QK; c++) q[c] = (int8_t)pb[K_Q8P_Q + ((c / 4) * 16 + lane) * 4 + c % 4];
}

static void q8_0_col_q(const uint8_t *pb, unsigned c, int32_t q[16])
{
    for (unsigned i = 0; i < 16; i++) q[i] = (int8_t)pb[K_Q8P_Q + ((c / 4) * 16 + i) * 4 + c % 4];
}

static size_t q8_0_q_line(unsigned c) { return K_Q8P_Q + (c / 4) * 64; }

static const k_block_fmt q8p16 = {.file_block = Q8_0_BYTES, .panel_block = K_Q8P_BLOCK, .affine = 0,
    .file_f32 = q8_0_file_f32, .pack = q8_0_pack_block, .lane_q = q8_0_lane_q, .col_q = q8_0_col_q,
    .q_line = q8_0_q_line};

K_REF_BLOCK_KERNELS(q8_0, Q8_0, q8p16)

