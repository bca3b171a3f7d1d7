/*
 * spec_draft.c - draft-model speculative decoding (issue 55): a second, smaller
 * model with the target's tokenizer (its own quantized twin, or a smaller
 * model of the family) proposes the draft that spec.c verifies.
 *
 * The draft model keeps its own session, which holds a prefix of the
 * sequence: before each proposal it is rolled back to the longest prefix it
 * shares with the context (kipp_session_truncate) and the rest is evaluated,
 * normally the pending token plus the one accepted draft it had not evaluated,
 * so no explicit rollback after verification is needed. Then it drafts
 * token by token, each the sample of its own row under the caller's sampler
 * parameters: greedy when those are deterministic (the verification keeps
 * the target's greedy tokens, so the output is the plain output bitwise),
 * else drawn from q, the draft's distribution, which is kept for
 * verification by speculative sampling (Leviathan et al. 2023, "Fast
 * Inference from Transformers via Speculative Decoding", Algorithm 1; Chen
 * et al. 2023): accept draft x with probability min(1, p(x)/q(x)), else emit
 * a sample of max(0, p - q) renormalised and stop; after a fully accepted
 * draft, sample the next row from p. Every emitted token is then distributed
 * exactly as the target's own sampler would draw it (p and q are the
 * distributions kipp_sample_ex draws from: kipp_sample_probs). A draft with
 * no q (prompt lookup, or a greedy proposal) is a point mass: q(x) = 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/spec_impl.h"

int kipp_spec_broken_residual;

int kipp_draft_check(const kipp_model *target, const kipp_model *draft, char *err, size_t errlen)
{
    if (!target || !draft) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_draft_check: NULL target or draft model");
    /* a retrieval model never generates: as a draft it would only cost (0% acceptance) */
    int tt = kipp_model_task(target), td = kipp_model_task(draft);
    if (tt == KIPP_TASK_EMBED || tt == KIPP_TASK_RERANK || td == KIPP_TASK_EMBED || td == KIPP_TASK_RERANK)
        return kipp_err(err, errlen, KIPP_EINVAL, "the %s is %s model (kipp.variant %s), expected a generation model",
                        td == KIPP_TASK_EMBED || td == KIPP_TASK_RERANK ? "draft" : "target",
                        (td == KIPP_TASK_EMBED || td == KIPP_TASK_RERANK ? td : tt) == KIPP_TASK_EMBED ? "an embedding"
                                                                                                        : "a reranker",
                        (td == KIPP_TASK_EMBED || td == KIPP_TASK_RERANK ? td : tt) == KIPP_TASK_EMBED ? "embedding"
                                                                                                        : "reranker");
    uint32_t vt = target->view.dims.vocab_size, vd = draft->view.dims.vocab_size;
    if (vt != vd)
        return kipp_err(err, errlen, KIPP_EINVAL, "the draft's vocabulary has %u entries and the target's %u, expected "
                        "the same vocabulary and tokenizer", vd, vt);
    char why[200];
    if (kipp_tokenizer_diff(target->tok, draft->tok, why, sizeof why))
        return kipp_err(err, errlen, KIPP_EINVAL, "the draft's tokenizer differs from the target's (target against "
                        "draft: %s), expected the same tokenizer", why);
    return 0;
}

int kipp_draft_self_path(const char *model_path, const char *quant, char *out, size_t outlen, char *err,
                         size_t errlen)
{
    if (!model_path || !quant || !out || !outlen)
        return kipp_err(err, errlen, KIPP_EINVAL, "kipp_draft_self_path: NULL model path, quant or output");
    int q8 = !strcmp(quant, "q8_0");
    if (!q8 && strcmp(quant, "affine4") && strcmp(quant, "affine4_gs32"))
        return kipp_err(err, errlen, KIPP_EINVAL, "--draft-self '%s' is not a draft format, expected q8_0 or affine4",
                        quant);
    size_t n = strlen(model_path);
    if (n > 5 && !strcmp(model_path + n - 5, ".gguf")) n -= 5;
    const char *scheme = q8 ? "q8_0" : "affine4_gs32";
    char twin[2][4096];
    for (int i = 0; i < 2; i++) {
        int len = i ? snprintf(twin[i], sizeof twin[i], "%.*s-%s.gguf", (int)n, model_path, scheme)
                    : snprintf(twin[i], sizeof twin[i], "%.*s-%s-head_%s.gguf", (int)n, model_path, scheme, scheme);
        if (len < 0 || (size_t)len >= sizeof twin[i] || (size_t)len >= outlen)
            return kipp_err(err, errlen, KIPP_EINVAL, "--draft-self: the path of the model '%s' is too long", model_path);
        if (access(twin[i], R_OK) == 0) return memcpy(out, twin[i], (size_t)len + 1), 0;
    }
    return kipp_err(err, errlen, KIPP_EINVAL, "--draft-self %s: neither '%s' nor '%s' is next to the model '%s'; Kipp "
                    "does not quantize at load, expected the converter's twin (tools/convert_to_gguf.py --quant %s "
                    "[--quant-head %s] --out ...) or --draft-model FILE", quant, twin[0], twin[1], model_path, scheme,
                    scheme);
}

int kipp_spec_draft_init(kipp_spec *sp, kipp_model *dm, char *err, size_t errlen)
{
    int rc = kipp_draft_check(sp->model, dm, err, errlen);
    if (rc) return rc;
    sp->dm = dm;
    sp->dlog = malloc((size_t)sp->vocab * sizeof *sp->dlog);
    sp->pr = malloc((size_t)sp->vocab * sizeof *sp->pr);
    sp->q = malloc((size_t)sp->o.k_max * sp->vocab * sizeof *sp->q);
    if (!sp->dlog || !sp->pr || !sp->q)
        return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for a draft model's %u rows", sp->o.k_max + 2);
    return 0;
}

void kipp_spec_draft_free(kipp_spec *sp)
{
    kipp_session_destroy(sp->ds);
    free(sp->ds_tok);
    free(sp->dlog);
    free(sp->pr);
    free(sp->q);
}

/* The draft session, created at the first proposal with the target session's capacity (at most the draft's context). */
static int draft_session(kipp_spec *sp, uint32_t cap, char *err, size_t errlen)
{
    if (sp->ds) return 0;
    uint32_t most = sp->dm->view.dims.context_length;
    sp->ds_cap = cap < most ? cap : most;
    sp->ds_tok = malloc((size_t)sp->ds_cap * sizeof *sp->ds_tok);
    if (!sp->ds_tok) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for the draft's %u token ids", sp->ds_cap);
    return kipp_session_create(sp->dm, sp->ds_cap, &sp->ds, err, errlen);
}

/* Bring the draft session to ctx[0..n_ctx) with the last position's row in
 * dlog: keep the longest common prefix, evaluate the rest. Returns the count
 * evaluated (>= 1), or a KIPP_E* code. */
static int draft_sync(kipp_spec *sp, const uint32_t *ctx, uint32_t n_ctx, char *err, size_t errlen)
{
    uint32_t len = kipp_session_length(sp->ds), m = 0;
    while (m < len && m < n_ctx && sp->ds_tok[m] == ctx[m]) m++;
    if (m == n_ctx) m--; /* the last row is needed: evaluate it again */
    int rc = kipp_session_truncate(sp->ds, m, err, errlen);
    if (!rc) rc = kipp_session_eval(sp->ds, ctx + m, n_ctx - m, sp->dlog, err, errlen);
    if (rc) return rc;
    memcpy(sp->ds_tok + m, ctx + m, (size_t)(n_ctx - m) * sizeof *ctx);
    return (int)(n_ctx - m);
}

/* A draw from probs[n] (need not sum to 1) by inverse CDF; the last token with mass when u*total rounds up. */
static uint32_t draw_probs(const float *probs, size_t n, kipp_rng *rng)
{
    double total = 0.0, cum = 0.0;
    for (size_t i = 0; i < n; i++) total += probs[i];
    double u = kipp_rng_uniform(rng) * total;
    for (size_t i = 0; i < n; i++) {
        cum += probs[i];
        if (u < cum) return (uint32_t)i;
    }
    for (size_t i = n; i-- > 0;)
        if (probs[i] > 0.0f) return (uint32_t)i;
    return 0;
}

/* Fold one proposal's time into the average draft evaluation. */
static void draft_time(kipp_spec *sp, double secs, uint32_t evals)
{
    double t = secs / evals;
    sp->t_deval = sp->t_deval > 0 ? 0.8 * sp->t_deval + 0.2 * t : t;
}

int kipp_spec_draft_model(kipp_spec *sp, const uint32_t *ctx, size_t n_ctx, uint32_t k, uint32_t cap,
                          const kipp_sample_params *p, kipp_rng *rng, uint32_t *draft, uint32_t *n_draft, char *err,
                          size_t errlen)
{
    *n_draft = 0;
    int rc = draft_session(sp, cap, err, errlen);
    if (rc) return rc;
    if (n_ctx > sp->ds_cap) return 0; /* past the draft's context: plain steps */
    if (k > sp->ds_cap - n_ctx + 1) k = sp->ds_cap - (uint32_t)n_ctx + 1;
    kipp_sample_params dp = p ? *p : kipp_sample_params_default();
    sp->sampled = p && !kipp_spec_params_ok(p) && rng;
    size_t base = p && p->history ? p->history_len : 0;
    rc = kipp_spec_hist_reserve(sp, base + k, err, errlen);
    if (rc) return rc;
    if (base) memcpy(sp->hist, p->history, base * sizeof *sp->hist);
    dp.history = sp->hist;
    double t0 = kipp_spec_now();
    int synced = draft_sync(sp, ctx, (uint32_t)n_ctx, err, errlen);
    if (synced < 0) return synced;
    kipp_rng none;
    kipp_rng_seed(&none, 0); /* greedy never draws */
    uint32_t evals = 1, j = 0;
    for (; j < k; j++) {
        uint32_t t;
        dp.history_len = base + j;
        float *q = sp->q + (size_t)j * sp->vocab;
        rc = sp->sampled ? kipp_sample_probs(sp->dlog, sp->vocab, &dp, q, err, errlen)
                         : kipp_sample_ex(sp->dlog, sp->vocab, &dp, &none, &t, err, errlen);
        if (rc) return rc;
        if (sp->sampled) t = draw_probs(q, sp->vocab, rng);
        draft[j] = t, sp->hist[base + j] = t;
        if (kipp_spec_is_stop(sp, t) || j + 1 == k) { j++; break; }
        uint32_t at = kipp_session_length(sp->ds);
        rc = kipp_session_eval(sp->ds, &t, 1, sp->dlog, err, errlen);
        if (rc) return rc;
        sp->ds_tok[at] = t, evals++;
    }
    if (synced <= 2) draft_time(sp, kipp_spec_now() - t0, evals); /* a catch-up after a pause is not a step's cost */
    *n_draft = j;
    return 0;
}

/* Row r's outcome for draft token x under target distribution pr and draft distribution q (NULL: a point mass
 * at x): 1 and *t = x when accepted, else 0 and *t a sample of max(0, p - q) renormalised. */
static int verify_row(kipp_spec *sp, const float *q, uint32_t x, kipp_rng *rng, uint32_t *t)
{
    double px = sp->pr[x], qx = q ? q[x] : 1.0, u = kipp_rng_uniform(rng);
    if (u * qx < px) {
        *t = x;
        return 1;
    }
    double mass = 0.0;
    for (uint32_t i = 0; i < sp->vocab && !kipp_spec_broken_residual; i++) {
        float r = sp->pr[i] - (q ? q[i] : (float)(i == x));
        sp->pr[i] = r > 0.0f ? r : 0.0f; /* the residual, in place: pr is refilled for the next row */
        mass += sp->pr[i];
    }
    /* p == q up to rounding leaves no residual mass; p itself is then the right law */
    if (!kipp_spec_broken_residual && mass <= 0.0) sp->pr[x] = 0.0f, mass = 1.0;
    *t = draw_probs(sp->pr, sp->vocab, rng);
    return 0;
}

int kipp_spec_sample_rows(kipp_spec *sp, const kipp_sample_params *p, kipp_rng *rng, const float *logits,
                          const uint32_t *draft, uint32_t n_draft, uint32_t max_new, uint32_t *out,
                          uint32_t *accepted, char *err, size_t errlen)
{
    kipp_sample_params rp;
    int rc = kipp_spec_rows_begin(sp, p, n_draft, &rp, err, errlen);
    if (rc) return rc;
    uint32_t n = 0;
    *accepted = 0;
    for (uint32_t r = 0; r <= n_draft; r++) {
        rp.history_len = p->history_len + n; /* row r follows pending + out[0..n) */
        rc = kipp_sample_probs(logits + (size_t)r * sp->vocab, sp->vocab, &rp, sp->pr, err, errlen);
        if (rc) return rc;
        uint32_t t;
        int ok = 0;
        if (r < n_draft) ok = verify_row(sp, sp->sampled ? sp->q + (size_t)r * sp->vocab : NULL, draft[r], rng, &t);
        else t = draw_probs(sp->pr, sp->vocab, rng);
        out[n] = t;
        sp->hist[p->history_len + n] = t;
        n++;
        *accepted += (uint32_t)ok;
        if (!ok || kipp_spec_is_stop(sp, t) || n >= max_new) break;
    }
    return (int)n;
}
