/*
 * gen.c - one sequence's generation step (kipp.h "one generation step"): the
 * per-token logic that `kipp generate`, `kipp chat` and kipp-serve share.
 *
 * A kipp_gen is a small state machine around a session it does not own:
 *   prefill   kipp_gen_next hands out prompt chunks of the caller's size; the
 *             chunk that ends the prompt asks for its last row, which is
 *             sampled into the first token.
 *   decode    the pending token (sampled, not yet evaluated) is the item; with
 *             deterministic sampling the drafter (spec.c) adds a prompt-lookup
 *             draft, and kipp_spec_accept turns the rows into 1..17 tokens,
 *             the plain greedy ones. The step's wall time teaches the gate.
 * Every emitted token is detokenized into the reply text, and stop strings
 * are matched only over the bytes a token added (plus the tail a match could
 * straddle), so a long reply costs no rescans. With a grammar, every sample
 * sees only the tokens its matcher allows (speculation is off: drafts know no
 * grammar), and each emitted token advances the matcher; grammar_after keeps
 * the text free until that string appears. The caller evaluates; that is
 * what lets a scheduler put many gens' items into one kipp_eval_batch.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/grammar_impl.h"

struct kipp_gen {
    kipp_model *model;
    kipp_session *s;
    uint32_t vocab;
    uint32_t n_stop_ids, stop_ids[2];
    kipp_sample_params sp;     /* history filled per sample */
    kipp_rng rng;
    uint32_t max_tokens;       /* 0 = until the session is full */
    int prompt_rows;
    uint32_t *hist;            /* [n_prompt + generated] prompt then output; the last is pending once decoding */
    size_t n_hist, cap_hist;
    uint32_t n_prompt, n_done; /* prompt tokens, and how many the session holds after the last advance */
    uint32_t n_redo;           /* tokens held before the last kipp_gen_rebind: evaluated again with no rows */
    uint32_t n_gen;
    int finish;
    kipp_spec *spec;           /* NULL = one token per step */
    kipp_detok_stream *ds;
    char **stop;               /* [n_stop] copies */
    size_t n_stop;
    int stop_hit;              /* index of the stop string that ended the text, -1 = none */
    char *text;                /* [n_text] reply bytes, cut before a stop string */
    size_t n_text, cap_text, n_final;
    /* the pending item */
    int pending;               /* 1: kipp_gen_next gave an item not yet advanced */
    uint32_t first, count, rows;
    uint32_t item[KIPP_SPEC_K_MAX + 1]; /* decode: pending token + draft */
    int spec_step;
    float *logits;             /* [rows_cap][vocab] */
    uint32_t rows_cap;
    /* the event's arrays */
    uint32_t ev_tok[KIPP_SPEC_K_MAX + 1], ev_row[KIPP_SPEC_K_MAX + 1], ev_bytes[KIPP_SPEC_K_MAX + 1];
    /* constrained output */
    kipp_grammar_matcher *gm; /* NULL = free text */
    char *g_after;            /* free until this appears in the text; NULL once constrained */
    int open_pending;         /* the first token may be open_id (grammar_open) instead of a grammar token */
    uint32_t open_id;
    uint64_t *open_mask;      /* the first step's mask: the grammar's plus open_id */
    /* vLLM's min_tokens and include_stop_str_in_output */
    uint32_t min_tokens;
    int keep_stop;
    uint64_t *min_mask;       /* while fewer than min_tokens: every token but the stop ids (and the grammar's) */
    /* the thinking budget (think_* options) */
    int think;                /* THINK_* */
    uint32_t think_left;      /* reasoning tokens still allowed */
    uint32_t think_open_id;
    char *think_close;
    uint32_t force[8], n_force, i_force; /* think_end's tokens, and how many were forced */
};

/* Where the thinking budget stands: off, waiting for the reply's first token
 * to open reasoning, counting reasoning tokens, forcing think_end, over. */
enum { THINK_OFF = 0, THINK_WAIT, THINK_IN, THINK_FORCE };

/* ---- create / destroy ---- */

static int copy_stops(kipp_gen *g, const kipp_gen_options *o, char *err, size_t errlen)
{
    if (o->n_stop > KIPP_GEN_MAX_STOP || (o->n_stop && !o->stop))
        return kipp_err(err, errlen, KIPP_EINVAL, "%zu stop strings given, expected 0..%u and an array", o->n_stop,
                        KIPP_GEN_MAX_STOP);
    g->stop = o->n_stop ? calloc(o->n_stop, sizeof *g->stop) : NULL;
    if (o->n_stop && !g->stop) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for stop strings");
    for (size_t i = 0; i < o->n_stop; i++) {
        size_t n = o->stop[i] ? strlen(o->stop[i]) : 0;
        if (n == 0 || n > KIPP_GEN_MAX_STOP_LEN)
            return kipp_err(err, errlen, KIPP_EINVAL, "stop string %zu has %zu bytes, expected 1..%u", i, n,
                            KIPP_GEN_MAX_STOP_LEN);
        if (!(g->stop[i] = strdup(o->stop[i]))) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for stop strings");
        g->n_stop = i + 1;
    }
    return 0;
}

/* The matcher of o->grammar; grammar_after copied. */
static int grammar_init(kipp_gen *g, const kipp_gen_options *o, char *err, size_t errlen)
{
    if (!o->grammar) {
        if (o->grammar_after || o->grammar_open)
            return kipp_err(err, errlen, KIPP_EINVAL, "grammar_after or grammar_open was given without a grammar");
        return 0;
    }
    if (o->grammar_after && !*o->grammar_after)
        return kipp_err(err, errlen, KIPP_EINVAL, "grammar_after is empty, expected NULL or a string");
    g->gm = kipp_grammar_matcher_create(o->grammar);
    if (o->grammar_open) {
        size_t n = 0;
        uint32_t ids[4];
        if (!o->grammar_after || kipp_tokenize(g->model, o->grammar_open, strlen(o->grammar_open), KIPP_TOK_SPECIAL,
                                               ids, 4, &n, NULL, 0) || n != 1)
            return kipp_err(err, errlen, KIPP_EINVAL, "grammar_open '%.40s' must be one token, and needs grammar_after",
                            o->grammar_open);
        g->open_id = ids[0], g->open_pending = 1;
        if (!(g->open_mask = malloc((g->vocab + 63) / 64 * sizeof *g->open_mask)))
            return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for a constrained generation");
    }
    if (o->grammar_after) g->g_after = strdup(o->grammar_after);
    if (!g->gm || (o->grammar_after && !g->g_after))
        return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for a constrained generation");
    return 0;
}

/* The thinking budget's markers: think_open's id, think_close copied, think_end tokenized. */
static int think_init(kipp_gen *g, const kipp_gen_options *o, char *err, size_t errlen)
{
    if (!o->think_budget_on) return 0;
    size_t n = 0;
    uint32_t ids[4];
    if (!o->think_close || !*o->think_close || !o->think_end ||
        kipp_tokenize(g->model, o->think_end, strlen(o->think_end), KIPP_TOK_SPECIAL, g->force, 8, &n, NULL, 0) || !n)
        return kipp_err(err, errlen, KIPP_EINVAL, "a thinking budget needs think_close and think_end (1..8 tokens)");
    g->n_force = (uint32_t)n;
    if (o->think_open && (kipp_tokenize(g->model, o->think_open, strlen(o->think_open), KIPP_TOK_SPECIAL, ids, 4, &n,
                                        NULL, 0) || n != 1))
        return kipp_err(err, errlen, KIPP_EINVAL, "think_open '%.40s' must be one token", o->think_open);
    g->think_open_id = o->think_open ? ids[0] : 0;
    if (!(g->think_close = strdup(o->think_close))) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory");
    g->think_left = o->think_budget;
    g->think = o->think_open ? THINK_WAIT : o->think_budget ? THINK_IN : THINK_FORCE;
    return 0;
}

/* min_tokens' mask: all tokens but the stop ids. */
static int min_init(kipp_gen *g, const kipp_gen_options *o, char *err, size_t errlen)
{
    g->min_tokens = o->min_tokens, g->keep_stop = o->keep_stop != 0;
    if (!g->min_tokens) return 0;
    size_t words = (g->vocab + 63) / 64;
    if (!(g->min_mask = malloc(2 * words * sizeof *g->min_mask))) /* [words] the mask, [words] scratch */
        return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for min_tokens");
    memset(g->min_mask, 0xff, words * sizeof *g->min_mask);
    if (g->vocab % 64) g->min_mask[words - 1] = (1ull << (g->vocab % 64)) - 1;
    for (uint32_t i = 0; i < g->n_stop_ids; i++)
        if (g->stop_ids[i] < g->vocab) g->min_mask[g->stop_ids[i] >> 6] &= ~(1ull << (g->stop_ids[i] & 63));
    return 0;
}

static int gen_init(kipp_gen *g, const uint32_t *prompt, size_t n_prompt, const kipp_gen_options *o, char *err,
                    size_t errlen)
{
    kipp_model_info info;
    kipp_model_get_info(g->model, &info);
    g->vocab = info.vocab_size;
    g->n_stop_ids = info.n_stop;
    memcpy(g->stop_ids, info.stop_ids, sizeof g->stop_ids);
    g->sp = o->sp;
    g->max_tokens = o->max_tokens;
    g->prompt_rows = o->prompt_rows != 0;
    if (o->rng) g->rng = *o->rng;
    else kipp_rng_seed(&g->rng, o->seed);
    g->n_prompt = (uint32_t)n_prompt;
    g->n_done = kipp_session_length(g->s);
    g->stop_hit = -1;
    int rc = grammar_init(g, o, err, errlen);
    if (!rc) rc = copy_stops(g, o, err, errlen);
    if (!rc) rc = think_init(g, o, err, errlen);
    if (!rc) rc = min_init(g, o, err, errlen);
    if (rc) return rc;
    g->cap_hist = n_prompt + 64;
    g->hist = malloc(g->cap_hist * sizeof *g->hist);
    g->ds = kipp_detok_stream_create(g->model);
    /* drafts know no grammar, budget or min_tokens */
    int spec = o->spec && !o->grammar && !o->think_budget_on && !o->min_tokens &&
               (kipp_spec_params_ok(&o->sp) || o->spec_opts.draft_model); /* a draft model samples too */
    g->rows_cap = g->prompt_rows ? KIPP_GEN_ROWS_CHUNK : 1;
    if (spec && g->rows_cap < KIPP_SPEC_K_MAX + 1) g->rows_cap = KIPP_SPEC_K_MAX + 1;
    g->logits = malloc((size_t)g->rows_cap * g->vocab * sizeof *g->logits);
    if (!g->hist || !g->ds || !g->logits) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for a generation");
    memcpy(g->hist, prompt, n_prompt * sizeof *g->hist);
    g->n_hist = n_prompt;
    if (!spec) return 0;
    kipp_spec_options so = o->spec_opts;
    so.stop_ids = g->stop_ids, so.n_stop = g->n_stop_ids;
    return kipp_spec_create(g->model, &so, &g->spec, err, errlen);
}

int kipp_gen_create(kipp_model *model, kipp_session *s, const uint32_t *prompt, size_t n_prompt,
                    const kipp_gen_options *opts, kipp_gen **out, char *err, size_t errlen)
{
    if (!out) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_gen_create: out is NULL, expected a pointer");
    *out = NULL;
    if (!model || !s || !opts || !prompt || n_prompt == 0)
        return kipp_err(err, errlen, KIPP_EINVAL, "kipp_gen_create: NULL model, session, options or prompt, or an "
                        "empty prompt (%zu tokens), expected at least 1 token", n_prompt);
    if (s->model != model) /* its items would be evaluated by, and sampled for, two different models */
        return kipp_err(err, errlen, KIPP_EINVAL, "kipp_gen_create: the session belongs to another model, expected "
                        "a session of the model the generation samples for");
    uint32_t held = kipp_session_length(s);
    if (n_prompt > UINT32_MAX / 2 || held >= n_prompt)
        return kipp_err(err, errlen, KIPP_EINVAL, "the session already holds %u tokens of a %zu-token prompt, expected "
                        "fewer: the last prompt token's row starts the reply", held, n_prompt);
    kipp_gen *g = calloc(1, sizeof *g);
    if (!g) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for a generation");
    g->model = model, g->s = s;
    int rc = gen_init(g, prompt, n_prompt, opts, err, errlen);
    if (rc) {
        kipp_gen_destroy(g);
        return rc;
    }
    *out = g;
    return 0;
}

void kipp_gen_destroy(kipp_gen *g)
{
    if (!g) return;
    for (size_t i = 0; i < g->n_stop; i++) free(g->stop[i]);
    free(g->stop);
    free(g->hist);
    free(g->text);
    free(g->logits);
    kipp_spec_destroy(g->spec);
    kipp_detok_stream_destroy(g->ds);
    kipp_grammar_matcher_destroy(g->gm);
    free(g->g_after);
    free(g->open_mask);
    free(g->min_mask);
    free(g->think_close);
    free(g);
}

/* ---- next ---- */

/* Tokens the session must hold before the next sample: the prompt, or once
 * decoding every token but the pending one (fewer only after kipp_gen_rebind). */
static uint32_t fill_target(const kipp_gen *g)
{
    return g->n_hist > g->n_prompt ? (uint32_t)g->n_hist - 1 : g->n_prompt;
}

/* Of the next count tokens, how many re-evaluate positions held before a rebind. */
static uint32_t redo_count(const kipp_gen *g, uint32_t count)
{
    uint32_t redo = g->n_redo > g->n_done ? g->n_redo - g->n_done : 0;
    return redo < count ? redo : count;
}

static kipp_sample_params params(const kipp_gen *g);

/* The drafter's item: pending token + draft (a draft model's drawn with the gen's sampler and RNG); 0 tokens
 * when it refuses (bad state only). */
static uint32_t spec_item(kipp_gen *g)
{
    uint32_t left = g->max_tokens ? g->max_tokens - g->n_gen : UINT32_MAX, n = 0;
    kipp_sample_params p = params(g);
    if (kipp_spec_propose_ex(g->spec, g->s, g->hist, g->n_hist, left, &p, &g->rng, g->item, &n, NULL, 0)) return 0;
    return n;
}

int kipp_gen_next(kipp_gen *g, uint32_t max_prefill, kipp_batch_item *it, char *err, size_t errlen)
{
    if (!g || !it) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_gen_next: NULL gen or item");
    *it = (kipp_batch_item){.session = g->s};
    g->pending = 0;
    if (g->finish) return 0;
    g->first = kipp_session_length(g->s);
    uint32_t target = fill_target(g);
    if (g->n_done < target) {
        if (max_prefill == 0)
            return kipp_err(err, errlen, KIPP_EINVAL, "kipp_gen_next: max_prefill is 0 with %u prompt tokens left, "
                            "expected at least 1", target - g->n_done);
        uint32_t left = target - g->n_done;
        if (g->prompt_rows && max_prefill > KIPP_GEN_ROWS_CHUNK) max_prefill = KIPP_GEN_ROWS_CHUNK;
        g->count = left < max_prefill ? left : max_prefill;
        /* rows only for prompt positions never evaluated before: a re-evaluated one already gave its row */
        g->rows = g->n_hist > g->n_prompt ? 0 : g->prompt_rows ? g->count - redo_count(g, g->count) : g->count == left;
        g->spec_step = 0;
        it->tokens = g->hist + g->n_done;
    } else {
        g->spec_step = g->spec && (g->count = spec_item(g)) > 0;
        if (!g->spec_step) g->count = 1, g->item[0] = g->hist[g->n_hist - 1];
        g->rows = g->count;
        it->tokens = g->item;
    }
    it->token_count = g->count;
    it->logits_count = g->rows;
    it->logits = g->rows ? g->logits : NULL;
    g->pending = 1;
    return 0;
}

/* ---- text and stops ---- */

static int text_put(kipp_gen *g, const char *p, size_t n)
{
    if (g->n_text + n + 1 > g->cap_text) {
        size_t cap = (g->n_text + n + 1) * 2 + 64;
        char *t = realloc(g->text, cap);
        if (!t) return KIPP_ENOMEM;
        g->text = t, g->cap_text = cap;
    }
    memcpy(g->text + g->n_text, p, n);
    g->n_text += n;
    g->text[g->n_text] = 0;
    return 0;
}

/* Longest k < plen with text[n-k..n) == pat[0..k): a tail that may still grow into pat. */
static size_t partial_tail(const char *text, size_t n, const char *pat, size_t plen)
{
    for (size_t k = plen - 1 < n ? plen - 1 : n; k > 0; k--)
        if (!memcmp(text + n - k, pat, k)) return k;
    return 0;
}

size_t kipp_stop_scan(const char *const *stop, size_t n_stop, const char *text, size_t n, size_t from,
                      size_t *final_len)
{
    size_t longest = 0, cut = n;
    for (size_t i = 0; i < n_stop; i++) longest = strlen(stop[i]) > longest ? strlen(stop[i]) : longest;
    size_t start = longest && from > longest - 1 ? from - (longest - 1) : 0;
    for (size_t i = 0; i < n_stop; i++) {
        size_t k = strlen(stop[i]);
        for (size_t p = start; p + k <= n && p < cut; p++)
            if (text[p] == stop[i][0] && !memcmp(text + p, stop[i], k)) {
                cut = p;
                break;
            }
    }
    size_t hold = 0;
    for (size_t i = 0; i < n_stop && cut == n; i++) {
        size_t h = partial_tail(text, n, stop[i], strlen(stop[i]));
        hold = h > hold ? h : hold;
    }
    *final_len = cut - hold;
    return cut;
}

/* Match stop strings over the bytes added since `from`; cut the text before
 * the first match. 1 when one matched. */
static int stop_scan(kipp_gen *g, size_t from)
{
    size_t cut = kipp_stop_scan((const char *const *)g->stop, g->n_stop, g->text, g->n_text, from, &g->n_final);
    if (cut == g->n_text) return 0;
    /* which string matched at the cut: the first in order, as kipp_stop_scan picks it among those starting there */
    for (size_t i = 0; i < g->n_stop && g->stop_hit < 0; i++)
        if (cut + strlen(g->stop[i]) <= g->n_text && !memcmp(g->text + cut, g->stop[i], strlen(g->stop[i])))
            g->stop_hit = (int)i;
    if (g->keep_stop && g->stop_hit >= 0) cut += strlen(g->stop[g->stop_hit]); /* include_stop_str_in_output */
    g->n_text = cut;
    g->text[cut] = 0;
    return 1;
}

/* End the generation: flush the detokenizer's held bytes (a stop string may
 * still appear in them; after a stop string's cut there is nothing to add),
 * and make all text final. */
static void finish(kipp_gen *g, int why, int cut)
{
    char buf[256];
    size_t n = 0, from = g->n_text;
    int rc;
    do {
        rc = kipp_detok_stream_flush(g->ds, buf, sizeof buf, &n);
        if (!cut && text_put(g, buf, n)) break;
    } while (rc == KIPP_ERANGE);
    if (!cut && g->n_stop && stop_scan(g, from)) why = KIPP_FIN_STOP;
    g->n_final = g->n_text;
    g->finish = why;
}

static int is_stop_id(const kipp_gen *g, uint32_t id)
{
    for (uint32_t i = 0; i < g->n_stop_ids; i++)
        if (g->stop_ids[i] == id) return 1;
    return 0;
}

/* Advance the grammar by tok, whose text starts at text[from]: its bytes once
 * constrained, else look for g_after, and feed what follows it. */
static int grammar_step(kipp_gen *g, uint32_t tok, size_t from, char *err, size_t errlen)
{
    if (g->open_pending) { /* the first token: the free part's marker, or the constrained reply's first token */
        g->open_pending = 0;
        if (tok != g->open_id) free(g->g_after), g->g_after = NULL;
    }
    if (!g->g_after) {
        if (!kipp_grammar_matcher_accept(g->gm, tok)) return 0;
        return kipp_err(err, errlen, KIPP_EINVAL, "token %u does not continue the constrained output", tok);
    }
    size_t k = strlen(g->g_after), start = from >= k ? from - k + 1 : 0;
    for (size_t p = start; p + k <= g->n_text; p++)
        if (!memcmp(g->text + p, g->g_after, k)) {
            free(g->g_after);
            g->g_after = NULL;
            /* A tail the grammar refuses (the marker spelled by ordinary tokens, text after it in the same one)
             * stays free text: the constrained output starts with the next token, from its beginning. */
            kipp_grammar_matcher_feed(g->gm, g->text + p + k, g->n_text - p - k);
            return 0;
        }
    return 0;
}

/* Tokens the reply may still take, this one and the end of turn included: what max_tokens leaves, and the
 * session's room (the token sampled when it is full is the last, emit's KIPP_FIN_FULL). */
static uint32_t budget_left(const kipp_gen *g)
{
    uint32_t left = g->max_tokens ? g->max_tokens - g->n_gen : UINT32_MAX;
    uint32_t len = kipp_session_length(g->s), cap = kipp_session_capacity(g->s);
    uint32_t room = cap > len ? cap - len + 1 : 1;
    return left < room ? left : room;
}

/* The grammar's mask of allowed tokens now, into p->allowed, within the budget left (grammar_budget.c: near
 * it, only tokens after which the shortest completion still fits); 1 when it allows none (a grammar that
 * cannot be completed: kipp_grammar_create refuses those, so this is a safety net, never an error). */
static int grammar_mask(kipp_gen *g, kipp_sample_params *p, char *err, size_t errlen)
{
    uint32_t n_allowed = 0;
    p->allowed = kipp_grammar_matcher_mask_budget(g->gm, budget_left(g), &n_allowed);
    if (!p->allowed) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for a token mask");
    if (!n_allowed) return 1;
    if (g->open_pending) {
        memcpy(g->open_mask, p->allowed, (g->vocab + 63) / 64 * sizeof *g->open_mask);
        g->open_mask[g->open_id >> 6] |= 1ull << (g->open_id & 63);
        p->allowed = g->open_mask;
    }
    return 0;
}

/* The thinking budget after token tok (its text from text[from]) was emitted. */
static void think_track(kipp_gen *g, uint32_t tok, size_t from)
{
    if (g->think == THINK_WAIT) {
        g->think = tok != g->think_open_id ? THINK_OFF : g->think_left ? THINK_IN : THINK_FORCE;
        return;
    }
    if (g->think == THINK_FORCE) {
        if (++g->i_force == g->n_force) g->think = THINK_OFF;
        return;
    }
    if (g->think != THINK_IN) return;
    size_t k = strlen(g->think_close), start = from >= k ? from - k + 1 : 0;
    for (size_t p = start; p + k <= g->n_text; p++)
        if (!memcmp(g->text + p, g->think_close, k)) {
            g->think = THINK_OFF; /* the model ended its reasoning itself */
            return;
        }
    if (--g->think_left == 0) g->think = THINK_FORCE;
}

/* Emit token tok (sampled from row) into ev; sets g->finish when it ends the
 * generation. last: the step's last token, the pending one, which needs room. */
static int emit(kipp_gen *g, uint32_t tok, uint32_t row, int last, kipp_gen_event *ev, char *err, size_t errlen)
{
    if (is_stop_id(g, tok)) { /* min_tokens masks them until then, but a complete grammar may end the reply */
        finish(g, KIPP_FIN_STOP, 0);
        return 0;
    }
    char buf[256];
    size_t n = 0, from = g->n_text;
    int rc = kipp_detok_stream_push(g->ds, tok, buf, sizeof buf, &n, err, errlen);
    if (!rc && text_put(g, buf, n)) rc = kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for the reply text");
    if (!rc && g->n_hist == g->cap_hist) {
        uint32_t *h = realloc(g->hist, g->cap_hist * 2 * sizeof *h);
        if (!h) rc = kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for the token history");
        else g->hist = h, g->cap_hist *= 2;
    }
    if (!rc && g->gm) rc = grammar_step(g, tok, from, err, errlen);
    if (rc) return rc;
    g->hist[g->n_hist++] = tok;
    g->n_gen++;
    ev->tokens = g->ev_tok, ev->token_row = g->ev_row, ev->token_bytes = g->ev_bytes;
    g->ev_tok[ev->n_tokens] = tok, g->ev_row[ev->n_tokens] = row, g->ev_bytes[ev->n_tokens] = (uint32_t)n;
    ev->n_tokens++;
    think_track(g, tok, from);
    int scan = g->n_stop && g->n_gen > g->min_tokens; /* min_tokens: stop strings count from the token after it */
    if (scan ? stop_scan(g, from) : (g->n_final = g->n_text, 0)) finish(g, KIPP_FIN_STOP, 1);
    else if (g->max_tokens && g->n_gen >= g->max_tokens) finish(g, KIPP_FIN_LENGTH, 0);
    else if (last && kipp_session_length(g->s) >= kipp_session_capacity(g->s)) finish(g, KIPP_FIN_FULL, 0);
    return 0;
}

/* min_tokens: take the stop ids out of p->allowed (the grammar's mask, or all),
 * unless that leaves nothing (a complete grammar allows only them). */
static void min_mask(kipp_gen *g, kipp_sample_params *p)
{
    size_t words = (g->vocab + 63) / 64;
    uint64_t *m = g->min_mask + words, any = 0;
    if (!p->allowed) {
        p->allowed = g->min_mask;
        return;
    }
    for (size_t w = 0; w < words; w++) m[w] = p->allowed[w] & g->min_mask[w], any |= m[w];
    if (any) p->allowed = m;
}

static kipp_sample_params params(const kipp_gen *g)
{
    kipp_sample_params p = g->sp;
    p.history = g->hist, p.history_len = g->n_hist, p.n_prompt_history = g->n_prompt;
    return p;
}

/* A speculative step's rows: the greedy tokens, each emitted from its row, until one ends the generation. */
static int spec_advance(kipp_gen *g, double seconds, kipp_gen_event *ev, char *err, size_t errlen)
{
    uint32_t out[KIPP_SPEC_K_MAX + 1], n = 0, left = g->max_tokens ? g->max_tokens - g->n_gen : UINT32_MAX;
    kipp_sample_params p = params(g);
    kipp_spec_gate_time(g->spec, g->count, seconds);
    int rc = kipp_spec_accept(g->spec, g->s, g->item, g->count, g->logits, &p, &g->rng, left, out, &n, err, errlen);
    for (uint32_t i = 0; !rc && i < n && !g->finish; i++) rc = emit(g, out[i], i, i + 1 == n, ev, err, errlen);
    return rc;
}

int kipp_gen_advance(kipp_gen *g, double seconds, kipp_gen_event *ev, char *err, size_t errlen)
{
    if (!g || !ev) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_gen_advance: NULL gen or event");
    *ev = (kipp_gen_event){.first_pos = g->first, .logits = g->logits, .n_rows = g->rows};
    if (!g->pending) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_gen_advance: no item is pending, expected a "
                                     "kipp_gen_next and its evaluation first");
    g->pending = 0;
    if (g->spec_step) {
        int rc = spec_advance(g, seconds, ev, err, errlen);
        g->n_done = kipp_session_length(g->s); /* the pending token and the accepted drafts */
        return rc;
    }
    uint32_t target = fill_target(g);
    if (g->n_done < target) {
        ev->n_refill = redo_count(g, g->count);
        ev->n_prompt = g->n_hist > g->n_prompt ? 0 : g->count - ev->n_refill;
        ev->n_refill = g->count - ev->n_prompt;
        g->n_done += g->count;
        if (g->n_done < target || g->n_hist > g->n_prompt) return 0; /* decoding resumes with the pending token */
    } else {
        g->n_done += g->count; /* the pending token */
    }
    kipp_sample_params p = params(g);
    uint32_t tok, row = g->rows - 1;
    int constrained = g->gm && (!g->g_after || g->open_pending), rc = constrained ? grammar_mask(g, &p, err, errlen) : 0;
    if (rc == 1) { /* no token can continue: the reply ends here, as if the end of turn were sampled */
        finish(g, KIPP_FIN_STOP, 0);
        return 0;
    }
    if (!rc && g->think == THINK_FORCE) { /* the budget ran out: think_end's next token, not a sample */
        tok = g->force[g->i_force];
        if (!constrained || (p.allowed[tok >> 6] >> (tok & 63) & 1)) return emit(g, tok, row, 1, ev, err, errlen);
        g->think = THINK_OFF; /* the grammar takes over from here */
    }
    if (!rc && g->n_gen < g->min_tokens) min_mask(g, &p);
    if (!rc) rc = kipp_sample_ex(g->logits + (size_t)row * g->vocab, g->vocab, &p, &g->rng, &tok, err, errlen);
    if (!rc && constrained && !(p.allowed[tok >> 6] >> (tok & 63) & 1)) /* the sampler's contract, checked */
        rc = kipp_err(err, errlen, KIPP_EINVAL, "the sampler chose token %u, which the grammar refuses", tok);
    return rc ? rc : emit(g, tok, row, 1, ev, err, errlen);
}

/* ---- accessors ---- */

void kipp_gen_text(const kipp_gen *g, const char **text, size_t *len, size_t *final_len)
{
    if (text) *text = g && g->text ? g->text : "";
    if (len) *len = g ? g->n_text : 0;
    if (final_len) *final_len = g ? g->n_final : 0;
}

void kipp_gen_cancel(kipp_gen *g)
{
    if (!g) return;
    g->pending = 0;
    if (!g->finish) finish(g, KIPP_FIN_CANCELLED, 0);
}

const uint32_t *kipp_gen_tokens(const kipp_gen *g, uint32_t *n)
{
    if (n) *n = g ? fill_target(g) - (g->n_hist > g->n_prompt ? 0 : 1) : 0;
    return g ? g->hist : NULL;
}

uint32_t kipp_gen_prompt_left(const kipp_gen *g) { return g && g->n_done < fill_target(g) ? fill_target(g) - g->n_done : 0; }

int kipp_gen_rebind(kipp_gen *g, kipp_session *s, char *err, size_t errlen)
{
    if (!g || !s) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_gen_rebind: NULL gen or session");
    if (g->finish) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_gen_rebind: the generation has finished");
    if (s->model != g->model)
        return kipp_err(err, errlen, KIPP_EINVAL, "kipp_gen_rebind: the session belongs to another model, expected "
                        "a session of the generation's model");
    uint32_t most, held = kipp_session_length(s);
    kipp_gen_tokens(g, &most);
    if (held > most)
        return kipp_err(err, errlen, KIPP_EINVAL, "kipp_gen_rebind: the session holds %u tokens, expected at most %u "
                        "(a prefix of the generation's tokens)", held, most);
    if (kipp_session_capacity(s) < fill_target(g) + 1)
        return kipp_err(err, errlen, KIPP_EINVAL, "kipp_gen_rebind: the session's capacity %u is below the %u tokens "
                        "the generation holds", kipp_session_capacity(s), fill_target(g) + 1);
    g->s = s, g->pending = 0;
    if (g->n_done > g->n_redo) g->n_redo = g->n_done;
    g->n_done = held;
    return 0;
}
uint32_t kipp_gen_generated(const kipp_gen *g) { return g ? g->n_gen : 0; }
int kipp_gen_finished(const kipp_gen *g) { return g ? g->finish : KIPP_FIN_NONE; }
int kipp_gen_stop_index(const kipp_gen *g) { return g ? g->stop_hit : -1; }
const kipp_spec *kipp_gen_spec(const kipp_gen *g) { return g ? g->spec : NULL; }

void kipp_gen_rng(const kipp_gen *g, kipp_rng *rng)
{
    if (g && rng) *rng = g->rng;
}
