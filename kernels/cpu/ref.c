/*
 * ref.c - scalar reference kernels: the readable oracle every SIMD variant is
 * checked against (ggml "arch fallback" style). Plain loops, FP32
 * accumulation in index order, no threads of their own. The format kernels
 * (pack, matvec, matmul and the file-layout oracle) live in ref_<fmt>.c.
 */
#include <math.h>

#include "kernels/cpu/kernels.h"

#define K_PI 3.14159265358979323846

void k_rmsnorm_f32_ref(const float *x, const kipp_bf16 *w, float *y, size_t n_rows, size_t n,
                       float eps)
{
    for (size_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        float ss = 0.0f;
        for (size_t i = 0; i < n; i++) ss += xr[i] * xr[i];
        float inv = 1.0f / sqrtf(ss / (float)n + eps);
        for (size_t i = 0; i < n; i++) yr[i] = xr[i] * inv * kipp_bf16_to_f32(w[i]);
    }
}

void k_rope_f32_ref(float *x, size_t n_head, const float *cs)
{
    const size_t half = KIPP_HEAD_DIM / 2;
    for (size_t h = 0; h < n_head; h++) {
        float *xh = x + h * KIPP_HEAD_DIM;
        for (size_t i = 0; i < half; i++) {
            float c = cs[i], s = cs[half + i], a = xh[i], b = xh[i + half];
            xh[i] = a * c - b * s;
            xh[i + half] = b * c + a * s;
        }
    }
}

void k_swiglu_f32_ref(const float *gate, const float *up, float *out, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

void k_add_f32_ref(float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

void k_embed_bf16_ref(const kipp_bf16 *table, uint32_t token, float *out, size_t d)
{
    const kipp_bf16 *row = table + (size_t)token * d;
    for (size_t c = 0; c < d; c++) out[c] = kipp_bf16_to_f32(row[c]);
}

void k_kv_write_bf16_ref(kipp_bf16 *kc, kipp_bf16 *vc, const uint32_t *block_table, uint32_t pos,
                         const float *k, const float *v)
{
    size_t off = k_kv_off(block_table, pos, 0);
    for (size_t i = 0; i < KIPP_N_KV_HEAD * KIPP_HEAD_DIM; i++) {
        kc[off + i] = kipp_f32_to_bf16(k[i]);
        vc[off + i] = kipp_f32_to_bf16(v[i]);
    }
}

void k_flash_gqa_bf16_ref(const float *q, size_t group, const kipp_bf16 *kc, const kipp_bf16 *vc,
                          uint32_t kvh, const uint32_t *block_table, uint32_t p0, uint32_t p1,
                          float scale, float *m, float *l, float *acc)
{
    for (size_t g = 0; g < group; g++) {
        const float *qg = q + g * KIPP_HEAD_DIM;
        float mg = m[g], lg = l[g], *ag = acc + g * KIPP_HEAD_DIM; /* continue the state */
        for (uint32_t p = p0; p < p1; p++) {
            size_t off = k_kv_off(block_table, p, kvh);
            float s = 0.0f;
            for (size_t i = 0; i < KIPP_HEAD_DIM; i++) s += qg[i] * kipp_bf16_to_f32(kc[off + i]);
            s *= scale;
            float m_new = s > mg ? s : mg, corr = expf(mg - m_new), e = expf(s - m_new);
            lg = lg * corr + e;
            for (size_t i = 0; i < KIPP_HEAD_DIM; i++)
                ag[i] = ag[i] * corr + e * kipp_bf16_to_f32(vc[off + i]);
            mg = m_new;
        }
        m[g] = mg;
        l[g] = lg;
    }
}

/* By definition: k_flash_gqa_bf16_ref once per KV head (no prefetch: pnext unused). */
void k_flash_rows_bf16_ref(const float *q, size_t group, const kipp_bf16 *kc, const kipp_bf16 *vc,
                           const uint32_t *block_table, uint32_t kvh0, uint32_t kvh1, uint32_t p0,
                           uint32_t p1, uint32_t pnext, float scale, float *m, float *l, float *acc)
{
    (void)pnext;
    for (uint32_t h = kvh0; h < kvh1; h++)
        k_flash_gqa_bf16_ref(q + h * group * KIPP_HEAD_DIM, group, kc, vc, h, block_table, p0, p1,
                             scale, m + h * group, l + h * group, acc + h * group * KIPP_HEAD_DIM);
}

/* Recipe of HF Qwen3RotaryEmbedding in FP32: inv_freq = 1 / theta^(2i/128)
 * (f32), angle = f32(pos) * inv_freq rounded to f32, cos/sin of that angle. */
void k_rope_table(float *cs, size_t n_pos, double theta)
{
    const size_t half = KIPP_HEAD_DIM / 2;
    float inv[KIPP_HEAD_DIM / 2];
    for (size_t i = 0; i < half; i++) {
        float p = powf((float)theta, (float)(2 * i) / (float)KIPP_HEAD_DIM);
        inv[i] = 1.0f / p;
    }
    for (size_t pos = 0; pos < n_pos; pos++) {
        float *row = cs + pos * KIPP_HEAD_DIM;
        for (size_t i = 0; i < half; i++) {
            float ang = (float)pos * inv[i];
            row[i] = (float)cos((double)ang);
            row[half + i] = (float)sin((double)ang);
        }
    }
}

/* find_correction_dim of transformers' _compute_yarn_parameters: the dimension index
 * (of 128) whose wavelength fits n_rot rotations into orig positions; in double, as Python. */
static double yarn_correction_dim(double n_rot, double theta, double orig)
{
    return (double)KIPP_HEAD_DIM * log(orig / (n_rot * 2.0 * K_PI)) / (2.0 * log(theta));
}

/* YaRN inv_freq, transformers' _compute_yarn_parameters step by step (truncate = True, the
 * default Qwen3 configs keep): pos_freqs = theta^(2i/128) in f32, extrapolation 1/pos_freqs,
 * interpolation 1/(factor*pos_freqs), blended by 1 - ramp(i) where the ramp rises from 0 at
 * floor(dim(beta_fast)) to 1 at ceil(dim(beta_slow)), both clamped to [0, 127]. */
static void yarn_inv_freq(float *inv, double theta, const k_rope_yarn *y)
{
    double lo_d = floor(yarn_correction_dim(y->beta_fast, theta, (double)y->original_context));
    double hi_d = ceil(yarn_correction_dim(y->beta_slow, theta, (double)y->original_context));
    double lo = lo_d > 0.0 ? lo_d : 0.0, hi = hi_d < KIPP_HEAD_DIM - 1.0 ? hi_d : KIPP_HEAD_DIM - 1.0;
    if (lo == hi) hi += 0.001; /* transformers: "Prevent singularity" */
    float span = (float)(hi - lo), factor = (float)y->factor;
    for (size_t i = 0; i < KIPP_HEAD_DIM / 2; i++) {
        float pf = powf((float)theta, (float)(2 * i) / (float)KIPP_HEAD_DIM);
        float extra = 1.0f / pf, inter = 1.0f / (factor * pf);
        float ramp = ((float)i - (float)lo) / span;
        ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
        float ef = 1.0f - ramp;
        inv[i] = inter * (1.0f - ef) + extra * ef;
    }
}

void k_rope_table_yarn(float *cs, size_t n_pos, double theta, const k_rope_yarn *y)
{
    if (!y || y->factor <= 0.0) {
        k_rope_table(cs, n_pos, theta);
        return;
    }
    const size_t half = KIPP_HEAD_DIM / 2;
    float inv[KIPP_HEAD_DIM / 2];
    yarn_inv_freq(inv, theta, y);
    /* get_mscale(factor) = 0.1 ln(factor) + 1 (1 at factor <= 1): Qwen3RotaryEmbedding
     * multiplies cos and sin by it in f32, so q.k scales by its square. */
    float ms = y->factor <= 1.0 ? 1.0f : (float)(0.1 * log(y->factor) + 1.0);
    for (size_t pos = 0; pos < n_pos; pos++) {
        float *row = cs + pos * KIPP_HEAD_DIM;
        for (size_t i = 0; i < half; i++) {
            float ang = (float)pos * inv[i];
            row[i] = (float)cos((double)ang) * ms;
            row[half + i] = (float)sin((double)ang) * ms;
        }
    }
}
