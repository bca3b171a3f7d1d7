/*
 * chat.c - native renderer of the Qwen3 chat templates (seed 000, chat
 * completions).
 *
 * A line-by-line transcription of the Jinja templates shipped in
 * tokenizer_config.json of Qwen3 (hybrid), Qwen3-*-Instruct-2507 and
 * Qwen3-*-Thinking-2507, as transformers renders them (trim_blocks,
 * lstrip_blocks; `tojson` = json.dumps(ensure_ascii=False)). Comments quote
 * the template line each step follows. Byte-identity with apply_chat_template
 * is checked on the committed conversations in tests/chat_cases/.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/chat.h"
#include "engine/internal.h"

/* ---- growable output ---- */

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* ---- Python json.dumps(x, ensure_ascii=False) over a jansson tree ---- */

static void py_json_string(sbuf *b, const char *s, size_t n)
{
    sb_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *e = NULL;
        char u[8];
        switch (c) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(u, sizeof u, "\\u%04x", c);
                e = u;
            }
        }
        if (e) sb_str(b, e);
        else sb_put(b, s + i, 1);
    }
    sb_put(b, "\"", 1);
}

/* float.__repr__: the shortest digits that round-trip, fixed notation for
 * decimal exponents -4..15 (with ".0" when integral), else d.ddde+XX. */
static void py_json_real(sbuf *b, double v)
{
    char buf[40], digits[24];
    int p = 1;
    for (; p < 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p - 1, v);
        if (strtod(buf, NULL) == v) break;
    }
    snprintf(buf, sizeof buf, "%.*e", p - 1, v);
    const char *q = buf;
    int neg = *q == '-', nd = 0;
    if (neg) q++;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    int e = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    if (neg) sb_put(b, "-", 1);
    if (e >= -4 && e < 16) {
        if (e < 0) {
            sb_str(b, "0.");
            for (int i = -1; i > e; i--) sb_put(b, "0", 1);
            sb_str(b, digits);
        } else {
            for (int i = 0; i <= e; i++) sb_put(b, i < nd ? &digits[i] : "0", 1);
            sb_put(b, ".", 1);
            if (nd > e + 1) sb_str(b, digits + e + 1);
            else sb_put(b, "0", 1);
        }
    } else {
        sb_put(b, digits, 1);
        if (nd > 1) {
            sb_put(b, ".", 1);
            sb_str(b, digits + 1);
        }
        snprintf(buf, sizeof buf, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
        sb_str(b, buf);
    }
}

static void py_json_dump(sbuf *b, const json_t *j)
{
    char num[32];
    size_t i;
    const char *key;
    json_t *v;
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        int first = 1;
        sb_put(b, "{", 1);
        json_object_foreach((json_t *)j, key, v) {
            if (!first) sb_put(b, ", ", 2);
            first = 0;
            py_json_string(b, key, strlen(key));
            sb_put(b, ": ", 2);
            py_json_dump(b, v);
        }
        sb_put(b, "}", 1);
        break;
    }
    case JSON_ARRAY:
        sb_put(b, "[", 1);
        json_array_foreach((json_t *)j, i, v) {
            if (i) sb_put(b, ", ", 2);
            py_json_dump(b, v);
        }
        sb_put(b, "]", 1);
        break;
    case JSON_STRING: py_json_string(b, json_string_value(j), json_string_length(j)); break;
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(j));
        sb_str(b, num);
        break;
    case JSON_REAL: py_json_real(b, json_real_value(j)); break;
    case JSON_TRUE: sb_str(b, "true"); break;
    case JSON_FALSE: sb_str(b, "false"); break;
    case JSON_NULL: sb_str(b, "null"); break;
    }
}

/* ---- Python str helpers on (ptr, len) views ---- */

typedef struct {
    const char *p;
    size_t n;
} view;

static view v_of(const char *s) { return (view){s ? s : "", s ? strlen(s) : 0}; }
/* A message's text by (pointer, length): content_len / reasoning_len when set, so NUL is text. */
static view v_content(const kipp_chat_message *m)
{
    return m->content ? (view){m->content, m->content_len ? m->content_len : strlen(m->content)} : v_of(NULL);
}
static view v_reasoning(const kipp_chat_message *m)
{
    return m->reasoning_content
               ? (view){m->reasoning_content, m->reasoning_len ? m->reasoning_len : strlen(m->reasoning_content)}
               : v_of(NULL);
}

static const char *v_find(view h, const char *needle, int last)
{
    size_t k = strlen(needle);
    const char *hit = NULL;
    for (size_t i = 0; i + k <= h.n; i++)
        if (!memcmp(h.p + i, needle, k)) {
            hit = h.p + i;
            if (!last) break;
        }
    return hit;
}

static view v_lstrip_nl(view v)
{
    while (v.n && v.p[0] == '\n') v.p++, v.n--;
    return v;
}

static view v_rstrip_nl(view v)
{
    while (v.n && v.p[v.n - 1] == '\n') v.n--;
    return v;
}

static int v_starts(view v, const char *s) { return v.n >= strlen(s) && !memcmp(v.p, s, strlen(s)); }

static int v_ends(view v, const char *s)
{
    size_t k = strlen(s);
    return v.n >= k && !memcmp(v.p + v.n - k, s, k);
}

static void sb_view(sbuf *b, view v) { sb_put(b, v.p, v.n); }

/* ---- the template ---- */

static const char TOOLS_HEAD[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
static const char TOOLS_TAIL[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";

/* {%- if tools %} ... {%- else %} system ... {%- endif %} */
static int render_system(sbuf *b, const kipp_chat_message *m, size_t n, const json_t *tools)
{
    int sys0 = n > 0 && m[0].role == KIPP_ROLE_SYSTEM;
    if (tools && json_array_size(tools) > 0) {
        sb_str(b, "<|im_start|>system\n");
        if (sys0) {
            sb_view(b, v_content(&m[0]));
            sb_str(b, "\n\n");
        }
        sb_str(b, TOOLS_HEAD);
        size_t i;
        json_t *t;
        json_array_foreach((json_t *)tools, i, t) {
            sb_str(b, "\n");
            py_json_dump(b, t); /* {{- tool | tojson }} */
        }
        sb_str(b, TOOLS_TAIL);
    } else if (sys0) {
        sb_str(b, "<|im_start|>system\n");
        sb_view(b, v_content(&m[0]));
        sb_str(b, "<|im_end|>\n");
    }
    return KIPP_OK;
}

/* ns.last_query_index: the last user turn that is not a wrapped tool response. */
static size_t last_query_index(const kipp_chat_message *m, size_t n)
{
    for (size_t i = n; i-- > 0;) {
        if (m[i].role != KIPP_ROLE_USER || !m[i].content) continue;
        view c = v_content(&m[i]);
        if (!(v_starts(c, "<tool_response>") && v_ends(c, "</tool_response>"))) return i;
    }
    return n - 1;
}

/* {%- if message.tool_calls %} ... {%- endfor %} */
static void render_tool_calls(sbuf *b, const kipp_chat_message *m, view content)
{
    for (size_t j = 0; j < m->n_tool_calls; j++) {
        if (j > 0 || content.n) sb_str(b, "\n");
        sb_str(b, "<tool_call>\n{\"name\": \"");
        sb_str(b, m->tool_calls[j].name);
        sb_str(b, "\", \"arguments\": ");
        /* arguments is a string here, so the template writes it as-is */
        sb_str(b, m->tool_calls[j].arguments ? m->tool_calls[j].arguments : "null");
        sb_str(b, "}\n</tool_call>");
    }
}

static void render_assistant(sbuf *b, kipp_chat_kind kind, const kipp_chat_message *m, size_t i, size_t n,
                             size_t lqi)
{
    view content = v_content(&m[i]), reasoning = v_of(NULL);
    int think = kind != KIPP_CHAT_INSTRUCT_2507;
    if (think && m[i].reasoning_content) {
        reasoning = v_reasoning(&m[i]);
    } else if (think && v_find(content, "</think>", 0)) {
        /* content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
        view head = {content.p, (size_t)(v_find(content, "</think>", 0) - content.p)};
        head = v_rstrip_nl(head);
        const char *open = v_find(head, "<think>", 1);
        if (open) head = (view){open + 7, head.n - (size_t)(open + 7 - head.p)};
        reasoning = v_lstrip_nl(head);
        /* content.split('</think>')[-1].lstrip('\n') */
        const char *close = v_find(content, "</think>", 1) + 8;
        content = v_lstrip_nl((view){close, content.n - (size_t)(close - content.p)});
    }
    sb_str(b, "<|im_start|>assistant\n");
    if (think && i > lqi && (i == n - 1 || reasoning.n)) {
        sb_str(b, "<think>\n");
        sb_view(b, v_lstrip_nl(v_rstrip_nl(reasoning)));
        sb_str(b, "\n</think>\n\n");
        sb_view(b, v_lstrip_nl(content));
    } else {
        sb_view(b, content);
    }
    render_tool_calls(b, &m[i], content);
    sb_str(b, "<|im_end|>\n");
}

static void render_tool(sbuf *b, const kipp_chat_message *m, size_t i, size_t n)
{
    if (i == 0 || m[i - 1].role != KIPP_ROLE_TOOL) sb_str(b, "<|im_start|>user");
    sb_str(b, "\n<tool_response>\n");
    sb_view(b, v_content(&m[i]));
    sb_str(b, "\n</tool_response>");
    if (i == n - 1 || m[i + 1].role != KIPP_ROLE_TOOL) sb_str(b, "<|im_end|>\n");
}

static void render_messages(sbuf *b, kipp_chat_kind kind, const kipp_chat_message *m, size_t n)
{
    size_t lqi = last_query_index(m, n);
    for (size_t i = 0; i < n; i++) {
        if (m[i].role == KIPP_ROLE_USER || (m[i].role == KIPP_ROLE_SYSTEM && i > 0)) {
            sb_str(b, "<|im_start|>");
            sb_str(b, m[i].role == KIPP_ROLE_USER ? "user" : "system");
            sb_str(b, "\n");
            sb_view(b, v_content(&m[i]));
            sb_str(b, "<|im_end|>\n");
        } else if (m[i].role == KIPP_ROLE_ASSISTANT) {
            render_assistant(b, kind, m, i, n, lqi);
        } else if (m[i].role == KIPP_ROLE_TOOL) {
            render_tool(b, m, i, n);
        }
    }
}

static int check_messages(const kipp_chat_message *m, size_t n, char *err, size_t errlen)
{
    if (!m || n == 0) return kipp_err(err, errlen, KIPP_EINVAL, "chat has no messages; expected at least one");
    for (size_t i = 0; i < n; i++) {
        if ((unsigned)m[i].role > KIPP_ROLE_TOOL)
            return kipp_err(err, errlen, KIPP_EINVAL, "message %zu has role %d; expected system, user, assistant or tool",
                            i, (int)m[i].role);
        if (m[i].n_tool_calls && !m[i].tool_calls)
            return kipp_err(err, errlen, KIPP_EINVAL, "message %zu has %zu tool calls but tool_calls is NULL", i,
                            m[i].n_tool_calls);
        for (size_t j = 0; j < m[i].n_tool_calls; j++)
            if (!m[i].tool_calls[j].name)
                return kipp_err(err, errlen, KIPP_EINVAL, "message %zu tool call %zu has no name", i, j);
        if (m[i].content && m[i].n_content_parts)
            return kipp_err(err, errlen, KIPP_EINVAL,
                            "message %zu has both content and %zu content parts; expected one of the two", i,
                            m[i].n_content_parts);
        if (m[i].n_content_parts && !m[i].content_parts)
            return kipp_err(err, errlen, KIPP_EINVAL, "message %zu has %zu content parts but content_parts is NULL",
                            i, m[i].n_content_parts);
        for (size_t j = 0; j < m[i].n_content_parts; j++)
            if (!m[i].content_parts[j])
                return kipp_err(err, errlen, KIPP_EINVAL, "message %zu content part %zu is NULL; expected a text",
                                i, j);
    }
    /* the template concatenates messages[0].content directly: None is an error there */
    if (m[0].role == KIPP_ROLE_SYSTEM && !m[0].content && !m[0].n_content_parts)
        return kipp_err(err, errlen, KIPP_EINVAL, "message 0 (system) has NULL content; expected a string");
    return KIPP_OK;
}

static int parse_tools(const char *tools_json, json_t **tools, char *err, size_t errlen)
{
    *tools = NULL;
    if (!tools_json) return KIPP_OK;
    json_error_t je;
    *tools = json_loads(tools_json, JSON_DECODE_ANY, &je);
    if (!*tools)
        return kipp_err(err, errlen, KIPP_EINVAL, "tools_json is not valid JSON at line %d column %d: %s", je.line,
                        je.column, je.text);
    if (!json_is_array(*tools)) {
        json_decref(*tools);
        *tools = NULL;
        return kipp_err(err, errlen, KIPP_EINVAL, "tools_json is a JSON %s; expected an array of tool definitions",
                        json_is_object(*tools) ? "object" : "scalar");
    }
    return KIPP_OK;
}

/* A copy of m[n] whose content_parts are joined with "\n" into content
 * (malloc'd, listed in *owned[n]); NULL on OOM. */
static kipp_chat_message *join_parts(const kipp_chat_message *m, size_t n, char ***owned)
{
    kipp_chat_message *c = malloc(n * sizeof *c);
    *owned = calloc(n, sizeof **owned);
    if (!c || !*owned) {
        free(c);
        free(*owned);
        *owned = NULL;
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        c[i] = m[i];
        if (!m[i].n_content_parts) continue;
        sbuf b = {0};
        for (size_t j = 0; j < m[i].n_content_parts; j++) {
            if (j) sb_put(&b, "\n", 1);
            sb_str(&b, m[i].content_parts[j]);
        }
        if (b.oom) {
            free(b.p);
            for (size_t k = 0; k < i; k++) free((*owned)[k]);
            free(*owned);
            free(c);
            *owned = NULL;
            return NULL;
        }
        (*owned)[i] = b.p;
        c[i].content = b.p;
        c[i].content_len = b.n; /* the joined bytes, NULs included */
        c[i].content_parts = NULL;
        c[i].n_content_parts = 0;
    }
    return c;
}

int kipp_chat_json_dumps(const char *json, size_t len, char **out, char *err, size_t errlen)
{
    if (!out) return kipp_err(err, errlen, KIPP_EINVAL, "out is NULL");
    *out = NULL;
    if (!json) return kipp_err(err, errlen, KIPP_EINVAL, "json is NULL; expected JSON text");
    json_error_t je;
    json_t *j = json_loadb(json, len, JSON_DECODE_ANY, &je);
    if (!j)
        return kipp_err(err, errlen, KIPP_EINVAL, "JSON text is not valid at line %d column %d: %s", je.line,
                        je.column, je.text);
    sbuf b = {0};
    sb_put(&b, "", 0);
    py_json_dump(&b, j);
    json_decref(j);
    if (b.oom) {
        free(b.p);
        return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory writing %zu bytes of JSON", len);
    }
    *out = b.p;
    return KIPP_OK;
}

int kipp_chat_render_kind(kipp_chat_kind kind, const kipp_chat_message *msgs, size_t n,
                          const kipp_chat_options *opts, char **out, char *err, size_t errlen)
{
    return kipp_chat_render_kind_n(kind, msgs, n, opts, out, NULL, err, errlen);
}

int kipp_chat_render_kind_n(kipp_chat_kind kind, const kipp_chat_message *msgs, size_t n,
                            const kipp_chat_options *opts, char **out, size_t *out_len, char *err, size_t errlen)
{
    if (!out) return kipp_err(err, errlen, KIPP_EINVAL, "out is NULL");
    *out = NULL;
    if (out_len) *out_len = 0;
    if (kind == KIPP_CHAT_NONE)
        return kipp_err(err, errlen, KIPP_ENOTSUP,
                        "this is a base checkpoint without a chat template; use plain completion instead of chat");
    if (kind != KIPP_CHAT_HYBRID && kind != KIPP_CHAT_INSTRUCT_2507 && kind != KIPP_CHAT_THINKING_2507)
        return kipp_err(err, errlen, KIPP_EINVAL, "chat kind %d is unknown; expected hybrid, instruct-2507 or thinking-2507",
                        (int)kind);
    kipp_chat_options def = {0, 1, NULL};
    if (!opts) opts = &def;
    json_t *tools;
    int rc = check_messages(msgs, n, err, errlen);
    if (!rc) rc = parse_tools(opts->tools_json, &tools, err, errlen);
    if (rc) return rc;
    int has_parts = 0;
    for (size_t i = 0; i < n; i++) has_parts |= msgs[i].n_content_parts != 0;
    char **owned = NULL;
    if (has_parts && !(msgs = join_parts(msgs, n, &owned))) {
        json_decref(tools);
        return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory joining content parts of %zu messages", n);
    }
    sbuf b = {0};
    sb_put(&b, "", 0);
    render_system(&b, msgs, n, tools);
    render_messages(&b, kind, msgs, n);
    if (opts->add_generation_prompt) {
        sb_str(&b, "<|im_start|>assistant\n");
        if (kind == KIPP_CHAT_THINKING_2507) sb_str(&b, "<think>\n");
        if (kind == KIPP_CHAT_HYBRID && !opts->enable_thinking) sb_str(&b, "<think>\n\n</think>\n\n");
    }
    json_decref(tools);
    if (owned) {
        for (size_t i = 0; i < n; i++) free(owned[i]);
        free(owned);
        free((void *)msgs);
    }
    if (b.oom) {
        free(b.p);
        return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory rendering %zu messages", n);
    }
    *out = b.p;
    if (out_len) *out_len = b.n;
    return KIPP_OK;
}

int kipp_chat_render(const kipp_model *model, const kipp_chat_message *msgs, size_t n,
                     const kipp_chat_options *opts, char **out, char *err, size_t errlen)
{
    return kipp_chat_render_n(model, msgs, n, opts, out, NULL, err, errlen);
}

int kipp_chat_render_n(const kipp_model *model, const kipp_chat_message *msgs, size_t n,
                       const kipp_chat_options *opts, char **out, size_t *out_len, char *err, size_t errlen)
{
    if (!model || !model->ckpt) {
        if (out) *out = NULL;
        return kipp_err(err, errlen, KIPP_EINVAL, "model is NULL; expected an open model");
    }
    if (model->ckpt->chat == KIPP_CHAT_NONE) {
        if (out) *out = NULL;
        return kipp_err(err, errlen, KIPP_ENOTSUP,
                        "checkpoint '%s' is a base model without a chat template; chat is not supported, "
                        "use plain completion", model->ckpt->id);
    }
    return kipp_chat_render_kind_n(model->ckpt->chat, msgs, n, opts, out, out_len, err, errlen);
}
