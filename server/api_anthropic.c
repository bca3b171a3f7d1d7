/*
 * api_anthropic.c - Anthropic Messages request JSON -> serve_req, checked
 * field by field before any model work, as api_parse.c checks OpenAI's.
 *
 * The conversation becomes the chat messages an OpenAI client would send for
 * it (llama-server and vLLM convert it the same way), so the Qwen3 template
 * renders both alike:
 *   system (string or text blocks)       -> a system message, blocks joined with "\n"
 *   user text blocks                     -> a user message, joined with "\n"
 *   user tool_result blocks              -> tool messages (before the user's text),
 *                                           content string or text blocks; is_error
 *                                           is accepted and not shown to the model
 *   assistant text / thinking / tool_use -> content, reasoning_content, tool_calls
 *   tools[].input_schema                 -> {"type": "function", "function":
 *                                           {name, description, parameters}}
 * cache_control and citations are accepted and have no effect (no prompt
 * cache is steered by them), as are redacted_thinking blocks (opaque to Qwen3).
 *
 * thinking absent keeps the template's default (Qwen3 thinks), as llama-server
 * and vLLM leave it; {"type": "disabled"} turns it off, {"type": "enabled",
 * "budget_tokens": N} sets the budget (any N >= 1 below max_tokens: Anthropic's
 * 1024 minimum is a rule of its models, not of Qwen3's).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/anthropic.h"
#include "server/serve_log.h"

#define BAD(param, ...) serve_fail(e, 400, "invalid_request_error", param, __VA_ARGS__)
#define OOM(param) serve_fail(e, 503, "server_error", param, "out of memory")
#define NAME_MAX_LEN 128 /* Anthropic's tool names: ^[a-zA-Z0-9_-]{1,128}$ */



static int name_ok(const char *s, size_t n)
{
    if (n == 0 || n > NAME_MAX_LEN) return 0;
    for (size_t i = 0; i < n; i++)
        if (!(s[i] == '_' || s[i] == '-' || (s[i] >= '0' && s[i] <= '9') || ((s[i] | 32) >= 'a' && (s[i] | 32) <= 'z')))
            return 0;
    return 1;
}

/* Refuse keys of o outside keys[] (NULL-terminated), naming where and what is expected. */
static int only_keys(const json_t *o, const char *const *keys, const char *where, const char *param, serve_error *e)
{
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)o, k, x) {
        size_t j = 0;
        while (keys[j] && strcmp(keys[j], k)) j++;
        if (keys[j]) continue;
        char expect[160] = "";
        for (j = 0; keys[j]; j++)
            snprintf(expect + strlen(expect), sizeof expect - strlen(expect), "%s%s", j ? ", " : "", keys[j]);
        return BAD(param, "%s.%.40s is not supported, expected only %s", where, k, expect);
    }
    return 0;
}

/* The block's "type" string, or NULL when b is not an object with one. */
static const char *block_type(const json_t *b)
{
    const json_t *t = json_object_get(b, "type");
    return json_is_object(b) && json_is_string(t) ? json_string_value(t) : NULL;
}

/* cache_control: accepted as Anthropic sends it (an object, or null). */
static int cache_control_ok(const json_t *b, const char *where, const char *param, serve_error *e)
{
    const json_t *cc = json_object_get(b, "cache_control");
    if (cc && !json_is_null(cc) && !json_is_object(cc))
        return BAD(param, "%s.cache_control is %s, expected an object such as {\"type\": \"ephemeral\"}", where, serve_json_type(cc));
    return 0;
}

/* One text block {"type": "text", "text", "cache_control"?, "citations"?} appended to out ("\n" between blocks). */
static int text_block(const json_t *b, const char *where, const char *param, serve_buf *out, int *n_parts, serve_error *e)
{
    static const char *const keys[] = {"type", "text", "cache_control", "citations", NULL};
    if (only_keys(b, keys, where, param, e) || cache_control_ok(b, where, param, e)) return -1;
    const json_t *t = json_object_get(b, "text"), *ci = json_object_get(b, "citations");
    if (!json_is_string(t)) return BAD(param, "%s.text is %s, expected a string", where, serve_json_type(t));
    if (ci && !json_is_null(ci) && !json_is_array(ci)) return BAD(param, "%s.citations is %s, expected an array or null", where, serve_json_type(ci));
    if ((*n_parts)++ && serve_buf_put(out, "\n", 1)) return OOM(param);
    return serve_buf_put(out, json_string_value(t), json_string_length(t)) ? OOM(param) : 0;
}

/* A string, or an array of text blocks, as one text (system, tool_result content). */
static int text_content(const json_t *v, const char *where, const char *param, serve_buf *out, serve_error *e)
{
    if (json_is_string(v)) return serve_buf_put(out, json_string_value(v), json_string_length(v)) ? OOM(param) : 0;
    if (!json_is_array(v)) return BAD(param, "%s is %s, expected a string or an array of text blocks", where, serve_json_type(v));
    int n_parts = 0;
    for (size_t k = 0; k < json_array_size(v); k++) {
        const json_t *b = json_array_get(v, k);
        const char *ty = block_type(b);
        char at[96];
        snprintf(at, sizeof at, "%s[%zu]", where, k);
        if (!ty || strcmp(ty, "text"))
            return BAD(param, "%s is %s%.40s%s, expected a text block {\"type\": \"text\", \"text\": ...} (kipp-serve's "
                       "models read text only)", at, ty ? "a block of type '" : "", ty ? ty : serve_json_type(b), ty ? "'" : "");
        if (text_block(b, at, param, out, &n_parts, e)) return -1;
    }
    return 0;
}

/* Append a message to r (capacity checked by the caller); content moved from b (may be empty). */
static serve_msg *push_msg(serve_req *r, kipp_role role, serve_buf *b, serve_error *e)
{
    serve_msg *m = &r->msgs[r->n_msgs];
    memset(m, 0, sizeof *m);
    m->role = role;
    m->content = b->p ? b->p : serve_dupn("", 0);
    m->content_len = b->p ? b->n : 0;
    memset(b, 0, sizeof *b);
    if (!m->content) return OOM("messages"), NULL;
    r->n_msgs++;
    return m;
}

/* ---- assistant turns ---- */

/* tool_use {"type", "id", "name", "input", "cache_control"?} -> call k of d. */
static int tool_use_block(serve_msg *d, const json_t *b, const char *where, serve_error *e)
{
    static const char *const keys[] = {"type", "id", "name", "input", "cache_control", NULL};
    if (only_keys(b, keys, where, "messages", e) || cache_control_ok(b, where, "messages", e)) return -1;
    const json_t *id = json_object_get(b, "id"), *nm = json_object_get(b, "name"), *in = json_object_get(b, "input");
    if (!json_is_string(id) || json_string_length(id) == 0)
        return BAD("messages", "%s.id is %s, expected a non-empty string", where, json_is_string(id) ? "empty" : serve_json_type(id));
    if (!json_is_string(nm) || !name_ok(json_string_value(nm), json_string_length(nm)))
        return BAD("messages", "%s.name is %s, expected 1..%d characters of a-z, A-Z, 0-9, _ and -", where,
                   json_is_string(nm) ? "not a valid name" : serve_json_type(nm), NAME_MAX_LEN);
    if (!json_is_object(in)) return BAD("messages", "%s.input is %s, expected an object", where, serve_json_type(in));
    for (size_t p = 0; p < d->n_calls; p++)
        if (!strcmp(d->call_ids[p], json_string_value(id)))
            return BAD("messages", "%s.id '%.64s' repeats an earlier tool_use of this message; expected unique ids", where,
                       json_string_value(id));
    /* the arguments as the template's tojson writes an object (api_tools.c does the same for OpenAI's) */
    char *text = json_dumps(in, JSON_COMPACT | JSON_REAL_PRECISION(17)), *args = NULL, err[256];
    int rc = text ? kipp_chat_json_dumps(text, strlen(text), &args, err, sizeof err) : KIPP_ENOMEM;
    free(text);
    if (rc) return rc == KIPP_ENOMEM ? OOM("messages") : BAD("messages", "%s.input: %s", where, err);
    kipp_tool_call *t = &d->calls[d->n_calls];
    d->call_ids[d->n_calls++] = serve_dupn(json_string_value(id), json_string_length(id));
    t->name = serve_dupn(json_string_value(nm), json_string_length(nm));
    t->arguments = args;
    return d->call_ids[d->n_calls - 1] && t->name ? 0 : OOM("messages");
}

static int assistant_blocks(serve_req *r, const json_t *c, size_t i, serve_error *e)
{
    static const char *const think_keys[] = {"type", "thinking", "signature", NULL}, *const red_keys[] = {"type", "data", NULL};
    serve_buf text = {0}, reasoning = {0};
    int n_text = 0, n_think = 0, rc = 0;
    size_t n = json_array_size(c);
    serve_msg tmp = {0};
    if (n && (!(tmp.calls = calloc(n, sizeof *tmp.calls)) || !(tmp.call_ids = calloc(n, sizeof *tmp.call_ids))))
        rc = OOM("messages");
    for (size_t k = 0; k < n && !rc; k++) {
        const json_t *b = json_array_get(c, k);
        const char *ty = block_type(b);
        char at[64];
        snprintf(at, sizeof at, "messages[%zu].content[%zu]", i, k);
        if (ty && !strcmp(ty, "text")) {
            rc = text_block(b, at, "messages", &text, &n_text, e);
        } else if (ty && !strcmp(ty, "tool_use")) {
            rc = tool_use_block(&tmp, b, at, e);
        } else if (ty && !strcmp(ty, "thinking")) {
            const json_t *th = json_object_get(b, "thinking"), *sg = json_object_get(b, "signature");
            rc = only_keys(b, think_keys, at, "messages", e);
            if (!rc && !json_is_string(th)) rc = BAD("messages", "%s.thinking is %s, expected a string", at, serve_json_type(th));
            if (!rc && sg && !json_is_string(sg)) rc = BAD("messages", "%s.signature is %s, expected a string", at, serve_json_type(sg));
            if (!rc && n_think++ && serve_buf_put(&reasoning, "\n", 1)) rc = OOM("messages");
            if (!rc && serve_buf_put(&reasoning, json_string_value(th), json_string_length(th))) rc = OOM("messages");
        } else if (ty && !strcmp(ty, "redacted_thinking")) {
            rc = only_keys(b, red_keys, at, "messages", e); /* encrypted for Claude: nothing Qwen3 can read */
        } else {
            rc = BAD("messages", "%s is %s%.40s%s, expected a text, thinking, redacted_thinking or tool_use block in an "
                     "assistant message", at, ty ? "a block of type '" : "", ty ? ty : serve_json_type(b), ty ? "'" : "");
        }
    }
    serve_msg *d = rc ? NULL : push_msg(r, KIPP_ROLE_ASSISTANT, &text, e);
    if (d) {
        d->calls = tmp.calls, d->call_ids = tmp.call_ids, d->n_calls = tmp.n_calls, memset(&tmp, 0, sizeof tmp);
        if (n_think) d->reasoning_content = reasoning.p ? reasoning.p : serve_dupn("", 0), d->reasoning_len = reasoning.n;
        if (n_think) memset(&reasoning, 0, sizeof reasoning);
        if (n_think && !d->reasoning_content) rc = OOM("messages");
    }
    for (size_t k = 0; k < tmp.n_calls; k++)
        free((char *)tmp.calls[k].name), free((char *)tmp.calls[k].arguments), free(tmp.call_ids[k]);
    free(tmp.calls), free(tmp.call_ids);
    serve_buf_free(&text), serve_buf_free(&reasoning);
    return rc || !d ? -1 : 0;
}

/* ---- user turns ---- */

/* tool_result {"type", "tool_use_id", "content"?, "is_error"?, "cache_control"?} -> a tool message
 * answering a tool_use of prev (the assistant message just before, or NULL). */
static int tool_result_block(serve_req *r, const json_t *b, const char *where, const serve_msg *prev, serve_error *e)
{
    static const char *const keys[] = {"type", "tool_use_id", "content", "is_error", "cache_control", NULL};
    if (only_keys(b, keys, where, "messages", e) || cache_control_ok(b, where, "messages", e)) return -1;
    const json_t *id = json_object_get(b, "tool_use_id"), *c = json_object_get(b, "content"), *ie = json_object_get(b, "is_error");
    if (!json_is_string(id) || json_string_length(id) == 0)
        return BAD("messages", "%s.tool_use_id is %s, expected the id of the tool_use this result answers", where,
                   json_is_string(id) ? "empty" : serve_json_type(id));
    if (ie && !json_is_boolean(ie)) return BAD("messages", "%s.is_error is %s, expected a boolean", where, serve_json_type(ie));
    size_t k = 0;
    while (prev && k < prev->n_calls && strcmp(prev->call_ids[k], json_string_value(id))) k++;
    if (!prev || k == prev->n_calls)
        return BAD("messages", "%s.tool_use_id '%.64s' matches no tool_use block of the assistant message right before "
                   "it; expected a tool_result to answer a tool_use of the previous turn", where, json_string_value(id));
    serve_buf text = {0};
    char at[96];
    snprintf(at, sizeof at, "%s.content", where);
    if (c && !json_is_null(c) && text_content(c, at, "messages", &text, e)) return serve_buf_free(&text), -1;
    serve_msg *d = push_msg(r, KIPP_ROLE_TOOL, &text, e);
    if (!d) return -1;
    return (d->tool_call_id = serve_dupn(json_string_value(id), json_string_length(id))) ? 0 : OOM("messages");
}

static int user_blocks(serve_req *r, const json_t *c, size_t i, serve_error *e)
{
    const serve_msg *prev = r->n_msgs && r->msgs[r->n_msgs - 1].role == KIPP_ROLE_ASSISTANT ? &r->msgs[r->n_msgs - 1] : NULL;
    serve_buf text = {0};
    int n_text = 0;
    for (size_t k = 0; k < json_array_size(c); k++) { /* tool results first, in order: they answer the turn before */
        const json_t *b = json_array_get(c, k);
        const char *ty = block_type(b);
        char at[64];
        snprintf(at, sizeof at, "messages[%zu].content[%zu]", i, k);
        int rc = 0;
        if (ty && !strcmp(ty, "tool_result")) rc = tool_result_block(r, b, at, prev, e);
        else if (!ty || strcmp(ty, "text"))
            rc = BAD("messages", "%s is %s%.40s%s, expected a text or tool_result block in a user message (kipp-serve's "
                     "models read text only)", at, ty ? "a block of type '" : "", ty ? ty : serve_json_type(b), ty ? "'" : "");
        if (rc) return -1;
    }
    for (size_t k = 0; k < json_array_size(c); k++) {
        const json_t *b = json_array_get(c, k);
        char at[64];
        snprintf(at, sizeof at, "messages[%zu].content[%zu]", i, k);
        if (!strcmp(block_type(b), "text") && text_block(b, at, "messages", &text, &n_text, e)) return serve_buf_free(&text), -1;
    }
    if (n_text == 0 && r->n_msgs && r->msgs[r->n_msgs - 1].role == KIPP_ROLE_TOOL) return 0; /* only results */
    return push_msg(r, KIPP_ROLE_USER, &text, e) ? 0 : -1;
}

static int parse_messages(serve_req *r, const json_t *v, const json_t *system, serve_error *e)
{
    size_t n = json_is_array(v) ? json_array_size(v) : 0, cap = 1;
    if (n == 0 || n > SERVE_MAX_MSGS)
        return BAD("messages", "messages is %s%s, expected an array of 1..%d messages", serve_json_type(v),
                   json_is_array(v) ? (n ? " (too long)" : " (empty)") : "", SERVE_MAX_MSGS);
    for (size_t i = 0; i < n; i++) cap += 1 + json_array_size(json_object_get(json_array_get(v, i), "content"));
    if (!(r->msgs = calloc(cap, sizeof *r->msgs))) return OOM("messages");
    if (system && !json_is_null(system)) {
        serve_buf b = {0};
        if (text_content(system, "system", "system", &b, e) || !push_msg(r, KIPP_ROLE_SYSTEM, &b, e)) return serve_buf_free(&b), -1;
    }
    for (size_t i = 0; i < n; i++) {
        static const char *const keys[] = {"role", "content", NULL};
        const json_t *m = json_array_get(v, i), *ro = json_object_get(m, "role"), *c = json_object_get(m, "content");
        char at[32];
        snprintf(at, sizeof at, "messages[%zu]", i);
        if (!json_is_object(m)) return BAD("messages", "%s is %s, expected an object {\"role\", \"content\"}", at, serve_json_type(m));
        if (only_keys(m, keys, at, "messages", e)) return -1;
        const char *role = json_is_string(ro) ? json_string_value(ro) : "";
        int user = !strcmp(role, "user");
        if (!user && strcmp(role, "assistant"))
            return BAD("messages", "%s.role is %s%.32s%s, expected \"user\" or \"assistant\" (the system prompt goes in the "
                       "top-level \"system\" field)", at, json_is_string(ro) ? "'" : "", json_is_string(ro) ? role : serve_json_type(ro),
                       json_is_string(ro) ? "'" : "");
        if (json_is_string(c)) {
            serve_buf b = {0};
            if (serve_buf_put(&b, json_string_value(c), json_string_length(c))) return OOM("messages");
            if (!push_msg(r, user ? KIPP_ROLE_USER : KIPP_ROLE_ASSISTANT, &b, e)) return serve_buf_free(&b), -1;
            continue;
        }
        if (!json_is_array(c) || json_array_size(c) == 0)
            return BAD("messages", "%s.content is %s%s, expected a string or a non-empty array of content blocks", at,
                       serve_json_type(c), json_is_array(c) ? " (empty)" : "");
        if (user ? user_blocks(r, c, i, e) : assistant_blocks(r, c, i, e)) return -1;
    }
    if (r->msgs[r->n_msgs - 1].role == KIPP_ROLE_ASSISTANT)
        return BAD("messages", "messages[%zu] is an assistant message: continuing a prefilled assistant turn is not "
                   "supported; expected the conversation to end with a user message", n - 1);
    return 0;
}

/* ---- tools, tool_choice, thinking ---- */

static int parse_tools(serve_req *r, const json_t *v, serve_error *e)
{
    static const char *const keys[] = {"name", "description", "input_schema", "cache_control", "type", NULL};
    size_t n = json_is_array(v) ? json_array_size(v) : 0;
    if (!json_is_array(v) || n > SERVE_MAX_TOOLS)
        return BAD("tools", "tools is %s%s, expected an array of at most %d tools", serve_json_type(v), json_is_array(v) ? " (too long)" : "",
                   SERVE_MAX_TOOLS);
    json_t *fns = json_array();
    if (!fns || (n && !(r->tools = calloc(n, sizeof *r->tools)))) return json_decref(fns), OOM("tools");
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const json_t *t = json_array_get(v, i), *ty = json_object_get(t, "type"), *nm = json_object_get(t, "name"),
                     *d = json_object_get(t, "description"), *sc = json_object_get(t, "input_schema");
        char at[32];
        snprintf(at, sizeof at, "tools[%zu]", i);
        if (!json_is_object(t)) rc = BAD("tools", "%s is %s, expected a tool {\"name\", \"description\", \"input_schema\"}", at, serve_json_type(t));
        else if (ty && !json_is_null(ty) && (!json_is_string(ty) || strcmp(json_string_value(ty), "custom")))
            rc = BAD("tools", "%s.type is %s%.60s%s: Anthropic's server and client tools are not available here, expected a "
                     "custom tool (type \"custom\" or absent) with an input_schema", at, json_is_string(ty) ? "'" : "",
                     json_is_string(ty) ? json_string_value(ty) : serve_json_type(ty), json_is_string(ty) ? "'" : "");
        else if (only_keys(t, keys, at, "tools", e) || cache_control_ok(t, at, "tools", e)) rc = -1;
        else if (!json_is_string(nm) || !name_ok(json_string_value(nm), json_string_length(nm)))
            rc = BAD("tools", "%s.name is %s, expected 1..%d characters of a-z, A-Z, 0-9, _ and -", at,
                     json_is_string(nm) ? "not a valid name" : serve_json_type(nm), NAME_MAX_LEN);
        else if (d && !json_is_null(d) && !json_is_string(d)) rc = BAD("tools", "%s.description is %s, expected a string", at, serve_json_type(d));
        else if (!json_is_object(sc) || !json_is_string(json_object_get(sc, "type")) ||
                 strcmp(json_string_value(json_object_get(sc, "type")), "object"))
            rc = BAD("tools", "%s.input_schema is %s, expected a JSON Schema object with \"type\": \"object\"", at,
                     json_is_object(sc) ? "a schema whose type is not \"object\"" : serve_json_type(sc));
        for (size_t k = 0; !rc && k < r->n_tools; k++)
            if (!strcmp(r->tools[k].name, json_string_value(nm)))
                rc = BAD("tools", "%s.name '%s' repeats tools[%zu]; expected unique names", at, json_string_value(nm), k);
        if (rc) break;
        serve_tool *o = &r->tools[r->n_tools++];
        o->name = serve_dupn(json_string_value(nm), json_string_length(nm));
        o->parameters = json_dumps(sc, JSON_COMPACT | JSON_REAL_PRECISION(17));
        /* the OpenAI function form the Qwen3 template expects: {"type": "function", "function": {...}} */
        json_t *fn = json_pack("{s:s}", "name", json_string_value(nm));
        if (fn && json_is_string(d)) json_object_set(fn, "description", (json_t *)d);
        if (fn) json_object_set(fn, "parameters", (json_t *)sc);
        if (!o->name || !o->parameters || !fn || json_array_append_new(fns, json_pack("{s:s, s:o}", "type", "function", "function", fn)))
            rc = OOM("tools");
    }
    if (!rc && n && !(r->tools_json = json_dumps(fns, JSON_COMPACT | JSON_REAL_PRECISION(17)))) rc = OOM("tools");
    json_decref(fns);
    return rc;
}

/* tool_choice {"type": "auto" | "any" | "tool" | "none", "name" (tool), "disable_parallel_tool_use"?}. */
static int parse_tool_choice(serve_req *r, const json_t *v, int count_only, serve_error *e)
{
    static const char *const keys[] = {"type", "name", "disable_parallel_tool_use", NULL};
    const json_t *ty = json_object_get(v, "type"), *nm = json_object_get(v, "name"), *dp = json_object_get(v, "disable_parallel_tool_use");
    const char *t = json_is_string(ty) ? json_string_value(ty) : "";
    if (!json_is_object(v) || (strcmp(t, "auto") && strcmp(t, "any") && strcmp(t, "tool") && strcmp(t, "none")))
        return BAD("tool_choice", "tool_choice is %s, expected {\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": \"tool\", "
                   "\"name\": ...} or {\"type\": \"none\"}", json_is_object(v) ? "an object of another type" : serve_json_type(v));
    if (only_keys(v, keys, "tool_choice", "tool_choice", e)) return -1;
    if (nm && strcmp(t, "tool")) return BAD("tool_choice", "tool_choice.name is only allowed with type \"tool\"");
    if (dp && !json_is_boolean(dp)) return BAD("tool_choice", "tool_choice.disable_parallel_tool_use is %s, expected a boolean", serve_json_type(dp));
    if (!r->n_tools && (!strcmp(t, "any") || !strcmp(t, "tool")))
        return BAD("tool_choice", "tool_choice type '%s' needs tools; expected a non-empty tools array", t);
    r->parallel_tool_calls = !json_is_true(dp);
    if (!strcmp(t, "none")) r->tool_choice = SERVE_TOOL_NONE;
    else if (!strcmp(t, "any")) r->tool_choice = SERVE_TOOL_REQUIRED;
    else if (!strcmp(t, "tool")) {
        if (!json_is_string(nm)) return BAD("tool_choice", "tool_choice.name is %s, expected the name of one of tools", serve_json_type(nm));
        size_t k = 0;
        while (k < r->n_tools && strcmp(r->tools[k].name, json_string_value(nm))) k++;
        if (k == r->n_tools) return BAD("tool_choice", "tool_choice names tool '%.64s', which is not in tools", json_string_value(nm));
        r->tool_choice = SERVE_TOOL_NAMED, r->tool_named = k;
    }
    if (count_only && r->tool_choice != SERVE_TOOL_NONE) r->tool_choice = SERVE_TOOL_AUTO; /* same prompt, no grammar */
    return 0;
}

/* thinking {"type": "enabled", "budget_tokens": N} | {"type": "disabled"} | {"type": "adaptive"}. */
static int parse_thinking(serve_req *r, const json_t *v, serve_error *e)
{
    static const char *const on_keys[] = {"type", "budget_tokens", NULL}, *const off_keys[] = {"type", NULL};
    const json_t *ty = json_object_get(v, "type"), *b = json_object_get(v, "budget_tokens");
    const char *t = json_is_string(ty) ? json_string_value(ty) : "";
    if (!json_is_object(v) || (strcmp(t, "enabled") && strcmp(t, "disabled") && strcmp(t, "adaptive")))
        return BAD("thinking", "thinking is %s, expected {\"type\": \"enabled\", \"budget_tokens\": N}, {\"type\": \"disabled\"} "
                   "or {\"type\": \"adaptive\"}", json_is_object(v) ? "an object of another type" : serve_json_type(v));
    if (only_keys(v, strcmp(t, "enabled") ? off_keys : on_keys, "thinking", "thinking", e)) return -1;
    r->enable_thinking = strcmp(t, "disabled") != 0;
    if (strcmp(t, "enabled")) return 0;
    if (!json_is_integer(b) || json_integer_value(b) < 1 || json_integer_value(b) > (1 << 30))
        return BAD("thinking", "thinking.budget_tokens is %s, expected an integer in [1, %d]", json_is_integer(b) ? "out of range" : serve_json_type(b), 1 << 30);
    r->thinking_budget = json_integer_value(b);
    return 0;
}

/* ---- scalar fields ---- */

static int parse_stop_sequences(serve_req *r, const json_t *v, serve_error *e)
{
    if (!json_is_array(v) || json_array_size(v) > SERVE_MAX_STOP)
        return BAD("stop_sequences", "stop_sequences is %s%s, expected an array of at most %d strings", serve_json_type(v),
                   json_is_array(v) ? " (too long)" : "", SERVE_MAX_STOP);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *s = json_array_get(v, i);
        if (!json_is_string(s) || json_string_length(s) == 0 || json_string_length(s) > SERVE_MAX_STOP_LEN)
            return BAD("stop_sequences", "stop_sequences[%zu] is %s, expected a string of 1..%d bytes", i,
                       json_is_string(s) ? "a string of another length" : serve_json_type(s), SERVE_MAX_STOP_LEN);
        if (!(r->stop[r->n_stop++] = serve_dupn(json_string_value(s), json_string_length(s)))) return OOM("stop_sequences");
    }
    return 0;
}

static int parse_number(serve_req *r, const char *k, const json_t *v, serve_error *e)
{
    int integer = !strcmp(k, "top_k") || !strcmp(k, "max_tokens");
    double lo = !strcmp(k, "max_tokens") ? 1 : 0, hi = integer ? (1 << 30) : 1;
    if (integer ? !json_is_integer(v) : !json_is_number(v))
        return BAD(k, "%s is %s, expected %s in [%g, %g]", k, serve_json_type(v), integer ? "an integer" : "a number", lo, hi);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return BAD(k, "%s %g is out of range, expected %s in [%g, %g]", k, x, integer ? "an integer" : "a number", lo, hi);
    if (!strcmp(k, "temperature")) r->sp.temperature = (float)x;
    else if (!strcmp(k, "top_p")) r->sp.top_p = (float)x;
    else if (!strcmp(k, "top_k")) r->sp.top_k = (int)x;
    else r->max_tokens = r->max_tokens_asked = (int64_t)x;
    return 0;
}

static int parse_metadata(const json_t *v, serve_error *e)
{
    static const char *const keys[] = {"user_id", NULL};
    const json_t *u = json_object_get(v, "user_id");
    if (!json_is_object(v)) return BAD("metadata", "metadata is %s, expected an object {\"user_id\": ...}", serve_json_type(v));
    if (only_keys(v, keys, "metadata", "metadata", e)) return -1;
    if (u && !json_is_null(u) && !json_is_string(u)) return BAD("metadata", "metadata.user_id is %s, expected a string", serve_json_type(u));
    return 0;
}

/* service_tier: accepted ("auto" or "standard_only"; there is one tier here), noted once per process. */
static int parse_service_tier(const json_t *v, serve_error *e)
{
    const char *s = json_is_string(v) ? json_string_value(v) : "";
    if (strcmp(s, "auto") && strcmp(s, "standard_only"))
        return BAD("service_tier", "service_tier is %s%.40s%s, expected \"auto\" or \"standard_only\"", json_is_string(v) ? "'" : "",
                   json_is_string(v) ? s : serve_json_type(v), json_is_string(v) ? "'" : "");
    serve_log_once("anthropic.service_tier", "/v1/messages: service_tier is accepted and has no effect (one tier); noted once");
    return 0;
}

/* One top-level field (non-null); tool_choice and thinking are handled after the loop. */
static int parse_field(serve_req *r, const char *k, const json_t *v, int count_only, serve_error *e)
{
    static const char *const gen_only[] = {"max_tokens", "stream", "stop_sequences", "temperature", "top_p", "top_k",
                                           "metadata", "service_tier", "logit_bias", NULL};
    for (size_t i = 0; count_only && gen_only[i]; i++)
        if (!strcmp(k, gen_only[i]))
            return BAD(k, "field '%s' is not supported by /v1/messages/count_tokens, expected only model, messages, system, "
                       "tools, tool_choice and thinking", k);
    if (!strcmp(k, "model")) {
        if (!json_is_string(v)) return BAD("model", "model is %s, expected a string", serve_json_type(v));
        return (r->model = serve_dupn(json_string_value(v), json_string_length(v))) ? 0 : OOM("model");
    }
    if (!strcmp(k, "max_tokens") || !strcmp(k, "temperature") || !strcmp(k, "top_p") || !strcmp(k, "top_k"))
        return parse_number(r, k, v, e);
    if (!strcmp(k, "stream")) {
        if (!json_is_boolean(v)) return BAD("stream", "stream is %s, expected a boolean", serve_json_type(v));
        r->stream = json_is_true(v);
        return 0;
    }
    if (!strcmp(k, "stop_sequences")) return parse_stop_sequences(r, v, e);
    if (!strcmp(k, "logit_bias")) return serve_parse_bias(r, v, e); /* a Kipp extension, as on /v1/responses */
    if (!strcmp(k, "metadata")) return parse_metadata(v, e);
    if (!strcmp(k, "service_tier")) return parse_service_tier(v, e);
    if (!strcmp(k, "cache_control")) /* automatic prompt caching: the KV pool reuses prefixes anyway */
        return json_is_object(v) ? 0 : BAD(k, "cache_control is %s, expected an object such as {\"type\": \"ephemeral\"}", serve_json_type(v));
    if (!strcmp(k, "tools")) return parse_tools(r, v, e);
    if (!strcmp(k, "thinking")) return parse_thinking(r, v, e);
    if (!strcmp(k, "messages") || !strcmp(k, "system") || !strcmp(k, "tool_choice")) return 0; /* after the loop */
    return BAD(k, "field '%.60s' is not supported by %s", k, count_only ? "/v1/messages/count_tokens" : "/v1/messages");
}

static int parse_object(serve_req *r, const json_t *root, int count_only, serve_error *e)
{
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)root, k, v) {
        if (json_is_null(v)) continue; /* null = absent */
        if (parse_field(r, k, v, count_only, e)) return -1;
    }
    const json_t *msgs = json_object_get(root, "messages"), *tc = json_object_get(root, "tool_choice");
    if (!msgs || json_is_null(msgs)) return BAD("messages", "messages is required");
    if (parse_messages(r, msgs, json_object_get(root, "system"), e)) return -1;
    if (tc && !json_is_null(tc) && parse_tool_choice(r, tc, count_only, e)) return -1;
    if (count_only) {
        r->max_tokens = r->max_tokens_asked = 1; /* as /tokenize: the whole prompt, as little room as possible */
        return 0;
    }
    if (r->max_tokens_asked < 0) return BAD("max_tokens", "max_tokens is required, expected an integer in [1, %d]", 1 << 30);
    if (r->thinking_budget >= r->max_tokens_asked)
        return BAD("thinking", "thinking.budget_tokens %lld is not below max_tokens %lld; expected a budget that leaves room "
                   "for the answer", (long long)r->thinking_budget, (long long)r->max_tokens_asked);
    return 0;
}

int serve_parse_anthropic(const char *body, size_t len, int count_only, serve_req *r, serve_error *e)
{
    serve_req_init(r, 1);
    r->api = SERVE_API_ANTHROPIC;
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (json_error_code(&je) == json_error_invalid_utf8)
            return BAD("", "request body holds invalid UTF-8 near byte %d; JSON text must be UTF-8", je.position);
        if (json_error_code(&je) == json_error_null_character)
            return BAD("", "request body holds \\u0000 (a NUL character) in the string that ends at line %d, column %d; "
                       "kipp-serve accepts strings without NUL", je.line, je.column);
        return BAD("", "request body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    }
    int rc = json_is_object(root) ? parse_object(r, root, count_only, e)
                                  : BAD("", "request body is %s, expected a JSON object", serve_json_type(root));
    json_decref(root);
    if (rc) serve_req_free(r);
    return rc;
}
