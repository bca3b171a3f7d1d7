/*
 * cmd_render.c - `kipp render`: show the prompt a chat request
 * renders to, and its token ids with the control tokens marked, so a template
 * can be checked without writing C.
 *
 *   kipp render --model FILE --messages FILE.json [--tools FILE.json]
 *               [--no-generation-prompt] [--thinking on|off] [--json]
 *
 * The messages file is read as the server reads a request: either a JSON
 * array of messages, or an object with "messages" and optionally "tools",
 * "add_generation_prompt", "enable_thinking" and "chat_template_kwargs"
 * ({"enable_thinking": bool}). A message has "role" (system, user, assistant,
 * tool), "content" (a string, null, or a list of {"type": "text", "text": ...}
 * parts), "reasoning_content", and "tool_calls" whose "arguments" (at the top
 * or under "function") is an object or a JSON string. Command-line options
 * override the file. Defaults: generation prompt on, thinking on.
 *
 * The model is opened with the loader alone (no backend, weights untouched).
 * Exit status: 0 ok, 1 model, file or render failure, 2 bad arguments.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "engine/kipp.h"

typedef struct {
    const char *model, *messages, *tools;
    int gen_prompt;   /* -1 = from the file, else 0/1 */
    int thinking;     /* -1 = from the file, else 0/1 */
    int json;
} render_args;

static void print_usage(FILE *f)
{
    fprintf(f, "usage: kipp render --model FILE --messages FILE.json [--tools FILE.json]\n"
               "                   [--no-generation-prompt] [--thinking on|off] [--json]\n"
               "  --model FILE            converted .gguf model (its chat template and tokenizer)\n"
               "  --messages FILE.json    a JSON array of messages, or a request object with \"messages\"\n"
               "                          (and \"tools\", \"add_generation_prompt\", \"enable_thinking\",\n"
               "                          \"chat_template_kwargs\"); - reads stdin\n"
               "  --tools FILE.json       a JSON array of tool definitions (overrides the file's)\n"
               "  --no-generation-prompt  do not end with the assistant header (default: add it)\n"
               "  --thinking on|off       hybrid checkpoints: off appends the empty think block\n"
               "  --json                  print {\"text\", \"ids\", \"control\"} as JSON\n"
               "  --help, -h              print this help\n"
               "prints the rendered text, then one line per token: position, id, * for a control\n"
               "token, and the token's bytes as a quoted string\n");
}

static int usage_error(const char *msg, const char *val)
{
    fprintf(stderr, "kipp render: %s%s%s\n", msg, val ? " " : "", val ? val : "");
    print_usage(stderr);
    return 2;
}

static int parse_args(int argc, char **argv, render_args *a)
{
    *a = (render_args){.gen_prompt = -1, .thinking = -1};
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            print_usage(stdout);
            return -1;
        }
        if (!strcmp(o, "--no-generation-prompt")) { a->gen_prompt = 0; continue; }
        if (!strcmp(o, "--json")) { a->json = 1; continue; }
        const char **slot = !strcmp(o, "--model") ? &a->model : !strcmp(o, "--messages") ? &a->messages
                          : !strcmp(o, "--tools") ? &a->tools : NULL;
        if (!slot && strcmp(o, "--thinking")) return usage_error("unknown argument", o);
        if (i + 1 >= argc) return usage_error("missing value after", o);
        const char *v = argv[++i];
        if (slot) {
            *slot = v;
        } else if (!strcmp(v, "on") || !strcmp(v, "off")) {
            a->thinking = !strcmp(v, "on");
        } else {
            fprintf(stderr, "kipp render: --thinking '%s' is not valid; expected on or off\n", v);
            return 2;
        }
    }
    if (!a->model) return usage_error("--model FILE is required", NULL);
    if (!a->messages) return usage_error("--messages FILE.json is required", NULL);
    return 0;
}

static json_t *load_json(const char *path, const char *what)
{
    json_error_t je;
    json_t *j = !strcmp(path, "-") ? json_loadf(stdin, JSON_DECODE_ANY, &je) : json_load_file(path, JSON_DECODE_ANY, &je);
    if (!j && json_error_code(&je) == json_error_null_character) /* jansson's text names a flag the user cannot set */
        fprintf(stderr, "kipp render: %s %s holds \\u0000 (a NUL character) in a string at line %d, column %d; "
                        "kipp render accepts strings without NUL, as kipp-serve does\n", what, path, je.line, je.column);
    else if (!j)
        fprintf(stderr, "kipp render: %s %s is not valid JSON: line %d column %d: %s\n", what, path, je.line, je.column,
                je.text);
    return j;
}

/* Strings made here (tool-call arguments from objects), freed at the end. */
typedef struct {
    char **p;
    size_t n, cap;
} owned_strs;

static char *own(owned_strs *o, char *s)
{
    if (!s) return NULL;
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 16;
        char **p = realloc(o->p, cap * sizeof *p);
        if (!p) {
            free(s);
            return NULL;
        }
        o->p = p;
        o->cap = cap;
    }
    return o->p[o->n++] = s;
}

static const char *type_name(const json_t *j)
{
    switch (json_typeof(j)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: case JSON_REAL: return "a number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* A string field that may be absent or null; 0 ok, -1 after naming the problem. */
static int opt_string(const json_t *m, const char *key, size_t i, const char **out)
{
    const json_t *v = json_object_get(m, key);
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) {
        fprintf(stderr, "kipp render: message %zu \"%s\" is %s; expected a string or null\n", i, key, type_name(v));
        return -1;
    }
    *out = json_string_value(v);
    return 0;
}

static int parse_content(const json_t *m, size_t i, kipp_chat_message *msg, const char ***parts_out)
{
    const json_t *c = json_object_get(m, "content");
    if (!c || json_is_null(c)) return 0;
    if (json_is_string(c)) {
        msg->content = json_string_value(c);
        return 0;
    }
    if (!json_is_array(c)) {
        fprintf(stderr, "kipp render: message %zu \"content\" is %s; expected a string, a list of text parts or null\n",
                i, type_name(c));
        return -1;
    }
    size_t n = json_array_size(c);
    const char **parts = calloc(n ? n : 1, sizeof *parts);
    if (!parts) return -1;
    *parts_out = parts;
    for (size_t j = 0; j < n; j++) {
        const json_t *p = json_array_get(c, j);
        const json_t *type = json_object_get(p, "type"), *text = json_object_get(p, "text");
        if (!json_is_object(p) || !json_is_string(type) || strcmp(json_string_value(type), "text") ||
            !json_is_string(text)) {
            fprintf(stderr, "kipp render: message %zu content part %zu is %s%s%s; expected {\"type\": \"text\", "
                            "\"text\": \"...\"} (only text parts are supported)\n", i, j,
                    json_is_string(type) ? "of type '" : type_name(p), json_is_string(type) ? json_string_value(type) : "",
                    json_is_string(type) ? "'" : "");
            return -1;
        }
        parts[j] = json_string_value(text);
    }
    msg->content_parts = parts;
    msg->n_content_parts = n;
    return 0;
}

static int parse_tool_calls(const json_t *m, size_t i, kipp_chat_message *msg, kipp_tool_call **calls_out,
                            owned_strs *owned)
{
    const json_t *tc = json_object_get(m, "tool_calls");
    if (!tc || json_is_null(tc)) return 0;
    if (!json_is_array(tc)) {
        fprintf(stderr, "kipp render: message %zu \"tool_calls\" is %s; expected an array\n", i, type_name(tc));
        return -1;
    }
    size_t n = json_array_size(tc);
    kipp_tool_call *calls = calloc(n ? n : 1, sizeof *calls);
    if (!calls) return -1;
    *calls_out = calls;
    for (size_t j = 0; j < n; j++) {
        const json_t *c = json_array_get(tc, j);
        const json_t *f = json_is_object(json_object_get(c, "function")) ? json_object_get(c, "function") : c;
        const json_t *name = json_object_get(f, "name"), *args = json_object_get(f, "arguments");
        if (!json_is_object(c) || !json_is_string(name)) {
            fprintf(stderr, "kipp render: message %zu tool call %zu has no string \"name\"; expected "
                            "{\"function\": {\"name\": ..., \"arguments\": ...}}\n", i, j);
            return -1;
        }
        calls[j].name = json_string_value(name);
        if (!args) {
            fprintf(stderr, "kipp render: message %zu tool call %zu has no \"arguments\"; expected an object or "
                            "a JSON string\n", i, j);
            return -1;
        }
        if (json_is_string(args)) { /* the template inserts a string verbatim */
            calls[j].arguments = json_string_value(args);
            continue;
        }
        /* an object goes through the template's tojson: Python json.dumps */
        char *text = json_dumps(args, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(17)), *py = NULL, err[256];
        int rc = text ? kipp_chat_json_dumps(text, strlen(text), &py, err, sizeof err) : KIPP_ENOMEM;
        free(text);
        if (rc || !own(owned, py)) {
            fprintf(stderr, "kipp render: message %zu tool call %zu arguments: %s\n", i, j,
                    rc ? err : "out of memory");
            return -1;
        }
        calls[j].arguments = py;
    }
    msg->tool_calls = calls;
    msg->n_tool_calls = n;
    return 0;
}

/* Fill msgs[n] from the JSON array; strings are borrowed from it. */
static int parse_messages(const json_t *arr, kipp_chat_message *msgs, const char ***parts, kipp_tool_call **calls,
                          owned_strs *owned)
{
    static const char *roles[] = {"system", "user", "assistant", "tool"};
    size_t i;
    const json_t *m;
    json_array_foreach(arr, i, m) {
        if (!json_is_object(m)) {
            fprintf(stderr, "kipp render: message %zu is %s; expected an object with \"role\"\n", i, type_name(m));
            return -1;
        }
        const json_t *role = json_object_get(m, "role");
        int r = -1;
        for (int k = 0; k < 4 && json_is_string(role); k++)
            if (!strcmp(json_string_value(role), roles[k])) r = k;
        if (r < 0) {
            fprintf(stderr, "kipp render: message %zu \"role\" is %s%s%s; expected system, user, assistant or tool\n",
                    i, json_is_string(role) ? "'" : role ? type_name(role) : "missing",
                    json_is_string(role) ? json_string_value(role) : "", json_is_string(role) ? "'" : "");
            return -1;
        }
        msgs[i].role = (kipp_role)r;
        if (parse_content(m, i, &msgs[i], &parts[i]) || opt_string(m, "reasoning_content", i, &msgs[i].reasoning_content) ||
            parse_tool_calls(m, i, &msgs[i], &calls[i], owned))
            return -1;
    }
    return 0;
}

/* An optional boolean of the request object; 0 ok, -1 after naming the problem. */
static int opt_bool(const json_t *o, const char *key, int *out)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) {
        fprintf(stderr, "kipp render: \"%s\" is %s; expected true or false\n", key, type_name(v));
        return -1;
    }
    *out = json_is_true(v);
    return 0;
}

/* One token's bytes as a double-quoted string: JSON escapes, \xNN for bytes
 * that are not printable ASCII or part of a complete UTF-8 character. */
static void print_piece(const char *p, size_t n)
{
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
        int ok = len > 1 && i + len <= n;
        for (size_t k = 1; ok && k < len; k++) ok = ((unsigned char)p[i + k] & 0xC0) == 0x80;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c == '\r') fputs("\\r", stdout);
        else if (c >= 0x20 && c < 0x7F) putchar(c);
        else if (ok) {
            fwrite(p + i, 1, len, stdout);
            i += len - 1;
        } else printf("\\x%02X", c);
    }
    putchar('"');
}

static int print_result(kipp_model *m, const char *ckpt, const char *text, const uint32_t *ids, size_t n, int json)
{
    if (json) {
        json_t *o = json_object(), *a = json_array(), *c = json_array();
        for (size_t i = 0; i < n; i++) {
            json_array_append_new(a, json_integer(ids[i]));
            json_array_append_new(c, json_boolean(kipp_token_is_added(m, ids[i])));
        }
        json_object_set_new(o, "checkpoint", json_string(ckpt));
        json_object_set_new(o, "text", json_string(text));
        json_object_set_new(o, "ids", a);
        json_object_set_new(o, "control", c);
        char *s = json_dumps(o, JSON_ENSURE_ASCII);
        json_decref(o);
        if (!s) return 1;
        puts(s);
        free(s);
        return 0;
    }
    size_t tlen = strlen(text), ctl = 0;
    for (size_t i = 0; i < n; i++) ctl += kipp_token_is_added(m, ids[i]) != 0;
    printf("=== rendered prompt (%s, %zu bytes) ===\n%s", ckpt, tlen, text);
    if (tlen && text[tlen - 1] != '\n') putchar('\n');
    printf("=== %zu tokens, %zu control (marked *) ===\n", n, ctl);
    char piece[256], err[256];
    for (size_t i = 0; i < n; i++) {
        size_t pn = 0;
        int rc = kipp_detokenize(m, &ids[i], 1, piece, sizeof piece, &pn, err, sizeof err);
        printf("%6zu %6u %c ", i, ids[i], kipp_token_is_added(m, ids[i]) ? '*' : ' ');
        if (rc) printf("(%s)", err);
        else print_piece(piece, pn);
        putchar('\n');
    }
    fputs("ids: [", stdout);
    for (size_t i = 0; i < n; i++) printf(i ? ", %u" : "%u", ids[i]);
    puts("]");
    return 0;
}

int cmd_render(int argc, char **argv)
{
    render_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    json_t *root = load_json(a.messages, "--messages"), *tools_file = NULL;
    if (!root) return 1;
    if (a.tools && !(tools_file = load_json(a.tools, "--tools"))) {
        json_decref(root);
        return 1;
    }
    const json_t *arr = json_is_array(root) ? root : json_object_get(root, "messages"), *tools = tools_file;
    int gen = 1, think = 1;
    kipp_chat_message *msgs = NULL;
    const char ***parts = NULL;
    kipp_tool_call **calls = NULL;
    owned_strs owned = {0};
    char *tools_json = NULL, *text = NULL, err[512];
    uint32_t *ids = NULL;
    kipp_model *m = NULL;
    size_t n = json_array_size(arr), n_ids = 0;
    rc = 1;
    if (!json_is_array(arr)) {
        fprintf(stderr, "kipp render: --messages %s is %s without \"messages\"; expected an array of messages or "
                        "an object with a \"messages\" array\n", a.messages, type_name(root));
        goto out;
    }
    if (json_is_object(root)) {
        const json_t *kw = json_object_get(root, "chat_template_kwargs");
        if (!tools) tools = json_object_get(root, "tools");
        if (opt_bool(root, "add_generation_prompt", &gen) || opt_bool(root, "enable_thinking", &think) ||
            (json_is_object(kw) && opt_bool(kw, "enable_thinking", &think)))
            goto out;
    }
    if (a.gen_prompt >= 0) gen = a.gen_prompt;
    if (a.thinking >= 0) think = a.thinking;
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) {
            fprintf(stderr, "kipp render: tools is %s; expected an array of tool definitions\n", type_name(tools));
            goto out;
        }
        if (json_array_size(tools) && !(tools_json = json_dumps(tools, JSON_COMPACT | JSON_REAL_PRECISION(17))))
            goto out;
    }
    msgs = calloc(n ? n : 1, sizeof *msgs);
    parts = calloc(n ? n : 1, sizeof *parts);
    calls = calloc(n ? n : 1, sizeof *calls);
    if (!msgs || !parts || !calls || parse_messages(arr, msgs, parts, calls, &owned)) goto out;
    if (kipp_model_open(a.model, "none", NULL, &m, err, sizeof err)) {
        cli_model_error("render", a.model, err);
        goto out;
    }
    kipp_model_info info;
    kipp_model_get_info(m, &info);
    kipp_chat_options o = {.add_generation_prompt = gen, .enable_thinking = think, .tools_json = tools_json};
    /* the ids a chat request gets (kipp-serve, kipp chat): message text stays
     * text, so a typed "<|im_start|>" is not a control token */
    if (kipp_chat_tokenize(m, msgs, n, &o, &ids, &n_ids, &text, NULL, err, sizeof err)) {
        fprintf(stderr, "kipp render: %s\n", err);
        goto out;
    }
    rc = print_result(m, info.checkpoint_id, text, ids, n_ids, a.json);
out:
    for (size_t i = 0; parts && calls && i < n; i++) {
        free((void *)parts[i]);
        free(calls[i]);
    }
    for (size_t i = 0; i < owned.n; i++) free(owned.p[i]);
    free(owned.p);
    free(parts);
    free(calls);
    free(msgs);
    free(tools_json);
    free(text);
    free(ids);
    kipp_model_close(m);
    json_decref(root);
    json_decref(tools_file);
    return rc;
}
