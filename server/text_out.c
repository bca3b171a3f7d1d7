/*
 * text_out.c - what a choice may show of its raw output.
 *
 * Raw output is the generation's text (kipp_gen_text: complete UTF-8 only,
 * already cut before a stop string, with the bytes that may still become one
 * held back as not final). The view holds back a tail that could still grow
 * into a think marker until the choice is final, and splits reasoning
 * ("<think>...</think>") from content when the request thinks. The same
 * function gives the streamed prefix and the final text, so concatenated
 * deltas equal the non-streamed text byte for byte.
 */
#include <stdlib.h>
#include <string.h>

#include "server/serve.h"

int serve_buf_put(serve_buf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2 + 64;
        char *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p, b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

void serve_buf_free(serve_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* Longest k < strlen(pat) with s[n-k..n) == pat[0..k): a tail that may grow into pat. */
static size_t partial_tail(const char *s, size_t n, const char *pat, size_t plen)
{
    for (size_t k = plen - 1 < n ? plen - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, pat, k)) return k;
    return 0;
}

static const char *find(const char *h, size_t n, const char *needle, size_t k)
{
    if (k == 0 || k > n) return NULL;
    for (size_t i = 0; i + k <= n; i++)
        if (h[i] == needle[0] && !memcmp(h + i, needle, k)) return h + i;
    return NULL;
}

static void lstrip_nl(const char *raw, size_t *off, size_t *len)
{
    while (*len && raw[*off] == '\n') (*off)++, (*len)--;
}

/* 1 when r's replies are parsed for tool calls (serve_tools_active, inlined:
 * this file links without api_tools.c). */
static int tools_on(const serve_req *r) { return r->n_tools > 0 && r->tool_choice != SERVE_TOOL_NONE; }

/* The reasoning/content split of raw[0..L) (already stop-cut): one pass of
 * the tag-driven state machine. State REASONING starts at the reply's start
 * when the prompt opened <think> (a redundant "<think>" the model repeats is
 * the marker, not text), or after a leading "<think>"; anything else starts
 * in CONTENT. REASONING ends at "</think>" (dropped, with the newlines after
 * it) or, when tools are active, at "<tool_call>", which stays in the content
 * so the tool parser reads the call (a call made while thinking ends the
 * thinking: it is neither lost nor shown as reasoning). Cut off before
 * either, everything is reasoning. Not final, a tail that could still grow
 * into one of the markers is held back. */
static void split_think(const serve_req *r, const char *raw, size_t L, int final, serve_view *v)
{
    size_t body = 0;
    if (L >= 7 && !memcmp(raw, "<think>", 7)) {
        body = 7;
    } else if (!final && L < 7 && !memcmp(raw, "<think>", L)) {
        return; /* could still become "<think>": show nothing yet */
    } else if (!r->starts_in_reasoning) {
        v->content_off = 0, v->content_len = L;
        return;
    }
    const char *close = find(raw + body, L - body, "</think>", 8);
    const char *call = tools_on(r) ? find(raw + body, L - body, "<tool_call>", 11) : NULL;
    if (call && (!close || call < close)) {
        size_t p = (size_t)(call - raw);
        v->reasoning_off = body, v->reasoning_len = p - body;
        v->content_off = p, v->content_len = L - p;
    } else if (close) {
        size_t p = (size_t)(close - raw);
        v->reasoning_off = body, v->reasoning_len = p - body;
        v->content_off = p + 8, v->content_len = L - p - 8;
        lstrip_nl(raw, &v->content_off, &v->content_len);
    } else {
        size_t hold = final ? 0 : partial_tail(raw + body, L - body, "</think>", 8);
        size_t hc = final || !tools_on(r) ? 0 : partial_tail(raw + body, L - body, "<tool_call>", 11);
        v->reasoning_off = body, v->reasoning_len = L - body - (hc > hold ? hc : hold);
        v->content_off = L;
    }
    lstrip_nl(raw, &v->reasoning_off, &v->reasoning_len);
}

void serve_text_view(const serve_req *r, const char *raw, size_t n, int final, serve_view *v)
{
    memset(v, 0, sizeof *v);
    if (r->chat && r->thinking) split_think(r, raw, n, final, v);
    else v->content_off = 0, v->content_len = n;
}

int serve_reply_split(const serve_req *r, const char *raw, size_t n, int final, serve_reply *out)
{
    memset(out, 0, sizeof *out);
    serve_text_view(r, raw, n, final, &out->view);
    out->reasoning = raw + out->view.reasoning_off, out->reasoning_len = out->view.reasoning_len;
    out->content = raw + out->view.content_off, out->content_len = out->view.content_len;
    if (!r->chat || !tools_on(r)) return 0;
    if (serve_tool_parse(r->tools, r->n_tools, out->content, out->content_len, final, &out->calls)) {
        serve_tool_out_free(&out->calls); /* out of memory: the text as it is */
        return -1;
    }
    out->content = out->calls.content.p ? out->calls.content.p : "", out->content_len = out->calls.content.n;
    return 0;
}

uint64_t serve_reasoning_tokens(const serve_req *r, const serve_choice_out *o)
{
    const char *raw = o->raw.p ? o->raw.p : "";
    serve_view v;
    serve_text_view(r, raw, o->raw.n, 1, &v);
    int opened = r->starts_in_reasoning || (o->raw.n >= 7 && !memcmp(raw, "<think>", 7));
    if (!r->chat || !r->thinking || !opened) return 0;
    size_t end = v.reasoning_off + v.reasoning_len; /* where the marker that ended it starts, or the text's end */
    if (o->raw.n - end >= 8 && !memcmp(raw + end, "</think>", 8)) end += 8;
    uint64_t n = 0;
    while (n < o->n_tok && o->tok_off[n] < end) n++;
    return n;
}

void serve_reply_free(serve_reply *out)
{
    serve_tool_out_free(&out->calls);
    memset(out, 0, sizeof *out);
}
