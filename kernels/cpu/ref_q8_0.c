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

static size_t q8_0_packed_bytes(size_t rows, size_t cols) { return rows / 16 * (cols / QK) * K_Q8P_BLOCK; }

static float fp16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return kipp_f16_to_f32(h);
}

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

/* outlier_fix over the packed layout "q8p16": w(r, c) = d_w * q. */
static void q8_0_outlier_fix(const void *wp, const void *xav, float *y, size_t rows, size_t cols, size_t n_tok,
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
                const uint8_t *pb = (const uint8_t *)wp + (P * nb + b) * K_Q8P_BLOCK;
                __builtin_prefetch(pb + K_FIX_PF * nb * K_Q8P_BLOCK);
                __builtin_prefetch(pb + K_FIX_PF * nb * K_Q8P_BLOCK + 64 + (c / 4) * 64);
                for (unsigned i = 0; i < 16; i++) {
                    float dw;
                    memcpy(&dw, pb + 4 * i, 4);
                    float w = dw * (float)(int8_t)pb[64 + ((c / 4) * 16 + i) * 4 + c % 4];
                    yt[16 * P + i] += w * xo;
                }
            }
        }
    }
}

const k_fmt_info k_fmt_info_q8_0 = {.name = "q8_0", .file = &kipp_fmts[KIPP_FMT_Q8_0], .row_align = 16,
    .col_align = 32, .packed_bytes = q8_0_packed_bytes, .act = K_ACT_Q8, .linear_ref = k_linear_q8_0_ref,
    .from_f32 = q8_0_from_f32, .outlier_fix = q8_0_outlier_fix};

/* The oracle: dequantize each block inside the matvec (seed 000 "The CPU
 * reference dequantizes per block inside a type-dispatched matvec"), FP32
 * activations, FP32 accumulation in column order. */
static float q8_0_file_row_dot(const void *wv, const float *x, size_t cols)
{
    const uint8_t *blk = wv;
    float acc = 0.0f;
    for (size_t b = 0; b < cols / QK; b++, blk += Q8_0_BYTES) {
        float d = fp16_at(blk);
        for (unsigned i = 0; i < QK; i++) acc += d * (float)(int8_t)blk[2 + i] * x[b * QK + i];
    }
    return acc;
}

void k_linear_q8_0_ref(const void *w, const float *x, float *y, size_t rows, size_t cols, size_t n_tok, int ith,
                       int nth)
{
    k_ref_linear(q8_0_file_row_dot, cols / QK * Q8_0_BYTES, w, x, y, rows, cols, n_tok, ith, nth);
}

static void q8_0_pack_block(const uint8_t *blk, uint8_t *pb, unsigned lane)
{
    float d = fp16_at(blk);
    memcpy(pb + 4 * lane, &d, 4);
    for (unsigned c = 0; c < QK; c++) pb[64 + ((c / 4) * 16 + lane) * 4 + c % 4] = blk[2 + c];
}

void k_pack_q8_0_ref(const void *w, void *wp, size_t rows, size_t cols, int ith, int nth)
{
    k_ref_pack16(q8_0_pack_block, Q8_0_BYTES, K_Q8P_BLOCK, w, wp, rows, cols, ith, nth);
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

/* Row r of the packed layout against one activation row: sum over blocks of
 * int32 dot * (d_w * d_x). */
static float q8_row_dot(const void *wpv, size_t r, size_t cols, const void *xv)
{
    const k_act_q8_block *xq = xv;
    const size_t nb = cols / QK;
    const uint8_t *panel = (const uint8_t *)wpv + (r / 16) * nb * K_Q8P_BLOCK;
    float acc = 0.0f;
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *pb = panel + b * K_Q8P_BLOCK;
        float dw;
        memcpy(&dw, pb + 4 * (r % 16), 4);
        int32_t isum = 0;
        for (unsigned c = 0; c < QK; c++)
            isum += (int32_t)(int8_t)pb[64 + ((c / 4) * 16 + r % 16) * 4 + c % 4] * xq[b].q[c];
        acc += (float)isum * (dw * xq[b].d);
    }
    return acc;
}

K_REF_ROW_KERNELS(q8_0, q8_row_dot, K_ACT_Q8)
