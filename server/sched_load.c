/*
 * sched_load.c - a queued request's prompt blocks read from the KV disk tier
 * off the scheduler thread (issue 54; serve.h serve_load_*, engine side in
 * engine/kv_disk_load.c).
 *
 * Reading 128 blocks of the 0.6B back and verifying them takes about 0.4 s;
 * done inside the prefix match at admission, that is 0.4 s added to every
 * running stream's next token. Instead the request at the head of the queue
 * waits, "loading", while the tier's I/O thread reads its blocks into pool
 * blocks reserved for them; the scheduler keeps stepping the running
 * streams, checks the read between steps, and admits the request once it is
 * over. Admission keeps its order: requests behind a loading head wait too,
 * as they would behind one that waits for pool room.
 */
#include "server/serve.h"

int serve_load_wait(kipp_model *m, serve_job *j, uint32_t room)
{
    if (!j->kv_load_tried) {
        j->kv_load_tried = 1;
        const serve_req *r = &j->req;
        char err[256];
        if (r->n_prompt > 1 && !(r->echo && r->logprobs) &&
            kipp_model_disk_load_start(m, r->prompt_ids, (uint32_t)r->n_prompt - 1, room, &j->kv_load, err, sizeof err))
            j->kv_load = NULL; /* out of memory for the read's bookkeeping: the prompt is evaluated instead */
    }
    if (!j->kv_load) return 0;
    if (!kipp_model_disk_load_ready(m, j->kv_load)) return 1;
    serve_load_drop(m, j);
    return 0;
}

void serve_load_drop(kipp_model *m, serve_job *j)
{
    kipp_model_disk_load_finish(m, j->kv_load);
    j->kv_load = NULL;
}

int serve_load_pending(const serve_job *head)
{
    for (const serve_job *q = head; q; q = q->next)
        if (q->kv_load) return 1;
    return 0;
}
