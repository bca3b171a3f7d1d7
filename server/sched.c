/*
 * sched.c - the FIFO continuous-batching scheduler (seed 000 phase 5; issue 9
 * item 6). One thread owns every session. Each step:
 *   1. frees the choices of cancelled jobs (client gone) at once;
 *   2. admits queued jobs, in order, while the total choice count fits
 *      max_choices (a job is admitted whole: all n choices); on a pooled
 *      model each choice first adopts the longest published prefix of its
 *      prompt (kipp_session_match_prefix), and the job is admitted only when
 *      the pool can hold the worst case of every choice (issue 10, below);
 *   3. gives every active choice one item: its next 32-token prompt chunk
 *      (chunked prefill) or its one decode token, and evaluates them all with
 *      one kipp_eval_batch, so the weights are read once per step;
 *   4. samples (kipp_sample_ex), detokenizes and publishes under the lock.
 * Greedy choices (temperature 0, top_p 0 or top_k 1; unless --no-spec) decode
 * speculatively: their item carries the pending token plus a prompt-lookup
 * draft (kipp_spec_propose) with a logits row each, in the same batch, and
 * kipp_spec_accept turns the rows into 1..17 tokens, the plain greedy ones.
 * Request state (serve_job) is shared with the HTTP threads under `mu`; the
 * engine is used under `engine` (lock order: mu, then engine). Each choice has
 * its own session, so results equal isolated evaluation, and a fixed seed
 * gives the same tokens alone or batched.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/serve.h"

typedef struct {
    serve_job *job;
    int idx;
    kipp_session *s;
    uint32_t n_done;          /* prompt tokens evaluated */
    uint32_t *hist;           /* [n_hist] prompt + generated, for penalties */
    size_t n_hist;
    uint32_t next_tok;        /* generated token to evaluate next */
    kipp_rng rng;
    kipp_detok_stream *ds;
    float *logits;            /* [rows_cap][vocab] */
    uint32_t rows_cap, rows;  /* rows requested this step */
    uint32_t first;           /* position of this step's first token */
    uint32_t count;           /* tokens in this step's item */
    kipp_spec *spec;          /* greedy choices: the drafter; NULL = one token per step */
    uint32_t spec_tok[KIPP_SPEC_K_MAX + 1]; /* this step's pending token + draft */
    int spec_step;            /* 1: this step's item is spec_tok[count], a row each */
    int echo;                 /* 1: prompt rows get logits (echo + logprobs) */
} sched_choice;

struct serve_sched {
    kipp_model *m;
    kipp_model_info info;
    serve_sched_opts o;
    pthread_mutex_t mu, engine;
    pthread_cond_t cv;
    pthread_t th;
    int stop, started;
    serve_job *head, *tail;
    int n_queued;
    sched_choice *act[64];
    int n_act;
    uint64_t seed_salt;
    uint64_t n_finished;      /* choices finished so far: pool room can only grow when this moves */
    serve_job *blocked;       /* head job last refused for pool room, retried once n_finished moves */
    uint64_t blocked_at;      /* n_finished at that refusal */
};

double serve_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

pthread_mutex_t *serve_sched_mutex(serve_sched *s) { return &s->mu; }
pthread_mutex_t *serve_engine_mutex(serve_sched *s) { return &s->engine; }

serve_job *serve_job_new(serve_req *req)
{
    static uint64_t next_id = 1;
    serve_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->req = *req;
    memset(req, 0, sizeof *req);
    j->id = __atomic_fetch_add(&next_id, 1, __ATOMIC_RELAXED);
    j->created = (int64_t)time(NULL);
    j->t_arrive = serve_now();
    j->refs = 1;
    return j;
}

void serve_job_unref(serve_job *j)
{
    if (!j || --j->refs > 0) return;
    for (int i = 0; i < SERVE_MAX_N; i++) serve_buf_free(&j->out[i].raw), free(j->out[i].lp);
    free(j->prompt_top);
    serve_req_free(&j->req);
    free(j);
}

void serve_sched_wait(serve_sched *s, int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&s->cv, &s->mu, &ts);
}

void serve_sched_cancel(serve_sched *s, serve_job *j)
{
    if (!j->done && !j->cancelled) serve_metrics_get()->cancelled++;
    j->cancelled = 1;
    pthread_cond_broadcast(&s->cv);
}

static uint64_t blocks_of(uint32_t cap) { return (cap + 31) / 32; }

/* KV blocks a job's sessions hold: n choices of prompt + max_tokens positions. */
static uint64_t job_blocks(const serve_job *j)
{
    return (uint64_t)j->req.n * blocks_of((uint32_t)(j->req.n_prompt + (size_t)j->req.max_tokens));
}

/* What a choice may generate, as the client set it: a sent max_tokens (or
 * max_completion_tokens), cut to the context, or the default when none was. */
static void gen_text(const serve_req *r, char *buf, size_t cap)
{
    const char *f = r->max_tokens_field;
    long long g = (long long)r->max_tokens, asked = (long long)r->max_tokens_asked;
    if (asked < 0 && r->chat)
        snprintf(buf, cap, "%lld generated (no max_tokens was sent, so the rest of the context)", g);
    else if (asked < 0)
        snprintf(buf, cap, "%lld generated (no max_tokens was sent: the completions default 16%s)", g,
                 g < 16 ? ", cut to the rest of the context" : "");
    else if (asked > g)
        snprintf(buf, cap, "%lld generated (%s %lld, cut to the rest of the context)", g, f, asked);
    else
        snprintf(buf, cap, "%lld %s", g, f);
}

/* The 400 for a job whose worst case alone exceeds the KV budget. It names
 * the generation budget as the client set it and the one change that fits:
 * a smaller max_tokens, else fewer choices, else a shorter prompt (a choice
 * needs its prompt and one generated position), with `param` on that field. */
static int budget_fail(const serve_sched *s, const serve_job *j, uint64_t budget, serve_error *e)
{
    const serve_req *r = &j->req;
    const char *flag = s->o.pool_blocks ? "--kv-pool-mib" : "--kv-mib";
    char gen[160], hint[160];
    gen_text(r, gen, sizeof gen);
    int64_t fit = (int64_t)(budget / (uint64_t)r->n * 32) - (int64_t)r->n_prompt; /* a choice's room to generate */
    uint64_t min_blocks = blocks_of((uint32_t)(r->n_prompt + 1)), n_fit = budget / min_blocks;
    const char *param = r->max_tokens_field;
    if (fit > 0)
        snprintf(hint, sizeof hint, "send %s <= %lld%s", r->max_tokens_field, (long long)fit, r->n > 1 ? " or lower n" : "");
    else if (n_fit > 0)
        param = "n", snprintf(hint, sizeof hint, "lower n to at most %llu with this prompt", (unsigned long long)n_fit);
    else
        param = r->chat ? "messages" : "prompt", snprintf(hint, sizeof hint, "shorten the prompt");
    serve_fail(e, 400, "invalid_request_error", param,
               "n %d x (%zu prompt + %s) positions need %llu KV blocks of 32, above the server's budget of %llu (%s); "
               "%s, or start kipp-serve with a larger %s", r->n, r->n_prompt, gen, (unsigned long long)job_blocks(j),
               (unsigned long long)budget, flag, hint, flag);
    snprintf(e->code, sizeof e->code, "kv_budget_exceeded");
    return -1;
}

int serve_sched_submit(serve_sched *s, serve_job *j, serve_error *e)
{
    uint64_t budget = s->o.pool_blocks ? s->o.pool_blocks : s->o.kv_budget_blocks;
    if (job_blocks(j) > budget) return budget_fail(s, j, budget, e);
    pthread_mutex_lock(&s->mu);
    if (s->n_queued >= s->o.max_queue) {
        int q = s->n_queued;
        pthread_mutex_unlock(&s->mu);
        serve_fail(e, 429, "rate_limit_error", "", "the request queue is full (%d requests waiting, limit %d); retry later",
                   q, s->o.max_queue);
        snprintf(e->code, sizeof e->code, "queue_full");
        return -1;
    }
    j->refs++;
    j->queued = 1;
    if (s->tail) s->tail->next = j;
    else s->head = j;
    s->tail = j;
    s->n_queued++;
    serve_metrics_get()->queue_depth = s->n_queued;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* ---- choices ---- */

static void choice_free(serve_sched *s, sched_choice *c)
{
    serve_metrics *mt = serve_metrics_get();
    if (c->s && !s->o.pool_blocks) mt->kv_blocks -= blocks_of(kipp_session_capacity(c->s));
    kipp_session_destroy(c->s); /* pooled: publishes the choice's full blocks (publish-at-finish) */
    kipp_spec_destroy(c->spec);
    kipp_detok_stream_destroy(c->ds);
    free(c->hist);
    free(c->logits);
    free(c);
    (void)s;
}

/* Finish choice k (mu and engine held): flush the detokenizer, cut at a stop
 * string, publish, free its session at once. */
static void choice_finish(serve_sched *s, int k, int why)
{
    sched_choice *c = s->act[k];
    serve_job *j = c->job;
    serve_choice_out *o = &j->out[c->idx];
    char buf[256];
    size_t n = 0;
    while (c->ds && why != FIN_CANCELLED) {
        int rc = kipp_detok_stream_flush(c->ds, buf, sizeof buf, &n);
        serve_buf_put(&o->raw, buf, n);
        if (rc != KIPP_ERANGE) break;
    }
    size_t stop_at;
    serve_view v;
    serve_text_view(&j->req, o->raw.p ? o->raw.p : "", o->raw.n, 1, &stop_at, &v);
    if (stop_at < o->raw.n) o->raw.n = stop_at, o->raw.p[stop_at] = 0, why = why == FIN_LENGTH ? FIN_STOP : why;
    o->raw_final = o->raw.n;
    o->finish = why;
    s->n_finished++;
    choice_free(s, c);
    s->act[k] = s->act[--s->n_act];
    serve_metrics_get()->active_choices = s->n_act;
    int all = 1;
    for (int i = 0; i < j->req.n; i++) all &= j->out[i].finish != FIN_NONE;
    if (all && !j->done) {
        j->done = 1;
        serve_job_unref(j);
    }
}

static int choice_new(serve_sched *s, serve_job *j, int idx, char *err, size_t errlen)
{
    sched_choice *c = calloc(1, sizeof *c);
    const serve_req *r = &j->req;
    int echo_rows = r->echo && r->logprobs && idx == 0;
    if (!c) return KIPP_ENOMEM;
    c->job = j, c->idx = idx;
    c->rows_cap = echo_rows ? SERVE_CHUNK : 1;
    c->echo = echo_rows;
    int spec = !s->o.no_spec && kipp_spec_params_ok(&r->sp);
    if (spec && c->rows_cap < KIPP_SPEC_K_MAX + 1) c->rows_cap = KIPP_SPEC_K_MAX + 1;
    c->hist = malloc((r->n_prompt + (size_t)r->max_tokens + 1) * sizeof *c->hist);
    c->logits = malloc((size_t)c->rows_cap * s->info.vocab_size * sizeof *c->logits);
    c->ds = kipp_detok_stream_create(s->m);
    uint32_t cap = (uint32_t)(r->n_prompt + (size_t)r->max_tokens);
    int rc = c->hist && c->logits && c->ds ? kipp_session_create(s->m, cap, &c->s, err, errlen) : KIPP_ENOMEM;
    if (!rc && spec) {
        kipp_spec_options so = {.stop_ids = s->info.stop_ids, .n_stop = s->info.n_stop};
        rc = kipp_spec_create(s->m, &so, &c->spec, err, errlen);
    }
    if (rc) {
        choice_free(s, c);
        return rc;
    }
    if (s->o.pool_blocks && !echo_rows && r->n_prompt > 1) {
        /* Adopt the longest published prefix, leaving the last prompt token to
         * evaluate: its logits start the reply. Echo logprobs need every row. */
        int got = kipp_session_match_prefix(c->s, r->prompt_ids, (uint32_t)r->n_prompt - 1, err, errlen);
        if (got < 0) {
            choice_free(s, c);
            return got;
        }
        c->n_done = (uint32_t)got;
        if (idx == 0) j->cached_tokens = (uint32_t)got;
    }
    if (!s->o.pool_blocks) serve_metrics_get()->kv_blocks += blocks_of(cap);
    memcpy(c->hist, r->prompt_ids, r->n_prompt * sizeof *c->hist);
    c->n_hist = r->n_prompt;
    kipp_rng_seed(&c->rng, (r->seed_set ? r->seed : s->seed_salt ^ (j->id * 0x9e3779b97f4a7c15ull)) + (uint64_t)idx);
    s->act[s->n_act++] = c;
    return 0;
}

/* Pool room for the worst case (issue 10): every active choice - the new
 * job's included, after their prefix adoption - may still grow to its whole
 * budget, n_prompt + max_tokens positions; admitted work must fit what the
 * pool can still hand out (free + unreferenced published blocks). Engine lock held. */
static int pool_fits(serve_sched *s)
{
    kipp_pool_stats st;
    kipp_model_pool_stats(s->m, &st);
    uint64_t need = 0;
    for (int k = 0; k < s->n_act; k++) need += kipp_session_pool_need(s->act[k]->s, kipp_session_capacity(s->act[k]->s));
    return need <= st.blocks_available;
}

/* Take job j's choices back out of the active set without finishing them (it
 * stays queued). Their sessions hold only adopted blocks, which go back to
 * the pool's LRU list. Engine lock held. */
static void unadmit(serve_sched *s, serve_job *j)
{
    for (int k = s->n_act; k-- > 0;)
        if (s->act[k]->job == j) {
            choice_free(s, s->act[k]);
            s->act[k] = s->act[--s->n_act];
        }
    j->cached_tokens = 0;
}

/* The scheduler's snapshot of the KV pool for /metrics (mu held). */
static void pool_snapshot(serve_sched *s)
{
    serve_metrics *mt = serve_metrics_get();
    if (!s->o.pool_blocks) return;
    mt->pooled = 1;
    kipp_model_pool_stats(s->m, &mt->pool);
    mt->kv_blocks = mt->pool.blocks_private + mt->pool.blocks_referenced;
}

/* Admit queued jobs in FIFO order while their choices fit the batch and their
 * sessions the KV budget (mu held); a job that does not fit waits at the head.
 * Pooled: the head's choices are created (adopting prefixes) and kept only if
 * pool_fits; otherwise they are dropped again and the job waits until some
 * choice finishes. */
static void admit(serve_sched *s)
{
    serve_metrics *mt = serve_metrics_get();
    while (s->head && s->n_act + s->head->req.n <= s->o.max_choices &&
           (s->o.pool_blocks || mt->kv_blocks + job_blocks(s->head) <= s->o.kv_budget_blocks)) {
        serve_job *j = s->head;
        if (!j->cancelled && j == s->blocked && s->n_finished == s->blocked_at) break; /* no room freed since */
        s->blocked = NULL;
        if (!j->cancelled) {
            if (j->req.echo && j->req.logprobs && !j->prompt_top && !(j->prompt_top = calloc(j->req.n_prompt, sizeof *j->prompt_top)))
                snprintf(j->error, sizeof j->error, "out of memory for prompt logprobs");
            pthread_mutex_lock(&s->engine);
            for (int i = 0; i < j->req.n && !j->error[0]; i++)
                if (choice_new(s, j, i, j->error, sizeof j->error)) break;
            if (!j->error[0] && s->o.pool_blocks && !pool_fits(s)) {
                unadmit(s, j);
                pthread_mutex_unlock(&s->engine);
                s->blocked = j, s->blocked_at = s->n_finished;
                break;
            }
            pthread_mutex_unlock(&s->engine);
        }
        s->head = j->next;
        if (!s->head) s->tail = NULL;
        j->next = NULL, j->queued = 0;
        s->n_queued--;
        if (j->cancelled) {
            serve_job_unref(j);
            continue;
        }
        if (j->error[0]) { /* undo: finish every choice created so far, the rest as errors */
            pthread_mutex_lock(&s->engine);
            for (int i = 0; i < j->req.n; i++) j->out[i].finish = FIN_ERROR; /* so no choice_finish completes the job */
            for (int k = s->n_act; k-- > 0;)
                if (s->act[k]->job == j) choice_finish(s, k, FIN_ERROR);
            if (!j->done) j->done = 1, serve_job_unref(j);
            pthread_mutex_unlock(&s->engine);
            continue;
        }
        mt->prompt_tokens += j->req.n_prompt;
        mt->prompt_tokens_cached += j->cached_tokens;
    }
    mt->queue_depth = s->n_queued;
    mt->active_choices = s->n_act;
    pool_snapshot(s);
}

/* ---- one step ---- */

/* A greedy choice's decode item: pending token + draft into spec_tok[count].
 * 0 (decode plainly) when the drafter refuses, which it does only on bad state. */
static int spec_propose(sched_choice *c)
{
    const serve_req *r = &c->job->req;
    uint64_t left = (uint64_t)r->max_tokens - c->job->out[c->idx].n_gen;
    return kipp_spec_propose(c->spec, c->s, c->hist, c->n_hist, left < UINT32_MAX ? (uint32_t)left : UINT32_MAX,
                             c->spec_tok, &c->count, NULL, 0) == 0;
}

/* Item for choice c: next prompt chunk, or its decode token(s). */
static kipp_batch_item item_for(sched_choice *c)
{
    const serve_req *r = &c->job->req;
    kipp_batch_item it;
    it.session = c->s;
    c->first = c->n_done < r->n_prompt ? c->n_done : (uint32_t)c->n_hist - 1;
    if (c->n_done < r->n_prompt) {
        uint32_t left = (uint32_t)r->n_prompt - c->n_done;
        c->count = left < SERVE_CHUNK ? left : SERVE_CHUNK;
        it.tokens = r->prompt_ids + c->n_done;
        c->rows = c->echo ? c->count : (c->count == left ? 1 : 0);
    } else if ((c->spec_step = c->spec && spec_propose(c))) {
        it.tokens = c->spec_tok;
        c->rows = c->count;
    } else {
        c->count = 1;
        it.tokens = &c->next_tok;
        c->rows = 1;
    }
    it.token_count = c->count;
    it.logits_count = c->rows;
    it.logits = c->rows ? c->logits : NULL;
    return it;
}

/* log-sum-exp of row[V], for log-probabilities of the raw logits. */
static double lse(const float *row, uint32_t V)
{
    float mx = row[0];
    for (uint32_t i = 1; i < V; i++) mx = row[i] > mx ? row[i] : mx;
    double sum = 0;
    for (uint32_t i = 0; i < V; i++) sum += exp((double)row[i] - mx);
    return mx + log(sum);
}

/* Fill rec with token id's log-probability and the n_top best alternatives. */
static void logprob_of(const float *row, uint32_t V, uint32_t id, int n_top, serve_lp *rec)
{
    double z = lse(row, V);
    rec->id = id;
    rec->logprob = (float)(row[id] - z);
    rec->n_top = 0;
    for (uint32_t i = 0; n_top > 0 && i < V; i++) { /* one pass, insertion into a sorted top list */
        if (rec->n_top == n_top && row[i] <= row[rec->top_ids[n_top - 1]]) continue;
        int q = rec->n_top < n_top ? rec->n_top++ : n_top - 1;
        while (q > 0 && row[rec->top_ids[q - 1]] < row[i]) rec->top_ids[q] = rec->top_ids[q - 1], q--;
        rec->top_ids[q] = i;
    }
    for (int t = 0; t < rec->n_top; t++) rec->top_lp[t] = (float)(row[rec->top_ids[t]] - z);
}

static int is_stop_id(const serve_sched *s, uint32_t id)
{
    for (uint32_t i = 0; i < s->info.n_stop; i++)
        if (s->info.stop_ids[i] == id) return 1;
    return 0;
}

static int push_lp(serve_choice_out *o, const serve_lp *rec)
{
    if (o->n_lp == o->cap_lp) {
        size_t cap = o->cap_lp ? o->cap_lp * 2 : 16;
        serve_lp *p = realloc(o->lp, cap * sizeof *p);
        if (!p) return -1;
        o->lp = p, o->cap_lp = cap;
    }
    o->lp[o->n_lp++] = *rec;
    return 0;
}

static int emit_token(serve_sched *s, sched_choice *c, const float *row, uint32_t tok, double now);

/* A speculative decode step's rows: the greedy tokens (kipp_spec_accept), each
 * published from the row that produced it, until one ends the choice. */
static int spec_advance(serve_sched *s, sched_choice *c, const kipp_sample_params *sp, double now)
{
    serve_job *j = c->job;
    uint64_t left = (uint64_t)j->req.max_tokens - j->out[c->idx].n_gen;
    uint32_t out[KIPP_SPEC_K_MAX + 1], n = 0, V = s->info.vocab_size;
    kipp_spec_stats before, after;
    kipp_spec_get_stats(c->spec, &before);
    if (kipp_spec_accept(c->spec, c->s, c->spec_tok, c->count, c->logits, sp, &c->rng,
                         left < UINT32_MAX ? (uint32_t)left : UINT32_MAX, out, &n, j->error, sizeof j->error))
        return FIN_ERROR;
    kipp_spec_get_stats(c->spec, &after);
    serve_metrics *mt = serve_metrics_get();
    mt->spec_steps++;
    mt->spec_drafted += after.drafted - before.drafted;
    mt->spec_accepted += after.accepted - before.accepted;
    mt->spec_emitted += n;
    int why = FIN_NONE;
    for (uint32_t i = 0; i < n && why == FIN_NONE; i++) why = emit_token(s, c, c->logits + (size_t)i * V, out[i], now);
    return why;
}

/* After the eval: record echo logprobs, then sample if this step ended the prompt
 * or was a decode step. Returns FIN_NONE to continue, else why the choice ends. */
static int choice_advance(serve_sched *s, sched_choice *c, double now)
{
    serve_job *j = c->job;
    const serve_req *r = &j->req;
    uint32_t V = s->info.vocab_size;
    int prefill = c->n_done < r->n_prompt;
    if (prefill) c->n_done += c->count;
    for (uint32_t q = 0; c->echo && prefill && q < c->rows; q++) {
        uint32_t pos = c->first + q + 1; /* row q predicts the token at pos */
        if (pos < r->n_prompt && j->prompt_top) logprob_of(c->logits + (size_t)q * V, V, r->prompt_ids[pos], r->top_logprobs, &j->prompt_top[pos]);
    }
    if (prefill && c->n_done < r->n_prompt) return FIN_NONE;
    if (prefill && c->idx == 0) j->t_prompt_done = now;
    kipp_sample_params sp = r->sp;
    sp.history = c->hist, sp.history_len = c->n_hist, sp.n_prompt_history = r->n_prompt;
    if (!prefill && c->spec_step) return spec_advance(s, c, &sp, now);
    const float *row = c->logits + (size_t)(c->rows - 1) * V;
    uint32_t tok;
    int rc = kipp_sample_ex(row, V, &sp, &c->rng, &tok, j->error, sizeof j->error);
    return rc ? FIN_ERROR : emit_token(s, c, row, tok, now);
}

/* Publish token tok, sampled from row, for choice c; FIN_NONE to continue. */
static int emit_token(serve_sched *s, sched_choice *c, const float *row, uint32_t tok, double now)
{
    serve_job *j = c->job;
    const serve_req *r = &j->req;
    uint32_t V = s->info.vocab_size;
    serve_choice_out *o = &j->out[c->idx];
    serve_metrics *mt = serve_metrics_get();
    if (o->t_first == 0) o->t_first = now, serve_hist_add(&mt->ttft, now - j->t_arrive);
    else serve_hist_add(&mt->itl, now - o->t_last);
    o->t_last = now;
    if (is_stop_id(s, tok)) return FIN_STOP;
    serve_lp rec = {0};
    if (r->logprobs) logprob_of(row, V, tok, r->top_logprobs, &rec);
    char buf[256];
    size_t n = 0, before = o->raw.n;
    if (kipp_detok_stream_push(c->ds, tok, buf, sizeof buf, &n, j->error, sizeof j->error) ||
        serve_buf_put(&o->raw, buf, n))
        return FIN_ERROR;
    rec.text_off = (uint32_t)before, rec.text_len = (uint32_t)n;
    if (r->logprobs && push_lp(o, &rec)) return FIN_ERROR;
    o->n_gen++, mt->generated_tokens++;
    c->hist[c->n_hist++] = tok;
    c->next_tok = tok;
    size_t stop_at;
    serve_view v;
    serve_text_view(r, o->raw.p, o->raw.n, 0, &stop_at, &v);
    if (stop_at < o->raw.n) return FIN_STOP;
    o->raw_final = o->raw.n;
    return o->n_gen >= (uint64_t)r->max_tokens ? FIN_LENGTH : FIN_NONE;
}

/* Run one step over the active choices; returns 0 when there was nothing to do. */
static int step(serve_sched *s)
{
    kipp_batch_item items[64];
    int n = s->n_act;
    for (int k = 0; k < n; k++) items[k] = item_for(s->act[k]);
    pthread_mutex_unlock(&s->mu);
    char err[256] = "";
    pthread_mutex_lock(&s->engine);
    int rc = kipp_eval_batch(s->m, items, (size_t)n, err, sizeof err);
    pthread_mutex_unlock(&s->engine);
    pthread_mutex_lock(&s->mu);
    pthread_mutex_lock(&s->engine);
    double now = serve_now();
    serve_metrics_get()->steps++;
    /* choice_finish swaps the last active choice into slot k: walk backwards. */
    for (int k = n; k-- > 0;) {
        sched_choice *c = s->act[k];
        int why = rc ? FIN_ERROR : choice_advance(s, c, now);
        if (rc) snprintf(c->job->error, sizeof c->job->error, "evaluation failed: %s", err);
        if (!why && c->job->cancelled) why = FIN_CANCELLED;
        if (why) choice_finish(s, k, why);
    }
    pthread_mutex_unlock(&s->engine);
    return 1;
}

static void drop_cancelled(serve_sched *s)
{
    pthread_mutex_lock(&s->engine);
    for (int k = s->n_act; k-- > 0;)
        if (s->act[k]->job->cancelled) choice_finish(s, k, FIN_CANCELLED);
    pthread_mutex_unlock(&s->engine);
}

static void *sched_main(void *arg)
{
    serve_sched *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        drop_cancelled(s);
        admit(s);
        if (s->n_act == 0) {
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        step(s);
        pool_snapshot(s);
        pthread_cond_broadcast(&s->cv);
    }
    drop_cancelled(s);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

serve_sched *serve_sched_start(kipp_model *m, const serve_sched_opts *o, char *err, size_t errlen)
{
    serve_sched *s = calloc(1, sizeof *s);
    if (!s) return snprintf(err, errlen, "out of memory"), NULL;
    if (o->max_choices < SERVE_MAX_N || o->max_choices > 64) {
        snprintf(err, errlen, "--max-batch %d is out of range, expected %d..64", o->max_choices, SERVE_MAX_N);
        free(s);
        return NULL;
    }
    s->m = m, s->o = *o;
    kipp_model_get_info(m, &s->info);
    s->seed_salt = (uint64_t)time(NULL) ^ ((uint64_t)(uintptr_t)s << 16);
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->engine, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->th, NULL, sched_main, s)) {
        snprintf(err, errlen, "cannot start the scheduler thread");
        free(s);
        return NULL;
    }
    s->started = 1;
    return s;
}

void serve_sched_stop(serve_sched *s)
{
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    for (int k = 0; k < s->n_act; k++) s->act[k]->job->cancelled = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->started) pthread_join(s->th, NULL);
    while (s->head) {
        serve_job *j = s->head;
        s->head = j->next;
        serve_job_unref(j);
    }
    free(s);
}
