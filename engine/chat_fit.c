/*
 * chat_fit.c - kipp_chat_tokenize_fit: a conversation cut to a context size
 * (seed 002 "Data flow": keep head (system) + tail (latest
 * turns), reserve room for the answer).
 *
 * Cuts are only at turn starts (user messages), so a turn and a tool-call block
 * inside it are never split, and the kept part still starts with the system
 * message: a KV pool or a chat session keeps reusing that prefix.
 *
 * The token count of "system + turns j.." falls as j grows (the template renders
 * each message on its own, markers between them), so the smallest j that fits
 * is found by bisection: a conversation that fits costs one tokenization, an
 * oversize one O(log turns). Uses only the public API (kipp.h).
 */
#include <stdlib.h>
#include <string.h>

#include "base/errbuf.h"
#include "engine/kipp.h"

typedef struct {
    const kipp_model *model;
    const kipp_chat_message *msgs;
    size_t n, head;            /* head: 1 when msgs[0] is the system message */
    const kipp_chat_options *opts;
    kipp_chat_message *view;   /* [n] scratch: head + the kept suffix */
} fit_ctx;

typedef struct {
    uint32_t *ids;
    size_t n_ids;
    char *text;
    size_t text_len;
} fit_try;

static void try_free(fit_try *t)
{
    free(t->ids), free(t->text);
    *t = (fit_try){0};
}

/* Render + tokenize the system message (if any) and msgs[from..n) into *t. */
static int try_from(fit_ctx *c, size_t from, fit_try *t, int want_text, char *err, size_t errlen)
{
    size_t k = 0;
    for (size_t i = 0; i < c->head; i++) c->view[k++] = c->msgs[i];
    for (size_t i = from; i < c->n; i++) c->view[k++] = c->msgs[i];
    return kipp_chat_tokenize(c->model, c->view, k, c->opts, &t->ids, &t->n_ids, want_text ? &t->text : NULL,
                              want_text ? &t->text_len : NULL, err, errlen);
}

int kipp_chat_tokenize_fit(const kipp_model *model, const kipp_chat_message *msgs, size_t n,
                           const kipp_chat_options *opts, uint32_t n_ctx, int64_t reserve, size_t *n_dropped,
                           uint32_t **ids, size_t *n_ids, char **text, size_t *text_len, char *err, size_t errlen)
{
    if (!n_dropped || !ids || !n_ids)
        return kipp_err(err, errlen, KIPP_EINVAL, "kipp_chat_tokenize_fit: n_dropped, ids or n_ids is NULL, "
                                                  "expected pointers");
    *n_dropped = 0;
    if (n_ctx == 0) return kipp_err(err, errlen, KIPP_EINVAL, "n_ctx is 0, expected a context of at least 1 token");
    uint64_t cap = n_ctx / KIPP_CHAT_FIT_RESERVE_MAX_DIV;
    uint64_t need_free = reserve < 0 ? n_ctx / KIPP_CHAT_FIT_RESERVE_DIV : (uint64_t)reserve < cap ? (uint64_t)reserve : cap;
    fit_ctx c = {.model = model, .msgs = msgs, .n = n, .opts = opts,
                 .head = n > 0 && msgs[0].role == KIPP_ROLE_SYSTEM};
    /* Turn starts after the head: the head index itself (the oldest turn) and every user message. */
    size_t *starts = malloc((n + 1) * sizeof *starts), m = 0;
    c.view = calloc(n ? n : 1, sizeof *c.view);
    fit_try best = {0}, t = {0};
    int rc = starts && c.view ? 0 : KIPP_ENOMEM;
    for (size_t i = c.head; !rc && i < n; i++)
        if (i == c.head || msgs[i].role == KIPP_ROLE_USER) starts[m++] = i;
    size_t best_j = 0;
    if (!rc) rc = try_from(&c, c.head, &best, text != NULL, err, errlen);
    if (!rc && best.n_ids + need_free > n_ctx && m > 1) {
        /* fits(j) is monotone in j: bisect for the smallest j in [1, m-1] that fits, else m-1 (the newest turn). */
        size_t lo = 1, hi = m - 1;
        try_free(&best);
        rc = try_from(&c, starts[hi], &best, text != NULL, err, errlen);
        best_j = hi;
        if (!rc && best.n_ids + need_free <= n_ctx) {
            while (!rc && lo < hi) { /* invariant: j = hi fits (held in best), every j < lo does not */
                size_t mid = lo + (hi - lo) / 2;
                rc = try_from(&c, starts[mid], &t, text != NULL, err, errlen);
                if (rc) break;
                if (t.n_ids + need_free <= n_ctx) {
                    try_free(&best);
                    best = t, best_j = mid, hi = mid;
                    t = (fit_try){0};
                } else {
                    try_free(&t);
                    lo = mid + 1;
                }
            }
        }
    }
    try_free(&t);
    size_t first = m ? starts[best_j] : c.head;
    free(starts), free(c.view);
    if (rc) {
        try_free(&best);
        return rc;
    }
    *n_dropped = first - c.head;
    *ids = best.ids, *n_ids = best.n_ids;
    if (text) *text = best.text;
    if (text_len) *text_len = best.text_len;
    return 0;
}
