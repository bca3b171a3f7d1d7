/*
 * api_responses.c - a /v1/responses body -> serve_req.
 *
 * The Response fields are checked here with their own names (400 naming the
 * field and the expectation), then translated into the chat-completions
 * request they stand for and parsed by serve_parse, which adds its own checks
 * (sampling ranges, tool schemas, tool turns):
 *   instructions              -> a system message first
 *   input items               -> messages: message -> its role, function_call -> an
 *                                assistant turn's tool_calls (joined to the assistant
 *                                message before it), function_call_output -> a tool
 *                                message, reasoning -> the next assistant turn's
 *                                reasoning_content (Qwen3's template drops old reasoning)
 *   tools {type: function, name, ...}  -> {type: function, function: {...}}
 *   tool_choice {type: function, name} -> {type: function, function: {name}}
 *   reasoning.effort none|minimal      -> chat_template_kwargs.enable_thinking false
 *   text.format               -> response_format
 *   max_output_tokens         -> max_completion_tokens
 * previous_response_id puts the stored conversation (responses_store.c)
 * before the input; instructions are not carried over, as OpenAI documents.
 * Fields without behaviour here (metadata, user, include, service_tier, ...)
 * are accepted, echoed where the Response has them, and logged once.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "server/responses.h"
#include "server/serve_log.h"

#define BAD(param, ...) serve_fail(e, 400, "invalid_request_error", param, __VA_ARGS__)
#define OOM(param) serve_fail(e, 503, "server_error", param, "out of memory")


/* OpenAI's function names: 1..64 of [a-zA-Z0-9_-]. */
static int name_ok(json_t *v)
{
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (!s || n == 0 || n > 64) return 0;
    for (size_t i = 0; i < n; i++)
        if (!(s[i] == '_' || s[i] == '-' || (s[i] >= '0' && s[i] <= '9') || ((s[i] | 32) >= 'a' && (s[i] | 32) <= 'z')))
            return 0;
    return 1;
}

static int type_is(json_t *o, const char *t)
{
    json_t *x = json_object_get(o, "type");
    return json_is_string(x) && !strcmp(json_string_value(x), t);
}

/* Refuse keys of o outside keys[] (NULL-terminated), naming where. */
static int only_keys(json_t *o, const char *const *keys, const char *where, serve_error *e)
{
    const char *k;
    json_t *x;
    json_object_foreach(o, k, x) {
        if (json_is_null(x)) continue; /* null = absent: the SDK's model_dump() of an output item sends its unset fields */
        size_t j = 0;
        while (keys[j] && strcmp(keys[j], k)) j++;
        if (!keys[j]) return BAD(where, "%s.%.40s is not supported", where, k);
    }
    return 0;
}

/* ---- input items: checked with their own paths ---- */

/* A string, or an array of text parts whose type is one of types ("a|b"). */
static int check_parts(json_t *c, const char *where, const char *type1, const char *type2, serve_error *e)
{
    if (json_is_string(c)) return 0;
    if (!json_is_array(c)) return BAD(where, "%s is %s, expected a string or an array of %s parts", where, serve_json_type(c), type1);
    size_t k;
    json_t *p;
    json_array_foreach(c, k, p) {
        json_t *ty = json_object_get(p, "type");
        const char *t = json_is_string(ty) ? json_string_value(ty) : "";
        if (!json_is_object(p) || !json_is_string(ty))
            return BAD(where, "%s[%zu] is %s, expected {\"type\": \"%s\", \"text\": ...}", where, k,
                       json_is_object(p) ? "a part without a type" : serve_json_type(p), type1);
        if (strcmp(t, type1) && (!type2 || strcmp(t, type2)))
            return BAD(where, "%s[%zu] is a '%.40s' part; kipp-serve takes text only, expected type \"%s\"%s%s%s", where, k, t,
                       type1, type2 ? " or \"" : "", type2 ? type2 : "", type2 ? "\"" : "");
        if (!json_is_string(json_object_get(p, "text")))
            return BAD(where, "%s[%zu].text is %s, expected a string", where, k, serve_json_type(json_object_get(p, "text")));
    }
    return 0;
}

static int check_message(json_t *it, const char *where, serve_error *e)
{
    static const char *keys[] = {"type", "role", "content", "id", "status", "phase", NULL};
    if (only_keys(it, keys, where, e)) return -1;
    json_t *role = json_object_get(it, "role");
    const char *r = json_is_string(role) ? json_string_value(role) : "";
    if (strcmp(r, "user") && strcmp(r, "system") && strcmp(r, "developer") && strcmp(r, "assistant"))
        return BAD(where, "%s.role is %s%.32s%s, expected user, system, developer or assistant", where,
                   json_is_string(role) ? "'" : "", json_is_string(role) ? r : serve_json_type(role), json_is_string(role) ? "'" : "");
    char at[64];
    snprintf(at, sizeof at, "%s.content", where);
    if (!json_object_get(it, "content")) return BAD(at, "%s is missing, expected a string or an array of text parts", at);
    return check_parts(json_object_get(it, "content"), at, "input_text", "output_text", e);
}

static int check_function_call(json_t *it, const char *where, serve_error *e)
{
    static const char *keys[] = {"type", "call_id", "name", "arguments", "id", "status", NULL};
    if (only_keys(it, keys, where, e)) return -1;
    json_t *id = json_object_get(it, "call_id"), *nm = json_object_get(it, "name"), *a = json_object_get(it, "arguments");
    if (!json_is_string(id) || !json_string_length(id))
        return BAD(where, "%s.call_id is %s, expected a non-empty string", where, json_is_string(id) ? "empty" : serve_json_type(id));
    if (!name_ok(nm))
        return BAD(where, "%s.name is %s, expected 1..64 characters of a-z, A-Z, 0-9, _ and -", where,
                   json_is_string(nm) ? "not a valid name" : serve_json_type(nm));
    if (!json_is_string(a)) return BAD(where, "%s.arguments is %s, expected a string of JSON text", where, serve_json_type(a));
    json_error_t je;
    json_t *v = json_loadb(json_string_value(a), json_string_length(a), JSON_DECODE_ANY, &je);
    json_decref(v);
    return v ? 0 : BAD(where, "%s.arguments is not valid JSON text: %s (column %d)", where, je.text, je.column);
}

static int check_call_output(json_t *it, const char *where, serve_error *e)
{
    static const char *keys[] = {"type", "call_id", "output", "id", "status", NULL};
    if (only_keys(it, keys, where, e)) return -1;
    json_t *id = json_object_get(it, "call_id");
    if (!json_is_string(id) || !json_string_length(id))
        return BAD(where, "%s.call_id is %s, expected the call_id of the function_call it answers", where,
                   json_is_string(id) ? "empty" : serve_json_type(id));
    char at[64];
    snprintf(at, sizeof at, "%s.output", where);
    if (!json_object_get(it, "output")) return BAD(at, "%s is missing, expected a string", at);
    return check_parts(json_object_get(it, "output"), at, "input_text", NULL, e);
}

static int check_reasoning(json_t *it, const char *where, serve_error *e)
{
    static const char *keys[] = {"type", "id", "summary", "content", "encrypted_content", "status", NULL};
    if (only_keys(it, keys, where, e)) return -1;
    json_t *s = json_object_get(it, "summary"), *c = json_object_get(it, "content");
    char at[64];
    snprintf(at, sizeof at, "%s.summary", where);
    if (s && !json_is_null(s) && (!json_is_array(s) || check_parts(s, at, "summary_text", NULL, e)))
        return json_is_array(s) ? -1 : BAD(at, "%s is %s, expected an array of summary_text parts", at, serve_json_type(s));
    snprintf(at, sizeof at, "%s.content", where);
    if (c && !json_is_null(c) && (!json_is_array(c) || check_parts(c, at, "reasoning_text", NULL, e)))
        return json_is_array(c) ? -1 : BAD(at, "%s is %s, expected an array of reasoning_text parts", at, serve_json_type(c));
    return 0;
}

static int check_item(json_t *it, size_t i, serve_error *e)
{
    char where[32];
    snprintf(where, sizeof where, "input[%zu]", i);
    if (!json_is_object(it)) return BAD(where, "%s is %s, expected an input item object", where, serve_json_type(it));
    json_t *ty = json_object_get(it, "type");
    if (!ty && json_object_get(it, "role")) return check_message(it, where, e); /* EasyInputMessage */
    if (type_is(it, "message")) return check_message(it, where, e);
    if (type_is(it, "function_call")) return check_function_call(it, where, e);
    if (type_is(it, "function_call_output")) return check_call_output(it, where, e);
    if (type_is(it, "reasoning")) return check_reasoning(it, where, e);
    return BAD(where, "%s.type is %s%.40s%s, expected message, function_call, function_call_output or reasoning "
               "(kipp-serve runs function tools only)", where, json_is_string(ty) ? "'" : "",
               json_is_string(ty) ? json_string_value(ty) : serve_json_type(ty), json_is_string(ty) ? "'" : "");
}

/* ---- items -> chat messages ---- */

/* The text of a string or of text parts joined with "\n" (as chat content parts are); malloc'd. */
static char *parts_text(json_t *c)
{
    if (json_is_string(c)) return strdup(json_string_value(c));
    serve_buf b = {0};
    size_t k;
    json_t *p;
    json_array_foreach(c, k, p) {
        json_t *t = json_object_get(p, "text");
        if (k) serve_buf_put(&b, "\n", 1);
        serve_buf_put(&b, json_string_value(t), json_string_length(t));
    }
    return b.p ? b.p : strdup("");
}

typedef struct {
    json_t *msgs;
    json_t *turn;     /* the assistant message a function_call joins, or NULL */
    char *reasoning;  /* a reasoning item's text, for the next assistant turn */
} conv;

static json_t *assistant_turn(conv *cv, json_t *content)
{
    json_t *m = json_pack("{s:s, s:o}", "role", "assistant", "content", content);
    if (cv->reasoning) json_object_set_new(m, "reasoning_content", json_string(cv->reasoning));
    free(cv->reasoning), cv->reasoning = NULL;
    json_array_append_new(cv->msgs, m);
    return cv->turn = m;
}

static void convert_item(conv *cv, json_t *it)
{
    if (type_is(it, "reasoning")) {
        json_t *c = json_object_get(it, "content"), *s = json_object_get(it, "summary");
        free(cv->reasoning);
        cv->reasoning = json_array_size(c) ? parts_text(c) : json_array_size(s) ? parts_text(s) : NULL;
        cv->turn = NULL;
        return;
    }
    if (type_is(it, "function_call")) {
        json_t *m = cv->turn ? cv->turn : assistant_turn(cv, json_string(""));
        json_t *calls = json_object_get(m, "tool_calls");
        if (!calls) json_object_set_new(m, "tool_calls", calls = json_array());
        json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", json_object_get(it, "call_id"), "type",
                                               "function", "function", "name", json_object_get(it, "name"), "arguments",
                                               json_object_get(it, "arguments")));
        return;
    }
    int output = type_is(it, "function_call_output");
    char *text = parts_text(json_object_get(it, output ? "output" : "content"));
    const char *role = output ? "tool" : json_string_value(json_object_get(it, "role"));
    if (!output && !strcmp(role, "assistant")) {
        assistant_turn(cv, json_string(text ? text : ""));
    } else {
        json_t *m = json_pack("{s:s, s:s}", "role", role, "content", text ? text : "");
        if (output) json_object_set(m, "tool_call_id", json_object_get(it, "call_id"));
        json_array_append_new(cv->msgs, m);
        free(cv->reasoning), cv->reasoning = NULL, cv->turn = NULL;
    }
    free(text);
}

/* ---- top-level fields ---- */

typedef struct {
    json_t *chat;      /* the chat request being built */
    json_t *echo;      /* the Response fields echoed */
    json_t *history;   /* conversation items */
    json_t *root;
    int store;
} build;

/* Log once per process that field k is accepted without effect. */
static void note_ignored(const char *k)
{
    char key[80];
    snprintf(key, sizeof key, "responses.%s", k);
    serve_log_once(key, "/v1/responses: field '%s' is accepted and has no effect here (logged once)", k);
}

static int parse_tool(build *b, json_t *t, size_t i, json_t *out, serve_error *e)
{
    static const char *keys[] = {"type", "name", "description", "parameters", "strict", NULL};
    char where[32];
    snprintf(where, sizeof where, "tools[%zu]", i);
    json_t *ty = json_object_get(t, "type");
    if (!json_is_object(t)) return BAD(where, "%s is %s, expected a function tool object", where, serve_json_type(t));
    if (!type_is(t, "function"))
        return BAD(where, "%s.type is %s%.40s%s: kipp-serve runs function tools only, expected \"function\"", where,
                   json_is_string(ty) ? "'" : "", json_is_string(ty) ? json_string_value(ty) : serve_json_type(ty),
                   json_is_string(ty) ? "'" : "");
    if (only_keys(t, keys, where, e)) return -1;
    json_t *nm = json_object_get(t, "name"), *p = json_object_get(t, "parameters");
    if (!name_ok(nm))
        return BAD(where, "%s.name is %s, expected 1..64 characters of a-z, A-Z, 0-9, _ and -", where,
                   json_is_string(nm) ? "not a valid name" : serve_json_type(nm));
    if (p && !json_is_null(p) && !json_is_object(p))
        return BAD(where, "%s.parameters is %s, expected a JSON Schema object", where, serve_json_type(p));
    json_t *fn = json_object();
    const char *k;
    json_t *x;
    json_object_foreach(t, k, x)
        if (strcmp(k, "type") && !json_is_null(x)) json_object_set(fn, k, x);
    (void)b;
    return json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn)) ? OOM("tools") : 0;
}

static int parse_tools(build *b, json_t *v, serve_error *e)
{
    if (!json_is_array(v)) return BAD("tools", "tools is %s, expected an array of function tools", serve_json_type(v));
    json_object_set(b->echo, "tools", v);
    if (!json_array_size(v)) return 0; /* no tools: the chat request has none */
    json_t *out = json_array();
    json_object_set_new(b->chat, "tools", out);
    for (size_t i = 0; i < json_array_size(v); i++)
        if (parse_tool(b, json_array_get(v, i), i, out, e)) return -1;
    return 0;
}

static int parse_tool_choice(build *b, json_t *v, serve_error *e)
{
    int has_tools = json_array_size(json_object_get(b->root, "tools")) > 0;
    json_object_set(b->echo, "tool_choice", v);
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (strcmp(s, "auto") && strcmp(s, "none") && strcmp(s, "required"))
            return BAD("tool_choice", "tool_choice is '%.40s', expected \"auto\", \"none\", \"required\" or "
                       "{\"type\": \"function\", \"name\": ...}", s);
        if (!has_tools && !strcmp(s, "required"))
            return BAD("tool_choice", "tool_choice \"required\" needs tools, and none are given");
        if (has_tools) json_object_set(b->chat, "tool_choice", v);
        return 0;
    }
    json_t *nm = json_object_get(v, "name");
    if (!json_is_object(v) || !type_is(v, "function") || json_object_size(v) != 2 || !json_is_string(nm))
        return BAD("tool_choice", "tool_choice is %s, expected \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                   "\"name\": ...} (kipp-serve runs function tools only)", json_is_object(v) ? "an object of another shape" : serve_json_type(v));
    if (!has_tools) return BAD("tool_choice", "tool_choice names function '%.64s', and no tools are given", json_string_value(nm));
    json_object_set_new(b->chat, "tool_choice", json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", nm));
    return 0;
}

static int parse_reasoning(build *b, json_t *v, serve_error *e)
{
    static const char *keys[] = {"effort", "summary", "generate_summary", NULL};
    if (!json_is_object(v)) return BAD("reasoning", "reasoning is %s, expected an object {\"effort\": ...}", serve_json_type(v));
    if (only_keys(v, keys, "reasoning", e)) return -1;
    json_t *ef = json_object_get(v, "effort");
    const char *s = json_is_string(ef) ? json_string_value(ef) : "";
    static const char *efforts[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
    size_t k = 0;
    while (k < 6 && strcmp(efforts[k], s)) k++;
    if (ef && !json_is_null(ef) && k == 6)
        return BAD("reasoning", "reasoning.effort is %s%.32s%s, expected none, minimal, low, medium, high or xhigh",
                   json_is_string(ef) ? "'" : "", json_is_string(ef) ? s : serve_json_type(ef), json_is_string(ef) ? "'" : "");
    for (const char *const *f = keys + 1; *f; f++) {
        json_t *x = json_object_get(v, *f);
        if (x && !json_is_null(x) && !json_is_string(x))
            return BAD("reasoning", "reasoning.%s is %s, expected \"auto\", \"concise\" or \"detailed\"", *f, serve_json_type(x));
    }
    /* none and minimal turn Qwen3's thinking off; the other efforts leave it on (there is no finer control) */
    if (k < 2) json_object_set_new(b->chat, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", 0));
    json_object_set_new(b->echo, "reasoning", json_pack("{s:O, s:O}", "effort", ef ? ef : json_null(), "summary",
                                                        json_object_get(v, "summary") ? json_object_get(v, "summary") : json_null()));
    return 0;
}

static int parse_text(build *b, json_t *v, serve_error *e)
{
    static const char *keys[] = {"format", "verbosity", NULL}, *fkeys[] = {"type", "name", "schema", "strict", "description", NULL};
    if (!json_is_object(v)) return BAD("text", "text is %s, expected an object {\"format\": ...}", serve_json_type(v));
    if (only_keys(v, keys, "text", e)) return -1;
    json_object_set(b->echo, "text", v);
    json_t *f = json_object_get(v, "format");
    if (!f || json_is_null(f)) return 0;
    json_t *ty = json_object_get(f, "type");
    if (!json_is_object(f)) return BAD("text.format", "text.format is %s, expected an object {\"type\": ...}", serve_json_type(f));
    if (type_is(f, "text") || type_is(f, "json_object")) {
        if (json_object_size(f) != 1) return BAD("text.format", "text.format of type '%s' takes no other field", json_string_value(ty));
        if (type_is(f, "json_object")) json_object_set_new(b->chat, "response_format", json_pack("{s:s}", "type", "json_object"));
        return 0;
    }
    if (!type_is(f, "json_schema"))
        return BAD("text.format", "text.format.type is %s%.40s%s, expected \"text\", \"json_object\" or \"json_schema\"",
                   json_is_string(ty) ? "'" : "", json_is_string(ty) ? json_string_value(ty) : serve_json_type(ty), json_is_string(ty) ? "'" : "");
    if (only_keys(f, fkeys, "text.format", e)) return -1;
    if (!json_is_object(json_object_get(f, "schema")))
        return BAD("text.format", "text.format.schema is %s, expected a JSON Schema object", serve_json_type(json_object_get(f, "schema")));
    json_t *js = json_deep_copy(f);
    json_object_del(js, "type");
    json_object_set_new(b->chat, "response_format", json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js));
    return 0;
}

static int parse_input(build *b, json_t *v, serve_error *e)
{
    if (json_is_string(v)) {
        json_array_append_new(b->history, json_pack("{s:s, s:s, s:O}", "type", "message", "role", "user", "content", v));
        return 0;
    }
    if (!json_is_array(v) || !json_array_size(v))
        return BAD("input", "input is %s%s, expected a string or a non-empty array of input items", serve_json_type(v),
                   json_is_array(v) ? " (empty)" : "");
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *it = json_array_get(v, i);
        if (check_item(it, i, e)) return -1;
        json_t *c = json_deep_copy(it);
        if (!json_object_get(c, "type")) json_object_set_new(c, "type", json_string("message"));
        json_array_append_new(b->history, c);
    }
    return 0;
}

static int parse_previous(build *b, json_t *v, serve_error *e)
{
    if (!json_is_string(v)) return BAD("previous_response_id", "previous_response_id is %s, expected a response id", serve_json_type(v));
    json_t *items = serve_resp_store_get(json_string_value(v));
    if (!items) {
        BAD("previous_response_id", "previous response with id '%.64s' not found: it was not stored (store false), was "
            "evicted (the server keeps the last %d responses, at most %zu MiB) or the server restarted",
            json_string_value(v), SERVE_RESP_STORE_MAX, SERVE_RESP_STORE_BYTES >> 20);
        snprintf(e->code, sizeof e->code, "previous_response_not_found");
        return -1;
    }
    json_array_extend(b->history, items);
    json_decref(items);
    json_object_set(b->echo, "previous_response_id", v);
    return 0;
}

static int parse_metadata(build *b, json_t *v, serve_error *e)
{
    if (!json_is_object(v) || json_object_size(v) > 16)
        return BAD("metadata", "metadata is %s%s, expected an object of at most 16 string values", serve_json_type(v),
                   json_is_object(v) ? " with more than 16 keys" : "");
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) {
        if (strlen(k) > 64 || !json_is_string(x) || json_string_length(x) > 512)
            return BAD("metadata", "metadata.%.64s is %s, expected a key of at most 64 characters with a string of at most "
                       "512", k, json_is_string(x) ? "too long" : serve_json_type(x));
    }
    json_object_set(b->echo, "metadata", v);
    return 0;
}

/* Fields accepted for what clients send and echoed, without behaviour here. */
static int parse_inert(build *b, const char *k, json_t *v, serve_error *e)
{
    if (!strcmp(k, "store")) {
        if (!json_is_boolean(v)) return BAD(k, "store is %s, expected a boolean", serve_json_type(v));
        b->store = json_is_true(v);
        return json_object_set(b->echo, k, v);
    }
    if (!strcmp(k, "truncation")) {
        const char *s = json_string_value(v);
        if (!s || (strcmp(s, "auto") && strcmp(s, "disabled")))
            return BAD(k, "truncation is %s, expected \"auto\" or \"disabled\"", json_is_string(v) ? "another string" : serve_json_type(v));
        note_ignored("truncation"); /* the chat fit drops the oldest turns either way, keeping the last (api_prepare.c) */
        return json_object_set(b->echo, k, v);
    }
    if (!strcmp(k, "background")) {
        if (!json_is_false(v)) return BAD(k, "background is %s, expected false: kipp-serve answers on the request's connection",
                                          json_is_true(v) ? "true" : serve_json_type(v));
        return 0;
    }
    if (!strcmp(k, "top_logprobs")) {
        if (!json_is_integer(v) || json_integer_value(v) != 0)
            return BAD(k, "top_logprobs is %s, expected 0: /v1/responses returns no logprobs here (use /v1/chat/completions)",
                       json_is_integer(v) ? "above 0" : serve_json_type(v));
        return 0;
    }
    if (!strcmp(k, "max_tool_calls")) {
        if (!json_is_integer(v) || json_integer_value(v) < 1) return BAD(k, "max_tool_calls is %s, expected an integer >= 1", serve_json_type(v));
        if (json_integer_value(v) == 1 && json_array_size(json_object_get(b->root, "tools")))
            json_object_set_new(b->chat, "parallel_tool_calls", json_false()); /* one call at most */
        return json_object_set(b->echo, k, v);
    }
    if (!strcmp(k, "include")) {
        for (size_t i = 0; json_is_array(v) && i < json_array_size(v); i++)
            if (!json_is_string(json_array_get(v, i))) return BAD(k, "include[%zu] is %s, expected a string", i, serve_json_type(json_array_get(v, i)));
        if (!json_is_array(v)) return BAD(k, "include is %s, expected an array of strings", serve_json_type(v));
        note_ignored("include");
        return 0;
    }
    if (!strcmp(k, "stream_options")) {
        if (!json_is_object(v)) return BAD(k, "stream_options is %s, expected an object", serve_json_type(v));
        note_ignored("stream_options");
        return 0;
    }
    /* user, service_tier, prompt_cache_key, safety_identifier: strings */
    if (!json_is_string(v)) return BAD(k, "%s is %s, expected a string", k, serve_json_type(v));
    if (strcmp(k, "user")) note_ignored(k);
    return strcmp(k, "user") && strcmp(k, "service_tier") ? 0 : json_object_set(b->echo, k, v);
}

static const char *const INERT[] = {"store", "truncation", "background", "top_logprobs", "max_tool_calls", "include",
                                    "stream_options", "user", "service_tier", "prompt_cache_key", "safety_identifier", NULL};
/* Sampling fields passed on as they are (kipp extensions beside OpenAI's temperature and top_p, as vLLM accepts them). */
static const char *const PASS[] = {"model", "temperature", "top_p", "stream", "top_k", "min_p", "seed", "logit_bias",
                                   "presence_penalty", "frequency_penalty", "repetition_penalty", "stop",
                                   "thinking_token_budget", "thinking_budget_tokens", NULL};

static int in(const char *const *list, const char *k)
{
    for (; *list; list++)
        if (!strcmp(*list, k)) return 1;
    return 0;
}

/* One top-level field other than previous_response_id and input (non-null). */
static int parse_field(build *b, const char *k, json_t *v, serve_error *e)
{
    if (in(PASS, k)) {
        if (!strcmp(k, "temperature") || !strcmp(k, "top_p")) json_object_set(b->echo, k, v); /* the Response has these */
        return json_object_set(b->chat, k, v);
    }
    if (in(INERT, k)) return parse_inert(b, k, v, e);
    if (!strcmp(k, "instructions")) {
        if (!json_is_string(v)) return BAD(k, "instructions is %s, expected a string", serve_json_type(v));
        return json_object_set(b->echo, k, v);
    }
    if (!strcmp(k, "tools")) return parse_tools(b, v, e);
    if (!strcmp(k, "tool_choice")) return parse_tool_choice(b, v, e);
    if (!strcmp(k, "parallel_tool_calls")) {
        if (!json_is_boolean(v)) return BAD(k, "parallel_tool_calls is %s, expected a boolean", serve_json_type(v));
        if (json_array_size(json_object_get(b->root, "tools")) && !json_object_get(b->chat, "parallel_tool_calls"))
            json_object_set(b->chat, k, v);
        return json_object_set(b->echo, k, v);
    }
    if (!strcmp(k, "reasoning")) return parse_reasoning(b, v, e);
    if (!strcmp(k, "text")) return parse_text(b, v, e);
    if (!strcmp(k, "metadata")) return parse_metadata(b, v, e);
    if (!strcmp(k, "max_output_tokens")) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > (1 << 30))
            return BAD(k, "max_output_tokens is %s, expected an integer in [1, %d]", json_is_integer(v) ? "out of range" : serve_json_type(v),
                       1 << 30);
        json_object_set(b->echo, k, v);
        return json_object_set(b->chat, "max_completion_tokens", v);
    }
    if (!strcmp(k, "prompt") || !strcmp(k, "conversation"))
        return BAD(k, "%s is not supported by kipp-serve: send the conversation as input (or use previous_response_id)", k);
    return BAD(k, "field '%.60s' is not supported by /v1/responses", k);
}

static json_t *echo_defaults(void)
{
    return json_pack("{s:n, s:[], s:s, s:b, s:f, s:f, s:n, s:n, s:b, s:{}, s:{s:{s:s}}, s:{s:n, s:n}, s:s, s:n, s:b}",
                     "instructions", "tools", "tool_choice", "auto", "parallel_tool_calls", 1, "temperature", 1.0, "top_p",
                     1.0, "max_output_tokens", "previous_response_id", "store", 1, "metadata", "text", "format", "type",
                     "text", "reasoning", "effort", "summary", "truncation", "disabled", "user", "background", 0);
}

/* The chat request's messages: instructions first, then the conversation items. */
static void build_messages(build *b)
{
    conv cv = {.msgs = json_array()};
    json_t *ins = json_object_get(b->root, "instructions");
    if (json_is_string(ins)) json_array_append_new(cv.msgs, json_pack("{s:s, s:O}", "role", "system", "content", ins));
    size_t i;
    json_t *it;
    json_array_foreach(b->history, i, it) convert_item(&cv, it);
    free(cv.reasoning);
    json_object_set_new(b->chat, "messages", cv.msgs);
}

static int build_request(build *b, serve_error *e)
{
    json_t *prev = json_object_get(b->root, "previous_response_id"), *input = json_object_get(b->root, "input");
    if (prev && !json_is_null(prev) && parse_previous(b, prev, e)) return -1; /* the stored items come first */
    if (!input || json_is_null(input)) return BAD("input", "input is required: a string or an array of input items");
    if (parse_input(b, input, e)) return -1;
    const char *k;
    json_t *v;
    json_object_foreach(b->root, k, v) {
        if (json_is_null(v) || !strcmp(k, "previous_response_id") || !strcmp(k, "input")) continue;
        if (parse_field(b, k, v, e)) return -1;
    }
    build_messages(b);
    return 0;
}

static void resp_free(void *p)
{
    serve_resp *x = p;
    if (!x) return;
    json_decref(x->echo), json_decref(x->history);
    serve_buf_free(&x->part_args);
    free(x);
}

/* 32 random hex digits: ids unique across processes and restarts. */
static void random_hex(char out[33])
{
    unsigned char b[16];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {
        static unsigned long long ctr;
        unsigned long long t = (unsigned long long)time(NULL) ^ ((unsigned long long)getpid() << 32) ^
                               __atomic_add_fetch(&ctr, 0x9e3779b97f4a7c15ull, __ATOMIC_RELAXED);
        for (int i = 0; i < 16; i++) b[i] = (unsigned char)(t >> (8 * (i & 7))) ^ (unsigned char)(i * 151);
    }
    for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
}

/* A chat-side error, said in the Responses request's terms. */
static void rename_param(serve_error *e)
{
    static const char *map[][2] = {{"messages", "input"}, {"max_completion_tokens", "max_output_tokens"},
                                   {"response_format", "text.format"}, {"chat_template_kwargs", "reasoning"}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(e->param, map[i][0])) snprintf(e->param, sizeof e->param, "%s", map[i][1]);
    if (!strcmp(e->param, "input")) {
        static const char pre[] = "input, as the chat messages it becomes (instructions first): ";
        size_t n = strnlen(e->message, sizeof e->message - sizeof pre);
        memmove(e->message + sizeof pre - 1, e->message, n);
        memcpy(e->message, pre, sizeof pre - 1);
        e->message[sizeof pre - 1 + n] = 0;
    }
}

int serve_responses_parse(const char *body, size_t len, serve_req *r, serve_error *e)
{
    serve_req_init(r, 1);
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root || !json_is_object(root)) { /* the message names root's type before root is freed */
        int rc = root ? BAD("", "request body is %s, expected a JSON object", serve_json_type(root))
                      : BAD("", "request body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
        json_decref(root);
        return rc;
    }
    build b = {.chat = json_object(), .echo = echo_defaults(), .history = json_array(), .root = root, .store = 1};
    int rc = build_request(&b, e);
    char *text = rc ? NULL : json_dumps(b.chat, JSON_COMPACT);
    if (!rc && !text) rc = OOM("");
    if (!rc && serve_parse(text, strlen(text), 1, r, e)) rc = -1, rename_param(e);
    free(text);
    json_decref(b.chat), json_decref(root);
    serve_resp *x = rc ? NULL : calloc(1, sizeof *x);
    if (!rc && !x) serve_req_free(r), rc = OOM("");
    if (rc) {
        json_decref(b.echo), json_decref(b.history);
        return -1;
    }
    *x = (serve_resp){.echo = b.echo, .history = b.history, .store = b.store, .rs_index = -1, .msg_index = -1};
    random_hex(x->hex);
    r->api = SERVE_API_RESPONSES, r->api_ctx = x, r->api_ctx_free = resp_free;
    return 0;
}
