/*
 * ref_bf16dot.c - the bf16dot read mode of bf16 weights (kernels.h "weight
 * formats"): its level-independent facts, the BF16 activation quantizer and
 * the scalar emulation of vdpbf16ps that the avx512_bf16 kernels are checked
 * against.
 *
 * vdpbf16ps (Intel SDM, VDPBF16PS), per FP32 lane i:
 *     acc += bf16(a[2i+1]) * bf16(b[2i+1]);  acc += bf16(a[2i]) * bf16(b[2i])
 * with denormal inputs read as zero and denormal results flushed to zero, RNE.
 * A product of two BF16 values is exact in FP32 (8 x 8 significand bits), so
 * each step is one rounded FP32 add, modelled below. Hardware may round the
 * pair differently (AMD documents no order), so the checks bound the SIMD
 * kernels by NMSE (ORDER), never bitwise against this file.
 */
#include <math.h>

#include "kernels/cpu/kernels.h"

/* The bf16 file format read another way (k_fmt_from_gguf returns bf16), with the
 * bf16 format's packed layout and converter (ref_bf16.c); linear_ref takes FP32
 * activations, so the matmul_f32 rows measure the rounding. */
const k_fmt_info k_fmt_info_bf16dot = {.name = "bf16dot", .file = &kipp_fmts[KIPP_FMT_BF16], .row_align = 16,
    .col_align = 32, .packed_bytes = k_bf16_bytes, .act = K_ACT_BF16, .linear_ref = k_linear_bf16_ref,
    .from_f32 = k_bf16_from_f32};

/* vcvtneps2bf16 on one value: denormal -> signed zero, NaN -> quiet NaN, else RNE. */
static kipp_bf16 cvtne_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0) return (kipp_bf16)((u >> 16) & 0x8000u);
    return kipp_f32_to_bf16(f);
}

void k_quant_bf16_ref(const float *x, void *xb, size_t n)
{
    kipp_bf16 *o = xb;
    for (size_t i = 0; i < n; i++) o[i] = cvtne_bf16(x[i]);
}

/* A BF16 operand as vdpbf16ps reads it: denormals are zero. */
static float daz(kipp_bf16 b)
{
    return (b & 0x7f80u) == 0 ? 0.0f : kipp_bf16_to_f32(b);
}

/* One rounded FP32 add with a denormal result flushed to a zero of its sign. */
static float add_ftz(float acc, float p)
{
    float s = acc + p;
    return fabsf(s) < 0x1p-126f ? copysignf(0.0f, s) : s;
}

/* One lane of one vdpbf16ps: w0, w1 and x0, x1 are the k-pair (2k, 2k+1). */
static float dot_pair(float acc, kipp_bf16 w0, kipp_bf16 w1, kipp_bf16 x0, kipp_bf16 x1)
{
    acc = add_ftz(acc, daz(w1) * daz(x1));
    return add_ftz(acc, daz(w0) * daz(x0));
}

/* Row r of the packed weights against one BF16 activation row, pair by pair in column order. */
static float row_dot(const void *wpv, size_t r, size_t cols, const void *xv)
{
    const kipp_bf16 *wp = wpv, *x = xv;
    float acc = 0.0f;
    for (size_t c = 0; c < cols; c += 2)
        acc = dot_pair(acc, wp[k_packed_index(r, c, cols)], wp[k_packed_index(r, c + 1, cols)], x[c], x[c + 1]);
    return acc;
}

K_REF_ROW_KERNELS(bf16dot, row_dot, K_ACT_BF16)

/* ---- BF16-dot attention: the scalar model of attention_avx512_bf16.c ----
 * The walk of k_flash_gqa_bf16_ref with the dot's two roundings: q rounded
 * once (vcvtneps2bf16) for the scores, and per aligned K_ATTN_CHUNK chunk the
 * softmax weights exp(s - m_chunk) rounded to BF16, l summing the rounded
 * weights. The max is taken per chunk, as the SIMD walk does, so both round
 * the same weights; the scores are summed in double (the SIMD walk's FP32
 * order differs, hence NMSE checks, ORDER). */
/* One chunk [p, p + n) for one query vector qb (BF16), continuing (m, l, acc). */
static void dot_chunk(const kipp_bf16 *qb, const kipp_bf16 *kc, const kipp_bf16 *vc, uint32_t kvh,
                      const uint32_t *bt, uint32_t p, uint32_t n, float scale, float *m, float *l, float *acc)
{
    float s[K_ATTN_CHUNK], cm = -INFINITY;
    for (uint32_t j = 0; j < n; j++) {
        const kipp_bf16 *k = kc + k_kv_off(bt, p + j, kvh);
        double d = 0;
        for (size_t i = 0; i < KIPP_HEAD_DIM; i++) d += (double)daz(qb[i]) * daz(k[i]);
        s[j] = (float)d * scale;
        cm = s[j] > cm ? s[j] : cm;
    }
    float mx = cm > *m ? cm : *m, corr = expf(*m - mx);
    *l *= corr;
    for (size_t i = 0; i < KIPP_HEAD_DIM; i++) acc[i] *= corr;
    for (uint32_t j = 0; j < n; j++) {
        float e = kipp_bf16_to_f32(cvtne_bf16(expf(s[j] - mx)));
        const kipp_bf16 *v = vc + k_kv_off(bt, p + j, kvh);
        *l += e;
        for (size_t i = 0; i < KIPP_HEAD_DIM; i++) acc[i] += e * daz(v[i]);
    }
    *m = mx;
}

void k_flash_gqa_dot_ref(const float *q, size_t group, const kipp_bf16 *kc, const kipp_bf16 *vc, uint32_t kvh,
                         const uint32_t *block_table, uint32_t p0, uint32_t p1, float scale, float *m, float *l,
                         float *acc)
{
    for (size_t g = 0; g < group; g++) {
        kipp_bf16 qb[KIPP_HEAD_DIM];
        k_quant_bf16_ref(q + g * KIPP_HEAD_DIM, qb, KIPP_HEAD_DIM);
        for (uint32_t p = p0; p < p1;) {
            uint32_t n = k_attn_chunk_len(p, p1);
            dot_chunk(qb, kc, vc, kvh, block_table, p, n, scale, &m[g], &l[g], acc + g * KIPP_HEAD_DIM);
            p += n;
        }
    }
}

/* By definition: k_flash_gqa_dot_ref once per KV head (no prefetch: pnext unused). */
void k_flash_rows_dot_ref(const float *q, size_t group, const kipp_bf16 *kc, const kipp_bf16 *vc,
                          const uint32_t *block_table, uint32_t kvh0, uint32_t kvh1, uint32_t p0, uint32_t p1,
                          uint32_t pnext, float scale, float *m, float *l, float *acc)
{
    (void)pnext;
    for (uint32_t h = kvh0; h < kvh1; h++)
        k_flash_gqa_dot_ref(q + h * group * KIPP_HEAD_DIM, group, kc, vc, h, block_table, p0, p1, scale,
                            m + h * group, l + h * group, acc + h * group * KIPP_HEAD_DIM);
}
