/*
 * test_tool_calls.c - kipp-serve's reply parser for Qwen3 tool calls
 * (server/tool_calls.c). Expected contents and calls are written out by hand
 * from the block format the Qwen3 chat template teaches
 * ("<tool_call>\n{\"name\": ..., \"arguments\": {...}}\n</tool_call>"):
 *   - one call, parallel calls, text before / between / after them;
 *   - an unterminated block, invalid JSON, an unknown function, a block
 *     without name or arguments, extra keys, stay content;
 *   - streaming: the text fed one byte at a time (every boundary) and split in
 *     two at every byte gives, delta by delta, exactly the whole parse, and no
 *     prefix shows content or a call the whole text does not have.
 */
#include <stdlib.h>
#include <string.h>

#include "server/serve.h"
#include "tests/test_harness.h"

static const serve_tool TOOLS[] = {{.name = "get_weather"}, {.name = "get_time"}};

typedef struct {
    const char *content;         /* expected content */
    const char *names[4];        /* expected calls, NULL-terminated */
    const char *args[4];
} expect;

static void check_parse(const char *what, const char *text, const expect *x)
{
    serve_tool_out o;
    int rc = serve_tool_parse(TOOLS, 2, text, strlen(text), 1, &o);
    CHECK(rc == 0, "%s: rc %d", what, rc);
    size_t n = 0;
    while (x->names[n]) n++;
    const char *got = o.content.p ? o.content.p : "";
    CHECK(o.content.n == strlen(x->content) && !memcmp(got, x->content, o.content.n), "%s: content '%s', expected '%s'", what,
          got, x->content);
    CHECK(o.n_calls == n, "%s: %zu calls, expected %zu", what, o.n_calls, n);
    for (size_t k = 0; k < n && k < o.n_calls; k++) {
        CHECK(!strcmp(o.calls[k].name, x->names[k]), "%s: call %zu name '%s', expected '%s'", what, k, o.calls[k].name,
              x->names[k]);
        CHECK(!strcmp(o.calls[k].arguments, x->args[k]), "%s: call %zu arguments '%s', expected '%s'", what, k,
              o.calls[k].arguments, x->args[k]);
    }
    serve_tool_out_free(&o);
}

#define ONE "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, 2]}}\n</tool_call>"
#define ONE_ARGS "{\"city\": \"Paris\", \"days\": [1, 2]}"
#define TWO "<tool_call>\n{\"arguments\": {\"tz\": \"a\\\"}b\"}, \"name\": \"get_time\"}\n</tool_call>"
#define TWO_ARGS "{\"tz\": \"a\\\"}b\"}"

static void test_calls(void)
{
    check_parse("one call", ONE, &(expect){"", {"get_weather"}, {ONE_ARGS}});
    check_parse("parallel", ONE "\n" TWO "\n", &(expect){"", {"get_weather", "get_time"}, {ONE_ARGS, TWO_ARGS}});
    check_parse("text around", "Let me check.\n" ONE "\n" TWO "\nDone.",
                &(expect){"Let me check.\n\nDone.", {"get_weather", "get_time"}, {ONE_ARGS, TWO_ARGS}});
    check_parse("leading blank", "\n\n" ONE, &(expect){"", {"get_weather"}, {ONE_ARGS}});
    check_parse("no calls", "just text \n", &(expect){"just text \n", {NULL}, {NULL}});
    check_parse("whitespace only", " \n", &(expect){" \n", {NULL}, {NULL}});
    check_parse("empty args", "<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call>",
                &(expect){"", {"get_time"}, {"{}"}});
    check_parse("escaped key", "<tool_call>{\"name\":\"get_time\",\"\\u0061rguments\":{\"x\": 1}}</tool_call>",
                &(expect){"", {"get_time"}, {"{\"x\":1}"}});
}

static void test_not_calls(void)
{
    const char *unterminated = "Hi " "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}";
    check_parse("unterminated", unterminated, &(expect){unterminated, {NULL}, {NULL}});
    const char *bad_json = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {]}\n</tool_call>";
    check_parse("invalid JSON", bad_json, &(expect){bad_json, {NULL}, {NULL}});
    const char *unknown = "<tool_call>{\"name\": \"launch\", \"arguments\": {}}</tool_call>";
    check_parse("unknown function", unknown, &(expect){unknown, {NULL}, {NULL}});
    const char *no_args = "<tool_call>{\"name\": \"get_time\"}</tool_call>";
    check_parse("no arguments", no_args, &(expect){no_args, {NULL}, {NULL}});
    const char *str_args = "<tool_call>{\"name\": \"get_time\", \"arguments\": \"{}\"}</tool_call>";
    check_parse("string arguments", str_args, &(expect){str_args, {NULL}, {NULL}});
    const char *extra = "<tool_call>{\"name\": \"get_time\", \"arguments\": {}, \"id\": 1}</tool_call>";
    check_parse("extra key", extra, &(expect){extra, {NULL}, {NULL}});
    const char *dup = "<tool_call>{\"name\": \"get_time\", \"name\": \"get_time\", \"arguments\": {}}</tool_call>";
    check_parse("duplicate key", dup, &(expect){dup, {NULL}, {NULL}});
    const char *prefix_name = "<tool_call>{\"name\": \"get_tim\", \"arguments\": {}}</tool_call>";
    check_parse("name prefix", prefix_name, &(expect){prefix_name, {NULL}, {NULL}});
    /* a bad block stays text, and a good one after it is still a call */
    check_parse("bad then good", "<tool_call>oops</tool_call>\n" ONE,
                &(expect){"<tool_call>oops</tool_call>\n", {"get_weather"}, {ONE_ARGS}});
    /* a block re-opened inside a broken one: the inner one is the call */
    check_parse("reopened", "<tool_call>{\"na<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call>",
                &(expect){"<tool_call>{\"na", {"get_time"}, {"{}"}});
}

/* Feed the parse as a stream over the given prefix lengths (then the whole
 * text, final) and check the deltas add up to the whole parse. */
static void stream_check(const char *what, const char *text, const size_t *cuts, size_t n_cuts)
{
    size_t n = strlen(text);
    serve_tool_out whole;
    CHECK(serve_tool_parse(TOOLS, 2, text, n, 1, &whole) == 0, "%s: whole", what);
    serve_buf got = {0};
    size_t sent_calls = 0, ok = 1;
    for (size_t c = 0; c <= n_cuts && ok; c++) {
        int final = c == n_cuts;
        size_t len = final ? n : cuts[c];
        serve_tool_out o;
        CHECK(serve_tool_parse(TOOLS, 2, text, len, final, &o) == 0, "%s: prefix %zu", what, len);
        /* what was shown before is a prefix of what is shown now, and of the whole */
        ok = o.content.n >= got.n && o.content.n <= whole.content.n && (!got.n || !memcmp(o.content.p, got.p, got.n)) &&
             (!o.content.n || !memcmp(o.content.p, whole.content.p, o.content.n)) && o.n_calls >= sent_calls &&
             o.n_calls <= whole.n_calls;
        CHECK(ok, "%s: prefix %zu shows content '%.*s' / %zu calls not within the whole parse", what, len,
              (int)o.content.n, o.content.p ? o.content.p : "", o.n_calls);
        for (size_t k = sent_calls; ok && k < o.n_calls; k++)
            CHECK(!strcmp(o.calls[k].name, whole.calls[k].name) && !strcmp(o.calls[k].arguments, whole.calls[k].arguments),
                  "%s: prefix %zu call %zu differs", what, len, k);
        if (ok) serve_buf_put(&got, o.content.p + got.n, o.content.n - got.n), sent_calls = o.n_calls;
        serve_tool_out_free(&o);
    }
    CHECK(got.n == whole.content.n && (!got.n || !memcmp(got.p, whole.content.p, got.n)) && sent_calls == whole.n_calls,
          "%s: streamed content '%s' (%zu calls) != whole '%s' (%zu calls)", what, got.p ? got.p : "", sent_calls,
          whole.content.p ? whole.content.p : "", whole.n_calls);
    serve_buf_free(&got);
    serve_tool_out_free(&whole);
}

static void test_streaming_splits(void)
{
    const char *texts[] = {
        "Let me check.\n" ONE "\n" TWO "\nDone.",
        ONE "\n\n" TWO,
        "a <tool_cal b <tool_call>oops</tool_call> " ONE " tail <tool_",
        "Hi <tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}",
        "<tool_call>{\"na<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call>\n x",
        "  \n",
    };
    for (size_t t = 0; t < sizeof texts / sizeof texts[0]; t++) {
        size_t n = strlen(texts[t]);
        size_t *cuts = malloc((n + 1) * sizeof *cuts);
        for (size_t k = 0; k <= n; k++) cuts[k] = k;
        stream_check(texts[t], texts[t], cuts, n + 1); /* one byte at a time */
        for (size_t k = 0; k <= n; k++) stream_check(texts[t], texts[t], &k, 1); /* two pieces, split at k */
        free(cuts);
    }
}

int main(void)
{
    RUN(test_calls);
    RUN(test_not_calls);
    RUN(test_streaming_splits);
    return th_finish();
}
