/*
 * test_chat.c - the native Qwen3 ChatML renderer against Hugging Face.
 *
 * Oracle: tests/chat_cases/cases.jsonl, rendered by transformers'
 * apply_chat_template from the shipped Jinja templates
 * (tools/gen_chat_cases.py). Every conversation must be byte-identical.
 * Also: base checkpoints refuse chat (through a converted base GGUF), the
 * model path equals the model-free path, and bad input is named.
 */
#include <jansson.h>
#include <string.h>

#include "engine/chat.h"
#include "tests/test_harness.h"
#include "engine/internal.h"

static kipp_chat_kind kind_of(const char *s)
{
    if (!strcmp(s, "hybrid")) return KIPP_CHAT_HYBRID;
    if (!strcmp(s, "instruct-2507")) return KIPP_CHAT_INSTRUCT_2507;
    if (!strcmp(s, "thinking-2507")) return KIPP_CHAT_THINKING_2507;
    return KIPP_CHAT_NONE;
}

static kipp_role role_of(const char *s)
{
    if (!strcmp(s, "system")) return KIPP_ROLE_SYSTEM;
    if (!strcmp(s, "user")) return KIPP_ROLE_USER;
    if (!strcmp(s, "assistant")) return KIPP_ROLE_ASSISTANT;
    return KIPP_ROLE_TOOL;
}

/* Build kipp_chat_message[] from the JSON case; strings borrowed from c. */
static kipp_chat_message *messages_of(json_t *c, size_t *n, kipp_tool_call **calls)
{
    json_t *msgs = json_object_get(c, "messages"), *m;
    size_t i, total = 0;
    json_array_foreach(msgs, i, m) total += json_array_size(json_object_get(m, "tool_calls"));
    *n = json_array_size(msgs);
    kipp_chat_message *out = calloc(*n, sizeof *out);
    *calls = calloc(total + 1, sizeof **calls);
    size_t k = 0;
    json_array_foreach(msgs, i, m) {
        out[i].role = role_of(json_string_value(json_object_get(m, "role")));
        out[i].content = json_string_value(json_object_get(m, "content")); /* NULL for null */
        out[i].reasoning_content = json_string_value(json_object_get(m, "reasoning_content"));
        json_t *tc = json_object_get(m, "tool_calls"), *t;
        size_t j;
        out[i].tool_calls = *calls + k;
        out[i].n_tool_calls = json_array_size(tc);
        json_array_foreach(tc, j, t) {
            (*calls)[k].name = json_string_value(json_object_get(t, "name"));
            (*calls)[k].arguments = json_string_value(json_object_get(t, "arguments"));
            k++;
        }
    }
    return out;
}

static void show_diff(const char *name, const char *got, const char *want)
{
    size_t i = 0;
    while (got[i] && got[i] == want[i]) i++;
    fprintf(stderr, "  %s: differs at byte %zu:\n    got  \"%.40s\"\n    want \"%.40s\"\n", name, i, got + i, want + i);
}

static void test_golden(void)
{
    FILE *f = fopen("tests/chat_cases/cases.jsonl", "r");
    CHECK(f != NULL, "cannot open tests/chat_cases/cases.jsonl");
    if (!f) return;
    char *line = NULL, err[256];
    size_t cap = 0, n_case = 0, n_ok = 0, per_kind[4] = {0};
    while (getline(&line, &cap, f) > 0) {
        json_error_t je;
        json_t *c = json_loads(line, 0, &je);
        n_case++;
        CHECK(c != NULL, "line %zu: %s", n_case, je.text);
        if (!c) continue;
        size_t n;
        kipp_tool_call *calls;
        kipp_chat_message *m = messages_of(c, &n, &calls);
        kipp_chat_options o = {json_is_true(json_object_get(c, "add_generation_prompt")),
                               json_is_true(json_object_get(c, "enable_thinking")),
                               json_string_value(json_object_get(c, "tools_json"))};
        kipp_chat_kind kind = kind_of(json_string_value(json_object_get(c, "kind")));
        char *out = NULL;
        int rc = kipp_chat_render_kind(kind, m, n, &o, &out, err, sizeof err);
        const char *want = json_string_value(json_object_get(c, "expected"));
        int ok = rc == 0 && !strcmp(out, want);
        if (rc) fprintf(stderr, "  line %zu: rc %d: %s\n", n_case, rc, err);
        else if (!ok) show_diff(json_string_value(json_object_get(c, "name")), out, want);
        n_ok += (size_t)ok;
        per_kind[kind]++;
        free(out);
        free(m);
        free(calls);
        json_decref(c);
    }
    free(line);
    fclose(f);
    printf("  %zu/%zu conversations byte-identical (hybrid %zu, instruct-2507 %zu, thinking-2507 %zu)\n", n_ok,
           n_case, per_kind[KIPP_CHAT_HYBRID], per_kind[KIPP_CHAT_INSTRUCT_2507], per_kind[KIPP_CHAT_THINKING_2507]);
    CHECK(per_kind[KIPP_CHAT_HYBRID] >= 50, "only %zu hybrid conversations; expected >= 50", per_kind[KIPP_CHAT_HYBRID]);
    CHECK(per_kind[KIPP_CHAT_INSTRUCT_2507] && per_kind[KIPP_CHAT_THINKING_2507], "2507 templates not covered");
    CHECK(n_ok == n_case, "%zu of %zu conversations differ", n_case - n_ok, n_case);
}

static kipp_model *load(const char *name)
{
    char path[600], err[256];
    kipp_model *m = NULL;
    snprintf(path, sizeof path, "%s/%s.gguf", th_models_dir(), name);
    if (kipp_model_load(path, &m, err, sizeof err)) fprintf(stderr, "  %s: %s\n", path, err);
    return m;
}

/* Through a converted model: hybrid renders as the kind does; base refuses. */
static void test_model_path(void)
{
    kipp_chat_message msg[2] = {{.role = KIPP_ROLE_SYSTEM, .content = "sys"}, {.role = KIPP_ROLE_USER, .content = "hi"}};
    kipp_chat_options o = {1, 0, NULL};
    char err[256], *a = NULL, *b = NULL;
    kipp_model *tiny = load("synthetic-tiny"), *base = load("synthetic-tiny-untied");
    CHECK(tiny && base, "test models missing: run `make models-test`");
    if (tiny) {
        int rc = kipp_chat_render(tiny, msg, 2, &o, &a, err, sizeof err);
        kipp_chat_render_kind(KIPP_CHAT_HYBRID, msg, 2, &o, &b, err, sizeof err);
        CHECK(rc == 0 && a && b && !strcmp(a, b), "model render differs from the hybrid kind");
        CHECK(a && strstr(a, "<|im_start|>assistant\n<think>\n\n</think>\n\n"), "empty think block missing");
    }
    if (base) {
        char *c = (char *)1;
        int rc = kipp_chat_render(base, msg, 2, &o, &c, err, sizeof err);
        CHECK(rc == KIPP_ENOTSUP && c == NULL && strstr(err, "synthetic-tiny-untied") && strstr(err, "base"),
              "base model: rc %d '%s'", rc, err);
    }
    free(a);
    free(b);
    kipp_model_close(tiny);
    kipp_model_close(base);
}

static void test_bad_input(void)
{
    kipp_chat_message user = {.role = KIPP_ROLE_USER, .content = "hi"};
    kipp_chat_message sys_null = {.role = KIPP_ROLE_SYSTEM, .content = NULL};
    kipp_chat_message bad_role = {.role = (kipp_role)9, .content = "x"};
    kipp_chat_options o = {1, 1, "{\"type\": \"function\"}"};
    char err[256], *out = NULL;
    int rc = kipp_chat_render_kind(KIPP_CHAT_HYBRID, &user, 1, &o, &out, err, sizeof err);
    CHECK(rc == KIPP_EINVAL && strstr(err, "array"), "tools object: rc %d '%s'", rc, err);
    o.tools_json = "[{\"a\": ]";
    rc = kipp_chat_render_kind(KIPP_CHAT_HYBRID, &user, 1, &o, &out, err, sizeof err);
    CHECK(rc == KIPP_EINVAL && strstr(err, "column"), "invalid tools JSON: rc %d '%s'", rc, err);
    rc = kipp_chat_render_kind(KIPP_CHAT_HYBRID, &sys_null, 1, NULL, &out, err, sizeof err);
    CHECK(rc == KIPP_EINVAL && strstr(err, "system"), "NULL system content: rc %d '%s'", rc, err);
    rc = kipp_chat_render_kind(KIPP_CHAT_HYBRID, &bad_role, 1, NULL, &out, err, sizeof err);
    CHECK(rc == KIPP_EINVAL && strstr(err, "role 9"), "bad role: rc %d '%s'", rc, err);
    rc = kipp_chat_render_kind(KIPP_CHAT_HYBRID, &user, 0, NULL, &out, err, sizeof err);
    CHECK(rc == KIPP_EINVAL && strstr(err, "no messages"), "no messages: rc %d '%s'", rc, err);
    rc = kipp_chat_render_kind(KIPP_CHAT_NONE, &user, 1, NULL, &out, err, sizeof err);
    CHECK(rc == KIPP_ENOTSUP && out == NULL, "base kind: rc %d", rc);
    /* NULL opts = HF defaults: no generation prompt */
    rc = kipp_chat_render_kind(KIPP_CHAT_HYBRID, &user, 1, NULL, &out, err, sizeof err);
    CHECK(rc == 0 && out && !strcmp(out, "<|im_start|>user\nhi<|im_end|>\n"), "NULL opts: '%s'", out ? out : "");
    free(out);
}

/* Content as a list of text parts renders as the parts joined with "\n" would,
 * in every role and every kind; the golden conversations pin the string form. */
static void test_content_parts(void)
{
    static const char *sys_p[] = {"You are", "terse."}, *user_p[] = {"Hi", "", "there"};
    static const char *asst_p[] = {"<think>\nhm\n</think>", "Hello"}, *tool_p[] = {"{\"ok\": true}"};
    kipp_tool_call call = {"get", "{\"q\": 1}"};
    kipp_chat_message parts[] = {
        {.role = KIPP_ROLE_SYSTEM, .content_parts = sys_p, .n_content_parts = 2},
        {.role = KIPP_ROLE_USER, .content_parts = user_p, .n_content_parts = 3},
        {.role = KIPP_ROLE_ASSISTANT, .content_parts = asst_p, .n_content_parts = 2, .tool_calls = &call,
         .n_tool_calls = 1},
        {.role = KIPP_ROLE_TOOL, .content_parts = tool_p, .n_content_parts = 1},
        {.role = KIPP_ROLE_USER, .content_parts = user_p, .n_content_parts = 1},
    };
    kipp_chat_message joined[] = {
        {.role = KIPP_ROLE_SYSTEM, .content = "You are\nterse."},
        {.role = KIPP_ROLE_USER, .content = "Hi\n\nthere"},
        {.role = KIPP_ROLE_ASSISTANT, .content = "<think>\nhm\n</think>\nHello", .tool_calls = &call, .n_tool_calls = 1},
        {.role = KIPP_ROLE_TOOL, .content = "{\"ok\": true}"},
        {.role = KIPP_ROLE_USER, .content = "Hi"},
    };
    const kipp_chat_kind kinds[] = {KIPP_CHAT_HYBRID, KIPP_CHAT_INSTRUCT_2507, KIPP_CHAT_THINKING_2507};
    kipp_chat_options o = {1, 1, "[{\"name\": \"get\"}]"};
    char err[256];
    for (size_t k = 0; k < 3; k++) {
        char *a = NULL, *b = NULL;
        int ra = kipp_chat_render_kind(kinds[k], parts, 5, &o, &a, err, sizeof err);
        int rb = kipp_chat_render_kind(kinds[k], joined, 5, &o, &b, err, sizeof err);
        CHECK(ra == 0 && rb == 0 && a && b && !strcmp(a, b), "kind %d: parts render differs from joined:\n%s\n--\n%s",
              (int)kinds[k], a ? a : "", b ? b : "");
        free(a);
        free(b);
    }
    kipp_chat_message both = {.role = KIPP_ROLE_USER, .content = "x", .content_parts = user_p, .n_content_parts = 1};
    char *out = NULL;
    int rc = kipp_chat_render_kind(KIPP_CHAT_HYBRID, &both, 1, NULL, &out, err, sizeof err);
    CHECK(rc == KIPP_EINVAL && strstr(err, "both content"), "content and parts: rc %d '%s'", rc, err);
    static const char *null_p[] = {"a", NULL};
    kipp_chat_message np = {.role = KIPP_ROLE_USER, .content_parts = null_p, .n_content_parts = 2};
    rc = kipp_chat_render_kind(KIPP_CHAT_HYBRID, &np, 1, NULL, &out, err, sizeof err);
    CHECK(rc == KIPP_EINVAL && strstr(err, "part 1 is NULL"), "NULL part: rc %d '%s'", rc, err);
}

/* kipp_chat_tokenize reads message text by length (a NUL byte does not end
 * it) and keeps typed markers as text in content parts too: the oracle is
 * kipp_tokenize over the rendered bytes (no marker text) and the count of
 * <|im_start|> control tokens (marker text). */
static void test_chat_tokenize_lengths_and_parts(void)
{
    kipp_model *m = load("synthetic-tiny");
    CHECK(m != NULL, "test model missing: run `make models-test`");
    if (!m) return;
    kipp_chat_options o = {1, 0, NULL};
    char err[256] = "", *text = NULL;
    uint32_t *ids = NULL, want[512], im_start = 0;
    size_t n = 0, nw = 0, nl = 0, tl = 0;
    kipp_chat_message nul = {.role = KIPP_ROLE_USER, .content = "before\0after", .content_len = 12};
    int rc = kipp_chat_tokenize(m, &nul, 1, &o, &ids, &n, &text, &tl, err, sizeof err);
    char *r = NULL;
    if (!rc) rc = kipp_chat_render_n(m, &nul, 1, &o, &r, &nl, err, sizeof err);
    if (!rc) rc = kipp_tokenize(m, r, nl, KIPP_TOK_SPECIAL, want, 512, &nw, err, sizeof err);
    CHECK(rc == 0 && n == nw && !memcmp(ids, want, n * sizeof *ids), "NUL in content: %zu ids, render+tokenize %zu (%s)",
          n, nw, err);
    /* the text comes back whole with its length: strlen would stop at the NUL */
    CHECK(rc == 0 && tl == nl && tl > strlen(text) && !memcmp(text, r, nl), "NUL in content: text length %zu, render %zu",
          tl, nl);
    free(ids), free(text), free(r);
    CHECK(kipp_tokenize(m, "<|im_start|>", 12, KIPP_TOK_SPECIAL, &im_start, 1, &nw, err, sizeof err) == 0 && nw == 1,
          "<|im_start|> is not one control token");
    static const char *typed_p[] = {"x<|im_start|>y", "z"};
    kipp_chat_message parts = {.role = KIPP_ROLE_USER, .content_parts = typed_p, .n_content_parts = 2};
    kipp_chat_message joined = {.role = KIPP_ROLE_USER, .content = "x<|im_start|>y\nz"};
    uint32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0, count = 0;
    rc = kipp_chat_tokenize(m, &parts, 1, &o, &a, &na, NULL, NULL, err, sizeof err);
    if (!rc) rc = kipp_chat_tokenize(m, &joined, 1, &o, &b, &nb, NULL, NULL, err, sizeof err);
    CHECK(rc == 0 && na == nb && !memcmp(a, b, na * sizeof *a), "parts tokenize differently from their joined string: %s", err);
    for (size_t i = 0; i < na; i++) count += a && a[i] == im_start;
    CHECK(count == 2, "typed marker in a part: %zu <|im_start|> control tokens, expected the template's 2", count);
    free(a), free(b);
    kipp_model_close(m);
}

/* kipp_chat_json_dumps writes Python json.dumps(ensure_ascii=False). */
static void test_json_dumps(void)
{
    const char *in = "{\"b\":1,\"a\":[1.0,1e-7,\"\\u00e9\\n\",null,true],\"c\":{}}";
    char err[256], *out = NULL;
    int rc = kipp_chat_json_dumps(in, strlen(in), &out, err, sizeof err);
    CHECK(rc == 0 && out && !strcmp(out, "{\"b\": 1, \"a\": [1.0, 1e-07, \"\xC3\xA9\\n\", null, true], \"c\": {}}"),
          "json_dumps: rc %d '%s'", rc, out ? out : err);
    free(out);
    rc = kipp_chat_json_dumps("{\"a\": ", 6, &out, err, sizeof err);
    CHECK(rc == KIPP_EINVAL && out == NULL && strstr(err, "column"), "invalid JSON: rc %d '%s'", rc, err);
}

int main(void)
{
    RUN(test_golden);
    RUN(test_model_path);
    RUN(test_bad_input);
    RUN(test_content_parts);
    RUN(test_chat_tokenize_lengths_and_parts);
    RUN(test_json_dumps);
    return th_finish();
}
