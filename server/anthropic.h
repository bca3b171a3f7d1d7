/*
 * anthropic.h - the Anthropic Messages API over kipp-serve's request and job
 * types (serve.h): POST /v1/messages and POST /v1/messages/count_tokens.
 *
 *   api_anthropic.c     Anthropic JSON body -> serve_req (chat = 1, api =
 *                       SERVE_API_ANTHROPIC; validation only, no model)
 *   anthropic_render.c  job -> Anthropic message JSON, its SSE event stream,
 *                       Anthropic error bodies, and count_tokens
 *
 * A request becomes the same serve_req an OpenAI chat request does, so it is
 * rendered by the chat template, fitted, scheduled, constrained (tool_choice
 * any / tool) and split into thinking, text and tool calls by the same code.
 */
#ifndef KIPP_ANTHROPIC_H
#define KIPP_ANTHROPIC_H

#include "server/serve.h"

/**
 * Parse and validate an Anthropic Messages body of len bytes (need not be
 * NUL-terminated) into r (initialised here: chat = 1, api =
 * SERVE_API_ANTHROPIC). count_only: the body of /v1/messages/count_tokens
 * (model, messages, system, tools, tool_choice, thinking; no max_tokens),
 * whose r asks for one token as /tokenize's does and forces no tool call
 * (tool_choice any / tool is checked, then counted as auto: the prompt is the
 * same and no grammar is needed). Unknown fields and
 * unsupported blocks get 400 naming them. Returns 0, or -1 with e filled (400,
 * or 503 when out of memory). Needs no model: the fuzz target calls it.
 */
int serve_parse_anthropic(const char *body, size_t len, int count_only, serve_req *r, serve_error *e);

/** count_tokens' reply {"input_tokens": N} for a prepared r (its prompt's length); malloc'd JSON text. */
char *serve_anthropic_count_json(const serve_req *r);

/** Anthropic's error body {"type": "error", "error": {"type", "message"}} for e; malloc'd JSON text. */
char *serve_anthropic_error_json(const serve_error *e);

/** The non-streamed Messages reply of a finished job (choice 0); malloc'd JSON text. Sched mutex held. */
char *serve_anthropic_response(const serve_info *si, const serve_job *job);

/** Cursor of one Anthropic SSE stream: what has been sent so far. Zero-initialise. */
typedef struct {
    int started;              /* message_start (and its ping) sent */
    int n_blocks;             /* content blocks started so far: the next block's index */
    int open;                 /* the open block: 0 none, 1 thinking, 2 text, 3 tool_use (its input streaming) */
    size_t sent_reasoning;    /* bytes of the view's reasoning sent as thinking_delta */
    size_t sent_content;      /* bytes of the content (calls taken out) sent as text_delta */
    size_t sent_calls;        /* parsed calls whose tool_use block is sent and stopped */
    size_t part_at, part_sent; /* the open tool_use block: its call's serve_call.at, input bytes sent */
    int done_sent;            /* message_stop (or an error event) sent */
    double last_event;        /* monotonic seconds of the last event (pings while nothing else comes) */
} serve_anth_stream;

/**
 * Append to out the SSE events ("event: <type>\ndata: <json>\n\n") that job's
 * progress allows since st: message_start and a ping once the job is
 * admitted, content_block_start / content_block_delta / content_block_stop
 * per thinking, text and tool_use block, then message_delta and message_stop
 * once done (an "error" event when generation failed); a ping when nothing
 * was sent for SERVE_ANTH_PING_S. Returns 1 once the stream is complete.
 * Sched mutex held.
 */
int serve_anthropic_events(const serve_info *si, const serve_job *job, serve_anth_stream *st, serve_buf *out);

#define SERVE_ANTH_PING_S 5.0 /* seconds of silence before a ping event */

#endif
