/*
 * sched_budget.c - the scheduler's KV admission arithmetic at submission
 * (sched.c): a job's worst case in 32-position blocks, and the 400s for a job
 * whose choices can never fit the KV budget (unpooled) or the pool, naming
 * the one field to change.
 */
#include <stdio.h>

#include "server/serve.h"

uint64_t serve_blocks_of(uint32_t cap) { return (cap + 31) / 32; }

/* KV blocks a job's sessions hold: n choices of prompt + max_tokens positions. */
uint64_t serve_job_blocks(const serve_job *j)
{
    return (uint64_t)j->req.n * serve_blocks_of((uint32_t)(j->req.n_prompt + (size_t)j->req.max_tokens));
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
int serve_budget_fail(const serve_sched_opts *o, const serve_job *j, uint64_t budget, serve_error *e)
{
    const serve_req *r = &j->req;
    const char *flag = o->pool_blocks ? "--kv-pool-mib" : "--kv-mib";
    char gen[160], hint[160];
    gen_text(r, gen, sizeof gen);
    int64_t fit = (int64_t)(budget / (uint64_t)r->n * 32) - (int64_t)r->n_prompt; /* a choice's room to generate */
    uint64_t min_blocks = serve_blocks_of((uint32_t)(r->n_prompt + 1)), n_fit = budget / min_blocks;
    const char *param = r->max_tokens_field;
    if (fit > 0)
        snprintf(hint, sizeof hint, "send %s <= %lld%s", r->max_tokens_field, (long long)fit, r->n > 1 ? " or lower n" : "");
    else if (n_fit > 0)
        param = "n", snprintf(hint, sizeof hint, "lower n to at most %llu with this prompt", (unsigned long long)n_fit);
    else
        param = r->chat ? "messages" : "prompt", snprintf(hint, sizeof hint, "shorten the prompt");
    serve_fail(e, 400, "invalid_request_error", param,
               "n %d x (%zu prompt + %s) positions need %llu KV blocks of 32, above the server's budget of %llu (%s); "
               "%s, or start kipp-serve with a larger %s", r->n, r->n_prompt, gen, (unsigned long long)serve_job_blocks(j),
               (unsigned long long)budget, flag, hint, flag);
    snprintf(e->code, sizeof e->code, "kv_budget_exceeded");
    return -1;
}

/* Pooled: positions a new choice reserves at admission (its prompt and a step budget). */
static size_t admit_positions(const serve_req *r)
{
    return r->n_prompt + (r->max_tokens < SERVE_RESERVE ? (size_t)r->max_tokens : SERVE_RESERVE);
}

/* Pooled admission rule at submission: one choice alone must fit the pool
 * with its worst case, so the oldest choice can always finish (a generation
 * budget the client did not send is cut to the pool instead, ending in
 * finish_reason "length"); all n choices must fit with their admission
 * reservation. Otherwise the 400 names the field to change. */
int serve_pool_check(const serve_sched_opts *o, serve_job *j, serve_error *e)
{
    serve_req *r = &j->req;
    uint64_t total = o->pool_blocks, pos = total * 32;
    const char *param;
    char gen[160], hint[160];
    if (r->n_prompt + 1 > pos) {
        param = r->chat ? "messages" : "prompt";
        snprintf(hint, sizeof hint, "shorten the prompt");
    } else if (r->n_prompt + (size_t)r->max_tokens > pos && r->max_tokens_asked >= 0) {
        param = r->max_tokens_field;
        snprintf(hint, sizeof hint, "send %s <= %llu", r->max_tokens_field, (unsigned long long)(pos - r->n_prompt));
    } else {
        if (r->n_prompt + (size_t)r->max_tokens > pos) r->max_tokens = (int64_t)(pos - r->n_prompt); /* nobody asked for more */
        uint64_t each = serve_blocks_of((uint32_t)admit_positions(r));
        if ((uint64_t)r->n * each <= total) return 0;
        param = "n", snprintf(hint, sizeof hint, "lower n to at most %llu with this prompt", (unsigned long long)(total / each));
    }
    gen_text(r, gen, sizeof gen);
    serve_fail(e, 400, "invalid_request_error", param,
               "n %d x (%zu prompt + %s) positions do not fit the KV pool of %llu blocks of 32 (--kv-pool-mib): one "
               "choice must fit it whole, and all n together with their prompt and up to %d more positions; %s, or start "
               "kipp-serve with a larger --kv-pool-mib", r->n, r->n_prompt, gen, (unsigned long long)total, SERVE_RESERVE,
               hint);
    snprintf(e->code, sizeof e->code, "kv_budget_exceeded");
    return -1;
}
