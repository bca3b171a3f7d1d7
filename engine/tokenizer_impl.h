/*
 * tokenizer_impl.h - private layout of the Qwen2 byte-level BPE tokenizer,
 * shared by engine/tokenizer.c (tables, decode) and engine/tokenizer_encode.c
 * (NFC, pre-tokenizer, BPE). Not for use outside those files and their tests.
 *
 * Memory: token strings are never copied. The vocab hash stores token ids
 * whose bytes are read through the borrowed kipp_str views (the GGUF mmap);
 * the merge hash stores (left id, right id) -> (rank, merged id).
 */
#ifndef KIPP_TOKENIZER_IMPL_H
#define KIPP_TOKENIZER_IMPL_H

#include <pthread.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "engine/tokenizer.h"

/** The Qwen2 Split pattern, as tokenizer.json and the GGUF spell it. */
#define KIPP_QWEN2_PATTERN \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" \
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

#define KIPP_TOK_MAX_ADDED 64u   /* added tokens accepted from a file */
#define KIPP_TOK_NO_RANK UINT32_MAX

#define KIPP_TOK_CACHE_SLOTS 32768u /* direct-mapped word cache: 3 MiB */
#define KIPP_TOK_CACHE_WORD 30u     /* longest cached pre-token, bytes */
#define KIPP_TOK_CACHE_IDS 14u      /* most ids of a cached pre-token */

/** A cached pre-token and its BPE ids; hash 0 = empty. */
typedef struct {
    uint64_t hash;
    uint8_t len, n;
    char word[KIPP_TOK_CACHE_WORD];
    uint32_t ids[KIPP_TOK_CACHE_IDS];
} kipp_tok_cache_entry;

/**
 * Pre-token -> ids cache shared by every encode call on one tokenizer (the
 * reference keeps one too). Mutable behind the const tokenizer, so it has its
 * own lock: encode may be called from several threads at once.
 */
typedef struct {
    pthread_mutex_t mu;
    kipp_tok_cache_entry *e; /* [KIPP_TOK_CACHE_SLOTS] */
} kipp_tok_cache;

/** One merge-hash slot: key (left<<32 | right) + 1 (0 = empty), val (rank<<32 | merged id). */
typedef struct {
    uint64_t key, val;
} kipp_tok_merge;

struct kipp_tokenizer {
    const kipp_str *tokens;       /* [n_tokens] borrowed views, byte-level form */
    size_t n_tokens;
    uint32_t byte_id[256];        /* raw byte -> id of its one-character token */
    int16_t cp_byte[324];         /* byte-level code point (< 0x144) -> raw byte, -1 none */

    uint32_t *vocab_slot;         /* [vocab_mask+1] id+1, 0 = empty (open addressing) */
    uint64_t vocab_mask;

    kipp_tok_merge *merge;        /* [merge_mask+1] open addressing, key and value in one line */
    uint64_t merge_mask;
    unsigned merge_shift;         /* 64 - log2(merge_mask+1) */
    size_t n_merges;

    uint32_t added_ids[KIPP_TOK_MAX_ADDED];   /* ascending */
    uint8_t added_special[KIPP_TOK_MAX_ADDED];
    size_t n_added;
    uint8_t added_first[256];     /* 1: some added token starts with this byte */
    uint8_t *is_added;            /* [n_tokens] 1 = added token (decoded literally) */

    kipp_tok_cache *cache;        /* word cache; NULL when it could not be allocated */
    pcre2_code *re;               /* the Split pre-tokenizer pattern, UTF|UCP */
    int re_jit;                   /* 1: JIT compiled */
    int native;                   /* 1: the pattern is KIPP_QWEN2_PATTERN; encode uses the
                                     native scanner (tokenizer_encode.c), not re */
};

/** Look up a merge of two adjacent symbols; returns rank<<32|merged id, or UINT64_MAX. */
static inline uint64_t kipp_tok_merge_find(const struct kipp_tokenizer *t, uint32_t a, uint32_t b)
{
    uint64_t key = ((uint64_t)a << 32 | b) + 1;
    uint64_t h = (key * 0x9E3779B97F4A7C15ull) >> t->merge_shift;
    for (;;) {
        const kipp_tok_merge *e = &t->merge[h & t->merge_mask];
        if (e->key == key) return e->val;
        if (e->key == 0) return UINT64_MAX;
        h++;
    }
}

/** Replace invalid UTF-8 per Python bytes.decode("utf-8", "replace"); see tokenizer_encode.c. */
int kipp_utf8_sanitize(const char *s, size_t n, char **out, size_t *out_len);

/**
 * Length of the well-formed UTF-8 sequence starting at s[i] (i < n), or 0 when
 * it is ill-formed or cut off by n; then *bad is the length of its maximal
 * well-formed prefix (>= 1), the bytes one U+FFFD replaces. Unicode Table 3-7.
 */
size_t kipp_utf8_seq(const uint8_t *s, size_t i, size_t n, size_t *bad);

/** Length of the valid UTF-8 prefix of s[n] that ends on a character boundary. */
size_t kipp_utf8_valid_prefix(const char *s, size_t n);

#endif
