/*
 * test_cpu_backend.c - correctness gate of the fast cpu backend: against
 * the scalar reference backend ("ref", the oracle) it must
 * match within NMSE <= 1e-6 with an identical
 * argmax, for prefill and every decode step, on every ISA path this CPU has;
 * batched items must equal isolated evaluation and multi-row logits
 * per-position evaluation bitwise (row invariance), and a
 * scrambled block table must give bitwise the same logits as the identity.
 *
 * Models are random-weight Qwen3 shapes built in memory (group sizes 1, 2
 * and 4, tied and untied heads) compared with the ref backend, plus the
 * golden vectors of the converted tiny GGUF models (tests/vectors, Hugging
 * Face transformers logits) through the public API.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/kernels.h"
#include "tests/test_harness.h"
#include "engine/internal.h"
#include "engine/kv_pool.h"
#include "tests/fixture_model.h"

/* Against the scalar FP32 ref backend the fast backend differs only in FP32
 * summation order and a ~2-ulp polynomial exp (FP32 activations, no BF16
 * rounding): measured 1.8e-9 on these shapes on AVX2 and 5.7e-8 through
 * `kipp logits` on synthetic-tiny-untied (small random-head logits), bound
 * 1e-6. With the ref backend's <= 2e-9 against an FP64 oracle,
 * that keeps the fast backend far inside the CPU contract's 5e-5. Against the
 * transformers vectors (HF runs BF16 activations) the bound is 1e-4. */
#define NMSE_REF_MAX 1e-6
#define NMSE_HF_MAX 1e-4
/* The bf16dot read mode rounds a projection's input to BF16 once (relative
 * error <= 2^-8, kcheck matmul_f32 rows ~2e-6 per projection), and the error
 * compounds through the layers. KIPP_BF16_ACT=mixed (the default where the
 * CPU has a fast dot, kipp_cpu_features.bf16_dot_fast: O, Gate|Up and Down through the dot, Q|K|V on FP32):
 * bound 5e-5, the CPU contract's against an FP32 oracle (seed 000 "Golden
 * vectors"). =bf16 (all four): bound 1e-4, the cross-backend tolerance (seed
 * 000), since on the synthetic 0.6B shape it measures 8.8e-5 (cpu_backend.c). */
#define NMSE_MIXED_MAX 5e-5
#define NMSE_BF16ALL_MAX 1e-4
static double nmse_max = NMSE_REF_MAX; /* the bound check_rows applies */

static const char *const act_modes[3] = {"f32", "mixed", "bf16"};
static const double act_bounds[3] = {NMSE_REF_MAX, NMSE_MIXED_MAX, NMSE_BF16ALL_MAX};

/* The KIPP_BF16_ACT mode (index into act_modes) the cpu backend runs at the
 * KIPP_ISA now set, as cpu_backend.c decides; -1 when it would refuse it. */
static int act_mode_now(void)
{
    const char *e = getenv("KIPP_BF16_ACT");
    int native = k_fmt_native(k_cpu_ops_get(kipp_isa_select(NULL)), K_FMT_BF16DOT);
    if (!e || !*e) return native && kipp_cpu_get()->bf16_dot_fast ? 1 : 0;
    for (int a = 0; a < 3; a++)
        if (!strcmp(e, act_modes[a])) return a == 0 || native ? a : -1;
    return -1;
}

/* The cpu-vs-ref bound of the mode act_mode_now reports. */
static double ref_bound_now(void) { int a = act_mode_now(); return act_bounds[a < 0 ? 0 : a]; }

/* ---- in-memory random model ---- */

typedef struct {
    kipp_model_view v;
    kipp_qwen3_layer *layers;
    kipp_bf16 *arena;
} tmodel;

static uint64_t rng_state;
static float uni(void) /* uniform [-1, 1), 64-bit LCG (Knuth MMIX) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static kipp_tensor_view tensor(kipp_bf16 **cur, uint64_t rows, uint64_t cols, float scale, float offset)
{
    kipp_tensor_view t = {*cur, KIPP_DTYPE_BF16, rows, cols, rows * cols * 2};
    for (uint64_t i = 0; i < rows * cols; i++) (*cur)[i] = kipp_f32_to_bf16(offset + scale * uni());
    *cur += (rows * cols + 31) & ~(uint64_t)31;
    return t;
}

/* Weights scaled ~1/sqrt(fan_in) so activations stay O(1) through the layers. */
static tmodel *tmodel_build(uint32_t d_model, uint32_t n_q_head, uint32_t d_ff, uint32_t vocab, int tied, uint64_t seed)
{
    tmodel *t = calloc(1, sizeof *t);
    kipp_dims d = {d_model, 2, n_q_head, 8, 128, d_ff, vocab, 1024, 1e6f, 1e-6f, tied};
    uint64_t A = n_q_head * 128u, D = d_model, F = d_ff;
    uint64_t per_layer = 3 * D + 256 + A * D + 2048 * D + D * A + 3 * F * D + 11 * 32;
    t->arena = kipp_aligned_alloc((2 * vocab * D + D + 64 + 2 * per_layer) * 2);
    t->layers = calloc(2, sizeof *t->layers);
    rng_state = seed;
    kipp_bf16 *cur = t->arena;
    float sd = 1.7f / sqrtf((float)D), sa = 1.7f / sqrtf((float)A), sf = 1.7f / sqrtf((float)F);
    t->v.dims = d;
    t->v.checkpoint_id = "test-random";
    t->v.w.token_embd = tensor(&cur, vocab, D, 1.0f, 0.0f);
    for (uint32_t i = 0; i < 2; i++) {
        kipp_qwen3_layer *L = &t->layers[i];
        L->attn_norm = tensor(&cur, 1, D, 0.2f, 1.0f);
        L->wq = tensor(&cur, A, D, sd, 0.0f);
        L->wk = tensor(&cur, 1024, D, sd, 0.0f);
        L->wv = tensor(&cur, 1024, D, sd, 0.0f);
        L->q_norm = tensor(&cur, 1, 128, 0.2f, 1.0f);
        L->k_norm = tensor(&cur, 1, 128, 0.2f, 1.0f);
        L->wo = tensor(&cur, D, A, sa, 0.0f);
        L->ffn_norm = tensor(&cur, 1, D, 0.2f, 1.0f);
        L->w_gate = tensor(&cur, F, D, sd, 0.0f);
        L->w_up = tensor(&cur, F, D, sd, 0.0f);
        L->w_down = tensor(&cur, D, F, sf, 0.0f);
    }
    t->v.w.layers = t->layers;
    t->v.w.output_norm = tensor(&cur, 1, D, 0.2f, 1.0f);
    t->v.w.output = tied ? t->v.w.token_embd : tensor(&cur, vocab, D, 1.0f, 0.0f);
    return t;
}

static void tmodel_free(tmodel *t)
{
    if (!t) return;
    free(t->layers);
    kipp_aligned_free(t->arena);
    free(t);
}

/* The three shapes: group 2 untied, group 4 tied (4B-like), group 1 tied. */
static tmodel *shape(int i)
{
    if (i == 0) return tmodel_build(128, 16, 256, 1024, 0, 11);
    if (i == 1) return tmodel_build(64, 32, 160, 512, 1, 22);
    return tmodel_build(64, 8, 96, 512, 1, 33);
}

/* ---- backend helpers ---- */

typedef struct {
    const kipp_backend_ops *ops;
    void *bm;
} bk;

static int bk_open(bk *b, const char *name, const tmodel *t, int n_threads)
{
    char err[256] = "";
    kipp_model_view v = t->v;
    v.n_threads = n_threads;
    b->ops = kipp_backend_find(name);
    b->bm = NULL;
    int rc = b->ops ? b->ops->model_create(&v, &b->bm, err, sizeof err) : KIPP_EBACKEND;
    CHECK(rc == 0, "backend %s model_create: %d %s", name, rc, err);
    return rc;
}

static void bk_close(bk *b)
{
    if (b->ops && b->bm) b->ops->model_destroy(b->bm);
    b->bm = NULL;
}

typedef struct {
    void *bs;
    uint32_t len;
    uint32_t bt[32]; /* block table: up to 1024 positions */
} sess;

static int sess_open(const bk *b, sess *s, uint32_t n_blocks, const uint32_t *perm)
{
    char err[256] = "";
    s->len = 0;
    for (uint32_t i = 0; i < 32; i++) s->bt[i] = perm ? perm[i] : i;
    int rc = b->ops->session_create(b->bm, n_blocks, &s->bs, err, sizeof err);
    CHECK(rc == 0, "session_create(%u blocks): %d %s", n_blocks, rc, err);
    return rc;
}

static int eval1(const bk *b, sess *s, const uint32_t *tok, uint32_t n, uint32_t nlog, float *logits)
{
    char err[256] = "";
    kipp_eval_item it = {s->bs, tok, n, s->len, s->bt, nlog, logits, NULL};
    int rc = b->ops->eval(b->bm, &it, 1, err, sizeof err);
    CHECK(rc == 0, "%s eval of %u tokens at %u: %d %s", b->ops->name, n, s->len, rc, err);
    if (rc == 0) s->len += n;
    return rc;
}

static uint32_t argmax(const float *x, size_t n)
{
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (uint32_t)best;
}

static double worst_nmse; /* largest NMSE seen since the last report, printed per test */

static void report_worst(const char *what)
{
    printf("  %s: worst NMSE %.3g (bound %.0e)\n", what, worst_nmse, nmse_max);
    worst_nmse = 0;
}

/* NMSE and argmax of rows rows of logits against the oracle. */
static void check_rows(const float *got, const float *want, uint32_t rows, uint32_t vocab, const char *what)
{
    for (uint32_t r = 0; r < rows; r++) {
        double e = th_nmse(got + (size_t)r * vocab, want + (size_t)r * vocab, vocab);
        uint32_t ag = argmax(got + (size_t)r * vocab, vocab), aw = argmax(want + (size_t)r * vocab, vocab);
        if (e > worst_nmse) worst_nmse = e;
        CHECK(e <= nmse_max, "%s row %u: NMSE %.3g > %.0e", what, r, e, nmse_max);
        CHECK(ag == aw, "%s row %u: argmax %u, reference %u", what, r, ag, aw);
    }
}

static void tokens(uint32_t *ids, uint32_t n, uint32_t vocab, uint32_t salt)
{
    for (uint32_t i = 0; i < n; i++) ids[i] = (i * 7919u + salt * 104729u + 13u) % vocab;
}

/* Prefill n_prompt tokens (last 3 rows of logits), then n_dec decode steps,
 * on cpu (n_threads) and ref; every logits row must agree. */
/* The oracle's logits: the last 3 prefill rows of n_prompt tokens, then one
 * row per decode step; [3 + n_dec][vocab], caller frees. */
static float *ref_run(const tmodel *t, uint32_t n_prompt, uint32_t n_dec)
{
    uint32_t V = t->v.dims.vocab_size, nb = (n_prompt + n_dec + 31) / 32;
    uint32_t *ids = malloc((n_prompt + n_dec) * sizeof *ids);
    float *out = malloc((3 + (size_t)n_dec) * V * sizeof *out);
    bk ref;
    sess s;
    int bad = 1;
    tokens(ids, n_prompt + n_dec, V, n_prompt);
    if (!bk_open(&ref, "ref", t, 1) && !sess_open(&ref, &s, nb, NULL)) {
        bad = eval1(&ref, &s, ids, n_prompt, 3, out);
        for (uint32_t i = 0; i < n_dec && !bad; i++) bad = eval1(&ref, &s, ids + n_prompt + i, 1, 1, out + (3 + (size_t)i) * V);
        ref.ops->session_destroy(s.bs);
    }
    bk_close(&ref);
    free(ids);
    if (bad) { free(out); return NULL; }
    return out;
}

/* The same sequence on cpu with n_threads workers, every row checked against want. */
static void cpu_check(const tmodel *t, int n_threads, uint32_t n_prompt, uint32_t n_dec, const float *want, const char *what)
{
    uint32_t V = t->v.dims.vocab_size, nb = (n_prompt + n_dec + 31) / 32;
    uint32_t *ids = malloc((n_prompt + n_dec) * sizeof *ids);
    float *got = malloc(3 * (size_t)V * sizeof *got);
    char lbl[160];
    bk cpu;
    sess s;
    tokens(ids, n_prompt + n_dec, V, n_prompt);
    CHECK(want != NULL, "%s: the reference backend produced no logits", what);
    if (want && !bk_open(&cpu, "cpu", t, n_threads) && !sess_open(&cpu, &s, nb, NULL)) {
        if (!eval1(&cpu, &s, ids, n_prompt, 3, got)) {
            snprintf(lbl, sizeof lbl, "%s, %d threads, prefill %u", what, n_threads, n_prompt);
            check_rows(got, want, 3, V, lbl);
        }
        for (uint32_t i = 0; i < n_dec; i++) {
            if (eval1(&cpu, &s, ids + n_prompt + i, 1, 1, got)) break;
            snprintf(lbl, sizeof lbl, "%s, %d threads, decode pos %u", what, n_threads, n_prompt + i);
            check_rows(got, want + (3 + (size_t)i) * V, 1, V, lbl);
        }
        cpu.ops->session_destroy(s.bs);
    }
    bk_close(&cpu);
    free(ids);
    free(got);
}

/* ---- the gates ---- */

static int isa_available(kipp_isa isa)
{
    return isa <= kipp_isa_cpu_max();
}

/* Every ISA path this CPU has, every shape: prefill across two rounds (270 > 256 rows) and decode. */
static void test_matches_ref_every_isa(void)
{
    for (int isa = KIPP_ISA_REF; isa < KIPP_ISA_COUNT; isa++) {
        if (!isa_available((kipp_isa)isa)) {
            printf("  note: ISA %s not on this CPU; its path is not exercised here\n", kipp_isa_name((kipp_isa)isa));
            continue;
        }
    }
    double worst[3] = {0, 0, 0};
    for (int s = 0; s < 3; s++) {
        tmodel *t = shape(s);
        float *want = ref_run(t, 270, 4);
        for (int isa = KIPP_ISA_REF; isa < KIPP_ISA_COUNT; isa++) {
            if (!isa_available((kipp_isa)isa)) continue;
            setenv("KIPP_ISA", kipp_isa_name((kipp_isa)isa), 1);
            for (int a = 0; a < 3; a++) { /* FP32 activations everywhere; the dot modes where the level has it */
                setenv("KIPP_BF16_ACT", act_modes[a], 1);
                if (act_mode_now() != a) continue;
                nmse_max = act_bounds[a];
                char what[64];
                snprintf(what, sizeof what, "isa %s act %s shape %d", kipp_isa_name((kipp_isa)isa), act_modes[a], s);
                cpu_check(t, 2, 270, 4, want, what);
                if (worst_nmse > worst[a]) worst[a] = worst_nmse;
                worst_nmse = 0;
            }
        }
        free(want);
        tmodel_free(t);
    }
    unsetenv("KIPP_ISA");
    unsetenv("KIPP_BF16_ACT");
    for (int a = 0; a < 3; a++)
        printf("  cpu vs ref backend, KIPP_BF16_ACT=%s: worst NMSE %.3g (bound %.0e)%s\n", act_modes[a], worst[a], act_bounds[a],
               a && worst[a] == 0 ? "; not run: no level here has the BF16 dot" : "");
    nmse_max = NMSE_REF_MAX;
}

/* The chosen table is the one asked for, and describe says so. */
static void test_describe_names_paths(void)
{
    tmodel *t = shape(0);
    for (int isa = KIPP_ISA_REF; isa < KIPP_ISA_COUNT; isa++) {
        if (!isa_available((kipp_isa)isa)) continue;
        setenv("KIPP_ISA", kipp_isa_name((kipp_isa)isa), 1);
        bk b;
        if (bk_open(&b, "cpu", t, 2)) continue;
        char out[4096], want[64];
        b.ops->describe(b.bm, out, sizeof out);
        snprintf(want, sizeof want, "kernel level %s", kipp_isa_name((kipp_isa)isa));
        CHECK(strstr(out, want) != NULL, "describe lacks '%s':\n%s", want, out);
        CHECK(strstr(out, "threads: 2") != NULL, "describe lacks the thread count:\n%s", out);
        snprintf(want, sizeof want, "format bf16: pack ref, matvec %s", isa >= KIPP_ISA_AVX512 ? "avx512" : kipp_isa_name((kipp_isa)isa));
        CHECK(strstr(out, want) && strstr(out, "k_flash_gqa_bf16_"), "describe lacks kernel lines ('%s'):\n%s", want, out);
        const kipp_dims *d = &t->v.dims;
        size_t D = d->d_model, A = d->n_q_head * 128u, F = d->d_ff;
        size_t bytes = 2 * (d->n_layer * ((A + 2048) * D + D * A + 3 * F * D) + (size_t)d->vocab_size * D);
        snprintf(want, sizeof want, "prepared weights: %zu bytes", bytes);
        CHECK(strstr(out, want) != NULL, "describe lacks '%s':\n%s", want, out);
        bk_close(&b);
    }
    unsetenv("KIPP_ISA");
    tmodel_free(t);
}

/* The mode the backend picks by default, and KIPP_BF16_ACT's values and refusals. */
static void test_bf16_act_modes(void)
{
    tmodel *t = shape(0);
    const char *vals[5] = {NULL, "f32", "mixed", "bf16", "fp16"};
    const char *lines[3] = {"q|k|v bf16/f32, o bf16/f32, gate|up bf16/f32, down bf16/f32, head bf16/f32",
                            "q|k|v bf16/f32, o bf16dot/bf16, gate|up bf16dot/bf16, down bf16dot/bf16, head bf16dot/bf16",
                            "q|k|v bf16dot/bf16, o bf16dot/bf16, gate|up bf16dot/bf16, down bf16dot/bf16, head bf16dot/bf16"};
    for (int isa = KIPP_ISA_REF; isa < KIPP_ISA_COUNT; isa++) {
        if (!isa_available((kipp_isa)isa)) continue;
        setenv("KIPP_ISA", kipp_isa_name((kipp_isa)isa), 1);
        int native = k_fmt_native(k_cpu_ops_get((kipp_isa)isa), K_FMT_BF16DOT);
        CHECK(native == (isa == KIPP_ISA_AVX512_BF16), "bf16dot native at %s: %d", kipp_isa_name((kipp_isa)isa), native);
        for (int i = 0; i < 5; i++) {
            if (vals[i]) setenv("KIPP_BF16_ACT", vals[i], 1);
            else unsetenv("KIPP_BF16_ACT");
            const char *shown = vals[i] ? vals[i] : "(unset)";
            int mode = i == 0 ? native && kipp_cpu_get()->bf16_dot_fast : i == 4 ? -1 : i == 1 || native ? i - 1 : -1;
            CHECK(act_mode_now() == mode, "KIPP_BF16_ACT=%s at %s: mode %d, expected %d", shown, kipp_isa_name((kipp_isa)isa),
                  act_mode_now(), mode);
            char err[256] = "";
            void *bm = NULL;
            int rc = cpu_backend_ops.model_create(&t->v, &bm, err, sizeof err);
            CHECK((rc != 0) == (mode < 0), "KIPP_BF16_ACT=%s at %s: rc %d (%s)", shown, kipp_isa_name((kipp_isa)isa), rc, err);
            if (rc) {
                const char *why = i == 4 ? "expected f32, mixed or bf16" : "needs the avx512_bf16 kernel level";
                CHECK(strstr(err, why) && strstr(err, vals[i]), "KIPP_BF16_ACT=%s: error '%s'", shown, err);
                if (i != 4) { /* names the level and that KIPP_ISA chose it */
                    char lvl[64];
                    snprintf(lvl, sizeof lvl, "runs %s (KIPP_ISA=%s)", kipp_isa_name((kipp_isa)isa), kipp_isa_name((kipp_isa)isa));
                    CHECK(strstr(err, lvl) != NULL, "KIPP_BF16_ACT=%s at %s: error '%s' lacks '%s'", shown, kipp_isa_name((kipp_isa)isa), err, lvl);
                }
                continue;
            }
            char out[4096];
            cpu_backend_ops.describe(bm, out, sizeof out);
            char tag[64];
            snprintf(tag, sizeof tag, "(KIPP_BF16_ACT=%s)", act_modes[mode]);
            CHECK(strstr(out, lines[mode]) && strstr(out, tag), "KIPP_BF16_ACT=%s at %s: describe lacks '%s' %s:\n%s", shown,
                  kipp_isa_name((kipp_isa)isa), tag, lines[mode], out);
            cpu_backend_ops.model_destroy(bm);
        }
    }
    unsetenv("KIPP_ISA");
    unsetenv("KIPP_BF16_ACT");
    tmodel_free(t);
}

/* Worker counts above and below the 8 KV heads over a long context, and the
 * single-worker pool, all against the reference. */
static void test_thread_counts(void)
{
    nmse_max = ref_bound_now(); /* the default read mode of this CPU's best level */
    tmodel *t = shape(2);
    float *want = ref_run(t, 450, 3);
    cpu_check(t, 4, 450, 3, want, "4 workers");
    cpu_check(t, 1, 450, 3, want, "single worker");
    cpu_check(t, 3, 450, 3, want, "odd worker count");
    report_worst(act_mode_now() > 0 ? "workers vs ref, bf16 activations (mixed)" : "workers vs ref");
    nmse_max = NMSE_REF_MAX;
    free(want);
    tmodel_free(t);
}

/* Items of 37, 1 and 290 tokens in one eval (290 crosses a round boundary
 * mid-item), then a batched decode step, against isolated evaluation. */
static void test_batched_vs_isolated(void)
{
    tmodel *t = shape(0);
    uint32_t V = t->v.dims.vocab_size, len[3] = {37, 1, 290}, nlog[3] = {2, 1, 1};
    uint32_t ids[3][291];
    float *lb = malloc(6 * (size_t)V * sizeof *lb), *li = malloc(6 * (size_t)V * sizeof *li);
    bk b;
    sess sb[3], si[3];
    if (bk_open(&b, "cpu", t, 2)) goto out;
    for (int i = 0; i < 3; i++) {
        tokens(ids[i], len[i] + 1, V, 100 + (uint32_t)i);
        sess_open(&b, &sb[i], 10, NULL);
        sess_open(&b, &si[i], 10, NULL);
    }
    kipp_eval_item items[3];
    float *dst[3] = {lb, lb + 2 * (size_t)V, lb + 3 * (size_t)V};
    for (int i = 0; i < 3; i++) items[i] = (kipp_eval_item){sb[i].bs, ids[i], len[i], 0, sb[i].bt, nlog[i], dst[i], NULL};
    char err[256] = "";
    int rc = b.ops->eval(b.bm, items, 3, err, sizeof err);
    CHECK(rc == 0, "batched prefill: %d %s", rc, err);
    for (int i = 0; i < 3; i++) eval1(&b, &si[i], ids[i], len[i], nlog[i], li + (dst[i] - lb));
    check_rows(lb, li, 4, V, "batched prefill vs isolated");
    CHECK(!memcmp(lb, li, 4 * (size_t)V * sizeof *lb), "batched prefill is not bitwise isolated prefill (row invariance)");
    for (int i = 0; i < 3; i++) items[i] = (kipp_eval_item){sb[i].bs, ids[i] + len[i], 1, len[i], sb[i].bt, 1, lb + (size_t)i * V, NULL};
    rc = b.ops->eval(b.bm, items, 3, err, sizeof err);
    CHECK(rc == 0, "batched decode: %d %s", rc, err);
    for (int i = 0; i < 3; i++) eval1(&b, &si[i], ids[i] + len[i], 1, 1, li + (size_t)i * V);
    check_rows(lb, li, 3, V, "batched decode vs isolated");
    CHECK(!memcmp(lb, li, 3 * (size_t)V * sizeof *lb), "batched decode is not bitwise isolated decode (row invariance)");
    for (int i = 0; i < 3; i++) {
        b.ops->session_destroy(sb[i].bs);
        b.ops->session_destroy(si[i].bs);
    }
out:
    bk_close(&b);
    free(lb);
    free(li);
    tmodel_free(t);
}

/* logits_count = n rows in one call equal n one-token calls. */
static void test_multirow_logits(void)
{
    tmodel *t = shape(2);
    uint32_t V = t->v.dims.vocab_size, n = 40, ids[40];
    float *lm = malloc((size_t)n * V * sizeof *lm), *lp = malloc((size_t)n * V * sizeof *lp);
    bk b;
    sess s1, s2;
    tokens(ids, n, V, 7);
    if (bk_open(&b, "cpu", t, 2) || sess_open(&b, &s1, 2, NULL) || sess_open(&b, &s2, 2, NULL)) goto out;
    eval1(&b, &s1, ids, n, n, lm);
    for (uint32_t i = 0; i < n; i++) eval1(&b, &s2, ids + i, 1, 1, lp + (size_t)i * V);
    check_rows(lm, lp, n, V, "multi-row vs per-position");
    CHECK(!memcmp(lm, lp, (size_t)n * V * sizeof *lm), "multi-row logits are not bitwise per-position (row invariance)");
    b.ops->session_destroy(s1.bs);
    b.ops->session_destroy(s2.bs);
out:
    bk_close(&b);
    free(lm);
    free(lp);
    tmodel_free(t);
}

/* A scrambled block table relocates pages without changing any value: the
 * logits are bitwise-identical to the identity table (seed 000, paged KV). */
static void test_scrambled_block_table(void)
{
    tmodel *t = shape(0);
    uint32_t V = t->v.dims.vocab_size, ids[303], perm[32];
    for (uint32_t i = 0; i < 32; i++) perm[i] = (i * 13u + 5u) % 32u; /* 13 is coprime to 32 */
    float *la = malloc(4 * (size_t)V * sizeof *la), *lb = malloc(4 * (size_t)V * sizeof *lb);
    bk b;
    sess sa, sp;
    tokens(ids, 303, V, 3);
    if (bk_open(&b, "cpu", t, 2) || sess_open(&b, &sa, 32, NULL) || sess_open(&b, &sp, 32, perm)) goto out;
    eval1(&b, &sa, ids, 300, 1, la);
    eval1(&b, &sp, ids, 300, 1, lb);
    for (int i = 0; i < 3; i++) { /* prefill row, then one row per decode step */
        eval1(&b, &sa, ids + 300 + i, 1, 1, la + (size_t)(i + 1) * V);
        eval1(&b, &sp, ids + 300 + i, 1, 1, lb + (size_t)(i + 1) * V);
    }
    CHECK(memcmp(la, lb, 4 * (size_t)V * sizeof *la) == 0, "scrambled block table changed the logits");
    b.ops->session_destroy(sa.bs);
    b.ops->session_destroy(sp.bs);
out:
    bk_close(&b);
    free(la);
    free(lb);
    tmodel_free(t);
}

/* Bad input gets an error code and a sentence naming the value. Items and
 * views are refused by the engine, the one place that validates them
 * (engine/session.c, engine/view_check.c), before the cpu backend sees them,
 * and a refused eval appends nothing; so are session capacities
 * (kipp_session_create). The thread count is the pool's own argument. */
static void test_bad_input(void)
{
    char err[256] = "";
    float logits[3 * FX_VOCAB];
    uint32_t bad_tok = FX_VOCAB, ok[70] = {0};
    fx_model *fx = fx_model_create("cpu", err, sizeof err);
    CHECK(fx != NULL, "fixture model on cpu: %s", err);
    if (fx) {
        kipp_model *m = &fx->model;
        kipp_session *s = NULL;
        CHECK(kipp_session_create(m, 64, &s, err, sizeof err) == 0, "session: %s", err);
        err[0] = 0;
        CHECK(kipp_session_eval_n(s, &bad_tok, 1, 1, logits, err, sizeof err) == KIPP_ERANGE && strstr(err, "512"),
              "token 512 >= vocab: '%s'", err);
        err[0] = 0;
        CHECK(kipp_session_eval_n(s, ok, 65, 1, logits, err, sizeof err) == KIPP_ERANGE && strstr(err, "65"),
              "65 tokens in 64 positions: '%s'", err);
        kipp_batch_item it = {s, ok, 2, 3, logits, NULL};
        err[0] = 0;
        CHECK(kipp_eval_batch(m, &it, 1, err, sizeof err) == KIPP_EINVAL && strstr(err, "3 logits rows"),
              "logits_count 3 > 2 tokens: '%s'", err);
        kipp_batch_item two[2] = {{s, ok, 1, 0, NULL, NULL}, {s, ok, 1, 0, NULL, NULL}};
        err[0] = 0;
        CHECK(kipp_eval_batch(m, two, 2, err, sizeof err) == KIPP_EINVAL && strstr(err, "share a session"),
              "duplicate sessions: '%s'", err);
        s->block_table[1] = 7; /* the engine's own state gone wrong: page 1 -> block 7 of 2 */
        err[0] = 0;
        CHECK(kipp_session_eval_n(s, ok, 40, 1, logits, err, sizeof err) == KIPP_ERANGE && strstr(err, "block_table[1] = 7"),
              "block 7 of a 2-block session: '%s'", err);
        s->block_table[1] = 1;
        CHECK(kipp_session_length(s) == 0, "refused evals appended %u tokens", kipp_session_length(s));
        CHECK(kipp_session_eval_n(s, ok, 40, 1, logits, err, sizeof err) == 0, "eval after the refusals: %s", err);
        kipp_session_destroy(s);
        s = NULL;
        err[0] = 0;
        CHECK(kipp_session_create(m, 0, &s, err, sizeof err) == KIPP_ERANGE && strstr(err, "0 tokens"), "capacity 0: '%s'", err);
        CHECK(kipp_session_create(m, FX_CTX + 1, &s, err, sizeof err) == KIPP_ERANGE && strstr(err, "301"),
              "capacity 301 > context 300: '%s'", err);
        kipp_model_view v = m->view;
        kipp_qwen3_layer layers[2];
        memcpy(layers, v.w.layers, sizeof layers);
        layers[1].wq.rows--;
        v.w.layers = layers;
        err[0] = 0;
        CHECK(kipp_view_check(&m->view, err, sizeof err) == 0, "the fixture's view: %s", err);
        CHECK(kipp_view_check(&v, err, sizeof err) == KIPP_EFORMAT && strstr(err, "attn_q of layer 1"),
              "attn_q of layer 1 one row short: '%s'", err);
        fx_model_destroy(fx);
    }
    /* A pooled session's table gone wrong: page 0 -> block 99 of a 4-block pool.
     * The refusal names the entry, and the block mapped for page 1 on the way is
     * returned to the pool (rollback): nothing leaks, nothing is appended. */
    fx = fx_model_create("cpu", err, sizeof err);
    CHECK(fx != NULL, "fixture model on cpu: %s", err);
    if (fx) {
        kipp_model *m = &fx->model;
        kipp_session *s = NULL;
        kipp_pool_stats st;
        CHECK(kipp_model_attach_pool(m, 4, err, sizeof err) == 0, "pool of 4 blocks: %s", err);
        CHECK(kipp_session_create(m, 64, &s, err, sizeof err) == 0, "pooled session: %s", err);
        CHECK(kipp_session_eval_n(s, ok, 10, 1, logits, err, sizeof err) == 0, "10 tokens: %s", err);
        uint32_t saved = s->block_table[0];
        s->block_table[0] = 99;
        err[0] = 0;
        CHECK(kipp_session_eval_n(s, ok, 30, 1, logits, err, sizeof err) == KIPP_ERANGE && strstr(err, "block_table[0] = 99") &&
              strstr(err, "< 4"), "block 99 of a 4-block pool: '%s'", err);
        kipp_model_pool_stats(m, &st);
        CHECK(kipp_session_length(s) == 10 && st.blocks_available == 3, "after the refusal: length %u, %llu blocks free, expected 10 and 3",
              kipp_session_length(s), (unsigned long long)st.blocks_available);
        s->block_table[0] = saved;
        CHECK(kipp_session_eval_n(s, ok, 30, 1, logits, err, sizeof err) == 0, "eval after the refusal: %s", err);
        kipp_session_destroy(s);
        kipp_kv_pool_destroy(m->pool);
        m->pool = NULL;
        fx_model_destroy(fx);
    }
    tmodel *t = shape(2);
    kipp_model_view v = t->v;
    v.n_threads = -1;
    void *bm = NULL;
    err[0] = 0;
    CHECK(cpu_backend_ops.model_create(&v, &bm, err, sizeof err) == KIPP_EINVAL && strstr(err, "-1"), "n_threads -1: '%s'", err);
    tmodel_free(t);
}

/* ---- golden vectors (tests/vectors, tools/gen_vectors.py: HF transformers FP32 from BF16) ---- */

/* Rows of one prompt: prefill of ids, then one decode step per greedy token.
 * Each stored row k has n_tokens = len(ids) + k. */
static void check_prompt(kipp_model *m, const char *cid, const char *pname, json_t *pr, FILE *bin, const char *isa)
{
    json_t *ids_j = json_object_get(pr, "ids"), *greedy = json_object_get(pr, "greedy"), *rows = json_object_get(pr, "logits");
    size_t n = json_array_size(ids_j), nrows = json_array_size(rows), V = 151936;
    uint32_t *ids = malloc((n + json_array_size(greedy) + 1) * sizeof *ids);
    float *got = malloc(V * sizeof *got), *want = malloc(V * sizeof *want);
    for (size_t i = 0; i < n; i++) ids[i] = (uint32_t)json_integer_value(json_array_get(ids_j, i));
    for (size_t i = 0; i < json_array_size(greedy); i++) ids[n + i] = (uint32_t)json_integer_value(json_array_get(greedy, i));
    kipp_session *s = NULL;
    char err[256] = "", what[160];
    int rc = kipp_session_create(m, 1024, &s, err, sizeof err);
    CHECK(rc == 0, "%s: session: %s", cid, err);
    CHECK(nrows >= 2, "%s/%s: expected a prefill row and decode rows, got %zu", cid, pname, nrows);
    for (size_t k = 0; k < nrows && rc == 0; k++) {
        json_t *row = json_array_get(rows, k);
        size_t nt = (size_t)json_integer_value(json_object_get(row, "n_tokens"));
        long off = (long)json_integer_value(json_object_get(row, "offset"));
        CHECK(nt == n + k, "%s/%s row %zu: n_tokens %zu, expected %zu", cid, pname, k, nt, n + k);
        if (nt != n + k) break;
        rc = k == 0 ? kipp_session_eval(s, ids, (uint32_t)n, got, err, sizeof err)
                    : kipp_session_eval(s, ids + n + k - 1, 1, got, err, sizeof err);
        CHECK(rc == 0, "%s/%s row %zu: eval: %s", cid, pname, k, err);
        if (rc) break;
        int ok = fseek(bin, off, SEEK_SET) == 0 && fread(want, sizeof *want, V, bin) == V;
        CHECK(ok, "%s/%s row %zu: could not read %zu floats at byte %ld of the vector file", cid, pname, k, V, off);
        if (!ok) break;
        snprintf(what, sizeof what, "vectors %s/%s isa %s %s", cid, pname, isa, k ? "decode" : "prefill");
        check_rows(got, want, 1, (uint32_t)V, what);
        CHECK(argmax(got, V) == (uint32_t)json_integer_value(json_object_get(row, "argmax")),
              "%s row %zu: argmax differs from the manifest's", what, k);
    }
    kipp_session_destroy(s);
    free(ids);
    free(got);
    free(want);
}

/* Every checkpoint and prompt of tests/vectors/MANIFEST.json, prefill and
 * decode, on every ISA path this CPU has, through the public API. */
static void test_golden_vectors(void)
{
    nmse_max = NMSE_HF_MAX;
    json_error_t je;
    json_t *man = json_load_file("tests/vectors/MANIFEST.json", 0, &je);
    CHECK(man != NULL, "tests/vectors/MANIFEST.json: %s (run from the repository root)", je.text);
    json_t *cks = json_object_get(man, "checkpoints");
    CHECK(json_object_size(cks) >= 2, "manifest lists %zu checkpoints, expected the two tiny models", json_object_size(cks));
    const char *cid;
    json_t *ck;
    json_object_foreach(cks, cid, ck) {
        char path[512], bpath[512], err[256] = "";
        snprintf(path, sizeof path, "%s/%s.gguf", th_models_dir(), cid);
        snprintf(bpath, sizeof bpath, "tests/vectors/%s", json_string_value(json_object_get(ck, "bin")));
        FILE *bin = fopen(bpath, "rb");
        CHECK(bin != NULL, "cannot open %s", bpath);
        for (int isa = KIPP_ISA_REF; bin && isa < KIPP_ISA_COUNT; isa++) {
            if (!isa_available((kipp_isa)isa)) continue;
            setenv("KIPP_ISA", kipp_isa_name((kipp_isa)isa), 1);
            kipp_model *m = NULL;
            int rc = kipp_model_open(path, "cpu", NULL, &m, err, sizeof err);
            CHECK(rc == 0, "open %s with cpu: %s (make models-test builds it)", path, err);
            if (rc) break;
            const char *pname;
            json_t *pr;
            json_object_foreach(json_object_get(ck, "prompts"), pname, pr)
                check_prompt(m, cid, pname, pr, bin, kipp_isa_name((kipp_isa)isa));
            kipp_model_close(m);
        }
        if (bin) fclose(bin);
    }
    unsetenv("KIPP_ISA");
    json_decref(man);
    report_worst("cpu vs golden vectors");
    nmse_max = NMSE_REF_MAX;
}

int main(void)
{
    RUN(test_matches_ref_every_isa);
    RUN(test_describe_names_paths);
    RUN(test_bf16_act_modes);
    RUN(test_thread_counts);
    RUN(test_batched_vs_isolated);
    RUN(test_multirow_logits);
    RUN(test_scrambled_block_table);
    RUN(test_bad_input);
    RUN(test_golden_vectors);
    return th_finish();
}
