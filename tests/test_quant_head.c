/*
 * test_quant_head.c - the gate of the opt-in quantized head
 * (docs/FORMAT.md "Quantized head").
 *
 * Each file converted with --quant-head is compared with the same conversion
 * without it (the BF16-head artifact: identical bytes except the head), on
 * both backends, over the gate prompts of tests/vectors/MANIFEST.json (each
 * prompt's prefill row, then DECODE_ROWS steps feeding the BF16-head file's
 * own argmax, so both read the same context):
 *   - identical argmax on every row, save at most MAX_TIES near ties per file
 *     and backend (the BF16-head file's top two closer than the row's largest
 *     logit error: measured once, the untied q8_0 head, gap 0.11 < 0.24);
 *   - logit NMSE against the BF16-head file <= HEAD_NMSE_<format> (measured
 *     and documented in docs/FORMAT.md, with the margin);
 *   - kipp_model_info.quant_head names the format, and a tied checkpoint's
 *     head is its own tensor (output.weight) while token_embd stays BF16.
 * And the loader refuses a bad kipp.quant.head value, "bf16" spelled out, and
 * an output.weight whose type differs from kipp.quant.head, naming each.
 */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "tests/test_harness.h"
#include "engine/gguf.h"
#include "engine/internal.h"

#define DECODE_ROWS 3
/* Logit NMSE bounds vs the BF16-head artifact (docs/FORMAT.md "Quantized head"):
 * the measured worst over both backends and every gate row, times ~3. q8_0:
 * 2.6e-5 (ref) / 6.2e-5 (cpu: Q8 activations into the head as well); affine4:
 * 5.73e-3 / 5.78e-3, the weight NMSE of Q4_1 on the embedding (5.7e-3). */
#define HEAD_NMSE_Q8_0 2e-4
#define HEAD_NMSE_AFFINE4 1.8e-2
/* Argmax: identical on every row, except a near tie: the two tokens' logits in
 * the BF16-head file differ by no more than the row's largest logit error; at
 * most MAX_TIES such rows per file and backend (docs/FORMAT.md). */
#define MAX_TIES 1

typedef struct {
    const char *file;    /* the --quant-head conversion */
    const char *base;    /* the same conversion with the BF16 head */
    const char *ckpt;    /* registry id (its prompts in tests/vectors/MANIFEST.json) */
    const char *head;    /* kipp.quant.head */
    double bound;
} head_case;

static const head_case cases[] = {
    {"synthetic-tiny-q8_0-head_q8_0", "synthetic-tiny-q8_0", "synthetic-tiny", "q8_0", HEAD_NMSE_Q8_0},
    {"synthetic-tiny-affine4_gs32-head_affine4_gs32", "synthetic-tiny-affine4_gs32", "synthetic-tiny", "affine4_gs32",
     HEAD_NMSE_AFFINE4},
    {"synthetic-tiny-untied-head_q8_0", "synthetic-tiny-untied", "synthetic-tiny-untied", "q8_0", HEAD_NMSE_Q8_0},
};

static uint32_t argmax_f(const float *x, size_t n)
{
    size_t b = 0;
    for (size_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (uint32_t)b;
}

static char *model_path(const char *stem)
{
    static char buf[2][512];
    static int k;
    k ^= 1;
    snprintf(buf[k], sizeof buf[k], "%s/%s.gguf", th_models_dir(), stem);
    return buf[k];
}

static json_t *gate_prompts(const char *ckpt)
{
    const char *d = getenv("KIPP_TEST_VECTORS");
    char path[512];
    snprintf(path, sizeof path, "%s/MANIFEST.json", d ? d : "tests/vectors");
    json_error_t je;
    json_t *man = json_load_file(path, 0, &je);
    CHECK(man != NULL, "cannot read %s: %s", path, je.text);
    json_t *p = man ? json_object_get(json_object_get(json_object_get(man, "checkpoints"), ckpt), "prompts") : NULL;
    CHECK(p != NULL, "%s has no prompts for %s", path, ckpt);
    json_incref(p);
    json_decref(man);
    return p;
}

static double worst[2][2]; /* [case format: 0 q8_0, 1 affine4][backend] */

/* One prompt: prefill, then DECODE_ROWS steps on the base's argmax. */
static void check_prompt(const head_case *hc, int bi, const char *backend, kipp_model *mq, kipp_model *mb,
                         const char *pname, json_t *p, int *ties)
{
    uint32_t n = (uint32_t)json_array_size(json_object_get(p, "ids")), V = 151936;
    uint32_t *ids = malloc((n + 1) * 4);
    for (uint32_t i = 0; i < n; i++) ids[i] = (uint32_t)json_integer_value(json_array_get(json_object_get(p, "ids"), i));
    float *lq = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4);
    kipp_session *sq = NULL, *sb = NULL;
    char err[256] = "";
    CHECK(kipp_session_create(mq, n + DECODE_ROWS + 1, &sq, err, sizeof err) == 0, "session: %s", err);
    CHECK(kipp_session_create(mb, n + DECODE_ROWS + 1, &sb, err, sizeof err) == 0, "session: %s", err);
    uint32_t tok = 0;
    for (uint32_t r = 0; sq && sb && r <= DECODE_ROWS; r++) {
        int rq = r ? kipp_session_eval(sq, &tok, 1, lq, err, sizeof err) : kipp_session_eval(sq, ids, n, lq, err, sizeof err);
        CHECK(rq == 0, "%s %s/%s row %u: eval: %s", backend, hc->file, pname, r, err);
        int rb = r ? kipp_session_eval(sb, &tok, 1, lb, err, sizeof err) : kipp_session_eval(sb, ids, n, lb, err, sizeof err);
        CHECK(rb == 0, "%s %s/%s row %u: eval: %s", backend, hc->base, pname, r, err);
        if (rq || rb) break;
        double e = th_nmse(lq, lb, V);
        uint32_t aq = argmax_f(lq, V), ab = argmax_f(lb, V);
        double se = 0, emax = 0;
        for (uint32_t i = 0; i < V; i++) {
            double d = (double)lq[i] - lb[i];
            se += d * d;
            if (fabs(d) > emax) emax = fabs(d);
        }
        double rms = sqrt(se / V), gap = (double)lb[ab] - lb[aq];
        /* A near tie: the BF16-head file's own two candidates lie closer than the
         * row's largest logit error (L-inf), so the head's rounding can order them
         * either way; at most MAX_TIES such rows per file and backend. */
        int tie = aq != ab && gap <= emax;
        if (tie) {
            (*ties)++;
            printf("  %s %s/%s at %u tokens: near tie, argmax %u vs %u: BF16-head gap %.4f <= max logit error %.4f "
                   "(RMS %.4f)\n", backend, hc->file, pname, n + r, aq, ab, gap, emax, rms);
        }
        CHECK(aq == ab || tie, "%s %s/%s at %u tokens: argmax %u, the BF16-head file's %u (its logits %.4f vs %.4f "
              "there: gap %.4f > max logit error %.4f)", backend, hc->file, pname, n + r, aq, ab, lb[aq], lb[ab],
              gap, emax);
        CHECK(e <= hc->bound, "%s %s/%s at %u tokens: logit NMSE %.3g vs the BF16-head file > bound %g", backend,
              hc->file, pname, n + r, e, hc->bound);
        int fi = strcmp(hc->head, "q8_0") != 0;
        if (e > worst[fi][bi]) worst[fi][bi] = e;
        printf("  %s %s/%s: %u tokens (%s), NMSE %.3g vs BF16 head, argmax %u\n", backend, hc->file, pname, n + r,
               r ? "decode" : "prefill", e, aq);
        tok = ab;
    }
    kipp_session_destroy(sq);
    kipp_session_destroy(sb);
    free(ids), free(lq), free(lb);
}

static void test_head_gate(void)
{
    static const char *const backends[] = {"ref", "cpu"};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const head_case *hc = &cases[c];
        json_t *prompts = gate_prompts(hc->ckpt);
        for (int b = 0; b < 2 && prompts; b++) {
            kipp_model *mq = NULL, *mb = NULL;
            char err[512] = "";
            int rc = kipp_model_open(model_path(hc->file), backends[b], NULL, &mq, err, sizeof err);
            CHECK(rc == 0, "open %s on %s: %s (run `make models-test`)", hc->file, backends[b], err);
            int rb = kipp_model_open(model_path(hc->base), backends[b], NULL, &mb, err, sizeof err);
            CHECK(rb == 0, "open %s on %s: %s (run `make models-test`)", hc->base, backends[b], err);
            if (!rc) {
                kipp_model_info in;
                kipp_model_get_info(mq, &in);
                CHECK(!strcmp(in.quant_head, hc->head), "%s: quant_head '%s', expected '%s'", hc->file, in.quant_head,
                      hc->head);
                const kipp_qwen3_weights *w = &mq->view.w;
                CHECK(w->output.data != w->token_embd.data && w->token_embd.dtype == KIPP_DTYPE_BF16 &&
                      w->output.dtype == kipp_fmt_by_scheme(hc->head, strlen(hc->head))->gguf_type,
                      "%s: the head must be its own output.weight in %s with token_embd BF16", hc->file, hc->head);
            }
            if (!rb) {
                kipp_model_info in;
                kipp_model_get_info(mb, &in);
                CHECK(!strcmp(in.quant_head, "bf16"), "%s: quant_head '%s', expected bf16", hc->base, in.quant_head);
            }
            const char *pname;
            json_t *p;
            int ties = 0;
            if (!rc && !rb)
                json_object_foreach(prompts, pname, p) check_prompt(hc, b, backends[b], mq, mb, pname, p, &ties);
            CHECK(ties <= MAX_TIES, "%s on %s: %d near-tie argmax flips, at most %d allowed", hc->file, backends[b], ties,
                  MAX_TIES);
            kipp_model_close(mq);
            kipp_model_close(mb);
        }
        json_decref(prompts);
    }
    printf("  worst logit NMSE vs the BF16 head: q8_0 ref %.3g cpu %.3g; affine4_gs32 ref %.3g cpu %.3g\n", worst[0][0],
           worst[0][1], worst[1][0], worst[1][1]);
}

/* ------------------------------------------------------------ loader refusals */

static uint8_t *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc(*n);
    if (p && fread(p, 1, *n, f) != *n) free(p), p = NULL;
    fclose(f);
    return p;
}

static void expect_refused(const uint8_t *img, size_t n, const char *want, const char *what)
{
    char err[512] = "";
    int rc = kipp_model_validate_image(img, n, err, sizeof err);
    CHECK(rc == KIPP_EFORMAT && strstr(err, want), "%s: rc %d, error '%s'; expected EFORMAT naming '%s'", what, rc,
          err, want);
}

static void test_loader_refusals(void)
{
    size_t n = 0;
    const char *path = model_path("synthetic-tiny-q8_0-head_q8_0");
    uint8_t *img = read_file(path, &n);
    CHECK(img != NULL, "cannot read %s (run `make models-test`)", path);
    if (!img) return;
    char err[512] = "";
    CHECK(kipp_model_validate_image(img, n, err, sizeof err) == 0, "pristine %s refused: %s", path, err);
    kipp_gguf g;
    memset(&g, 0, sizeof g);
    CHECK(kipp_gguf_parse(img, n, &g, err, sizeof err) == 0, "parse: %s", err);
    const kipp_gguf_kv *kv = kipp_gguf_find(&g, "kipp.quant.head");
    CHECK(kv && kv->v.s.len == 4, "kipp.quant.head missing or not 'q8_0'");
    const kipp_gguf_tensor *out = NULL;
    for (uint64_t i = 0; i < g.n_tensors; i++)
        if (g.tensors[i].name.len == 13 && !memcmp(g.tensors[i].name.ptr, "output.weight", 13)) out = &g.tensors[i];
    CHECK(out != NULL, "no output.weight in %s", path);
    if (kv && out) {
        size_t val = (size_t)((const uint8_t *)kv->v.s.ptr - img);
        size_t type_at = (size_t)((const uint8_t *)out->name.ptr - img) + out->name.len + 4 + 8 * out->n_dims;
        memcpy(img + val, "q9_0", 4);
        expect_refused(img, n, "kipp.quant.head is 'q9_0', expected one of q8_0, affine4_gs32", "unknown head format");
        memcpy(img + val, "bf16", 4);
        expect_refused(img, n, "kipp.quant.head is 'bf16'", "bf16 spelled out");
        memcpy(img + val, "q8_0", 4);
        uint32_t t = 3, old; /* Q4_1: smaller than the Q8_0 bytes, so only the type check can refuse it */
        memcpy(&old, img + type_at, 4);
        CHECK(old == 8, "output.weight type %u at the computed offset, expected 8", old);
        memcpy(img + type_at, &t, 4);
        expect_refused(img, n, "tensor 'output.weight' has GGUF type Q4_1 (3), but kipp.quant.head is q8_0",
                       "head type differs from kipp.quant.head");
    }
    kipp_gguf_free(&g);
    free(img);
}

int main(void)
{
    RUN(test_loader_refusals);
    RUN(test_head_gate);
    return th_finish();
}
