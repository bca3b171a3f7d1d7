/*
 * elementwise_avx512.c - RMSNorm, RoPE, SwiGLU, residual add, embedding gather
 * and the paged KV write for AVX-512 (kernels.h).
 *
 * Accuracy vs *_ref: add, embed and kv_write are bit-exact (same single
 * operation per element; integer RNE for BF16). RoPE uses the same separate
 * multiply and subtract as the reference (no FMA contraction), so it is
 * bit-exact too. RMSNorm differs only in the order of the sum of squares
 * (NMSE ~1e-14); SwiGLU in the exp polynomial (~2 ulp, NMSE ~1e-13).
 */
#include <math.h>

#include "kernels/cpu/kernels_isa.h"
#include "kernels/cpu/vmath_avx512.h"

void k_rmsnorm_f32_avx512(const float *x, const kipp_bf16 *w, float *y, size_t n_rows, size_t n,
                        float eps)
{
    for (size_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
        size_t i = 0;
        for (; i + 32 <= n; i += 32) {
            __m512 a = _mm512_loadu_ps(xr + i), b = _mm512_loadu_ps(xr + i + 16);
            s0 = _mm512_fmadd_ps(a, a, s0);
            s1 = _mm512_fmadd_ps(b, b, s1);
        }
        float ss = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
        for (; i < n; i++) ss += xr[i] * xr[i];
        float inv = 1.0f / sqrtf(ss / (float)n + eps);
        __m512 vi = _mm512_set1_ps(inv);
        for (i = 0; i + 16 <= n; i += 16)
            _mm512_storeu_ps(yr + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(xr + i), vi), k_widen16(w + i)));
        for (; i < n; i++) yr[i] = xr[i] * inv * kipp_bf16_to_f32(w[i]);
    }
}

void k_rope_f32_avx512(float *x, size_t n_head, const float *cs)
{
    const size_t half = KIPP_HEAD_DIM / 2;
    for (size_t h = 0; h < n_head; h++) {
        float *xh = x + h * KIPP_HEAD_DIM;
        for (size_t i = 0; i < half; i += 16) {
            __m512 c = _mm512_loadu_ps(cs + i), s = _mm512_loadu_ps(cs + half + i);
            __m512 a = _mm512_loadu_ps(xh + i), b = _mm512_loadu_ps(xh + half + i);
            _mm512_storeu_ps(xh + i, _mm512_sub_ps(_mm512_mul_ps(a, c), _mm512_mul_ps(b, s)));
            _mm512_storeu_ps(xh + half + i, _mm512_add_ps(_mm512_mul_ps(b, c), _mm512_mul_ps(a, s)));
        }
    }
}

void k_swiglu_f32_avx512(const float *gate, const float *up, float *out, size_t n)
{
    size_t i = 0;
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; i + 16 <= n; i += 16) {
        __m512 g = _mm512_loadu_ps(gate + i);
        __m512 e = k_exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
        __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, e));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(silu, _mm512_loadu_ps(up + i)));
    }
    for (; i < n; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

void k_add_f32_avx512(float *x, const float *y, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(x + i, _mm512_add_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    for (; i < n; i++) x[i] += y[i];
}

void k_embed_bf16_avx512(const kipp_bf16 *table, uint32_t token, float *out, size_t d)
{
    const kipp_bf16 *row = table + (size_t)token * d;
    size_t c = 0;
    for (; c + 16 <= d; c += 16) _mm512_storeu_ps(out + c, k_widen16(row + c));
    for (; c < d; c++) out[c] = kipp_bf16_to_f32(row[c]);
}

void k_kv_write_bf16_avx512(kipp_bf16 *kc, kipp_bf16 *vc, const uint32_t *block_table,
                          uint32_t pos, const float *k, const float *v)
{
    size_t off = ((size_t)block_table[pos / KIPP_KV_BLOCK] * KIPP_KV_BLOCK + pos % KIPP_KV_BLOCK) *
                 KIPP_N_KV_HEAD * KIPP_HEAD_DIM;
    for (size_t i = 0; i < KIPP_N_KV_HEAD * KIPP_HEAD_DIM; i += 16) {
        _mm256_storeu_si256((__m256i *)(kc + off + i), k_cvt16_bf16(_mm512_loadu_ps(k + i)));
        _mm256_storeu_si256((__m256i *)(vc + off + i), k_cvt16_bf16(_mm512_loadu_ps(v + i)));
    }
}
