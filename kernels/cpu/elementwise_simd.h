/*
 * elementwise_simd.h - RMSNorm, RoPE, SwiGLU, residual add, embedding gather,
 * the paged KV write and the BF16 activation rounding, written once over the
 * vector vocabulary (simd_<level>.h) and compiled once per level by
 * elementwise_<level>.c. Semantics in kernels.h.
 *
 * Accuracy vs *_ref: add, embed, kv_write and cvt are bit-exact (one
 * operation per element; integer RNE for BF16). RoPE uses the reference's
 * separate multiply and subtract (no FMA contraction): bit-exact too. RMSNorm
 * differs only in the order of the sum of squares (NMSE ~1e-14); SwiGLU in the
 * exp polynomial (~2 ulp, NMSE ~1e-13). Widths are multiples of VF_LANES in every
 * Qwen3 shape; scalar tails keep odd widths (tests) correct.
 */
#ifndef K_SFX
#error "include kernels/cpu/simd_<level>.h first"
#endif

#include <math.h>

void K_SFX(k_rmsnorm_f32)(const float *x, const kipp_bf16 *w, float *y, size_t n_rows, size_t n, float eps)
{
    for (size_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        vf s0 = vf_zero(), s1 = vf_zero(); /* two chains cover the FMA latency */
        size_t i = 0;
        for (; i + 2 * VF_LANES <= n; i += 2 * VF_LANES) {
            vf a = vf_load(xr + i), b = vf_load(xr + i + VF_LANES);
            s0 = vf_fma(a, a, s0);
            s1 = vf_fma(b, b, s1);
        }
        float ss = vf_hsum(vf_add(s0, s1));
        for (; i < n; i++) ss += xr[i] * xr[i];
        float inv = 1.0f / sqrtf(ss / (float)n + eps);
        vf vi_ = vf_set1(inv);
        for (i = 0; i + VF_LANES <= n; i += VF_LANES) vf_store(yr + i, vf_mul(vf_mul(vf_load(xr + i), vi_), vf_widen(w + i)));
        for (; i < n; i++) yr[i] = xr[i] * inv * kipp_bf16_to_f32(w[i]);
    }
}

void K_SFX(k_rope_f32)(float *x, size_t n_head, const float *cs)
{
    const size_t half = KIPP_HEAD_DIM / 2;
    for (size_t h = 0; h < n_head; h++) {
        float *xh = x + h * KIPP_HEAD_DIM;
        for (size_t i = 0; i < half; i += VF_LANES) {
            vf c = vf_load(cs + i), s = vf_load(cs + half + i);
            vf a = vf_load(xh + i), b = vf_load(xh + half + i);
            vf_store(xh + i, vf_sub(vf_mul(a, c), vf_mul(b, s)));
            vf_store(xh + half + i, vf_add(vf_mul(b, c), vf_mul(a, s)));
        }
    }
}

void K_SFX(k_swiglu_f32)(const float *gate, const float *up, float *out, size_t n)
{
    size_t i = 0;
    const vf one = vf_set1(1.0f);
    for (; i + VF_LANES <= n; i += VF_LANES) {
        vf g = vf_load(gate + i);
        vf silu = vf_div(g, vf_add(one, vf_exp(vf_sub(vf_zero(), g))));
        vf_store(out + i, vf_mul(silu, vf_load(up + i)));
    }
    for (; i < n; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

void K_SFX(k_add_f32)(float *x, const float *y, size_t n)
{
    size_t i = 0;
    for (; i + VF_LANES <= n; i += VF_LANES) vf_store(x + i, vf_add(vf_load(x + i), vf_load(y + i)));
    for (; i < n; i++) x[i] += y[i];
}

void K_SFX(k_embed_bf16)(const kipp_bf16 *table, uint32_t token, float *out, size_t d)
{
    const kipp_bf16 *row = table + (size_t)token * d;
    size_t c = 0;
    for (; c + VF_LANES <= d; c += VF_LANES) vf_store(out + c, vf_widen(row + c));
    for (; c < d; c++) out[c] = kipp_bf16_to_f32(row[c]);
}

void K_SFX(k_kv_write_bf16)(kipp_bf16 *kc, kipp_bf16 *vc, const uint32_t *block_table, uint32_t pos,
                            const float *k, const float *v)
{
    size_t off = ((size_t)block_table[pos / KIPP_KV_BLOCK] * KIPP_KV_BLOCK + pos % KIPP_KV_BLOCK) *
                 KIPP_N_KV_HEAD * KIPP_HEAD_DIM;
    for (size_t i = 0; i < KIPP_N_KV_HEAD * KIPP_HEAD_DIM; i += VF_LANES) {
        vf_store_bf16(kc + off + i, vf_load(k + i));
        vf_store_bf16(vc + off + i, vf_load(v + i));
    }
}

