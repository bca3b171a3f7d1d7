/*
 * linear_avx2.c - BF16 matvec/matmul for AVX2 + FMA (kernels.h). AVX2 has no
 * BF16 dot, so weights are widened to FP32 in registers (a BF16 is the top
 * half of an FP32: a 16-bit shift or a mask) and multiplied with FMA.
 *
 * Accuracy vs the *_ref kernels: the same products in FP32, summed in a
 * different order (8-16 lane partial sums, then a tree), so the difference is
 * FP32 rounding only: NMSE ~1e-12 for cols <= 10k (see tests/test_kernels.c).
 */
#include <immintrin.h>

#include <string.h>

#include "kernels/cpu/kernels_isa.h"
#include "kernels/cpu/vmath_avx2.h"

static inline __m256 widen8(const kipp_bf16 *p) { return k_widen8(p); }

/* Lane j of a 32-bit load of packed pairs holds (w[2j] low, w[2j+1] high):
 * the even element is the low half shifted up, the odd one the high half. */
static inline __m256 even_bf16(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
static inline __m256 odd_bf16(__m256i v)
{
    return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
}

/* odd_bf16 by two shifts, for kernels with no register left for the mask. */
static inline __m256 odd_shift(__m256i v)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(v, 16), 16));
}

static inline float hsum8(__m256 v) { return k_hsum8(v); }

/* ---- unpacked row-major weights ---- */

/* Four rows against one x, two accumulator chains per row (8 in flight hide
 * the FMA latency; the loop is DRAM-bound anyway). */
static void matvec_rows4(const kipp_bf16 *w, const float *x, float *y, size_t cols)
{
    __m256 a[4][2];
    for (int r = 0; r < 4; r++) a[r][0] = a[r][1] = _mm256_setzero_ps();
    for (size_t c = 0; c < cols; c += 16) {
        __m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(x + c + 8);
        for (int r = 0; r < 4; r++) {
            const kipp_bf16 *wr = w + (size_t)r * cols + c;
            _mm_prefetch((const char *)(wr + 512), _MM_HINT_T0);
            a[r][0] = _mm256_fmadd_ps(widen8(wr), x0, a[r][0]);
            a[r][1] = _mm256_fmadd_ps(widen8(wr + 8), x1, a[r][1]);
        }
    }
    for (int r = 0; r < 4; r++) y[r] = hsum8(_mm256_add_ps(a[r][0], a[r][1]));
}

static float dot_row(const kipp_bf16 *w, const float *x, size_t cols)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (size_t c = 0; c < cols; c += 16) {
        a0 = _mm256_fmadd_ps(widen8(w + c), _mm256_loadu_ps(x + c), a0);
        a1 = _mm256_fmadd_ps(widen8(w + c + 8), _mm256_loadu_ps(x + c + 8), a1);
    }
    return hsum8(_mm256_add_ps(a0, a1));
}

void k_matvec_bf16_avx2(const kipp_bf16 *w, const float *x, float *y, size_t rows, size_t cols,
                        int ith, int nth)
{
    size_t r0, r1, r;
    k_split_rows(rows, ith, nth, 4, &r0, &r1);
    for (r = r0; r + 4 <= r1; r += 4) matvec_rows4(w + r * cols, x, y + r, cols);
    for (; r < r1; r++) y[r] = dot_row(w + r * cols, x, cols);
}

/* 4 rows x 3 tokens: 12 accumulators + 3 x + 1 widened weight = 16 ymm. */
static void matmul_4x3(const kipp_bf16 *w, const float *x, float *y, size_t rows, size_t cols,
                       size_t nt)
{
    __m256 a[4][3];
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < 3; t++) a[r][t] = _mm256_setzero_ps();
    for (size_t c = 0; c < cols; c += 8) {
        __m256 xv[3];
        for (size_t t = 0; t < 3; t++) xv[t] = _mm256_loadu_ps(x + (t < nt ? t : 0) * cols + c);
        for (int r = 0; r < 4; r++) {
            __m256 wv = widen8(w + (size_t)r * cols + c);
            for (int t = 0; t < 3; t++) a[r][t] = _mm256_fmadd_ps(wv, xv[t], a[r][t]);
        }
    }
    for (size_t t = 0; t < nt; t++)
        for (int r = 0; r < 4; r++) y[t * rows + (size_t)r] = hsum8(a[r][t]);
}

/* Rows in blocks of 4 are the outer loop, so a block (<= 80 KB at cols 9728)
 * stays in L1/L2 while all tokens pass: each weight byte leaves DRAM once. */
void k_matmul_bf16_avx2(const kipp_bf16 *w, const float *x, float *y, size_t rows, size_t cols,
                        size_t n_tok, int ith, int nth)
{
    size_t r0, r1, r;
    k_split_rows(rows, ith, nth, 4, &r0, &r1);
    for (r = r0; r + 4 <= r1; r += 4)
        for (size_t t = 0; t < n_tok; t += 3) {
            size_t nt = n_tok - t < 3 ? n_tok - t : 3;
            matmul_4x3(w + r * cols, x + t * cols, y + t * rows + r, rows, cols, nt);
        }
    for (; r < r1; r++)
        for (size_t t = 0; t < n_tok; t++) y[t * rows + r] = dot_row(w + r * cols, x + t * cols, cols);
}

/* ---- activation rounding ---- */

void k_cvt_bf16_avx2(const float *x, kipp_bf16 *xb, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm_storeu_si128((__m128i *)(xb + i), k_cvt8_bf16(_mm256_loadu_ps(x + i)));
    for (; i < n; i++) xb[i] = kipp_f32_to_bf16(x[i]);
}

/* ---- packed weights ([rows/16][cols/2][16][2]) ---- */

/* Prefetch distance of the packed matvec, in bf16 elements (2 KB ahead: about
 * DRAM latency x one core's bandwidth). Every 64-byte line gets its own
 * prefetch: touching only every other line (the old one-per-128-bytes loop)
 * measured ~9.5 GB/s on one Zen core against ~15.5 with every line and 17.5
 * for a bare read stream (bench_matvec, results in the commit message). */
#define MV_PF_AVX2 1024u

void k_matvec_bf16p_avx2(const kipp_bf16 *wp, const float *x, float *y, size_t rows, size_t cols,
                         int ith, int nth)
{
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    const kipp_bf16 *p = wp + r0 * cols; /* this thread's panels are one contiguous stream */
    for (size_t r = r0; r < r1; r += 16) {
        __m256 a[8];
        for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
        for (size_t c = 0; c < cols; c += 16, p += 256) { /* eight k-pairs = 512 B per step */
            for (int q = 0; q < 8; q++) _mm_prefetch((const char *)(p + MV_PF_AVX2 + 32 * q), _MM_HINT_T0);
#pragma GCC unroll 8
            for (int h = 0; h < 8; h++) {
                __m256 xe = _mm256_broadcast_ss(x + c + 2 * (size_t)h);
                __m256 xo = _mm256_broadcast_ss(x + c + 2 * (size_t)h + 1);
                __m256i lo = _mm256_loadu_si256((const __m256i *)(p + 32 * h));
                __m256i hi = _mm256_loadu_si256((const __m256i *)(p + 32 * h + 16));
                int s = (h & 1) * 4; /* two sets of four chains: 8 FMAs in flight */
                a[s + 0] = _mm256_fmadd_ps(even_bf16(lo), xe, a[s + 0]);
                a[s + 1] = _mm256_fmadd_ps(odd_bf16(lo), xo, a[s + 1]);
                a[s + 2] = _mm256_fmadd_ps(even_bf16(hi), xe, a[s + 2]);
                a[s + 3] = _mm256_fmadd_ps(odd_bf16(hi), xo, a[s + 3]);
            }
        }
        __m256 ylo = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[4], a[5]));
        __m256 yhi = _mm256_add_ps(_mm256_add_ps(a[2], a[3]), _mm256_add_ps(a[6], a[7]));
        _mm256_storeu_ps(y + r, ylo);
        _mm256_storeu_ps(y + r + 8, yhi);
    }
}

/* 16 rows x T tokens over k-pairs [0, kp), activations already widened to
 * FP32 (xf: [T][ldx] f32). AVX2 has no BF16 dot, so the cost to beat is the
 * integer widening: each weight vector is widened once (one shift or one and
 * per 8 lanes) and reused by T <= 6 tokens, and each activation is a plain
 * vbroadcastss load. Per k-pair the even half runs first, then the odd half,
 * so the live set is 12 accumulators + 2 weights + 1 broadcast (+ the mask):
 * 24 FMAs against 2 weight loads, 4 integer ops and 12 broadcast loads. */
static inline __attribute__((always_inline)) void
mk_16xT(const kipp_bf16 *p, const float *xf, size_t ldx, size_t kp, float *y, size_t ldy, int T,
        int load)
{
    __m256 a[6][2];
#pragma GCC unroll 6
    for (int t = 0; t < T; t++) {
        a[t][0] = load ? _mm256_loadu_ps(y + (size_t)t * ldy) : _mm256_setzero_ps();
        a[t][1] = load ? _mm256_loadu_ps(y + (size_t)t * ldy + 8) : _mm256_setzero_ps();
    }
    for (size_t k = 0; k < kp; k++, p += 32) {
        __m256i lo = _mm256_loadu_si256((const __m256i *)p);
        __m256i hi = _mm256_loadu_si256((const __m256i *)(p + 16));
        __m256 w0 = even_bf16(lo), w1 = even_bf16(hi);
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            __m256 xe = _mm256_broadcast_ss(xf + (size_t)t * ldx + 2 * k);
            a[t][0] = _mm256_fmadd_ps(w0, xe, a[t][0]);
            a[t][1] = _mm256_fmadd_ps(w1, xe, a[t][1]);
        }
        w0 = odd_shift(lo); /* no mask register: all 16 ymm are taken */
        w1 = odd_shift(hi);
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            __m256 xo = _mm256_broadcast_ss(xf + (size_t)t * ldx + 2 * k + 1);
            a[t][0] = _mm256_fmadd_ps(w0, xo, a[t][0]);
            a[t][1] = _mm256_fmadd_ps(w1, xo, a[t][1]);
        }
    }
#pragma GCC unroll 6
    for (int t = 0; t < T; t++) {
        _mm256_storeu_ps(y + (size_t)t * ldy, a[t][0]);
        _mm256_storeu_ps(y + (size_t)t * ldy + 8, a[t][1]);
    }
}

static void mk_16xT_any(const kipp_bf16 *p, const float *xf, size_t ldx, size_t kp, float *y,
                        size_t ldy, int T, int load)
{
    switch (T) {
    case 1: mk_16xT(p, xf, ldx, kp, y, ldy, 1, load); break;
    case 2: mk_16xT(p, xf, ldx, kp, y, ldy, 2, load); break;
    case 3: mk_16xT(p, xf, ldx, kp, y, ldy, 3, load); break;
    case 4: mk_16xT(p, xf, ldx, kp, y, ldy, 4, load); break;
    case 5: mk_16xT(p, xf, ldx, kp, y, ldy, 5, load); break;
    default: mk_16xT(p, xf, ldx, kp, y, ldy, 6, load); break;
    }
}

#define KB_AVX2 128u /* k per block: 4 panels x 16 rows x 128 k x 2 B = 16 KB of weights in L1 */
#define TT_AVX2 6    /* tokens per micro-tile */
#define NP_AVX2 4    /* panels sharing one widened activation tile */

/* Widen T token rows of xb[.][k0, k0 + kn) into xf[T][KB_AVX2] f32 (exact). */
static void widen_tile(const kipp_bf16 *xb, size_t ldx, size_t kn, int T, float *xf)
{
    for (int t = 0; t < T; t++)
        for (size_t c = 0; c < kn; c += 8) {
            __m128i h = _mm_loadu_si128((const __m128i *)(xb + (size_t)t * ldx + c));
            __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
            _mm256_storeu_ps(xf + (size_t)t * KB_AVX2 + c, _mm256_castsi256_ps(w));
        }
}

/* Loop order: group of NP_AVX2 16-row panels (outer, from DRAM once), k-block
 * (their 16 KB stays in L1), token tile (activations widened once per group,
 * about 3% of the FMA work). */
void k_matmul_bf16p_avx2(const kipp_bf16 *wp, const kipp_bf16 *xb, float *y, size_t rows,
                         size_t cols, size_t n_tok, int accumulate, int ith, int nth)
{
    size_t r0, r1;
    float xf[TT_AVX2 * KB_AVX2] __attribute__((aligned(32)));
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    for (size_t rg = r0; rg < r1; rg += 16 * NP_AVX2) {
        size_t np = (r1 - rg) / 16 < NP_AVX2 ? (r1 - rg) / 16 : NP_AVX2;
        for (size_t k0 = 0; k0 < cols; k0 += KB_AVX2) {
            size_t kn = cols - k0 < KB_AVX2 ? cols - k0 : KB_AVX2;
            int load = accumulate || k0 > 0;
            for (size_t t = 0; t < n_tok; t += TT_AVX2) {
                int T = (int)(n_tok - t < TT_AVX2 ? n_tok - t : TT_AVX2);
                widen_tile(xb + t * cols + k0, cols, kn, T, xf);
                for (size_t g = 0; g < np; g++) {
                    size_t r = rg + 16 * g;
                    mk_16xT_any(wp + r * cols + k0 * 16, xf, KB_AVX2, kn / 2, y + t * rows + r,
                                rows, T, load);
                }
            }
        }
    }
}
