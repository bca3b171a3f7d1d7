/*
 * linear_avx512.c - BF16 matvec/matmul for AVX-512 (F/BW/VL/DQ + BF16).
 *
 * Decode (matvec_bf16, matvec_bf16p): DRAM-bound, so weights are widened to
 * FP32 in registers and FMA'd with the FP32 activations; accuracy equals the
 * reference up to summation order (NMSE ~1e-12).
 *
 * Prefill (matmul_bf16p): compute-bound, so it runs on vdpbf16ps
 * (_mm512_dpbf16_ps, 32 MACs per instruction, 2 per cycle on Zen 4/5) over the
 * packed layout [rows/16][cols/2][16][2] and BF16 activations: the microkernel
 * holds 32 rows x 12 tokens = 24 zmm accumulators, loads 2 zmm of weights per
 * k-pair and feeds each token's activation pair as a 32-bit broadcast, so there
 * is no horizontal reduction. A 32-row x 256-k weight block (16 KB) stays in L1
 * while all token tiles pass, and the row panel is the outer loop: each weight
 * byte leaves DRAM once per call. NMSE vs k_matmul_bf16p_ref ~1e-12 (same BF16
 * products, FP32 sums in another order).
 *
 * matmul_bf16 (unpacked, FP32 activations) widens weights and uses FP32 FMA:
 * exact up to order, at most the FP32 peak.
 */
#include "kernels/cpu/kernels_isa.h"
#include "kernels/cpu/vmath_avx512.h"

static inline float hsum16(__m512 v) { return _mm512_reduce_add_ps(v); }

/* ---- unpacked row-major weights ---- */

static void matvec_rows4(const kipp_bf16 *w, const float *x, float *y, size_t cols)
{
    __m512 a[4][2];
    for (int r = 0; r < 4; r++) a[r][0] = a[r][1] = _mm512_setzero_ps();
    for (size_t c = 0; c < cols; c += 32) {
        __m512 x0 = _mm512_loadu_ps(x + c), x1 = _mm512_loadu_ps(x + c + 16);
        for (int r = 0; r < 4; r++) {
            const kipp_bf16 *wr = w + (size_t)r * cols + c;
            _mm_prefetch((const char *)(wr + 512), _MM_HINT_T0);
            a[r][0] = _mm512_fmadd_ps(k_widen16(wr), x0, a[r][0]);
            a[r][1] = _mm512_fmadd_ps(k_widen16(wr + 16), x1, a[r][1]);
        }
    }
    for (int r = 0; r < 4; r++) y[r] = hsum16(_mm512_add_ps(a[r][0], a[r][1]));
}

static float dot_row(const kipp_bf16 *w, const float *x, size_t cols)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    for (size_t c = 0; c < cols; c += 32) {
        a0 = _mm512_fmadd_ps(k_widen16(w + c), _mm512_loadu_ps(x + c), a0);
        a1 = _mm512_fmadd_ps(k_widen16(w + c + 16), _mm512_loadu_ps(x + c + 16), a1);
    }
    return hsum16(_mm512_add_ps(a0, a1));
}

void k_matvec_bf16_avx512(const kipp_bf16 *w, const float *x, float *y, size_t rows, size_t cols,
                          int ith, int nth)
{
    size_t r0, r1, r;
    k_split_rows(rows, ith, nth, 4, &r0, &r1);
    for (r = r0; r + 4 <= r1; r += 4) matvec_rows4(w + r * cols, x, y + r, cols);
    for (; r < r1; r++) y[r] = dot_row(w + r * cols, x, cols);
}

/* 4 rows x 6 tokens: 24 accumulators + 6 activations + 1 weight = 31 zmm. */
static void matmul_4x6(const kipp_bf16 *w, const float *x, float *y, size_t rows, size_t cols,
                       size_t nt)
{
    __m512 a[4][6];
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < 6; t++) a[r][t] = _mm512_setzero_ps();
    for (size_t c = 0; c < cols; c += 16) {
        __m512 xv[6];
        for (size_t t = 0; t < 6; t++) xv[t] = _mm512_loadu_ps(x + (t < nt ? t : 0) * cols + c);
        for (int r = 0; r < 4; r++) {
            __m512 wv = k_widen16(w + (size_t)r * cols + c);
            for (int t = 0; t < 6; t++) a[r][t] = _mm512_fmadd_ps(wv, xv[t], a[r][t]);
        }
    }
    for (size_t t = 0; t < nt; t++)
        for (int r = 0; r < 4; r++) y[t * rows + (size_t)r] = hsum16(a[r][t]);
}

void k_matmul_bf16_avx512(const kipp_bf16 *w, const float *x, float *y, size_t rows, size_t cols,
                          size_t n_tok, int ith, int nth)
{
    size_t r0, r1, r;
    k_split_rows(rows, ith, nth, 4, &r0, &r1);
    for (r = r0; r + 4 <= r1; r += 4)
        for (size_t t = 0; t < n_tok; t += 6) {
            size_t nt = n_tok - t < 6 ? n_tok - t : 6;
            matmul_4x6(w + r * cols, x + t * cols, y + t * rows + r, rows, cols, nt);
        }
    for (; r < r1; r++)
        for (size_t t = 0; t < n_tok; t++) y[t * rows + r] = dot_row(w + r * cols, x + t * cols, cols);
}

/* ---- activation rounding ---- */

void k_cvt_bf16_avx512(const float *x, kipp_bf16 *xb, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(xb + i), k_cvt16_bf16(_mm512_loadu_ps(x + i)));
    for (; i < n; i++) xb[i] = kipp_f32_to_bf16(x[i]);
}

/* ---- packed weights ---- */

void k_matvec_bf16p_avx512(const kipp_bf16 *wp, const float *x, float *y, size_t rows,
                           size_t cols, int ith, int nth)
{
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    for (size_t r = r0; r < r1; r += 16) {
        const kipp_bf16 *p = wp + r * cols;
        __m512 a[8];
        for (int i = 0; i < 8; i++) a[i] = _mm512_setzero_ps();
        for (size_t c = 0; c < cols; c += 8, p += 128) { /* four k-pairs per step */
            /* every 64-byte line of the 256 B step (skipping lines slowed the AVX2 twin ~35%) */
            for (int q = 0; q < 4; q++) _mm_prefetch((const char *)(p + 1024 + 32 * q), _MM_HINT_T0);
            for (int h = 0; h < 4; h++) {
                __m512i v = _mm512_loadu_si512((const void *)(p + 32 * h));
                a[2 * h] = _mm512_fmadd_ps(k_even16(v), _mm512_set1_ps(x[c + 2 * (size_t)h]), a[2 * h]);
                a[2 * h + 1] =
                    _mm512_fmadd_ps(k_odd16(v), _mm512_set1_ps(x[c + 2 * (size_t)h + 1]), a[2 * h + 1]);
            }
        }
        __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])),
                                 _mm512_add_ps(_mm512_add_ps(a[4], a[5]), _mm512_add_ps(a[6], a[7])));
        _mm512_storeu_ps(y + r, s);
    }
}

/* (16 * NP) rows x T tokens over k-pairs [0, kp) with vdpbf16ps; NP in {1, 2}. */
static inline __attribute__((always_inline)) void
mk_bf16(const kipp_bf16 *p0, const kipp_bf16 *p1, const kipp_bf16 *xb, size_t ldx, size_t kp,
        float *y, size_t ldy, int T, int NP, int load)
{
    __m512 a[12][2];
#pragma GCC unroll 12
    for (int t = 0; t < T; t++)
#pragma GCC unroll 2
        for (int h = 0; h < NP; h++)
            a[t][h] = load ? _mm512_loadu_ps(y + (size_t)t * ldy + 16 * (size_t)h) : _mm512_setzero_ps();
    for (size_t k = 0; k < kp; k++) {
        __m512bh w0 = k_as_bh(_mm512_loadu_si512((const void *)(p0 + 32 * k)));
        __m512bh w1 = NP > 1 ? k_as_bh(_mm512_loadu_si512((const void *)(p1 + 32 * k))) : w0;
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) {
            int32_t pair;
            memcpy(&pair, xb + (size_t)t * ldx + 2 * k, 4);
            __m512bh xv = k_as_bh(_mm512_set1_epi32(pair));
            a[t][0] = _mm512_dpbf16_ps(a[t][0], w0, xv);
            if (NP > 1) a[t][1] = _mm512_dpbf16_ps(a[t][1], w1, xv);
        }
    }
#pragma GCC unroll 12
    for (int t = 0; t < T; t++)
#pragma GCC unroll 2
        for (int h = 0; h < NP; h++) _mm512_storeu_ps(y + (size_t)t * ldy + 16 * (size_t)h, a[t][h]);
}

#define MK_CASE(n)                                                                          \
    case n:                                                                                 \
        if (NP == 2) mk_bf16(p0, p1, xb, ldx, kp, y, ldy, n, 2, load);                      \
        else mk_bf16(p0, p1, xb, ldx, kp, y, ldy, n, 1, load);                              \
        break;

static void mk_bf16_any(const kipp_bf16 *p0, const kipp_bf16 *p1, const kipp_bf16 *xb, size_t ldx,
                        size_t kp, float *y, size_t ldy, int T, int NP, int load)
{
    switch (T) {
        MK_CASE(1) MK_CASE(2) MK_CASE(3) MK_CASE(4) MK_CASE(5) MK_CASE(6)
        MK_CASE(7) MK_CASE(8) MK_CASE(9) MK_CASE(10) MK_CASE(11)
    default:
        if (NP == 2) mk_bf16(p0, p1, xb, ldx, kp, y, ldy, 12, 2, load);
        else mk_bf16(p0, p1, xb, ldx, kp, y, ldy, 12, 1, load);
    }
}

#define KB_512 256u /* 32 rows x 256 k x 2 B = 16 KB of weights per L1 block */
#define TT_512 12

void k_matmul_bf16p_avx512(const kipp_bf16 *wp, const kipp_bf16 *xb, float *y, size_t rows,
                           size_t cols, size_t n_tok, int accumulate, int ith, int nth)
{
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    for (size_t r = r0; r < r1; r += 32) {
        int NP = r + 32 <= r1 ? 2 : 1;
        const kipp_bf16 *p0 = wp + r * cols, *p1 = wp + (r + 16) * cols;
        for (size_t k0 = 0; k0 < cols; k0 += KB_512) {
            size_t kn = cols - k0 < KB_512 ? cols - k0 : KB_512;
            int load = accumulate || k0 > 0;
            for (size_t t = 0; t < n_tok; t += TT_512) {
                int T = (int)(n_tok - t < TT_512 ? n_tok - t : TT_512);
                mk_bf16_any(p0 + k0 * 16, NP == 2 ? p1 + k0 * 16 : p0, xb + t * cols + k0, cols,
                            kn / 2, y + t * rows + r, rows, T, NP, load);
            }
        }
    }
}
