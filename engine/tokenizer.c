/*
 * tokenizer.c - tables and decoding of the native Qwen2Tokenizer byte-level
 * BPE (seed 000, "Tokenizer"; GPT-2 byte-level BPE, Radford et al. 2019).
 *
 * Built from kipp_tokenizer_data, i.e. views into the GGUF mmap
 * (docs/FORMAT.md). Nothing is copied: the vocab hash holds ids and compares
 * through the views, the merge hash holds id pairs. Encoding lives in
 * tokenizer_encode.c; behaviour is documented in docs/TOKENIZER.md.
 */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "engine/internal.h"
#include "engine/tokenizer_impl.h"

#define MAX_TOKEN_BYTES 4096u  /* longest token string accepted from a file */

/* GPT-2 bytes_to_unicode(): printable Latin-1 bytes map to themselves, the
 * other 68 bytes to 256, 257, ... in byte order. */
static uint32_t byte_to_cp(unsigned b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return b;
    unsigned n = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
    return 256 + n;
}

static uint64_t hash_bytes(const char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64 */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static size_t pow2_at_least(size_t n)
{
    size_t p = 1;
    while (p < n) p <<= 1;
    return p;
}

/* Id of the token whose string is p[n], or -1. */
static int64_t vocab_find(const kipp_tokenizer *t, const char *p, size_t n)
{
    for (uint64_t h = hash_bytes(p, n);; h++) {
        uint32_t v = t->vocab_slot[h & t->vocab_mask];
        if (!v) return -1;
        kipp_str s = t->tokens[v - 1];
        if (s.len == n && !memcmp(s.ptr, p, n)) return v - 1;
    }
}

static int build_vocab(kipp_tokenizer *t, char *err, size_t errlen)
{
    t->vocab_mask = pow2_at_least(t->n_tokens * 2) - 1;
    t->vocab_slot = calloc(t->vocab_mask + 1, sizeof *t->vocab_slot);
    if (!t->vocab_slot) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for the vocab hash");
    for (size_t id = 0; id < t->n_tokens; id++) {
        kipp_str s = t->tokens[id];
        if (s.len == 0 || s.len > MAX_TOKEN_BYTES || !s.ptr)
            return kipp_err(err, errlen, KIPP_EFORMAT,
                            "tokenizer token %zu has length %llu; expected 1..%u bytes", id,
                            (unsigned long long)s.len, MAX_TOKEN_BYTES);
        if (vocab_find(t, s.ptr, s.len) >= 0)
            return kipp_err(err, errlen, KIPP_EFORMAT,
                            "tokenizer token %zu repeats the string of an earlier token; expected unique tokens", id);
        for (uint64_t h = hash_bytes(s.ptr, s.len);; h++)
            if (!t->vocab_slot[h & t->vocab_mask]) {
                t->vocab_slot[h & t->vocab_mask] = (uint32_t)id + 1;
                break;
            }
    }
    return KIPP_OK;
}

/* Every non-added token must be a string of byte-level code points. */
static int check_byte_level(const kipp_tokenizer *t, size_t id, char *err, size_t errlen)
{
    kipp_str s = t->tokens[id];
    const uint8_t *p = (const uint8_t *)s.ptr;
    for (size_t i = 0; i < s.len;) {
        uint32_t cp;
        if (p[i] < 0x80) cp = p[i++];
        else if ((p[i] & 0xE0) == 0xC0 && i + 1 < s.len && (p[i + 1] & 0xC0) == 0x80) {
            cp = (uint32_t)(p[i] & 0x1F) << 6 | (p[i + 1] & 0x3F);
            i += 2;
        } else cp = UINT32_MAX;
        if (cp >= 324 || t->cp_byte[cp] < 0)
            return kipp_err(err, errlen, KIPP_EFORMAT,
                            "tokenizer token %zu contains a character outside the GPT-2 byte-level "
                            "alphabet; expected only the 256 byte-level code points", id);
    }
    return KIPP_OK;
}

static int build_bytes(kipp_tokenizer *t, char *err, size_t errlen)
{
    memset(t->cp_byte, 0xFF, sizeof t->cp_byte);
    for (unsigned b = 0; b < 256; b++) t->cp_byte[byte_to_cp(b)] = (int16_t)b;
    for (unsigned b = 0; b < 256; b++) {
        uint32_t cp = byte_to_cp(b);
        char u[2];
        size_t n = 1;
        if (cp < 0x80) u[0] = (char)cp;
        else { u[0] = (char)(0xC0 | cp >> 6); u[1] = (char)(0x80 | (cp & 0x3F)); n = 2; }
        int64_t id = vocab_find(t, u, n);
        if (id < 0 || t->is_added[id])
            return kipp_err(err, errlen, KIPP_EFORMAT,
                            "tokenizer has no single-byte token for byte 0x%02x; expected all 256", b);
        t->byte_id[b] = (uint32_t)id;
    }
    for (size_t id = 0; id < t->n_tokens; id++) {
        if (t->is_added[id]) continue;
        int rc = check_byte_level(t, id, err, errlen);
        if (rc) return rc;
    }
    return KIPP_OK;
}

static int parse_merge(const kipp_tokenizer *t, size_t i, kipp_str m, uint32_t *l, uint32_t *r,
                       uint32_t *res, char *buf, char *err, size_t errlen)
{
    const char *sp = m.ptr ? memchr(m.ptr, ' ', m.len) : NULL;
    if (!sp || sp == m.ptr || sp == m.ptr + m.len - 1 || memchr(sp + 1, ' ', m.len - (size_t)(sp - m.ptr) - 1)
        || m.len - 1 > MAX_TOKEN_BYTES)
        return kipp_err(err, errlen, KIPP_EFORMAT,
                        "tokenizer merge %zu is not \"left right\" with one space; expected two tokens", i);
    size_t nl = (size_t)(sp - m.ptr), nr = m.len - nl - 1;
    int64_t a = vocab_find(t, m.ptr, nl), b = vocab_find(t, sp + 1, nr);
    memcpy(buf, m.ptr, nl);
    memcpy(buf + nl, sp + 1, nr);
    int64_t c = vocab_find(t, buf, nl + nr);
    if (a < 0 || b < 0 || c < 0)
        return kipp_err(err, errlen, KIPP_EFORMAT,
                        "tokenizer merge %zu (\"%.*s\") names a %s not in the vocabulary", i,
                        (int)(m.len > 64 ? 64 : m.len), m.ptr,
                        c < 0 && a >= 0 && b >= 0 ? "merged token" : "token");
    *l = (uint32_t)a; *r = (uint32_t)b; *res = (uint32_t)c;
    return KIPP_OK;
}

static int build_merges(kipp_tokenizer *t, const kipp_tokenizer_data *d, char *err, size_t errlen)
{
    size_t cap = pow2_at_least(d->n_merges + d->n_merges / 2 + 2); /* load <= 2/3: 4 MiB for Qwen */
    t->merge_mask = cap - 1;
    t->merge_shift = 64;
    for (size_t c = cap; c > 1; c >>= 1) t->merge_shift--;
    t->merge = calloc(cap, sizeof *t->merge);
    char *buf = malloc(MAX_TOKEN_BYTES * 2);
    int rc = KIPP_OK;
    if (!t->merge || !buf)
        rc = kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for %zu merges", d->n_merges);
    for (size_t i = 0; i < d->n_merges && !rc; i++) {
        uint32_t a = 0, b = 0, c = 0;
        rc = parse_merge(t, i, d->merges[i], &a, &b, &c, buf, err, errlen);
        if (rc) break;
        if (kipp_tok_merge_find(t, a, b) != UINT64_MAX) {
            rc = kipp_err(err, errlen, KIPP_EFORMAT,
                          "tokenizer merge %zu repeats an earlier merge; expected unique pairs", i);
            break;
        }
        uint64_t key = ((uint64_t)a << 32 | b) + 1;
        for (uint64_t h = (key * 0x9E3779B97F4A7C15ull) >> t->merge_shift;; h++)
            if (!t->merge[h & t->merge_mask].key) {
                t->merge[h & t->merge_mask].key = key;
                t->merge[h & t->merge_mask].val = (uint64_t)i << 32 | c;
                break;
            }
    }
    t->n_merges = d->n_merges;
    free(buf);
    return rc;
}

static int build_added(kipp_tokenizer *t, const kipp_tokenizer_data *d, char *err, size_t errlen)
{
    if (d->n_added > KIPP_TOK_MAX_ADDED)
        return kipp_err(err, errlen, KIPP_EFORMAT, "tokenizer has %zu added tokens; expected at most %u",
                        d->n_added, KIPP_TOK_MAX_ADDED);
    t->is_added = calloc(t->n_tokens, 1);
    if (!t->is_added) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for added-token flags");
    for (size_t i = 0; i < d->n_added; i++) {
        uint32_t id = d->added_ids[i];
        if (id >= t->n_tokens || (i && id <= d->added_ids[i - 1]))
            return kipp_err(err, errlen, KIPP_EFORMAT,
                            "added token id %u at index %zu is out of order or >= %zu tokens; "
                            "expected ascending ids below the token count", id, i, t->n_tokens);
        t->added_ids[i] = id;
        t->added_special[i] = d->added_special ? d->added_special[i] : 0;
        t->is_added[id] = 1;
        t->added_first[(uint8_t)t->tokens[id].ptr[0]] = 1;
    }
    t->n_added = d->n_added;
    return KIPP_OK;
}

static int build_regex(kipp_tokenizer *t, kipp_str pat, char *err, size_t errlen)
{
    int ec;
    PCRE2_SIZE eo;
    if (!pat.ptr || !pat.len)
        return kipp_err(err, errlen, KIPP_EFORMAT, "tokenizer pre_regex is empty; expected the Split pattern");
    t->re = pcre2_compile((PCRE2_SPTR)pat.ptr, pat.len, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return kipp_err(err, errlen, KIPP_EFORMAT,
                        "tokenizer pre_regex does not compile at offset %zu: %s", (size_t)eo, (char *)msg);
    }
    t->native = pat.len == strlen(KIPP_QWEN2_PATTERN) && !memcmp(pat.ptr, KIPP_QWEN2_PATTERN, pat.len);
    /* JIT keeps long lines linear in practice; the interpreter is the fallback. */
    t->re_jit = pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0;
    return KIPP_OK;
}

int kipp_tokenizer_create(const kipp_tokenizer_data *d, kipp_tokenizer **out, char *err, size_t errlen)
{
    if (!d || !out) return kipp_err(err, errlen, KIPP_EINVAL, "tokenizer data or out pointer is NULL");
    *out = NULL;
    if (!d->tokens || d->n_tokens < 256 || d->n_tokens > KIPP_VOCAB_SIZE)
        return kipp_err(err, errlen, KIPP_EFORMAT, "tokenizer has %zu tokens; expected 256..%u",
                        d->n_tokens, KIPP_VOCAB_SIZE);
    if (d->n_merges && !d->merges)
        return kipp_err(err, errlen, KIPP_EFORMAT, "tokenizer merges array is missing");
    if (d->n_added && !d->added_ids)
        return kipp_err(err, errlen, KIPP_EFORMAT, "tokenizer added_ids array is missing");
    kipp_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for the tokenizer");
    t->tokens = d->tokens;
    t->n_tokens = d->n_tokens;
    int rc = build_vocab(t, err, errlen);
    if (!rc) rc = build_added(t, d, err, errlen);
    if (!rc) rc = build_bytes(t, err, errlen);
    if (!rc) rc = build_merges(t, d, err, errlen);
    if (!rc) rc = build_regex(t, d->pre_regex, err, errlen);
    if (!rc) { /* optional: without it encode is only slower */
        t->cache = calloc(1, sizeof *t->cache);
        if (t->cache && !(t->cache->e = calloc(KIPP_TOK_CACHE_SLOTS, sizeof *t->cache->e))) {
            free(t->cache);
            t->cache = NULL;
        }
        if (t->cache) pthread_mutex_init(&t->cache->mu, NULL);
    }
    if (rc) {
        kipp_tokenizer_destroy(t);
        return rc;
    }
    *out = t;
    return KIPP_OK;
}

void kipp_tokenizer_destroy(kipp_tokenizer *t)
{
    if (!t) return;
    free(t->vocab_slot);
    free(t->merge);
    if (t->cache) {
        pthread_mutex_destroy(&t->cache->mu);
        free(t->cache->e);
        free(t->cache);
    }
    free(t->is_added);
    pcre2_code_free(t->re);
    free(t);
}

int kipp_tokenizer_same(const kipp_tokenizer *a, const kipp_tokenizer *b)
{
    if (a == b) return 1;
    if (!a || !b) return 0;
    /* The merge table is filled in rank order from the same ids, so equal merges give equal tables. */
    if (a->n_tokens != b->n_tokens || a->n_merges != b->n_merges || a->merge_mask != b->merge_mask ||
        a->n_added != b->n_added || a->native != b->native ||
        memcmp(a->added_ids, b->added_ids, a->n_added * sizeof *a->added_ids) ||
        memcmp(a->added_special, b->added_special, a->n_added) ||
        memcmp(a->merge, b->merge, (a->merge_mask + 1) * sizeof *a->merge))
        return 0;
    for (size_t i = 0; i < a->n_tokens; i++)
        if (a->tokens[i].len != b->tokens[i].len || memcmp(a->tokens[i].ptr, b->tokens[i].ptr, a->tokens[i].len))
            return 0;
    return 1;
}

int kipp_tokenizer_diff(const kipp_tokenizer *a, const kipp_tokenizer *b, char *buf, size_t len)
{
    if (kipp_tokenizer_same(a, b)) return 0;
    if (!a || !b) return snprintf(buf, len, "a tokenizer is missing"), 1;
    if (a->n_tokens != b->n_tokens)
        return snprintf(buf, len, "%zu tokens against %zu", (size_t)a->n_tokens, (size_t)b->n_tokens), 1;
    for (size_t i = 0; i < a->n_tokens; i++)
        if (a->tokens[i].len != b->tokens[i].len || memcmp(a->tokens[i].ptr, b->tokens[i].ptr, a->tokens[i].len))
            return snprintf(buf, len, "token %zu is '%.*s' against '%.*s'", i, (int)(a->tokens[i].len > 40 ? 40 : a->tokens[i].len),
                            a->tokens[i].ptr, (int)(b->tokens[i].len > 40 ? 40 : b->tokens[i].len), b->tokens[i].ptr), 1;
    if (a->n_merges != b->n_merges)
        return snprintf(buf, len, "%zu merges against %zu", (size_t)a->n_merges, (size_t)b->n_merges), 1;
    if (a->n_added != b->n_added)
        return snprintf(buf, len, "%zu added tokens against %zu", (size_t)a->n_added, (size_t)b->n_added), 1;
    return snprintf(buf, len, "the same tokens but different merges, added or special tokens, or pre-tokenizer"), 1;
}

kipp_str kipp_tokenizer_token_bytes(const kipp_tokenizer *t, uint32_t id, char *buf, size_t cap)
{
    kipp_str none = {buf, 0};
    if (id >= t->n_tokens) return none;
    kipp_str s = t->tokens[id];
    if (t->is_added[id]) return s; /* literal content, straight from the views */
    const uint8_t *p = (const uint8_t *)s.ptr;
    size_t n = 0;
    for (size_t i = 0; i < s.len; n++) {
        uint32_t cp = p[i] < 0x80 ? p[i++] : (uint32_t)(p[i] & 0x1F) << 6 | (p[i + 1] & 0x3F);
        if (cp >= 0x80) i += 2;
        if (n < cap) buf[n] = (char)t->cp_byte[cp];
    }
    if (n > cap) return (kipp_str){NULL, n};
    return (kipp_str){buf, n};
}

int kipp_tokenizer_decode(const kipp_tokenizer *t, const uint32_t *ids, size_t n, char *out,
                          size_t cap, size_t *n_out, char *err, size_t errlen)
{
    if (!t || (n && !ids) || (cap && !out) || !n_out)
        return kipp_err(err, errlen, KIPP_EINVAL, "decode got a NULL tokenizer, ids, out or n_out");
    size_t len = 0;
    char buf[MAX_TOKEN_BYTES];
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= KIPP_VOCAB_SIZE)
            return kipp_err(err, errlen, KIPP_ERANGE, "token id %u at index %zu is out of range; expected < %u",
                            ids[i], i, KIPP_VOCAB_SIZE);
        kipp_str b = kipp_tokenizer_token_bytes(t, ids[i], buf, sizeof buf);
        KIPP_ASSERT(b.ptr != NULL);
        if (len < cap) memcpy(out + len, b.ptr, b.len <= cap - len ? b.len : cap - len);
        len += b.len;
    }
    *n_out = len;
    if (len > cap)
        return kipp_err(err, errlen, KIPP_ERANGE, "decoded text is %zu bytes; the buffer holds %zu", len, cap);
    return KIPP_OK;
}
