/*
 * test_tokenizer_unicode.c - the tokenizer agrees with HF tokenizers on every
 * code point of planes 0-3 and 14.
 *
 * Golden data: tests/tokenizer_cases/unicode_blocks.txt, made by
 * tools/gen_tokenizer_unicode.py. Each code point X is encoded in the contexts
 * below; the ids are hashed per block of 256 code points (FNV-1a 64 over the id
 * count and the ids, uint32 little-endian). A mismatch names the block; run
 * the tool's contexts on that block in Python to find the code point.
 *
 * The tokenizer is the GGUF's (build/models/synthetic-tiny.gguf, kipp_tokenize)
 * and, independently of the converter, tokenizer.json read directly.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "engine/kipp.h"
#include "engine/internal.h"
#include "engine/tokenizer.h"
#include "engine/tokenizer_impl.h"
#include "tests/test_harness.h"
#include "tests/tokenizer_json.h"

static kipp_model *model;
static kipp_tokenizer *tok_json;
static tj_tokenizer tj;

/* Keep in step with CONTEXTS in tools/gen_tokenizer_unicode.py. */
static const char *const contexts[] = {"X's", "X+W", " X", "X1", " X1"};
#define N_CONTEXTS (sizeof contexts / sizeof contexts[0])

static size_t utf8_put(uint32_t cp, char *o)
{
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | (cp >> 6 & 63)); o[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | (cp >> 12 & 63));
    o[2] = (char)(0x80 | (cp >> 6 & 63)); o[3] = (char)(0x80 | (cp & 63));
    return 4;
}

static uint64_t fnv_u32(uint64_t h, uint32_t v)
{
    for (int i = 0; i < 4; i++) h = (h ^ (v >> (8 * i) & 0xFF)) * 0x100000001B3ull;
    return h;
}

typedef int (*encode_fn)(const char *s, size_t n, uint32_t *ids, size_t cap, size_t *n_out, char *err, size_t errlen);

static int enc_gguf(const char *s, size_t n, uint32_t *ids, size_t cap, size_t *n_out, char *err, size_t errlen)
{
    return kipp_tokenize(model, s, n, 0, ids, cap, n_out, err, errlen);
}

static int enc_json(const char *s, size_t n, uint32_t *ids, size_t cap, size_t *n_out, char *err, size_t errlen)
{
    return kipp_tokenizer_encode(tok_json, s, n, 0, ids, cap, n_out, err, errlen);
}

/* Hash of one block as the tool computes it; returns 0 and sets *ok = 0 on an encode error. */
static uint64_t block_hash(encode_fn enc, uint32_t blk, int *ok)
{
    uint64_t h = 0xCBF29CE484222325ull;
    char text[16], err[256];
    uint32_t ids[16];
    for (uint32_t cp = blk << 8; cp < (blk + 1) << 8; cp++) {
        char x[4];
        size_t xn = utf8_put(cp, x);
        for (size_t c = 0; c < N_CONTEXTS; c++) {
            size_t n = 0, m = 0;
            for (const char *p = contexts[c]; *p; p++) {
                if (*p == 'X') { memcpy(text + n, x, xn); n += xn; }
                else text[n++] = *p;
            }
            if (enc(text, n, ids, 16, &m, err, sizeof err)) {
                fprintf(stderr, "  U+%04X context %zu: %s\n", cp, c, err);
                *ok = 0;
                return 0;
            }
            h = fnv_u32(h, (uint32_t)m);
            for (size_t i = 0; i < m; i++) h = fnv_u32(h, ids[i]);
        }
    }
    return h;
}

static void run_exhaustive(encode_fn enc, const char *what)
{
    FILE *f = fopen("tests/tokenizer_cases/unicode_blocks.txt", "r");
    CHECK(f != NULL, "cannot open tests/tokenizer_cases/unicode_blocks.txt (run from the repo root)");
    if (!f) return;
    char line[256];
    unsigned blocks = 0, bad = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        unsigned blk;
        unsigned long long want;
        if (sscanf(line, "%x %llx", &blk, &want) != 2) {
            CHECK(0, "bad golden line '%s'", line);
            continue;
        }
        int ok = 1;
        uint64_t got = block_hash(enc, blk, &ok);
        blocks++;
        if (!ok || got != want) {
            if (bad < 10) fprintf(stderr, "  %s: block U+%04X..U+%04X differs from HF\n", what, blk << 8, (blk << 8) | 255);
            bad++;
        }
    }
    fclose(f);
    printf("  %s: %u blocks (%u code points x %zu contexts), %u mismatched\n", what, blocks, blocks * 256,
           N_CONTEXTS, bad);
    CHECK(blocks >= 1272, "%s: only %u golden blocks; expected 1272 (planes 0-3, 14)", what, blocks);
    CHECK(bad == 0, "%s: %u of %u blocks differ from HF", what, bad, blocks);
}

static void test_exhaustive_gguf(void)
{
    CHECK(model != NULL, "synthetic-tiny.gguf did not load");
    if (model) run_exhaustive(enc_gguf, "gguf");
}

static void test_exhaustive_json(void) { run_exhaustive(enc_json, "tokenizer.json"); }

/* Minimal cases where a pre-tokenizer can go wrong: code points newer than
 * an older Unicode table, U+180E (not \s), case folding in (?i:'s), mixed
 * whitespace runs; expected ids are HF tokenizers 0.23.3. */
static void test_issue_cases(void)
{
    static const struct {
        const char *text;
        uint32_t ids[8];
        size_t n;
    } cases[] = {
        {"\xF0\xB1\x8D\x90's", {172, 109, 235, 238, 594}, 5},        /* U+31350 (Unicode 15.0) */
        {"\xF0\xAE\xAF\xB0's", {172, 106, 107, 108, 594}, 5},        /* U+2EBF0 (15.1) */
        {"\xE1\xB2\x89's", {128233, 231, 594}, 3},                  /* U+1C89 (16.0) */
        {"\xF0\x93\xA9\xB1+W", {124373, 102, 109, 97883}, 4},       /* U+13A71 (16.0) */
        {" \xE1\xA0\x8E" "1", {86089, 254, 236, 16}, 4},           /* U+180E is not \s */
        {"\xE1\xA0\x8E's", {123970, 236, 6, 82}, 4},                /* ... so "U+180E'" is one pre-token */
        {"'\xC5\xBF", {6, 144815}, 2},                             /* (?i:'s) does not fold U+017F */
        {"a \xE3\x80\x80\n\n  b\t\r\n x", {64, 220, 22441, 271, 220, 293, 4474, 856}, 8},
        {"  \xC2\xA0\xE2\x80\xA8!!\r\r\n", {256, 4102, 378, 101, 2928, 5928}, 6},
        {"I'LL it'Re", {40, 6, 4086, 432, 49427}, 5},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        uint32_t ids[32];
        size_t n = 0;
        char err[256];
        int rc = kipp_tokenizer_encode(tok_json, cases[k].text, strlen(cases[k].text), 0, ids, 32, &n, err, sizeof err);
        int same = rc == 0 && n == cases[k].n && !memcmp(ids, cases[k].ids, n * sizeof *ids);
        CHECK(same, "case %zu: rc %d, %zu ids (first %u); expected %zu ids (first %u)", k, rc, n, n ? ids[0] : 0,
              cases[k].n, cases[k].ids[0]);
    }
}

/* NFC runs utf8proc only on the spans around code points that are not
 * NFC-safe (engine/tokenizer_encode.c, nfc_segment). Random texts over code
 * points that compose, reorder, decompose or block must encode exactly as
 * their whole-text utf8proc NFC does. The pool leaves out the code points
 * where Kipp follows HF rather than utf8proc (KIPP_UC_HF_NFC_BOUNDARY), which
 * test_nfc_hf covers. */
static void test_nfc_spans(void)
{
    static const uint32_t pool[] = {
        'a', 'e', 'A', ' ', '\n', '1', 0x301, 0x323, 0x334, 0x345, 0x5B0, 0x1100, 0x1161, 0x11A8, 0xAC00,
        0x958, 0x93C, 0x915, 0x212B, 0x2126, 0x1E0A, 0xF71, 0xF72, 0xF73, 0xF80, 0x11935, 0x9C7,
        0x9BE, 0xB47, 0xB3E, 0xB57, 0xCC6, 0xCD5, 0x3099, 0x304B, 0x1F600, 0x4E2D, 0xFB2C, 0xE9, 0xFE0F,
        0x1611E, 0x113C2, 0x0, 0x10FFFF, 0x30A6, 0x309A, 0x1B05, 0x1B35, 0x64, 0x307,
    };
    const size_t np = sizeof pool / sizeof pool[0];
    uint64_t x = 0x9E3779B97F4A7C15ull;
    size_t bad = 0;
    for (int t = 0; t < 20000; t++) {
        char text[256];
        size_t n = 0;
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int len = 1 + (int)(x >> 59);
        for (int k = 0; k < len; k++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            n += utf8_put(pool[(x >> 33) % np], text + n);
        }
        text[n] = 0;
        utf8proc_uint8_t *nfc = utf8proc_NFC((const utf8proc_uint8_t *)text);
        /* utf8proc_NFC stops at NUL: compare the prefix before the first one */
        size_t m = strlen(text);
        uint32_t a[256], b[256];
        size_t na = 0, nb = 0;
        char err[256];
        int ra = kipp_tokenizer_encode(tok_json, text, m, 0, a, 256, &na, err, sizeof err);
        int rb = nfc ? kipp_tokenizer_encode(tok_json, (const char *)nfc, strlen((const char *)nfc), 0, b, 256, &nb,
                                             err, sizeof err) : -1;
        if (ra || rb || na != nb || memcmp(a, b, na * sizeof *a)) {
            if (bad < 5) {
                fprintf(stderr, "  text %d differs from its whole-text NFC:", t);
                for (size_t k = 0; k < m; k++) fprintf(stderr, " %02X", (uint8_t)text[k]);
                fprintf(stderr, "\n");
            }
            bad++;
        }
        free(nfc);
    }
    CHECK(bad == 0, "%zu of 20000 random texts encode differently from their utf8proc NFC", bad);
}

/* Keep in step with nfc_probes in tools/gen_unicode_tables.py; X is the code
 * point, F its composition first (the last two only when it has one). */
static const char *const nfc_probes[] = {
    "q\xCC\x81X", "qX\xCC\xB4", "aX\xCC\x81", "a\xCC\x81X", "X\xCC\x81", "aX", "q\xCC\xB4X\xCC\x81",
    "\xD6\xB0X", "X\xD6\xB0", "aX\xCD\x85", "a\xCD\x85X", "FX", "F\xCC\xB4X",
};

static uint64_t hash_ids(uint64_t h, const char *text, size_t n, int *ok)
{
    uint32_t ids[64];
    size_t m = 0;
    char err[256];
    if (kipp_tokenizer_encode(tok_json, text, n, 0, ids, 64, &m, err, sizeof err)) {
        fprintf(stderr, "  encode failed: %s\n", err);
        *ok = 0;
        return h;
    }
    h = fnv_u32(h, (uint32_t)m);
    for (size_t i = 0; i < m; i++) h = fnv_u32(h, ids[i]);
    return h;
}

/* NFC as HF computes it, on every code point that is not NFC-safe: HF ids of
 * its probes, and of random texts over them (tools/gen_tokenizer_unicode.py). */
static void test_nfc_hf(void)
{
    FILE *f = fopen("tests/tokenizer_cases/unicode_nfc.txt", "r");
    CHECK(f != NULL, "cannot open tests/tokenizer_cases/unicode_nfc.txt (run from the repo root)");
    if (!f) return;
    char line[512];
    unsigned cps = 0, texts = 0, bad = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        uint64_t h = 0xCBF29CE484222325ull;
        unsigned long long want;
        int ok = 1;
        if (line[0] == 'T') {
            char text[64], *p = line + 2, *end;
            size_t n = 0;
            for (;;) {
                unsigned long cp = strtoul(p, &end, 16);
                n += utf8_put((uint32_t)cp, text + n);
                if (*end != ',') break;
                p = end + 1;
            }
            if (sscanf(end, " %llx", &want) != 1) { CHECK(0, "bad golden line '%s'", line); continue; }
            h = hash_ids(h, text, n, &ok);
            texts++;
            if (!ok || h != want) {
                if (bad < 10) fprintf(stderr, "  random text %s differs from HF", line);
                bad++;
            }
            continue;
        }
        unsigned x, fcp;
        if (sscanf(line, "%x %x %llx", &x, &fcp, &want) != 3) { CHECK(0, "bad golden line '%s'", line); continue; }
        char xs[4], fs[4];
        size_t xn = utf8_put(x, xs), fn = fcp ? utf8_put(fcp, fs) : 0;
        size_t np = sizeof nfc_probes / sizeof nfc_probes[0] - (fcp ? 0 : 2);
        for (size_t k = 0; k < np; k++) {
            char text[32];
            size_t n = 0;
            for (const char *p = nfc_probes[k]; *p; p++) {
                if (*p == 'X') { memcpy(text + n, xs, xn); n += xn; }
                else if (*p == 'F') { memcpy(text + n, fs, fn); n += fn; }
                else text[n++] = *p;
            }
            h = hash_ids(h, text, n, &ok);
        }
        cps++;
        if (!ok || h != want) {
            if (bad < 10) fprintf(stderr, "  U+%04X: NFC probes differ from HF\n", x);
            bad++;
        }
    }
    fclose(f);
    printf("  NFC: %u code points, %u random texts, %u differ from HF\n", cps, texts, bad);
    CHECK(cps >= 2000 && texts >= 400, "only %u code points and %u texts in the NFC golden data", cps, texts);
    CHECK(bad == 0, "%u NFC golden lines differ from HF", bad);
}

/* Any pattern other than Qwen2's still runs, through PCRE2: the Qwen2 pattern
 * with a redundant last branch must give the native scanner's ids on text
 * where PCRE2's Unicode 15 tables and the generated ones agree. */
static void test_pcre2_fallback(void)
{
    static const char pat[] = KIPP_QWEN2_PATTERN "|\\s+";
    kipp_tokenizer_data d = tj.d;
    d.pre_regex = (kipp_str){pat, sizeof pat - 1};
    kipp_tokenizer *t = NULL;
    char err[256];
    CHECK(kipp_tokenizer_create(&d, &t, err, sizeof err) == 0 && t && !t->native, "fallback create: %s", err);
    static const char *texts[] = {"Hello world, it's 2024!\n\n  x", "naïve café 中文 😀 'LL\t\r\n", "   ", "a\n\nb  c"};
    for (size_t k = 0; t && k < sizeof texts / sizeof texts[0]; k++) {
        uint32_t a[64], b[64];
        size_t na = 0, nb = 0;
        int ra = kipp_tokenizer_encode(t, texts[k], strlen(texts[k]), 0, a, 64, &na, err, sizeof err);
        int rb = kipp_tokenizer_encode(tok_json, texts[k], strlen(texts[k]), 0, b, 64, &nb, err, sizeof err);
        CHECK(ra == 0 && rb == 0 && na == nb && !memcmp(a, b, na * sizeof *a), "text %zu: PCRE2 and native differ", k);
    }
    kipp_tokenizer_destroy(t);
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
    RUN(test_issue_cases);
    RUN(test_nfc_spans);
    RUN(test_nfc_hf);
    RUN(test_pcre2_fallback);
    RUN(test_exhaustive_json);
    RUN(test_exhaustive_gguf);
    kipp_model_close(model);
    kipp_tokenizer_destroy(tok_json);
    tj_free(&tj);
    return th_finish();
}
