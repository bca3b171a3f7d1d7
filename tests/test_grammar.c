/*
 * test_grammar.c - constrained output (engine/grammar*.c): the automaton's
 * verdict on hand-written byte strings (complete, a valid prefix, refused),
 * exact masks over a hand-made vocabulary, the refusals of unsupported
 * schemas, and, over the real 151k-token vocabulary, every mask along
 * seeded random walks against the brute-force oracle (each token's bytes fed
 * to the automaton one by one), walks that end in JSON jansson parses, and a
 * constrained kipp_gen on synthetic-tiny.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "engine/grammar_impl.h"
#include "tests/test_harness.h"

static kipp_model *model;

/* A grammar over a one-token vocabulary: enough for byte-level verdicts. */
static kipp_grammar *tiny_grammar(const char *schema, const char *prefix, const char *suffix, const char *sep,
                                  uint32_t max_count, char *err, size_t errlen)
{
    kipp_str t = {"x", 1};
    uint32_t stop = 1;
    kipp_vocab_index *vi = NULL;
    if (kipp_vocab_index_build(&t, NULL, 1, 2, &stop, 1, &vi, err, errlen)) return NULL;
    kipp_grammar_spec spec = {.schema = schema, .prefix = prefix, .suffix = suffix, .separator = sep,
                              .max_count = max_count};
    kipp_grammar *g = NULL;
    kipp_grammar_create_vi(vi, 1, &spec, &g, err, errlen);
    return g;
}

/* 2: complete; 1: a valid prefix, not complete; 0: refused. */
static int verdict(kipp_grammar *g, const char *text)
{
    kipp_grammar_matcher *m = kipp_grammar_matcher_create(g);
    int v = kipp_grammar_matcher_feed(m, text, strlen(text)) ? 0 : kipp_grammar_matcher_complete(m) ? 2 : 1;
    kipp_grammar_matcher_destroy(m);
    return v;
}

typedef struct {
    const char *schema, *text;
    int want;
} vcase;

static const vcase cases[] = {
    /* json_object mode */
    {NULL, "{}", 2}, {NULL, "{\"a\": [1, -2.5e+3, \"x\", true, null, {}]}", 2}, {NULL, "[]", 0}, {NULL, "{\"a\"", 1},
    {NULL, "{\"a\":1,}", 0}, {NULL, "\n\n{}", 2}, {NULL, "{\"a\":01}", 0}, {NULL, "{\"a\":1.}", 0},
    {NULL, "{\"a\":\"\\u00e9\\n\"}", 2}, {NULL, "{\"a\":\"\\ud800\"}", 0}, {NULL, "{\"a\":\"\\x\"}", 0},
    {NULL, "{\"a\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}", 2}, {NULL, "{\"a\":\"\xc0\xaf\"}", 0},
    {NULL, "{\"a\":\"\xed\xa0\x80\"}", 0}, {NULL, "{\"a\":\"\x01\"}", 0}, {NULL, "{\"a\":1}x", 0},
    {NULL, "{             }", 0}, /* 13 spaces: one gap takes one space (test_grammar_bounds.c: the rule) */
    {NULL, "{\"a\":1234567890123456}", 0}, {NULL, "{\"a\":123456789012345}", 2},
    /* objects: declared order, required, optional, no extra keys */
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},\"required\":[\"b\"]}",
     "{\"a\": 1, \"b\": \"x\"}", 2},
    {"{\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},\"required\":[\"b\"]}", "{\"b\":\"\"}", 2},
    {"{\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},\"required\":[\"b\"]}", "{\"a\":1}", 0},
    {"{\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},\"required\":[\"b\"]}", "{}", 0},
    {"{\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}}}", "{}", 2},
    {"{\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}}}", "{\"b\":\"\",\"a\":1}", 0},
    {"{\"properties\":{\"a\":{\"type\":\"integer\"}}}", "{\"c\":1}", 0},
    {"{\"properties\":{\"a\":{\"type\":\"integer\"}}}", "{\"a\":1.5}", 0},
    {"{\"properties\":{\"a\":{\"type\":\"number\"}}}", "{\"a\":-0.5E-7}", 2},
    {"{\"type\":\"object\",\"additionalProperties\":false}", "{}", 2},
    {"{\"type\":\"object\",\"additionalProperties\":false}", "{\"a\":1}", 0},
    /* strings */
    {"{\"type\":\"string\",\"maxLength\":3}", "\"\xc3\xa9\\n\xf0\x9f\x98\x80\"", 2},
    {"{\"type\":\"string\",\"maxLength\":3}", "\"abcd\"", 0},
    {"{\"type\":\"string\",\"minLength\":2}", "\"a\"", 0},
    {"{\"type\":\"string\",\"minLength\":2}", "\"ab\"", 2},
    {"{\"type\":\"string\",\"enum\":[\"red\",\"green\"]}", "\"green\"", 2},
    {"{\"enum\":[\"red\",\"green\"]}", "\"blue\"", 0},
    {"{\"enum\":[1,12,{\"k\":[null]}]}", "1", 2}, {"{\"enum\":[1,12,{\"k\":[null]}]}", "12", 2},
    {"{\"enum\":[1,12,{\"k\":[null]}]}", "{\"k\":[null]}", 2}, {"{\"enum\":[1,12]}", "123", 0},
    {"{\"const\":\"x\"}", "\"x\"", 2}, {"{\"const\":\"x\"}", "\"y\"", 0},
    /* arrays */
    {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":2}", "[]", 0},
    {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":2}", "[1, 2]", 2},
    {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":2}", "[1,2,", 0},
    {"{\"type\":\"array\",\"maxItems\":0}", "[]", 2}, {"{\"type\":\"array\",\"maxItems\":0}", "[1]", 0},
    {"{\"type\":\"array\",\"items\":{\"type\":\"boolean\"}}", "[true,false]", 2},
    /* alternatives, type arrays, refs */
    {"{\"type\":[\"string\",\"null\"]}", "null", 2}, {"{\"type\":[\"string\",\"null\"]}", "\"n\"", 2},
    {"{\"type\":[\"string\",\"null\"]}", "1", 0},
    {"{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}]}", "[3]", 2},
    {"{\"anyOf\":[{\"properties\":{\"n\":{\"const\":\"f\"}},\"required\":[\"n\"]},"
     "{\"properties\":{\"n\":{\"const\":\"g\"},\"x\":{\"type\":\"null\"}},\"required\":[\"n\",\"x\"]}]}",
     "{\"n\":\"g\",\"x\":null}", 2},
    {"{\"anyOf\":[{\"properties\":{\"n\":{\"const\":\"f\"}},\"required\":[\"n\"]},"
     "{\"properties\":{\"n\":{\"const\":\"g\"},\"x\":{\"type\":\"null\"}},\"required\":[\"n\",\"x\"]}]}",
     "{\"n\":\"f\",\"x\":null}", 0},
    {"{\"$defs\":{\"P\":{\"type\":\"object\",\"properties\":{\"k\":{\"$ref\":\"#/$defs/P\"}}}},\"$ref\":\"#/$defs/P\"}",
     "{\"k\":{\"k\":{}}}", 2},
    {"{\"definitions\":{\"I\":{\"type\":\"integer\"}},\"type\":\"array\",\"items\":{\"$ref\":\"#/definitions/I\"}}",
     "[1,\"a\"]", 0},
    {"{\"title\":\"T\",\"description\":\"d\",\"type\":\"boolean\",\"default\":true}", "false", 2},
    {"{\"properties\":{\"u\":{\"anyOf\":[{\"$ref\":\"#/definitions/U\"},{\"type\":\"null\"}]}},"
     "\"definitions\":{\"U\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"]}}}", "{\"u\":\"f\"}", 2},
    {"{\"type\":\"integer\"}", "-0", 2}, {"{\"type\":\"integer\"}", "-", 1},
};

static void test_verdicts(void)
{
    char err[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kipp_grammar *g = tiny_grammar(cases[i].schema, NULL, NULL, NULL, 1, err, sizeof err);
        CHECK(g, "case %zu: %s", i, err);
        if (!g) continue;
        int v = verdict(g, cases[i].text);
        CHECK(v == cases[i].want, "case %zu: schema %s text %s: got %d, want %d", i,
              cases[i].schema ? cases[i].schema : "(json_object)", cases[i].text, v, cases[i].want);
        kipp_grammar_destroy(g);
    }
}

static void test_framing(void)
{
    char err[256];
    const char *sch = "{\"properties\":{\"name\":{\"const\":\"f\"}},\"required\":[\"name\"]}";
    kipp_grammar *g = tiny_grammar(sch, "<t>\n", "\n</t>", "\n", 2, err, sizeof err);
    CHECK(g, "%s", err);
    if (!g) return;
    CHECK(verdict(g, "<t>\n{\"name\":\"f\"}\n</t>") == 2, "one call");
    CHECK(verdict(g, "<t>\n{\"name\":\"f\"}\n</t>\n<t>\n{\"name\": \"f\"}\n</t>") == 2, "two calls");
    CHECK(verdict(g, "<t>\n{\"name\":\"f\"}\n</t>\n<t>\n{\"name\":\"f\"}\n</t>\n") == 0, "a third is past max_count");
    CHECK(verdict(g, "<t>\n{\"name\":\"f\"}") == 1, "no suffix yet");
    CHECK(verdict(g, "{\"name\":\"f\"}") == 0, "no prefix");
    CHECK(verdict(g, "") == 1, "empty: not complete");
    kipp_grammar_destroy(g);
}

static void test_refusals(void)
{
    static const struct {
        const char *schema, *needle;
    } bad[] = {
        {"{\"type\":\"string\",\"pattern\":\"a+\"}", "\"pattern\""},
        {"{\"properties\":{\"x\":{\"type\":\"string\",\"format\":\"date\"}}}", "#/properties/x"},
        {"{\"oneOf\":[{\"type\":\"string\"}]}", "\"oneOf\""},
        {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"}}", "additionalProperties"},
        {"{\"type\":\"integer\",\"minimum\":3}", "\"minimum\""},
        {"{\"type\":\"strin\"}", "strin"},
        {"{\"required\":[\"x\"]}", "x"},
        {"{\"$ref\":\"http://x/y\"}", "$ref"},
        {"{\"$ref\":\"#/$defs/nope\"}", "$ref"},
        {"{\"type\":\"array\",\"items\":[{\"type\":\"string\"}]}", "items"},
        {"{\"maxLength\":-1}", "maxLength"},
        {"{\"anyOf\":[]}", "anyOf"},
        {"[1]", "schema"},
        {"{\"type\":", "JSON"},
        {"false", "schema"},
    };
    char err[512];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        kipp_grammar *g = tiny_grammar(bad[i].schema, NULL, NULL, NULL, 1, err, sizeof err);
        CHECK(!g && strstr(err, bad[i].needle), "schema %s: expected a refusal naming %s, got %s", bad[i].schema,
              bad[i].needle, g ? "a grammar" : err);
        kipp_grammar_destroy(g);
    }
}

/* A hand-made vocabulary: exact masks. */
static void test_tiny_masks(void)
{
    static const char *const toks[] = {"{", "}", "\"", "a", "\"a\"", ":", " ", "1", "12", "x", ",", "<t>", "<e>", "\"a"};
    enum { N = sizeof toks / sizeof toks[0] };
    kipp_str t[N];
    uint8_t added[N] = {0};
    added[11] = 1, added[12] = 2;
    for (int i = 0; i < N; i++) t[i] = (kipp_str){toks[i], strlen(toks[i])};
    uint32_t stop = 12;
    kipp_vocab_index *vi = NULL;
    char err[256];
    CHECK(kipp_vocab_index_build(t, added, N, 16, &stop, 1, &vi, err, sizeof err) == 0, "%s", err);
    kipp_grammar_spec spec = {.schema = "{\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}",
                              .prefix = "<t>"};
    kipp_grammar *g = NULL;
    CHECK(kipp_grammar_create_vi(vi, 1, &spec, &g, err, sizeof err) == 0, "%s", err);
    if (!g) return;
    kipp_grammar_matcher *m = kipp_grammar_matcher_create(g);
    /* after each accepted token: the allowed ids as a bit string over ids 0..15 */
    static const struct {
        int tok;
        uint32_t want;
    } steps[] = {
        {-1, 1u << 11},                       /* only the framing token spells the prefix */
        {11, 1u << 0},                        /* "{" */
        {0, 1u << 2 | 1u << 4 | 1u << 6 | 1u << 13}, /* '"', "\"a\"", ' ', "\"a" (no '}': a is required) */
        {4, 1u << 5},                         /* ':' only: no whitespace before it */
        {5, 1u << 6 | 1u << 7 | 1u << 8},     /* ' ', 1, 12 */
        {8, 1u << 1 | 1u << 6 | 1u << 7 | 1u << 8}, /* '}', ' ', more digits (not ',': no property left) */
        {1, 1u << 12},                        /* complete: the end-of-turn id only */
    };
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        if (steps[i].tok >= 0) CHECK(kipp_grammar_matcher_accept(m, (uint32_t)steps[i].tok) == 0, "accept step %zu", i);
        uint32_t n = 0;
        const uint64_t *b = kipp_grammar_matcher_mask(m, &n);
        CHECK(b && (uint32_t)(b[0] & 0xFFFF) == steps[i].want && n == (uint32_t)__builtin_popcount(steps[i].want),
              "step %zu: mask %#llx, want %#x", i, b ? (unsigned long long)b[0] : 0ull, steps[i].want);
    }
    CHECK(kipp_grammar_matcher_accept(m, 12) == 0 && kipp_grammar_matcher_accept(m, 0) != 0, "end, then nothing");
    kipp_grammar_matcher_destroy(m);
    kipp_grammar_destroy(g);
}

/* The real vocabulary: masks against the brute-force oracle along random walks that must finish. */
static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

static void walk_schema(const char *schema, uint64_t seed, int check_every, int max_steps)
{
    char err[512];
    kipp_grammar_spec spec = {.schema = schema};
    kipp_grammar *g = NULL;
    CHECK(kipp_grammar_create(model, &spec, &g, err, sizeof err) == 0, "%s", err);
    if (!g) return;
    const kipp_vocab_index *vi = g->vi;
    kipp_grammar_matcher *m = kipp_grammar_matcher_create(g);
    uint32_t *allowed = malloc(vi->vocab * sizeof *allowed);
    char *text = calloc(1, 1 << 16);
    size_t len = 0;
    int done = 0;
    for (int step = 0; step < max_steps && !done; step++) {
        uint32_t n = 0, k = 0, bad = 0;
        const uint64_t *b = kipp_grammar_matcher_mask(m, &n);
        int complete = kipp_grammar_matcher_complete(m);
        for (uint32_t id = 0; id < vi->vocab; id++) {
            int got = (int)(b[id >> 6] >> (id & 63) & 1);
            if (got) allowed[k++] = id;
            if (!check_every || step % check_every) continue;
            int want;
            if (id == vi->stop_ids[0] || (vi->n_stop > 1 && id == vi->stop_ids[1])) want = complete;
            else if (id >= vi->n_tokens || vi->added[id]) continue; /* framing: covered by test_tiny_masks */
            else want = kipp_grammar_matcher_can(m, vi->blob + vi->off[id], vi->off[id + 1] - vi->off[id]);
            if (want != got && bad++ < 3)
                CHECK(0, "schema %s step %d token %u: mask %d, oracle %d (text so far %.*s)", schema, step, id, got,
                      want, (int)len, text);
        }
        CHECK(n == k && k > 0, "step %d: %u allowed, %u counted", step, n, k);
        if (!k) break;
        /* prefer closing bytes half of the time, so free-form documents end */
        uint32_t pick = allowed[rng_next(&seed) % k];
        if (rng_next(&seed) % 2) {
            for (uint32_t i = 0; i < k; i++) {
                uint32_t id = allowed[(i + (uint32_t)seed) % k];
                if (id == vi->stop_ids[0] || (id < vi->n_tokens && vi->off[id + 1] > vi->off[id] &&
                                              strchr("\"}]", vi->blob[vi->off[id + 1] - 1]))) {
                    pick = id;
                    break;
                }
            }
        }
        if (pick == vi->stop_ids[0] || (vi->n_stop > 1 && pick == vi->stop_ids[1])) done = 1;
        else if (len + (vi->off[pick + 1] - vi->off[pick]) < (1 << 16) - 1) {
            memcpy(text + len, vi->blob + vi->off[pick], vi->off[pick + 1] - vi->off[pick]);
            len += vi->off[pick + 1] - vi->off[pick];
        }
        CHECK(kipp_grammar_matcher_accept(m, pick) == 0, "accept %u", pick);
    }
    CHECK(done, "schema %s: no end in %d steps: %.*s", schema, max_steps, (int)len, text);
    if (getenv("KIPP_TEST_VERBOSE")) printf("  %.*s\n", (int)len, text);
    json_error_t je;
    json_t *j = json_loadb(text, len, JSON_DECODE_ANY, &je);
    CHECK(j != NULL, "schema %s: %.*s does not parse: %s", schema, (int)len, text, je.text);
    json_decref(j);
    free(allowed), free(text);
    kipp_grammar_matcher_destroy(m);
    kipp_grammar_destroy(g);
}

#define TOOLISH "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":12}," \
    "\"unit\":{\"anyOf\":[{\"$ref\":\"#/definitions/Unit\"},{\"type\":\"null\"}]},\"days\":{\"type\":" \
    "\"array\",\"items\":{\"type\":\"integer\"},\"maxItems\":2}},\"required\":[\"city\",\"unit\",\"days\"]," \
    "\"definitions\":{\"Unit\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"]}}}"

static void test_real_vocab(void)
{
    walk_schema(NULL, 1, 5, 400);
    walk_schema("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},"
                "\"n\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b c\"]},"
                "\"maxItems\":3},\"x\":{\"type\":[\"number\",\"null\"]}},\"required\":[\"name\",\"n\",\"tags\"]}",
                7, 3, 400);
    walk_schema("{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":12},"
                "\"unit\":{\"anyOf\":[{\"$ref\":\"#/definitions/Unit\"},{\"type\":\"null\"}]},\"days\":{\"type\":"
                "\"array\",\"items\":{\"type\":\"integer\"},\"maxItems\":2}},\"required\":[\"city\",\"unit\",\"days\"],"
                "\"definitions\":{\"Unit\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"]}}}", 5, 2, 400);
    for (uint64_t seed = 11; seed < 14; seed++) walk_schema(NULL, seed, 0, 600);
}

/* Qwen3 tool-call framing over the real vocabulary: the model's own tokenization of two calls (the added
 * <tool_call> / </tool_call> tokens included) is allowed token by token, then only the end of turn. */
static void test_tool_framing(void)
{
    char err[512];
    kipp_grammar_spec spec = {.schema = "{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"f\"},"
                              "\"arguments\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}},"
                              "\"required\":[\"x\"]}},\"required\":[\"name\",\"arguments\"],\"additionalProperties\":false},"
                              "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"g\"},\"arguments\":{}},"
                              "\"required\":[\"name\",\"arguments\"]}]}",
                              .prefix = "<tool_call>\n", .suffix = "\n</tool_call>", .separator = "\n", .max_count = 2};
    kipp_grammar *g = NULL;
    CHECK(kipp_grammar_create(model, &spec, &g, err, sizeof err) == 0, "%s", err);
    if (!g) return;
    const char *text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 12}}\n</tool_call>\n"
                       "<tool_call>\n{\"name\": \"g\", \"arguments\": {\"k\": [true]}}\n</tool_call>";
    uint32_t ids[128];
    size_t n = 0;
    CHECK(kipp_tokenize(model, text, strlen(text), KIPP_TOK_SPECIAL, ids, 128, &n, NULL, 0) == 0, "tokenize");
    CHECK(ids[0] == 151657, "<tool_call> is the added token: %u", ids[0]);
    kipp_grammar_matcher *m = kipp_grammar_matcher_create(g);
    for (size_t i = 0; i < n; i++) {
        const uint64_t *b = kipp_grammar_matcher_mask(m, NULL);
        CHECK(b[ids[i] >> 6] >> (ids[i] & 63) & 1, "token %zu (%u) not in the mask", i, ids[i]);
        CHECK(kipp_grammar_matcher_accept(m, ids[i]) == 0, "token %zu (%u) refused", i, ids[i]);
    }
    uint32_t na = 0;
    const uint64_t *b = kipp_grammar_matcher_mask(m, &na);
    CHECK(na == g->vi->n_stop && (b[151645 >> 6] >> (151645 & 63) & 1), "after two calls: %u allowed", na);
    CHECK(verdict(g, "<tool_call>\n{\"name\": \"g\", \"arguments\": 1}\n</tool_call>") == 2, "g takes any arguments");
    CHECK(verdict(g, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}") == 0, "f needs x");
    kipp_grammar_matcher_destroy(m);
    kipp_grammar_destroy(g);
}

/* One gen to its end; its text in out. */
static int run_gen(const kipp_gen_options *o, char *out, size_t cap, size_t *len, char *err, size_t errlen)
{
    uint32_t prompt[64];
    size_t n = 0;
    kipp_tokenize(model, "Reply in JSON.", 14, 0, prompt, 64, &n, NULL, 0);
    kipp_session *s = NULL;
    kipp_gen *g = NULL;
    int rc = kipp_session_create(model, 1024, &s, err, errlen);
    if (!rc) rc = kipp_gen_create(model, s, prompt, n, o, &g, err, errlen);
    while (!rc && !kipp_gen_finished(g)) {
        kipp_batch_item it;
        kipp_gen_event ev;
        rc = kipp_gen_next(g, 64, &it, err, errlen);
        if (!rc) rc = kipp_eval_batch(model, &it, 1, err, errlen);
        if (!rc) rc = kipp_gen_advance(g, 0.001, &ev, err, errlen);
    }
    const char *p;
    kipp_gen_text(g, &p, len, NULL);
    *len = *len < cap ? *len : cap - 1;
    memcpy(out, p, *len);
    out[*len] = 0;
    int fin = rc ? -1 : kipp_gen_finished(g);
    kipp_gen_destroy(g);
    kipp_session_destroy(s);
    return fin;
}

/* Constrained kipp_gen: sampled replies at several seeds end (stop) in JSON that parses; after "</think>". */
static void test_gen_constrained(void)
{
    char err[512] = "", text[8192];
    kipp_grammar_spec spec = {.schema = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\","
                              "\"maxLength\":6},\"b\":{\"enum\":[1,2,\"x\"]},\"c\":{\"type\":\"boolean\"}},"
                              "\"required\":[\"a\",\"b\",\"c\"],\"additionalProperties\":false}"};
    kipp_grammar *g = NULL;
    CHECK(kipp_grammar_create(model, &spec, &g, err, sizeof err) == 0, "%s", err);
    if (!g) return;
    uint32_t think_end = 0;
    size_t nt = 0;
    CHECK(kipp_tokenize(model, "</think>", 8, KIPP_TOK_SPECIAL, &think_end, 1, &nt, NULL, 0) == 0 && nt == 1, "</think> is one token");
    kipp_logit_bias lb = {think_end, 100.0f};
    for (int k = 0; k < 8; k++) {
        kipp_gen_options o = {.sp = kipp_sample_params_default(), .seed = (uint64_t)k, .max_tokens = 200,
                              .grammar = g, .spec = k == 1};
        o.sp.temperature = k % 2 ? 1.0f : 0.7f;
        if (k >= 6) o.grammar_after = "</think>", o.sp.logit_bias = &lb, o.sp.n_logit_bias = 1;
        size_t len = 0;
        int fin = run_gen(&o, text, sizeof text, &len, err, sizeof err);
        CHECK(fin == KIPP_FIN_STOP, "seed %d: finish %d (%s), text %s", k, fin, err, text);
        const char *doc = text;
        if (k >= 6) {
            CHECK(!strncmp(text, "</think>", 8), "seed %d: free text first: %s", k, text);
            doc = text + 8;
        }
        json_error_t je;
        json_t *j = json_loads(doc, 0, &je);
        CHECK(j && json_object_size(j) == 3 && json_is_boolean(json_object_get(j, "c")) &&
              strlen(json_string_value(json_object_get(j, "a")) ? json_string_value(json_object_get(j, "a")) : "xxxxxxxxx") <= 24,
              "seed %d: %s", k, text);
        json_decref(j);
        if (getenv("KIPP_TEST_VERBOSE")) printf("  %s\n", text);
    }
    kipp_grammar *g2 = NULL;
    spec.schema = TOOLISH;
    CHECK(kipp_grammar_create(model, &spec, &g2, err, sizeof err) == 0, "%s", err);
    for (int k = 0; g2 && k < 6; k++) {
        kipp_gen_options o = {.sp = kipp_sample_params_default(), .seed = (uint64_t)k, .max_tokens = 300, .grammar = g2};
        o.sp.temperature = 1.0f, o.sp.presence_penalty = k % 2 ? 2.0f : 0.0f;
        o.sp.logit_bias = &lb, o.sp.n_logit_bias = 1;
        size_t len = 0;
        int fin = run_gen(&o, text, sizeof text, &len, err, sizeof err);
        json_t *j = json_loads(text, 0, NULL);
        CHECK(fin == KIPP_FIN_STOP && j, "toolish seed %d: finish %d (%s), text %s", k, fin, err, text);
        json_decref(j);
    }
    kipp_grammar_destroy(g2);
    kipp_gen_options o = {.sp = kipp_sample_params_default(), .grammar_after = "</think>"};
    kipp_gen *gen = NULL;
    uint32_t p = 1;
    kipp_session *s = NULL;
    kipp_session_create(model, 64, &s, NULL, 0);
    CHECK(kipp_gen_create(model, s, &p, 1, &o, &gen, err, sizeof err) == KIPP_EINVAL && strstr(err, "grammar_after"),
          "grammar_after without a grammar: %s", err);
    kipp_session_destroy(s);
    kipp_grammar_destroy(g);
}

/* kipp_sample_params.allowed: an all-set mask changes nothing (same RNG stream, same picks); a sparse one
 * gives only its tokens, greedy the best of them, and sampling them in proportion (top_k over them only). */
static void test_sampler_mask(void)
{
    enum { V = 200 };
    float x[V];
    uint64_t all[4], some[4] = {0};
    memset(all, 0xff, sizeof all);
    for (int i = 0; i < V; i++) x[i] = (float)((i * 37) % 101) / 10.0f;
    int ids[3] = {5, 64, 150};
    for (int k = 0; k < 3; k++) some[ids[k] >> 6] |= 1ull << (ids[k] & 63);
    kipp_sample_params p = kipp_sample_params_default();
    p.temperature = 0.8f, p.top_p = 0.9f, p.top_k = 40;
    kipp_rng a, b;
    kipp_rng_seed(&a, 9), kipp_rng_seed(&b, 9);
    for (int r = 0; r < 200; r++) {
        uint32_t t1 = 0, t2 = 0;
        p.allowed = NULL;
        kipp_sample_ex(x, V, &p, &a, &t1, NULL, 0);
        p.allowed = all;
        kipp_sample_ex(x, V, &p, &b, &t2, NULL, 0);
        CHECK(t1 == t2, "draw %d: %u without a mask, %u with an all-set one", r, t1, t2);
    }
    p.allowed = some, p.top_k = 2, p.top_p = 1.0f, p.temperature = 1.0f;
    int count[V] = {0};
    for (int r = 0; r < 3000; r++) {
        uint32_t t = 0;
        CHECK(kipp_sample_ex(x, V, &p, &a, &t, NULL, 0) == 0, "sample");
        count[t % V]++;
    }
    /* x[5] = 8.4, x[64] = 4.5, x[150] = 9.6 ((37 i mod 101) / 10): top_k 2 keeps 150 and 5, p = e^9.6 : e^8.4 */
    double want150 = 1.0 / (1.0 + exp((double)x[5] - (double)x[150]));
    CHECK(count[150] + count[5] == 3000 && fabs(count[150] / 3000.0 - want150) < 0.03,
          "picks %d %d %d, want share %.3f", count[5], count[64], count[150], want150);
    p.temperature = 0.0f;
    uint32_t t = 0;
    CHECK(kipp_sample_ex(x, V, &p, &a, &t, NULL, 0) == 0 && t == 150, "greedy over the mask: %u", t);
    uint64_t none[4] = {0};
    p.allowed = none;
    CHECK(kipp_sample_ex(x, V, &p, &a, &t, NULL, 0) == KIPP_EINVAL, "an empty mask is refused");
}

int main(void)
{
    RUN(test_verdicts);
    RUN(test_framing);
    RUN(test_refusals);
    RUN(test_tiny_masks);
    RUN(test_sampler_mask);
    if (th_open_model("synthetic-tiny", &model)) return th_finish();
    RUN(test_real_vocab);
    RUN(test_gen_constrained);
    RUN(test_tool_framing);
    kipp_model_close(model);
    return th_finish();
}
