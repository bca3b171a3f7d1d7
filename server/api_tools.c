/*
 * api_tools.c - the tool fields of a chat request: tools, tool_choice,
 * parallel_tool_calls, assistant tool_calls and tool messages, checked as
 * OpenAI's API checks them (a tool message must answer a call of the
 * assistant turn before it), and the grammar that forces a call for
 * tool_choice "required" or a named function. No model is needed for the
 * parse: tests/fuzz_http.c drives it with api_parse.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/serve.h"

#define BAD(param, ...) serve_fail(e, 400, "invalid_request_error", param, __VA_ARGS__)
#define OOM(param) serve_fail(e, 503, "server_error", param, "out of memory")



int serve_tools_active(const serve_req *r) { return r->n_tools > 0 && r->tool_choice != SERVE_TOOL_NONE; }

void serve_tools_free(serve_req *r)
{
    for (size_t i = 0; i < r->n_tools; i++) free(r->tools[i].name), free(r->tools[i].parameters);
    free(r->tools);
    free(r->tools_json); /* r->grammar: serve_req_free */
    for (size_t i = 0; r->msgs && i < r->n_msgs; i++) {
        serve_msg *d = &r->msgs[i];
        for (size_t k = 0; k < d->n_calls; k++) {
            free((char *)d->calls[k].name), free((char *)d->calls[k].arguments);
            if (d->call_ids) free(d->call_ids[k]);
        }
        free(d->calls), free(d->call_ids), free(d->tool_call_id);
    }
}

/* OpenAI's function names: 1..64 of [a-zA-Z0-9_-]. */
static int name_ok(const char *s, size_t n)
{
    if (n == 0 || n > 64) return 0;
    for (size_t i = 0; i < n; i++)
        if (!(s[i] == '_' || s[i] == '-' || (s[i] >= '0' && s[i] <= '9') || ((s[i] | 32) >= 'a' && (s[i] | 32) <= 'z')))
            return 0;
    return 1;
}

/* Refuse keys of o outside keys[], naming where (e.g. "tools[2].function"). */
static int only_keys(const json_t *o, const char *const *keys, const char *where, const char *param, const char *expect,
                     serve_error *e)
{
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)o, k, x) {
        size_t j = 0;
        while (keys[j] && strcmp(keys[j], k)) j++;
        if (!keys[j]) return BAD(param, "%s.%.40s is not supported, expected only %s", where, k, expect);
    }
    return 0;
}

/* parameters describe the arguments, which are a JSON object (OpenAI refuses other types the same way):
 * "type" is "object", or absent with no keyword that makes the value something else. */
static int params_object(const json_t *p, size_t i, serve_error *e)
{
    static const char *const other[] = {"anyOf", "oneOf", "allOf", "$ref", "enum", "const", "items", NULL};
    const json_t *ty = json_object_get(p, "type");
    if (ty && (!json_is_string(ty) || strcmp(json_string_value(ty), "object")))
        return BAD("tools", "tools[%zu].function.parameters has \"type\" %s%.40s%s, expected \"object\": a function's "
                   "arguments are a JSON object", i, json_is_string(ty) ? "\"" : "", json_is_string(ty) ?
                   json_string_value(ty) : serve_json_type(ty), json_is_string(ty) ? "\"" : "");
    for (size_t k = 0; !ty && other[k]; k++)
        if (json_object_get(p, other[k]))
            return BAD("tools", "tools[%zu].function.parameters uses \"%s\" without \"type\": \"object\", expected a "
                       "JSON Schema of type \"object\": a function's arguments are a JSON object", i, other[k]);
    return 0;
}

/* tools[i]: {"type": "function", "function": {name, description?, parameters?, strict?}} */
static int parse_tool(serve_req *r, const json_t *t, size_t i, serve_error *e)
{
    static const char *top[] = {"type", "function", NULL}, *fn_keys[] = {"name", "description", "parameters", "strict", NULL};
    const json_t *ty = json_object_get(t, "type"), *f = json_object_get(t, "function");
    if (!json_is_object(t) || !json_is_string(ty) || strcmp(json_string_value(ty), "function") || !json_is_object(f))
        return BAD("tools", "tools[%zu] is not a function tool, expected {\"type\": \"function\", \"function\": {\"name\": ...}}", i);
    char where[48];
    snprintf(where, sizeof where, "tools[%zu]", i);
    if (only_keys(t, top, where, "tools", "type and function", e)) return -1;
    snprintf(where, sizeof where, "tools[%zu].function", i);
    if (only_keys(f, fn_keys, where, "tools", "name, description, parameters and strict", e)) return -1;
    const json_t *nm = json_object_get(f, "name"), *d = json_object_get(f, "description"),
                 *p = json_object_get(f, "parameters"), *st = json_object_get(f, "strict");
    if (!json_is_string(nm) || !name_ok(json_string_value(nm), json_string_length(nm)))
        return BAD("tools", "tools[%zu].function.name is %s, expected 1..64 characters of a-z, A-Z, 0-9, _ and -", i,
                   json_is_string(nm) ? "not a valid name" : serve_json_type(nm));
    if (d && !json_is_null(d) && !json_is_string(d))
        return BAD("tools", "tools[%zu].function.description is %s, expected a string", i, serve_json_type(d));
    if (p && !json_is_null(p) && !json_is_object(p))
        return BAD("tools", "tools[%zu].function.parameters is %s, expected a JSON Schema object", i, serve_json_type(p));
    if (json_is_object(p) && params_object(p, i, e)) return -1;
    if (st && !json_is_null(st) && !json_is_boolean(st))
        return BAD("tools", "tools[%zu].function.strict is %s, expected a boolean", i, serve_json_type(st));
    for (size_t k = 0; k < r->n_tools; k++)
        if (!strcmp(r->tools[k].name, json_string_value(nm)))
            return BAD("tools", "tools[%zu].function.name '%s' repeats tools[%zu]; expected unique names", i,
                       json_string_value(nm), k);
    serve_tool *d_out = &r->tools[r->n_tools++];
    d_out->name = serve_dupn(json_string_value(nm), json_string_length(nm));
    if (json_is_object(p)) d_out->parameters = json_dumps(p, JSON_COMPACT | JSON_REAL_PRECISION(17));
    if (!d_out->name || (json_is_object(p) && !d_out->parameters)) return OOM("tools");
    return 0;
}

static int parse_tool_choice(serve_req *r, const json_t *v, serve_error *e)
{
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (!strcmp(s, "auto")) r->tool_choice = SERVE_TOOL_AUTO;
        else if (!strcmp(s, "none")) r->tool_choice = SERVE_TOOL_NONE;
        else if (!strcmp(s, "required")) r->tool_choice = SERVE_TOOL_REQUIRED;
        else return BAD("tool_choice", "tool_choice is '%.40s', expected \"none\", \"auto\", \"required\" or "
                        "{\"type\": \"function\", \"function\": {\"name\": ...}}", s);
        return 0;
    }
    const json_t *ty = json_object_get(v, "type"), *f = json_object_get(v, "function"), *nm = json_object_get(f, "name");
    if (!json_is_object(v) || json_object_size(v) != 2 || !json_is_string(ty) || strcmp(json_string_value(ty), "function") ||
        !json_is_object(f) || json_object_size(f) != 1 || !json_is_string(nm))
        return BAD("tool_choice", "tool_choice is %s, expected \"none\", \"auto\", \"required\" or "
                   "{\"type\": \"function\", \"function\": {\"name\": ...}}", json_is_object(v) ? "an object of another shape" : serve_json_type(v));
    for (size_t k = 0; k < r->n_tools; k++)
        if (!strcmp(r->tools[k].name, json_string_value(nm))) {
            r->tool_choice = SERVE_TOOL_NAMED, r->tool_named = k;
            return 0;
        }
    return BAD("tool_choice", "tool_choice names function '%.64s', which is not in tools", json_string_value(nm));
}

/* A tool message answers a call of the nearest assistant turn with tool_calls,
 * with only tool messages between (OpenAI's rule). */
static int check_tool_messages(const serve_req *r, serve_error *e)
{
    const serve_msg *calls = NULL;
    for (size_t i = 0; i < r->n_msgs; i++) {
        const serve_msg *m = &r->msgs[i];
        if (m->role != KIPP_ROLE_TOOL) {
            calls = m->n_calls ? m : NULL;
            continue;
        }
        if (!calls)
            return BAD("messages", "messages[%zu] has role tool but does not follow an assistant message with "
                       "tool_calls; expected it right after such a message (or its other tool messages)", i);
        size_t k = 0;
        while (k < calls->n_calls && strcmp(calls->call_ids[k], m->tool_call_id)) k++;
        if (k == calls->n_calls)
            return BAD("messages", "messages[%zu].tool_call_id '%.64s' matches no id in the tool_calls before it", i,
                       m->tool_call_id);
    }
    return 0;
}

int serve_parse_tools(serve_req *r, const json_t *root, serve_error *e)
{
    const json_t *tools = json_object_get(root, "tools"), *tc = json_object_get(root, "tool_choice"),
                 *par = json_object_get(root, "parallel_tool_calls");
    r->parallel_tool_calls = 1;
    if (tools && !json_is_null(tools)) {
        size_t n = json_is_array(tools) ? json_array_size(tools) : 0;
        if (n == 0 || n > SERVE_MAX_TOOLS)
            return BAD("tools", "tools is %s%s, expected an array of 1..%d function tools (omit it for none)", serve_json_type(tools),
                       json_is_array(tools) ? (n ? " (too long)" : " (empty)") : "", SERVE_MAX_TOOLS);
        if (!(r->tools = calloc(n, sizeof *r->tools))) return OOM("tools");
        for (size_t i = 0; i < n; i++)
            if (parse_tool(r, json_array_get(tools, i), i, e)) return -1;
        if (!(r->tools_json = json_dumps(tools, JSON_COMPACT | JSON_REAL_PRECISION(17)))) return OOM("tools");
    }
    if (tc && !json_is_null(tc)) {
        if (!r->n_tools) return BAD("tool_choice", "tool_choice is only allowed when tools are given");
        if (parse_tool_choice(r, tc, e)) return -1;
        if ((r->tool_choice == SERVE_TOOL_REQUIRED || r->tool_choice == SERVE_TOOL_NAMED) && r->response_format != SERVE_RF_TEXT)
            return BAD("tool_choice", "tool_choice %s constrains the reply to tool calls, which response_format %s "
                       "would contradict; expected one of them", r->tool_choice == SERVE_TOOL_NAMED ? "naming a function" :
                       "\"required\"", r->response_format == SERVE_RF_JSON_OBJECT ? "json_object" : "json_schema");
    }
    if (par && !json_is_null(par)) {
        if (!json_is_boolean(par)) return BAD("parallel_tool_calls", "parallel_tool_calls is %s, expected a boolean", serve_json_type(par));
        if (!r->n_tools) return BAD("parallel_tool_calls", "parallel_tool_calls is only allowed when tools are given");
        r->parallel_tool_calls = json_is_true(par);
    }
    return check_tool_messages(r, e);
}

/* arguments of messages[i].tool_calls[k]: a JSON string holding JSON text, or
 * an object, which is written as the template's tojson writes it. */
static int call_arguments(const json_t *a, size_t i, size_t k, char **out, serve_error *e)
{
    char err[256];
    if (json_is_string(a)) {
        json_error_t je;
        json_t *v = json_loadb(json_string_value(a), json_string_length(a), JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL, &je);
        if (!v)
            return BAD("messages", "messages[%zu].tool_calls[%zu].function.arguments is not valid JSON text: %s "
                       "(column %d); expected a JSON object as a string", i, k, je.text, je.column);
        json_decref(v);
        return (*out = serve_dupn(json_string_value(a), json_string_length(a))) ? 0 : OOM("messages");
    }
    if (!json_is_object(a))
        return BAD("messages", "messages[%zu].tool_calls[%zu].function.arguments is %s, expected a JSON string or an object",
                   i, k, serve_json_type(a));
    char *text = json_dumps(a, JSON_COMPACT | JSON_REAL_PRECISION(17));
    int rc = text ? kipp_chat_json_dumps(text, strlen(text), out, err, sizeof err) : KIPP_ENOMEM;
    free(text);
    if (rc == KIPP_ENOMEM) return OOM("messages");
    return rc ? BAD("messages", "messages[%zu].tool_calls[%zu].function.arguments: %s", i, k, err) : 0;
}

static int parse_call(serve_msg *d, const json_t *c, size_t i, size_t k, serve_error *e)
{
    static const char *keys[] = {"id", "type", "function", NULL}, *fkeys[] = {"name", "arguments", NULL};
    const json_t *id = json_object_get(c, "id"), *ty = json_object_get(c, "type"), *f = json_object_get(c, "function");
    char where[64], at[128];
    snprintf(where, sizeof where, "messages[%zu].tool_calls", i);
    if (!json_is_object(c) || !json_is_object(f))
        return BAD("messages", "%s[%zu] is not a call, expected {\"id\": ..., \"type\": \"function\", \"function\": "
                   "{\"name\": ..., \"arguments\": ...}}", where, k);
    snprintf(at, sizeof at, "%s[%zu]", where, k);
    if (only_keys(c, keys, at, "messages", "id, type and function", e)) return -1;
    snprintf(at, sizeof at, "%s[%zu].function", where, k);
    if (only_keys(f, fkeys, at, "messages", "name and arguments", e)) return -1;
    if (!json_is_string(id) || json_string_length(id) == 0)
        return BAD("messages", "%s[%zu].id is %s, expected a non-empty string", where, k, serve_json_type(id));
    if (!json_is_string(ty) || strcmp(json_string_value(ty), "function"))
        return BAD("messages", "%s[%zu].type is %s, expected \"function\"", where, k, json_is_string(ty) ? "not \"function\"" : serve_json_type(ty));
    const json_t *nm = json_object_get(f, "name");
    if (!json_is_string(nm) || !name_ok(json_string_value(nm), json_string_length(nm)))
        return BAD("messages", "%s[%zu].function.name is %s, expected 1..64 characters of a-z, A-Z, 0-9, _ and -", where, k,
                   json_is_string(nm) ? "not a valid name" : serve_json_type(nm));
    for (size_t p = 0; p < d->n_calls; p++)
        if (!strcmp(d->call_ids[p], json_string_value(id)))
            return BAD("messages", "%s[%zu].id '%.64s' repeats call %zu; expected unique ids", where, k, json_string_value(id), p);
    char *args = NULL;
    if (call_arguments(json_object_get(f, "arguments"), i, k, &args, e)) return -1;
    kipp_tool_call *t = &d->calls[d->n_calls];
    d->call_ids[d->n_calls++] = serve_dupn(json_string_value(id), json_string_length(id));
    t->name = serve_dupn(json_string_value(nm), json_string_length(nm));
    t->arguments = args;
    return d->call_ids[d->n_calls - 1] && t->name ? 0 : OOM("messages");
}

int serve_parse_msg_tools(serve_msg *d, const json_t *m, size_t i, serve_error *e)
{
    const json_t *tc = json_object_get(m, "tool_calls"), *id = json_object_get(m, "tool_call_id");
    if (tc && !json_is_null(tc)) {
        if (d->role != KIPP_ROLE_ASSISTANT) return BAD("messages", "messages[%zu].tool_calls is not supported on this role, only on assistant messages", i);
        size_t n = json_is_array(tc) ? json_array_size(tc) : 0;
        if (!json_is_array(tc)) return BAD("messages", "messages[%zu].tool_calls is %s, expected an array of calls", i, serve_json_type(tc));
        if (n && (!(d->calls = calloc(n, sizeof *d->calls)) || !(d->call_ids = calloc(n, sizeof *d->call_ids))))
            return OOM("messages");
        for (size_t k = 0; k < n; k++)
            if (parse_call(d, json_array_get(tc, k), i, k, e)) return -1;
    }
    if (d->role == KIPP_ROLE_TOOL) {
        if (!json_is_string(id) || json_string_length(id) == 0)
            return BAD("messages", "messages[%zu].tool_call_id is %s, expected the id of the call this tool message answers",
                       i, json_is_string(id) ? "empty" : serve_json_type(id));
        if (!(d->tool_call_id = serve_dupn(json_string_value(id), json_string_length(id)))) return OOM("messages");
    } else if (id) {
        return BAD("messages", "messages[%zu].tool_call_id is not supported on this role, only on tool messages", i);
    }
    return 0;
}

/* {"type":"object","properties":{"name":{"const":N},"arguments":P},"required":[...],"additionalProperties":false}
 * P is the tool's parameters, read as strict function calling reads them: an object (type "object" where it
 * is left out), and with empty "properties" and no "additionalProperties" a function without arguments, whose
 * only call is {} (JSON Schema alone would allow any keys, and a model given them never stops writing keys).
 * No parameters at all: no arguments either. response_format keeps JSON Schema's own meaning (api_prepare.c). */
static json_t *call_schema(const serve_tool *t)
{
    json_t *p = t->parameters ? json_loads(t->parameters, 0, NULL)
                              : json_pack("{s:s, s:{}, s:b}", "type", "object", "properties", "additionalProperties", 0);
    if (!p) return NULL;
    const json_t *props = json_object_get(p, "properties");
    int set = json_object_set_new(p, "type", json_string("object"));
    if (json_is_object(props) && json_object_size(props) == 0 && !json_object_get(p, "additionalProperties"))
        set |= json_object_set_new(p, "additionalProperties", json_false());
    if (set) {
        json_decref(p);
        return NULL;
    }
    return json_pack("{s:s, s:{s:{s:s}, s:o}, s:[s, s], s:b}", "type", "object", "properties", "name", "const", t->name,
                     "arguments", p, "required", "name", "arguments", "additionalProperties", 0);
}

int serve_tools_grammar(kipp_model *m, serve_req *r, serve_error *e)
{
    if (r->tool_choice != SERVE_TOOL_REQUIRED && r->tool_choice != SERVE_TOOL_NAMED) return 0;
    json_t *s = NULL;
    if (r->tool_choice == SERVE_TOOL_NAMED || r->n_tools == 1) {
        s = call_schema(&r->tools[r->tool_choice == SERVE_TOOL_NAMED ? r->tool_named : 0]);
    } else {
        json_t *any = json_array();
        for (size_t i = 0; any && i < r->n_tools; i++)
            if (json_array_append_new(any, call_schema(&r->tools[i]))) json_decref(any), any = NULL;
        s = any ? json_pack("{s:o}", "anyOf", any) : NULL;
    }
    char *text = s ? json_dumps(s, JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(s);
    if (!text) return OOM("tools");
    kipp_grammar_spec spec = {.schema = text, .prefix = "<tool_call>\n", .suffix = "\n</tool_call>", .separator = "\n",
                              .max_count = r->parallel_tool_calls ? SERVE_MAX_PARALLEL : 1};
    char err[400] = "";
    int rc = kipp_grammar_create(m, &spec, &r->grammar, err, sizeof err);
    free(text);
    if (rc == KIPP_ENOMEM) return OOM("tools");
    if (rc == KIPP_ENOTSUP)
        return serve_fail(e, 501, "invalid_request_error", "tool_choice",
                          "tool_choice \"required\" or a named function needs constrained output, which this server "
                          "cannot do: %s; use \"auto\" or \"none\"", err);
    if (rc) return BAD("tools", "the tools' parameters cannot constrain the reply (tool_choice %s): %s",
                       r->tool_choice == SERVE_TOOL_NAMED ? "names a function" : "\"required\"", err);
    return 0;
}
