/*
 * test_grammar_budget.c - constrained output that ends within its token budget
 * (engine/grammar_budget.c, issue 51: a forced call cut by max_tokens).
 *
 * The shortest completion of a state (its text, the least in byte order
 * among the shortest) and its need in tokens are checked against values
 * worked out by hand on a small vocabulary; on the real Qwen3 vocabulary of
 * synthetic-tiny, random walks under the tightest budget (the start's need)
 * always end, with the end of turn, within it, and no state's shortest
 * completion passes the grammar's worst; far from the budget the mask is the
 * plain one, bit for bit; through kipp_gen, a free string still closes in a
 * valid document within max_tokens or the session's room.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "engine/grammar_impl.h"
#include "tests/test_harness.h"

static kipp_model *model;

/* The hand vocabulary: ids 0..255 the single bytes, then these, then the framing tokens and the end of turn. */
static const char *const hand_words[] = {"{\"", "\":", "\",\"", "name", "arguments", "}}", "\":\"", "\n</"};
#define N_WORDS (sizeof hand_words / sizeof hand_words[0])
#define ID_OPEN (256 + N_WORDS)  /* <tool_call>, added */
#define ID_CLOSE (ID_OPEN + 1)   /* </tool_call>, added */
#define ID_EOT (ID_OPEN + 2)     /* <|im_end|>, special */

static kipp_grammar *hand_grammar(const char *schema, int framed)
{
    static char bytes[256];
    kipp_str tok[ID_EOT + 1];
    uint8_t added[ID_EOT + 1] = {0};
    for (int i = 0; i < 256; i++) bytes[i] = (char)i, tok[i] = (kipp_str){bytes + i, 1};
    for (size_t i = 0; i < N_WORDS; i++) tok[256 + i] = (kipp_str){hand_words[i], strlen(hand_words[i])};
    tok[ID_OPEN] = (kipp_str){"<tool_call>", 11}, tok[ID_CLOSE] = (kipp_str){"</tool_call>", 12};
    tok[ID_EOT] = (kipp_str){"<|im_end|>", 10};
    added[ID_OPEN] = added[ID_CLOSE] = 1, added[ID_EOT] = 2;
    uint32_t stop = ID_EOT;
    char err[512] = "";
    kipp_vocab_index *vi = NULL;
    kipp_grammar *g = NULL;
    CHECK(kipp_vocab_index_build(tok, added, ID_EOT + 1, ID_EOT + 1, &stop, 1, &vi, err, sizeof err) == 0, "%s", err);
    kipp_grammar_spec spec = {.schema = schema};
    if (framed) spec.prefix = "<tool_call>\n", spec.suffix = "\n</tool_call>", spec.separator = "\n", spec.max_count = 2;
    CHECK(vi && kipp_grammar_create_vi(vi, 1, &spec, &g, err, sizeof err) == 0, "%s: %s", schema, err);
    return g;
}

/* After feeding text: the shortest completion is want, and (want_need > 0) the need is want_need tokens. */
static void expect(kipp_grammar *g, const char *text, const char *want, uint32_t want_need)
{
    kipp_grammar_matcher *m = kipp_grammar_matcher_create(g);
    char got[512];
    CHECK(kipp_grammar_matcher_feed(m, text, strlen(text)) == 0, "feed %s", text);
    size_t n = kipp_grammar_matcher_shortest(m, got, sizeof got);
    CHECK(n == strlen(want) && !memcmp(got, want, n), "after [%s]: shortest [%.*s] (%zu bytes), want [%s]", text,
          (int)(n < sizeof got ? n : 0), got, n, want);
    uint32_t need = kipp_grammar_matcher_need(m);
    CHECK(!want_need || need == want_need, "after [%s]: need %u tokens, want %u", text, need, want_need);
    kipp_grammar_matcher_destroy(m);
}

#define TOOL "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"f\"},\"arguments\":{\"type\":\"object\"," \
             "\"properties\":{\"q\":{\"type\":\"string\",\"maxLength\":4},\"n\":{\"type\":\"integer\"},\"u\":" \
             "{\"enum\":[\"cc\",\"b\",3]}},\"required\":[\"q\",\"u\"]}},\"required\":[\"name\",\"arguments\"]," \
             "\"additionalProperties\":false}"

/* A forced call's framing and arguments, segmented by hand (| between tokens; EOT the end of turn). */
static void test_tool_call_needs(void)
{
    kipp_grammar *g = hand_grammar(TOOL, 1);
    if (!g) return;
    /* <tool_call>|\n|{"|name|":"|f|","|arguments|":|{"|q|":"|","|u|":|3|}}|\n|</tool_call>|EOT: 20 */
    expect(g, "", "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"q\":\"\",\"u\":3}}\n</tool_call>", 20);
    /* \n|{"|... : 18 after the added token; with "<tool" spelled by bytes the rest is "_call>" (6) + 18 */
    expect(g, "<tool_call>", "\n{\"name\":\"f\",\"arguments\":{\"q\":\"\",\"u\":3}}\n</tool_call>", 19);
    expect(g, "<tool", "_call>\n{\"name\":\"f\",\"arguments\":{\"q\":\"\",\"u\":3}}\n</tool_call>", 25);
    /* ","|u|":|3|}}|\n|</tool_call>|EOT */
    expect(g, "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"q\":\"ab", "\",\"u\":3}}\n</tool_call>", 8);
    /* 0|,|"|u|":|3|}}|\n|</tool_call>|EOT: a digit after '-', then the required "u" */
    expect(g, "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"q\":\"ab\",\"n\":-", "0,\"u\":3}}\n</tool_call>", 10);
    /* 0|0|","|u|":|3|}}|\n|</tool_call>|EOT: two hex digits of a \u escape */
    expect(g, "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"q\":\"\\u00", "00\",\"u\":3}}\n</tool_call>", 10);
    /* inside the enum's "cc": c|"|}}|\n|</tool_call>|EOT */
    expect(g, "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"q\":\"\",\"u\":\"c", "c\"}}\n</tool_call>", 6);
    /* the call closed: \n|</tool_call>|EOT, or with "\n</" spelled by its token: \n</|t|o|o|l|_|c|a|l|l|>: more */
    expect(g, "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"q\":\"\",\"u\":3}}", "\n</tool_call>", 3);
    /* the added token spells only framing text: inside it, ordinary bytes: l|>|EOT */
    expect(g, "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"q\":\"\",\"u\":3}}\n</tool_ca", "ll>", 4);
    /* complete: only the end of turn; after a separator, a whole call again (20 - 1: no "<tool_call>" yet...) */
    expect(g, "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"q\":\"\",\"u\":3}}\n</tool_call>", "", 1);
    expect(g, "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"q\":\"\",\"u\":3}}\n</tool_call>\n",
           "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"q\":\"\",\"u\":3}}\n</tool_call>", 20);
    kipp_grammar_destroy(g);
}

/* Shortest texts of the other node kinds and phases, the least in byte order where lengths tie. */
static void test_shortest_texts(void)
{
    static const struct {
        const char *schema, *text, *want;
    } cases[] = {
        {"{\"enum\":[\"b\",\"a\",\"ccc\"]}", "", "\"a\""},
        {"{\"anyOf\":[{\"const\":\"y\"},{\"const\":\"x\"},{\"type\":\"integer\"}]}", "", "0"},
        {"{\"anyOf\":[{\"const\":\"y\"},{\"const\":\"x\"}]}", "", "\"x\""},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2}", "", "[0,0]"},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2}", "[5", ",0]"},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2}", "[5,", "0]"},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2}", "[5,6", "]"},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2}", "[5,6,", "0]"},
        {"{\"type\":\"string\",\"minLength\":3}", "\"a", "  \""},
        {"{\"type\":\"string\",\"minLength\":3}", "\"\xE0", "\xA0\x80  \""},
        {"{\"type\":\"string\"}", "\"\xF0", "\x90\x80\x80\""},
        {"{\"type\":\"string\"}", "\"\\", "\"\""},
        {"{\"type\":\"string\"}", "\"\\ud", "000\""},
        {"{\"type\":\"number\"}", "1.", "0"},
        {"{\"type\":\"number\"}", "1e-", "0"},
        {"{\"type\":\"number\"}", "12", ""},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"c\":{\"type\":\"integer\"},"
         "\"b\":{\"type\":\"string\"}}}", "{", "}"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"c\":{\"type\":\"integer\"},"
         "\"b\":{\"type\":\"string\"}}}", "{\"a\":1,", "\"c\":0}"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"d\":{\"type\":\"integer\"},"
         "\"c\":{\"type\":\"integer\"}}}", "{\"a\":1,", "\"c\":0}"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"boolean\"}},"
         "\"required\":[\"b\"]}", "{ ", "\"b\":true}"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":[\"boolean\",\"null\"]}},"
         "\"required\":[\"a\",\"b\"]}", "{\"a\"", ":0,\"b\":null}"},
        {NULL, "", "{}"},
        {NULL, "{\"k\"", ":0}"},
        {NULL, "{\"k\":[{", "}]}"},
        {NULL, "{\"k\":[1,", "0]}"},
        {NULL, "{\"k\":t", "rue}"},
        {"{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"string\",\"maxLength\":2},\"k\":"
         "{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"},\"minItems\":1}},\"required\":[\"v\"]}},"
         "\"$ref\":\"#/$defs/n\"}", "{\"v\":\"\",\"k\":[", "{\"v\":\"\"}]}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kipp_grammar *g = hand_grammar(cases[i].schema, 0);
        if (!g) continue;
        expect(g, cases[i].text, cases[i].want, 0);
        kipp_grammar_destroy(g);
    }
}

/* The vocabulary's own spelling: "\n</" is one token, so "\n</tool_call>" spelled without the added token
 * costs \n</|t|o|o|l|_|c|a|l|l|> (11), with it \n|</tool_call> (2); a JSON document has no framing: the
 * bytes after "<" are ordinary. */
static void test_spelling(void)
{
    kipp_grammar *g = hand_grammar("{\"enum\":[\"\\n</tool_call>\"]}", 0);
    if (!g) return;
    /* "|\n</|t|o|o|l|_|c|a|l|l|>|\\n"... the literal is the JSON text "\"\\n</tool_call>\"": a backslash and n */
    expect(g, "", "\"\\n</tool_call>\"", 17);
    kipp_grammar_destroy(g);
    g = hand_grammar("{\"enum\":[\"a\"]}", 1);
    if (!g) return;
    expect(g, "<tool_call>\n\"a\"", "\n</tool_call>", 3);
    expect(g, "<tool_call>\n\"a\"\n", "</tool_call>", 2);
    expect(g, "<tool_call>\n\"a\"\n<", "/tool_call>", 12);
    kipp_grammar_destroy(g);
}

/* ---- the real vocabulary ---- */

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

static kipp_grammar *real_grammar(const char *schema, int framed)
{
    char err[512] = "";
    kipp_grammar_spec spec = {.schema = schema};
    if (framed) spec.prefix = "<tool_call>\n", spec.suffix = "\n</tool_call>", spec.separator = "\n", spec.max_count = 4;
    kipp_grammar *g = NULL;
    CHECK(kipp_grammar_create(model, &spec, &g, err, sizeof err) == 0, "%s: %s", schema ? schema : "(null)", err);
    return g;
}

/* A random walk under budget tokens (the end of turn counted): each step a random allowed token; where the
 * documents are complete, a coin flip may take the end of turn. Returns the tokens taken (the end of turn included) or 0 when it did
 * not end; every state's shortest completion is checked against the grammar's worst. */
static uint32_t walk_budget(kipp_grammar *g, uint32_t budget, uint64_t seed, int *far_same)
{
    kipp_grammar_matcher *m = kipp_grammar_matcher_create(g);
    const kipp_vocab_index *vi = g->vi;
    uint32_t words = (vi->vocab + 63) / 64, *ids = malloc(vi->vocab * sizeof *ids), used = 0;
    uint64_t s = seed * 0x9E3779B97F4A7C15ull | 1;
    char text[KG_CANON_MAX];
    int eot_taken = 0;
    for (; used < budget; used++) {
        size_t sl = kipp_grammar_matcher_shortest(m, text, sizeof text);
        CHECK(sl <= g->worst, "shortest completion of %zu bytes, past the worst %u", sl, g->worst);
        uint32_t n = 0, k = 0;
        const uint64_t *far = kipp_grammar_matcher_mask(m, NULL);
        uint64_t far_copy[(152000 + 63) / 64];
        if (words <= sizeof far_copy / 8) memcpy(far_copy, far, words * 8);
        const uint64_t *b = kipp_grammar_matcher_mask_budget(m, g->worst + 2, NULL);
        *far_same &= words <= sizeof far_copy / 8 && !memcmp(b, far_copy, words * 8);
        b = kipp_grammar_matcher_mask_budget(m, budget - used, &n);
        CHECK(b && n > 0, "step %u: an empty mask", used);
        if (!b || !n) break;
        for (uint32_t i = 0; i < vi->vocab; i++)
            if (b[i >> 6] >> (i & 63) & 1) ids[k++] = i;
        uint32_t pick = ids[rng_next(&s) % k];
        int eot = pick == vi->stop_ids[0] || (vi->n_stop > 1 && pick == vi->stop_ids[1]);
        if (eot || (kipp_grammar_matcher_complete(m) && rng_next(&s) % 4 == 0)) {
            CHECK(kipp_grammar_matcher_complete(m), "the end of turn before the end");
            used++, eot_taken = 1;
            break;
        }
        CHECK(kipp_grammar_matcher_accept(m, pick) == 0, "accept %u", pick);
    }
    int ended = kipp_grammar_matcher_complete(m);
    kipp_grammar_matcher_destroy(m);
    free(ids);
    return ended && eot_taken && used <= budget ? used : 0;
}

#define BOOK "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"book\"},\"arguments\":{\"type\":\"object\"," \
             "\"properties\":{\"count\":{\"type\":\"integer\"},\"unit\":{\"enum\":[\"c\",\"f\",3]},\"where\":{\"type\":" \
             "\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":12},\"floor\":{\"type\":\"integer\"}," \
             "\"open\":{\"type\":[\"boolean\",\"null\"]}},\"required\":[\"city\",\"open\"]}},\"required\":[\"count\"," \
             "\"unit\",\"where\"]}},\"required\":[\"name\",\"arguments\"],\"additionalProperties\":false}"

/* Under the tightest budget the walks still end within it; far from it the mask is the plain one. */
static void test_tight_budget_walks(void)
{
    static const struct {
        const char *schema;
        int framed;
    } cases[] = {
        {BOOK, 1},
        {"{\"anyOf\":[" BOOK ",{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"ping\"},\"arguments\":"
         "{\"type\":\"object\",\"properties\":{},\"additionalProperties\":false}},\"required\":[\"name\","
         "\"arguments\"],\"additionalProperties\":false}]}", 1},
        {"{\"type\":\"object\",\"properties\":{\"q\":{\"type\":\"string\"},\"tags\":{\"type\":\"array\",\"items\":"
         "{\"type\":\"string\",\"minLength\":2},\"minItems\":2}},\"required\":[\"q\",\"tags\"]}", 0},
        {"{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},"
         "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":3}},\"required\":[\"name\","
         "\"kids\"]}},\"$ref\":\"#/$defs/node\"}", 0}, /* the README's recursive schema */
        {NULL, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        kipp_grammar *g = real_grammar(cases[c].schema, cases[c].framed);
        if (!g) continue;
        kipp_grammar_matcher *m = kipp_grammar_matcher_create(g);
        uint32_t start = kipp_grammar_matcher_need(m);
        kipp_grammar_matcher_destroy(m);
        CHECK(start > 1 && start < 64, "case %zu: the start needs %u tokens", c, start);
        int far_same = 1;
        for (uint64_t seed = 1; seed <= 12; seed++) {
            uint32_t budget = start + (uint32_t)(seed % 3) * 3; /* the tightest, and a little room */
            uint32_t used = walk_budget(g, budget, seed, &far_same);
            CHECK(used > 0, "case %zu seed %llu: did not end within %u tokens", c, (unsigned long long)seed, budget);
        }
        CHECK(far_same, "case %zu: the mask at budget worst + 2 differs from the plain one", c);
        kipp_grammar_destroy(g);
    }
}

/* One generation over g at temperature 1 (seed): its finish, token count and text; max_tokens 0 = until the
 * session of capacity cap is full; prompt: n_prompt copies of one token. */
static int gen_run(kipp_grammar *g, uint32_t max_tokens, uint32_t cap, uint32_t n_prompt, uint64_t seed,
                   uint32_t *n_gen, char *text, size_t text_cap)
{
    char err[512] = "";
    uint32_t prompt[64];
    for (uint32_t i = 0; i < n_prompt && i < 64; i++) prompt[i] = 1;
    kipp_gen_options o = {.sp = kipp_sample_params_default(), .max_tokens = max_tokens, .grammar = g, .seed = seed};
    o.sp.temperature = 1.0f;
    kipp_session *s = NULL;
    kipp_gen *gen = NULL;
    int rc = kipp_session_create(model, cap, &s, err, sizeof err);
    if (!rc) rc = kipp_gen_create(model, s, prompt, n_prompt, &o, &gen, err, sizeof err);
    while (!rc && !kipp_gen_finished(gen)) {
        kipp_batch_item it;
        kipp_gen_event ev;
        rc = kipp_gen_next(gen, 64, &it, err, sizeof err);
        if (!rc) rc = kipp_eval_batch(model, &it, 1, err, sizeof err);
        if (!rc) rc = kipp_gen_advance(gen, 0.001, &ev, err, sizeof err);
    }
    CHECK(rc == 0, "%s", err);
    const char *t = "";
    size_t tl = 0;
    kipp_gen_text(gen, &t, &tl, NULL);
    snprintf(text, text_cap, "%.*s", (int)tl, t);
    *n_gen = kipp_gen_generated(gen);
    int fin = rc ? -1 : kipp_gen_finished(gen);
    kipp_gen_destroy(gen);
    kipp_session_destroy(s);
    return fin;
}

/* Through kipp_gen: a free string (random weights rarely close one) still ends in a valid document within
 * max_tokens = the start's need, and within a session whose room is just the need (max_tokens 0); one
 * token less cannot hold it: "length" (or "full"), as without the rule. */
static void test_gen_within_budget(void)
{
    kipp_grammar *g = real_grammar("{\"type\":\"object\",\"properties\":{\"q\":{\"type\":\"string\"}},"
                                   "\"required\":[\"q\"]}", 0);
    if (!g) return;
    kipp_grammar_matcher *m = kipp_grammar_matcher_create(g);
    uint32_t need = kipp_grammar_matcher_need(m) + 6, n = 0; /* room for 6 tokens of the string */
    kipp_grammar_matcher_destroy(m);
    char text[4096];
    for (uint64_t seed = 1; seed <= 4; seed++) {
        int fin = gen_run(g, need, 256, 4, seed, &n, text, sizeof text);
        json_t *j = json_loads(text, 0, NULL);
        CHECK(fin == KIPP_FIN_STOP && n < need && json_is_string(json_object_get(j, "q")),
              "max_tokens %u, seed %llu: finish %d after %u tokens: %s", need, (unsigned long long)seed, fin, n, text);
        json_decref(j);
        /* the session's room: capacity 40 with a 40 - need + 1 token prompt leaves need tokens to sample */
        fin = gen_run(g, 0, 40, 40 - need + 1, seed, &n, text, sizeof text);
        j = json_loads(text, 0, NULL);
        CHECK(fin == KIPP_FIN_STOP && n < need && json_is_string(json_object_get(j, "q")),
              "room %u, seed %llu: finish %d after %u tokens: %s", need, (unsigned long long)seed, fin, n, text);
        json_decref(j);
    }
    int fin = gen_run(g, 2, 256, 4, 1, &n, text, sizeof text);
    CHECK(fin == KIPP_FIN_LENGTH && n == 2, "max_tokens 2 (below the need): finish %d after %u tokens", fin, n);
    kipp_grammar_destroy(g);
}

int main(void)
{
    RUN(test_tool_call_needs);
    RUN(test_shortest_texts);
    RUN(test_spelling);
    if (th_open_model("synthetic-tiny", &model)) return th_finish();
    RUN(test_tight_budget_walks);
    RUN(test_gen_within_budget);
    kipp_model_close(model);
    return th_finish();
}
