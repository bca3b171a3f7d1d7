/*
 * anthropic_render.c - job state -> Anthropic Messages JSON: the reply, its
 * SSE event stream, error bodies and count_tokens.
 *
 * Blocks come from the same view the OpenAI renderer uses (serve_text_view
 * splits thinking from text, serve_tool_parse takes the <tool_call> blocks
 * out of the text), so streamed deltas and the non-streamed reply are cut
 * from the same bytes: thinking_delta pieces concatenate to the thinking
 * block, text_delta pieces to the text, and each tool_use block's
 * input_json_delta pieces to its input's JSON as the model wrote it, streamed
 * as it is written (serve_call_part; its id and name go once, in
 * content_block_start). A call max_tokens cuts keeps the input streamed so
 * far in the stream, and is no tool_use block of the whole reply
 * (docs/ANTHROPIC.md).
 *
 * One difference is structural only: text the model writes after a tool call
 * streams as a new text block after that tool_use block, where the
 * non-streamed reply keeps all its text in one block before the calls.
 * Callers hold the scheduler mutex; nothing here touches the engine.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/anthropic.h"


/* Anthropic's error types by status (docs.anthropic.com, "Errors"). */
static const char *error_type(int status)
{
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

char *serve_anthropic_error_json(const serve_error *e)
{
    json_t *o = json_pack("{s:s, s:{s:s, s:o}}", "type", "error", "error", "type", error_type(e->status), "message",
                          serve_json_text(e->message, strlen(e->message)));
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s ? s : strdup("{\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"error\"}}");
}

char *serve_anthropic_count_json(const serve_req *r)
{
    json_t *o = json_pack("{s:I}", "input_tokens", (json_int_t)r->n_prompt);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

/* ---- what the reply shows ---- */

typedef struct {
    const char *reasoning, *content;
    size_t reasoning_len, content_len;
    serve_tool_out calls;
} shown;

/* Choice 0's reasoning, text and calls over raw[0..n) (n: all of it when final). */
static void shown_make(const serve_job *j, int final, shown *sh)
{
    const serve_req *r = &j->req;
    const serve_choice_out *o = &j->out[0];
    const char *raw = o->raw.p ? o->raw.p : "";
    serve_view v;
    serve_text_view(r, raw, final ? o->raw.n : o->raw_final, final, &v);
    memset(sh, 0, sizeof *sh);
    sh->reasoning = raw + v.reasoning_off, sh->reasoning_len = r->thinking ? v.reasoning_len : 0;
    sh->content = raw + v.content_off, sh->content_len = v.content_len;
    if (!serve_tools_active(r)) return;
    if (serve_tool_parse(r->tools, r->n_tools, sh->content, sh->content_len, final, &sh->calls)) {
        serve_tool_out_free(&sh->calls); /* out of memory: the text as it is */
        return;
    }
    sh->content = sh->calls.content.p ? sh->calls.content.p : "", sh->content_len = sh->calls.content.n;
}

/* 24 hex digits, a function of (job, salt): the same in a stream and in the whole reply. */
static void hex_id(const serve_job *j, uint64_t salt, const char *prefix, char out[48])
{
    uint64_t x = j->id ^ ((uint64_t)j->created << 24) ^ (salt * 0xd6e8feb86659fd93ull), h[2];
    for (int r = 0; r < 2; r++) { /* splitmix64 */
        x += 0x9e3779b97f4a7c15ull;
        uint64_t z = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        h[r] = z ^ (z >> 31);
    }
    snprintf(out, 48, "%s%016llx%08llx", prefix, (unsigned long long)h[0], (unsigned long long)(h[1] & 0xffffffffu));
}

/* A call's id, from its block's offset in the content (the same streamed and whole). */
static void tool_id(const serve_job *j, size_t at, char out[48]) { hex_id(j, at + 1, "toolu_", out); }

/* stop_reason (and *seq, the stop string matched, or NULL) of a finished choice 0. */
static const char *stop_reason(const serve_job *j, const shown *sh, const char **seq)
{
    const serve_choice_out *o = &j->out[0];
    *seq = NULL;
    if (o->finish != FIN_STOP) return "max_tokens"; /* length, a full context, or a drain's early end */
    if (sh->calls.n_calls) return "tool_use";
    if (o->stop_matched > 0 && (size_t)o->stop_matched <= j->req.n_stop) {
        *seq = j->req.stop[o->stop_matched - 1];
        return "stop_sequence";
    }
    return "end_turn";
}

/* usage: Anthropic counts prompt tokens read from the cache apart from input_tokens. */
static json_t *usage(const serve_job *j, int with_output)
{
    uint32_t cached = j->cached_tokens <= j->req.n_prompt ? j->cached_tokens : 0;
    return json_pack("{s:I, s:I, s:I, s:I}", "input_tokens", (json_int_t)(j->req.n_prompt - cached),
                     "cache_creation_input_tokens", (json_int_t)0, "cache_read_input_tokens", (json_int_t)cached,
                     "output_tokens", (json_int_t)(with_output ? j->out[0].n_gen : 0));
}

/* A call's input: its arguments parsed (serve_tool_parse checked they are one JSON object). */
static json_t *call_input(const serve_call *c)
{
    json_t *in = json_loads(c->arguments, JSON_DECODE_ANY, NULL);
    return json_is_object(in) ? in : (json_decref(in), json_object());
}

static json_t *message(const serve_info *si, const serve_job *j, json_t *content, json_t *reason, json_t *seq, int with_output)
{
    char id[48];
    hex_id(j, 0, "msg_", id);
    return json_pack("{s:s, s:s, s:s, s:s, s:o, s:o, s:o, s:o}", "id", id, "type", "message", "role", "assistant", "model",
                     si->model_id, "content", content, "stop_reason", reason, "stop_sequence", seq, "usage",
                     usage(j, with_output));
}

char *serve_anthropic_response(const serve_info *si, const serve_job *j)
{
    shown sh;
    shown_make(j, 1, &sh);
    json_t *content = json_array();
    if (sh.reasoning_len)
        json_array_append_new(content, json_pack("{s:s, s:o, s:s}", "type", "thinking", "thinking",
                                                 serve_json_text(sh.reasoning, sh.reasoning_len), "signature", ""));
    if (sh.content_len)
        json_array_append_new(content, json_pack("{s:s, s:o}", "type", "text", "text", serve_json_text(sh.content, sh.content_len)));
    for (size_t k = 0; k < sh.calls.n_calls; k++) {
        char id[48];
        tool_id(j, sh.calls.calls[k].at, id);
        json_array_append_new(content, json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", id, "name",
                                                 sh.calls.calls[k].name, "input", call_input(&sh.calls.calls[k])));
    }
    const char *seq, *reason = stop_reason(j, &sh, &seq);
    json_t *o = message(si, j, content, json_string(reason), seq ? json_string(seq) : json_null(), 1);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    serve_tool_out_free(&sh.calls);
    return s;
}

/* ---- streaming ---- */

/* "event: <type>\ndata: <o>\n\n"; o is consumed. */
static void event(serve_buf *b, json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    const char *type = json_string_value(json_object_get(o, "type"));
    if (s && type) {
        serve_buf_put(b, "event: ", 7), serve_buf_put(b, type, strlen(type)), serve_buf_put(b, "\ndata: ", 7);
        serve_buf_put(b, s, strlen(s)), serve_buf_put(b, "\n\n", 2);
    }
    free(s);
    json_decref(o);
}

static void block_start(serve_buf *b, serve_anth_stream *st, json_t *block)
{
    event(b, json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index", st->n_blocks, "content_block", block));
    st->n_blocks++;
}

static void block_delta(serve_buf *b, const serve_anth_stream *st, json_t *delta)
{
    event(b, json_pack("{s:s, s:i, s:o}", "type", "content_block_delta", "index", st->n_blocks - 1, "delta", delta));
}

/* Close the open block: a thinking block gets its (empty: Qwen3 signs nothing)
 * signature first. A tool_use block whose call never completed (cut by
 * max_tokens, or a broken format) closes with the input sent so far. */
static void block_close(serve_buf *b, serve_anth_stream *st)
{
    if (!st->open) return;
    if (st->open == 1) block_delta(b, st, json_pack("{s:s, s:s}", "type", "signature_delta", "signature", ""));
    event(b, json_pack("{s:s, s:i}", "type", "content_block_stop", "index", st->n_blocks - 1));
    st->open = 0;
}

/* The open tool_use block's call is parsed whole: the rest of its input, and its stop. */
static void finish_part(serve_anth_stream *st, const serve_call *c, serve_buf *out)
{
    size_t len = strlen(c->arguments);
    if (len > st->part_sent)
        block_delta(out, st, json_pack("{s:s, s:o}", "type", "input_json_delta", "partial_json",
                                       serve_json_text(c->arguments + st->part_sent, len - st->part_sent)));
    block_close(out, st);
}

/* A tool_use block for the call at text offset at, left open (st->open 3). */
static void open_tool(const serve_job *j, serve_anth_stream *st, size_t at, const char *name, serve_buf *out)
{
    char id[48];
    tool_id(j, at, id);
    block_close(out, st);
    block_start(out, st, json_pack("{s:s, s:s, s:s, s:{}}", "type", "tool_use", "id", id, "name", name, "input"));
    st->open = 3, st->part_at = at, st->part_sent = 0;
}

/* Parsed calls not yet sent: the open tool_use block's completes; any other
 * gets a whole block. The input_json_delta pieces are its arguments as the
 * model wrote them (they parse to the reply's input). */
static void done_calls(const serve_job *j, const shown *sh, serve_anth_stream *st, serve_buf *out)
{
    for (size_t k = st->sent_calls; k < sh->calls.n_calls; k++) {
        const serve_call *c = &sh->calls.calls[k];
        if (st->open != 3 || st->part_at != c->at || st->part_sent > strlen(c->arguments))
            open_tool(j, st, c->at, c->name, out);
        finish_part(st, c, out);
    }
    st->sent_calls = sh->calls.n_calls;
}

/* The call in progress: its block opens once its head is read, and its input
 * streams as far as it is a valid JSON prefix (serve_call_part). */
static void part_call(const serve_job *j, const shown *sh, serve_anth_stream *st, serve_buf *out)
{
    const serve_call_part *p = &sh->calls.part;
    if (!p->name) return;
    if (st->open != 3 || st->part_at != p->at) open_tool(j, st, p->at, p->name, out);
    if (p->args_len > st->part_sent)
        block_delta(out, st, json_pack("{s:s, s:o}", "type", "input_json_delta", "partial_json",
                                       serve_json_text(p->args + st->part_sent, p->args_len - st->part_sent)));
    st->part_sent = p->args_len;
}

/* New thinking and text bytes, and tool calls, since st. */
static void blocks(const serve_job *j, const shown *sh, int fin, serve_anth_stream *st, serve_buf *out)
{
    if (sh->reasoning_len > st->sent_reasoning) {
        if (st->open != 1) block_close(out, st), block_start(out, st, json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "", "signature", "")), st->open = 1;
        block_delta(out, st, json_pack("{s:s, s:o}", "type", "thinking_delta", "thinking",
                                       serve_json_text(sh->reasoning + st->sent_reasoning, sh->reasoning_len - st->sent_reasoning)));
        st->sent_reasoning = sh->reasoning_len;
    }
    if (st->open == 1 && (sh->content_len > st->sent_content || sh->calls.n_calls > st->sent_calls || sh->calls.part.name || fin))
        block_close(out, st); /* reasoning is over once anything else shows */
    if (st->open == 3) done_calls(j, sh, st, out); /* the call in progress ends before text after it */
    if (sh->content_len > st->sent_content) {
        if (st->open != 2) block_close(out, st), block_start(out, st, json_pack("{s:s, s:s}", "type", "text", "text", "")), st->open = 2;
        block_delta(out, st, json_pack("{s:s, s:o}", "type", "text_delta", "text",
                                       serve_json_text(sh->content + st->sent_content, sh->content_len - st->sent_content)));
        st->sent_content = sh->content_len;
    }
    done_calls(j, sh, st, out);
    part_call(j, sh, st, out);
}

static int stream_error(const serve_job *j, serve_anth_stream *st, serve_buf *out)
{
    serve_error e;
    serve_fail(&e, 500, "api_error", "", "generation failed: %s", j->error[0] ? j->error : "engine error");
    char *s = serve_anthropic_error_json(&e);
    serve_buf_put(out, "event: error\ndata: ", 19), serve_buf_put(out, s, strlen(s)), serve_buf_put(out, "\n\n", 2);
    free(s);
    st->done_sent = 1;
    return 1;
}

int serve_anthropic_events(const serve_info *si, const serve_job *j, serve_anth_stream *st, serve_buf *out)
{
    if (st->done_sent) return 1;
    const serve_choice_out *o = &j->out[0];
    size_t before = out->n;
    double now = serve_now();
    if (!st->started) {
        if (j->queued && !j->done) return 0; /* message_start carries the cache read, known at admission */
        event(out, json_pack("{s:s, s:o}", "type", "message_start", "message", message(si, j, json_array(), json_null(), json_null(), 0)));
        event(out, json_pack("{s:s}", "type", "ping"));
        st->started = 1;
    }
    if (o->finish == FIN_ERROR || (j->done && j->error[0])) return stream_error(j, st, out);
    int fin = o->finish != FIN_NONE;
    shown sh;
    shown_make(j, fin, &sh);
    blocks(j, &sh, fin, st, out);
    if (fin) {
        block_close(out, st);
        const char *seq, *reason = stop_reason(j, &sh, &seq);
        event(out, json_pack("{s:s, s:{s:s, s:o}, s:{s:I}}", "type", "message_delta", "delta", "stop_reason", reason,
                             "stop_sequence", seq ? json_string(seq) : json_null(), "usage", "output_tokens", (json_int_t)o->n_gen));
        event(out, json_pack("{s:s}", "type", "message_stop"));
        st->done_sent = 1;
    } else if (out->n == before && now - st->last_event >= SERVE_ANTH_PING_S) {
        event(out, json_pack("{s:s}", "type", "ping"));
    }
    if (out->n > before) st->last_event = now;
    serve_tool_out_free(&sh.calls);
    return st->done_sent;
}
