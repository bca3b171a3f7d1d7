/*
 * test_kernels.c - every CPU kernel against its scalar *_ref (the oracle) on
 * fixed pseudo-random inputs at the registry's real shapes, on every ISA path
 * this CPU runs (k_cpu_ops_get for ref, avx2, avx512). Built a second time with
 * KIPP_TEST_AVX512_EMU (make: build/bin/test_kernels_avx512emu), where the
 * AVX-512 sources are compiled against SIMDe, so the AVX-512 path is checked
 * on CPUs that lack it too.
 *
 * NMSE bounds (sum (a-b)^2 / sum b^2) and why:
 *  - FP32 reductions in another order (matvec, matmul, packed, rmsnorm): each
 *    partial sum carries a relative rounding of ~2^-24 * sqrt(cols) ~ 3e-6 at
 *    cols 3072, i.e. NMSE ~1e-11; bound K_NMSE_ORDER = 1e-9 (100x margin, and a
 *    wrong index or lost tail gives NMSE >= 1e-4).
 *  - polynomial exp (swiglu, attention): ~2 ulp per exp, NMSE ~1e-13; the
 *    attention output also reorders 128-wide dots: bound K_NMSE_ORDER too.
 *  - BF16 activation rounding (packed matmul vs FP32-activation matmul): the
 *    rounding of x is uniform in +-2^-9 relative, NMSE ~(2^-9)^2/3 = 1.3e-6;
 *    bound 1e-5. This documents the accuracy the backend gets from matmul_bf16p.
 *  - exact (bitwise): add, embed, kv_write, cvt_bf16, rope, pack.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/test_harness.h"
#include "kernels/cpu/kernels_isa.h"

#define K_NMSE_ORDER 1e-9
#define K_NMSE_BF16_ACT 1e-5

/* ---- deterministic inputs (splitmix64) ---- */

static uint64_t rng_state = 0x5eed5eedULL;
static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static float rng_unif(float lo, float hi) { return lo + (hi - lo) * (float)(rng_next() >> 40) / 16777216.0f; }

static float *rand_f32(size_t n, float lo, float hi)
{
    float *p = kipp_aligned_alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = rng_unif(lo, hi);
    return p;
}
static kipp_bf16 *rand_bf16(size_t n, float amp)
{
    kipp_bf16 *p = kipp_aligned_alloc(n * sizeof(kipp_bf16));
    for (size_t i = 0; i < n; i++) p[i] = kipp_f32_to_bf16(rng_unif(-amp, amp));
    return p;
}

/* ---- the paths under test ---- */

static const k_cpu_ops *paths[3];
static int n_paths;

static void collect_paths(void)
{
#ifdef KIPP_TEST_AVX512_EMU
    paths[n_paths++] = k_cpu_ops_table(KIPP_ISA_AVX512);
#else
    for (int isa = KIPP_ISA_REF; isa <= KIPP_ISA_AVX512; isa++) {
        const k_cpu_ops *ops = k_cpu_ops_get((kipp_isa)isa);
        if (strcmp(ops->isa, kipp_isa_name((kipp_isa)isa)) == 0) paths[n_paths++] = ops;
    }
#endif
    printf("paths:");
    for (int i = 0; i < n_paths; i++) printf(" %s", paths[i]->isa);
    printf("\n");
}

/* Runs a threaded kernel as nth sequential "threads" so the split is covered. */
#define FOR_THREADS(nth, call)                                                  \
    for (int ith_ = 0; ith_ < (nth); ith_++) { int ith = ith_; (void)ith; call; }

static int bits_equal(const void *a, const void *b, size_t bytes) { return memcmp(a, b, bytes) == 0; }

/* ---- linear algebra ---- */

static const size_t mv_shapes[][2] = {{1024, 1024}, {3072, 1024}, {1024, 3072}, {8192, 1024}, {1027, 1024}};

static void test_matvec(void)
{
    for (size_t s = 0; s < sizeof mv_shapes / sizeof mv_shapes[0]; s++) {
        size_t rows = mv_shapes[s][0], cols = mv_shapes[s][1];
        kipp_bf16 *w = rand_bf16(rows * cols, 0.05f);
        float *x = rand_f32(cols, -1, 1), *ref = rand_f32(rows, 0, 0), *y = rand_f32(rows, 0, 0);
        k_matvec_bf16_ref(w, x, ref, rows, cols, 0, 1);
        for (int i = 0; i < n_paths; i++) {
            memset(y, 0xff, rows * sizeof(float));
            FOR_THREADS(2, paths[i]->matvec_bf16(w, x, y, rows, cols, ith, 2));
            double e = th_nmse(y, ref, rows);
            CHECK(e <= K_NMSE_ORDER, "%s matvec %zux%zu nmse %.3g > %.1g", paths[i]->isa, rows, cols, e, K_NMSE_ORDER);
        }
        kipp_aligned_free(w); kipp_aligned_free(x); kipp_aligned_free(ref); kipp_aligned_free(y);
    }
}

/* The final head is a matvec over 151,936 rows: check a 2,048-row slice at the
 * end of a 151,936 x 1024 head whose rows are addressed with 64-bit offsets. */
static void test_matvec_head_slice(void)
{
    const size_t rows = 2048, cols = 1024;
    kipp_bf16 *w = rand_bf16(rows * cols, 0.05f);
    float *x = rand_f32(cols, -1, 1), *ref = rand_f32(rows, 0, 0), *y = rand_f32(rows, 0, 0);
    k_matvec_bf16_ref(w, x, ref, rows, cols, 0, 1);
    for (int i = 0; i < n_paths; i++) {
        /* 7 threads: uneven shares, like the head split over the pool */
        FOR_THREADS(7, paths[i]->matvec_bf16(w, x, y, rows, cols, ith, 7));
        double e = th_nmse(y, ref, rows);
        CHECK(e <= K_NMSE_ORDER, "%s head slice nmse %.3g", paths[i]->isa, e);
    }
    kipp_aligned_free(w); kipp_aligned_free(x); kipp_aligned_free(ref); kipp_aligned_free(y);
}

static const size_t mm_cases[][3] = {/* rows, cols, n_tok */
    {1024, 1024, 1}, {1024, 1024, 7}, {1024, 1024, 64}, {1024, 1024, 130},
    {3072, 1024, 13}, {1024, 3072, 13}, {1040, 1024, 5}, {1056, 1056, 15}, {512, 1024, 2}};

static void test_matmul(void)
{
    for (size_t s = 0; s < sizeof mm_cases / sizeof mm_cases[0]; s++) {
        size_t rows = mm_cases[s][0], cols = mm_cases[s][1], nt = mm_cases[s][2];
        kipp_bf16 *w = rand_bf16(rows * cols, 0.05f);
        float *x = rand_f32(nt * cols, -1, 1), *ref = rand_f32(nt * rows, 0, 0), *y = rand_f32(nt * rows, 0, 0);
        k_matmul_bf16_ref(w, x, ref, rows, cols, nt, 0, 1);
        for (int i = 0; i < n_paths; i++) {
            memset(y, 0xff, nt * rows * sizeof(float));
            FOR_THREADS(2, paths[i]->matmul_bf16(w, x, y, rows, cols, nt, ith, 2));
            double e = th_nmse(y, ref, nt * rows);
            CHECK(e <= K_NMSE_ORDER, "%s matmul %zux%zu n_tok %zu nmse %.3g", paths[i]->isa, rows, cols, nt, e);
        }
        kipp_aligned_free(w); kipp_aligned_free(x); kipp_aligned_free(ref); kipp_aligned_free(y);
    }
}

static void test_pack(void)
{
    const size_t rows = 48, cols = 96;
    kipp_bf16 *w = rand_bf16(rows * cols, 1.0f), *wp = rand_bf16(rows * cols, 0);
    for (int i = 0; i < n_paths; i++) {
        memset(wp, 0, rows * cols * 2);
        FOR_THREADS(2, paths[i]->pack_bf16(w, wp, rows, cols, ith, 2));
        int ok = 1;
        /* independent oracle: panel 16 rows, k-pairs interleaved (kernels.h) */
        for (size_t r = 0; r < rows; r++)
            for (size_t c = 0; c < cols; c++)
                ok &= wp[(r / 16) * 16 * cols + (c / 2) * 32 + (r % 16) * 2 + (c & 1)] == w[r * cols + c];
        CHECK(ok, "%s pack_bf16 layout differs from [rows/16][cols/2][16][2]", paths[i]->isa);
    }
    kipp_aligned_free(w); kipp_aligned_free(wp);
}

static void test_packed_linear(void)
{
    for (size_t s = 0; s < sizeof mm_cases / sizeof mm_cases[0]; s++) {
        size_t rows = mm_cases[s][0], cols = mm_cases[s][1], nt = mm_cases[s][2];
        kipp_bf16 *w = rand_bf16(rows * cols, 0.05f), *wp = rand_bf16(rows * cols, 0);
        float *x = rand_f32(nt * cols, -1, 1);
        kipp_bf16 *xb = rand_bf16(nt * cols, 0);
        float *ref = rand_f32(nt * rows, 0, 0), *y = rand_f32(nt * rows, 0, 0), *y0 = rand_f32(nt * rows, -1, 1);
        float *mv_ref = rand_f32(rows, 0, 0), *fp32 = rand_f32(nt * rows, 0, 0);
        k_pack_bf16_ref(w, wp, rows, cols, 0, 1);
        k_cvt_bf16_ref(x, xb, nt * cols);
        k_matmul_bf16p_ref(wp, xb, ref, rows, cols, nt, 0, 0, 1);
        k_matvec_bf16_ref(w, x, mv_ref, rows, cols, 0, 1);
        k_matmul_bf16_ref(w, x, fp32, rows, cols, nt, 0, 1);
        double ea = th_nmse(ref, fp32, nt * rows);
        CHECK(ea <= K_NMSE_BF16_ACT, "bf16 activation rounding nmse %.3g > %.1g", ea, K_NMSE_BF16_ACT);
        for (int i = 0; i < n_paths; i++) {
            const k_cpu_ops *o = paths[i];
            memset(y, 0xff, nt * rows * sizeof(float));
            FOR_THREADS(3, o->matmul_bf16p(wp, xb, y, rows, cols, nt, 0, ith, 3));
            double e = th_nmse(y, ref, nt * rows);
            CHECK(e <= K_NMSE_ORDER, "%s matmul_bf16p %zux%zu n_tok %zu nmse %.3g", o->isa, rows, cols, nt, e);
            /* accumulate = 1 adds onto y0 */
            memcpy(y, y0, nt * rows * sizeof(float));
            FOR_THREADS(2, o->matmul_bf16p(wp, xb, y, rows, cols, nt, 1, ith, 2));
            for (size_t j = 0; j < nt * rows; j++) y[j] -= y0[j];
            e = th_nmse(y, ref, nt * rows);
            CHECK(e <= K_NMSE_ORDER, "%s matmul_bf16p accumulate nmse %.3g", o->isa, e);
            memset(y, 0xff, rows * sizeof(float));
            FOR_THREADS(2, o->matvec_bf16p(wp, x, y, rows, cols, ith, 2));
            e = th_nmse(y, mv_ref, rows);
            CHECK(e <= K_NMSE_ORDER, "%s matvec_bf16p %zux%zu nmse %.3g", o->isa, rows, cols, e);
        }
        kipp_aligned_free(w); kipp_aligned_free(wp); kipp_aligned_free(x); kipp_aligned_free(xb);
        kipp_aligned_free(ref); kipp_aligned_free(y); kipp_aligned_free(y0);
        kipp_aligned_free(mv_ref); kipp_aligned_free(fp32);
    }
}

static void test_cvt_bf16(void)
{
    const size_t n = 4096 + 5;
    float *x = rand_f32(n, -3e4f, 3e4f);
    const float special[] = {0.0f, -0.0f, 1e-40f, -3e-39f, INFINITY, -INFINITY, NAN, 1.00390625f,
                             1.01171875f, 3.4e38f, -1e-45f};
    memcpy(x, special, sizeof special);
    kipp_bf16 *ref = rand_bf16(n, 0), *y = rand_bf16(n, 0);
    k_cvt_bf16_ref(x, ref, n);
    for (int i = 0; i < n_paths; i++) {
        paths[i]->cvt_bf16(x, y, n);
        CHECK(bits_equal(y, ref, n * 2), "%s cvt_bf16 is not bit-exact RNE", paths[i]->isa);
    }
    kipp_aligned_free(x); kipp_aligned_free(ref); kipp_aligned_free(y);
}

/* ---- normalisation and elementwise ---- */

static void test_rmsnorm(void)
{
    const size_t shapes[][2] = {{7, 1024}, {3, 2560}, {16, 128}, {8, 128}};
    for (size_t s = 0; s < 4; s++) {
        size_t nr = shapes[s][0], n = shapes[s][1];
        float *x = rand_f32(nr * n, -4, 4), *ref = rand_f32(nr * n, 0, 0), *y = rand_f32(nr * n, 0, 0);
        kipp_bf16 *w = rand_bf16(n, 2.0f);
        k_rmsnorm_f32_ref(x, w, ref, nr, n, 1e-6f);
        for (int i = 0; i < n_paths; i++) {
            paths[i]->rmsnorm_f32(x, w, y, nr, n, 1e-6f);
            double e = th_nmse(y, ref, nr * n);
            CHECK(e <= K_NMSE_ORDER, "%s rmsnorm %zux%zu nmse %.3g", paths[i]->isa, nr, n, e);
            memcpy(y, x, nr * n * sizeof(float)); /* in place (x == y) */
            paths[i]->rmsnorm_f32(y, w, y, nr, n, 1e-6f);
            e = th_nmse(y, ref, nr * n);
            CHECK(e <= K_NMSE_ORDER, "%s rmsnorm in place nmse %.3g", paths[i]->isa, e);
        }
        kipp_aligned_free(x); kipp_aligned_free(ref); kipp_aligned_free(y); kipp_aligned_free(w);
    }
}

/* Same separate multiply/add as the reference, so bit-exact. */
static void test_rope(void)
{
    const size_t n_head = 16, n_pos = 40000;
    float *table = kipp_aligned_alloc(KIPP_HEAD_DIM * sizeof(float));
    const size_t pos[] = {0, 1, 31, 32, 4095, n_pos - 1};
    float *x = rand_f32(n_head * KIPP_HEAD_DIM, -2, 2), *ref = rand_f32(n_head * KIPP_HEAD_DIM, 0, 0);
    float *y = rand_f32(n_head * KIPP_HEAD_DIM, 0, 0);
    for (size_t k = 0; k < sizeof pos / sizeof pos[0]; k++) {
        float *rows = kipp_aligned_alloc((pos[k] + 1) * KIPP_HEAD_DIM * sizeof(float));
        k_rope_table(rows, pos[k] + 1, 1000000.0);
        memcpy(table, rows + pos[k] * KIPP_HEAD_DIM, KIPP_HEAD_DIM * sizeof(float));
        kipp_aligned_free(rows);
        memcpy(ref, x, n_head * KIPP_HEAD_DIM * sizeof(float));
        k_rope_f32_ref(ref, n_head, table);
        for (int i = 0; i < n_paths; i++) {
            memcpy(y, x, n_head * KIPP_HEAD_DIM * sizeof(float));
            paths[i]->rope_f32(y, n_head, table);
            CHECK(bits_equal(y, ref, n_head * KIPP_HEAD_DIM * sizeof(float)), "%s rope at pos %zu not exact",
                  paths[i]->isa, pos[k]);
        }
    }
    kipp_aligned_free(table); kipp_aligned_free(x); kipp_aligned_free(ref);
    kipp_aligned_free(y);
}

static void test_swiglu(void)
{
    const size_t n = 3072 + 7;
    float *g = rand_f32(n, -20, 20), *u = rand_f32(n, -3, 3), *ref = rand_f32(n, 0, 0), *y = rand_f32(n, 0, 0);
    k_swiglu_f32_ref(g, u, ref, n);
    for (int i = 0; i < n_paths; i++) {
        paths[i]->swiglu_f32(g, u, y, n);
        double e = th_nmse(y, ref, n);
        CHECK(e <= K_NMSE_ORDER, "%s swiglu nmse %.3g", paths[i]->isa, e);
    }
    kipp_aligned_free(g); kipp_aligned_free(u); kipp_aligned_free(ref); kipp_aligned_free(y);
}

static void test_add_embed(void)
{
    const size_t n = 2560 + 3, vocab = 50;
    float *x = rand_f32(n, -5, 5), *d = rand_f32(n, -5, 5), *ref = rand_f32(n, 0, 0), *y = rand_f32(n, 0, 0);
    kipp_bf16 *table = rand_bf16(vocab * n, 3.0f);
    for (int i = 0; i < n_paths; i++) {
        memcpy(ref, x, n * sizeof(float));
        k_add_f32_ref(ref, d, n);
        memcpy(y, x, n * sizeof(float));
        paths[i]->add_f32(y, d, n);
        CHECK(bits_equal(y, ref, n * sizeof(float)), "%s add not exact", paths[i]->isa);
        k_embed_bf16_ref(table, 37, ref, n);
        paths[i]->embed_bf16(table, 37, y, n);
        CHECK(bits_equal(y, ref, n * sizeof(float)), "%s embed not exact", paths[i]->isa);
        CHECK(y[5] == kipp_bf16_to_f32(table[37 * n + 5]), "%s embed row 37 misread", paths[i]->isa);
    }
    kipp_aligned_free(x); kipp_aligned_free(d); kipp_aligned_free(ref); kipp_aligned_free(y);
    kipp_aligned_free(table);
}

/* ---- paged KV and attention ---- */

#define KV_ROW (KIPP_N_KV_HEAD * KIPP_HEAD_DIM)

static void test_kv_write(void)
{
    const uint32_t n_blocks = 4, bt[4] = {2, 0, 3, 1};
    const size_t total = (size_t)n_blocks * KIPP_KV_BLOCK * KV_ROW;
    kipp_bf16 *kr = rand_bf16(total, 0), *vr = rand_bf16(total, 0), *kc = rand_bf16(total, 0),
              *vc = rand_bf16(total, 0);
    float *k = rand_f32(KV_ROW, -8, 8), *v = rand_f32(KV_ROW, -8, 8);
    k[0] = 1e-40f; k[1] = NAN; v[2] = -INFINITY; v[3] = 1.00390625f;
    const uint32_t pos[] = {0, 31, 32, 77, 127};
    for (int i = 0; i < n_paths; i++) {
        memset(kr, 0, total * 2); memset(vr, 0, total * 2); memset(kc, 0, total * 2); memset(vc, 0, total * 2);
        for (size_t p = 0; p < sizeof pos / sizeof pos[0]; p++) {
            k_kv_write_bf16_ref(kr, vr, bt, pos[p], k, v);
            paths[i]->kv_write_bf16(kc, vc, bt, pos[p], k, v);
        }
        CHECK(bits_equal(kc, kr, total * 2) && bits_equal(vc, vr, total * 2), "%s kv_write not exact",
              paths[i]->isa);
        /* independent check of the page mapping: pos 77 -> block bt[2]=3, slot 13 */
        size_t row = ((size_t)3 * KIPP_KV_BLOCK + 13) * KV_ROW;
        CHECK(kc[row + 5] == kipp_f32_to_bf16(k[5]) && vc[row + 9] == kipp_f32_to_bf16(v[9]),
              "%s kv_write put pos 77 in the wrong page", paths[i]->isa);
    }
    kipp_aligned_free(kr); kipp_aligned_free(vr); kipp_aligned_free(kc); kipp_aligned_free(vc);
    kipp_aligned_free(k); kipp_aligned_free(v);
}

/* Normalised outputs o = acc / l for `group` heads. */
static void attn_out(size_t group, const float *l, const float *acc, float *o)
{
    for (size_t g = 0; g < group; g++)
        for (size_t i = 0; i < KIPP_HEAD_DIM; i++) o[g * KIPP_HEAD_DIM + i] = acc[g * KIPP_HEAD_DIM + i] / l[g];
}

static void check_flash(const k_cpu_ops *o, size_t group, const kipp_bf16 *kc, const kipp_bf16 *vc,
                        const uint32_t *bt, uint32_t p0, uint32_t p1, const float *q, uint32_t kvh)
{
    enum { GM = 16 };
    static float m_r[GM], l_r[GM], a_r[GM * KIPP_HEAD_DIM], m[GM], l[GM], a[GM * KIPP_HEAD_DIM];
    static float m2[GM], l2[GM], a2[GM * KIPP_HEAD_DIM], o_r[GM * KIPP_HEAD_DIM], o_t[GM * KIPP_HEAD_DIM];
    const float scale = 1.0f / sqrtf((float)KIPP_HEAD_DIM);
    k_flash_gqa_bf16_ref(q, group, kc, vc, kvh, bt, p0, p1, scale, m_r, l_r, a_r);
    attn_out(group, l_r, a_r, o_r);
    o->flash_gqa_bf16(q, group, kc, vc, kvh, bt, p0, p1, scale, m, l, a);
    attn_out(group, l, a, o_t);
    double e = th_nmse(o_t, o_r, group * KIPP_HEAD_DIM), worst = 0;
    for (size_t g = 0; g < group; g++) { /* l * e^m is the softmax denominator, whatever m is */
        double d = fabs((double)l[g] * exp((double)m[g]) / ((double)l_r[g] * exp((double)m_r[g])) - 1.0);
        worst = d > worst ? d : worst;
    }
    CHECK(e <= K_NMSE_ORDER && worst < 1e-5, "%s flash group %zu [%u,%u) kvh %u nmse %.3g denom rel %.3g",
          o->isa, group, p0, p1, kvh, e, worst);
    if (p1 - p0 < 2) return;
    /* split-K: two partials merged with k_attn_merge equal one pass */
    uint32_t mid = p0 + (p1 - p0) / 3 + 1;
    o->flash_gqa_bf16(q, group, kc, vc, kvh, bt, p0, mid, scale, m, l, a);
    o->flash_gqa_bf16(q, group, kc, vc, kvh, bt, mid, p1, scale, m2, l2, a2);
    k_attn_merge(group, m, l, a, m2, l2, a2);
    attn_out(group, l, a, o_t);
    e = th_nmse(o_t, o_r, group * KIPP_HEAD_DIM);
    CHECK(e <= K_NMSE_ORDER, "%s flash split at %u merged nmse %.3g", o->isa, mid, e);
}

static void test_flash_gqa(void)
{
    const uint32_t n_blocks = 12;
    uint32_t bt[12];
    for (uint32_t b = 0; b < n_blocks; b++) bt[b] = (b * 7 + 3) % n_blocks; /* scrambled pages */
    const size_t total = (size_t)n_blocks * KIPP_KV_BLOCK * KV_ROW;
    kipp_bf16 *kc = rand_bf16(total, 1.0f), *vc = rand_bf16(total, 1.0f);
    float *q = rand_f32(16 * KIPP_HEAD_DIM, -3, 3); /* scores spread over ~+-10: a peaked softmax */
    const size_t groups[] = {2, 4, 5, 8, 16};
    const uint32_t ranges[][2] = {{0, 1}, {0, 45}, {3, 100}, {37, 300}, {31, 33}, {0, 384}};
    for (int i = 0; i < n_paths; i++)
        for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++)
            for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++)
                check_flash(paths[i], groups[g], kc, vc, bt, ranges[r][0], ranges[r][1], q,
                            (uint32_t)(g + r) % KIPP_N_KV_HEAD);
    kipp_aligned_free(kc); kipp_aligned_free(vc); kipp_aligned_free(q);
}

/* flash_rows_bf16 (all 8 KV heads, page-major walk) equals the reference
 * flash_gqa_bf16 run per KV head, within the flash bound. */
static void test_flash_rows(void)
{
    const uint32_t n_blocks = 12;
    uint32_t bt[12];
    for (uint32_t b = 0; b < n_blocks; b++) bt[b] = (b * 5 + 7) % n_blocks; /* scrambled pages */
    const size_t total = (size_t)n_blocks * KIPP_KV_BLOCK * KV_ROW;
    kipp_bf16 *kc = rand_bf16(total, 1.0f), *vc = rand_bf16(total, 1.0f);
    float *q = rand_f32(8 * 8 * KIPP_HEAD_DIM, -3, 3);
    float *m = rand_f32(64, 0, 1), *l = rand_f32(64, 0, 1), *a = rand_f32(64 * KIPP_HEAD_DIM, 0, 1);
    float *o_r = rand_f32(64 * KIPP_HEAD_DIM, 0, 1), *o_t = rand_f32(64 * KIPP_HEAD_DIM, 0, 1);
    const float scale = 1.0f / sqrtf((float)KIPP_HEAD_DIM);
    const size_t groups[] = {2, 4, 8};
    const uint32_t ranges[][2] = {{0, 1}, {0, 45}, {3, 100}, {37, 300}, {31, 33}, {64, 96}, {0, 384}};
    for (int i = 0; i < n_paths; i++)
        for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++)
            for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++) {
                size_t G = groups[g], H = KIPP_N_KV_HEAD * G;
                uint32_t p0 = ranges[r][0], p1 = ranges[r][1];
                double worst = 0, e;
                for (uint32_t h = 0; h < KIPP_N_KV_HEAD; h++) { /* the oracle, head by head */
                    float mr[8], lr[8];
                    k_flash_gqa_bf16_ref(q + h * G * KIPP_HEAD_DIM, G, kc, vc, h, bt, p0, p1, scale, mr, lr,
                                         o_r + h * G * KIPP_HEAD_DIM);
                    for (size_t j = 0; j < G; j++) { m[h * G + j] = mr[j]; l[h * G + j] = lr[j]; }
                }
                attn_out(H, l, o_r, o_r);
                float ml_r[128];
                memcpy(ml_r, m, H * sizeof(float));
                memcpy(ml_r + 64, l, H * sizeof(float));
                paths[i]->flash_rows_bf16(q, G, kc, vc, bt, p0, p1, scale, m, l, a);
                attn_out(H, l, a, o_t);
                e = th_nmse(o_t, o_r, H * KIPP_HEAD_DIM);
                for (size_t h = 0; h < H; h++) {
                    double d = fabs((double)l[h] * exp((double)m[h]) / ((double)ml_r[64 + h] * exp((double)ml_r[h])) - 1.0);
                    worst = d > worst ? d : worst;
                }
                CHECK(e <= K_NMSE_ORDER && worst < 1e-5, "%s flash_rows group %zu [%u,%u) nmse %.3g denom rel %.3g",
                      paths[i]->isa, G, p0, p1, e, worst);
            }
    kipp_aligned_free(kc); kipp_aligned_free(vc); kipp_aligned_free(q); kipp_aligned_free(m);
    kipp_aligned_free(l); kipp_aligned_free(a); kipp_aligned_free(o_r); kipp_aligned_free(o_t);
}

/* k_cpu_ops_get never hands out a level above what the CPU runs. */
static void test_ops_cap(void)
{
    const kipp_cpu_features *f = kipp_cpu_get();
    const k_cpu_ops *o = k_cpu_ops_get(KIPP_ISA_AVX512);
    const char *want = f->avx512 && f->avx512_bf16 ? "avx512" : f->avx2 ? "avx2" : "ref";
    CHECK(strcmp(o->isa, want) == 0, "k_cpu_ops_get(avx512) gave %s, expected %s on this CPU", o->isa, want);
    CHECK(strcmp(k_cpu_ops_get(KIPP_ISA_REF)->isa, "ref") == 0, "k_cpu_ops_get(ref) is not ref");
}

int main(void)
{
    collect_paths();
    CHECK(n_paths >= 1, "no kernel path");
    RUN(test_matvec);
    RUN(test_matvec_head_slice);
    RUN(test_matmul);
    RUN(test_pack);
    RUN(test_packed_linear);
    RUN(test_cvt_bf16);
    RUN(test_rmsnorm);
    RUN(test_rope);
    RUN(test_swiglu);
    RUN(test_add_embed);
    RUN(test_kv_write);
    RUN(test_flash_gqa);
    RUN(test_flash_rows);
    RUN(test_ops_cap);
    return th_finish();
}
