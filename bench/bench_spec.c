/*
 * bench_spec.c - `kipp-bench-spec`: speculative decoding against plain greedy,
 * same process, interleaved (`make bench-spec`).
 *
 *   kipp-bench-spec --model M.gguf [--backend cpu] [--threads N] [--reps N]
 *                   [--tokens N] [--k N] [--profiles DIR] [--out DIR]
 *
 * Synthetic weights are random, so greedy output copies nothing by itself.
 * The workloads therefore fix the acceptance pattern by construction and
 * record it: a first plain greedy run gives the continuation G of the prompt,
 * and the drafter gets a reference text (kipp_spec_set_reference, as OpenAI's
 * "predicted outputs": the document being edited or quoted) built from G:
 *   copy         G with every 10th token changed: an edit of a given text,
 *                about 90% of the tokens copyable;
 *   free         no reference: prompt lookup over the prompt and the reply
 *                only, whatever the model's own repetitions give;
 *   adversarial  G interleaved with wrong tokens, so a draft is offered at
 *                every step and its first token is always wrong: the gate's
 *                worst case.
 * Each repetition runs plain, copy, free, adversarial in turn (A,B,C,D), so the
 * ratios compare runs under the same load; only the decode part is timed. Every
 * speculative run is checked token for token against G ("exact" in the JSON).
 * The cost model times one multi-row evaluation of r = 1..17 rows (all with
 * logits, as verification asks; r = k + 1 for a k-token draft) at the same
 * context, rolled back after each, divided by one decode step (r = 1). It runs
 * first and is handed to the gate (kipp_spec_options.costs) in place of the
 * gate's online timing, so every speculative run of a workload drafts the same
 * way and every run of a workload is the same computation.
 * A backend whose verification rows differ from its decode rows (none now:
 * every backend keeps row invariance, kernels.h) can part from the plain text at a near-tie; then the runs
 * are timed in pattern mode (recorded_pattern), recorded as such in the JSON.
 * With --draft-model FILE (repeatable, up to 4; issue 55) the workloads are
 * plain and one draft-model run per file instead, interleaved the same way:
 * the draft proposes greedily on its own session, the gate prices its
 * evaluations online (and the verification by the cost model), and each run
 * is checked token for token against plain greedy. Its rows report the
 * acceptance, tokens per verification and the speedup over plain.
 * Results: <out>/<YYYYMMDD>-<host>-<cpu id>-spec-<sha>.json (kipp.bench.v1, kind "spec").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_harness.h"
#include "engine/internal.h" /* kipp_spec_gate_time */
#include "engine/kipp.h"
#include "kernels/common.h"

#define N_WORK 4
static const char *WORK[N_WORK] = {"plain", "copy", "free", "adversarial"};
static const char *PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman "
                            "who told the same story every evening.";

#define MAX_DRAFTS 4

typedef struct {
    const char *model, *backend, *profiles, *out;
    int threads, reps, tokens, k;
    const char *draft[MAX_DRAFTS]; /* --draft-model files */
    int n_draft;
} options;

typedef struct {
    kipp_model *m;
    kipp_model_info info;
    uint32_t *prompt;
    size_t n_prompt;
    uint32_t *g;          /* [tokens] plain greedy continuation (the oracle) */
    float *logits;        /* [17][vocab] */
    int tokens;           /* length of g */
    float costs[KIPP_SPEC_K_MAX + 1]; /* [k] measured verify cost of k drafts in decode steps (the gate's table) */
    int pattern;          /* 1: acceptance follows the recorded plain output g (see recorded_pattern) */
    kipp_model *dm[MAX_DRAFTS]; /* the draft models of --draft-model */
    double t_phase[3];    /* the last run_spec's seconds in proposal (drafting), verification, acceptance */
} bench_ctx;

static double median(double *v, int n) { return kipp_median(v, (size_t)n); }

static uint32_t argmax(const float *x, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Plain greedy: prefill, then time tokens-1 one-token decode steps. Writes the ids to out. */
static int run_plain(bench_ctx *b, int tokens, uint32_t *out, double *secs, char *err, size_t errlen)
{
    kipp_session *s = NULL;
    int rc = kipp_session_create(b->m, (uint32_t)(b->n_prompt + tokens + KIPP_SPEC_K_MAX + 1), &s, err, errlen);
    if (!rc) rc = kipp_session_eval(s, b->prompt, (uint32_t)b->n_prompt, b->logits, err, errlen);
    kipp_sample_params p = kipp_sample_params_default();
    kipp_rng rng;
    kipp_rng_seed(&rng, 0);
    double t0 = kipp_timer_now();
    for (int i = 0; !rc && i < tokens; i++) { /* sampled as `kipp generate` does: kipp_sample_ex */
        rc = kipp_sample_ex(b->logits, b->info.vocab_size, &p, &rng, &out[i], err, errlen);
        if (!rc && i + 1 < tokens) rc = kipp_session_eval(s, &out[i], 1, b->logits, err, errlen);
    }
    *secs = kipp_timer_now() - t0;
    kipp_session_destroy(s);
    return rc;
}

/* The reference text of a workload (NULL for none); *n gets its length. */
static uint32_t *reference_for(const bench_ctx *b, int w, int tokens, size_t *n)
{
    uint32_t V = b->info.vocab_size, *r = malloc(2 * (size_t)tokens * sizeof *r);
    *n = 0;
    if (!r || w == 2) return free(r), NULL;
    for (int i = 0; i < tokens; i++) {
        if (w == 1) r[(*n)++] = i % 10 == 9 ? (b->g[i] + 1) % V : b->g[i];
        else r[(*n)++] = b->g[i], r[(*n)++] = (b->g[i] + 7919u) % V; /* each true token then a wrong one */
    }
    return r;
}

/* Pattern mode, for a backend whose verification rows differ slightly from its
 * decode rows: there a run can part from the plain
 * text at a near-tie, after which no reference built from that text predicts
 * it. Row r of a verification at reply position pos then gets g[pos + r] raised
 * to its row's maximum + 1, so the sampled token, and with it the acceptance,
 * follows the recorded plain text: the compute (rows, sampling, rollback) is
 * exactly the speculative step's, and on a row-invariant backend, where the
 * argmax already is g, nothing changes. */
static void recorded_pattern(bench_ctx *b, size_t pos, uint32_t rows)
{
    uint32_t V = b->info.vocab_size;
    for (uint32_t r = 0; r < rows && pos + r < (size_t)b->tokens; r++) {
        float *row = b->logits + (size_t)r * V;
        row[b->g[pos + r]] = row[argmax(row, V)] + 1.0f;
    }
}

/* One speculative run of workload w; checks the ids against the oracle. */
static int run_spec(bench_ctx *b, const options *o, int w, kipp_model *dm, double *secs, kipp_spec_stats *st,
                    int *exact, uint32_t *ids_out, char *err, size_t errlen)
{
    kipp_session *s = NULL;
    kipp_spec *sp = NULL;
    size_t n_ref = 0, n_ctx = b->n_prompt;
    uint32_t *ref = dm ? NULL : reference_for(b, w, o->tokens, &n_ref);
    uint32_t *ctx = malloc((b->n_prompt + (size_t)o->tokens + KIPP_SPEC_K_MAX + 1) * sizeof *ctx);
    kipp_spec_options so = {.k_max = (uint32_t)o->k, .costs = b->costs, .draft_model = dm};
    int rc = ctx ? kipp_spec_create(b->m, &so, &sp, err, errlen) : KIPP_ENOMEM;
    if (!rc && ref) rc = kipp_spec_set_reference(sp, ref, n_ref, err, errlen);
    if (!rc) rc = kipp_session_create(b->m, (uint32_t)(b->n_prompt + o->tokens + KIPP_SPEC_K_MAX + 1), &s, err, errlen);
    if (!rc) rc = kipp_session_eval(s, b->prompt, (uint32_t)b->n_prompt, b->logits, err, errlen);
    if (!rc) memcpy(ctx, b->prompt, b->n_prompt * sizeof *ctx), ctx[n_ctx++] = argmax(b->logits, b->info.vocab_size);
    kipp_sample_params p = kipp_sample_params_default();
    kipp_rng rng;
    kipp_rng_seed(&rng, 0);
    double t0 = kipp_timer_now();
    b->t_phase[0] = b->t_phase[1] = b->t_phase[2] = 0;
    while (!rc && n_ctx < b->n_prompt + (size_t)o->tokens) {
        uint32_t got[KIPP_SPEC_K_MAX + 1], n_got = 0, tok[KIPP_SPEC_K_MAX + 1], n_tok = 0;
        uint32_t left = (uint32_t)(b->n_prompt + o->tokens - n_ctx);
        /* kipp_spec_step's three parts, so pattern mode can steer the acceptance */
        double ta = kipp_timer_now();
        rc = kipp_spec_propose(sp, s, ctx, n_ctx, left, tok, &n_tok, err, errlen);
        double tb = kipp_timer_now();
        if (!rc) rc = kipp_session_eval_n(s, tok, n_tok, n_tok, b->logits, err, errlen);
        double tc = kipp_timer_now();
        if (!rc && b->pattern) recorded_pattern(b, n_ctx - b->n_prompt, n_tok);
        if (!rc) rc = kipp_spec_accept(sp, s, tok, n_tok, b->logits, &p, &rng, left, got, &n_got, err, errlen);
        b->t_phase[0] += tb - ta, b->t_phase[1] += tc - tb, b->t_phase[2] += kipp_timer_now() - tc;
        if (!rc && dm) kipp_spec_gate_time(sp, n_tok, tc - tb); /* prices the draft's evaluations in decode steps */
        for (uint32_t i = 0; !rc && i < n_got; i++) ctx[n_ctx++] = got[i];
    }
    *secs = kipp_timer_now() - t0;
    *exact = !rc && !memcmp(ctx + b->n_prompt, b->g, (size_t)o->tokens * sizeof *ctx);
    if (!rc && ids_out) memcpy(ids_out, ctx + b->n_prompt, (size_t)o->tokens * sizeof *ctx);
    kipp_spec_get_stats(sp, st);
    kipp_spec_destroy(sp);
    kipp_session_destroy(s);
    free(ref), free(ctx);
    return rc;
}

/* Seconds of one r-row evaluation (all rows with logits) at the prompt's context, rolled back. */
static int time_rows(bench_ctx *b, kipp_session *s, uint32_t r, double *secs, char *err, size_t errlen)
{
    uint32_t len = kipp_session_length(s);
    double t0 = kipp_timer_now();
    int rc = kipp_session_eval_n(s, b->g, r, r, b->logits, err, errlen);
    *secs = kipp_timer_now() - t0;
    if (!rc) rc = kipp_session_truncate(s, len, err, errlen);
    return rc;
}

static int cost_model(bench_ctx *b, const options *o, json_t *out, char *err, size_t errlen)
{
    enum { R = KIPP_SPEC_K_MAX + 1 };
    kipp_session *s = NULL;
    int reps = o->reps * 3, rc = kipp_session_create(b->m, (uint32_t)b->n_prompt + R, &s, err, errlen);
    if (!rc) rc = kipp_session_eval(s, b->prompt, (uint32_t)b->n_prompt, NULL, err, errlen);
    double *t = calloc((size_t)R * reps, sizeof *t), med[R + 1];
    for (int i = 0; !rc && i < reps; i++) /* interleaved over r, so load changes hit every r alike */
        for (uint32_t r = 1; !rc && r <= R; r++) rc = time_rows(b, s, r, &t[(size_t)(r - 1) * reps + i], err, errlen);
    for (uint32_t r = 1; !rc && r <= R; r++) med[r] = median(&t[(size_t)(r - 1) * reps], reps);
    for (uint32_t r = 1; !rc && r <= R; r++) {
        json_t *e = json_object();
        json_object_set_new(e, "rows", json_integer(r));
        json_object_set_new(e, "draft_k", json_integer(r - 1));
        json_object_set_new(e, "median_ms", json_real(med[r] * 1e3));
        json_object_set_new(e, "over_decode_step", json_real(med[r] / med[1]));
        json_array_append_new(out, e);
        if (r - 1 <= (uint32_t)o->k) b->costs[r - 1] = (float)(med[r] / med[1]);
        printf("cost: %2u rows (k %2u): %.2f ms = %.3f decode steps\n", r, r - 1, med[r] * 1e3, med[r] / med[1]);
    }
    free(t);
    kipp_session_destroy(s);
    return rc;
}

static json_t *workload_json(int w, double *tps, int reps, const kipp_spec_stats *st, int exact, double plain_med)
{
    json_t *r = json_object();
    double med_tps = median(tps, reps), mn = tps[0], mx = tps[reps - 1]; /* sorted by median() */
    json_object_set_new(r, "name", json_string(WORK[w]));
    json_object_set_new(r, "unit", json_string("tok/s"));
    json_object_set_new(r, "median", json_real(med_tps));
    json_object_set_new(r, "min", json_real(mn));
    json_object_set_new(r, "max", json_real(mx));
    json_object_set_new(r, "reps", json_integer(reps));
    json_object_set_new(r, "over_plain", json_real(med_tps / plain_med));
    if (w) {
        json_object_set_new(r, "drafted", json_integer((json_int_t)st->drafted));
        json_object_set_new(r, "accepted", json_integer((json_int_t)st->accepted));
        json_object_set_new(r, "emitted", json_integer((json_int_t)st->emitted));
        json_object_set_new(r, "forwards", json_integer((json_int_t)st->steps));
        json_object_set_new(r, "acceptance", json_real(st->drafted ? (double)st->accepted / (double)st->drafted : 0.0));
        json_object_set_new(r, "exact", exact < 0 ? json_null() : json_boolean(exact)); /* null: pattern mode */
    }
    return r;
}

/* Whether speculative runs reproduce the plain text on this backend (one copy
 * run); when not, the timed runs use pattern mode (recorded_pattern). */
static int probe_exact(bench_ctx *b, const options *o, int *exact, char *err, size_t errlen)
{
    double secs;
    kipp_spec_stats st;
    int rc = run_spec(b, o, 1, NULL, &secs, &st, exact, NULL, err, errlen);
    b->pattern = !rc && !*exact;
    if (b->pattern)
        printf("note: speculative output parts from plain greedy on this backend (verification rows differ from decode "
               "rows): acceptance follows the recorded plain text (pattern mode)\n");
    return rc;
}

/* The interleaved runs: plain, copy, free, adversarial, reps times. */
static int workloads(bench_ctx *b, const options *o, json_t *results, double *ratio, char *err, size_t errlen)
{
    double *tps = calloc((size_t)N_WORK * o->reps, sizeof *tps), secs = 0;
    uint32_t *scratch = malloc((size_t)o->tokens * sizeof *scratch);
    kipp_spec_stats st[N_WORK] = {{0}};
    int exact[N_WORK] = {1, 1, 1, 1}, rc = tps && scratch ? 0 : KIPP_ENOMEM;
    for (int i = 0; !rc && i < o->reps; i++)
        for (int w = 0; !rc && w < N_WORK; w++) {
            int ex = 1;
            rc = w ? run_spec(b, o, w, NULL, &secs, &st[w], &ex, NULL, err, errlen) : run_plain(b, o->tokens, scratch, &secs, err, errlen);
            if (!w && memcmp(scratch, b->g, (size_t)o->tokens * sizeof *scratch)) ex = 0;
            exact[w] &= ex;
            tps[w * o->reps + i] = (o->tokens - 1) / secs; /* tokens after the first (which the prefill gives) */
            printf("rep %d %-11s %7.1f tok/s%s\n", i, WORK[w], tps[w * o->reps + i], ex ? "" : "  NOT EXACT");
        }
    double plain_med = rc ? 1 : median(tps, o->reps);
    for (int w = 0; !rc && w < N_WORK; w++) {
        json_t *r = workload_json(w, &tps[w * o->reps], o->reps, &st[w], w && b->pattern ? -1 : exact[w], plain_med);
        ratio[w] = json_real_value(json_object_get(r, "over_plain"));
        json_array_append_new(results, r);
    }
    free(tps), free(scratch);
    if (!rc && !b->pattern && !(exact[0] && exact[1] && exact[2] && exact[3]))
        printf("warning: a run's ids differ from the first plain run (\"exact\": false in the JSON)\n");
    return rc;
}

/* The last path component of path. */
static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* Draft-model mode: plain, then one run per draft, reps times, interleaved. ratio[d] = draft d's speedup. */
static int draft_workloads(bench_ctx *b, const options *o, json_t *results, double *ratio, char *err, size_t errlen)
{
    int W = 1 + o->n_draft, rc = 0;
    double *tps = calloc((size_t)W * o->reps, sizeof *tps), secs = 0;
    uint32_t *scratch = malloc((size_t)o->tokens * sizeof *scratch);
    kipp_spec_stats st[1 + MAX_DRAFTS] = {{0}};
    double phase[1 + MAX_DRAFTS][3] = {{0}}; /* summed over repetitions: drafting, verification, acceptance */
    int exact[1 + MAX_DRAFTS] = {1, 1, 1, 1, 1};
    if (!tps || !scratch) rc = KIPP_ENOMEM;
    for (int i = 0; !rc && i < o->reps; i++)
        for (int w = 0; !rc && w < W; w++) {
            int ex = 1;
            kipp_spec_stats one = {0};
            rc = w ? run_spec(b, o, 2, b->dm[w - 1], &secs, &one, &ex, NULL, err, errlen)
                   : run_plain(b, o->tokens, scratch, &secs, err, errlen);
            if (!w && memcmp(scratch, b->g, (size_t)o->tokens * sizeof *scratch)) ex = 0;
            exact[w] &= ex;
            st[w].drafted += one.drafted, st[w].accepted += one.accepted, st[w].emitted += one.emitted;
            st[w].steps += one.steps;
            for (int ph = 0; w && ph < 3; ph++) phase[w][ph] += b->t_phase[ph];
            tps[w * o->reps + i] = (o->tokens - 1) / secs;
            printf("rep %d %-40s %7.2f tok/s  accepted %llu/%llu, %llu tokens in %llu verifications%s\n", i,
                   w ? base_name(o->draft[w - 1]) : "plain", tps[w * o->reps + i], (unsigned long long)one.accepted,
                   (unsigned long long)one.drafted, (unsigned long long)one.emitted, (unsigned long long)one.steps,
                   ex ? "" : "  NOT EXACT");
            fflush(stdout);
        }
    /* per repetition, against that repetition's plain run (load drifts between repetitions); before median()
     * sorts tps in place */
    double paired[1 + MAX_DRAFTS] = {0}, per_rep[64];
    for (int w = 1; !rc && w < W; w++) {
        for (int i = 0; i < o->reps; i++) per_rep[i] = tps[w * o->reps + i] / tps[i];
        paired[w] = median(per_rep, o->reps);
    }
    double plain_med = rc ? 1 : median(tps, o->reps);
    for (int w = 0; !rc && w < W; w++) {
        json_t *r = workload_json(w ? 1 : 0, &tps[w * o->reps], o->reps, &st[w], exact[w], plain_med);
        char name[300];
        snprintf(name, sizeof name, "draft:%s", w ? base_name(o->draft[w - 1]) : "");
        if (w) {
            json_object_set_new(r, "name", json_string(name));
            json_object_set_new(r, "draft_file", json_string(o->draft[w - 1]));
            json_object_set_new(r, "tokens_per_verify", json_real(st[w].steps ? (double)st[w].emitted / st[w].steps : 0));
            double per = 1e3 / ((double)(o->tokens - 1) * o->reps); /* ms per emitted token, mean over the reps */
            json_object_set_new(r, "draft_ms_per_token", json_real(phase[w][0] * per));
            json_object_set_new(r, "verify_ms_per_token", json_real(phase[w][1] * per));
            json_object_set_new(r, "accept_ms_per_token", json_real(phase[w][2] * per));
            ratio[w - 1] = json_real_value(json_object_get(r, "over_plain"));
            json_object_set_new(r, "over_plain_paired_median", json_real(paired[w]));
            printf("%-40s %.3fx plain (paired median %.3fx), acceptance %.1f%%, %.2f tokens per verification, ms per token: draft %.2f, "
                   "verify %.2f, accept %.2f%s\n", base_name(o->draft[w - 1]), ratio[w - 1], paired[w],
                   st[w].drafted ? 100.0 * st[w].accepted / st[w].drafted : 0.0,
                   st[w].steps ? (double)st[w].emitted / st[w].steps : 0.0, phase[w][0] * per, phase[w][1] * per,
                   phase[w][2] * per, exact[w] ? "" : ", NOT EXACT");
        }
        json_array_append_new(results, r);
    }
    free(tps), free(scratch);
    return rc;
}

static void usage(FILE *f)
{
    char backends[128];
    fprintf(f, "usage: kipp-bench-spec --model M.gguf [--backend %s] [--threads N] [--reps N (1..64, default 5)]\n"
               "                       [--tokens N (32..1024, default 192)] [--k N (1..16, default 8)]\n"
               "                       [--profiles DIR] [--out DIR] [--draft-model FILE (repeatable, up to 4)]\n",
               kipp_backend_names(backends, sizeof backends, "|"));
}

static int parse_int(const char *flag, const char *v, int lo, int hi, int *out)
{
    char *end = NULL;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || x < lo || x > hi) {
        fprintf(stderr, "kipp-bench-spec: %s '%s' is invalid, expected an integer in %d..%d\n", flag, v ? v : "", lo, hi);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int parse_args(int argc, char **argv, options *o)
{
    *o = (options){.backend = "cpu", .profiles = "profiles", .out = "results", .reps = 5, .tokens = 192, .k = 8};
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout), 1;
        if (!strcmp(a, "--model") && v) o->model = v;
        else if (!strcmp(a, "--backend") && v) o->backend = v;
        else if (!strcmp(a, "--profiles") && v) o->profiles = v;
        else if (!strcmp(a, "--out") && v) o->out = v;
        else if (!strcmp(a, "--draft-model") && v) {
            if (o->n_draft == MAX_DRAFTS)
                return fprintf(stderr, "kipp-bench-spec: more than %d --draft-model files, expected at most %d\n",
                               MAX_DRAFTS, MAX_DRAFTS), -1;
            o->draft[o->n_draft++] = v;
        }
        else if (!strcmp(a, "--threads")) { if (parse_int(a, v, 0, 1024, &o->threads)) return -1; }
        else if (!strcmp(a, "--reps")) { if (parse_int(a, v, 1, 64, &o->reps)) return -1; }
        else if (!strcmp(a, "--tokens")) { if (parse_int(a, v, 32, 1024, &o->tokens)) return -1; }
        else if (!strcmp(a, "--k")) { if (parse_int(a, v, 1, KIPP_SPEC_K_MAX, &o->k)) return -1; }
        else { fprintf(stderr, "kipp-bench-spec: unknown or incomplete argument '%s'\n", a); usage(stderr); return -1; }
    }
    if (!o->model) return fprintf(stderr, "kipp-bench-spec: missing required option --model (expected a .gguf path)\n"), -1;
    return 0;
}


static int open_model(bench_ctx *b, const options *o, char *err, size_t errlen)
{
    kipp_model_options mo = {.n_threads = o->threads};
    int rc = kipp_model_open(o->model, o->backend, &mo, &b->m, err, errlen);
    if (rc) return rc;
    kipp_model_get_info(b->m, &b->info);
    size_t cap = strlen(PROMPT) + 16;
    b->prompt = malloc(cap * sizeof *b->prompt);
    b->g = malloc((size_t)o->tokens * sizeof *b->g);
    b->tokens = o->tokens;
    b->logits = malloc((size_t)(KIPP_SPEC_K_MAX + 1) * b->info.vocab_size * sizeof *b->logits);
    if (!b->prompt || !b->g || !b->logits) return KIPP_ENOMEM;
    for (int d = 0; d < o->n_draft; d++) {
        char why[512];
        rc = kipp_model_open(o->draft[d], o->backend, &mo, &b->dm[d], why, sizeof why);
        if (!rc) rc = kipp_draft_check(b->m, b->dm[d], why, sizeof why);
        if (rc) { /* main prints err after "kipp-bench-spec: " */
            fprintf(stderr, "kipp-bench-spec: --draft-model '%s' for --model '%s':\n", o->draft[d], o->model);
            snprintf(err, errlen, "%s", why);
            return rc;
        }
    }
    return kipp_tokenize(b->m, PROMPT, strlen(PROMPT), 0, b->prompt, cap, &b->n_prompt, err, errlen);
}

/* The speedup targets, checked on the medians of this run. */
static json_t *targets(const double *ratio, json_t *cost)
{
    json_t *t = json_object();
    double k8 = json_real_value(json_object_get(json_array_get(cost, 8), "over_decode_step")); /* 9 rows */
    json_object_set_new(t, "copy_over_plain_min", json_real(2.0));
    json_object_set_new(t, "copy_met", json_boolean(ratio[1] >= 2.0));
    json_object_set_new(t, "low_acceptance_over_plain_min", json_real(0.95));
    json_object_set_new(t, "free_met", json_boolean(ratio[2] >= 0.95));
    json_object_set_new(t, "adversarial_met", json_boolean(ratio[3] >= 0.95));
    json_object_set_new(t, "verify_k8_over_decode_max", json_real(1.5));
    json_object_set_new(t, "verify_k8_over_decode", json_real(k8));
    json_object_set_new(t, "verify_k8_met", json_boolean(k8 <= 1.5));
    printf("targets: copy %.2fx (>= 2), free %.2fx, adversarial %.2fx (>= 0.95), verify k=8 (9 rows) %.2f decode steps (<= 1.5)\n",
           ratio[1], ratio[2], ratio[3], k8);
    return t;
}

int main(int argc, char **argv)
{
    options o;
    char err[512] = "";
    int prc = parse_args(argc, argv, &o);
    if (prc) return prc > 0 ? 0 : 2;
    bench_ctx b = {0};
    double secs = 0, ratio[N_WORK] = {0};
    int rc = open_model(&b, &o, err, sizeof err);
    if (!rc) rc = run_plain(&b, o.tokens, b.g, &secs, err, sizeof err); /* the oracle, and a warm-up */
    kipp_profile prof;
    memset(&prof, 0, sizeof prof);
    kipp_profile_load(&prof, o.profiles, NULL, 0);
    json_t *config = json_object();
    json_object_set_new(config, "model", json_string(b.m ? b.info.checkpoint_id : o.model));
    json_object_set_new(config, "backend", json_string(o.backend));
    json_object_set_new(config, "threads", json_integer(o.threads ? o.threads : kipp_team_cores()));
    json_object_set_new(config, "isa", json_string(kipp_isa_name(kipp_isa_select(NULL))));
    json_object_set_new(config, "reps", json_integer(o.reps));
    json_object_set_new(config, "tokens", json_integer(o.tokens));
    json_object_set_new(config, "k_max", json_integer(o.k));
    json_object_set_new(config, "prompt_tokens", json_integer((json_int_t)b.n_prompt));
    json_object_set_new(config, "order", json_string(o.n_draft ? "interleaved per repetition: plain, then each draft model"
                                                               : "interleaved per repetition: plain, copy, free, adversarial"));
    json_t *drafts = json_array();
    for (int d = 0; d < o.n_draft; d++) json_array_append_new(drafts, json_string(o.draft[d]));
    json_object_set_new(config, "draft_models", drafts);
    json_object_set_new(config, "copy", json_string("reference = plain greedy output with every 10th token changed"));
    json_object_set_new(config, "free", json_string("no reference: prompt lookup over prompt + reply only"));
    json_object_set_new(config, "adversarial", json_string("reference = plain greedy output interleaved with wrong tokens"));
    json_object_set_new(config, "load_avg_1min_at_start", json_real(kipp_load_average()));
    json_t *doc = kipp_result_create("spec", prof.loaded ? prof.path : NULL, config);
    json_object_set_new(doc, "cpu", kipp_cpu_json());
    json_t *results = json_object_get(doc, "results"), *cost = json_array();
    int exact = 0;
    if (!rc) rc = cost_model(&b, &o, cost, err, sizeof err); /* first: the gate prices drafts with it */
    if (!rc && !o.n_draft) rc = probe_exact(&b, &o, &exact, err, sizeof err);
    else exact = 1;
    json_object_set_new(config, "spec_exact_unsteered", json_boolean(exact));
    json_object_set_new(config, "acceptance_source", json_string(b.pattern ?
        "pattern mode: each verified row's sampled token is steered to the recorded plain greedy text (this backend's "
        "verification rows are not bitwise its decode rows); compute identical to kipp_spec_step" :
        "the rows' own greedy tokens (kipp_spec_accept), checked equal to plain greedy"));
    double dratio[MAX_DRAFTS] = {0};
    if (!rc && o.n_draft) rc = draft_workloads(&b, &o, results, dratio, err, sizeof err);
    else if (!rc) rc = workloads(&b, &o, results, ratio, err, sizeof err);
    json_object_set_new(config, "load_avg_1min_at_end", json_real(kipp_load_average()));
    json_object_set_new(doc, "cost_model", cost);
    if (!rc && !o.n_draft) json_object_set_new(doc, "targets", targets(ratio, cost));
    char path[512];
    if (!rc && kipp_result_write(doc, o.out, "spec", path, sizeof path, err, sizeof err) == 0) printf("wrote %s\n", path);
    else if (!rc) rc = -1;
    if (rc) fprintf(stderr, "kipp-bench-spec: %s\n", err[0] ? err : kipp_strerror(rc));
    json_decref(doc);
    free(b.prompt), free(b.g), free(b.logits);
    for (int d = 0; d < o.n_draft; d++) kipp_model_close(b.dm[d]);
    kipp_model_close(b.m);
    return rc ? 1 : 0;
}
