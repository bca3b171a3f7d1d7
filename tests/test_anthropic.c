/*
 * test_anthropic.c - the Anthropic Messages request parser
 * (server/api_anthropic.c) and renderer (server/anthropic_render.c), without
 * a model: requests against the serve_req fields written out by hand, and
 * fabricated jobs (raw model text, finish, counts) against the reply and the
 * event stream Anthropic documents. The synthetic model never opens <think>
 * by itself, so thinking blocks are exercised here, from raw text.
 */
#include <string.h>

#include "server/anthropic.h"
#include "tests/test_harness.h"

static double fake_now; /* the renderer's clock (pings) */
double serve_now(void) { return fake_now; }

static int parse(const char *body, int count_only, serve_req *r, serve_error *e)
{
    return serve_parse_anthropic(body, strlen(body), count_only, r, e);
}

static int msg_is(const serve_msg *m, kipp_role role, const char *content)
{
    return m->role == role && m->content_len == strlen(content) && !memcmp(m->content, content, m->content_len);
}

static void test_parse_conversation(void)
{
    const char *body =
        "{\"model\":\"m\",\"max_tokens\":50,\"system\":[{\"type\":\"text\",\"text\":\"A\"},{\"type\":\"text\",\"text\":\"B\","
        "\"cache_control\":{\"type\":\"ephemeral\"}}],\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hmm\",\"signature\":\"sig\"},"
        "{\"type\":\"text\",\"text\":\"ok\"},{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"f\",\"input\":{\"b\":[1,2],"
        "\"a\":\"\\u00e9\"}}]},{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\","
        "\"content\":[{\"type\":\"text\",\"text\":\"r1\"},{\"type\":\"text\",\"text\":\"r2\"}],\"is_error\":false},"
        "{\"type\":\"text\",\"text\":\"next\"}]}],\"tools\":[{\"name\":\"f\",\"description\":\"d\",\"input_schema\":"
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}}}}],\"tool_choice\":{\"type\":\"tool\","
        "\"name\":\"f\",\"disable_parallel_tool_use\":true},\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":20},"
        "\"stop_sequences\":[\"X\",\"YY\"],\"temperature\":0.5,\"top_k\":3,\"top_p\":0.9,\"metadata\":{\"user_id\":\"u\"},"
        "\"stream\":true,\"service_tier\":\"auto\"}";
    serve_req r;
    serve_error e;
    CHECK(parse(body, 0, &r, &e) == 0, "parse: %s", e.message);
    if (th_cur_failed) return;
    CHECK(r.chat == 1 && r.api == SERVE_API_ANTHROPIC && r.n == 1, "chat %d api %d n %d", r.chat, r.api, r.n);
    CHECK(r.n_msgs == 5, "%zu messages, expected system, user, assistant, tool, user", r.n_msgs);
    if (r.n_msgs == 5) {
        CHECK(msg_is(&r.msgs[0], KIPP_ROLE_SYSTEM, "A\nB"), "system '%s'", r.msgs[0].content);
        CHECK(msg_is(&r.msgs[1], KIPP_ROLE_USER, "hi"), "user '%s'", r.msgs[1].content);
        const serve_msg *a = &r.msgs[2];
        CHECK(msg_is(a, KIPP_ROLE_ASSISTANT, "ok") && a->reasoning_content && !strcmp(a->reasoning_content, "hmm"),
              "assistant '%s' / '%s'", a->content, a->reasoning_content ? a->reasoning_content : "(null)");
        CHECK(a->n_calls == 1 && !strcmp(a->calls[0].name, "f") && !strcmp(a->call_ids[0], "toolu_1") &&
              !strcmp(a->calls[0].arguments, "{\"b\": [1, 2], \"a\": \"\xc3\xa9\"}"),
              "call: %zu, '%s'", a->n_calls, a->n_calls ? a->calls[0].arguments : "");
        CHECK(msg_is(&r.msgs[3], KIPP_ROLE_TOOL, "r1\nr2") && !strcmp(r.msgs[3].tool_call_id, "toolu_1"), "tool '%s'",
              r.msgs[3].content);
        CHECK(msg_is(&r.msgs[4], KIPP_ROLE_USER, "next"), "user text after the results '%s'", r.msgs[4].content);
    }
    CHECK(r.n_tools == 1 && !strcmp(r.tools[0].parameters, "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}}}"),
          "tool parameters '%s'", r.n_tools ? r.tools[0].parameters : "");
    CHECK(r.tools_json && !strcmp(r.tools_json, "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\","
                                                "\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}}}}}]"),
          "tools_json '%s'", r.tools_json ? r.tools_json : "(null)");
    CHECK(r.tool_choice == SERVE_TOOL_NAMED && r.tool_named == 0 && r.parallel_tool_calls == 0, "tool_choice %d %zu %d",
          r.tool_choice, r.tool_named, r.parallel_tool_calls);
    CHECK(r.enable_thinking == 1 && r.thinking_budget == 20, "thinking %d budget %lld", r.enable_thinking, (long long)r.thinking_budget);
    CHECK(r.n_stop == 2 && !strcmp(r.stop[1], "YY"), "stops %zu", r.n_stop);
    CHECK(r.sp.temperature == 0.5f && r.sp.top_k == 3 && r.sp.top_p == 0.9f && r.stream == 1 && r.max_tokens == 50 &&
          r.max_tokens_asked == 50, "sampling %g %d %g stream %d max %lld", r.sp.temperature, r.sp.top_k, r.sp.top_p,
          r.stream, (long long)r.max_tokens);
    serve_req_free(&r);
}

static void test_parse_modes(void)
{
    serve_req r;
    serve_error e;
    const char *count = "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"tools\":[{\"name\":\"f\",\"input_schema\":"
                        "{\"type\":\"object\"}}],\"tool_choice\":{\"type\":\"any\"},\"thinking\":{\"type\":\"disabled\"}}";
    CHECK(parse(count, 1, &r, &e) == 0, "count_tokens body: %s", e.message);
    CHECK(r.max_tokens_asked == 1 && r.tool_choice == SERVE_TOOL_AUTO && r.enable_thinking == 0 && r.n_tools == 1,
          "count: max %lld choice %d thinking %d", (long long)r.max_tokens_asked, r.tool_choice, r.enable_thinking);
    serve_req_free(&r);
    CHECK(parse(count, 0, &r, &e) == -1 && strstr(e.message, "max_tokens is required"), "messages without max_tokens: %s", e.message);
    const char *plain = "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}";
    CHECK(parse(plain, 0, &r, &e) == 0 && r.enable_thinking == 1 && r.thinking_budget == -1 && r.tool_choice == SERVE_TOOL_AUTO &&
          r.sp.temperature == 1.0f && r.n_msgs == 1, "defaults: thinking %d budget %lld", r.enable_thinking,
          (long long)r.thinking_budget);
    serve_req_free(&r);
}

static void test_parse_errors(void)
{
    static const struct {
        const char *body, *needle;
    } cases[] = {
        {"[]", "request body is an array, expected a JSON object"},
        {"{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"n\":2}", "field 'n'"},
        {"{\"max_tokens\":0,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}", "max_tokens 0"},
        {"{\"max_tokens\":5,\"temperature\":2,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}", "temperature 2"},
        {"{\"max_tokens\":5,\"messages\":[]}", "(empty)"},
        {"{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[]}]}", "non-empty array"},
        {"{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"q\",\"name\":\"x\"}]}", "messages[0].name"},
        {"{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"q\",\"x\":1}]}]}",
         "content[0].x"},
        {"{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"f\","
         "\"input\":{}}]}]}", "'tool_use'"},
        {"{\"max_tokens\":5,\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"f\","
         "\"input\":[]}]},{\"role\":\"user\",\"content\":\"q\"}]}", "input is an array"},
        {"{\"max_tokens\":5,\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"f\","
         "\"input\":{}}]},{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"b\"}]}]}", "'b' matches no"},
        {"{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"tool_choice\":{\"type\":\"any\"}}", "needs tools"},
        {"{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"tools\":[{\"name\":\"f\",\"input_schema\":"
         "{\"type\":\"object\"}},{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}]}", "repeats tools[0]"},
        {"{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"thinking\":{\"type\":\"enabled\","
         "\"budget_tokens\":5}}", "not below max_tokens"},
        {"{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"thinking\":{\"type\":\"disabled\","
         "\"budget_tokens\":5}}", "thinking.budget_tokens is not supported"},
        {"{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"stop_sequences\":[\"\"]}", "stop_sequences[0]"},
        {"{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"service_tier\":\"priority\"}", "'priority'"},
        {"{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"metadata\":{\"x\":1}}", "metadata.x"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        serve_req r;
        serve_error e;
        int rc = parse(cases[i].body, 0, &r, &e);
        CHECK(rc == -1 && e.status == 400 && strstr(e.message, cases[i].needle), "case %zu: rc %d status %d '%s', expected '%s'",
              i, rc, e.status, e.message, cases[i].needle);
        if (!rc) serve_req_free(&r);
    }
}

/* ---- rendering ---- */

static const char *RAW = "<think>\nreason here</think>\n\nHello <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";

/* A finished-or-not job over raw text with tools [f] and thinking split on. */
static void job_make(serve_job *j, const char *body, const char *raw, int thinking)
{
    serve_error e;
    memset(j, 0, sizeof *j);
    if (parse(body, 0, &j->req, &e)) fprintf(stderr, "job body: %s\n", e.message);
    j->req.thinking = thinking, j->req.n_prompt = 10;
    j->id = 7, j->created = 1000, j->cached_tokens = 4;
    serve_buf_put(&j->out[0].raw, raw, strlen(raw));
    j->out[0].n_gen = 20;
}

static void job_free(serve_job *j)
{
    serve_req_free(&j->req);
    serve_buf_free(&j->out[0].raw);
}

static const char *TOOLS_BODY = "{\"max_tokens\":64,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"tools\":[{\"name\":\"f\","
                                "\"input_schema\":{\"type\":\"object\"}}],\"stop_sequences\":[\"X\",\"YY\"]}";

static void test_response(void)
{
    serve_job j;
    serve_info si = {.model_id = "qwen"};
    job_make(&j, TOOLS_BODY, RAW, 1);
    j.out[0].finish = FIN_STOP;
    char *s = serve_anthropic_response(&si, &j);
    json_t *o = s ? json_loads(s, 0, NULL) : NULL;
    json_t *want = json_loads("{\"type\":\"message\",\"role\":\"assistant\",\"model\":\"qwen\",\"content\":["
                              "{\"type\":\"thinking\",\"thinking\":\"reason here\",\"signature\":\"\"},"
                              "{\"type\":\"text\",\"text\":\"Hello \"},{\"type\":\"tool_use\",\"name\":\"f\",\"input\":{\"a\":1}}],"
                              "\"stop_reason\":\"tool_use\",\"stop_sequence\":null,\"usage\":{\"input_tokens\":6,"
                              "\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":4,\"output_tokens\":20}}", 0, NULL);
    const char *id = json_string_value(json_object_get(o, "id"));
    json_t *tu = json_array_get(json_object_get(o, "content"), 2);
    const char *tid = json_string_value(json_object_get(tu, "id"));
    CHECK(id && !strncmp(id, "msg_", 4) && strlen(id) == 28, "id '%s'", id ? id : "(none)");
    CHECK(tid && !strncmp(tid, "toolu_", 6) && strlen(tid) == 30, "tool id '%s'", tid ? tid : "(none)");
    json_object_del(o, "id"), json_object_del(tu, "id");
    CHECK(json_equal(o, want), "reply %s", s ? s : "(null)");
    json_decref(o), json_decref(want), free(s);
    /* a stop string: stop_sequence names it; no calls, no thinking */
    job_free(&j);
    job_make(&j, TOOLS_BODY, "abc", 0);
    j.out[0].finish = FIN_STOP, j.out[0].stop_matched = 2;
    s = serve_anthropic_response(&si, &j);
    CHECK(s && strstr(s, "\"content\":[{\"type\":\"text\",\"text\":\"abc\"}]") && strstr(s, "\"stop_reason\":\"stop_sequence\"") &&
          strstr(s, "\"stop_sequence\":\"YY\""), "stop sequence reply %s", s ? s : "(null)");
    free(s);
    j.out[0].finish = FIN_LENGTH, j.out[0].stop_matched = 0;
    s = serve_anthropic_response(&si, &j);
    CHECK(s && strstr(s, "\"stop_reason\":\"max_tokens\",\"stop_sequence\":null"), "length reply %s", s ? s : "(null)");
    free(s);
    job_free(&j);
}

/* The stream's events as "type" words (consecutive deltas of one kind once), and what they carry. */
typedef struct {
    char seq[1024];
    serve_buf thinking, text, json;
    int pings, bad, n_json; /* n_json: input_json_delta events */
} events_t;

static void events_read(const serve_buf *b, events_t *ev)
{
    const char *p = b->p ? b->p : "", *end = p + b->n;
    char last[48] = "";
    while (p < end) {
        const char *nl = strstr(p, "\n"), *fin = strstr(p, "\n\n");
        if (!nl || !fin || strncmp(p, "event: ", 7) || strncmp(nl + 1, "data: ", 6)) { ev->bad++; return; }
        char type[32];
        snprintf(type, sizeof type, "%.*s", (int)(nl - p - 7), p + 7);
        json_t *d = json_loadb(nl + 7, (size_t)(fin - nl - 7), 0, NULL);
        if (!d || strcmp(json_string_value(json_object_get(d, "type")), type)) ev->bad++;
        json_t *delta = json_object_get(d, "delta"), *cb = json_object_get(d, "content_block");
        const char *dt = json_string_value(json_object_get(delta, "type"));
        char word[48];
        snprintf(word, sizeof word, "%s", dt && !strcmp(type, "content_block_delta") ? dt : type);
        if (cb) snprintf(word, sizeof word, "start:%s", json_string_value(json_object_get(cb, "type")));
        if (!strcmp(type, "ping")) ev->pings++;
        if (dt && !strcmp(dt, "thinking_delta")) serve_buf_put(&ev->thinking, json_string_value(json_object_get(delta, "thinking")), strlen(json_string_value(json_object_get(delta, "thinking"))));
        if (dt && !strcmp(dt, "text_delta")) serve_buf_put(&ev->text, json_string_value(json_object_get(delta, "text")), strlen(json_string_value(json_object_get(delta, "text"))));
        ev->n_json += dt && !strcmp(dt, "input_json_delta");
        if (dt && !strcmp(dt, "input_json_delta")) serve_buf_put(&ev->json, json_string_value(json_object_get(delta, "partial_json")), strlen(json_string_value(json_object_get(delta, "partial_json"))));
        if (strcmp(word, last) || !dt || strcmp(type, "content_block_delta"))
            snprintf(ev->seq + strlen(ev->seq), sizeof ev->seq - strlen(ev->seq), "%s%s", ev->seq[0] ? " " : "", word);
        snprintf(last, sizeof last, "%s", word);
        json_decref(d);
        p = fin + 2;
    }
}

static void test_stream(void)
{
    serve_job j;
    serve_info si = {.model_id = "qwen"};
    serve_anth_stream st = {0};
    serve_buf out = {0};
    job_make(&j, TOOLS_BODY, RAW, 1);
    size_t len = j.out[0].raw.n;
    fake_now = 100;
    j.queued = 1;
    CHECK(serve_anthropic_events(&si, &j, &st, &out) == 0 && out.n == 0, "queued: %zu bytes sent", out.n);
    j.queued = 0;
    for (size_t k = 0; k <= len; k++) { /* the text grows a byte at a time, all of it final */
        j.out[0].raw.n = k, j.out[0].raw_final = k;
        CHECK(serve_anthropic_events(&si, &j, &st, &out) == 0, "done at %zu of %zu bytes", k, len);
    }
    size_t before = out.n;
    fake_now = 100 + SERVE_ANTH_PING_S + 1; /* silence: one ping */
    serve_anthropic_events(&si, &j, &st, &out);
    CHECK(out.n > before && strstr(out.p + before, "event: ping\n"), "no ping after %g s of silence", SERVE_ANTH_PING_S + 1);
    before = out.n;
    serve_anthropic_events(&si, &j, &st, &out);
    CHECK(out.n == before, "a second ping within %g s", SERVE_ANTH_PING_S);
    j.out[0].finish = FIN_STOP, j.done = 1;
    CHECK(serve_anthropic_events(&si, &j, &st, &out) == 1 && st.done_sent, "not done once finished");
    events_t ev = {0};
    events_read(&out, &ev);
    const char *want = "message_start ping start:thinking thinking_delta signature_delta content_block_stop start:text "
                       "text_delta content_block_stop start:tool_use input_json_delta content_block_stop ping message_delta "
                       "message_stop";
    CHECK(!ev.bad && !strcmp(ev.seq, want), "events (%d bad):\n  %s\nexpected\n  %s", ev.bad, ev.seq, want);
    CHECK(ev.thinking.n == 11 && !memcmp(ev.thinking.p, "reason here", 11), "thinking '%s'", ev.thinking.p);
    CHECK(ev.text.n == 6 && !memcmp(ev.text.p, "Hello ", 6), "text '%s'", ev.text.p);
    /* the input streams as the model wrote it, a byte a step here: pieces that concatenate to its arguments */
    CHECK(ev.json.p && !strcmp(ev.json.p, "{\"a\": 1}"), "input json '%s'", ev.json.p);
    CHECK(ev.n_json == 8, "%d input_json_delta events, expected one per byte of {\"a\": 1}", ev.n_json);
    CHECK(strstr(out.p, "\"stop_reason\":\"tool_use\""), "message_delta lacks tool_use");
    serve_buf_free(&ev.thinking), serve_buf_free(&ev.text), serve_buf_free(&ev.json), serve_buf_free(&out);
    /* a failed generation ends the stream with an error event */
    memset(&st, 0, sizeof st);
    j.out[0].finish = FIN_ERROR;
    snprintf(j.error, sizeof j.error, "boom");
    serve_anthropic_events(&si, &j, &st, &out);
    CHECK(out.p && strstr(out.p, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\"") &&
          strstr(out.p, "boom") && st.done_sent, "error stream: %s", out.p ? out.p : "");
    serve_buf_free(&out);
    job_free(&j);
}

static void test_errors(void)
{
    static const struct {
        int status;
        const char *type;
    } cases[] = {{400, "invalid_request_error"}, {401, "authentication_error"}, {404, "not_found_error"},
                 {413, "request_too_large"}, {429, "rate_limit_error"}, {500, "api_error"}, {503, "overloaded_error"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        serve_error e;
        serve_fail(&e, cases[i].status, "invalid_request_error", "x", "bad \"%s\"", "q");
        char *s = serve_anthropic_error_json(&e), want[160];
        snprintf(want, sizeof want, "{\"type\":\"error\",\"error\":{\"type\":\"%s\",\"message\":\"bad \\\"q\\\"\"}}", cases[i].type);
        CHECK(s && !strcmp(s, want), "status %d: %s, expected %s", cases[i].status, s ? s : "(null)", want);
        free(s);
    }
}

int main(void)
{
    RUN(test_parse_conversation);
    RUN(test_parse_modes);
    RUN(test_parse_errors);
    RUN(test_response);
    RUN(test_stream);
    RUN(test_errors);
    return th_finish();
}
