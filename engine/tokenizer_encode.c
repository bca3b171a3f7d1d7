/*
 * tokenizer_encode.c - text -> ids for the Qwen2Tokenizer byte-level BPE,
 * following the Hugging Face `tokenizers` pipeline of tokenizer.json:
 *
 *   invalid UTF-8 -> U+FFFD (as Python bytes.decode("utf-8", "replace"))
 *   -> added tokens split out of the raw text (KIPP_TOK_SPECIAL only)
 *   -> NFC per remaining segment (utf8proc; skipped when a quick check
 *      over the generated tables shows the segment is already NFC)
 *   -> Split pre-tokenizer: the Qwen2 pattern by a native scanner over the
 *      generated Unicode 16.0 class tables (engine/tokenizer_unicode.h), any
 *      other pattern by PCRE2 (UTF|UCP, JIT)
 *   -> byte-level BPE by merge rank on each pre-token.
 *
 * BPE applies the lowest-ranked adjacent pair first, leftmost on ties, exactly
 * like the reference's priority queue. Short pre-tokens use an array scan;
 * long ones (a 10 MB word) a binary heap over a linked list, O(n log n).
 * Behaviour on odd input is documented in docs/TOKENIZER.md.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "engine/internal.h"
#include "engine/tokenizer_impl.h"
#include "engine/tokenizer_unicode.h"

#define SMALL_WORD 48u            /* bytes: array BPE up to here, heap BPE above */
#define JIT_STACK_MAX (64u << 20) /* bytes of JIT stack one encode call may use */

/* One encode call: output cursor plus reusable scratch. */
typedef struct {
    const kipp_tokenizer *t;
    uint32_t *ids;
    size_t cap, n;               /* ids written = min(n, cap); n counts all */
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
    int32_t *nfc;                /* [nfc_cap] utf8proc scratch (UTF-32, then UTF-8 in place) */
    size_t nfc_cap;
    char *norm;                  /* [norm_cap] NFC of the current segment when it differs */
    size_t norm_n, norm_cap;
    uint32_t *sym;               /* [sym_cap] BPE symbol ids */
    uint64_t *heap;              /* [3*sym_cap] (rank << 32 | pos) min-heap */
    int32_t *prev, *next;        /* [sym_cap] linked list over symbols */
    size_t sym_cap;
    char *err;
    size_t errlen;
} enc_ctx;

static inline void emit(enc_ctx *c, uint32_t id)
{
    if (c->n < c->cap) c->ids[c->n] = id;
    c->n++;
}

/* ---- invalid UTF-8 ---- */

/* Length of the well-formed sequence at s[i..n) (Unicode Table 3-7), or 0;
 * *bad gets the length of its maximal well-formed prefix (>= 1) when 0. */
size_t kipp_utf8_seq(const uint8_t *s, size_t i, size_t n, size_t *bad)
{
    uint8_t b = s[i];
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) need = 2;
    else if (b >= 0xE0 && b <= 0xEF) {
        need = 3;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F; /* UTF-8-encoded surrogates are ill-formed */
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 4;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else {
        *bad = 1;
        return 0;
    }
    size_t k = 1;
    for (; k < need && i + k < n; k++) {
        uint8_t c = s[i + k];
        if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) break;
    }
    if (k == need) return need;
    *bad = k;
    return 0;
}

size_t kipp_utf8_valid_prefix(const char *s, size_t n)
{
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0, bad;
    while (i < n) {
        size_t k = kipp_utf8_seq(p, i, n, &bad);
        if (!k) break;
        i += k;
    }
    return i;
}

/* Each maximal ill-formed subpart becomes one U+FFFD, which is what CPython's
 * "replace" error handler does; returns 1 and a malloc'd copy when something
 * was replaced, 0 when s is valid, KIPP_ENOMEM. */
int kipp_utf8_sanitize(const char *s, size_t n, char **out, size_t *out_len)
{
    size_t ok = kipp_utf8_valid_prefix(s, n);
    *out = NULL;
    if (ok == n) return 0;
    char *o = malloc(ok + (n - ok) * 3 + 1);
    if (!o) return KIPP_ENOMEM;
    memcpy(o, s, ok);
    size_t i = ok, m = ok, bad;
    const uint8_t *p = (const uint8_t *)s;
    while (i < n) {
        size_t k = kipp_utf8_seq(p, i, n, &bad);
        if (k) {
            memcpy(o + m, s + i, k);
            m += k;
            i += k;
        } else {
            memcpy(o + m, "\xEF\xBF\xBD", 3);
            m += 3;
            i += bad;
        }
    }
    *out = o;
    *out_len = m;
    return 1;
}

/* ---- BPE ---- */

static int grow_sym(enc_ctx *c, size_t n)
{
    if (n <= c->sym_cap) return KIPP_OK;
    size_t cap = n < 1024 ? 1024 : n;
    free(c->sym); free(c->heap); free(c->prev); free(c->next);
    c->sym = malloc(cap * sizeof *c->sym);
    c->heap = malloc(3 * cap * sizeof *c->heap); /* n-1 pairs + 2 per merge, stale ones included */
    c->prev = malloc(cap * sizeof *c->prev);
    c->next = malloc(cap * sizeof *c->next);
    c->sym_cap = (c->sym && c->heap && c->prev && c->next) ? cap : 0;
    if (!c->sym_cap)
        return kipp_err(c->err, c->errlen, KIPP_ENOMEM, "out of memory for a %zu-byte pre-token", n);
    return KIPP_OK;
}

static inline uint32_t pair_rank(const kipp_tokenizer *t, uint32_t a, uint32_t b, uint32_t *merged)
{
    uint64_t v = kipp_tok_merge_find(t, a, b);
    *merged = (uint32_t)v;
    return v == UINT64_MAX ? KIPP_TOK_NO_RANK : (uint32_t)(v >> 32);
}

/* Short words: ranks of all adjacent pairs in an array; merge the leftmost
 * lowest rank, then refresh only the two pairs that touch the new symbol. */
static size_t bpe_small(const kipp_tokenizer *t, const uint8_t *w, size_t n, uint32_t *sym)
{
    uint32_t rank[SMALL_WORD], mid[SMALL_WORD];
    for (size_t i = 0; i < n; i++) sym[i] = t->byte_id[w[i]];
    for (size_t i = 0; i + 1 < n; i++) rank[i] = pair_rank(t, sym[i], sym[i + 1], &mid[i]);
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (rank[i] < rank[best]) best = i;
        if (rank[best] == KIPP_TOK_NO_RANK) break;
        sym[best] = mid[best];
        memmove(sym + best + 1, sym + best + 2, (n - best - 2) * sizeof *sym);
        size_t tail = n - best >= 3 ? n - best - 3 : 0; /* pairs after the removed one */
        memmove(rank + best + 1, rank + best + 2, tail * sizeof *rank);
        memmove(mid + best + 1, mid + best + 2, tail * sizeof *mid);
        n--;
        if (best > 0) rank[best - 1] = pair_rank(t, sym[best - 1], sym[best], &mid[best - 1]);
        if (best + 1 < n) rank[best] = pair_rank(t, sym[best], sym[best + 1], &mid[best]);
    }
    return n;
}

static uint64_t word_hash(const uint8_t *w, size_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    for (size_t i = 0; i < n; i++) h = (h ^ w[i]) * 0x100000001b3ull;
    return (h ^ (h >> 31)) | 1; /* never 0: 0 marks an empty slot */
}

/* Short words go through the shared cache: most pre-tokens of real text repeat. */
static void bpe_cached(enc_ctx *c, const uint8_t *w, size_t n)
{
    kipp_tok_cache *k = c->t->cache;
    uint32_t sym[SMALL_WORD];
    size_t m;
    if (!k || n > KIPP_TOK_CACHE_WORD) {
        m = bpe_small(c->t, w, n, sym);
        for (size_t i = 0; i < m; i++) emit(c, sym[i]);
        return;
    }
    uint64_t h = word_hash(w, n);
    kipp_tok_cache_entry *e = &k->e[h & (KIPP_TOK_CACHE_SLOTS - 1)];
    pthread_mutex_lock(&k->mu);
    int hit = e->hash == h && e->len == n && !memcmp(e->word, w, n);
    if (hit) {
        m = e->n;
        memcpy(sym, e->ids, m * sizeof *sym);
    }
    pthread_mutex_unlock(&k->mu);
    if (!hit) {
        m = bpe_small(c->t, w, n, sym);
        if (m <= KIPP_TOK_CACHE_IDS) {
            pthread_mutex_lock(&k->mu);
            e->hash = h;
            e->len = (uint8_t)n;
            e->n = (uint8_t)m;
            memcpy(e->word, w, n);
            memcpy(e->ids, sym, m * sizeof *sym);
            pthread_mutex_unlock(&k->mu);
        }
    }
    for (size_t i = 0; i < m; i++) emit(c, sym[i]);
}

/* A 4-ary min-heap: half the levels of a binary heap, and the four children
 * share a cache line, which is what matters on multi-MB pre-tokens. */
static void heap_sift_down(uint64_t *h, size_t n, size_t i)
{
    uint64_t v = h[i];
    for (;;) {
        size_t c = 4 * i + 1, m = c;
        if (c >= n) break;
        size_t end = c + 4 < n ? c + 4 : n;
        for (size_t k = c + 1; k < end; k++)
            if (h[k] < h[m]) m = k;
        if (h[m] >= v) break;
        h[i] = h[m];
        i = m;
    }
    h[i] = v;
}

static void heap_push(uint64_t *h, size_t *n, uint64_t v)
{
    size_t i = (*n)++;
    while (i && h[(i - 1) / 4] > v) {
        h[i] = h[(i - 1) / 4];
        i = (i - 1) / 4;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n)
{
    uint64_t top = h[0];
    h[0] = h[--*n];
    if (*n) heap_sift_down(h, *n, 0);
    return top;
}

/* Long words: a min-heap of (rank, left position); stale entries are
 * recognised because a rank names exactly one pair. */
static int bpe_large(enc_ctx *c, const uint8_t *w, size_t n)
{
    const kipp_tokenizer *t = c->t;
    int rc = grow_sym(c, n);
    if (rc) return rc;
    uint32_t *sym = c->sym, m;
    int32_t *prev = c->prev, *next = c->next;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        sym[i] = t->byte_id[w[i]];
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        uint32_t r = pair_rank(t, sym[i], sym[i + 1], &m);
        if (r != KIPP_TOK_NO_RANK) c->heap[hn++] = (uint64_t)r << 32 | i;
    }
    for (size_t i = hn / 4 + 1; i-- > 0;) /* bottom-up heapify: O(n) */
        if (i < hn) heap_sift_down(c->heap, hn, i);
    while (hn) {
        uint64_t top = heap_pop(c->heap, &hn);
        uint32_t r = (uint32_t)(top >> 32), pos = (uint32_t)top;
        int32_t nx = next[pos];
        if (sym[pos] == UINT32_MAX || nx < 0 || pair_rank(t, sym[pos], sym[nx], &m) != r) continue;
        sym[pos] = m; /* absorb the right symbol */
        sym[nx] = UINT32_MAX;
        next[pos] = next[nx];
        if (next[nx] >= 0) prev[next[nx]] = (int32_t)pos;
        uint32_t r2, m2;
        if (prev[pos] >= 0 && (r2 = pair_rank(t, sym[prev[pos]], sym[pos], &m2)) != KIPP_TOK_NO_RANK)
            heap_push(c->heap, &hn, (uint64_t)r2 << 32 | (uint32_t)prev[pos]);
        if (next[pos] >= 0 && (r2 = pair_rank(t, sym[pos], sym[next[pos]], &m2)) != KIPP_TOK_NO_RANK)
            heap_push(c->heap, &hn, (uint64_t)r2 << 32 | pos);
    }
    for (int32_t i = 0; i >= 0; i = next[i]) emit(c, sym[i]);
    return KIPP_OK;
}

static int bpe(enc_ctx *c, const char *w, size_t n)
{
    if (n == 0) return KIPP_OK;
    if (n == 1) {
        emit(c, c->t->byte_id[(uint8_t)w[0]]);
        return KIPP_OK;
    }
    if (n <= SMALL_WORD) {
        bpe_cached(c, (const uint8_t *)w, n);
        return KIPP_OK;
    }
    if (n > INT32_MAX) return kipp_err(c->err, c->errlen, KIPP_ERANGE, "pre-token of %zu bytes exceeds 2 GiB", n);
    return bpe_large(c, (const uint8_t *)w, n);
}

/* ---- pre-tokenizer ---- */

static int regex_match(enc_ctx *c, const char *s, size_t n, size_t off)
{
    const kipp_tokenizer *t = c->t;
    int rc = t->re_jit ? pcre2_jit_match(t->re, (PCRE2_SPTR)s, n, off, PCRE2_NO_UTF_CHECK, c->md, c->mctx)
                       : pcre2_match(t->re, (PCRE2_SPTR)s, n, off, PCRE2_NO_UTF_CHECK, c->md, c->mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !c->jstack) {
        /* Rare deep backtracking: retry once with a large JIT stack. */
        c->jstack = pcre2_jit_stack_create(32 << 10, JIT_STACK_MAX, NULL);
        if (!c->jstack) return PCRE2_ERROR_NOMEMORY;
        pcre2_jit_stack_assign(c->mctx, NULL, c->jstack);
        return regex_match(c, s, n, off);
    }
    return rc;
}

/* ---- native scanner for the Qwen2 pattern ----
 *
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}
 *   | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *
 * Each character has one class (L, N, S = \s, or other), from the generated
 * tables. Every character starts some alternative, so matches tile the text
 * and the search never skips. The alternatives are tried in order, as the
 * backtracking engine does; the backtracking itself has closed forms (see
 * qwen2_match). (?i) folds ASCII only: HF matches no non-ASCII letter there
 * (U+017F LONG S included), unlike PCRE2 with UCP. */

static const uint8_t ascii_class[128] = {
    ['\t'] = KIPP_UC_S, ['\n'] = KIPP_UC_S, ['\v'] = KIPP_UC_S, ['\f'] = KIPP_UC_S, ['\r'] = KIPP_UC_S,
    [' '] = KIPP_UC_S,
    ['0'] = KIPP_UC_N, ['1'] = KIPP_UC_N, ['2'] = KIPP_UC_N, ['3'] = KIPP_UC_N, ['4'] = KIPP_UC_N,
    ['5'] = KIPP_UC_N, ['6'] = KIPP_UC_N, ['7'] = KIPP_UC_N, ['8'] = KIPP_UC_N, ['9'] = KIPP_UC_N,
#define L_(ch) [ch] = KIPP_UC_L, [ch + 32] = KIPP_UC_L
    L_('A'), L_('B'), L_('C'), L_('D'), L_('E'), L_('F'), L_('G'), L_('H'), L_('I'), L_('J'),
    L_('K'), L_('L'), L_('M'), L_('N'), L_('O'), L_('P'), L_('Q'), L_('R'), L_('S'), L_('T'),
    L_('U'), L_('V'), L_('W'), L_('X'), L_('Y'), L_('Z'),
#undef L_
};

/* Class and byte length of the character at s[i] (valid UTF-8, i < n). */
static inline unsigned char_class(const uint8_t *s, size_t i, unsigned *len)
{
    uint8_t b = s[i];
    uint32_t cp;
    if (b < 0x80) {
        *len = 1;
        return ascii_class[b];
    }
    if (b < 0xE0) {
        *len = 2;
        cp = (uint32_t)(b & 0x1F) << 6 | (s[i + 1] & 0x3F);
    } else if (b < 0xF0) {
        *len = 3;
        cp = (uint32_t)(b & 0x0F) << 12 | (uint32_t)(s[i + 1] & 0x3F) << 6 | (s[i + 2] & 0x3F);
    } else {
        *len = 4;
        cp = (uint32_t)(b & 0x07) << 18 | (uint32_t)(s[i + 1] & 0x3F) << 12 |
             (uint32_t)(s[i + 2] & 0x3F) << 6 | (s[i + 3] & 0x3F);
    }
    return kipp_uc_class(cp);
}

/* End of the run of class k starting at i. */
static inline size_t run_of(const uint8_t *s, size_t i, size_t n, unsigned k)
{
    unsigned len;
    while (i < n && char_class(s, i, &len) == k) i += len;
    return i;
}

static inline size_t run_other(const uint8_t *s, size_t i, size_t n) /* [^\s\p{L}\p{N}]+ */
{
    unsigned len;
    while (i < n && char_class(s, i, &len) == KIPP_UC_OTHER) i += len;
    return i;
}

/* End of the Qwen2 pattern's match starting at s[i] (i < n); always > i. */
static size_t qwen2_match(const uint8_t *s, size_t i, size_t n)
{
    unsigned len0, len1;
    unsigned k0 = char_class(s, i, &len0);
    uint8_t b0 = s[i];
    size_t j = i + len0;
    /* (?i:'s|'t|'re|'ve|'m|'ll|'d) */
    if (b0 == '\'' && j < n) {
        uint8_t a = s[j] | 0x20, z = j + 1 < n ? s[j + 1] | 0x20 : 0;
        /* b | 0x20 of a byte >= 0x80 is never an ASCII letter */
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return j + 1;
        if ((a == 'r' && z == 'e') || (a == 'v' && z == 'e') || (a == 'l' && z == 'l')) return j + 2;
    }
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (k0 == KIPP_UC_L) return run_of(s, j, n, KIPP_UC_L);
    if (k0 != KIPP_UC_N && b0 != '\r' && b0 != '\n' && j < n && char_class(s, j, &len1) == KIPP_UC_L)
        return run_of(s, j + len1, n, KIPP_UC_L);
    /* \p{N} */
    if (k0 == KIPP_UC_N) return j;
    /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
    size_t p = k0 == KIPP_UC_OTHER ? i : (b0 == ' ' && j < n && char_class(s, j, &len1) == KIPP_UC_OTHER) ? j : n;
    if (p < n) {
        size_t e = run_other(s, p, n);
        while (e < n && (s[e] == '\r' || s[e] == '\n')) e++;
        return e;
    }
    /* k0 is S: \s*[\r\n]+ ends after the run's last \r or \n; \s+(?!\S) gives
     * the run less its last character unless the run ends the text; \s+ the run. */
    size_t e = j, last_nl = (b0 == '\r' || b0 == '\n') ? j : 0, last_start = i;
    while (e < n) {
        unsigned l;
        if (char_class(s, e, &l) != KIPP_UC_S) break;
        if (s[e] == '\r' || s[e] == '\n') last_nl = e + 1;
        last_start = e;
        e += l;
    }
    if (last_nl) return last_nl;
    if (e < n && last_start > i) return last_start;
    return e;
}

/* Split s[n] (valid, NFC UTF-8); every match is one pre-token. */
static int pretokenize_native(enc_ctx *c, const char *s, size_t n)
{
    const uint8_t *u = (const uint8_t *)s;
    for (size_t off = 0; off < n;) {
        size_t e = qwen2_match(u, off, n);
        int rc = bpe(c, s + off, e - off);
        if (rc) return rc;
        off = e;
    }
    return KIPP_OK;
}

/* Split s[n] (valid, NFC UTF-8) with the pattern; Isolated behaviour: every
 * match and every gap between matches is one pre-token. */
static int pretokenize(enc_ctx *c, const char *s, size_t n)
{
    if (c->t->native) return pretokenize_native(c, s, n);
    size_t off = 0;
    while (off < n) {
        int rc = regex_match(c, s, n, off);
        if (rc == PCRE2_ERROR_NOMATCH) return bpe(c, s + off, n - off);
        if (rc < 0) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return kipp_err(c->err, c->errlen, KIPP_EINVAL,
                            "pre-tokenizer regex failed at byte %zu: %s", off, (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t a = ov[0], b = ov[1];
        int e = bpe(c, s + off, a - off);
        if (!e) e = bpe(c, s + a, b - a);
        if (e) return e;
        if (b == a) { /* an empty match cannot come from the Qwen pattern; step one char */
            if (b >= n) break;
            b++;
            while (b < n && ((uint8_t)s[b] & 0xC0) == 0x80) b++;
            e = bpe(c, s + a, b - a);
            if (e) return e;
        }
        off = b;
    }
    return KIPP_OK;
}

/* ---- NFC ---- */

/* Code point and byte length of the character at s[i] (valid UTF-8). */
static inline uint32_t utf8_cp(const uint8_t *s, size_t i, unsigned *len)
{
    uint8_t b = s[i];
    if (b < 0x80) { *len = 1; return b; }
    if (b < 0xE0) { *len = 2; return (uint32_t)(b & 0x1F) << 6 | (s[i + 1] & 0x3F); }
    if (b < 0xF0) {
        *len = 3;
        return (uint32_t)(b & 0x0F) << 12 | (uint32_t)(s[i + 1] & 0x3F) << 6 | (s[i + 2] & 0x3F);
    }
    *len = 4;
    return (uint32_t)(b & 0x07) << 18 | (uint32_t)(s[i + 1] & 0x3F) << 12 | (uint32_t)(s[i + 2] & 0x3F) << 6 |
           (s[i + 3] & 0x3F);
}

/* Table bits of the character at s[i]: KIPP_UC_NFC_SAFE, KIPP_UC_HF_NFC_BOUNDARY. */
static inline unsigned nfc_bits_at(const uint8_t *s, size_t i, unsigned *len)
{
    if (s[i] < 0x80) { *len = 1; return KIPP_UC_NFC_SAFE; }
    return kipp_uc_entry(utf8_cp(s, i, len)) & (KIPP_UC_NFC_SAFE | KIPP_UC_HF_NFC_BOUNDARY);
}

/* NFC of s[n] by utf8proc into c->nfc (as UTF-8); *out points there. */
static int nfc_utf8proc(enc_ctx *c, const char *s, size_t n, const char **out, size_t *out_n)
{
    const utf8proc_option_t opt = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    for (;;) {
        utf8proc_ssize_t r = c->nfc_cap
            ? utf8proc_decompose((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, c->nfc,
                                 (utf8proc_ssize_t)c->nfc_cap, opt)
            : (utf8proc_ssize_t)n + 16;
        if (r < 0)
            return kipp_err(c->err, c->errlen, KIPP_EINVAL, "NFC normalisation failed: %s",
                            utf8proc_errmsg(r));
        if ((size_t)r <= c->nfc_cap && c->nfc_cap) {
            r = utf8proc_normalize_utf32(c->nfc, r, opt);
            if (r >= 0) r = utf8proc_reencode(c->nfc, r, opt);
            if (r < 0)
                return kipp_err(c->err, c->errlen, KIPP_EINVAL, "NFC normalisation failed: %s",
                                utf8proc_errmsg(r));
            *out = (const char *)c->nfc;
            *out_n = (size_t)r;
            return KIPP_OK;
        }
        free(c->nfc);
        c->nfc_cap = (size_t)r + 16;
        c->nfc = malloc(c->nfc_cap * sizeof *c->nfc);
        if (!c->nfc) {
            c->nfc_cap = 0;
            return kipp_err(c->err, c->errlen, KIPP_ENOMEM, "out of memory normalising %zu bytes", n);
        }
    }
}

static int out_put(enc_ctx *c, const char *s, size_t n)
{
    if (!n) return KIPP_OK; /* c->norm may still be NULL */
    if (c->norm_n + n > c->norm_cap) {
        size_t cap = c->norm_cap ? c->norm_cap : 4096;
        while (cap < c->norm_n + n) cap *= 2;
        char *p = realloc(c->norm, cap);
        if (!p) return kipp_err(c->err, c->errlen, KIPP_ENOMEM, "out of memory normalising %zu bytes", n);
        c->norm = p;
        c->norm_cap = cap;
    }
    memcpy(c->norm + c->norm_n, s, n);
    c->norm_n += n;
    return KIPP_OK;
}

/* NFC of one segment, as HF's normaliser computes it.
 * - Code points that are NFC-safe (starters with NFC_Quick_Check Yes, from
 *   the generated tables) are normalisation boundaries: nothing before one can
 *   combine with anything after it. So only the spans from the last safe
 *   character before an unsafe one up to the next safe character go through
 *   utf8proc; the rest is copied. A segment with no unsafe character is
 *   returned as it is.
 * - HF's normaliser has pre-10.0 tables: the 109 code points marked
 *   KIPP_UC_HF_NFC_BOUNDARY (marks classed in Unicode 10..15, and U+11930)
 *   are plain starters to it. They are copied as they are and split the text,
 *   which makes utf8proc's result equal HF's (tools/gen_unicode_tables.py
 *   checks this against HF). */
static int nfc_segment(enc_ctx *c, const char *s, size_t n, const char **out, size_t *out_n)
{
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0, done = 0, last_safe = 0;
    unsigned len;
    c->norm_n = 0;
    while (i < n) {
        if (u[i] < 0x80) { /* ASCII run */
            last_safe = i++;
            continue;
        }
        unsigned bits = nfc_bits_at(u, i, &len);
        if (bits & KIPP_UC_NFC_SAFE) {
            last_safe = i;
            i += len;
            continue;
        }
        if (bits & KIPP_UC_HF_NFC_BOUNDARY) {
            int rc = out_put(c, s + done, i + len - done);
            if (rc) return rc;
            done = last_safe = i = i + len;
            continue;
        }
        size_t start = last_safe > done ? last_safe : done, q = i + len;
        while (q < n && !nfc_bits_at(u, q, &len)) q += len;
        const char *p = NULL;
        size_t pn = 0;
        int rc = out_put(c, s + done, start - done);
        if (!rc) rc = nfc_utf8proc(c, s + start, q - start, &p, &pn);
        if (!rc) rc = out_put(c, p, pn);
        if (rc) return rc;
        done = last_safe = i = q;
    }
    if (done == 0 && c->norm_n == 0) { /* already NFC */
        *out = s;
        *out_n = n;
        return KIPP_OK;
    }
    int rc = out_put(c, s + done, n - done);
    if (rc) return rc;
    *out = c->norm;
    *out_n = c->norm_n;
    return KIPP_OK;
}

static int encode_plain(enc_ctx *c, const char *s, size_t n)
{
    if (!n) return KIPP_OK;
    const char *p;
    size_t pn;
    int rc = nfc_segment(c, s, n, &p, &pn);
    return rc ? rc : pretokenize(c, p, pn);
}

/* ---- added tokens ---- */

/* Leftmost added token at or after *pos (longest at one position, as the
 * reference's leftmost-longest matcher); returns its id or -1. */
static int64_t find_added(const kipp_tokenizer *t, const char *s, size_t n, size_t *pos)
{
    for (size_t i = *pos; i < n; i++) {
        if (!t->added_first[(uint8_t)s[i]]) continue;
        int64_t best = -1;
        uint64_t best_len = 0;
        for (size_t k = 0; k < t->n_added; k++) {
            kipp_str a = t->tokens[t->added_ids[k]];
            if (a.len <= n - i && a.len > best_len && !memcmp(s + i, a.ptr, a.len)) {
                best = t->added_ids[k];
                best_len = a.len;
            }
        }
        if (best >= 0) {
            *pos = i;
            return best;
        }
    }
    *pos = n;
    return -1;
}

static int encode_text(enc_ctx *c, const char *s, size_t n, int flags)
{
    if (!(flags & KIPP_TOK_SPECIAL)) return encode_plain(c, s, n);
    size_t off = 0;
    while (off < n) {
        size_t at = off;
        int64_t id = find_added(c->t, s, n, &at);
        int rc = encode_plain(c, s + off, at - off);
        if (rc) return rc;
        if (id < 0) break;
        emit(c, (uint32_t)id);
        off = at + c->t->tokens[id].len;
    }
    return KIPP_OK;
}

int kipp_tokenizer_encode(const kipp_tokenizer *t, const char *text, size_t len, int flags,
                          uint32_t *ids, size_t cap, size_t *n_out, char *err, size_t errlen)
{
    if (!t || (len && !text) || (cap && !ids) || !n_out)
        return kipp_err(err, errlen, KIPP_EINVAL, "encode got a NULL tokenizer, text, ids or n_out");
    if (flags & ~KIPP_TOK_SPECIAL)
        return kipp_err(err, errlen, KIPP_EINVAL, "tokenize flags 0x%x are unknown; expected 0 or KIPP_TOK_SPECIAL",
                        (unsigned)flags);
    enc_ctx c = {.t = t, .ids = ids, .cap = cap, .err = err, .errlen = errlen};
    char *clean = NULL;
    size_t clean_n = 0;
    int rc = kipp_utf8_sanitize(text, len, &clean, &clean_n);
    if (rc < 0) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory replacing invalid UTF-8");
    if (t->native) {
        rc = encode_text(&c, clean ? clean : text, clean ? clean_n : len, flags);
        goto done;
    }
    c.md = pcre2_match_data_create_from_pattern(t->re, NULL);
    c.mctx = pcre2_match_context_create(NULL);
    if (!c.md || !c.mctx) rc = kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for regex match data");
    /* The default limit (10^7 steps) trips on a 10 MB whitespace run, where
     * \s*[\r\n]+ scans the run once per match; the work stays linear
     * (docs/TOKENIZER.md, "Long lines"), so lift it. */
    else if (pcre2_set_match_limit(c.mctx, UINT32_MAX)) rc = KIPP_EINVAL;
    else rc = encode_text(&c, clean ? clean : text, clean ? clean_n : len, flags);
done:
    free(clean);
    free(c.nfc);
    free(c.norm);
    free(c.sym); free(c.heap); free(c.prev); free(c.next);
    pcre2_match_data_free(c.md);
    pcre2_match_context_free(c.mctx);
    pcre2_jit_stack_free(c.jstack);
    if (rc) return rc;
    *n_out = c.n;
    if (c.n > cap)
        return kipp_err(err, errlen, KIPP_ERANGE, "text encodes to %zu tokens; the buffer holds %zu", c.n, cap);
    return KIPP_OK;
}

int kipp_tokenizer_describe(const kipp_model *model, char *out, size_t outlen)
{
    if (!model || !model->tok || !out || !outlen)
        return kipp_err(out, outlen, KIPP_EINVAL, "tokenizer_describe needs an open model with a tokenizer and a buffer");
    char pre[96];
    if (model->tok->native) {
        snprintf(pre, sizeof pre, "native Qwen2 scanner, Unicode %s classes", KIPP_UNICODE_VERSION);
    } else {
        char ver[48] = "?", uni[24] = "?";
        pcre2_config(PCRE2_CONFIG_VERSION, ver);
        pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, uni);
        snprintf(pre, sizeof pre, "PCRE2 %s, Unicode %s classes (not the Qwen2 pattern)", ver, uni);
    }
    snprintf(out, outlen, "pre-tokenizer %s; NFC utf8proc %s (Unicode %s)", pre, utf8proc_version(),
             utf8proc_unicode_version());
    return KIPP_OK;
}
