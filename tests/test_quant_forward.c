/*
 * test_quant_forward.c - the quantized-artifact gates (seed 000
 * "Weight quantization": "Quantized artifacts gate as ordinary artifacts").
 *
 * For every file in tests/vectors/quant/MANIFEST.json (written by
 * tools/np_forward.py: a numpy FP32 transcription of HF Qwen3 over the same
 * file's weights dequantized by the `gguf` package; it reproduces the
 * transformers vectors of the BF16 file to NMSE ~1e-12) and both backends:
 *   - kipp_model_info.quant is the file's scheme;
 *   - the prompt's final row (prefill: the cpu backend's tiled matmul) and
 *     DECODE_ROWS greedy steps through the KV cache (the cpu backend's
 *     matvec) against the FP32 oracle: identical argmax, NMSE <= 5e-5 (ref:
 *     the dequantizing FP32 matvec, so only BF16 KV rounding remains) and
 *     <= 1e-3 (cpu: plus Q8 activations, the integer dot; not the earlier
 *     1e-4, which int8 activations cannot meet here: MANIFEST.json
 *     "tolerance_notes");
 *   - quantization loss against the transformers vectors of the BF16
 *     checkpoint (tests/vectors/MANIFEST.json): identical greedy tokens and
 *     argmax at every stored row, NMSE <= the manifest's quant_loss_<scheme>.
 * And the kernels' encoder (k_fmt_info.from_f32) reproduces the converter's
 * bytes (tools/quant_blocks.py) for every projection of the file, from the
 * BF16 file's weights: encoder and decoder agree exactly.
 * The bounds live in the manifest (tools/np_forward.py TOLERANCES) with the
 * measurements behind them; this test refuses bounds looser than those.
 */
#include <jansson.h>
#include <string.h>

#include "tests/test_harness.h"
#include "engine/internal.h"
#include "kernels/cpu/kernels.h"


static uint32_t argmax_f(const float *x, size_t n)
{
    size_t b = 0;
    for (size_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (uint32_t)b;
}

static const char *vectors_dir(void)
{
    const char *d = getenv("KIPP_TEST_VECTORS");
    return d ? d : "tests/vectors";
}

static float *read_bin(const char *path, size_t *n_floats)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    float *p = malloc((size_t)sz);
    if (p && fread(p, 1, (size_t)sz, f) != (size_t)sz) free(p), p = NULL;
    fclose(f);
    *n_floats = (size_t)sz / 4;
    return p;
}

static uint32_t *json_ids(json_t *arr, uint32_t *n)
{
    *n = (uint32_t)json_array_size(arr);
    uint32_t *ids = malloc((*n + 1) * 4);
    for (uint32_t i = 0; i < *n; i++) ids[i] = (uint32_t)json_integer_value(json_array_get(arr, i));
    return ids;
}

/* The stored row of `rows` (a logits array) at n_tokens, or NULL. */
static const float *row_at(json_t *rows, uint32_t n_tokens, const float *bin, size_t bin_n)
{
    for (size_t i = 0; i < json_array_size(rows); i++) {
        json_t *r = json_array_get(rows, i);
        if ((uint32_t)json_integer_value(json_object_get(r, "n_tokens")) != n_tokens) continue;
        size_t off = (size_t)json_integer_value(json_object_get(r, "offset")) / 4;
        size_t cnt = (size_t)json_integer_value(json_object_get(r, "count"));
        return off + cnt <= bin_n ? bin + off : NULL;
    }
    return NULL;
}

typedef struct {
    json_t *hf;        /* tests/vectors/MANIFEST.json */
    float *hf_bin;     /* the BF16 checkpoint's transformers rows */
    size_t hf_n;
    double worst_loss; /* largest quantization-loss NMSE seen */
    json_t *exempt;    /* quant manifest's bf16_argmax_exempt: ["<stem>/<prompt>"] */
} hf_ref;

/* One prompt on one backend: prefill row, then decode rows, each against the
 * oracle and against the BF16 reference. */
static void check_prompt(kipp_model *m, const char *backend, const char *stem, const char *cid,
                         const char *pname, json_t *p, const float *bin, size_t bin_n, hf_ref *hf, double tol,
                         double loss_bound, int exempt)
{
    kipp_model_info info;
    kipp_model_get_info(m, &info);
    uint32_t V = info.vocab_size, n, n_greedy;
    uint32_t *ids = json_ids(json_object_get(p, "ids"), &n);
    uint32_t *greedy = json_ids(json_object_get(p, "greedy"), &n_greedy);
    json_t *rows = json_object_get(p, "logits");
    json_t *hp = json_object_get(json_object_get(json_object_get(json_object_get(hf->hf, "checkpoints"), cid),
                                                 "prompts"), pname);
    float *lg = malloc((size_t)V * 4);
    kipp_session *s = NULL;
    char err[256] = "";
    CHECK(kipp_session_create(m, n + n_greedy + 1, &s, err, sizeof err) == 0, "create: %s", err);
    for (uint32_t r = 0; s && r <= n_greedy; r++) {
        int rc = r == 0 ? kipp_session_eval(s, ids, n, lg, err, sizeof err)
                        : kipp_session_eval(s, greedy + r - 1, 1, lg, err, sizeof err);
        CHECK(rc == 0, "%s %s/%s row %u: eval failed: %s", backend, stem, pname, r, err);
        if (rc) break;
        const float *want = row_at(rows, n + r, bin, bin_n);
        CHECK(want != NULL, "%s/%s: no oracle row at %u tokens", stem, pname, n + r);
        if (!want) break;
        double e = th_nmse(lg, want, V);
        uint32_t a = argmax_f(lg, V), aw = argmax_f(want, V);
        CHECK(e <= tol, "%s %s/%s at %u tokens (%s): NMSE %.3g > %g vs the FP32 oracle", backend, stem, pname, n + r,
              r ? "decode" : "prefill", e, tol);
        CHECK(a == aw, "%s %s/%s at %u tokens: argmax %u, oracle %u", backend, stem, pname, n + r, a, aw);
        const float *bf = hp && !exempt ? row_at(json_object_get(hp, "logits"), n + r, hf->hf_bin, hf->hf_n) : NULL;
        double loss = bf ? th_nmse(lg, bf, V) : -1;
        if (bf) {
            CHECK(loss <= loss_bound, "%s %s/%s at %u tokens: quantization loss NMSE %.3g > %g vs the BF16 reference",
                  backend, stem, pname, n + r, loss, loss_bound);
            CHECK(a == argmax_f(bf, V), "%s %s/%s at %u tokens: argmax %u, BF16 reference %u", backend, stem, pname,
                  n + r, a, argmax_f(bf, V));
            if (loss > hf->worst_loss) hf->worst_loss = loss;
        }
        printf("  %s %s/%s: %u tokens (%s), NMSE %.3g vs FP32 oracle, %.3g vs BF16 reference, argmax %u\n", backend,
               stem, pname, n + r, r ? "decode" : "prefill", e, loss, a);
    }
    if (hp && !exempt) {
        uint32_t hn;
        uint32_t *hg = json_ids(json_object_get(hp, "greedy"), &hn);
        CHECK(hn >= n_greedy && !memcmp(hg, greedy, n_greedy * 4), "%s/%s: greedy tokens differ from the BF16 reference",
              stem, pname);
        free(hg);
    }
    kipp_session_destroy(s);
    free(lg), free(ids), free(greedy);
}

static void check_file(const char *stem, json_t *f, json_t *tol, hf_ref *hf)
{
    const char *cid = json_string_value(json_object_get(f, "checkpoint"));
    const char *scheme = json_string_value(json_object_get(f, "scheme"));
    char path[512], err[512] = "";
    snprintf(path, sizeof path, "%s/quant/%s", vectors_dir(), json_string_value(json_object_get(f, "bin")));
    size_t bin_n = 0;
    float *bin = read_bin(path, &bin_n);
    CHECK(bin != NULL, "cannot read %s", path);
    snprintf(path, sizeof path, "%s/%s.gguf", th_models_dir(), stem);
    static const char *const backends[] = {"ref", "cpu"};
    for (int b = 0; b < 2 && bin; b++) {
        kipp_model *m = NULL;
        int rc = kipp_model_open(path, backends[b], NULL, &m, err, sizeof err);
        CHECK(rc == 0, "open %s on %s: %s (run `make models-test`)", path, backends[b], err);
        if (rc) continue;
        kipp_model_info info;
        kipp_model_get_info(m, &info);
        CHECK(!strcmp(info.quant, scheme), "%s: kipp_model_info.quant is '%s', expected '%s'", stem, info.quant, scheme);
        double t = json_real_value(json_object_get(tol, b ? "cpu_nmse" : "ref_nmse"));
        char lk[64];
        snprintf(lk, sizeof lk, "quant_loss_%s", scheme);
        double loss_bound = json_real_value(json_object_get(tol, lk));
        CHECK(loss_bound > 0, "manifest has no %s bound", lk);
        json_t *prompts = json_object_get(f, "prompts");
        const char *pname;
        json_t *p;
        json_object_foreach(prompts, pname, p) {
            char key[256];
            snprintf(key, sizeof key, "%s/%s", stem, pname);
            int exempt = 0;
            for (size_t i = 0; i < json_array_size(hf->exempt); i++)
                exempt |= !strcmp(json_string_value(json_array_get(hf->exempt, i)), key);
            if (exempt) printf("  %s: leaves the BF16 reference's greedy path (manifest bf16_argmax_exempt): FP32-oracle gate only\n", key);
            check_prompt(m, backends[b], stem, cid, pname, p, bin, bin_n, hf, t, loss_bound, exempt);
        }
        kipp_model_close(m);
    }
    free(bin);
}

static void test_quant_vectors(void)
{
    char path[512];
    json_error_t je;
    snprintf(path, sizeof path, "%s/quant/MANIFEST.json", vectors_dir());
    json_t *man = json_load_file(path, 0, &je);
    CHECK(man != NULL, "cannot read %s: %s", path, je.text);
    snprintf(path, sizeof path, "%s/MANIFEST.json", vectors_dir());
    hf_ref hf = {json_load_file(path, 0, &je), NULL, 0, 0, NULL};
    CHECK(hf.hf != NULL, "cannot read %s: %s", path, je.text);
    if (!man || !hf.hf) { json_decref(man); json_decref(hf.hf); return; }
    json_t *tol = json_object_get(man, "tolerances");
    hf.exempt = json_object_get(man, "bf16_argmax_exempt");
    CHECK(json_real_value(json_object_get(tol, "ref_nmse")) <= 5e-5 && json_real_value(json_object_get(tol, "cpu_nmse")) <= 1e-3 &&
          json_real_value(json_object_get(tol, "quant_loss_q8_0")) <= 2e-3 &&
          json_real_value(json_object_get(tol, "quant_loss_affine4_gs32")) <= 0.2 && json_array_size(hf.exempt) <= 1,
          "manifest tolerances are looser than the documented 5e-5 (ref) / 1e-3 (cpu) / 2e-3 (q8_0 loss) / 0.2 "
          "(affine4 loss), or exempt more than the one affine4 prompt");
    const char *stem;
    json_t *f;
    json_object_foreach(json_object_get(man, "files"), stem, f) {
        const char *cid = json_string_value(json_object_get(f, "checkpoint"));
        json_t *c = json_object_get(json_object_get(hf.hf, "checkpoints"), cid);
        snprintf(path, sizeof path, "%s/%s", vectors_dir(), json_string_value(json_object_get(c, "bin")));
        hf.hf_bin = read_bin(path, &hf.hf_n);
        CHECK(hf.hf_bin != NULL, "cannot read the BF16 reference %s", path);
        check_file(stem, f, tol, &hf);
        free(hf.hf_bin);
    }
    printf("  worst quantization loss (rows on the BF16 greedy path): NMSE %.3g\n", hf.worst_loss);
    json_decref(man);
    json_decref(hf.hf);
}

/* from_f32 of the BF16 file's projections == the quantized file's bytes. */
static void check_encoder(const char *stem, const char *bf16_stem, k_fmt fmt)
{
    char p1[512], p2[512], err[512] = "";
    snprintf(p1, sizeof p1, "%s/%s.gguf", th_models_dir(), stem);
    snprintf(p2, sizeof p2, "%s/%s.gguf", th_models_dir(), bf16_stem);
    kipp_model *q = NULL, *b = NULL;
    CHECK(kipp_model_load(p1, &q, err, sizeof err) == 0, "load %s: %s", p1, err);
    CHECK(kipp_model_load(p2, &b, err, sizeof err) == 0, "load %s: %s", p2, err);
    const k_fmt_info *fi = k_fmt_get(fmt);
    size_t n_checked = 0;
    for (uint32_t l = 0; q && b && l < q->view.dims.n_layer; l++) {
        const kipp_tensor_view *vq[] = {&q->layers[l].wq, &q->layers[l].wk, &q->layers[l].wv, &q->layers[l].wo,
                                        &q->layers[l].w_gate, &q->layers[l].w_up, &q->layers[l].w_down};
        const kipp_tensor_view *vb[] = {&b->layers[l].wq, &b->layers[l].wk, &b->layers[l].wv, &b->layers[l].wo,
                                        &b->layers[l].w_gate, &b->layers[l].w_up, &b->layers[l].w_down};
        for (int i = 0; i < 7; i++) {
            size_t rows = vb[i]->rows, cols = vb[i]->cols, nb = k_fmt_file_bytes(fi, rows, cols);
            float *w = malloc(rows * cols * 4);
            void *enc = malloc(nb);
            const kipp_bf16 *src = vb[i]->data;
            for (size_t k = 0; k < rows * cols; k++) w[k] = kipp_bf16_to_f32(src[k]);
            fi->from_f32(w, enc, rows, cols);
            CHECK(vq[i]->dtype == fi->file->gguf_type && vq[i]->nbytes == nb && !memcmp(enc, vq[i]->data, nb),
                  "%s layer %u projection %d: the kernels' %s encoder differs from the converter's bytes", stem, l, i,
                  fi->name);
            n_checked++;
            free(w), free(enc);
        }
    }
    printf("  %s: %zu projections, kernels' encoder == converter bytes\n", stem, n_checked);
    kipp_model_close(q);
    kipp_model_close(b);
}

static void test_encoder_matches_converter(void)
{
    check_encoder("synthetic-tiny-q8_0", "synthetic-tiny", K_FMT_Q8_0);
    check_encoder("synthetic-tiny-affine4_gs32", "synthetic-tiny", K_FMT_AFFINE4);
}

/* ---- int8 fidelity on outlier weights ----
 * synthetic-tiny-outliers (tools/make_checkpoint.py "heavy" projections: loud
 * rows and heavy-tailed weights, its own seed) converted to q8_0 and
 * affine4_gs32: the cpu backend at every kernel level this CPU has (the
 * scalar ref level too) against the
 * ref backend on the same file (the ref backend dequantizes into an FP32
 * matvec: the oracle on the same dequantized weights), each prompt's prefill
 * row and OUTLIER_DECODE greedy steps (the ref backend's argmax fed to both).
 * Gated per level:
 *   - prefill: NMSE <= 5e-4 over the three prompts' prefill rows together
 *     (sum of squared errors over sum of squares), every prefill row
 *     <= OUTLIER_PREFILL_ROW_MAX and with the ref backend's argmax;
 *   - decode: the median row <= 5e-4, every row <= OUTLIER_DECODE_ROW_MAX,
 *     at most one argmax flip.
 * Why these statistics and not 5e-4 on every row: on this random model the
 * int8 floor of the loudest prompt's prefill row is 5e-4..7e-4 (numpy, no
 * Kipp code: tools/act_precision.py), so that row passes or not with the
 * FP32 summation order of a level; and a few decode rows amplify any
 * rounding so much that BF16 activations, or the ref backend's own BF16 KV
 * cache against an FP32 one, miss 5e-4 there too (docs/FORMAT.md "Int8
 * activations on outlier weights"). The gate still fails the per-block
 * int8 without FP32 outliers on both files (worst prefill row 6.4e-3 /
 * 1.1e-3, decode median 1.4e-3 / 2.5e-3). */
#define OUTLIER_NMSE_MAX 5e-4
#define OUTLIER_PREFILL_ROW_MAX 1e-3
#define OUTLIER_DECODE_ROW_MAX 0.25
#define OUTLIER_DECODE 6
#define OUTLIER_ROWS (OUTLIER_DECODE + 1)
#define OUTLIER_MAX_IDS 256

static const char *const outlier_prompts[] = {
    "The quick brown fox jumps over the lazy dog, and then it runs back home across the field.",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\nprint([fib(i) for i in range(10)])\n",
    "<|im_start|>user\nWrite a short poem about the autumn rain.<|im_end|>\n<|im_start|>assistant\n",
};
#define N_OUTLIER_PROMPTS (sizeof outlier_prompts / sizeof *outlier_prompts)

/* The ref backend's rows of every prompt, and the tokens that produced them (prompt, then its greedy picks). */
typedef struct {
    uint32_t V;
    size_t n[N_OUTLIER_PROMPTS];
    uint32_t ids[N_OUTLIER_PROMPTS][OUTLIER_MAX_IDS + OUTLIER_DECODE];
    float *rows; /* [prompt][OUTLIER_ROWS][V] */
} outlier_oracle;

static float *oracle_row(const outlier_oracle *o, size_t p, int r)
{
    return o->rows + ((size_t)p * OUTLIER_ROWS + (size_t)r) * o->V;
}

/* Evaluate prompt p's prefill and OUTLIER_DECODE single tokens on m (the tokens o->ids), calling back per row. */
static int outlier_rows(kipp_model *m, const outlier_oracle *o, size_t p, float *lg,
                        void (*row)(void *ctx, size_t p, int r, const float *lg), void *ctx)
{
    char err[512] = "";
    kipp_session *s = NULL;
    int rc = kipp_session_create(m, (uint32_t)o->n[p] + OUTLIER_ROWS, &s, err, sizeof err);
    CHECK(rc == 0, "session: %s", err);
    for (int r = 0; !rc && r < OUTLIER_ROWS; r++) {
        const uint32_t *in = r ? &o->ids[p][o->n[p] + (size_t)r - 1] : o->ids[p];
        rc = kipp_session_eval(s, in, r ? 1 : (uint32_t)o->n[p], lg, err, sizeof err);
        CHECK(rc == 0, "prompt %zu row %d: eval: %s", p, r, err);
        if (!rc) row(ctx, p, r, lg);
    }
    kipp_session_destroy(s);
    return rc;
}

static void oracle_keep(void *ctx, size_t p, int r, const float *lg)
{
    outlier_oracle *o = ctx;
    memcpy(oracle_row(o, p, r), lg, (size_t)o->V * 4);
    if (r < OUTLIER_DECODE) o->ids[p][o->n[p] + (size_t)r] = argmax_f(lg, o->V);
}

/* The ref backend's rows of stem's file; 0 when it could not run (reported). */
static int outlier_oracle_make(const char *path, outlier_oracle *o)
{
    char err[512] = "";
    kipp_model *m = NULL;
    int rc = kipp_model_open(path, "ref", NULL, &m, err, sizeof err);
    CHECK(rc == 0, "open %s on ref: %s (run `make models-test`)", path, err);
    if (rc) return 0;
    kipp_model_info info;
    kipp_model_get_info(m, &info);
    o->V = info.vocab_size;
    o->rows = malloc(N_OUTLIER_PROMPTS * OUTLIER_ROWS * (size_t)o->V * 4);
    float *lg = malloc((size_t)o->V * 4);
    CHECK(o->rows && lg, "out of memory");
    for (size_t p = 0; !rc && o->rows && lg && p < N_OUTLIER_PROMPTS; p++) {
        const char *t = outlier_prompts[p];
        rc = kipp_tokenize(m, t, strlen(t), KIPP_TOK_SPECIAL, o->ids[p], OUTLIER_MAX_IDS, &o->n[p], err, sizeof err);
        CHECK(rc == 0 && o->n[p] > 0, "tokenize prompt %zu: %s", p, err);
        if (!rc && o->n[p]) rc = outlier_rows(m, o, p, lg, oracle_keep, o);
    }
    int ok = !rc && o->rows && lg;
    free(lg);
    kipp_model_close(m);
    return ok;
}

/* What one level's rows came to against the oracle. */
typedef struct {
    const outlier_oracle *o;
    const char *what;
    double pre_err, pre_ref, worst_prefill, dec[N_OUTLIER_PROMPTS * OUTLIER_DECODE];
    size_t n_dec, flips;
} outlier_stats;

static void outlier_compare(void *ctx, size_t p, int r, const float *lc)
{
    outlier_stats *st = ctx;
    const float *lr = oracle_row(st->o, p, r);
    uint32_t V = st->o->V, ar = argmax_f(lr, V), ac = argmax_f(lc, V);
    double e = th_nmse(lc, lr, V);
    printf("  %s prompt %zu: %zu tokens (%s), cpu NMSE %.3g vs ref, argmax %u%s\n", st->what, p, st->o->n[p] + (size_t)r,
           r ? "decode" : "prefill", e, ac, ac == ar ? "" : " (ref differs)");
    if (r == 0) {
        double se = 0, sr = 0;
        for (uint32_t i = 0; i < V; i++) se += ((double)lc[i] - lr[i]) * ((double)lc[i] - lr[i]), sr += (double)lr[i] * lr[i];
        st->pre_err += se, st->pre_ref += sr;
        CHECK(e <= OUTLIER_PREFILL_ROW_MAX, "%s prompt %zu (prefill): cpu NMSE %.3g > %g vs the ref backend", st->what,
              p, e, OUTLIER_PREFILL_ROW_MAX);
        CHECK(ar == ac, "%s prompt %zu (prefill): cpu argmax %u, ref %u", st->what, p, ac, ar);
        if (e > st->worst_prefill) st->worst_prefill = e;
    } else {
        CHECK(e <= OUTLIER_DECODE_ROW_MAX, "%s prompt %zu (decode row %d): cpu NMSE %.3g > %g vs the ref backend",
              st->what, p, r, e, OUTLIER_DECODE_ROW_MAX);
        st->dec[st->n_dec++] = e;
        st->flips += ar != ac;
    }
}

static void check_outliers_at(const char *path, const char *stem, const outlier_oracle *o, kipp_isa isa)
{
    char err[512] = "", what[128];
    snprintf(what, sizeof what, "%s at %s", stem, kipp_isa_name(isa));
    setenv("KIPP_ISA", kipp_isa_name(isa), 1);
    kipp_model *m = NULL;
    int rc = kipp_model_open(path, "cpu", NULL, &m, err, sizeof err);
    CHECK(rc == 0, "open %s on cpu: %s", what, err);
    float *lg = malloc((size_t)o->V * 4);
    outlier_stats st = {.o = o, .what = what};
    for (size_t p = 0; !rc && lg && p < N_OUTLIER_PROMPTS; p++) outlier_rows(m, o, p, lg, outlier_compare, &st);
    free(lg);
    kipp_model_close(m);
    if (rc) return;
    size_t n = st.n_dec;
    double med = kipp_median(st.dec, n); /* sorts st.dec: dec[n - 1] is the worst row */
    double pooled = st.pre_ref > 0 ? st.pre_err / st.pre_ref : 1;
    CHECK(n == N_OUTLIER_PROMPTS * OUTLIER_DECODE, "%s: %zu decode rows ran", what, n);
    CHECK(pooled <= OUTLIER_NMSE_MAX, "%s: NMSE over the prefill rows %.3g > %g vs the ref backend", what, pooled,
          OUTLIER_NMSE_MAX);
    CHECK(med <= OUTLIER_NMSE_MAX, "%s: median decode NMSE %.3g > %g vs the ref backend", what, med, OUTLIER_NMSE_MAX);
    CHECK(st.flips <= 1, "%s: %zu decode rows with another argmax than the ref backend (at most 1)", what, st.flips);
    printf("  %s: cpu vs ref NMSE prefill %.3g (worst row %.3g), decode median %.3g worst %.3g, %zu decode argmax "
           "flips\n", what, pooled, st.worst_prefill, med, n ? st.dec[n - 1] : 0.0, st.flips);
}

static void check_outliers(const char *stem)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.gguf", th_models_dir(), stem);
    outlier_oracle *o = calloc(1, sizeof *o);
    CHECK(o, "out of memory");
    const char *env = getenv("KIPP_ISA");
    char saved[32] = "";
    if (env) snprintf(saved, sizeof saved, "%s", env);
    /* every level, the scalar one included: a CPU without AVX2 runs it */
    if (o && outlier_oracle_make(path, o))
        for (int isa = KIPP_ISA_REF; isa <= (int)kipp_isa_cpu_max(); isa++)
            check_outliers_at(path, stem, o, (kipp_isa)isa);
    if (env) setenv("KIPP_ISA", saved, 1);
    else unsetenv("KIPP_ISA");
    if (o) free(o->rows);
    free(o);
}

static void test_outlier_fidelity(void)
{
    check_outliers("synthetic-tiny-outliers-q8_0");
    check_outliers("synthetic-tiny-outliers-affine4_gs32");
}

int main(void)
{
    RUN(test_encoder_matches_converter);
    RUN(test_quant_vectors);
    RUN(test_outlier_fidelity);
    return th_finish();
}
