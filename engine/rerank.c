/*
 * rerank.c - Qwen3-Reranker scoring (issue 56): the model card's prompt, the
 * softmax over the "yes" and "no" logits at the last position, and one
 * evaluation of the prefix every prompt shares.
 *
 * The prompt follows the card's transformers code byte for byte:
 * tokens(PREFIX) + tokens(body) + tokens(SUFFIX), the body tokenized as one
 * string (so the ids equal the card's, and vLLM PR #19260's query/document
 * template split, whose concatenation is the same text). PREFIX and SUFFIX
 * hold the chat markers; the body is plain text.
 *
 * Sharing: on a pooled model the longest common prefix of the prompts
 * (system prompt, instruction, query, "<Document>:") is evaluated once in a
 * session that first adopts what the KV pool already holds of it; every
 * document's session is then forked from it (full blocks shared, the partial
 * block copied: kipp_pool_session_fork) and evaluates only its own tokens.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/internal.h"
#include "engine/kv_pool.h"

static const char PREFIX[] = "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
                             "and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
                             "<|im_start|>user\n";
static const char SUFFIX[] = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";

struct kipp_rerank {
    size_t n;                 /* documents */
    uint32_t **ids;           /* [n] prompt ids */
    uint32_t *len;            /* [n] their lengths */
    uint32_t yes, no;         /* the two scored token ids */
    uint64_t prompt_tokens;
};

/* Tokenize text[len] with flags into a malloc'd *ids[*n]. */
static int tokenize(const kipp_model *m, const char *text, size_t len, int flags, uint32_t **ids, size_t *n, char *err,
                    size_t errlen)
{
    size_t cap = len + 16; /* byte-level BPE: at most one id per byte */
    *ids = malloc(cap * sizeof **ids);
    if (!*ids) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory tokenizing %zu bytes", len);
    int rc = kipp_tokenize(m, text, len, flags, *ids, cap, n, err, errlen);
    if (rc) free(*ids), *ids = NULL;
    return rc;
}

/* The one id of word ("yes" / "no"); KIPP_EFORMAT when it is not one token. */
static int one_token(const kipp_model *m, const char *word, uint32_t *id, char *err, size_t errlen)
{
    uint32_t *ids;
    size_t n;
    int rc = tokenize(m, word, strlen(word), 0, &ids, &n, err, errlen);
    if (rc) return rc;
    if (n == 1) *id = ids[0];
    free(ids);
    return n == 1 ? 0 : kipp_err(err, errlen, KIPP_EFORMAT, "\"%s\" is %zu tokens in this vocabulary, expected 1 (the "
                                 "reranker scores the \"yes\" and \"no\" tokens)", word, n);
}

/* body = "<Instruct>: I\n<Query>: Q\n<Document>: D" into a malloc'd buffer. */
static char *body_text(const kipp_rerank_request *rq, size_t d, size_t *len)
{
    const char *ins = rq->instruction ? rq->instruction : KIPP_RERANK_DEFAULT_INSTRUCTION;
    size_t il = rq->instruction ? rq->instruction_len : strlen(ins);
    const char *parts[] = {"<Instruct>: ", ins, "\n<Query>: ", rq->query, "\n<Document>: ", rq->docs[d]};
    size_t lens[] = {12, il, 10, rq->query_len, 13, rq->doc_lens[d]};
    size_t n = 0;
    for (int i = 0; i < 6; i++) n += lens[i];
    char *b = malloc(n + 1);
    if (!b) return NULL;
    for (int i = 0, o = 0; i < 6; o += (int)lens[i], i++) memcpy(b + o, parts[i], lens[i]);
    *len = n;
    return b;
}

/* Prompt d's ids: pre + body + suf. */
static int build_one(const kipp_model *m, const kipp_rerank_request *rq, size_t d, const uint32_t *pre, size_t npre,
                     const uint32_t *suf, size_t nsuf, kipp_rerank *r, char *err, size_t errlen)
{
    size_t blen, nb;
    char *body = body_text(rq, d, &blen);
    if (!body) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for document %zu's prompt", d);
    uint32_t *bids;
    int rc = tokenize(m, body, blen, 0, &bids, &nb, err, errlen);
    free(body);
    if (rc) return rc;
    size_t n = npre + nb + nsuf;
    uint32_t limit = rq->max_tokens ? rq->max_tokens : m->view.dims.context_length;
    if (n > limit) {
        free(bids);
        return kipp_err(err, errlen, KIPP_ERANGE, "document %zu's prompt is %zu tokens (the template and query included), "
                        "more than the %u allowed", d, n, limit);
    }
    r->ids[d] = malloc(n * sizeof *r->ids[d]);
    if (!r->ids[d]) return free(bids), kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for %zu ids", n);
    memcpy(r->ids[d], pre, npre * sizeof *pre);
    memcpy(r->ids[d] + npre, bids, nb * sizeof *bids);
    memcpy(r->ids[d] + npre + nb, suf, nsuf * sizeof *suf);
    free(bids);
    r->len[d] = (uint32_t)n;
    r->prompt_tokens += n;
    return 0;
}

/* The prompt with an empty document: too long means the query (or instruction) is to blame, not a document. */
static int query_fits(const kipp_model *m, const kipp_rerank_request *rq, size_t n_template, char *err, size_t errlen)
{
    static const char *const empty = "";
    static const size_t zero = 0;
    kipp_rerank_request q0 = *rq;
    q0.docs = &empty, q0.doc_lens = &zero, q0.n_docs = 1;
    size_t blen, nb;
    char *body = body_text(&q0, 0, &blen);
    if (!body) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for the query's prompt");
    uint32_t *bids;
    int rc = tokenize(m, body, blen, 0, &bids, &nb, err, errlen);
    free(body);
    if (rc) return rc;
    free(bids);
    uint32_t limit = rq->max_tokens ? rq->max_tokens : m->view.dims.context_length;
    if (n_template + nb > limit)
        return kipp_err(err, errlen, KIPP_ERANGE, KIPP_RERANK_QUERY_TOO_LONG " make a prompt of %zu tokens before any "
                        "document (the template included), more than the %u allowed", n_template + nb, limit);
    return 0;
}

static int build_all(const kipp_model *m, const kipp_rerank_request *rq, kipp_rerank *r, char *err, size_t errlen)
{
    uint32_t *pre = NULL, *suf = NULL;
    size_t npre, nsuf;
    int rc = one_token(m, "yes", &r->yes, err, errlen);
    if (!rc) rc = one_token(m, "no", &r->no, err, errlen);
    if (!rc) rc = tokenize(m, PREFIX, sizeof PREFIX - 1, KIPP_TOK_SPECIAL, &pre, &npre, err, errlen);
    if (!rc) rc = tokenize(m, SUFFIX, sizeof SUFFIX - 1, KIPP_TOK_SPECIAL, &suf, &nsuf, err, errlen);
    if (!rc) rc = query_fits(m, rq, npre + nsuf, err, errlen);
    for (size_t d = 0; d < rq->n_docs && !rc; d++) rc = build_one(m, rq, d, pre, npre, suf, nsuf, r, err, errlen);
    free(pre);
    free(suf);
    return rc;
}

int kipp_rerank_prepare(const kipp_model *m, const kipp_rerank_request *rq, kipp_rerank **out, char *err, size_t errlen)
{
    if (!m || !rq || !out || (!rq->query && rq->query_len) || (!rq->instruction && rq->instruction_len))
        return kipp_err(err, errlen, KIPP_EINVAL, "kipp_rerank_prepare: NULL model, request, out or text");
    *out = NULL;
    if (rq->n_docs == 0 || !rq->docs || !rq->doc_lens)
        return kipp_err(err, errlen, KIPP_EINVAL, "kipp_rerank_prepare: %zu documents given, expected at least 1", rq->n_docs);
    if (!rq->query) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_rerank_prepare: query is NULL");
    for (size_t d = 0; d < rq->n_docs; d++)
        if (!rq->docs[d] && rq->doc_lens[d]) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_rerank_prepare: document %zu is NULL", d);
    kipp_rerank *r = calloc(1, sizeof *r);
    if (r) r->ids = calloc(rq->n_docs, sizeof *r->ids), r->len = calloc(rq->n_docs, sizeof *r->len);
    if (!r || !r->ids || !r->len) {
        kipp_rerank_free(r);
        return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for %zu documents", rq->n_docs);
    }
    r->n = rq->n_docs;
    int rc = build_all(m, rq, r, err, errlen);
    if (rc) kipp_rerank_free(r);
    else *out = r;
    return rc;
}

const uint32_t *kipp_rerank_ids(const kipp_rerank *r, size_t i, uint32_t *n)
{
    if (!r || i >= r->n) return NULL;
    if (n) *n = r->len[i];
    return r->ids[i];
}

size_t kipp_rerank_count(const kipp_rerank *r) { return r ? r->n : 0; }

uint64_t kipp_rerank_prompt_tokens(const kipp_rerank *r) { return r ? r->prompt_tokens : 0; }

void kipp_rerank_free(kipp_rerank *r)
{
    if (!r) return;
    for (size_t i = 0; r->ids && i < r->n; i++) free(r->ids[i]);
    free(r->ids);
    free(r->len);
    free(r);
}

/* ---- scoring ---- */

/* Tokens every prompt shares, leaving each at least one of its own (its logits row). */
static uint32_t shared_prefix(const kipp_rerank *r)
{
    if (r->n < 2) return 0;
    uint32_t n = r->len[0] - 1;
    for (size_t d = 1; d < r->n; d++) {
        uint32_t k = 0, lim = r->len[d] - 1 < n ? r->len[d] - 1 : n;
        while (k < lim && r->ids[d][k] == r->ids[0][k]) k++;
        n = k;
    }
    return n;
}

/* P(yes) from a logits row: the two-way softmax, in double. */
static float yes_prob(const kipp_rerank *r, const float *row)
{
    double d = (double)row[r->no] - (double)row[r->yes];
    return (float)(1.0 / (1.0 + exp(d)));
}

/* The shared prefix's session: adopt what the pool holds, evaluate the rest. */
static int eval_prefix(kipp_model *m, const kipp_rerank *r, uint32_t np, kipp_session **out, kipp_rerank_stats *st,
                       char *err, size_t errlen)
{
    int rc = kipp_session_create(m, np, out, err, errlen);
    if (rc) return rc;
    int got = kipp_session_match_prefix(*out, r->ids[0], np, err, errlen);
    if (got < 0) return got;
    st->prefix_cached = (uint32_t)got;
    if ((uint32_t)got < np) {
        kipp_batch_item it = {.session = *out, .tokens = r->ids[0] + got, .token_count = np - (uint32_t)got};
        rc = kipp_eval_batch(m, &it, 1, err, errlen);
        st->eval_calls++;
        st->tokens_evaluated += np - (uint32_t)got;
    }
    st->prefix_evaluated = np - (uint32_t)got;
    return rc;
}

/* Documents [d0, d1) in one kipp_eval_batch, each forked from pre (NULL: from scratch). */
static int eval_group(kipp_model *m, const kipp_rerank *r, kipp_session *pre, uint32_t np, size_t d0, size_t d1,
                      float *rows, float *scores, kipp_rerank_stats *st, char *err, size_t errlen)
{
    size_t n = d1 - d0, V = m->view.dims.vocab_size;
    kipp_session **ss = calloc(n, sizeof *ss);
    kipp_batch_item *it = calloc(n, sizeof *it);
    int rc = ss && it ? 0 : kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for %zu sessions", n);
    for (size_t i = 0; i < n && !rc; i++) {
        size_t d = d0 + i;
        uint32_t start = np;
        rc = kipp_session_create(m, r->len[d], &ss[i], err, errlen);
        if (!rc && pre) rc = kipp_pool_session_fork(ss[i], pre, err, errlen);
        if (!rc && !pre && m->pool) { /* nothing shared in this call: what an earlier one left in the pool */
            int got = kipp_session_match_prefix(ss[i], r->ids[d], r->len[d] - 1, err, errlen);
            rc = got < 0 ? got : 0;
            start = got < 0 ? 0 : (uint32_t)got;
            st->prefix_cached += start;
        }
        it[i] = (kipp_batch_item){.session = ss[i], .tokens = r->ids[d] + start, .token_count = r->len[d] - start,
                                  .logits_count = 1, .logits = rows + i * V};
    }
    if (!rc) rc = kipp_eval_batch(m, it, n, err, errlen);
    for (size_t i = 0; i < n && !rc; i++) {
        scores[d0 + i] = yes_prob(r, rows + i * V);
        st->tokens_evaluated += it[i].token_count;
    }
    st->eval_calls++;
    for (size_t i = 0; ss && i < n; i++) {
        /* Keep the documents' own blocks out of the pool: only the prefix is worth finding again. */
        if (ss[i] && pre) kipp_session_truncate(ss[i], np / KIPP_KV_BLOCK * KIPP_KV_BLOCK, NULL, 0);
        kipp_session_destroy(ss[i]);
    }
    free(ss);
    free(it);
    return rc;
}

/* Pool blocks document d's forked session takes beyond the prefix's shared full blocks. */
static uint64_t doc_blocks(const kipp_rerank *r, uint32_t np, size_t d)
{
    return (r->len[d] + KIPP_KV_BLOCK - 1) / KIPP_KV_BLOCK - np / KIPP_KV_BLOCK;
}

/* End of the group starting at document a: documents while their own tokens fit budget and
 * their sessions' blocks fit max_blocks (at least one document). Short documents under a long
 * shared prefix would otherwise put thousands of sessions, one copied tail block each, in one call. */
static size_t group_end(const kipp_rerank *r, uint32_t np, uint32_t budget, uint64_t max_blocks, size_t a)
{
    size_t b = a + 1;
    uint64_t t = r->len[a] - np, blk = doc_blocks(r, np, a);
    for (; b < r->n && t + r->len[b] - np <= budget && blk + doc_blocks(r, np, b) <= max_blocks; b++)
        t += r->len[b] - np, blk += doc_blocks(r, np, b);
    return b;
}

/* Every document, in groups of at most budget tokens. */
static int eval_docs(kipp_model *m, const kipp_rerank *r, kipp_session *pre, uint32_t np, uint32_t budget, float *scores,
                     kipp_rerank_stats *st, char *err, size_t errlen)
{
    size_t V = m->view.dims.vocab_size, most = 1;
    /* half of what the pool can hand out now (the prefix's blocks are held by pre) */
    uint64_t max_blocks = m->pool ? kipp_kv_pool_available(m->pool) / 2 : UINT64_MAX;
    for (size_t a = 0, b; a < r->n; a = b)
        if ((b = group_end(r, np, budget, max_blocks, a)) - a > most) most = b - a;
    float *rows = malloc(most * V * sizeof *rows);
    if (!rows) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for %zu logits rows", most);
    int rc = 0;
    for (size_t a = 0, b; a < r->n && !rc; a = b) {
        b = group_end(r, np, budget, max_blocks, a);
        rc = eval_group(m, r, pre, np, a, b, rows, scores, st, err, errlen);
    }
    free(rows);
    return rc;
}

int kipp_rerank_score(kipp_model *m, const kipp_rerank *r, uint32_t batch_tokens, float *scores, kipp_rerank_stats *st,
                      char *err, size_t errlen)
{
    kipp_rerank_stats local;
    if (!st) st = &local;
    memset(st, 0, sizeof *st);
    if (!m || !r || !scores) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_rerank_score: NULL model, rerank or scores");
    st->prompt_tokens = r->prompt_tokens;
    uint32_t np = m->pool ? shared_prefix(r) : 0;
    kipp_session *pre = NULL;
    int rc = 0;
    if (np) {
        st->prefix_tokens = np;
        rc = eval_prefix(m, r, np, &pre, st, err, errlen);
        st->prefix_reused = (uint64_t)np * r->n;
    } else if (r->n > 1) {
        uint32_t common = shared_prefix(r);
        st->prefix_tokens = common;
        st->prefix_evaluated = (uint64_t)common * r->n;
    }
    if (!rc) rc = eval_docs(m, r, pre, np, batch_tokens ? batch_tokens : 4096, scores, st, err, errlen);
    kipp_session_destroy(pre); /* publish-at-finish: the prefix's full blocks stay findable */
    return rc;
}
