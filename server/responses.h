/*
 * responses.h - OpenAI's Responses API (POST /v1/responses) over kipp-serve's
 * chat path. A Responses request is translated into the chat-completions
 * request it stands for (api_responses.c) and parsed by serve_parse, so it
 * reuses prepare (chat render and fit), the scheduler, tools, tool_choice and
 * their grammar, response_format and the reasoning / tool-call split; its
 * reply is rendered as a Response object or its event stream
 * (responses_render.c). previous_response_id is served from a bounded
 * in-memory store (responses_store.c).
 */
#ifndef KIPP_RESPONSES_H
#define KIPP_RESPONSES_H

#include <pthread.h>

#include "server/serve.h"

/** Entries the previous_response_id store keeps (least recently used evicted first). */
#define SERVE_RESP_STORE_MAX 256
/** Bytes of item JSON the store keeps across all entries (64 MiB); a larger single response is not stored. */
#define SERVE_RESP_STORE_BYTES ((size_t)64 << 20)

/**
 * What a Responses request keeps beside its serve_req (r->api_ctx, freed with
 * it): the ids, the request fields the Response object echoes, the
 * conversation to store, and the event-stream cursor. Read and written by the
 * HTTP thread that owns the job, under the sched mutex once submitted.
 */
typedef struct {
    char hex[33];             /* 32 random hex digits: "resp_", "msg_", "rs_", "fc_" ids and call ids derive from them */
    json_t *echo;             /* the Response object's request fields (instructions, tools, tool_choice, text, ...) */
    json_t *history;          /* the conversation items (previous response's + this input), for the store */
    int store;                /* store the finished response for previous_response_id (OpenAI's default: true) */
    /* event stream cursor (responses_render.c) */
    unsigned long long seq;   /* next sequence_number */
    int started;              /* response.created and response.in_progress sent */
    int next_index;           /* next output_index */
    int rs_index, msg_index;  /* output_index of the open reasoning / message item, -1 = none yet */
    int rs_closed, msg_closed;
    size_t rs_sent, msg_sent; /* bytes of reasoning / content already streamed */
    size_t calls_sent;        /* parsed calls whose function_call item is done */
    int part_open, part_index; /* a function_call item is open, its arguments streaming; its output_index */
    size_t part_at;           /* its call's serve_call.at */
    const char *part_name;    /* its function's name (the request's tools own it) */
    serve_buf part_args;      /* its arguments sent so far */
    int done;                 /* the terminal event is sent */
    int stored;               /* put in the store already */
} serve_resp;

/**
 * Parse a /v1/responses body of len bytes into r (initialised here): the
 * Response fields are checked here (400 naming the field, OpenAI's error
 * shape), translated into a chat request and parsed by serve_parse. r->api is
 * SERVE_API_RESPONSES and r->api_ctx a serve_resp. previous_response_id is
 * looked up in the store (400 code previous_response_not_found when absent).
 * Returns 0, or -1 with e filled.
 */
int serve_responses_parse(const char *body, size_t len, serve_req *r, serve_error *e);

/**
 * The finished job's Response object as JSON text (malloc'd); stores it when
 * the request asked to. Sched mutex held.
 */
char *serve_responses_render(const serve_info *si, serve_job *job);

/**
 * Append to sse the events that job's progress allows since its cursor
 * (r->api_ctx): response.created / in_progress first, text and reasoning
 * deltas as they become final, function calls as they are written, items
 * closed in order, and response.completed (or .incomplete / .failed) once done. Returns 1 when the
 * terminal event is written. Sched mutex held.
 */
int serve_responses_chunks(const serve_info *si, serve_job *job, serve_buf *sse);

/* ---- the previous_response_id store (responses_store.c); thread-safe ---- */

/**
 * Keep items (the conversation, a JSON array) and response (the Response
 * object) under id, both references stolen; evicts LRU entries past the
 * bounds. 0, or -1 when not kept.
 */
int serve_resp_store_put(const char *id, json_t *items, json_t *response);
/** A deep copy of the items stored under id (the caller's reference), or NULL when unknown or evicted. */
json_t *serve_resp_store_get(const char *id);
/** A deep copy of the Response stored under id (GET /v1/responses/{id}), or NULL when unknown or evicted. */
json_t *serve_resp_store_response(const char *id);
/** Forget id (DELETE /v1/responses/{id}): 1 when it was stored, 0 when unknown or evicted. */
int serve_resp_store_delete(const char *id);

#endif
