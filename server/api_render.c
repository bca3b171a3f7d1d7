/*
 * api_render.c - job state -> OpenAI JSON: non-streamed responses and SSE
 * chunks (errors: serve_error.c). Text comes from serve_text_view, so
 * streamed deltas and the non-streamed text are cut from the same bytes.
 * Callers hold the scheduler mutex; token texts need no engine lock.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/serve.h"

static json_t *token_text(const serve_info *si, uint32_t id, json_t **bytes)
{
    char buf[256];
    size_t n = 0;
    if (kipp_detokenize(si->model, &id, 1, buf, sizeof buf, &n, NULL, 0)) n = 0;
    if (bytes) {
        *bytes = json_array();
        for (size_t i = 0; i < n; i++) json_array_append_new(*bytes, json_integer((unsigned char)buf[i]));
    }
    return serve_json_text(buf, n);
}

static const char *finish_name(int f) { return f == FIN_LENGTH ? "length" : "stop"; }

static json_t *usage(const serve_job *j)
{
    uint64_t gen = 0;
    for (int i = 0; i < j->req.n; i++) gen += j->out[i].n_gen;
    json_t *u = json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)j->req.n_prompt, "completion_tokens",
                          (json_int_t)gen, "total_tokens", (json_int_t)(j->req.n_prompt + gen), "prompt_tokens_details",
                          "cached_tokens", (json_int_t)j->cached_tokens);
    if (!u || !j->req.chat) return u;
    /* chat: how many of the oldest messages were left out to fit the context (0 when none), and
     * OpenAI's completion_tokens_details.reasoning_tokens: the tokens up to and with </think> */
    uint64_t reasoning = 0;
    for (int i = 0; i < j->req.n; i++) reasoning += serve_reasoning_tokens(&j->req, &j->out[i]);
    json_object_set_new(u, "truncated_messages", json_integer((json_int_t)j->req.truncated_messages));
    json_object_set_new(u, "completion_tokens_details", json_pack("{s:I}", "reasoning_tokens", (json_int_t)reasoning));
    return u;
}

/* llama.cpp-style timings: prompt and predicted counts, ms, per-token ms, tok/s. */
static json_t *timings(const serve_job *j)
{
    double t_end = j->t_prompt_done;
    uint64_t gen = 0;
    for (int i = 0; i < j->req.n; i++) {
        gen += j->out[i].n_gen;
        if (j->out[i].t_last > t_end) t_end = j->out[i].t_last;
    }
    double pms = j->t_prompt_done > 0 ? (j->t_prompt_done - j->t_arrive) * 1e3 : 0;
    double gms = j->t_prompt_done > 0 ? (t_end - j->t_prompt_done) * 1e3 : 0;
    double np = (double)j->req.n_prompt, ng = (double)gen;
    return json_pack("{s:I, s:f, s:f, s:f, s:I, s:f, s:f, s:f}", "prompt_n", (json_int_t)j->req.n_prompt, "prompt_ms", pms,
                     "prompt_per_token_ms", np > 0 ? pms / np : 0.0, "prompt_per_second", pms > 0 ? np * 1e3 / pms : 0.0,
                     "predicted_n", (json_int_t)gen, "predicted_ms", gms, "predicted_per_token_ms", ng > 0 ? gms / ng : 0.0,
                     "predicted_per_second", gms > 0 ? ng * 1e3 / gms : 0.0);
}

/* ---- logprobs ---- */

static json_t *chat_lp_entry(const serve_info *si, uint32_t id, float lp, const serve_lp *alts)
{
    json_t *bytes, *tok = token_text(si, id, &bytes);
    json_t *o = json_pack("{s:o, s:f, s:o}", "token", tok, "logprob", (double)lp, "bytes", bytes);
    if (alts) {
        json_t *top = json_array();
        for (int t = 0; t < alts->n_top; t++) json_array_append_new(top, chat_lp_entry(si, alts->top_ids[t], alts->top_lp[t], NULL));
        json_object_set_new(o, "top_logprobs", top);
    }
    return o;
}

/* Chat: {"content": [...]} over lp[from..to). */
static json_t *chat_logprobs(const serve_info *si, const serve_lp *lp, size_t from, size_t to)
{
    json_t *arr = json_array();
    for (size_t i = from; i < to; i++) json_array_append_new(arr, chat_lp_entry(si, lp[i].id, lp[i].logprob, &lp[i]));
    return json_pack("{s:o}", "content", arr);
}

/* Completions (legacy): parallel lists; base_off shifts text_offset (echo). */
static void legacy_add(const serve_info *si, json_t *o, const serve_lp *e, int has_lp, size_t off)
{
    json_array_append_new(json_object_get(o, "tokens"), token_text(si, e->id, NULL));
    json_array_append_new(json_object_get(o, "token_logprobs"), has_lp ? json_real(e->logprob) : json_null());
    json_t *top = has_lp ? json_object() : json_null();
    for (int t = 0; has_lp && t < e->n_top; t++) {
        json_t *k = token_text(si, e->top_ids[t], NULL);
        json_object_set_new(top, json_string_value(k), json_real(e->top_lp[t]));
        json_decref(k);
    }
    json_array_append_new(json_object_get(o, "top_logprobs"), top);
    json_array_append_new(json_object_get(o, "text_offset"), json_integer((json_int_t)off));
}

/* Code points in p[n] (OpenAI and vLLM count text_offset in characters, not
 * bytes): every byte that does not continue a UTF-8 sequence starts one. */
static size_t chars_in(const char *p, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)p[i] & 0xC0) != 0x80;
    return c;
}

static json_t *legacy_logprobs(const serve_info *si, const serve_job *j, const serve_choice_out *o, size_t from, size_t to,
                               int with_prompt)
{
    json_t *r = json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
    size_t base = 0; /* with echo, offsets count from the prompt's start: the text begins with it */
    if (j->req.echo && j->req.prompt_text) base = chars_in(j->req.prompt_text, strlen(j->req.prompt_text));
    if (with_prompt && j->prompt_top) {
        size_t off = 0;
        for (size_t p = 0; p < j->req.n_prompt; p++) {
            serve_lp e = j->prompt_top[p];
            e.id = j->req.prompt_ids[p];
            legacy_add(si, r, &e, p > 0, off);
            char buf[256];
            size_t n = 0;
            if (!kipp_detokenize(si->model, &e.id, 1, buf, sizeof buf, &n, NULL, 0)) off += chars_in(buf, n);
        }
    }
    size_t pos = 0, chars = 0; /* text_off only grows: count the raw text once */
    for (size_t i = from; i < to; i++) {
        size_t off = o->lp[i].text_off < o->raw.n ? o->lp[i].text_off : o->raw.n;
        if (off < pos) pos = chars = 0;
        chars += chars_in(o->raw.p + pos, off - pos), pos = off;
        legacy_add(si, r, &o->lp[i], 1, base + chars);
    }
    return r;
}

/* lp entries whose text starts inside the final text (a stop string may cut the tail). */
static size_t lp_visible(const serve_choice_out *o, size_t upto_bytes)
{
    size_t k = 0;
    while (k < o->n_lp && (o->lp[k].text_off < upto_bytes || (o->lp[k].text_len == 0 && o->lp[k].text_off <= upto_bytes))) k++;
    return k;
}

/* ---- tool calls ---- */

/* What a chat choice shows: reasoning, content and, with tools, the calls
 * (serve_reply_split, the state machine every API shares). */
typedef serve_reply shown;

static void shown_make(const serve_req *r, const char *raw, size_t n, int final, shown *sh)
{
    serve_reply_split(r, raw, n, final, sh); /* out of memory: the text as it is, no calls */
}

/* "call_" and 24 hex digits, a function of (job's random public id, choice,
 * the call's offset in the content): the same in a stream and in the whole
 * response, and as unique across processes as the public id. */
static void call_id(const serve_job *j, int i, size_t k, char out[32])
{
    uint64_t x = 0xcbf29ce484222325ull, h[2]; /* FNV-1a of pub_id */
    for (const char *p = j->pub_id; *p; p++) x = (x ^ (unsigned char)*p) * 0x100000001b3ull;
    x ^= ((uint64_t)i << 56) ^ ((uint64_t)k * 0x9e3779b97f4a7c15ull); /* k odd-multiplied: every offset its own */
    for (int r = 0; r < 2; r++) { /* splitmix64: every input bit reaches both halves */
        x += 0x9e3779b97f4a7c15ull;
        uint64_t z = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        h[r] = z ^ (z >> 31);
    }
    snprintf(out, 32, "call_%016llx%08llx", (unsigned long long)h[0], (unsigned long long)(h[1] & 0xffffffffu));
}

static const char *chat_finish(const shown *sh, int f)
{
    return sh->calls.n_calls && f == FIN_STOP ? "tool_calls" : finish_name(f);
}

/* ---- non-streamed ---- */

static json_t *chat_message(const serve_job *j, int i, const shown *sh)
{
    const serve_req *r = &j->req;
    /* no content beside calls or reasoning (a reply cut off while thinking): null, as OpenAI and vLLM send it */
    int none = !sh->content_len && (sh->calls.n_calls || (r->thinking && sh->reasoning_len));
    json_t *msg = json_pack("{s:s, s:o}", "role", "assistant", "content",
                            none ? json_null() : serve_json_text(sh->content, sh->content_len));
    if (r->thinking && sh->reasoning_len) json_object_set_new(msg, "reasoning_content", serve_json_text(sh->reasoning, sh->reasoning_len));
    if (!sh->calls.n_calls) return msg;
    json_t *calls = json_array();
    for (size_t k = 0; k < sh->calls.n_calls; k++) {
        char id[32];
        call_id(j, i, sh->calls.calls[k].at, id);
        json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function", "name",
                                               sh->calls.calls[k].name, "arguments", sh->calls.calls[k].arguments));
    }
    json_object_set_new(msg, "tool_calls", calls);
    return msg;
}

static json_t *choice_json(const serve_info *si, const serve_job *j, int i)
{
    const serve_req *r = &j->req;
    const serve_choice_out *o = &j->out[i];
    serve_view v;
    serve_text_view(r, o->raw.p ? o->raw.p : "", o->raw.n, 1, &v);
    size_t nlp = lp_visible(o, o->raw.n);
    if (r->chat) {
        shown sh;
        shown_make(r, o->raw.p ? o->raw.p : "", o->raw.n, 1, &sh);
        json_t *c = json_pack("{s:i, s:s}", "index", i, "finish_reason", chat_finish(&sh, o->finish));
        json_object_set_new(c, "message", chat_message(j, i, &sh));
        json_object_set_new(c, "logprobs", r->logprobs ? chat_logprobs(si, o->lp, 0, nlp) : json_null());
        serve_reply_free(&sh);
        return c;
    }
    json_t *c = json_pack("{s:i, s:s}", "index", i, "finish_reason", finish_name(o->finish));
    serve_buf t = {0};
    if (r->echo && r->prompt_text) serve_buf_put(&t, r->prompt_text, strlen(r->prompt_text));
    serve_buf_put(&t, o->raw.p ? o->raw.p : "", v.content_len);
    json_object_set_new(c, "text", serve_json_text(t.p, t.n));
    free(t.p);
    json_object_set_new(c, "logprobs", r->logprobs ? legacy_logprobs(si, j, o, 0, nlp, r->echo) : json_null());
    return c;
}

char *serve_render_response(const serve_info *si, const serve_job *j)
{
    json_t *choices = json_array();
    for (int i = 0; i < j->req.n; i++) json_array_append_new(choices, choice_json(si, j, i));
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:o, s:o, s:o}", "id", j->pub_id, "object",
                          j->req.chat ? "chat.completion" : "text_completion", "created", (json_int_t)j->created, "model",
                          si->model_id, "choices", choices, "usage", usage(j), "timings", timings(j));
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* ---- streaming ---- */

static void sse(serve_buf *b, json_t *o)
{
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) return;
    serve_buf_put(b, "data: ", 6);
    serve_buf_put(b, s, strlen(s));
    serve_buf_put(b, "\n\n", 2);
    free(s);
}

static json_t *chunk(const serve_info *si, const serve_job *j, json_t *choices)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", j->pub_id, "object", j->req.chat ? "chat.completion.chunk" : "text_completion",
                     "created", (json_int_t)j->created, "model", si->model_id, "choices", choices);
}

/* One tool_calls delta of choice i as a chunk; tc stolen. */
static void call_chunk(const serve_info *si, const serve_job *j, int i, json_t *tc, serve_buf *out)
{
    sse(out, chunk(si, j, json_pack("[{s:i, s:{s:[o]}, s:n, s:n}]", "index", i, "delta", "tool_calls", tc, "logprobs",
                                    "finish_reason")));
}

/* A call's first delta (OpenAI's shape): stream index, id, type and name, empty arguments. */
static void call_head(const serve_info *si, const serve_job *j, int i, size_t index, size_t at, const char *name,
                      serve_buf *out)
{
    char id[32];
    call_id(j, i, at, id);
    call_chunk(si, j, i, json_pack("{s:I, s:s, s:s, s:{s:s, s:s}}", "index", (json_int_t)index, "id", id, "type",
                                   "function", "function", "name", name, "arguments", ""), out);
}

static void call_args(const serve_info *si, const serve_job *j, int i, size_t index, const char *a, size_t n, serve_buf *out)
{
    if (n) call_chunk(si, j, i, json_pack("{s:I, s:{s:o}}", "index", (json_int_t)index, "function", "arguments",
                                          serve_json_text(a, n)), out);
}

/* Choice i's calls since st: a call in progress gets its head once, then its
 * arguments as the model writes them (serve_call_part); a call parsed whole
 * gets the rest of them, or head and arguments when it was not in progress.
 * A call in progress whose block ends as no call (the model broke the format)
 * keeps what was sent: its stream index is not reused (docs/SERVING.md, "Streamed calls"). */
static void call_chunks(const serve_info *si, const serve_job *j, int i, const shown *sh, serve_stream_state *st,
                        serve_buf *out)
{
    for (size_t k = st->sent_calls[i]; k < sh->calls.n_calls; k++) {
        const serve_call *c = &sh->calls.calls[k];
        size_t len = strlen(c->arguments);
        if (!st->part_open[i] || st->part_at[i] != c->at || st->part_sent[i] > len) {
            st->part_index[i] = st->stream_calls[i]++, st->part_sent[i] = 0;
            call_head(si, j, i, st->part_index[i], c->at, c->name, out);
        }
        call_args(si, j, i, st->part_index[i], c->arguments + st->part_sent[i], len - st->part_sent[i], out);
        st->part_open[i] = 0;
    }
    st->sent_calls[i] = sh->calls.n_calls;
    const serve_call_part *p = &sh->calls.part;
    if (!p->name) return;
    if (!st->part_open[i] || st->part_at[i] != p->at) {
        st->part_open[i] = 1, st->part_at[i] = p->at, st->part_sent[i] = 0, st->part_index[i] = st->stream_calls[i]++;
        call_head(si, j, i, st->part_index[i], p->at, p->name, out);
    }
    if (p->args_len > st->part_sent[i]) {
        call_args(si, j, i, st->part_index[i], p->args + st->part_sent[i], p->args_len - st->part_sent[i], out);
        st->part_sent[i] = p->args_len;
    }
}

/* One choice's delta chunk: new reasoning/content bytes and new logprobs, or its finish. */
static void choice_chunk(const serve_info *si, const serve_job *j, int i, const shown *sh, size_t nlp,
                         serve_stream_state *st, const char *finish, serve_buf *out, json_t *extra_timings)
{
    const serve_req *r = &j->req;
    const serve_choice_out *o = &j->out[i];
    size_t nr = sh->reasoning_len - st->sent_reasoning[i], nc = sh->content_len - st->sent_content[i];
    json_t *c = json_pack("{s:i, s:o}", "index", i, "finish_reason", finish ? json_string(finish) : json_null());
    json_t *lp = json_null();
    int echo = !r->chat && r->echo && !st->echo_sent[i]; /* the prompt leads the first chunk, as in the whole text */
    if (r->logprobs && (nlp > st->sent_lp[i] || echo))
        lp = r->chat ? chat_logprobs(si, o->lp, st->sent_lp[i], nlp) : legacy_logprobs(si, j, o, st->sent_lp[i], nlp, echo);
    if (r->chat) {
        json_t *d = json_object();
        if (!st->role_sent[i]) json_object_set_new(d, "role", json_string("assistant"));
        if (nr) json_object_set_new(d, "reasoning_content", serve_json_text(sh->reasoning + st->sent_reasoning[i], nr));
        if (nc || !st->role_sent[i]) json_object_set_new(d, "content", serve_json_text(sh->content + st->sent_content[i], nc));
        json_object_set_new(c, "delta", d);
    } else {
        serve_buf t = {0};
        if (echo && r->prompt_text) serve_buf_put(&t, r->prompt_text, strlen(r->prompt_text));
        serve_buf_put(&t, sh->content + st->sent_content[i], nc);
        json_object_set_new(c, "text", serve_json_text(t.p ? t.p : "", t.n));
        serve_buf_free(&t);
        st->echo_sent[i] = 1;
    }
    json_object_set_new(c, "logprobs", lp);
    st->role_sent[i] = 1;
    st->sent_reasoning[i] = sh->reasoning_len, st->sent_content[i] = sh->content_len, st->sent_lp[i] = nlp;
    json_t *ch = chunk(si, j, json_pack("[o]", c));
    if (extra_timings) json_object_set_new(ch, "timings", extra_timings);
    sse(out, ch);
}

int serve_render_chunks(const serve_info *si, const serve_job *j, serve_stream_state *st, serve_buf *out)
{
    const serve_req *r = &j->req;
    int n_fin = 0;
    for (int i = 0; i < r->n; i++) n_fin += st->finish_sent[i];
    for (int i = 0; i < r->n && !st->done_sent; i++) {
        const serve_choice_out *o = &j->out[i];
        if (st->finish_sent[i] || o->finish == FIN_ERROR || o->finish == FIN_CANCELLED) continue;
        int fin = o->finish != FIN_NONE;
        shown sh;
        shown_make(r, o->raw.p ? o->raw.p : "", fin ? o->raw.n : o->raw_final, fin, &sh);
        size_t nlp = lp_visible(o, fin ? o->raw.n : o->raw_final);
        int news = sh.reasoning_len > st->sent_reasoning[i] || sh.content_len > st->sent_content[i] ||
                   (r->logprobs && nlp > st->sent_lp[i]) || (r->chat && !st->role_sent[i]) ||
                   (!r->chat && r->echo && !st->echo_sent[i] && j->t_prompt_done > 0);
        if (news) choice_chunk(si, j, i, &sh, nlp, st, NULL, out, NULL);
        call_chunks(si, j, i, &sh, st, out);
        if (fin) {
            st->finish_sent[i] = 1, n_fin++;
            json_t *tm = n_fin == r->n && j->done && !r->include_usage ? timings(j) : NULL;
            choice_chunk(si, j, i, &sh, nlp, st, r->chat ? chat_finish(&sh, o->finish) : finish_name(o->finish), out, tm);
        }
        serve_reply_free(&sh);
    }
    if (!j->done || st->done_sent) return st->done_sent;
    for (int i = 0; i < r->n; i++)
        if (j->out[i].finish == FIN_ERROR) {
            serve_error e;
            serve_fail(&e, 500, "server_error", "", "generation failed: %s", j->error[0] ? j->error : "engine error");
            char *s = serve_error_json(&e);
            serve_buf_put(out, "data: ", 6), serve_buf_put(out, s, strlen(s)), serve_buf_put(out, "\n\n", 2);
            free(s);
            break;
        }
    if (r->include_usage) {
        json_t *ch = chunk(si, j, json_array());
        json_object_set_new(ch, "usage", usage(j));
        json_object_set_new(ch, "timings", timings(j));
        sse(out, ch);
    }
    serve_buf_put(out, "data: [DONE]\n\n", 14);
    st->done_sent = 1;
    return 1;
}
