/*
 * logprobs.c - log-probabilities of the raw logits for the OpenAI logprobs
 * fields: the chosen token's and the n best alternatives', and the growing
 * per-choice list the renderer reads; and each token's offset in the text,
 * from which reasoning_tokens is counted.
 */
#include <math.h>
#include <stdlib.h>

#include "server/serve.h"

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
void serve_logprob_of(const float *row, uint32_t V, uint32_t id, int n_top, serve_lp *rec)
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

int serve_push_lp(serve_choice_out *o, const serve_lp *rec)
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

int serve_push_tok(serve_choice_out *o, uint32_t off)
{
    if (o->n_tok == o->cap_tok) {
        size_t cap = o->cap_tok ? o->cap_tok * 2 : 64;
        uint32_t *p = realloc(o->tok_off, cap * sizeof *p);
        if (!p) return -1;
        o->tok_off = p, o->cap_tok = cap;
    }
    o->tok_off[o->n_tok++] = off;
    return 0;
}
