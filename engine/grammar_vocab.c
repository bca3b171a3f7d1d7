/*
 * grammar_vocab.c - the vocabulary as byte strings for constrained output:
 * preorder byte tries (a mask walk skips a whole subtree at the first byte
 * the automaton refuses) and the list of "plain" tokens, whose bytes are
 * ordinary JSON string text, so a state inside a string allows them all
 * without a walk. Built once per model, on the first grammar.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/grammar_impl.h"
#include "engine/tokenizer_impl.h"

static pthread_mutex_t g_index_mu = PTHREAD_MUTEX_INITIALIZER;

/* Length of the well-formed UTF-8 sequence at p[0..n), 0 if none (RFC 3629 table 3-7). */
static size_t utf8_len(const uint8_t *p, size_t n)
{
    uint8_t c = p[0], lo = 0x80, hi = 0xBF;
    size_t k;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) k = 2;
    else if (c >= 0xE0 && c <= 0xEF) k = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) k = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else return 0;
    if (n < k || p[1] < lo || p[1] > hi) return 0;
    for (size_t i = 2; i < k; i++)
        if (p[i] < 0x80 || p[i] > 0xBF) return 0;
    return k;
}

/* Code points of s when it is plain string text, else 0. */
static uint32_t plain_cps(const uint8_t *s, size_t n)
{
    uint32_t cps = 0;
    for (size_t i = 0; i < n; cps++) {
        if (s[i] < 0x20 || s[i] == '"' || s[i] == '\\' || s[i] == 0x7F) return 0;
        size_t k = utf8_len(s + i, n - i);
        if (!k) return 0;
        i += k;
    }
    return cps;
}

static const kipp_vocab_index *sort_vi; /* qsort has no context argument */

static int cmp_tok(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    const kipp_vocab_index *vi = sort_vi;
    uint32_t lx = vi->off[x + 1] - vi->off[x], ly = vi->off[y + 1] - vi->off[y];
    int c = memcmp(vi->blob + vi->off[x], vi->blob + vi->off[y], lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Preorder trie of ids[n] (sorted by bytes): each node is one byte; a node's
 * subtree is [i, end). ids is kept by the trie. */
static int trie_build(const kipp_vocab_index *vi, uint32_t *ids, uint32_t n, kg_trie *t)
{
    size_t cap = 1024, total = 0;
    for (uint32_t i = 0; i < n; i++) total += vi->off[ids[i] + 1] - vi->off[ids[i]];
    cap = total + 1;
    t->nodes = malloc(cap * sizeof *t->nodes);
    t->ids = ids;
    uint32_t path[4096], depth = 0, nn = 0, maxd = 0;
    if (!t->nodes) return KIPP_ENOMEM;
    const char *prev = NULL;
    uint32_t plen = 0;
    for (uint32_t i = 0; i < n; i++) {
        const char *s = vi->blob + vi->off[ids[i]];
        uint32_t len = vi->off[ids[i] + 1] - vi->off[ids[i]], l = 0;
        if (len > 4096) len = 4096;
        while (prev && l < plen && l < len && prev[l] == s[l]) l++;
        while (depth > l) t->nodes[path[--depth]].end = nn;
        for (; depth < len; depth++) {
            t->nodes[nn] = (kg_trie_node){.byte = (uint8_t)s[depth], .depth = (uint16_t)(depth + 1), .tok = i};
            path[depth] = nn++;
        }
        kg_trie_node *leaf = &t->nodes[path[len - 1]];
        if (!leaf->ntok) leaf->tok = i;
        leaf->ntok++;
        maxd = len > maxd ? len : maxd;
        prev = s, plen = len;
    }
    while (depth > 0) t->nodes[path[--depth]].end = nn;
    t->n_nodes = nn, t->max_depth = maxd;
    return 0;
}

static int build_tries(kipp_vocab_index *vi)
{
    uint32_t *all = malloc(vi->n_tokens * sizeof *all), *odd = malloc(vi->n_tokens * sizeof *odd), na = 0, no = 0;
    vi->plain = malloc(vi->n_tokens * sizeof *vi->plain);
    vi->plain_cp = malloc(vi->n_tokens * sizeof *vi->plain_cp);
    vi->framing = malloc(vi->n_tokens * sizeof *vi->framing);
    if (!all || !odd || !vi->plain || !vi->plain_cp || !vi->framing) {
        free(all), free(odd);
        return KIPP_ENOMEM;
    }
    for (uint32_t id = 0; id < vi->n_tokens; id++) {
        uint32_t len = vi->off[id + 1] - vi->off[id];
        if (!len || vi->added[id] == 2) continue;
        if (vi->added[id]) {
            vi->framing[vi->n_framing++] = id;
            continue;
        }
        all[na++] = id;
        uint32_t cps = plain_cps((const uint8_t *)vi->blob + vi->off[id], len);
        if (cps && cps < 65536) vi->plain[vi->n_plain] = id, vi->plain_cp[vi->n_plain++] = (uint16_t)cps;
        else odd[no++] = id;
    }
    sort_vi = vi;
    qsort(all, na, sizeof *all, cmp_tok);
    qsort(odd, no, sizeof *odd, cmp_tok);
    int rc = trie_build(vi, all, na, &vi->all);
    if (rc) {
        free(odd);
        return rc;
    }
    int bytes = 0;
    for (uint32_t b = 0; b < 256; b++) vi->all_kid[b] = UINT32_MAX;
    for (uint32_t i = 0; i < vi->all.n_nodes; i = vi->all.nodes[i].end) { /* the first level, in byte order */
        vi->all_kid[vi->all.nodes[i].byte] = i;
        bytes += vi->all.nodes[i].ntok > 0;
    }
    vi->all_bytes = bytes == 256;
    return trie_build(vi, odd, no, &vi->odd);
}

int kipp_vocab_index_build(const kipp_str *tokens, const uint8_t *added, uint32_t n_tokens, uint32_t vocab,
                           const uint32_t *stop_ids, uint32_t n_stop, kipp_vocab_index **out, char *err,
                           size_t errlen)
{
    *out = NULL;
    kipp_vocab_index *vi = calloc(1, sizeof *vi);
    size_t total = 0;
    for (uint32_t i = 0; i < n_tokens; i++) total += tokens[i].len;
    if (vi) vi->blob = malloc(total + 1), vi->off = malloc((n_tokens + 1) * sizeof *vi->off),
        vi->added = malloc(n_tokens + 1);
    if (!vi || !vi->blob || !vi->off || !vi->added || n_stop > 2) {
        kipp_vocab_index_free(vi);
        return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for the vocabulary index");
    }
    vi->vocab = vocab, vi->n_tokens = n_tokens, vi->n_stop = n_stop;
    memcpy(vi->stop_ids, stop_ids, n_stop * sizeof *stop_ids);
    uint32_t o = 0;
    for (uint32_t i = 0; i < n_tokens; i++) {
        vi->off[i] = o;
        memcpy(vi->blob + o, tokens[i].ptr, tokens[i].len);
        o += (uint32_t)tokens[i].len;
        vi->added[i] = added ? added[i] : 0;
    }
    vi->off[n_tokens] = o;
    if (build_tries(vi)) {
        kipp_vocab_index_free(vi);
        return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for the vocabulary tries");
    }
    *out = vi;
    return 0;
}

void kipp_vocab_index_free(kipp_vocab_index *vi)
{
    if (!vi) return;
    free(vi->blob), free(vi->off), free(vi->added);
    free(vi->all.nodes), free(vi->all.ids), free(vi->odd.nodes), free(vi->odd.ids);
    free(vi->plain), free(vi->plain_cp), free(vi->framing);
    free(vi);
}

/* The model's tokens as raw bytes, with their added/special flags. */
static int index_model(kipp_model *model, kipp_vocab_index **out, char *err, size_t errlen)
{
    const struct kipp_tokenizer *t = model->tok;
    if (!t) return kipp_err(err, errlen, KIPP_ENOTSUP, "the model has no tokenizer: constrained output needs one");
    kipp_model_info info;
    kipp_model_get_info(model, &info);
    uint32_t n = (uint32_t)t->n_tokens;
    kipp_str *toks = calloc(n, sizeof *toks);
    uint8_t *added = calloc(n, 1);
    char *buf = malloc((size_t)n * 16 + 65536), tmp[4096];
    size_t used = 0, cap = (size_t)n * 16 + 65536;
    int rc = 0;
    for (uint32_t id = 0; buf && toks && added && id < n && !rc; id++) {
        kipp_str b = kipp_tokenizer_token_bytes(t, id, tmp, sizeof tmp);
        if (used + b.len > cap) {
            rc = kipp_err(err, errlen, KIPP_ENOMEM, "vocabulary bytes exceed %zu", cap);
            break;
        }
        memcpy(buf + used, b.ptr, b.len);
        toks[id] = (kipp_str){.ptr = buf + used, .len = b.len};
        used += b.len;
        if (t->is_added[id]) {
            added[id] = 1;
            for (size_t a = 0; a < t->n_added; a++)
                if (t->added_ids[a] == id && t->added_special[a]) added[id] = 2;
        }
    }
    if (!buf || !toks || !added) rc = kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for the vocabulary");
    if (!rc) rc = kipp_vocab_index_build(toks, added, n, info.vocab_size, info.stop_ids, info.n_stop, out, err, errlen);
    free(toks), free(added), free(buf);
    return rc;
}

const kipp_vocab_index *kipp_vocab_index_of(kipp_model *model, char *err, size_t errlen)
{
    pthread_mutex_lock(&g_index_mu);
    if (!model->gvi) index_model(model, &model->gvi, err, errlen);
    const kipp_vocab_index *vi = model->gvi;
    pthread_mutex_unlock(&g_index_mu);
    return vi;
}
