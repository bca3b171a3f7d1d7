/*
 * sched_embed.c - side work on the scheduler thread: embedding requests
 * (issue 56) and serve_sched_run tasks (rerank/score), between steps.
 *
 * The scheduler thread owns the engine (sched.c), so an embedding request is
 * queued here and run by that thread between generation steps: each turn of
 * its loop runs one group of the oldest request's inputs with one kipp_embed
 * (one kipp_eval_batch, no logits: weights read once per backend round, the
 * head skipped), then one generation step. A group is every input left while
 * nothing generates, else as many as fit SERVE_EMBED_BUSY_TOKENS (or
 * --step-tokens if smaller; at least one input), so a decode waits at most
 * one such group, as behind a prefill chunk. On a pooled model a group also
 * keeps to half the pool's blocks (its sessions take pool blocks while they
 * run, and give them back, published, when destroyed).
 */
#include <stdio.h>
#include <string.h>

#include "server/sched_internal.h"

void serve_embed_queue_push(serve_embed_queue *q, serve_embed_job *j)
{
    j->next_job = NULL;
    if (q->tail) q->tail->next_job = j;
    else q->head = j;
    q->tail = j;
}

static void pop(serve_embed_queue *q)
{
    serve_embed_job *j = q->head;
    q->head = j->next_job;
    if (!q->head) q->tail = NULL;
    j->done = 1;
}

/* Inputs [from, end) of j that one group takes under the two limits; at least one. */
static size_t group_end(const serve_embed_job *j, size_t from, uint64_t max_tokens, uint64_t max_blocks)
{
    uint64_t tok = 0, blk = 0;
    size_t e = from;
    while (e < j->n) {
        tok += j->lens[e], blk += (j->lens[e] + 31) / 32;
        if (e > from && (tok > max_tokens || blk > max_blocks)) break;
        e++;
    }
    return e;
}

int serve_embed_run(serve_embed_queue *q, kipp_model *m, pthread_mutex_t *mu, uint64_t max_tokens, uint64_t max_blocks)
{
    serve_embed_job *j = q->head;
    if (!j) return 0;
    if (j->cancelled) { /* its client hung up: nothing more is computed for it */
        pop(q);
        return 1;
    }
    size_t from = j->next, end = group_end(j, from, max_tokens, max_blocks);
    char err[256] = "";
    pthread_mutex_unlock(mu); /* the HTTP threads only read done/rc under mu; the buffers are ours until done */
    int rc = kipp_embed(m, j->ids + from, j->lens + from, end - from, j->dims, j->out + from * (size_t)j->dims, err, sizeof err);
    pthread_mutex_lock(mu);
    j->next = end;
    if (rc) j->rc = rc, snprintf(j->error, sizeof j->error, "%s", err);
    if (rc || end == j->n) pop(q);
    return 1;
}

void serve_embed_fail_all(serve_embed_queue *q, int rc, const char *why)
{
    while (q->head) {
        q->head->rc = rc;
        snprintf(q->head->error, sizeof q->head->error, "%s", why);
        pop(q);
    }
}

/* ---- the scheduler side: queueing and the thread's turns (state in sched_internal.h) ---- */

void serve_sched_embed(serve_sched *s, serve_embed_job *j)
{
    pthread_mutex_lock(&s->mu);
    if (s->end_all || s->stop) j->rc = KIPP_EBACKEND, snprintf(j->error, sizeof j->error, "the server is shutting down"), j->done = 1;
    else serve_embed_queue_push(&s->eq, j);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void serve_sched_embed_turn(serve_sched *s)
{
    uint64_t busy = s->o.step_tokens < SERVE_EMBED_BUSY_TOKENS ? s->o.step_tokens : SERVE_EMBED_BUSY_TOKENS;
    uint64_t tokens = s->n_act ? busy : SERVE_EMBED_IDLE_TOKENS;
    if (serve_embed_run(&s->eq, s->m, &s->mu, tokens, s->o.pool_blocks ? s->o.pool_blocks / 2 : UINT64_MAX))
        pthread_cond_broadcast(&s->cv);
}

int serve_sched_run(serve_sched *s, serve_task *t)
{
    pthread_mutex_lock(&s->mu);
    t->done = 0, t->next = NULL, t->rc = -1;
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    if (s->tasks_tail) s->tasks_tail->next = t;
    else s->tasks = t;
    s->tasks_tail = t;
    pthread_cond_broadcast(&s->cv);
    while (!t->done) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return t->rc;
}

void serve_sched_run_tasks(serve_sched *s)
{
    while (s->tasks) {
        serve_task *t = s->tasks;
        if (!(s->tasks = t->next)) s->tasks_tail = NULL;
        pthread_mutex_unlock(&s->mu);
        int rc = t->fn(s->m, t->ctx);
        pthread_mutex_lock(&s->mu);
        t->rc = rc, t->done = 1;
        serve_sched_pool_snapshot(s);
        pthread_cond_broadcast(&s->cv);
    }
}
