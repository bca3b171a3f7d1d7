/*
 * sched_embed.c - embedding requests on the scheduler thread (issue 56).
 *
 * The scheduler thread owns the engine (sched.c), so an embedding request is
 * queued here and run by that thread between generation steps: each turn of
 * its loop runs one group of the oldest request's inputs with one kipp_embed
 * (one kipp_eval_batch, no logits: weights read once per backend round, the
 * head skipped), then one generation step. A group is every input left while
 * nothing generates, else as many as fit the step's token budget
 * (--step-tokens; at least one input), so a decode waits at most one
 * step-sized group, as behind a prefill chunk. On a pooled model a group also
 * keeps to half the pool's blocks (its sessions take pool blocks while they
 * run, and give them back, published, when destroyed).
 */
#include <stdio.h>
#include <string.h>

#include "server/serve.h"

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
