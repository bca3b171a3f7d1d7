/*
 * sched.c - the continuous-batching scheduler (seed 000 phase 5). One thread
 * owns the engine: every session and every generation step. Each step:
 *   1. frees the choices of cancelled jobs (client gone) at once;
 *   2. resumes preempted choices, most urgent first, then admits queued jobs
 *      in queue order (priority, lower first, then arrival: vLLM's "priority"
 *      field), while the total choice count fits max_choices (a job is
 *      admitted whole: all n choices). On a pooled model (the default) each
 *      choice first adopts the longest published prefix of its prompt
 *      (kipp_session_match_prefix), and KV is reserved as sequences grow, as
 *      vLLM does: a job or a resumed choice comes in when the pool can hold
 *      every resident choice's tokens plus SERVE_RESERVE positions each
 *      (pool_fits), not their worst case; unpooled, each job's worst case
 *      (prompt + max_tokens) counts against --kv-mib;
 *   3. fills the step's token budget (--step-tokens): every decoding choice's
 *      item first (its pending token, plus a prompt-lookup draft for greedy
 *      choices), then prefill chunks in admission order: each prefilling
 *      choice gets up to SERVE_CHUNK tokens while the budget lasts (the oldest
 *      always gets one chunk), and what is left lengthens the chunks, oldest
 *      first. A lone prompt prefills in budget-sized chunks; a decode never
 *      waits behind a prefill; a new request starts within one step.
 *      Stall-free (Sarathi-Serve): while more choices decode than prefill,
 *      the prefill share is also cut to what fits the step time target
 *      (--step-ms) beside the decode part, as the online step-cost fit
 *      predicts it (step_cost.h, fed each step's measured time); the oldest
 *      prefilling choice still gets SERVE_MIN_CHUNK tokens, so every prompt
 *      progresses. A burst (serve_step_burst: at least as many prefilling
 *      choices) takes the token budget in one pass beside the decodes.
 *      Pooled, when the planned step needs more blocks than the pool can
 *      hand out, the least urgent resident choice (highest priority value,
 *      then youngest) is preempted: its session is
 *      destroyed (publishing its full blocks, so its prefix may be adopted
 *      back), its kipp_gen is kept, and it resumes before any new job with
 *      kipp_gen_rebind, re-evaluating what the pool no longer holds. The
 *      most urgent choice is never preempted, so it always progresses;
 *   4. evaluates all items with one kipp_eval_batch (weights read once per
 *      step) and advances each choice's kipp_gen (sampling, speculative
 *      acceptance, detokenizing, stop strings), with no lock held: only this
 *      thread touches the engine and the gens, and changes act[];
 *   5. publishes text, logprobs and finishes under `mu`.
 * Request state (serve_job) is shared with the HTTP threads under `mu`; they
 * never touch the engine but to tokenize (serve_prepare, under `tok`). Each
 * choice has its own session, so results equal isolated evaluation, and a
 * fixed seed gives the same tokens alone, batched or preempted and resumed
 * (the KV of a position is bitwise the same however it was evaluated).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/sched_internal.h"

double serve_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

pthread_mutex_t *serve_sched_mutex(serve_sched *s) { return &s->mu; }
pthread_mutex_t *serve_tokenizer_mutex(serve_sched *s) { return &s->tok; }

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
    if (!j->done && !j->cancelled) serve_metrics_on_cancel();
    j->cancelled = 1;
    pthread_cond_broadcast(&s->cv);
}


/* Queued requests that would still wait after the scheduler's next admission
 * (mu held): those that do not fit the free batch slots, in FIFO order. The
 * queue limit counts these only: a job queued a moment before admission while
 * slots are free is not waiting, so a burst below the batch size is never
 * refused. *new_waits: a new job of n_new choices would wait too. */
static int waiting_jobs(const serve_sched *s, int n_new, int *new_waits)
{
    int slots = s->o.max_choices - s->n_act, waiting = 0;
    for (int k = 0; k < s->n_act; k++)
        if (!s->act[k]->s) slots = 0; /* nothing is admitted while a preempted choice waits to resume */
    for (const serve_job *q = s->head; q; q = q->next) {
        if (q->cancelled) continue;
        if (!waiting && q->req.n <= slots && q != s->blocked) slots -= q->req.n;
        else waiting++;
    }
    *new_waits = waiting || n_new > slots;
    return waiting;
}

/* Queue j behind every job at least as urgent (mu held): the queue is
 * ordered by priority (lower first), then by arrival, as vLLM's priority
 * policy orders its waiting queue. */
static void enqueue(serve_sched *s, serve_job *j)
{
    serve_job **p = &s->head;
    while (*p && (*p)->req.priority <= j->req.priority) p = &(*p)->next;
    j->next = *p;
    *p = j;
    if (!j->next) s->tail = j;
}

int serve_sched_submit(serve_sched *s, serve_job *j, serve_error *e)
{
    if (s->o.pool_blocks ? serve_pool_check(&s->o, j, e) : serve_job_blocks(j) > s->o.kv_budget_blocks ? serve_budget_fail(&s->o, j, s->o.kv_budget_blocks, e) : 0)
        return -1;
    pthread_mutex_lock(&s->mu);
    int new_waits, q = waiting_jobs(s, j->req.n, &new_waits);
    if (new_waits && q >= s->o.max_queue) {
        pthread_mutex_unlock(&s->mu);
        serve_fail(e, 429, "rate_limit_error", "", "the request queue is full (%d requests waiting, limit %d); retry later",
                   q, s->o.max_queue);
        snprintf(e->code, sizeof e->code, "queue_full");
        return -1;
    }
    j->refs++;
    j->queued = 1;
    enqueue(s, j);
    s->n_queued++;
    serve_metrics_on_queue(s->n_queued, s->n_act);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* ---- choices ---- */

static void choice_free(serve_sched *s, sched_choice *c)
{
    if (c->s && !s->o.pool_blocks) s->kv_held -= serve_blocks_of(kipp_session_capacity(c->s)), serve_metrics_on_kv(s->kv_held);
    kipp_gen_destroy(c->g);
    kipp_session_destroy(c->s); /* pooled: publishes the choice's full blocks (publish-at-finish) */
    free(c);
}

/* Copy the gen's text into the choice's published output (mu held): the text
 * only grows, except that a stop string cuts it. */
static int publish_text(sched_choice *c)
{
    serve_choice_out *o = &c->job->out[c->idx];
    const char *p;
    size_t len, fin;
    kipp_gen_text(c->g, &p, &len, &fin);
    if (len < o->raw.n) o->raw.n = len, o->raw.p[len] = 0;
    else if (serve_buf_put(&o->raw, p + o->raw.n, len - o->raw.n)) return -1;
    o->raw_final = fin;
    o->n_gen = kipp_gen_generated(c->g);
    return 0;
}

/* Finish choice k (mu held): end its gen (flushing held bytes), publish, free
 * its session at once. */
static void choice_finish(serve_sched *s, int k, int why)
{
    sched_choice *c = s->act[k];
    serve_job *j = c->job;
    serve_choice_out *o = &j->out[c->idx];
    if (why != FIN_ERROR) {
        kipp_gen_cancel(c->g); /* no-op for a gen that ended itself */
        if (kipp_gen_finished(c->g) == KIPP_FIN_STOP && why == FIN_LENGTH) why = FIN_STOP; /* a stop string in the flushed tail */
        o->stop_matched = kipp_gen_stop_index(c->g) + 1; /* which stop string (Anthropic's stop_sequence) */
        if (publish_text(c)) why = FIN_ERROR, snprintf(j->error, sizeof j->error, "out of memory for the reply text");
        if (why == FIN_CANCELLED) o->raw_final = o->raw.n;
    }
    o->finish = why;
    s->n_finished++;
    serve_metrics_on_finish(why, j->t_arrive, j->t_admit, o->t_first, o->t_last, serve_now());
    choice_free(s, c);
    s->act[k] = s->act[--s->n_act];
    serve_metrics_on_queue(s->n_queued, s->n_act);
    int all = 1;
    for (int i = 0; i < j->req.n; i++) all &= j->out[i].finish != FIN_NONE;
    if (all && !j->done) {
        j->done = 1;
        serve_job_unref(j);
    }
}

static kipp_gen_options gen_options(const serve_sched *s, const serve_job *j, int idx, int echo)
{
    const serve_req *r = &j->req;
    return (kipp_gen_options){
        .sp = r->sp,
        .seed = (r->seed_set ? r->seed : s->seed_salt ^ (j->id * 0x9e3779b97f4a7c15ull)) + (uint64_t)idx,
        .max_tokens = (uint32_t)r->max_tokens,
        .stop = (const char *const *)r->stop,
        .n_stop = r->n_stop,
        .spec = !s->o.no_spec,
        .spec_opts = {.draft_model = s->o.draft, .k_max = s->o.draft_max, .draft_min = s->o.draft_min},
        .prompt_rows = echo,
        .grammar = r->grammar,
        /* the schema binds the answer, not the thoughts (text_out.c splits them the same way) */
        .grammar_after = r->grammar && r->thinking ? "</think>" : NULL,
        .grammar_open = r->grammar && r->thinking && !r->starts_in_reasoning ? "<think>" : NULL,
        .min_tokens = r->min_tokens,
        .keep_stop = r->include_stop,
        /* thinking_token_budget: past it the gen forces "\n</think>\n\n" in place of samples (evaluated like
         * them), where text_out.c ends the reasoning; counted from the reply's "<think>", or its first token
         * when the prompt opened reasoning */
        .think_budget_on = r->thinking && r->thinking_budget >= 0,
        .think_budget = r->thinking_budget > 0 ? (uint32_t)r->thinking_budget : 0,
        .think_open = r->starts_in_reasoning ? NULL : "<think>",
        .think_close = "</think>",
        .think_end = "\n</think>\n\n",
    };
}

static int choice_new(serve_sched *s, serve_job *j, int idx, char *err, size_t errlen)
{
    sched_choice *c = calloc(1, sizeof *c);
    const serve_req *r = &j->req;
    if (!c) return KIPP_ENOMEM;
    c->job = j, c->idx = idx, c->seq = s->n_admitted++;
    c->echo = r->echo && r->logprobs && idx == 0;
    uint32_t cap = (uint32_t)(r->n_prompt + (size_t)r->max_tokens);
    int rc = kipp_session_create(s->m, cap, &c->s, err, errlen);
    if (!rc && s->o.pool_blocks && !c->echo && r->n_prompt > 1) {
        /* Adopt the longest published prefix, leaving the last prompt token to
         * evaluate: its logits start the reply. Echo logprobs need every row. */
        int got = kipp_session_match_prefix(c->s, r->prompt_ids, (uint32_t)r->n_prompt - 1, err, errlen);
        rc = got < 0 ? got : 0;
        if (got > 0 && idx == 0) j->cached_tokens = (uint32_t)got;
    }
    kipp_gen_options go = gen_options(s, j, idx, c->echo);
    if (!rc) rc = kipp_gen_create(s->m, c->s, r->prompt_ids, r->n_prompt, &go, &c->g, err, errlen);
    if (rc) {
        choice_free(s, c);
        return rc;
    }
    if (!s->o.pool_blocks) s->kv_held += serve_blocks_of(cap), serve_metrics_on_kv(s->kv_held);
    s->act[s->n_act++] = c;
    return 0;
}

/* Pool blocks resident choice c reserves: those it lacks for the tokens it
 * must hold before its next sample, plus SERVE_RESERVE positions to grow. */
_Static_assert(SERVE_RESERVE >= KIPP_SPEC_K_MAX, "a speculative step must fit a choice's reservation");
static uint64_t reserve(const sched_choice *c)
{
    /* + 1: the pending token, so a speculative item (1 + up to KIPP_SPEC_K_MAX drafts) fits the reservation */
    uint64_t want = (uint64_t)kipp_session_length(c->s) + kipp_gen_prompt_left(c->g) + 1 + SERVE_RESERVE;
    uint32_t cap = kipp_session_capacity(c->s);
    return kipp_session_pool_need(c->s, want < cap ? (uint32_t)want : cap);
}

/* What the pool can still hand out (free + unreferenced published blocks)
 * beyond every resident choice's reservation - a new job's or a resumed
 * choice's included, after their prefix adoption; negative when short. */
static int64_t pool_room(serve_sched *s)
{
    kipp_pool_stats st;
    kipp_model_pool_stats(s->m, &st);
    int64_t room = (int64_t)st.blocks_available;
    for (int k = 0; k < s->n_act; k++)
        if (s->act[k]->s) room -= (int64_t)reserve(s->act[k]);
    return room;
}

static int pool_fits(serve_sched *s) { return pool_room(s) >= 0; }

/* Preempt choice c (mu held): destroy its session, which publishes its full
 * blocks (its prefix stays adoptable until evicted), and keep its gen. */
static void preempt(serve_sched *s, sched_choice *c)
{
    c->held = kipp_session_length(c->s);
    kipp_session_destroy(c->s);
    c->s = NULL, c->it.token_count = 0;
    s->n_preempted++;
    serve_metrics_on_preempt();
}

/* 1 when choice a is less urgent than b: a higher priority value, or the
 * same and admitted later. Preemption takes the least urgent resident choice;
 * resumption brings back the most urgent preempted one first. */
static int less_urgent(const sched_choice *a, const sched_choice *b)
{
    int pa = a->job->req.priority, pb = b->job->req.priority;
    return pa != pb ? pa > pb : a->seq > b->seq;
}

/* The slot of the most urgent preempted choice, or -1. */
static int oldest_preempted(const serve_sched *s)
{
    int o = -1;
    for (int k = 0; k < s->n_act; k++)
        if (!s->act[k]->s && (o < 0 || less_urgent(s->act[o], s->act[k]))) o = k;
    return o;
}

/* Resume preempted choices, oldest first, while the pool holds their
 * reservation (mu held): a new session adopts the longest published prefix
 * of the gen's tokens (an echo choice no further than it had evaluated, as
 * only those positions gave their rows) and kipp_gen_rebind re-evaluates the
 * rest. Returns 1 when no preempted choice is left waiting. */
static int resume(serve_sched *s)
{
    uint64_t moves = s->n_finished + s->n_preempted;
    if (s->resume_waits && moves == s->resume_at) return 0; /* nothing freed since it did not fit */
    s->resume_waits = 0;
    for (int k; (k = oldest_preempted(s)) >= 0;) {
        sched_choice *c = s->act[k];
        const serve_req *r = &c->job->req;
        char err[256] = "";
        uint32_t most;
        const uint32_t *toks = kipp_gen_tokens(c->g, &most);
        kipp_session *t = NULL;
        if (c->echo && most > c->held) most = c->held;
        int rc = kipp_session_create(s->m, (uint32_t)(r->n_prompt + (size_t)r->max_tokens), &t, err, sizeof err);
        int got = rc ? rc : kipp_session_match_prefix(t, toks, most, err, sizeof err);
        rc = got < 0 ? got : kipp_gen_rebind(c->g, t, err, sizeof err);
        if (rc) {
            kipp_session_destroy(t);
            snprintf(c->job->error, sizeof c->job->error, "cannot resume a preempted choice: %s", err);
            choice_finish(s, k, FIN_ERROR);
            continue;
        }
        c->s = t;
        if (!pool_fits(s)) {
            kipp_session_destroy(t); /* the gen is rebound again when there is room */
            c->s = NULL;
            s->resume_waits = 1, s->resume_at = moves;
            return 0;
        }
    }
    return 1;
}

/* Take job j's choices back out of the active set without finishing them (it
 * stays queued). Their sessions hold only adopted blocks, which go back to
 * the pool's LRU list. */
static void unadmit(serve_sched *s, serve_job *j)
{
    for (int k = s->n_act; k-- > 0;)
        if (s->act[k]->job == j) {
            choice_free(s, s->act[k]);
            s->act[k] = s->act[--s->n_act];
        }
    j->cached_tokens = 0;
}

void serve_sched_pool_snapshot(serve_sched *s)
{
    kipp_pool_stats st;
    if (s->o.pool_blocks && !kipp_model_pool_stats(s->m, &st)) serve_metrics_on_pool(&st);
}

/* Admit queued jobs in FIFO order while their choices fit the batch and their
 * sessions the KV budget (mu held); a job that does not fit waits at the head.
 * Pooled: preempted choices resume first, and no job is admitted while one
 * waits; the head's choices are created (adopting prefixes) and kept only if
 * pool_fits; otherwise they are dropped again and the job waits until some
 * choice finishes. */
static void admit(serve_sched *s)
{
    int resumed = !s->o.pool_blocks || resume(s);
    while (resumed && s->head && s->n_act + s->head->req.n <= s->o.max_choices &&
           (s->o.pool_blocks || s->kv_held + serve_job_blocks(s->head) <= s->o.kv_budget_blocks)) {
        serve_job *j = s->head;
        if (!j->cancelled && j == s->blocked && s->n_finished == s->blocked_at) break; /* no room freed since */
        int64_t room = s->o.pool_blocks && !j->cancelled && !j->kv_load_tried ? pool_room(s) : 0;
        if (!j->cancelled && s->o.pool_blocks && serve_load_wait(s->m, j, room > 0 ? (uint32_t)room : 0)) break; /* loading */
        s->blocked = NULL;
        if (!j->cancelled) {
            if (j->req.echo && j->req.logprobs && !j->prompt_top && !(j->prompt_top = calloc(j->req.n_prompt, sizeof *j->prompt_top)))
                snprintf(j->error, sizeof j->error, "out of memory for prompt logprobs");
            for (int i = 0; i < j->req.n && !j->error[0]; i++)
                if (choice_new(s, j, i, j->error, sizeof j->error)) break;
            if (!j->error[0] && s->o.pool_blocks && !pool_fits(s)) {
                unadmit(s, j);
                s->blocked = j, s->blocked_at = s->n_finished;
                break;
            }
        }
        s->head = j->next;
        if (!s->head) s->tail = NULL;
        j->next = NULL, j->queued = 0;
        s->n_queued--;
        serve_load_drop(s->m, j); /* a cancelled job's read in flight */
        if (j->cancelled) {
            for (int i = 0; i < j->req.n; i++) serve_metrics_on_finish(FIN_CANCELLED, j->t_arrive, 0, 0, 0, serve_now());
            serve_job_unref(j);
            continue;
        }
        if (j->error[0]) { /* undo: finish every choice created so far, the rest as errors */
            for (int i = 0; i < j->req.n; i++) j->out[i].finish = FIN_ERROR; /* so no choice_finish completes the job */
            for (int k = s->n_act; k-- > 0;)
                if (s->act[k]->job == j) choice_finish(s, k, FIN_ERROR);
            if (!j->done) j->done = 1, serve_job_unref(j);
            continue;
        }
        j->t_admit = serve_now();
        serve_metrics_on_admit(j->req.n_prompt, j->cached_tokens);
    }
    serve_metrics_on_queue(s->n_queued, s->n_act);
    serve_sched_pool_snapshot(s);
}

/* Drain (mu held): end every active choice as if its length ran out (the gen
 * flushes its held bytes, so the text is what was generated so far) and every
 * queued job with no tokens, so each client still gets a complete reply. */
static void end_everything(serve_sched *s)
{
    for (int k = s->n_act; k-- > 0;) choice_finish(s, k, s->act[k]->job->cancelled ? FIN_CANCELLED : FIN_LENGTH);
    while (s->head) {
        serve_job *j = s->head;
        s->head = j->next, j->next = NULL, j->queued = 0;
        s->n_queued--;
        serve_load_drop(s->m, j);
        for (int i = 0; i < j->req.n; i++) {
            j->out[i].finish = j->cancelled ? FIN_CANCELLED : FIN_LENGTH;
            serve_metrics_on_finish(j->out[i].finish, j->t_arrive, 0, 0, 0, serve_now());
        }
        if (!j->done) j->done = 1, serve_job_unref(j); /* the scheduler's reference */
    }
    s->tail = NULL, s->blocked = NULL;
    serve_metrics_on_queue(0, 0);
}

void serve_sched_end_all(serve_sched *s)
{
    pthread_mutex_lock(&s->mu);
    s->end_all = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

int serve_sched_busy(serve_sched *s)
{
    pthread_mutex_lock(&s->mu);
    int n = s->n_act + s->n_queued;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* Requests with a resident choice, and those whose choices are all preempted
 * (waiting, as vLLM counts them), for the router gauges; the preempted
 * choices (mu held). */
static void count_running(serve_sched *s)
{
    int n = 0, pre = 0, pre_jobs = 0;
    for (int k = 0; k < s->n_act; k++) {
        pre += !s->act[k]->s;
        int seen = 0, resident = 0;
        for (int q = 0; q < k && !seen; q++) seen = s->act[q]->job == s->act[k]->job;
        if (seen) continue;
        for (int q = k; q < s->n_act; q++) resident |= s->act[q]->job == s->act[k]->job && s->act[q]->s;
        n += resident, pre_jobs += !resident;
    }
    serve_metrics_on_running(n, pre_jobs, pre);
}

/* ---- one step ---- */

/* Insertion sort of prefilling choices by admission order (at most SERVE_MAX_BATCH). */
static int prefill_order(serve_sched *s, sched_choice **pre)
{
    int n = 0;
    for (int k = 0; k < s->n_act; k++) {
        sched_choice *c = s->act[k];
        if (!c->s || !kipp_gen_prompt_left(c->g)) continue;
        int q = n++;
        while (q > 0 && pre[q - 1]->seq > c->seq) pre[q] = pre[q - 1], q--;
        pre[q] = c;
    }
    return n;
}

/* The step's time target (step_cost.h): --step-ms, or in auto
 * SERVE_STEP_AUTO x the predicted cost of the decode-only step the resident
 * choices will reach (each one token at its position after its prompt), so
 * a step with prefill takes at most that many times a steady decode step;
 * 0 = none. */
static double step_target(const serve_sched *s, const serve_step_load *steady)
{
    if (s->o.step_ms > 0) return s->o.step_ms * 1e-3;
    return s->o.step_ms < 0 ? SERVE_STEP_AUTO * serve_cost_predict(&s->cost, steady) : 0;
}

/* Plan the step (mu held): every decode item, then prefill chunks within the
 * token budget and the time target (the rule in the header comment; the
 * arithmetic is serve_step_plan_prefill's). Returns the item count. */
static int plan(serve_sched *s, kipp_batch_item *items)
{
    sched_choice *pre[SERVE_MAX_BATCH];
    serve_prefill_want want[SERVE_MAX_BATCH];
    uint32_t give[SERVE_MAX_BATCH], all[SERVE_MAX_BATCH], used = 0;
    int n = 0, n_dec = 0, n_pre = prefill_order(s, pre);
    serve_step_load dec = {0};
    for (int k = 0; k < s->n_act; k++) {
        sched_choice *c = s->act[k];
        c->it.token_count = 0;
        if (!c->s || kipp_gen_prompt_left(c->g) || kipp_gen_next(c->g, 1, &c->it, NULL, 0)) continue;
        used += c->it.token_count, dec.decode_tokens += c->it.token_count, n_dec++;
        dec.attn_kpairs += serve_attn_kpairs(kipp_session_length(c->s), c->it.token_count);
    }
    serve_step_load steady = dec;
    for (int p = 0; p < n_pre; p++) {
        want[p] = (serve_prefill_want){kipp_gen_prompt_left(pre[p]->g), kipp_session_length(pre[p]->s)};
        steady.decode_tokens++, steady.attn_kpairs += serve_attn_kpairs(want[p].pos + want[p].left, 1);
    }
    serve_prefill_plan pp = {.token_room = used < s->o.step_tokens ? s->o.step_tokens - used : 0, .chunk = SERVE_CHUNK,
                             .min_chunk = SERVE_MIN_CHUNK, .target_s = step_target(s, &steady), .cost = &s->cost, .decode = dec,
                             .decoding = (uint32_t)n_dec};
    uint32_t got = serve_step_plan_prefill(&pp, want, n_pre, give);
    s->burst = n_dec && serve_step_burst(&pp, n_pre);
    s->target_s = n_pre && dec.decode_tokens > 0 && !s->burst ? pp.target_s : 0;
    pp.target_s = 0;
    s->capped = s->target_s > 0 && got < serve_step_plan_prefill(&pp, want, n_pre, all);
    s->load = dec;
    for (int p = 0; p < n_pre; p++) {
        if (give[p]) kipp_gen_next(pre[p]->g, give[p], &pre[p]->it, NULL, 0); /* echo rows may take fewer */
        uint32_t t = pre[p]->it.token_count;
        s->load.prefill_tokens += t, s->load.attn_kpairs += serve_attn_kpairs(want[p].pos, t);
    }
    for (int k = 0; k < s->n_act; k++)
        if (s->act[k]->it.token_count) items[n++] = s->act[k]->it;
    return n;
}

/* Pool blocks the planned step takes (mu held): each resident choice's growth by its item. */
static uint64_t step_need(const serve_sched *s)
{
    uint64_t need = 0;
    for (int k = 0; k < s->n_act; k++) {
        const sched_choice *c = s->act[k];
        if (c->s && c->it.token_count) need += kipp_session_pool_need(c->s, kipp_session_length(c->s) + c->it.token_count);
    }
    return need;
}

/* plan, and on a pooled model preempt the least urgent resident choice
 * (highest priority value, then youngest) until the step fits what the pool
 * can hand out (mu held). The most urgent is never preempted: submission
 * checked that one choice alone fits the pool. */
static int plan_fitting(serve_sched *s, kipp_batch_item *items)
{
    for (;;) {
        int n = plan(s, items), young = -1, resident = 0;
        kipp_pool_stats st;
        if (!s->o.pool_blocks || kipp_model_pool_stats(s->m, &st) || step_need(s) <= st.blocks_available) return n;
        for (int k = 0; k < s->n_act; k++)
            if (s->act[k]->s) resident++, young = young < 0 || less_urgent(s->act[k], s->act[young]) ? k : young;
        if (resident < 2) return n; /* cannot happen (see above); the evaluation would report the pool exhausted */
        preempt(s, s->act[young]);
    }
}

/* Echo logprobs of the prompt rows this step evaluated. */
static void echo_rows(sched_choice *c, const kipp_gen_event *ev, uint32_t V)
{
    serve_job *j = c->job;
    const serve_req *r = &j->req;
    for (uint32_t q = 0; c->echo && j->prompt_top && q < ev->n_rows && ev->n_prompt; q++) {
        uint32_t pos = ev->first_pos + ev->n_refill + q + 1; /* row q predicts the token at pos */
        if (pos < r->n_prompt) serve_logprob_of(ev->logits + (size_t)q * V, V, r->prompt_ids[pos], r->top_logprobs, &j->prompt_top[pos]);
    }
}

/* Publish one step's event for choice c (mu held): timings, logprobs, text.
 * Returns FIN_NONE to continue, else why the choice ends. */
static int publish(serve_sched *s, sched_choice *c, const kipp_gen_event *ev, double now)
{
    serve_job *j = c->job;
    const serve_req *r = &j->req;
    serve_choice_out *o = &j->out[c->idx];
    uint32_t V = s->info.vocab_size;
    int sampled = ev->n_tokens || (ev->n_prompt && !kipp_gen_prompt_left(c->g)); /* a stop id emits nothing */
    echo_rows(c, ev, V);
    if (ev->n_prompt && !kipp_gen_prompt_left(c->g) && c->idx == 0) j->t_prompt_done = now;
    int first = !sampled ? -1 : o->t_first == 0;
    serve_metrics_on_token(first, first == 1 ? now - j->t_arrive : now - o->t_last, ev->n_tokens, ev->n_refill);
    if (first == 1) o->t_first = now;
    if (sampled) o->t_last = now;
    for (uint32_t i = 0; i < ev->n_tokens; i++) {
        serve_lp rec = {0};
        if (r->logprobs) serve_logprob_of(ev->logits + (size_t)ev->token_row[i] * V, V, ev->tokens[i], r->top_logprobs, &rec);
        rec.text_off = (uint32_t)c->text_pos, rec.text_len = ev->token_bytes[i];
        c->text_pos += ev->token_bytes[i];
        if ((r->logprobs && serve_push_lp(o, &rec)) || (r->thinking && serve_push_tok(o, rec.text_off))) return FIN_ERROR;
    }
    if (publish_text(c)) return FIN_ERROR;
    switch (kipp_gen_finished(c->g)) {
    case KIPP_FIN_NONE: return FIN_NONE;
    case KIPP_FIN_STOP: return FIN_STOP;
    case KIPP_FIN_CANCELLED: return FIN_CANCELLED;
    default: return FIN_LENGTH; /* max_tokens, or the session full: its capacity is prompt + max_tokens */
    }
}

/* Advance choice c after the batch, outside `mu` (only this thread touches
 * its gen): sampling, detokenizing, stop strings; the outcome and the
 * speculative counters wait in c for publishing. */
static void advance(sched_choice *c, double secs)
{
    kipp_spec_stats before = {0}, after = {0};
    const kipp_spec *sp = kipp_gen_spec(c->g);
    int spec_step = sp && !kipp_gen_prompt_left(c->g);
    if (sp) kipp_spec_get_stats(sp, &before);
    c->err[0] = 0;
    c->adv_rc = kipp_gen_advance(c->g, secs, &c->ev, c->err, sizeof c->err);
    if (sp) kipp_spec_get_stats(sp, &after);
    c->spec_step = spec_step && after.steps > before.steps;
    c->spec_d[0] = after.drafted - before.drafted, c->spec_d[1] = after.accepted - before.accepted;
    c->spec_d[2] = after.emitted - before.emitted;
}

/* Run one step over the active choices (mu held on entry and exit): plan
 * under `mu`, evaluate and advance without it (HTTP threads render chunks
 * meanwhile), publish under it; each phase's time goes to /metrics and the
 * whole step's to the cost fit. */
static void step(serve_sched *s)
{
    kipp_batch_item items[SERVE_MAX_BATCH];
    double t[6];
    t[0] = serve_now();
    int n = plan_fitting(s, items);
    pthread_mutex_unlock(&s->mu);
    char err[256] = "";
    t[1] = serve_now();
    int rc = kipp_eval_batch(s->m, items, (size_t)n, err, sizeof err);
    t[2] = serve_now();
    for (int k = 0; k < s->n_act && !rc; k++) /* the scheduler alone changes act[] */
        if (s->act[k]->it.token_count) advance(s->act[k], t[2] - t[1]);
    t[3] = serve_now();
    pthread_mutex_lock(&s->mu);
    t[4] = serve_now();
    /* choice_finish swaps the last active choice into slot k: walk backwards. */
    for (int k = s->n_act; k-- > 0;) {
        sched_choice *c = s->act[k];
        if (!c->it.token_count) continue;
        int why = FIN_ERROR;
        if (rc) snprintf(c->job->error, sizeof c->job->error, "evaluation failed: %s", err);
        else if (c->adv_rc) snprintf(c->job->error, sizeof c->job->error, "%s", c->err);
        else {
            if (c->spec_step) serve_metrics_on_spec(c->spec_d[0], c->spec_d[1], c->spec_d[2]);
            why = publish(s, c, &c->ev, t[4]);
        }
        if (!why && c->job->cancelled) why = FIN_CANCELLED;
        if (why) choice_finish(s, k, why);
    }
    t[5] = serve_now();
    const double phase[SERVE_STEP_PHASES] = {t[1] - t[0], t[2] - t[1], t[3] - t[2], t[4] - t[3], t[5] - t[4]};
    serve_metrics_on_step(phase, &s->load, s->target_s, s->capped, s->burst, s->cost.theta);
    if (!rc) serve_cost_observe(&s->cost, &s->load, t[5] - t[0]);
}

static void drop_cancelled(serve_sched *s)
{
    for (int k = s->n_act; k-- > 0;)
        if (s->act[k]->job->cancelled) choice_finish(s, k, FIN_CANCELLED);
}

static void *sched_main(void *arg)
{
    serve_sched *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        serve_sched_run_tasks(s);
        drop_cancelled(s);
        admit(s);
        if (s->end_all) end_everything(s), serve_embed_fail_all(&s->eq, KIPP_EBACKEND, "the server is shutting down"),
            pthread_cond_broadcast(&s->cv);
        count_running(s);
        serve_sched_embed_turn(s);
        if (s->n_act == 0) {
            if (serve_load_pending(s->head)) serve_sched_wait(s, 2); /* a disk read ends without a signal */
            else if (!s->eq.head && !s->tasks) pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        step(s);
        serve_sched_pool_snapshot(s);
        pthread_cond_broadcast(&s->cv);
    }
    drop_cancelled(s);
    serve_embed_fail_all(&s->eq, KIPP_EBACKEND, "the server is shutting down");
    serve_sched_run_tasks(s); /* waiters queued before stop still get their answer */
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

serve_sched *serve_sched_start(kipp_model *m, const serve_sched_opts *o, char *err, size_t errlen)
{
    serve_sched *s = calloc(1, sizeof *s);
    if (!s) return snprintf(err, errlen, "out of memory"), NULL;
    if (o->max_choices < SERVE_MAX_N || o->max_choices > SERVE_MAX_BATCH) {
        snprintf(err, errlen, "--max-batch %d is out of range, expected %d..%d", o->max_choices, SERVE_MAX_N, SERVE_MAX_BATCH);
        free(s);
        return NULL;
    }
    s->m = m, s->o = *o;
    serve_metrics_on_start(o->pool_blocks ? o->pool_blocks : o->kv_budget_blocks);
    kipp_model_get_info(m, &s->info);
    s->seed_salt = (uint64_t)time(NULL) ^ ((uint64_t)(uintptr_t)s << 16);
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->tok, NULL);
    pthread_cond_init(&s->cv, NULL);
    serve_sched_pool_snapshot(s); /* /metrics shows the pool from the first request, before the thread's first turn */
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
        serve_load_drop(s->m, j); /* the scheduler thread has ended: the model is this thread's */
        serve_job_unref(j);
    }
    free(s);
}
