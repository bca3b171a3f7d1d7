/*
 * tokenizer.h - native Qwen2Tokenizer byte-level BPE (seed 000, "Tokenizer").
 *
 * Internal to the engine; the public entry points are kipp_tokenize /
 * kipp_detokenize in kipp.h. Tables point into the GGUF mmap where possible.
 */
#ifndef KIPP_TOKENIZER_H
#define KIPP_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

/** A byte string that is not NUL-terminated; usually points into the mmap. */
typedef struct {
    const char *ptr;
    uint64_t len;
} kipp_str;

/** Raw tokenizer data as stored in the GGUF (docs/FORMAT.md); all views borrowed. */
typedef struct {
    const kipp_str *tokens;       /* [n_tokens] byte-level token strings, index = id */
    size_t n_tokens;              /* 151669 */
    const kipp_str *merges;       /* [n_merges] "left right", rank order */
    size_t n_merges;
    const uint32_t *added_ids;    /* [n_added] ascending ids of added tokens */
    const uint8_t *added_special; /* [n_added] 1 = special */
    size_t n_added;
    kipp_str pre_regex;           /* Split pre-tokenizer pattern; the Qwen2 one runs natively */
} kipp_tokenizer_data;

typedef struct kipp_tokenizer kipp_tokenizer;

/**
 * Build a tokenizer from data (views must outlive it). Compiles the regex
 * (PCRE2, UTF|UCP, JIT: it validates the pattern, and runs any pattern other
 * than Qwen2's, which the native scanner over the generated Unicode 16.0
 * tables runs) and hashes vocab and merges. Errors: KIPP_EFORMAT naming the
 * bad entry, KIPP_ENOMEM.
 */
int kipp_tokenizer_create(const kipp_tokenizer_data *d, kipp_tokenizer **out, char *err,
                          size_t errlen);
/** Destroy; NULL accepted. */
void kipp_tokenizer_destroy(kipp_tokenizer *t);
/** See kipp_tokenize in kipp.h for the contract. */
int kipp_tokenizer_encode(const kipp_tokenizer *t, const char *text, size_t len, int flags,
                          uint32_t *ids, size_t cap, size_t *n_out, char *err, size_t errlen);
/** See kipp_detokenize in kipp.h; n_vocab bounds the accepted ids (padding ids decode to nothing). */
int kipp_tokenizer_decode(const kipp_tokenizer *t, const uint32_t *ids, size_t n, char *out,
                          size_t cap, size_t *n_out, char *err, size_t errlen);
/**
 * 1 when a and b map ids to text alike: the same token strings, merges, added
 * tokens and pre-tokenizer kind (both NULL counts as alike); 0 otherwise. A
 * full comparison (the merge table is megabytes for Qwen3), for the rare
 * caller holding two models, not for a per-token path.
 */
int kipp_tokenizer_same(const kipp_tokenizer *a, const kipp_tokenizer *b);
/** 0 when kipp_tokenizer_same(a, b); else 1 with the first difference in words in buf[len] (sizes, a token's text). */
int kipp_tokenizer_diff(const kipp_tokenizer *a, const kipp_tokenizer *b, char *buf, size_t len);
/** Bytes of one token (raw bytes, after the byte-level map is undone); len 0 for padding ids. */
kipp_str kipp_tokenizer_token_bytes(const kipp_tokenizer *t, uint32_t id, char *buf, size_t cap);

#endif
