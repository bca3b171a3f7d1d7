/*
 * spec.c - prompt-lookup speculative decoding that is exactly greedy (seed 000,
 * "Greedy self-speculative decoding").
 *
 * One step: draft up to k tokens by copying what followed the latest earlier
 * occurrence of the context's suffix n-gram, evaluate pending + draft in one
 * multi-row forward (kipp_session_eval_n: the weights are read once for all
 * rows), sample every row in order with the caller's deterministic parameters,
 * keep the longest prefix where the sample equals the draft, and roll the KV
 * back with kipp_session_truncate. Each emitted token is the sample of the
 * logits row that follows exactly the emitted tokens before it, so the output
 * is the plain greedy output whenever a row's logits equal what a one-token
 * decode step would give (bitwise on "ref"; see README "Speculative decoding").
 *
 * The gate keeps the step from costing more than it saves: it estimates the
 * per-token acceptance a from decayed counts and drafts the k that maximises
 * expected emitted tokens per unit of cost; at k = 0 it decodes plainly and
 * probes with a 1-token draft at growing intervals. The cost of r rows is
 * learned online: each verification's wall time updates a per-row-count
 * average, and counts not yet timed are priced by the linear prior
 * 1 + row_cost * (r - 1) decode steps. Timing only changes which k is drafted,
 * never what is emitted.
 *
 * With options.draft_model the draft comes from a second model instead
 * (spec_draft.c), and a non-deterministic sampler is verified by speculative
 * sampling there. The gate then adds the draft's cost, k draft evaluations
 * of a learned average (prior: the ratio of the bytes a decode step of each reads),
 * to the verification's, so a draft that is rarely accepted or too slow
 * drives k to 0 and the step is a plain decode step.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/spec_impl.h"

#define SPEC_NGRAM_LIMIT 8u
#define GATE_DECAY 0.9       /* weight of older steps in the acceptance estimate */
#define GATE_PROBE_MIN 8u    /* plain steps before the first probe when paused */
#define GATE_PROBE_MAX 128u  /* longest interval between probes */
/* A draft model's first probe after a pause waits this many plain steps: a probe first evaluates the
 * paused stretch in the draft (a prefill of that many tokens), so probing at 8, 24, 56, 120 had the
 * draft read the whole reply anyway: an unrelated 0.6B draft for the 1.7B spent 4.8% of the
 * verification time drafting (loaded run; the issue allows 3% against plain decoding). */
#define GATE_PROBE_DRAFT_MIN 128u


static int check_opts(const kipp_spec_options *o, char *err, size_t errlen)
{
    if (o->k_max < 1 || o->k_max > KIPP_SPEC_K_MAX)
        return kipp_err(err, errlen, KIPP_EINVAL, "speculative draft length k %u is out of range, expected 1..%u",
                        o->k_max, KIPP_SPEC_K_MAX);
    if (o->ngram_max < 1 || o->ngram_max > SPEC_NGRAM_LIMIT)
        return kipp_err(err, errlen, KIPP_EINVAL, "ngram_max %u is out of range, expected 1..%u", o->ngram_max,
                        SPEC_NGRAM_LIMIT);
    if (o->ngram_min < 1 || o->ngram_min > o->ngram_max)
        return kipp_err(err, errlen, KIPP_EINVAL, "ngram_min %u is out of range, expected 1..%u (ngram_max)",
                        o->ngram_min, o->ngram_max);
    if (!(o->row_cost >= 0.0f && o->row_cost <= 1.0f))
        return kipp_err(err, errlen, KIPP_EINVAL, "row_cost %g is out of range, expected 0..1 decode steps",
                        (double)o->row_cost);
    for (uint32_t k = 0; o->costs && k <= o->k_max; k++)
        if (!(o->costs[k] > 0.0f && o->costs[k] < 1e6f))
            return kipp_err(err, errlen, KIPP_EINVAL, "costs[%u] is %g, expected a positive number of decode steps", k,
                            (double)o->costs[k]);
    if (o->draft_model && !(o->draft_cost >= 0.0f && o->draft_cost <= 1.0f))
        return kipp_err(err, errlen, KIPP_EINVAL, "draft_cost %g is out of range, expected 0..1 decode steps",
                        (double)o->draft_cost);
    if (o->draft_min > o->k_max)
        return kipp_err(err, errlen, KIPP_EINVAL, "draft_min %u is above the longest draft k_max %u, expected "
                        "0..%u", o->draft_min, o->k_max, o->k_max);
    if (o->n_stop > 2 || (o->n_stop && !o->stop_ids))
        return kipp_err(err, errlen, KIPP_EINVAL, "%u stop ids given, expected 0..2 and an array", o->n_stop);
    return 0;
}

/* Bytes one decode step of m reads: its weights, less an embedding table that is not also the head (a
 * quantized-head file keeps both, and reads one row of the table per token). */
static double decode_bytes(const kipp_model *m)
{
    const kipp_tensor_view *e = &m->view.w.token_embd, *o = &m->view.w.output;
    uint64_t b = m->weight_bytes;
    if (o->data && o->data != e->data && b >= e->nbytes) b -= e->nbytes;
    return (double)b;
}

int kipp_spec_create(const kipp_model *model, const kipp_spec_options *opts, kipp_spec **out, char *err,
                     size_t errlen)
{
    if (!out) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_spec_create: out is NULL, expected a pointer");
    *out = NULL;
    if (!model) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_spec_create: model is NULL, expected an open model");
    kipp_spec_options o = opts ? *opts : (kipp_spec_options){0};
    if (!o.k_max) o.k_max = 8;
    if (!o.ngram_max) o.ngram_max = o.ngram_min > 3 ? o.ngram_min : 3;
    if (!o.ngram_min) o.ngram_min = 1;
    if (o.row_cost == 0.0f) o.row_cost = 0.15f;
    int rc = check_opts(&o, err, errlen);
    if (rc) return rc;
    kipp_spec *sp = calloc(1, sizeof *sp);
    if (!sp) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory allocating a drafter");
    sp->model = model;
    sp->vocab = model->view.dims.vocab_size;
    for (uint32_t i = 0; i < o.n_stop; i++) sp->stop[i] = o.stop_ids[i];
    for (uint32_t k = 0; o.costs && k <= o.k_max; k++) sp->fixed_cost[k] = o.costs[k];
    o.stop_ids = NULL, o.costs = NULL; /* copied */
    sp->o = o;
    sp->logits = malloc((size_t)(o.k_max + 1) * sp->vocab * sizeof *sp->logits);
    if (!sp->logits) {
        free(sp);
        return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for %u logits rows", o.k_max + 1);
    }
    rc = o.draft_model ? kipp_spec_draft_init(sp, o.draft_model, err, errlen) : 0;
    if (rc) {
        kipp_spec_destroy(sp);
        return rc;
    }
    if (o.draft_model) { /* decode is read-bound: a draft evaluation costs about its share of the bytes */
        double ratio = decode_bytes(o.draft_model) / (decode_bytes(model) > 0 ? decode_bytes(model) : 1.0);
        sp->draft_prior = o.draft_cost > 0 ? o.draft_cost : ratio < 1.0 ? ratio : 1.0;
    }
    kipp_spec_reset(sp);
    *out = sp;
    return 0;
}

void kipp_spec_destroy(kipp_spec *sp)
{
    if (!sp) return;
    if (sp->dm) kipp_spec_draft_free(sp);
    free(sp->logits);
    free(sp->hist);
    free(sp->ref);
    free(sp);
}

void kipp_spec_reset(kipp_spec *sp)
{
    if (!sp) return;
    memset(&sp->st, 0, sizeof sp->st);
    sp->acc = 1.0, sp->rej = 1.0; /* prior a = 1/2: draft a little until the text shows its kind */
    /* A draft model is made to agree: prior a = 0.8 (a quantized twin: 0.9+), but held lightly, and the first
     * drafts are short (ramp: 1, doubled after each whole draft accepted), so an unrelated draft costs a few
     * one-token verifications before the gate pauses it, not several long ones. */
    if (sp->dm) sp->acc = 1.6, sp->rej = 0.4;
    sp->ramp = 1;
    sp->idle = 0, sp->probe_every = sp->dm ? GATE_PROBE_DRAFT_MIN : GATE_PROBE_MIN;
    memset(sp->t_rows, 0, sizeof sp->t_rows);
    sp->st.k_now = sp->o.k_max;
}

int kipp_spec_set_reference(kipp_spec *sp, const uint32_t *ids, size_t n, char *err, size_t errlen)
{
    if (!sp || (n && !ids)) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_spec_set_reference: NULL drafter or ids");
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= sp->vocab)
            return kipp_err(err, errlen, KIPP_ERANGE, "reference token %u (index %zu) is out of range, expected an id below %u",
                            ids[i], i, sp->vocab);
    uint32_t *copy = n ? malloc(n * sizeof *copy) : NULL;
    if (n && !copy) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for a %zu-token reference", n);
    if (n) memcpy(copy, ids, n * sizeof *copy);
    free(sp->ref);
    sp->ref = copy, sp->n_ref = n;
    return 0;
}

/* ---- the drafter ---- */

/* Latest start i <= end in src[0..n_src) with src[i..i+n) == suf[0..n) and i+n < n_src
 * (something follows it), searching down from end; -1 when none. */
static long find_latest(const uint32_t *src, size_t n_src, size_t end, const uint32_t *suf, uint32_t n)
{
    if (n_src <= n) return -1;
    size_t last = n_src - n - 1;
    for (long i = (long)(end < last ? end : last); i >= 0; i--)
        if (src[i] == suf[0] && !memcmp(src + i, suf, n * sizeof *suf)) return i;
    return -1;
}

/* Copy up to k tokens that follow src[from..) into draft; past the end of ctx
 * (src == ctx) the copy reads its own output, so a cycle of period p shorter
 * than k still drafts k tokens. Returns the count. */
static uint32_t copy_after(const uint32_t *src, size_t n_src, int is_ctx, size_t from, uint32_t k, uint32_t *draft)
{
    uint32_t j = 0;
    for (; j < k; j++) {
        size_t at = from + j;
        if (at < n_src) draft[j] = src[at];
        else if (is_ctx) draft[j] = draft[at - n_src];
        else break;
    }
    return j;
}

/* The longest suffix n-gram of ctx[0..end) (skip = tokens left out at the end)
 * found earlier in ctx, else in the reference; the draft copies what followed
 * it, after skipping `skip` more tokens. 0 when nothing matched. */
static uint32_t lookup(const kipp_spec *sp, const uint32_t *ctx, size_t n_ctx, uint32_t skip, uint32_t k, uint32_t *draft)
{
    for (uint32_t n = sp->o.ngram_max; n >= sp->o.ngram_min; n--) {
        if (n_ctx < (size_t)n + skip + 1) continue;
        const uint32_t *suf = ctx + n_ctx - skip - n;
        long i = find_latest(ctx, n_ctx, n_ctx - skip - n - 1, suf, n);
        if (i >= 0) return copy_after(ctx, n_ctx, 1, (size_t)i + n + skip, k, draft);
        i = sp->n_ref ? find_latest(sp->ref, sp->n_ref, sp->n_ref, suf, n) : -1;
        if (i >= 0) return copy_after(sp->ref, sp->n_ref, 0, (size_t)i + n + skip, k, draft);
    }
    return 0;
}

void kipp_spec_draft(kipp_spec *sp, const uint32_t *ctx, size_t n_ctx, uint32_t k, uint32_t *draft,
                     uint32_t *n_draft)
{
    if (!n_draft) return;
    *n_draft = 0;
    if (!sp || !ctx || !draft) return; /* void: a draft of nothing is the safe answer */
    if (k > KIPP_SPEC_K_MAX) k = KIPP_SPEC_K_MAX;
    *n_draft = k ? lookup(sp, ctx, n_ctx, 0, k, draft) : 0;
    /* Nothing matched: the last token may be a substitution (an edit of the copied
     * text), so match the n-gram before it and copy from after its counterpart. */
    if (k && !*n_draft) *n_draft = lookup(sp, ctx, n_ctx, 1, k, draft);
}

/* ---- the gate ---- */

/* Cost of verifying k drafts (k + 1 rows) in decode steps: the given table, else measured when both row
 * counts were timed, else the linear prior. */
static double verify_cost(const kipp_spec *sp, uint32_t k)
{
    const double *t = sp->t_rows;
    if (sp->fixed_cost[0] > 0) return sp->fixed_cost[k] / sp->fixed_cost[0];
    if (t[1] > 0 && t[k + 1] > 0) return t[k + 1] / t[1];
    return 1.0 + sp->o.row_cost * k;
}

/* Seconds of one decode step: timed, else from the timed row count with the least rows and its cost
 * (a draft model accepted every time never verifies 1 row); 0 when nothing was timed. */
static double decode_step_s(const kipp_spec *sp)
{
    for (uint32_t r = 1; r <= sp->o.k_max + 1; r++)
        if (sp->t_rows[r] > 0) return sp->t_rows[r] / verify_cost(sp, r - 1);
    return 0.0;
}

/* Verification cost plus a draft model's k evaluations, in decode steps. */
static double gate_cost(const kipp_spec *sp, uint32_t k)
{
    double step = sp->dm && sp->t_deval > 0 ? decode_step_s(sp) : 0.0;
    double draft = !sp->dm ? 0.0 : k * (step > 0 ? sp->t_deval / step : sp->draft_prior);
    return verify_cost(sp, k) + draft;
}

/* The k in 0..k_max maximising (1 + a + ... + a^k) / cost(k). */
static uint32_t gate_best_k(const kipp_spec *sp)
{
    double a = sp->acc / (sp->acc + sp->rej), e = 0.0, term = 1.0, best = 0.0;
    uint32_t best_k = 0;
    for (uint32_t k = 0; k <= sp->o.k_max; k++) {
        e += term;
        term *= a;
        double v = e / gate_cost(sp, k);
        if (v > best * (1.0 + 1e-9)) best = v, best_k = k;
    }
    return best_k;
}

double kipp_spec_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Fold one verification's wall time into the average for its row count. */
static void gate_time(kipp_spec *sp, uint32_t rows, double secs)
{
    double *t = &sp->t_rows[rows];
    *t = *t > 0 ? 0.8 * *t + 0.2 * secs : secs;
}

/* The draft length for this step: the gate's k, or a 1-token probe when paused long enough. */
static uint32_t gate_k(kipp_spec *sp)
{
    if (sp->o.fixed_k) return sp->o.k_max;
    sp->st.k_now = gate_best_k(sp);
    uint32_t k = sp->st.k_now;
    if (k && sp->dm && k > sp->ramp) k = sp->ramp; /* a draft model's slow start */
    if (k) return k > sp->o.draft_min ? k : sp->o.draft_min;
    return sp->idle >= sp->probe_every ? 1u : 0u;
}

static void gate_update(kipp_spec *sp, uint32_t drafted, uint32_t accepted)
{
    if (sp->o.fixed_k) return;
    if (!drafted) {
        if (!sp->st.k_now) sp->idle++;
        return;
    }
    if (!sp->st.k_now) { /* that was a probe: back off further when it failed */
        sp->idle = 0;
        /* a draft model's probe first evaluates the paused stretch in the draft: rarer probes */
        uint32_t most = sp->dm ? GATE_PROBE_MAX * 4 : GATE_PROBE_MAX;
        uint32_t least = sp->dm ? GATE_PROBE_DRAFT_MIN : GATE_PROBE_MIN;
        sp->probe_every = accepted ? least : (sp->probe_every * 2 > most ? most : sp->probe_every * 2);
    }
    if (accepted == drafted && sp->ramp < sp->o.k_max) sp->ramp *= 2; /* a whole draft taken: allow twice as long */
    sp->acc = sp->acc * GATE_DECAY + accepted;
    sp->rej = sp->rej * GATE_DECAY + (accepted < drafted ? 1.0 : 0.0);
    sp->st.k_now = gate_best_k(sp);
}

/* ---- the step ---- */

int kipp_spec_params_ok(const kipp_sample_params *p)
{
    return p && (p->temperature == 0.0f || p->top_p == 0.0f || p->top_k == 1);
}


int kipp_spec_hist_reserve(kipp_spec *sp, size_t n, char *err, size_t errlen)
{
    if (n <= sp->hist_cap) return 0;
    uint32_t *h = realloc(sp->hist, n * sizeof *h);
    if (!h) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for a %zu-token sampling history", n);
    sp->hist = h, sp->hist_cap = n;
    return 0;
}

int kipp_spec_rows_begin(kipp_spec *sp, const kipp_sample_params *p, uint32_t n_draft, kipp_sample_params *rp,
                         char *err, size_t errlen)
{
    /* the caller's history plus the rows' emitted tokens */
    int rc = kipp_spec_hist_reserve(sp, p->history_len + n_draft + 1, err, errlen);
    if (rc) return rc;
    if (p->history_len) memcpy(sp->hist, p->history, p->history_len * sizeof *sp->hist);
    *rp = *p;
    rp->history = sp->hist;
    return 0;
}

/* Sample the verified rows in order; returns the count emitted into out, or a KIPP_E* code. */
static int sample_rows(kipp_spec *sp, const kipp_sample_params *p, kipp_rng *rng, const float *logits, const uint32_t *draft,
                       uint32_t n_draft, uint32_t max_new, uint32_t *out, uint32_t *accepted, char *err, size_t errlen)
{
    kipp_sample_params rp;
    int rc = kipp_spec_rows_begin(sp, p, n_draft, &rp, err, errlen);
    if (rc) return rc;
    uint32_t n = 0;
    *accepted = 0;
    for (uint32_t r = 0; r <= n_draft; r++) {
        uint32_t t;
        rp.history_len = p->history_len + n; /* row r follows pending + out[0..n) */
        rc = kipp_sample_ex(logits + (size_t)r * sp->vocab, sp->vocab, &rp, rng, &t, err, errlen);
        if (rc) return rc;
        out[n] = t;
        sp->hist[p->history_len + n] = t;
        n++;
        int match = r < n_draft && t == draft[r]; /* row r+1 is valid only after a match */
        *accepted += (uint32_t)match;
        if (!match || kipp_spec_is_stop(sp, t) || n >= max_new) break;
    }
    return (int)n;
}

/* A session of another model is refused unless its ids mean the same: its
 * rows must fit the [vocab] logits buffer, and the drafted ids, stop ids and
 * reference were taken from the drafter's model's tokenizer. */
static int check_model(kipp_spec *sp, const kipp_session *s, char *err, size_t errlen)
{
    const kipp_model *m = s->model;
    if (m == sp->model) return 0;
    if (m->view.dims.vocab_size != sp->vocab)
        return kipp_err(err, errlen, KIPP_EINVAL, "kipp_spec: the session's model has a vocabulary of %u tokens and "
                        "the drafter's %u, expected a session of the drafter's model (or one with its vocabulary "
                        "and tokenizer)", m->view.dims.vocab_size, sp->vocab);
    if (m == sp->same) return 0;
    if (!kipp_tokenizer_same(m->tok, sp->model->tok))
        return kipp_err(err, errlen, KIPP_EINVAL, "kipp_spec: the session's model and the drafter's both have %u "
                        "tokens but different tokenizers, expected a session of the drafter's model (or one with "
                        "its tokenizer)", sp->vocab);
    sp->same = m;
    return 0;
}

/* Session length, capacity and parameter checks shared by step and propose. */
static int check_step(kipp_spec *sp, kipp_session *s, const uint32_t *ctx, size_t n_ctx, uint32_t max_new,
                      const kipp_sample_params *p, char *err, size_t errlen)
{
    if (!sp || !s || !ctx || !n_ctx)
        return kipp_err(err, errlen, KIPP_EINVAL, "kipp_spec: NULL drafter, session or context, or an empty context");
    int rc = check_model(sp, s, err, errlen);
    if (rc) return rc;
    if (p && !kipp_spec_params_ok(p) && !sp->dm)
        return kipp_err(err, errlen, KIPP_EINVAL,
                        "speculative decoding needs deterministic sampling (temperature 0, top_p 0 or top_k 1), "
                        "got temperature %g top_p %g top_k %d", (double)p->temperature, (double)p->top_p, p->top_k);
    if (max_new == 0) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_spec: max_new is 0, expected at least 1");
    uint32_t len = kipp_session_length(s), cap = kipp_session_capacity(s);
    if (len >= cap)
        return kipp_err(err, errlen, KIPP_ERANGE, "the session is full (%u of %u tokens): no room to evaluate", len, cap);
    return 0;
}

int kipp_spec_propose_ex(kipp_spec *sp, kipp_session *s, const uint32_t *ctx, size_t n_ctx, uint32_t max_new,
                         const kipp_sample_params *p, kipp_rng *rng, uint32_t *tokens, uint32_t *n_tokens, char *err,
                         size_t errlen)
{
    if (n_tokens) *n_tokens = 0;
    if (!tokens || !n_tokens) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_spec_propose: NULL tokens or n_tokens");
    int rc = check_step(sp, s, ctx, n_ctx, max_new, NULL, err, errlen);
    if (rc) return rc;
    uint32_t k = gate_k(sp), room = kipp_session_capacity(s) - kipp_session_length(s) - 1, n_draft = 0;
    if (k > room) k = room;               /* the draft must fit the context */
    if (k > max_new - 1) k = max_new - 1; /* at most max_new tokens come out */
    tokens[0] = ctx[n_ctx - 1];
    if (k && sp->dm)
        rc = kipp_spec_draft_model(sp, ctx, n_ctx, k, kipp_session_capacity(s), p, rng, tokens + 1, &n_draft, err,
                                   errlen);
    else if (k) kipp_spec_draft(sp, ctx, n_ctx, k, tokens + 1, &n_draft);
    if (!k || !sp->dm) sp->sampled = 0;
    *n_tokens = n_draft + 1;
    return rc;
}

int kipp_spec_propose(kipp_spec *sp, kipp_session *s, const uint32_t *ctx, size_t n_ctx, uint32_t max_new,
                      uint32_t *tokens, uint32_t *n_tokens, char *err, size_t errlen)
{
    return kipp_spec_propose_ex(sp, s, ctx, n_ctx, max_new, NULL, NULL, tokens, n_tokens, err, errlen);
}

int kipp_spec_accept(kipp_spec *sp, kipp_session *s, const uint32_t *tokens, uint32_t n_tokens, const float *logits,
                     const kipp_sample_params *p, kipp_rng *rng, uint32_t max_new, uint32_t *out, uint32_t *n_out,
                     char *err, size_t errlen)
{
    if (n_out) *n_out = 0;
    if (!sp || !s || !tokens || !logits || !p || !rng || !out || !n_out || n_tokens < 1 || n_tokens > sp->o.k_max + 1 ||
        max_new == 0 || kipp_session_length(s) < n_tokens)
        return kipp_err(err, errlen, KIPP_EINVAL, "kipp_spec_accept: %u evaluated tokens, expected 1..%u in the session "
                        "and non-NULL buffers", n_tokens, sp ? sp->o.k_max + 1 : 0);
    int rc = check_model(sp, s, err, errlen);
    if (rc) return rc;
    if (!kipp_spec_params_ok(p) && !sp->dm) return check_step(sp, s, tokens, 1, max_new, p, err, errlen);
    uint32_t len = kipp_session_length(s) - n_tokens, n_draft = n_tokens - 1, accepted = 0;
    int n = kipp_spec_params_ok(p) ? sample_rows(sp, p, rng, logits, tokens + 1, n_draft, max_new, out, &accepted, err, errlen)
                                   : kipp_spec_sample_rows(sp, p, rng, logits, tokens + 1, n_draft, max_new, out,
                                                           &accepted, err, errlen);
    /* Keep pending + out[0..n-1): exactly what n plain decode steps would have evaluated.
     * The rollback can fail: tokens that end inside an adopted (shared) pool block
     * need a private copy, and the pool may have none (KIPP_ENOMEM, the session
     * unchanged). kipp_spec_step never gets there (its rows are private), but a
     * caller's own tokens can; they get the error, not an abort. */
    int trc = kipp_session_truncate(s, n > 0 ? len + (uint32_t)n : len, n < 0 ? NULL : err, n < 0 ? 0 : errlen);
    if (n < 0) return n;
    if (trc) return trc;
    sp->st.steps++;
    sp->st.drafted += n_draft;
    sp->st.accepted += accepted;
    sp->st.emitted += (uint32_t)n;
    gate_update(sp, n_draft, accepted);
    *n_out = (uint32_t)n;
    return 0;
}

int kipp_spec_step(kipp_spec *sp, kipp_session *s, const uint32_t *ctx, size_t n_ctx,
                   const kipp_sample_params *p, kipp_rng *rng, uint32_t max_new, uint32_t *out,
                   uint32_t *n_out, char *err, size_t errlen)
{
    if (n_out) *n_out = 0;
    if (!rng || !out || !n_out) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_spec_step: NULL rng, out or n_out");
    int rc = check_step(sp, s, ctx, n_ctx, max_new, p ? p : &(kipp_sample_params){.temperature = 1, .top_p = 1}, err,
                        errlen);
    if (rc) return rc;
    uint32_t tokens[KIPP_SPEC_K_MAX + 1], n_tokens = 0;
    rc = kipp_spec_propose_ex(sp, s, ctx, n_ctx, max_new, p, rng, tokens, &n_tokens, err, errlen);
    double t0 = kipp_spec_now();
    if (!rc) rc = kipp_session_eval_n(s, tokens, n_tokens, n_tokens, sp->logits, err, errlen);
    if (rc) return rc;
    kipp_spec_gate_time(sp, n_tokens, kipp_spec_now() - t0);
    return kipp_spec_accept(sp, s, tokens, n_tokens, sp->logits, p, rng, max_new, out, n_out, err, errlen);
}

void kipp_spec_gate_time(kipp_spec *sp, uint32_t rows, double secs)
{
    /* with a cost table the times only price a draft model's evaluations (decode_step_s) */
    if (sp && !sp->o.fixed_k && (sp->fixed_cost[0] == 0 || sp->dm) && secs > 0 && rows >= 1 && rows <= sp->o.k_max + 1)
        gate_time(sp, rows, secs);
}

uint32_t kipp_spec_gate_next(kipp_spec *sp) { return gate_k(sp); }

void kipp_spec_gate_observe(kipp_spec *sp, uint32_t drafted, uint32_t accepted) { gate_update(sp, drafted, accepted); }

void kipp_spec_get_stats(const kipp_spec *sp, kipp_spec_stats *st)
{
    if (sp && st) *st = sp->st;
}
