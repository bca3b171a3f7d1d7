/*
 * test_tokenizer.c - the native Qwen2 tokenizer against Hugging Face.
 *
 * Oracles (independent of the C code):
 *  - tests/tokenizer_cases/cases.jsonl: ids from HF `tokenizers` and NFC from
 *    Python's unicodedata (tools/gen_tokenizer_cases.py); 100% exact match.
 *  - data/qwen3/tokenizer-cases/qwen2.inp/.out: llama.cpp's HF-made cases.
 * Both run through two builds of the tables: the converted GGUF
 * (kipp_model_load on build/models/synthetic-tiny.gguf) and tokenizer.json
 * read here with jansson (tests/tokenizer_json.h).
 * Bad input (invalid UTF-8, NUL, surrogates, 10 MB lines) is checked against
 * the behaviour documented in docs/TOKENIZER.md.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "tests/test_harness.h"
#include "engine/internal.h"
#include "engine/tokenizer_impl.h"
#include "tests/tokenizer_json.h"

static kipp_tokenizer *tok_json;  /* from tokenizer.json */
static kipp_model *model;         /* from the GGUF; NULL when not loadable */
static tj_tokenizer tj;

/* ---- helpers ---- */

static size_t b64_decode(const char *in, uint8_t *out)
{
    static const char *tab = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    uint32_t acc = 0;
    int bits = 0;
    size_t n = 0;
    for (; *in && *in != '='; in++) {
        const char *p = strchr(tab, *in);
        if (!p) continue;
        acc = acc << 6 | (uint32_t)(p - tab);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[n++] = (uint8_t)(acc >> bits);
        }
    }
    return n;
}

/* Mirror of gen_text() in tools/gen_tokenizer_cases.py. */
static char *gen_text(json_t *gen, size_t *len)
{
    uint64_t x = (uint64_t)json_integer_value(json_object_get(gen, "seed"));
    size_t want = (size_t)json_integer_value(json_object_get(gen, "bytes"));
    json_t *frags = json_object_get(gen, "frags");
    size_t nf = json_array_size(frags), n = 0;
    char *s = malloc(want + 4096);
    while (s && n < want) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        json_t *f = json_array_get(frags, (x >> 33) % nf);
        memcpy(s + n, json_string_value(f), json_string_length(f));
        n += json_string_length(f);
    }
    *len = n;
    return s;
}

static uint64_t fnv64_ids(const uint32_t *ids, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 4; k++) h = (h ^ ((ids[i] >> (8 * k)) & 0xFF)) * 0x100000001b3ull;
    return h;
}

/* Encode with a buffer sized from a first ERANGE call (exercises the retry contract). */
static uint32_t *encode_all(kipp_tokenizer *t, const char *s, size_t n, int flags, size_t *count, int *rc)
{
    char err[256];
    size_t need = 0;
    *rc = kipp_tokenizer_encode(t, s, n, flags, NULL, 0, &need, err, sizeof err);
    if (*rc && *rc != KIPP_ERANGE) {
        fprintf(stderr, "  encode: %s\n", err);
        return NULL;
    }
    uint32_t *ids = malloc((need + 1) * sizeof *ids);
    *rc = kipp_tokenizer_encode(t, s, n, flags, ids, need, count, err, sizeof err);
    if (*rc) fprintf(stderr, "  encode: %s\n", err);
    return ids;
}

static char *decode_all(kipp_tokenizer *t, const uint32_t *ids, size_t n, size_t *len)
{
    char err[256];
    size_t need = 0;
    kipp_tokenizer_decode(t, ids, n, NULL, 0, &need, err, sizeof err);
    char *s = malloc(need + 1);
    if (kipp_tokenizer_decode(t, ids, n, s, need, len, err, sizeof err)) {
        fprintf(stderr, "  decode: %s\n", err);
        *len = 0;
    }
    return s;
}

/* ---- golden cases ---- */

static int check_case(kipp_tokenizer *t, json_t *c, size_t line)
{
    int special = json_is_true(json_object_get(c, "special"));
    json_t *text = json_object_get(c, "text"), *b64 = json_object_get(c, "bytes_b64");
    json_t *gen = json_object_get(c, "gen"), *want = json_object_get(c, "ids");
    const char *tag = json_string_value(json_object_get(c, "tag"));
    char *s = NULL;
    size_t n = 0, got_n = 0;
    int rc, ok = 1;
    if (text) {
        n = json_string_length(text);
        s = malloc(n + 1);
        memcpy(s, json_string_value(text), n);
    } else if (b64) {
        s = malloc(strlen(json_string_value(b64)) + 1);
        n = b64_decode(json_string_value(b64), (uint8_t *)s);
    } else {
        s = gen_text(gen, &n);
    }
    uint32_t *ids = encode_all(t, s, n, special ? KIPP_TOK_SPECIAL : 0, &got_n, &rc);
    if (rc) ok = 0;
    else if (want) {
        ok = got_n == json_array_size(want);
        for (size_t i = 0; ok && i < got_n; i++) ok = ids[i] == json_integer_value(json_array_get(want, i));
    } else {
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)fnv64_ids(ids, got_n));
        json_t *head = json_object_get(c, "head_ids");
        ok = got_n == (size_t)json_integer_value(json_object_get(c, "n_ids"))
             && !strcmp(hex, json_string_value(json_object_get(c, "ids_fnv64")));
        for (size_t i = 0; ok && i < json_array_size(head); i++)
            ok = ids[i] == json_integer_value(json_array_get(head, i));
    }
    if (!ok) fprintf(stderr, "  case line %zu (%s, special=%d): ids differ from HF (%zu ids)\n", line, tag,
                     special, got_n);
    /* decode(encode(x)) == NFC(x); for invalid input NFC of the replaced text */
    size_t dn = 0;
    char *d = rc ? NULL : decode_all(t, ids, got_n, &dn);
    json_t *nfc = json_object_get(c, "nfc");
    int rt = d && (nfc ? dn == json_string_length(nfc) && !memcmp(d, json_string_value(nfc), dn)
                       : dn == (size_t)json_integer_value(json_object_get(c, "nfc_len")));
    if (!rt) fprintf(stderr, "  case line %zu (%s): decode(encode(x)) != NFC(x)\n", line, tag);
    free(d);
    free(ids);
    free(s);
    return ok && rt;
}

static void run_golden(kipp_tokenizer *t, const char *what)
{
    FILE *f = fopen("tests/tokenizer_cases/cases.jsonl", "r");
    CHECK(f != NULL, "cannot open tests/tokenizer_cases/cases.jsonl");
    if (!f) return;
    char *line = NULL;
    size_t cap = 0, n_case = 0, n_ok = 0, n_special = 0, n_plain = 0;
    while (getline(&line, &cap, f) > 0) {
        json_error_t je;
        json_t *c = json_loads(line, JSON_ALLOW_NUL, &je);
        n_case++;
        CHECK(c != NULL, "line %zu is not JSON: %s", n_case, je.text);
        if (!c) continue;
        if (json_is_true(json_object_get(c, "special"))) n_special++; else n_plain++;
        n_ok += (size_t)check_case(t, c, n_case);
        json_decref(c);
    }
    free(line);
    fclose(f);
    printf("  %s: %zu/%zu golden cases exact (%zu special, %zu plain)\n", what, n_ok, n_case, n_special, n_plain);
    CHECK(n_case >= 1000, "only %zu golden cases; expected >= 1000", n_case);
    CHECK(n_ok == n_case, "%zu of %zu golden cases failed", n_case - n_ok, n_case);
}

static void test_golden_json(void) { run_golden(tok_json, "tokenizer.json"); }

static void test_golden_gguf(void)
{
    CHECK(model && model->tok, "synthetic-tiny.gguf did not load; run `make models-test`");
    if (model && model->tok) run_golden(model->tok, "GGUF");
}

/* llama.cpp's qwen2 cases: inputs split by "\n__ggml_vocab_test__\n". */
static void test_llama_cases(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer-cases/qwen2.inp", tj_data_dir());
    FILE *fi = fopen(path, "rb");
    snprintf(path, sizeof path, "%s/tokenizer-cases/qwen2.out", tj_data_dir());
    FILE *fo = fopen(path, "r");
    CHECK(fi && fo, "cannot open %s/tokenizer-cases/qwen2.{inp,out}", tj_data_dir());
    if (!fi || !fo) return;
    static char inp[1 << 16];
    size_t n = fread(inp, 1, sizeof inp - 1, fi);
    inp[n] = 0;
    const char *sep = "\n__ggml_vocab_test__\n";
    char *p = inp, *line = NULL;
    size_t lcap = 0, cases = 0, ok = 0;
    while (*p) {
        char *e = strstr(p, sep);
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (getline(&line, &lcap, fo) <= 0) break;
        size_t got_n;
        int rc;
        uint32_t *ids = encode_all(tok_json, p, len, KIPP_TOK_SPECIAL, &got_n, &rc);
        size_t k = 0;
        int good = rc == 0;
        for (char *q = line, *end; good; q = end) {
            long v = strtol(q, &end, 10);
            if (end == q) break;
            good = k < got_n && ids[k++] == (uint32_t)v;
        }
        good = good && k == got_n;
        if (!good) fprintf(stderr, "  qwen2 case %zu (\"%.*s\") differs\n", cases, (int)(len > 40 ? 40 : len), p);
        ok += (size_t)good;
        cases++;
        free(ids);
        p = e ? e + strlen(sep) : p + len;
    }
    free(line);
    fclose(fi);
    fclose(fo);
    CHECK(cases == 46, "read %zu qwen2 cases; expected 46 (47 pieces, the last empty one after the final separator)", cases);
    CHECK(ok == cases, "%zu of %zu qwen2 cases differ", cases - ok, cases);
}

/* ---- bad input, per docs/TOKENIZER.md ---- */

static int encodes_as(const char *raw, size_t n, const char *as, size_t as_n, int flags)
{
    size_t a_n, b_n;
    int rc1, rc2;
    uint32_t *a = encode_all(tok_json, raw, n, flags, &a_n, &rc1);
    uint32_t *b = encode_all(tok_json, as, as_n, flags, &b_n, &rc2);
    int same = !rc1 && !rc2 && a_n == b_n && !memcmp(a, b, a_n * sizeof *a);
    free(a);
    free(b);
    return same;
}

/* Invalid UTF-8: each maximal ill-formed subpart becomes one U+FFFD. */
static void test_invalid_utf8(void)
{
#define FFFD "\xEF\xBF\xBD"
    static const struct { const char *raw, *as; } cases[] = {
        {"a\x80z", "a" FFFD "z"},
        {"\xC3", FFFD},
        {"\xE2\x82z", FFFD "z"},            /* truncated 3-byte: one U+FFFD */
        {"\xF0\x9F\x98", FFFD},             /* truncated 4-byte at the end */
        {"\xC0\xAF", FFFD FFFD},            /* overlong: C0 is never valid */
        {"\xE0\x80\xAF", FFFD FFFD FFFD},   /* overlong 3-byte */
        {"\xF4\x90\x80\x80", FFFD FFFD FFFD FFFD}, /* above U+10FFFF */
        {"\xFF\xFE", FFFD FFFD},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *clean;
        size_t cn;
        int r = kipp_utf8_sanitize(cases[i].raw, strlen(cases[i].raw), &clean, &cn);
        CHECK(r == 1 && cn == strlen(cases[i].as) && !memcmp(clean, cases[i].as, cn),
              "case %zu: replacement differs from Python's decode('utf-8', 'replace')", i);
        free(clean);
        CHECK(encodes_as(cases[i].raw, strlen(cases[i].raw), cases[i].as, strlen(cases[i].as), KIPP_TOK_SPECIAL),
              "case %zu: invalid input does not encode as its replaced text", i);
    }
}

/* UTF-8-encoded surrogates (CESU-8 style) are ill-formed: three U+FFFD each. */
static void test_surrogates(void)
{
    const char raw[] = "x\xED\xA0\x80y\xED\xB0\x80";
    const char as[] = "x" FFFD FFFD FFFD "y" FFFD FFFD FFFD;
    CHECK(encodes_as(raw, sizeof raw - 1, as, sizeof as - 1, 0), "surrogate bytes do not encode as U+FFFD x3");
    size_t n;
    int rc;
    uint32_t *ids = encode_all(tok_json, raw, sizeof raw - 1, 0, &n, &rc);
    size_t dn;
    char *d = decode_all(tok_json, ids, n, &dn);
    CHECK(!rc && dn == sizeof as - 1 && !memcmp(d, as, dn), "decode does not give the replaced text");
    free(d);
    free(ids);
}

/* NUL is an ordinary character (U+0000), never a terminator. */
static void test_nul(void)
{
    const char s[] = "a\0b\0\0<think>\0";
    size_t n, dn;
    int rc;
    uint32_t *ids = encode_all(tok_json, s, sizeof s - 1, KIPP_TOK_SPECIAL, &n, &rc);
    char *d = decode_all(tok_json, ids, n, &dn);
    CHECK(!rc && dn == sizeof s - 1 && !memcmp(d, s, dn), "NUL bytes do not round-trip");
    int has_think = 0;
    for (size_t i = 0; i < n; i++) has_think |= ids[i] == 151667;
    CHECK(has_think, "<think> after a NUL was not matched");
    free(d);
    free(ids);
}
#undef FFFD

/* Single long lines. The 10 MB line of words is the reported case; a 2 MB
 * single word (heap BPE) and a 2 MB whitespace run (regex backtracking) are
 * the worst shapes, kept at 2 MB so `make test` stays fast (make
 * bench-tokenizer times them at 10 MB). Each must round-trip; the word line
 * must equal the periodic encoding of its period. */
static void test_10mb_lines(void)
{
    const size_t N = 10u << 20;
    char *s = malloc(N);
    static const char *fill[] = {"hello world ", "abcdefghij", " \t "};
    static const size_t len[] = {10u << 20, 2u << 20, 2u << 20};
    for (int k = 0; k < 3; k++) {
        size_t fl = strlen(fill[k]);
        for (size_t i = 0; i < len[k]; i++) s[i] = fill[k][i % fl];
        size_t n, dn;
        int rc;
        uint32_t *ids = encode_all(tok_json, s, len[k], 0, &n, &rc);
        char *d = rc ? NULL : decode_all(tok_json, ids, n, &dn);
        CHECK(!rc && d && dn == len[k] && !memcmp(d, s, len[k]), "long line %d does not round-trip", k);
        if (k == 0 && !rc) { /* [hello] then ([ world][ hello]) repeated, then the tail */
            size_t pn, body = 2 * (N / 12);
            uint32_t *p = encode_all(tok_json, " world hello", 12, 0, &pn, &rc);
            int periodic = !rc && pn == 2 && n >= body;
            for (size_t i = 1; periodic && i < body; i++) periodic = ids[i] == p[(i - 1) % 2];
            CHECK(periodic, "10 MB word line is not the periodic encoding of ' world hello'");
            free(p);
        }
        printf("  line of %zu bytes (\"%s\"...): %zu tokens\n", len[k], k == 2 ? "\\t" : fill[k], n);
        free(d);
        free(ids);
    }
    free(s);
}

/* ---- contracts: buffers, ids, flags, streaming ---- */

static void test_erange_and_errors(void)
{
    char err[256];
    uint32_t ids[2];
    size_t n = 0;
    int rc = kipp_tokenizer_encode(tok_json, "Hello world again", 17, 0, ids, 2, &n, err, sizeof err);
    CHECK(rc == KIPP_ERANGE && n == 3, "cap 2 for 3 tokens: rc %d n %zu; expected ERANGE and n 3", rc, n);
    CHECK(ids[0] == 9707 && ids[1] == 1879, "the first cap ids are written: %u %u", ids[0], ids[1]);
    rc = kipp_tokenizer_encode(tok_json, "x", 1, 4, ids, 2, &n, err, sizeof err);
    CHECK(rc == KIPP_EINVAL && strstr(err, "0x4"), "unknown flag: rc %d '%s'", rc, err);
    uint32_t bad[2] = {9707, KIPP_VOCAB_SIZE};
    char out[64];
    rc = kipp_tokenizer_decode(tok_json, bad, 2, out, sizeof out, &n, err, sizeof err);
    CHECK(rc == KIPP_ERANGE && strstr(err, "151936") && strstr(err, "index 1"), "bad id: rc %d '%s'", rc, err);
    uint32_t pad[3] = {9707, 151669, 151935}; /* padding ids decode to nothing */
    rc = kipp_tokenizer_decode(tok_json, pad, 3, out, sizeof out, &n, err, sizeof err);
    CHECK(rc == 0 && n == 5 && !memcmp(out, "Hello", 5), "padding ids: rc %d n %zu", rc, n);
    rc = kipp_tokenizer_decode(tok_json, pad, 1, out, 3, &n, err, sizeof err);
    CHECK(rc == KIPP_ERANGE && n == 5, "short decode buffer: rc %d n %zu", rc, n);
    uint32_t sp[2] = {151644, 151667};
    rc = kipp_tokenizer_decode(tok_json, sp, 2, out, sizeof out, &n, err, sizeof err);
    CHECK(rc == 0 && n == 19 && !memcmp(out, "<|im_start|><think>", 19), "added tokens decode literally");
}

/* KIPP_TOK_SPECIAL off: added-token text is plain text (no control ids). */
static void test_plain_mode(void)
{
    const char *s = "<|im_start|>user<|im_end|><think></think><tool_call>";
    size_t n;
    int rc;
    uint32_t *ids = encode_all(tok_json, s, strlen(s), 0, &n, &rc);
    int any_added = 0;
    for (size_t i = 0; i < n; i++) any_added |= ids[i] >= 151643;
    CHECK(!rc && !any_added && n > 10, "plain mode produced an added-token id");
    free(ids);
    ids = encode_all(tok_json, s, strlen(s), KIPP_TOK_SPECIAL, &n, &rc);
    static const uint32_t want[] = {151644, 872, 151645, 151667, 151668, 151657};
    CHECK(!rc && n == 6 && !memcmp(ids, want, sizeof want), "special mode: %zu ids", n);
    free(ids);
}

/* Push ids one at a time: every chunk is whole UTF-8, and the concatenation
 * (plus flush) equals the U+FFFD-replaced decode. */
static int stream_matches(kipp_model *m, const uint32_t *ids, size_t n, const char *want, size_t want_n)
{
    char err[256], out[64], *acc = malloc(want_n + 4 * n + 64);
    size_t got = 0, k;
    int ok = 1;
    kipp_detok_stream *s = kipp_detok_stream_create(m);
    for (size_t i = 0; i < n && ok; i++) {
        ok = kipp_detok_stream_push(s, ids[i], out, sizeof out, &k, err, sizeof err) == 0
             && kipp_utf8_valid_prefix(out, k) == k;
        memcpy(acc + got, out, k);
        got += k;
    }
    while (ok) {
        int rc = kipp_detok_stream_flush(s, out, sizeof out, &k);
        memcpy(acc + got, out, k);
        got += k;
        if (rc != KIPP_ERANGE) break;
    }
    ok = ok && got == want_n && !memcmp(acc, want, want_n);
    kipp_detok_stream_destroy(s);
    free(acc);
    return ok;
}

static void test_stream(void)
{
    struct kipp_model m = {0};
    m.tok = tok_json;
    const char *texts[] = {"Hello 👨‍👩‍👧‍👦 world 中文字符 🇯🇵 naïve", "😀😀😀😀", "ok", "<think>\n🤔</think>"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        size_t n;
        int rc;
        uint32_t *ids = encode_all(tok_json, texts[i], strlen(texts[i]), KIPP_TOK_SPECIAL, &n, &rc);
        CHECK(!rc && stream_matches(&m, ids, n, texts[i], strlen(texts[i])), "stream of text %zu differs", i);
        free(ids);
    }
    /* 😀 = F0 9F 98 80 is byte tokens; cut off after 3 bytes: flush gives one U+FFFD */
    uint32_t part[3] = {9707, 75360, 0};
    char b[8];
    kipp_str e = kipp_tokenizer_token_bytes(tok_json, 75360, b, sizeof b);
    CHECK(e.len >= 1 && (uint8_t)e.ptr[0] == 0xF0, "token 75360 should start a 4-byte sequence");
    part[2] = 0; /* '!' */
    CHECK(stream_matches(&m, part, 2, "Hello\xEF\xBF\xBD", 8), "truncated emoji: flush should emit U+FFFD");
    CHECK(stream_matches(&m, part, 3, "Hello\xEF\xBF\xBD!", 9), "broken sequence then '!'");
    char err[64], out[64];
    size_t k;
    kipp_detok_stream *st = kipp_detok_stream_create(&m);
    CHECK(kipp_detok_stream_push(st, KIPP_VOCAB_SIZE, out, 64, &k, err, 64) == KIPP_ERANGE, "id >= vocab must be ERANGE");
    kipp_detok_stream_destroy(st);
    CHECK(kipp_detok_stream_create(NULL) == NULL, "stream on a NULL model must fail");
}

/* The word cache is shared by concurrent encode calls: two threads encoding
 * the same texts must each get the single-threaded ids. */
static const char *mt_text[] = {"the cat sat on the mat again and again", "naïve café résumé", "中文字符 日本語",
                                "x = foo(bar, baz) + 42;", "Hello, world! How are you?"};
static uint32_t mt_want[5][64];
static size_t mt_n[5];

static void *mt_worker(void *arg)
{
    size_t bad = 0, n;
    uint32_t ids[64];
    char err[128];
    for (int it = 0; it < 2000; it++) {
        size_t k = (size_t)(it + (intptr_t)arg) % 5;
        if (kipp_tokenizer_encode(tok_json, mt_text[k], strlen(mt_text[k]), 0, ids, 64, &n, err, sizeof err)
            || n != mt_n[k] || memcmp(ids, mt_want[k], n * sizeof *ids))
            bad++;
    }
    return (void *)bad;
}

static void test_threads(void)
{
    char err[128];
    for (size_t k = 0; k < 5; k++)
        CHECK(!kipp_tokenizer_encode(tok_json, mt_text[k], strlen(mt_text[k]), 0, mt_want[k], 64, &mt_n[k], err,
                                     sizeof err), "encode %zu: %s", k, err);
    pthread_t th[2];
    void *bad[2];
    for (intptr_t i = 0; i < 2; i++) pthread_create(&th[i], NULL, mt_worker, (void *)i);
    for (int i = 0; i < 2; i++) pthread_join(th[i], &bad[i]);
    CHECK(!bad[0] && !bad[1], "concurrent encodes differed %zu + %zu times", (size_t)bad[0], (size_t)bad[1]);
}

/* Malformed tables are refused with the bad entry named. */
static void test_create_errors(void)
{
    char err[256];
    kipp_tokenizer *t = NULL;
    kipp_tokenizer_data d = tj.d;
    kipp_str merges[2] = {{"a", 1}, {"Ġ Ġ", 4}};
    d.merges = merges;
    d.n_merges = 1;
    CHECK(kipp_tokenizer_create(&d, &t, err, sizeof err) == KIPP_EFORMAT && strstr(err, "merge 0"),
          "merge without a space: '%s'", err);
    d = tj.d;
    d.pre_regex = (kipp_str){"(unclosed", 9};
    CHECK(kipp_tokenizer_create(&d, &t, err, sizeof err) == KIPP_EFORMAT && strstr(err, "pre_regex"),
          "bad regex: '%s'", err);
    d = tj.d;
    d.n_tokens = 100;
    CHECK(kipp_tokenizer_create(&d, &t, err, sizeof err) == KIPP_EFORMAT && strstr(err, "100"),
          "too few tokens: '%s'", err);
    kipp_str *toks = malloc(tj.d.n_tokens * sizeof *toks);
    memcpy(toks, tj.d.tokens, tj.d.n_tokens * sizeof *toks);
    toks[500] = (kipp_str){"a b", 3};
    d = tj.d;
    d.tokens = toks;
    CHECK(kipp_tokenizer_create(&d, &t, err, sizeof err) == KIPP_EFORMAT && strstr(err, "token 500"),
          "non-byte-level token: '%s'", err);
    free(toks);
    CHECK(t == NULL, "no tokenizer is returned on error");
}

int main(void)
{
    char err[512];
    if (tj_load(&tj, tj_data_dir()) || kipp_tokenizer_create(&tj.d, &tok_json, err, sizeof err)) {
        fprintf(stderr, "reference tokenizer from %s failed: %s\n", tj_data_dir(), err);
        return 1;
    }
    char path[600];
    snprintf(path, sizeof path, "%s/synthetic-tiny.gguf", th_models_dir());
    if (kipp_model_load(path, &model, err, sizeof err)) fprintf(stderr, "  %s: %s\n", path, err);
    RUN(test_golden_json);
    RUN(test_golden_gguf);
    RUN(test_llama_cases);
    RUN(test_invalid_utf8);
    RUN(test_surrogates);
    RUN(test_nul);
    RUN(test_10mb_lines);
    RUN(test_erange_and_errors);
    RUN(test_plain_mode);
    RUN(test_stream);
    RUN(test_threads);
    RUN(test_create_errors);
    kipp_model_close(model);
    kipp_tokenizer_destroy(tok_json);
    tj_free(&tj);
    return th_finish();
}
