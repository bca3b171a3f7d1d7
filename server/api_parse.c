/*
 * api_parse.c - OpenAI request JSON -> serve_req, with every field checked
 * before any model work. Unknown fields are refused by name rather than
 * ignored; numbers are range-checked with the range in the message. No model
 * is needed here, so tests/fuzz_http.c drives this file alone.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/serve.h"

#define BAD(param, ...) serve_fail(e, 400, "invalid_request_error", param, __VA_ARGS__)

void serve_req_init(serve_req *r, int chat)
{
    memset(r, 0, sizeof *r);
    r->chat = chat;
    r->n = 1;
    r->max_tokens = chat ? -1 : 16; /* OpenAI: completions default 16, chat until done */
    r->max_tokens_asked = -1;
    r->max_tokens_field = "max_tokens";
    r->enable_thinking = 1;
    r->thinking_budget = -1;
    r->parallel_tool_calls = 1;
    r->sp = kipp_sample_params_default();
    r->sp.temperature = 1.0f; /* OpenAI default */
}

void serve_req_free(serve_req *r)
{
    free(r->model);
    free(r->prompt_text);
    free(r->prompt_ids);
    serve_tools_free(r);
    for (size_t i = 0; i < r->n_msgs; i++) free(r->msgs[i].content), free(r->msgs[i].reasoning_content);
    free(r->msgs);
    free(r->bias);
    for (size_t i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->rf_schema);
    kipp_grammar_destroy(r->grammar);
    if (r->api_ctx_free) r->api_ctx_free(r->api_ctx);
    memset(r, 0, sizeof *r);
}



/* ---- numeric fields: one table row each (the sampling fields are the
 * engine's table, kipp_sample_fields, which the CLI and the sampler share) ---- */

enum { F_REAL, F_INT };
typedef struct {
    const char *name;
    int kind;
    double lo, hi;
    int lo_open;
    int where; /* 0 both, 1 completions only, 2 chat only */
} num_field;

static const num_field NUMS[] = {
    {"n", F_INT, 1, SERVE_MAX_N, 0, 0},
    {"max_tokens", F_INT, 1, 1 << 30, 0, 0},
    {"max_completion_tokens", F_INT, 1, 1 << 30, 0, 2},
    {"logprobs", F_INT, 0, 5, 0, 1},
    {"top_logprobs", F_INT, 0, 20, 0, 2},
    {"priority", F_INT, -(1 << 30), 1 << 30, 0, 0}, /* vLLM's: lower is admitted sooner and preempted later */
};

static int num_value(const num_field *f, const json_t *v, double *out, serve_error *e)
{
    if (f->kind == F_INT && !json_is_integer(v))
        return BAD(f->name, "%s is %s, expected an integer in [%.0f, %.0f]", f->name, serve_json_type(v), f->lo, f->hi);
    if (!json_is_number(v))
        return BAD(f->name, "%s is %s, expected a number in [%g, %g]", f->name, serve_json_type(v), f->lo, f->hi);
    double x = json_number_value(v);
    if (!(x >= f->lo && x <= f->hi) || (f->lo_open && x == f->lo)) {
        if (f->kind == F_INT)
            return BAD(f->name, "%s %" JSON_INTEGER_FORMAT " is out of range, expected an integer in [%.0f, %.0f]",
                       f->name, json_integer_value(v), f->lo, f->hi);
        return BAD(f->name, "%s %g is out of range, expected a number in [%g, %g]", f->name, x, f->lo, f->hi);
    }
    *out = x;
    return 0;
}

/* A sampling field of the engine's table: its range and message, stored into r->sp. */
static int sample_field(serve_req *r, const kipp_sample_field *f, const json_t *v, serve_error *e)
{
    if (f->is_int ? !json_is_integer(v) : !json_is_number(v))
        return BAD(f->name, "%s is %s, expected %s", f->name, serve_json_type(v), f->expect);
    double x = json_number_value(v);
    if (!(x >= f->lo && x <= f->hi)) return BAD(f->name, "%s %g is out of range, expected %s", f->name, x, f->expect);
    kipp_sample_field_set(&r->sp, f, x);
    return 0;
}

static void num_store(serve_req *r, const char *name, double x)
{
    if (!strcmp(name, "n")) r->n = (int)x;
    else if (!strcmp(name, "max_tokens") || !strcmp(name, "max_completion_tokens"))
        r->max_tokens = r->max_tokens_asked = (int64_t)x, r->max_tokens_field = name;
    else if (!strcmp(name, "logprobs")) r->logprobs = 1, r->top_logprobs = (int)x;
    else if (!strcmp(name, "top_logprobs")) r->top_logprobs = (int)x;
    else if (!strcmp(name, "priority")) r->priority = (int)x;
}

/* ---- structured fields ---- */

static int parse_stop(serve_req *r, const json_t *v, serve_error *e)
{
    const json_t *one[1] = {v};
    size_t n = json_is_string(v) ? 1 : json_is_array(v) ? json_array_size(v) : 0;
    if (!json_is_string(v) && !json_is_array(v))
        return BAD("stop", "stop is %s, expected a string or an array of up to %d strings", serve_json_type(v), SERVE_MAX_STOP);
    if (n > SERVE_MAX_STOP) return BAD("stop", "stop has %zu strings, expected at most %d", n, SERVE_MAX_STOP);
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_is_string(v) ? one[0] : json_array_get(v, i);
        if (!json_is_string(s)) return BAD("stop", "stop[%zu] is %s, expected a string", i, serve_json_type(s));
        size_t len = json_string_length(s);
        if (len == 0 || len > SERVE_MAX_STOP_LEN)
            return BAD("stop", "stop[%zu] is %zu bytes long, expected 1..%d", i, len, SERVE_MAX_STOP_LEN);
        if (!(r->stop[r->n_stop++] = serve_dupn(json_string_value(s), len)))
            return serve_fail(e, 503, "server_error", "stop", "out of memory");
    }
    return 0;
}

int serve_parse_bias(serve_req *r, const json_t *v, serve_error *e)
{
    if (!json_is_object(v)) return BAD("logit_bias", "logit_bias is %s, expected an object {\"token id\": bias}", serve_json_type(v));
    size_t n = json_object_size(v);
    if (n > SERVE_MAX_BIAS) return BAD("logit_bias", "logit_bias has %zu entries, expected at most %d", n, SERVE_MAX_BIAS);
    r->bias = calloc(n ? n : 1, sizeof *r->bias);
    if (!r->bias) return serve_fail(e, 503, "server_error", "logit_bias", "out of memory");
    const char *k;
    json_t *b;
    json_object_foreach((json_t *)v, k, b) {
        char *end;
        unsigned long long id = strtoull(k, &end, 10);
        if (!*k || *end || k[0] < '0' || k[0] > '9' || id > UINT32_MAX)
            return BAD("logit_bias", "logit_bias key '%.40s' is not a token id, expected a decimal integer", k);
        if (!json_is_number(b) || !(json_number_value(b) >= -100 && json_number_value(b) <= 100))
            return BAD("logit_bias", "logit_bias[%s] must be a number in [-100, 100]", k);
        r->bias[r->sp.n_logit_bias++] = (kipp_logit_bias){(uint32_t)id, (float)json_number_value(b)};
    }
    r->sp.logit_bias = r->bias;
    return 0;
}

static int parse_prompt(serve_req *r, const json_t *v, serve_error *e)
{
    if (json_is_array(v) && json_array_size(v) == 1 && json_is_string(json_array_get(v, 0))) v = json_array_get(v, 0);
    if (json_is_string(v)) {
        r->prompt_text = serve_dupn(json_string_value(v), json_string_length(v));
        return r->prompt_text ? 0 : serve_fail(e, 503, "server_error", "prompt", "out of memory");
    }
    if (!json_is_array(v) || json_array_size(v) == 0)
        return BAD("prompt", "prompt is %s%s, expected a string or a non-empty array of token ids", serve_json_type(v),
                   json_is_array(v) ? " (empty)" : "");
    size_t n = json_array_size(v);
    r->prompt_ids = malloc(n * sizeof *r->prompt_ids);
    if (!r->prompt_ids) return serve_fail(e, 503, "server_error", "prompt", "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_array_get(v, i);
        if (json_is_array(t) || json_is_string(t))
            return BAD("prompt", "prompt[%zu] is %s: batched prompts are not supported, send one prompt per request", i,
                       serve_json_type(t));
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > UINT32_MAX)
            return BAD("prompt", "prompt[%zu] is %s, expected a token id >= 0", i, serve_json_type(t));
        r->prompt_ids[i] = (uint32_t)json_integer_value(t);
    }
    r->n_prompt = n, r->prompt_is_ids = 1;
    return 0;
}

/* content: a string, or a list of {"type": "text", "text": ...} parts joined
 * with "\n" (as kipp_chat_message parts); *len its bytes (JSON "\u0000" is a
 * byte of the text, not its end). */
static int parse_content(const json_t *c, size_t i, char **out, size_t *len, serve_error *e)
{
    if (!c || json_is_null(c)) return 0;
    if (json_is_string(c)) {
        *len = json_string_length(c);
        return (*out = serve_dupn(json_string_value(c), *len)) ? 0 : serve_fail(e, 503, "server_error", "messages", "out of memory");
    }
    if (!json_is_array(c)) return BAD("messages", "messages[%zu].content is %s, expected a string or an array of text parts", i, serve_json_type(c));
    serve_buf b = {0};
    size_t k;
    json_t *part;
    json_array_foreach((json_t *)c, k, part) {
        const json_t *ty = json_object_get(part, "type"), *tx = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(ty) || strcmp(json_string_value(ty), "text") || !json_is_string(tx) ||
            json_object_size(part) != 2) {
            serve_buf_free(&b);
            return BAD("messages", "messages[%zu].content[%zu] is not a text part, expected {\"type\": \"text\", \"text\": \"...\"} "
                       "(only text is supported)", i, k);
        }
        if ((k > 0 && serve_buf_put(&b, "\n", 1)) || serve_buf_put(&b, json_string_value(tx), json_string_length(tx))) {
            serve_buf_free(&b);
            return serve_fail(e, 503, "server_error", "messages", "out of memory");
        }
    }
    *out = b.p ? b.p : serve_dupn("", 0);
    *len = b.p ? b.n : 0;
    return *out ? 0 : serve_fail(e, 503, "server_error", "messages", "out of memory");
}

static int parse_role(const json_t *m, size_t i, kipp_role *role, serve_error *e)
{
    const json_t *r = json_object_get(m, "role");
    const char *s = json_is_string(r) ? json_string_value(r) : "";
    if (!strcmp(s, "system") || !strcmp(s, "developer")) *role = KIPP_ROLE_SYSTEM;
    else if (!strcmp(s, "user")) *role = KIPP_ROLE_USER;
    else if (!strcmp(s, "assistant")) *role = KIPP_ROLE_ASSISTANT;
    else if (!strcmp(s, "tool")) *role = KIPP_ROLE_TOOL;
    else return BAD("messages", "messages[%zu].role is '%.32s', expected system, developer, user, assistant or tool", i, s);
    return 0;
}

static int parse_messages(serve_req *r, const json_t *v, serve_error *e)
{
    size_t n = json_is_array(v) ? json_array_size(v) : 0;
    if (n == 0 || n > SERVE_MAX_MSGS)
        return BAD("messages", "messages is %s%s, expected an array of 1..%d messages", serve_json_type(v),
                   json_is_array(v) ? (n ? " (too long)" : " (empty)") : "", SERVE_MAX_MSGS);
    if (!(r->msgs = calloc(n, sizeof *r->msgs))) return serve_fail(e, 503, "server_error", "messages", "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(v, i);
        if (!json_is_object(m)) return BAD("messages", "messages[%zu] is %s, expected an object", i, serve_json_type(m));
        serve_msg *d = &r->msgs[r->n_msgs++];
        if (parse_role(m, i, &d->role, e)) return -1;
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)m, k, x) {
            int ok = !strcmp(k, "role") || !strcmp(k, "content") || !strcmp(k, "name") || !strcmp(k, "tool_calls") ||
                     !strcmp(k, "tool_call_id") || (d->role == KIPP_ROLE_ASSISTANT && !strcmp(k, "reasoning_content"));
            int rc = 0;
            if (!ok && d->role == KIPP_ROLE_ASSISTANT && serve_parse_compat_msg(r, k, x, i, &rc, e)) {
                if (rc) return rc;
                continue;
            }
            if (!ok) return BAD("messages", "messages[%zu].%.40s is not supported", i, k);
        }
        if (serve_parse_msg_tools(d, m, i, e)) return -1; /* refuses tool_calls / tool_call_id on other roles */
        if (parse_content(json_object_get(m, "content"), i, &d->content, &d->content_len, e)) return -1;
        const json_t *rc = json_object_get(m, "reasoning_content");
        if (rc && !json_is_null(rc) && parse_content(rc, i, &d->reasoning_content, &d->reasoning_len, e)) return -1;
        if (!d->content && d->role != KIPP_ROLE_ASSISTANT)
            return BAD("messages", "messages[%zu].content is %s, expected a string or an array of text parts", i,
                       json_object_get(m, "content") ? "null" : "missing");
        if (!d->content && !(d->content = serve_dupn("", 0))) return serve_fail(e, 503, "server_error", "messages", "out of memory");
    }
    return 0;
}

static int parse_kwargs(serve_req *r, const json_t *v, serve_error *e)
{
    if (!json_is_object(v)) return BAD("chat_template_kwargs", "chat_template_kwargs is %s, expected an object", serve_json_type(v));
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) {
        if (strcmp(k, "enable_thinking"))
            return BAD("chat_template_kwargs", "chat_template_kwargs.%.40s is not supported, expected only enable_thinking", k);
        if (!json_is_boolean(x))
            return BAD("chat_template_kwargs", "chat_template_kwargs.enable_thinking is %s, expected a boolean", serve_json_type(x));
        r->enable_thinking = json_is_true(x);
    }
    return 0;
}

static int parse_bool(const json_t *v, const char *name, int *out, serve_error *e)
{
    if (!json_is_boolean(v)) return BAD(name, "%s is %s, expected a boolean", name, serve_json_type(v));
    *out = json_is_true(v);
    return 0;
}

static int parse_stream_options(serve_req *r, const json_t *v, serve_error *e)
{
    if (!json_is_object(v)) return BAD("stream_options", "stream_options is %s, expected an object", serve_json_type(v));
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) {
        if (strcmp(k, "include_usage"))
            return BAD("stream_options", "stream_options.%.40s is not supported, expected only include_usage", k);
        if (parse_bool(x, "stream_options.include_usage", &r->include_usage, e)) return -1;
    }
    return 0;
}

/* response_format.json_schema: {name, schema, strict, description}; the schema kept as compact text. */
static int parse_json_schema(serve_req *r, const json_t *v, serve_error *e)
{
    if (!json_is_object(v))
        return BAD("response_format", "response_format.json_schema is %s, expected an object", serve_json_type(v));
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) {
        if (json_is_null(x)) continue;
        if (!strcmp(k, "name") || !strcmp(k, "description")) {
            if (!json_is_string(x))
                return BAD("response_format", "response_format.json_schema.%s is %s, expected a string", k, serve_json_type(x));
        } else if (!strcmp(k, "strict")) {
            if (!json_is_boolean(x))
                return BAD("response_format", "response_format.json_schema.strict is %s, expected a boolean", serve_json_type(x));
        } else if (strcmp(k, "schema")) {
            return BAD("response_format", "response_format.json_schema.%.40s is not supported, expected name, schema, "
                       "strict or description", k);
        }
    }
    const json_t *sch = json_object_get(v, "schema");
    if (!json_is_object(sch))
        return BAD("response_format", "response_format.json_schema.schema is %s, expected a JSON Schema object",
                   sch ? serve_json_type(sch) : "missing");
    free(r->rf_schema); /* a guided_json before it (refused once both are seen) */
    if (!(r->rf_schema = json_dumps(sch, JSON_COMPACT)))
        return serve_fail(e, 503, "server_error", "response_format", "out of memory");
    return 0;
}

/* response_format: {"type": "text" | "json_object" | "json_schema", "json_schema": {...}}. */
static int parse_response_format(serve_req *r, const json_t *v, serve_error *e)
{
    if (!json_is_object(v)) return BAD("response_format", "response_format is %s, expected an object", serve_json_type(v));
    const json_t *t = json_object_get(v, "type");
    const char *type = json_is_string(t) ? json_string_value(t) : "";
    if (!strcmp(type, "text")) r->response_format = SERVE_RF_TEXT;
    else if (!strcmp(type, "json_object")) r->response_format = SERVE_RF_JSON_OBJECT;
    else if (!strcmp(type, "json_schema")) r->response_format = SERVE_RF_JSON_SCHEMA;
    else return BAD("response_format", "response_format.type is %s%.40s%s, expected \"text\", \"json_object\" or "
                    "\"json_schema\"", json_is_string(t) ? "'" : "", json_is_string(t) ? type : t ? serve_json_type(t) : "missing",
                    json_is_string(t) ? "'" : "");
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) {
        int ok = !strcmp(k, "type") || (r->response_format == SERVE_RF_JSON_SCHEMA && !strcmp(k, "json_schema"));
        if (!ok) return BAD("response_format", "response_format.%.40s is not supported with type '%s'", k, type);
    }
    if (r->response_format != SERVE_RF_JSON_SCHEMA) return 0;
    const json_t *js = json_object_get(v, "json_schema");
    if (!js) return BAD("response_format", "response_format.json_schema is required with type 'json_schema'");
    return parse_json_schema(r, js, e);
}

/* Fields that vllm-router and sglang-router add to every request they
 * forward (they re-serialise the body with their own defaults). Each is
 * accepted only at the value that is Kipp's behaviour anyway; any other value
 * would ask for a feature Kipp does not have, so it stays a 400. */
static const struct {
    const char *name;
    int value; /* the boolean accepted */
    int where; /* 0 both endpoints, 1 completions, 2 chat */
} ROUTER_FIELDS[] = {
    {.name = "no_stop_trim", .value = 0},          {.name = "ignore_eos", .value = 0},
    {.name = "skip_special_tokens", .value = 1},   {.name = "return_hidden_states", .value = 0},
    {.name = "continue_final_message", .value = 0, .where = 2}, {.name = "separate_reasoning", .value = 1, .where = 2},
    {.name = "stream_reasoning", .value = 1, .where = 2},       {.name = "include_reasoning", .value = 1, .where = 2},
};

/* 1 when k is a router field (handled: 0 or -1 in *rc), else 0. */
static int router_field(const serve_req *r, const char *k, const json_t *v, int *rc, serve_error *e)
{
    for (size_t i = 0; i < sizeof ROUTER_FIELDS / sizeof ROUTER_FIELDS[0]; i++) {
        if (strcmp(k, ROUTER_FIELDS[i].name) || (ROUTER_FIELDS[i].where && ROUTER_FIELDS[i].where != (r->chat ? 2 : 1)))
            continue;
        int want = ROUTER_FIELDS[i].value;
        *rc = json_is_boolean(v) && json_is_true(v) == want
                  ? 0
                  : BAD(k, "%s is %s, expected %s: Kipp accepts this field (routers send it) only at the value that "
                           "matches what it does", k, json_is_boolean(v) ? (json_is_true(v) ? "true" : "false") : serve_json_type(v),
                        want ? "true" : "false");
        return 1;
    }
    return 0;
}

/* One top-level field (non-null). */
static int parse_field(serve_req *r, const char *k, const json_t *v, serve_error *e)
{
    int where = r->chat ? 2 : 1;
    const kipp_sample_field *sf = kipp_sample_field_find(k);
    if (sf) return sample_field(r, sf, v, e);
    for (size_t i = 0; i < sizeof NUMS / sizeof NUMS[0]; i++) {
        if (strcmp(k, NUMS[i].name) || (NUMS[i].where && NUMS[i].where != where)) continue;
        double x = 0;
        if (num_value(&NUMS[i], v, &x, e)) return -1;
        num_store(r, NUMS[i].name, x); /* the table's static name: r keeps it */
        return 0;
    }
    if (!strcmp(k, "model")) {
        if (!json_is_string(v)) return BAD("model", "model is %s, expected a string", serve_json_type(v));
        r->model = serve_dupn(json_string_value(v), json_string_length(v));
        return 0;
    }
    if (!strcmp(k, "seed")) {
        if (!json_is_integer(v)) return BAD("seed", "seed is %s, expected an integer", serve_json_type(v));
        if (json_integer_value(v) < 0) /* llama.cpp's -1 means "random"; here that is an omitted seed */
            return BAD("seed", "seed is %lld, expected an integer >= 0 (omit seed for a random one)",
                       (long long)json_integer_value(v));
        r->seed = (uint64_t)json_integer_value(v), r->seed_set = 1;
        return 0;
    }
    if (!strcmp(k, "stop")) return parse_stop(r, v, e);
    if (!strcmp(k, "logit_bias")) return serve_parse_bias(r, v, e);
    if (!strcmp(k, "stream")) return parse_bool(v, "stream", &r->stream, e);
    if (!strcmp(k, "stream_options")) return parse_stream_options(r, v, e);
    if (!r->chat && !strcmp(k, "prompt")) return parse_prompt(r, v, e);
    if (!r->chat && !strcmp(k, "echo")) return parse_bool(v, "echo", &r->echo, e);
    if (r->chat && !strcmp(k, "messages")) return parse_messages(r, v, e);
    if (r->chat && !strcmp(k, "logprobs")) return parse_bool(v, "logprobs", &r->logprobs, e);
    if (r->chat && !strcmp(k, "chat_template_kwargs")) return parse_kwargs(r, v, e);
    if (r->chat && (!strcmp(k, "tools") || !strcmp(k, "tool_choice") || !strcmp(k, "parallel_tool_calls")))
        return 0; /* checked together once the messages are in: serve_parse_tools */
    if (!strcmp(k, "response_format")) return parse_response_format(r, v, e);
    int rc;
    if (router_field(r, k, v, &rc, e)) return rc;
    if (serve_parse_compat(r, k, v, &rc, e)) return rc;
    return BAD(k, "field '%.60s' is not supported by %s", k, r->chat ? "/v1/chat/completions" : "/v1/completions");
}

static int parse_object(serve_req *r, const json_t *root, serve_error *e)
{
    const char *k;
    json_t *v;
    int top_lp_set = 0;
    json_object_foreach((json_t *)root, k, v) {
        if (json_is_null(v)) continue; /* null = absent, as the OpenAI clients send it */
        if (parse_field(r, k, v, e)) return -1;
        top_lp_set |= !strcmp(k, "top_logprobs");
    }
    if (r->chat ? !r->msgs : !(r->prompt_text || r->prompt_ids))
        return BAD(r->chat ? "messages" : "prompt", "%s is required", r->chat ? "messages" : "prompt");
    if (r->chat && serve_parse_tools(r, root, e)) return -1;
    /* Both limits given: the later one used to win silently; equal values are one limit. */
    const json_t *mt = json_object_get(root, "max_tokens"), *mct = json_object_get(root, "max_completion_tokens");
    if (r->chat && json_is_integer(mt) && json_is_integer(mct) && json_integer_value(mt) != json_integer_value(mct))
        return BAD("max_completion_tokens",
                   "max_tokens %" JSON_INTEGER_FORMAT " and max_completion_tokens %" JSON_INTEGER_FORMAT
                   " disagree; expected one of them, or the same value in both",
                   json_integer_value(mt), json_integer_value(mct));
    if (r->chat && top_lp_set && !r->logprobs)
        return BAD("top_logprobs", "top_logprobs needs logprobs set to true");
    if (r->include_usage && !r->stream) return BAD("stream_options", "stream_options is only allowed with stream set to true");
    return serve_parse_compat_done(r, root, e);
}

int serve_parse(const char *body, size_t len, int chat, serve_req *r, serve_error *e)
{
    serve_req_init(r, chat);
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (json_error_code(&je) == json_error_invalid_utf8)
            return BAD("", "request body holds invalid UTF-8 near byte %d; JSON text must be UTF-8", je.position);
        if (json_error_code(&je) == json_error_null_character) /* prompts and stops are C strings downstream */
            return BAD("", "request body holds \\u0000 (a NUL character) in the string that ends at line %d, column %d; "
                       "kipp-serve accepts strings without NUL", je.line, je.column);
        return BAD("", "request body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    }
    int rc = json_is_object(root) ? parse_object(r, root, e)
                                  : BAD("", "request body is %s, expected a JSON object", serve_json_type(root));
    json_decref(root);
    if (rc) serve_req_free(r);
    return rc;
}
