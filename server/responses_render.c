/*
 * responses_render.c - a Responses job -> the Response object, or its event
 * stream (OpenAI's "event: <type>" SSE with sequence_number).
 *
 * The reply is cut as the chat reply is, by serve_reply_split: reasoning,
 * content and calls. Its output
 * items, in this order:
 *   reasoning     when the reply has reasoning text (thinking on)
 *   message       when it has content, or nothing else at all (an empty message)
 *   function_call one per parsed call
 * The stream opens the reasoning item with the first reasoning byte, the
 * message with the first content byte and a function_call item once its
 * call's head is read (either closing the reasoning); a call's arguments
 * stream as the model writes them (serve_call_part). Since every prefix's view
 * and calls are prefixes of the final ones, the streamed items, indexes and
 * deltas add up to the non-streamed output byte for byte, except where a
 * call never completes (its item ends "incomplete" in the stream and is no
 * item of the Response) or text follows a call (the message item comes after
 * it in the stream): docs/RESPONSES.md. Callers hold the sched mutex.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/responses.h"


/* ---- what the reply shows ---- */

/* What the reply shows: the state machine every API shares (serve_reply_split). */
typedef serve_reply shown;

static void shown_make(const serve_req *r, const serve_choice_out *o, int final, shown *sh)
{
    const char *raw = o->raw.p ? o->raw.p : "";
    serve_reply_split(r, raw, final ? o->raw.n : o->raw_final, final, sh); /* out of memory: the text, no calls */
}

static int has_message(const shown *sh) { return sh->content_len || (!sh->calls.n_calls && !sh->reasoning_len); }

/* ---- items ---- */

static json_t *reasoning_item(const serve_resp *x, const shown *sh, const char *status)
{
    char id[48];
    snprintf(id, sizeof id, "rs_%s", x->hex);
    json_t *content = json_array();
    if (sh) json_array_append_new(content, json_pack("{s:s, s:o}", "type", "reasoning_text", "text",
                                                     serve_json_text(sh->reasoning, sh->reasoning_len)));
    return json_pack("{s:s, s:s, s:[], s:o, s:s}", "id", id, "type", "reasoning", "summary", "content", content, "status", status);
}

static json_t *text_part(const shown *sh)
{
    return json_pack("{s:s, s:o, s:[]}", "type", "output_text", "text", sh ? serve_json_text(sh->content, sh->content_len) : json_string(""),
                     "annotations");
}

static json_t *message_item(const serve_resp *x, const shown *sh, const char *status)
{
    char id[48];
    snprintf(id, sizeof id, "msg_%s", x->hex);
    json_t *content = json_array();
    if (sh) json_array_append_new(content, text_part(sh));
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", id, "type", "message", "role", "assistant", "status", status,
                     "content", content);
}

/* A function_call item for the call whose block is at content offset at (its
 * ids derive from it: the same streamed and whole). */
static json_t *call_json(const serve_resp *x, size_t at, const char *name, json_t *args, const char *status)
{
    char id[48], call[48];
    snprintf(id, sizeof id, "fc_%s%06zx", x->hex, at);
    snprintf(call, sizeof call, "call_%.24s%06zx", x->hex, at);
    return json_pack("{s:s, s:s, s:s, s:s, s:o, s:s}", "id", id, "type", "function_call", "call_id", call, "name", name,
                     "arguments", args, "status", status);
}

static json_t *call_item(const serve_resp *x, const shown *sh, size_t k)
{
    const serve_call *c = &sh->calls.calls[k];
    return call_json(x, c->at, c->name, json_string(c->arguments), "completed");
}

/* The reasoning item's final status: incomplete only when the cut fell inside it. */
static const char *rs_status(const shown *sh, int incomplete)
{
    return incomplete && !sh->content_len && !sh->calls.n_calls ? "incomplete" : "completed";
}

static json_t *outputs(const serve_resp *x, const shown *sh, int incomplete)
{
    json_t *a = json_array();
    if (sh->reasoning_len) json_array_append_new(a, reasoning_item(x, sh, rs_status(sh, incomplete)));
    if (has_message(sh)) json_array_append_new(a, message_item(x, sh, incomplete ? "incomplete" : "completed"));
    for (size_t k = 0; k < sh->calls.n_calls; k++) json_array_append_new(a, call_item(x, sh, k));
    return a;
}

/* ---- the Response object ---- */

static json_t *usage_obj(const serve_job *j, uint64_t reasoning)
{
    uint64_t gen = j->out[0].n_gen;
    return json_pack("{s:I, s:{s:I}, s:I, s:{s:I}, s:I}", "input_tokens", (json_int_t)j->req.n_prompt, "input_tokens_details",
                     "cached_tokens", (json_int_t)j->cached_tokens, "output_tokens", (json_int_t)gen, "output_tokens_details",
                     "reasoning_tokens", (json_int_t)reasoning, "total_tokens", (json_int_t)(j->req.n_prompt + gen));
}

/* The Response: the request's echoed fields, then ours. output and usage: references stolen (usage NULL = null). */
static json_t *response_obj(const serve_info *si, const serve_job *j, const char *status, json_t *output, json_t *usage)
{
    const serve_resp *x = j->req.api_ctx;
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:n, s:n, s:s}", "id", j->pub_id, "object", "response", "created_at",
                          (json_int_t)j->created, "status", status, "error", "incomplete_details", "model", si->model_id);
    json_object_update(o, x->echo);
    json_object_set_new(o, "output", output);
    json_object_set_new(o, "usage", usage ? usage : json_null());
    return o;
}

/* The finished Response, stored when the request asked (once). */
static json_t *final_response(const serve_info *si, serve_job *j, const shown *sh)
{
    serve_resp *x = j->req.api_ctx;
    int failed = j->out[0].finish == FIN_ERROR || j->error[0], incomplete = !failed && j->out[0].finish == FIN_LENGTH;
    json_t *out = outputs(x, sh, incomplete);
    json_t *o = response_obj(si, j, failed ? "failed" : incomplete ? "incomplete" : "completed", json_incref(out),
                             usage_obj(j, serve_reasoning_tokens(&j->req, &j->out[0])));
    if (failed)
        json_object_set_new(o, "error", json_pack("{s:s, s:s+}", "code", "server_error", "message", "generation failed: ",
                                                  j->error[0] ? j->error : "engine error"));
    if (incomplete) json_object_set_new(o, "incomplete_details", json_pack("{s:s}", "reason", "max_output_tokens"));
    if (!failed && x->store && !x->stored) {
        json_t *items = json_deep_copy(x->history), *copy = json_deep_copy(out); /* shares nothing with o */
        json_array_extend(items, copy);
        json_decref(copy);
        serve_resp_store_put(json_string_value(json_object_get(o, "id")), items, json_deep_copy(o));
        x->stored = 1;
    }
    json_decref(out);
    return o;
}

char *serve_responses_render(const serve_info *si, serve_job *job)
{
    shown sh;
    shown_make(&job->req, &job->out[0], 1, &sh);
    json_t *o = final_response(si, job, &sh);
    serve_reply_free(&sh);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* ---- the event stream ---- */

/* "event: <type>" and the event's JSON (type and sequence_number added); o stolen. */
static void event(serve_buf *b, serve_resp *x, const char *type, json_t *o)
{
    json_t *ev = json_pack("{s:s, s:I}", "type", type, "sequence_number", (json_int_t)x->seq++);
    json_object_update(ev, o); /* type and sequence_number first, as OpenAI writes them */
    json_decref(o);
    char *s = json_dumps(ev, JSON_COMPACT);
    json_decref(ev);
    if (!s) return;
    serve_buf_put(b, "event: ", 7), serve_buf_put(b, type, strlen(type)), serve_buf_put(b, "\ndata: ", 7);
    serve_buf_put(b, s, strlen(s)), serve_buf_put(b, "\n\n", 2);
    free(s);
}

static void item_ids(const serve_resp *x, char rs[48], char msg[48])
{
    snprintf(rs, 48, "rs_%s", x->hex);
    snprintf(msg, 48, "msg_%s", x->hex);
}

static void stream_reasoning(serve_resp *x, const shown *sh, serve_buf *b)
{
    char rs[48], msg[48];
    item_ids(x, rs, msg);
    if (sh->reasoning_len <= x->rs_sent || x->rs_closed) return;
    if (x->rs_index < 0) {
        x->rs_index = x->next_index++;
        event(b, x, "response.output_item.added", json_pack("{s:i, s:o}", "output_index", x->rs_index, "item",
                                                            reasoning_item(x, NULL, "in_progress")));
        event(b, x, "response.content_part.added", json_pack("{s:s, s:i, s:i, s:{s:s, s:s}}", "item_id", rs, "output_index",
                                                             x->rs_index, "content_index", 0, "part", "type", "reasoning_text",
                                                             "text", ""));
    }
    event(b, x, "response.reasoning_text.delta", json_pack("{s:s, s:i, s:i, s:o}", "item_id", rs, "output_index", x->rs_index,
                                                           "content_index", 0, "delta",
                                                           serve_json_text(sh->reasoning + x->rs_sent, sh->reasoning_len - x->rs_sent)));
    x->rs_sent = sh->reasoning_len;
}

static void close_reasoning(serve_resp *x, const shown *sh, const char *status, serve_buf *b)
{
    char rs[48], msg[48];
    item_ids(x, rs, msg);
    if (x->rs_index < 0 || x->rs_closed) return;
    event(b, x, "response.reasoning_text.done", json_pack("{s:s, s:i, s:i, s:o}", "item_id", rs, "output_index", x->rs_index,
                                                          "content_index", 0, "text", serve_json_text(sh->reasoning, sh->reasoning_len)));
    event(b, x, "response.content_part.done", json_pack("{s:s, s:i, s:i, s:{s:s, s:o}}", "item_id", rs, "output_index",
                                                        x->rs_index, "content_index", 0, "part", "type", "reasoning_text",
                                                        "text", serve_json_text(sh->reasoning, sh->reasoning_len)));
    event(b, x, "response.output_item.done", json_pack("{s:i, s:o}", "output_index", x->rs_index, "item",
                                                       reasoning_item(x, sh, status)));
    x->rs_closed = 1;
}

static void open_message(serve_resp *x, serve_buf *b)
{
    char rs[48], msg[48];
    item_ids(x, rs, msg);
    x->msg_index = x->next_index++;
    event(b, x, "response.output_item.added", json_pack("{s:i, s:o}", "output_index", x->msg_index, "item",
                                                        message_item(x, NULL, "in_progress")));
    event(b, x, "response.content_part.added", json_pack("{s:s, s:i, s:i, s:o}", "item_id", msg, "output_index", x->msg_index,
                                                         "content_index", 0, "part", text_part(NULL)));
}

static void stream_content(serve_resp *x, const shown *sh, serve_buf *b)
{
    char rs[48], msg[48];
    item_ids(x, rs, msg);
    if (sh->content_len <= x->msg_sent) return;
    if (x->msg_index < 0) {
        close_reasoning(x, sh, "completed", b); /* content follows: the reasoning is whole */
        open_message(x, b);
    }
    event(b, x, "response.output_text.delta", json_pack("{s:s, s:i, s:i, s:o, s:[]}", "item_id", msg, "output_index",
                                                        x->msg_index, "content_index", 0, "delta",
                                                        serve_json_text(sh->content + x->msg_sent, sh->content_len - x->msg_sent), "logprobs"));
    x->msg_sent = sh->content_len;
}

static void close_message(serve_resp *x, const shown *sh, const char *status, serve_buf *b)
{
    char rs[48], msg[48];
    item_ids(x, rs, msg);
    if (has_message(sh) && x->msg_index < 0) open_message(x, b);
    if (x->msg_index < 0 || x->msg_closed) return;
    event(b, x, "response.output_text.done", json_pack("{s:s, s:i, s:i, s:o, s:[]}", "item_id", msg, "output_index",
                                                       x->msg_index, "content_index", 0, "text",
                                                       serve_json_text(sh->content, sh->content_len), "logprobs"));
    event(b, x, "response.content_part.done", json_pack("{s:s, s:i, s:i, s:o}", "item_id", msg, "output_index", x->msg_index,
                                                        "content_index", 0, "part", text_part(sh)));
    event(b, x, "response.output_item.done", json_pack("{s:i, s:o}", "output_index", x->msg_index, "item",
                                                       message_item(x, sh, status)));
    x->msg_closed = 1;
}

/* ---- function_call items, streamed as the model writes them ---- */

static void part_id(const serve_resp *x, char id[48]) { snprintf(id, 48, "fc_%s%06zx", x->hex, x->part_at); }

/* Open an item for the call at offset at (reasoning is over: closed first). */
static void open_call(serve_resp *x, const shown *sh, size_t at, const char *name, serve_buf *b)
{
    close_reasoning(x, sh, "completed", b);
    x->part_open = 1, x->part_index = x->next_index++, x->part_at = at, x->part_name = name, x->part_args.n = 0;
    event(b, x, "response.output_item.added", json_pack("{s:i, s:o}", "output_index", x->part_index, "item",
                                                        call_json(x, at, name, json_string(""), "in_progress")));
}

static void args_delta(serve_resp *x, const char *a, size_t n, serve_buf *b)
{
    char id[48];
    part_id(x, id);
    if (!n) return;
    event(b, x, "response.function_call_arguments.delta", json_pack("{s:s, s:i, s:o}", "item_id", id, "output_index",
                                                                    x->part_index, "delta", serve_json_text(a, n)));
    serve_buf_put(&x->part_args, a, n);
}

/* The open item's call is parsed whole: the rest of its arguments, then done. */
static void done_call(serve_resp *x, const serve_call *c, serve_buf *b)
{
    char id[48];
    part_id(x, id);
    size_t len = strlen(c->arguments);
    args_delta(x, c->arguments + x->part_args.n, len - x->part_args.n, b);
    event(b, x, "response.function_call_arguments.done", json_pack("{s:s, s:i, s:s, s:s}", "item_id", id, "output_index",
                                                                   x->part_index, "name", c->name, "arguments", c->arguments));
    event(b, x, "response.output_item.done", json_pack("{s:i, s:o}", "output_index", x->part_index, "item",
                                                       call_json(x, c->at, c->name, json_string(c->arguments), "completed")));
    x->part_open = 0;
}

/* The open item's call never completed (max_tokens cut it, or the model broke
 * the format): done as "incomplete" with the arguments streamed; the whole
 * Response has no such call (docs/RESPONSES.md). */
static void drop_call(serve_resp *x, serve_buf *b)
{
    if (!x->part_open) return;
    event(b, x, "response.output_item.done", json_pack("{s:i, s:o}", "output_index", x->part_index, "item",
                                                       call_json(x, x->part_at, x->part_name,
                                                                 serve_json_text(x->part_args.p ? x->part_args.p : "", x->part_args.n),
                                                                 "incomplete")));
    x->part_open = 0;
}

/* Parsed calls not yet done, then the call in progress (serve_call_part). */
static void stream_calls(serve_resp *x, const shown *sh, serve_buf *b)
{
    for (size_t k = x->calls_sent; k < sh->calls.n_calls; k++) {
        const serve_call *c = &sh->calls.calls[k];
        if (!x->part_open || x->part_at != c->at || x->part_args.n > strlen(c->arguments)) {
            drop_call(x, b);
            open_call(x, sh, c->at, c->name, b);
        }
        done_call(x, c, b);
    }
    x->calls_sent = sh->calls.n_calls;
    const serve_call_part *p = &sh->calls.part;
    if (!p->name) return;
    if (x->part_open && x->part_at != p->at) drop_call(x, b);
    if (!x->part_open) open_call(x, sh, p->at, p->name, b);
    if (p->args_len > x->part_args.n) args_delta(x, p->args + x->part_args.n, p->args_len - x->part_args.n, b);
}

static void stream_end(const serve_info *si, serve_job *j, const shown *sh, serve_buf *b)
{
    serve_resp *x = j->req.api_ctx;
    json_t *o = final_response(si, j, sh);
    const char *status = json_string_value(json_object_get(o, "status"));
    int incomplete = !strcmp(status, "incomplete");
    close_reasoning(x, sh, rs_status(sh, incomplete), b);
    stream_calls(x, sh, b);
    drop_call(x, b);
    close_message(x, sh, incomplete ? "incomplete" : "completed", b);
    const char *type = !strcmp(status, "failed") ? "response.failed" : incomplete ? "response.incomplete" : "response.completed";
    event(b, x, type, json_pack("{s:o}", "response", o));
    x->done = 1;
}

int serve_responses_chunks(const serve_info *si, serve_job *job, serve_buf *sse)
{
    serve_resp *x = job->req.api_ctx;
    const serve_choice_out *o = &job->out[0];
    if (x->done) return 1;
    if (!x->started) {
        event(sse, x, "response.created", json_pack("{s:o}", "response", response_obj(si, job, "in_progress", json_array(), NULL)));
        event(sse, x, "response.in_progress", json_pack("{s:o}", "response",
                                                        response_obj(si, job, "in_progress", json_array(), NULL)));
        x->started = 1;
    }
    if (o->finish == FIN_CANCELLED) return x->done = job->done;
    int fin = o->finish != FIN_NONE;
    shown sh;
    shown_make(&job->req, o, fin, &sh);
    stream_reasoning(x, &sh, sse);
    stream_content(x, &sh, sse);
    if (!fin) stream_calls(x, &sh, sse);
    if (fin && job->done) stream_end(si, job, &sh, sse);
    serve_reply_free(&sh);
    return x->done;
}
