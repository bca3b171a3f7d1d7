/*
 * ref_kvq8.c - scalar reference kernels of the q8_0 KV cache (kernels.h
 * "q8_0 KV cache"): the quantizing KV write (ggml's quantize_row_q8_0_ref
 * per 32 values) and the flash-attention walks over the dequantized rows,
 * k_flash_gqa_bf16_ref's arithmetic with another read.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/kernels.h"

/* Quantize 32 values x into q and the fp16 scale at d (ggml q8_0). */
static void quant32(const float *x, int8_t *q, uint8_t *d)
{
    float amax = 0.0f;
    for (int i = 0; i < 32; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    float s = amax / 127.0f, id = s != 0.0f ? 1.0f / s : 0.0f;
    for (int i = 0; i < 32; i++) {
        float v = x[i] * id;
        v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
        q[i] = v == v ? (int8_t)roundf(v) : 0; /* NaN stores 0 */
    }
    uint16_t h = kipp_f32_to_f16(s);
    memcpy(d, &h, 2);
}

/* One row of K or V ([8][128] f32) into the q8_0 row at r. */
static void quant_row(const float *x, uint8_t *r)
{
    for (size_t b = 0; b < K_KVQ8_Q / 32; b++) quant32(x + 32 * b, (int8_t *)r + 32 * b, r + K_KVQ8_Q + 2 * b);
}

void k_kv_write_q8_0_ref(uint8_t *kc, uint8_t *vc, const uint32_t *block_table, uint32_t pos, const float *k,
                         const float *v)
{
    size_t off = k_kvq8_off(block_table, pos);
    quant_row(k, kc + off);
    quant_row(v, vc + off);
}

/* KV head kvh's 128 values of the q8_0 row at r, dequantized. */
static void dequant_head(const uint8_t *r, uint32_t kvh, float *out)
{
    const int8_t *q = (const int8_t *)r + (size_t)kvh * KIPP_HEAD_DIM;
    const uint8_t *d = r + K_KVQ8_Q + (size_t)kvh * (KIPP_HEAD_DIM / 32) * 2;
    for (size_t i = 0; i < KIPP_HEAD_DIM; i++) out[i] = k_f16_at(d + 2 * (i / 32)) * (float)q[i];
}

void k_flash_gqa_q8_0_ref(const float *q, size_t group, const uint8_t *kc, const uint8_t *vc, uint32_t kvh,
                          const uint32_t *block_table, uint32_t p0, uint32_t p1, float scale, float *m, float *l,
                          float *acc)
{
    float kr[KIPP_HEAD_DIM], vr[KIPP_HEAD_DIM];
    for (size_t g = 0; g < group; g++) {
        const float *qg = q + g * KIPP_HEAD_DIM;
        float mg = m[g], lg = l[g], *ag = acc + g * KIPP_HEAD_DIM; /* continue the state */
        for (uint32_t p = p0; p < p1; p++) {
            size_t off = k_kvq8_off(block_table, p);
            dequant_head(kc + off, kvh, kr);
            dequant_head(vc + off, kvh, vr);
            float s = 0.0f;
            for (size_t i = 0; i < KIPP_HEAD_DIM; i++) s += qg[i] * kr[i];
            s *= scale;
            float m_new = s > mg ? s : mg, corr = expf(mg - m_new), e = expf(s - m_new);
            lg = lg * corr + e;
            for (size_t i = 0; i < KIPP_HEAD_DIM; i++) ag[i] = ag[i] * corr + e * vr[i];
            mg = m_new;
        }
        m[g] = mg;
        l[g] = lg;
    }
}

/* By definition: k_flash_gqa_q8_0_ref once per KV head (pnext unused). */
void k_flash_rows_q8_0_ref(const float *q, size_t group, const uint8_t *kc, const uint8_t *vc,
                           const uint32_t *block_table, uint32_t kvh0, uint32_t kvh1, uint32_t p0, uint32_t p1,
                           uint32_t pnext, float scale, float *m, float *l, float *acc)
{
    (void)pnext;
    for (uint32_t h = kvh0; h < kvh1; h++)
        k_flash_gqa_q8_0_ref(q + h * group * KIPP_HEAD_DIM, group, kc, vc, h, block_table, p0, p1, scale,
                             m + h * group, l + h * group, acc + h * group * KIPP_HEAD_DIM);
}
