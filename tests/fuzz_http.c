/*
 * fuzz_http.c - libFuzzer over kipp-serve's request parser and validator
 * (server/api_parse.c), its error rendering, and the text view that cuts stop
 * strings and think blocks (server/text_out.c). `make fuzz-http`.
 *
 * Input: byte 0 picks the endpoint (bit 0: chat; bit 3: Anthropic's
 * /v1/messages, server/api_anthropic.c, with bit 4: its count_tokens; bit 5:
 * OpenAI's /v1/responses, server/api_responses.c) and the rest is the request
 * body. A parsed request's text is also split as a reply (serve_reply_split,
 * the state machine all three APIs share): every prefix's reasoning, content
 * and calls are prefixes of the whole text's. A body that parses is also used as raw model output against its own
 * stop strings, streamed and final, which must agree, and as a reply parsed
 * for tool calls (server/tool_calls.c): every prefix's content and calls are
 * prefixes of the whole text's, and the arguments of a call in progress start
 * the final call's of its block.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/internal.h"
#include "server/anthropic.h"
#include "server/responses.h"
#include "server/serve.h"

static void tool_prefixes(const char *text, size_t n)
{
    static const serve_tool tools[] = {{.name = "f"}, {.name = "get_time"}};
    serve_tool_out whole, o;
    if (serve_tool_parse(tools, 2, text, n, 1, &whole)) abort();
    for (size_t k = 0; k <= n; k += 1 + n / 64) {
        if (serve_tool_parse(tools, 2, text, k, 0, &o)) abort();
        if (o.content.n > whole.content.n || (o.content.n && memcmp(o.content.p, whole.content.p, o.content.n)) ||
            o.n_calls > whole.n_calls)
            abort();
        for (size_t c = 0; c < o.n_calls; c++)
            if (strcmp(o.calls[c].name, whole.calls[c].name) || strcmp(o.calls[c].arguments, whole.calls[c].arguments))
                abort();
        /* the call in progress: its arguments so far start the final call's of the same block, if it is one */
        for (size_t c = o.n_calls; o.part.name && c < whole.n_calls; c++)
            if (whole.calls[c].at == o.part.at &&
                (strcmp(whole.calls[c].name, o.part.name) || strlen(whole.calls[c].arguments) < o.part.args_len ||
                 memcmp(whole.calls[c].arguments, o.part.args, o.part.args_len)))
                abort();
        serve_tool_out_free(&o);
    }
    serve_tool_out_free(&whole);
}

/* serve_reply_split on every prefix (not final) against the whole (final). */
static void reply_prefixes(const serve_req *r, const char *text, size_t n)
{
    serve_reply whole, o;
    if (serve_reply_split(r, text, n, 1, &whole)) abort();
    for (size_t k = 0; k <= n; k += 1 + n / 64) {
        if (serve_reply_split(r, text, k, 0, &o)) abort();
        if (o.reasoning_len > whole.reasoning_len || memcmp(o.reasoning, whole.reasoning, o.reasoning_len) ||
            o.content_len > whole.content_len || memcmp(o.content, whole.content, o.content_len) ||
            o.calls.n_calls > whole.calls.n_calls)
            abort();
        serve_reply_free(&o);
    }
    serve_reply_free(&whole);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int chat = data[0] & 1;
    const char *body = (const char *)data + 1;
    size_t n = size - 1;
    tool_prefixes(body, n);
    serve_req r;
    serve_error e;
    int rc = data[0] & 32 ? serve_responses_parse(body, n, &r, &e)
             : data[0] & 8 ? serve_parse_anthropic(body, n, (data[0] >> 4) & 1, &r, &e)
                           : serve_parse(body, n, chat, &r, &e);
    if (rc) {
        if (e.status != 400 && e.status != 503) abort(); /* client input is never a 5xx but OOM */
        free(serve_error_json(&e));
        return 0;
    }
    r.thinking = data[0] & 2 ? 1 : 0;
    r.starts_in_reasoning = data[0] & 4 ? 1 : 0;
    /* each prefix as a generation keeps it (cut before a stop string, kipp_stop_scan):
     * what a stream shows of it never exceeds the final view of the same text */
    for (size_t k = 0; k <= n; k += 1 + n / 64) {
        serve_view fin, v;
        size_t shown, at = kipp_stop_scan((const char *const *)r.stop, r.n_stop, body, k, 0, &shown);
        if (shown > at || at > k) abort();
        serve_text_view(&r, body, at, 1, &fin);
        serve_text_view(&r, body, shown, 0, &v);
        if (v.content_len > fin.content_len || v.reasoning_len > fin.reasoning_len) abort();
    }
    reply_prefixes(&r, body, n);
    serve_req_free(&r);
    return 0;
}
