/*
 * api_rerank.c - POST /v1/rerank (the Jina/Cohere shape llama-server and vLLM
 * share) and POST /v1/score (vLLM's), over engine/rerank.c (issue 56).
 *
 * /v1/rerank: {model?, query, documents: [string | {"text": string}], top_n?,
 * return_documents?, instruction?} -> {id, object, model, results: [{index,
 * relevance_score, document?: {text}}] best first, usage}. /v1/score: {model?,
 * text_1, text_2, instruction?}, each a string or a list: 1:1, 1:N or N:N
 * pairs (vLLM's rule) -> {id, object, created, model, data: [{index, object,
 * score}], usage}. text_1 is the query, text_2 the document.
 *
 * The prompts are tokenized here, under the tokenizer lock, so every bad input
 * is a 400 before anything is evaluated; the scores are computed on the
 * scheduler thread (serve_sched_run), which owns the engine.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/serve_http.h"

#define RR_MAX_DOCS 4096 /* documents (or pairs) per request */

/* One query and the documents scored against it. */
typedef struct {
    const char *query;
    size_t query_len;
    const char **docs;        /* into the request's JSON */
    size_t *lens;
    size_t n, first;          /* documents, index of the first in the request */
    kipp_rerank *r;           /* tokenized prompts */
} rr_group;

typedef struct {
    json_t *root;
    int score_api;
    const char *instruction;  /* NULL = the card's default */
    size_t instruction_len;
    rr_group *g;
    size_t n_groups, n_docs;
    int64_t top_n;            /* rerank: results kept, 0 = all */
    int return_documents;     /* rerank: 1 (default) */
    float *scores;            /* [n_docs] */
    kipp_rerank_stats st;     /* summed over groups */
    char err[256];
} rr_req;

#define BAD(param, ...) serve_fail(e, 400, "invalid_request_error", param, __VA_ARGS__)

/* A non-empty string field, or for documents / text_2 a possibly empty one. */
static int text_of(const json_t *v, const char *param, int empty_ok, const char **s, size_t *n, serve_error *e)
{
    if (!json_is_string(v)) return BAD(param, "%s must be a string, got %s", param, serve_json_type(v));
    *s = json_string_value(v), *n = json_string_length(v);
    if (!*n && !empty_ok) return BAD(param, "%s is empty, expected a non-empty string", param);
    return 0;
}

/* One document: a string, or an object {"text": string} (vLLM's RerankDocument). */
static int doc_of(const json_t *v, size_t i, const char **s, size_t *n, serve_error *e)
{
    char p[40];
    snprintf(p, sizeof p, "documents[%zu]", i);
    if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)v, k, x) if (strcmp(k, "text"))
            return BAD(p, "%s.%.40s is not supported, expected only \"text\"", p, k);
        if (!json_object_get(v, "text")) return BAD(p, "%s has no \"text\"", p);
        snprintf(p, sizeof p, "documents[%zu].text", i);
        return text_of(json_object_get(v, "text"), p, 1, s, n, e);
    }
    if (!json_is_string(v)) return BAD(p, "%s must be a string or an object {\"text\": string}, got %s", p, serve_json_type(v));
    return text_of(v, p, 1, s, n, e);
}

/* A list field's n entries into one group's arrays. */
static int alloc_docs(rr_group *g, size_t n, serve_error *e)
{
    g->docs = calloc(n ? n : 1, sizeof *g->docs), g->lens = calloc(n ? n : 1, sizeof *g->lens), g->n = n;
    return g->docs && g->lens ? 0 : serve_fail(e, 503, "server_error", "", "out of memory");
}

static int list_len(const json_t *v, const char *param, serve_error *e)
{
    size_t n = json_array_size(v);
    if (!n) return BAD(param, "%s is an empty list, expected at least one %s", param,
                       strcmp(param, "documents") ? "text" : "document");
    if (n > RR_MAX_DOCS) return BAD(param, "%s has %zu entries, more than the %d allowed", param, n, RR_MAX_DOCS);
    return 0;
}

static int parse_rerank(rr_req *q, serve_error *e)
{
    json_t *o = q->root, *docs = json_object_get(o, "documents"), *top = json_object_get(o, "top_n");
    json_t *rd = json_object_get(o, "return_documents");
    if (!json_object_get(o, "query")) return BAD("query", "query is missing, expected a non-empty string");
    if (!docs) return BAD("documents", "documents is missing, expected a list of strings or {\"text\": string} objects");
    if (!json_is_array(docs)) return BAD("documents", "documents must be a list, got %s", serve_json_type(docs));
    if (list_len(docs, "documents", e)) return -1;
    if (top && json_is_integer(top) && json_integer_value(top) < 1)
        return BAD("top_n", "top_n is %lld; expected an integer >= 1 (omit it for all documents)",
                   (long long)json_integer_value(top));
    if (top && !json_is_integer(top))
        return BAD("top_n", "top_n must be an integer >= 1 (omit it for all documents), got %s", serve_json_type(top));
    if (rd && !json_is_boolean(rd)) return BAD("return_documents", "return_documents must be a boolean, got %s", serve_json_type(rd));
    q->top_n = top ? json_integer_value(top) : 0;
    q->return_documents = !rd || json_is_true(rd);
    q->g = calloc(1, sizeof *q->g), q->n_groups = 1;
    if (!q->g || alloc_docs(q->g, json_array_size(docs), e)) return q->g ? -1 : serve_fail(e, 503, "server_error", "", "out of memory");
    if (text_of(json_object_get(o, "query"), "query", 0, &q->g->query, &q->g->query_len, e)) return -1;
    for (size_t i = 0; i < q->g->n; i++)
        if (doc_of(json_array_get(docs, i), i, &q->g->docs[i], &q->g->lens[i], e)) return -1;
    q->n_docs = q->g->n;
    return 0;
}

/* text_1 / text_2: a string or a non-empty list of strings; *n entries. */
static int score_side(const json_t *v, const char *param, int empty_ok, size_t *n, serve_error *e)
{
    if (!v) return BAD(param, "%s is missing, expected a string or a list of strings", param);
    if (json_is_array(v)) return list_len(v, param, e) ? -1 : (*n = json_array_size(v), 0);
    const char *s;
    size_t len;
    return text_of(v, param, empty_ok, &s, &len, e) ? -1 : (*n = 1, 0);
}

static const json_t *side_at(const json_t *v, size_t i) { return json_is_array(v) ? json_array_get(v, i) : v; }

static int parse_score(rr_req *q, serve_error *e)
{
    json_t *t1 = json_object_get(q->root, "text_1"), *t2 = json_object_get(q->root, "text_2");
    size_t n1 = 0, n2 = 0;
    if (score_side(t1, "text_1", 0, &n1, e) || score_side(t2, "text_2", 1, &n2, e)) return -1;
    if (n1 > 1 && n1 != n2)
        return BAD("text_2", "text_1 has %zu texts and text_2 %zu: expected one text_1, or as many text_2 as text_1", n1, n2);
    q->n_groups = n1, q->n_docs = n2;
    q->g = calloc(n1, sizeof *q->g);
    if (!q->g) return serve_fail(e, 503, "server_error", "", "out of memory");
    for (size_t i = 0; i < n1; i++) {
        rr_group *g = &q->g[i];
        char p1[32], p2[32];
        snprintf(p1, sizeof p1, json_is_array(t1) ? "text_1[%zu]" : "text_1", i);
        if (alloc_docs(g, n1 == 1 ? n2 : 1, e) || text_of(side_at(t1, i), p1, 0, &g->query, &g->query_len, e)) return -1;
        g->first = n1 == 1 ? 0 : i;
        for (size_t d = 0; d < g->n; d++) {
            snprintf(p2, sizeof p2, json_is_array(t2) ? "text_2[%zu]" : "text_2", g->first + d);
            if (text_of(side_at(t2, g->first + d), p2, 1, &g->docs[d], &g->lens[d], e)) return -1;
        }
    }
    return 0;
}

static int parse(const char *body, size_t len, rr_req *q, serve_error *e)
{
    static const char *const rerank_keys[] = {"model", "query", "documents", "top_n", "return_documents", "instruction", NULL};
    static const char *const score_keys[] = {"model", "text_1", "text_2", "instruction", NULL};
    json_error_t je;
    q->root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!q->root || !json_is_object(q->root))
        return BAD("", "the body is not a JSON object%s%s", q->root ? "" : ": ", q->root ? "" : je.text);
    const char *k;
    json_t *v;
    json_object_foreach(q->root, k, v) {
        int ok = 0;
        for (const char *const *a = q->score_api ? score_keys : rerank_keys; *a && !ok; a++) ok = !strcmp(k, *a);
        if (!ok) return BAD(k, "field '%.60s' is not supported by %s", k, q->score_api ? "/v1/score" : "/v1/rerank");
    }
    json_t *ins = json_object_get(q->root, "instruction"), *model = json_object_get(q->root, "model");
    if (model && !json_is_string(model)) return BAD("model", "model must be a string, got %s", serve_json_type(model));
    if (ins && text_of(ins, "instruction", 0, &q->instruction, &q->instruction_len, e)) return -1;
    return q->score_api ? parse_score(q, e) : parse_rerank(q, e);
}

static void req_free(rr_req *q)
{
    for (size_t i = 0; q->g && i < q->n_groups; i++) free(q->g[i].docs), free(q->g[i].lens), kipp_rerank_free(q->g[i].r);
    free(q->g);
    free(q->scores);
    json_decref(q->root);
}

/* Tokenize every group (tokenizer lock held): prompt too long -> 400 naming the document. */
static int prepare(serve_http *h, rr_req *q, serve_error *e)
{
    /* A prompt longer than the pool can hold beside its one copied tail block never fits: a 400, not a 503. */
    kipp_model_info mi;
    kipp_model_get_info(h->info.model, &mi);
    uint32_t limit = h->info.n_ctx;
    uint64_t pool_pos = mi.kv_pool_blocks > 1 ? ((uint64_t)mi.kv_pool_blocks - 1) * SERVE_KV_BLOCK : UINT64_MAX;
    if (pool_pos < limit) limit = (uint32_t)pool_pos;
    for (size_t i = 0; i < q->n_groups; i++) {
        rr_group *g = &q->g[i];
        kipp_rerank_request rq = {.query = g->query, .query_len = g->query_len, .instruction = q->instruction,
                                  .instruction_len = q->instruction_len, .docs = g->docs, .doc_lens = g->lens, .n_docs = g->n,
                                  .max_tokens = limit};
        char err[256] = "";
        int rc = kipp_rerank_prepare(h->info.model, &rq, &g->r, err, sizeof err);
        if (rc == KIPP_ERANGE) {
            int query = !strncmp(err, KIPP_RERANK_QUERY_TOO_LONG, sizeof KIPP_RERANK_QUERY_TOO_LONG - 1);
            const char *param = q->score_api ? (query ? "text_1" : "text_2") : (query ? "query" : "documents");
            serve_fail(e, 400, "invalid_request_error", param, "%s%s (n_ctx %u%s)",
                       q->n_groups > 1 ? "pair: " : "", err, h->info.n_ctx,
                       limit < h->info.n_ctx ? "; the KV pool holds one prompt of at most that many tokens: --kv-pool-mib" : "");
            snprintf(e->code, sizeof e->code, "context_length_exceeded");
            return -1;
        }
        if (rc) return serve_fail(e, rc == KIPP_ENOMEM ? 503 : 400, rc == KIPP_ENOMEM ? "server_error" : "invalid_request_error",
                                  "", "cannot build the reranker prompt: %s", err);
    }
    return 0;
}

/* On the scheduler thread: every group's scores. */
static int run_groups(kipp_model *m, void *ctx)
{
    rr_req *q = ctx;
    for (size_t i = 0; i < q->n_groups; i++) {
        kipp_rerank_stats st;
        int rc = kipp_rerank_score(m, q->g[i].r, 0, q->scores + q->g[i].first, &st, q->err, sizeof q->err);
        if (rc) return rc;
        q->st.prompt_tokens += st.prompt_tokens, q->st.prefix_tokens += st.prefix_tokens;
        q->st.prefix_cached += st.prefix_cached, q->st.prefix_evaluated += st.prefix_evaluated;
        q->st.prefix_reused += st.prefix_reused, q->st.tokens_evaluated += st.tokens_evaluated;
        q->st.eval_calls += st.eval_calls;
    }
    return 0;
}

/* usage: prompt tokens (the template and query counted in each prompt), and what the shared prefix saved. */
static json_t *usage_json(const rr_req *q)
{
    const kipp_rerank_stats *st = &q->st;
    return json_pack("{s:I, s:I, s:I, s:{s:I}, s:I, s:I, s:I, s:I}", "prompt_tokens", (json_int_t)st->prompt_tokens,
                     "total_tokens", (json_int_t)st->prompt_tokens, "completion_tokens", (json_int_t)0, "prompt_tokens_details",
                     "cached_tokens", (json_int_t)(st->prompt_tokens - st->tokens_evaluated), "prefix_tokens",
                     (json_int_t)st->prefix_tokens, "prefix_tokens_cached", (json_int_t)st->prefix_cached,
                     "prefix_tokens_evaluated", (json_int_t)st->prefix_evaluated, "tokens_evaluated",
                     (json_int_t)st->tokens_evaluated);
}

typedef struct {
    float score;
    size_t index;
} rr_rank;

/* Best first; equal scores keep request order. */
static int by_score(const void *a, const void *b)
{
    const rr_rank *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

static json_t *render_rerank(const serve_http *h, const rr_req *q, const char *id)
{
    size_t n = q->n_docs;
    rr_rank *order = malloc(n * sizeof *order);
    if (!order) return NULL;
    for (size_t i = 0; i < n; i++) order[i] = (rr_rank){q->scores[i], i};
    qsort(order, n, sizeof *order, by_score);
    if (q->top_n && (uint64_t)q->top_n < n) n = (size_t)q->top_n;
    json_t *res = json_array();
    for (size_t k = 0; k < n; k++) {
        size_t i = order[k].index;
        json_t *r = json_pack("{s:I, s:f}", "index", (json_int_t)i, "relevance_score", (double)order[k].score);
        if (q->return_documents)
            json_object_set_new(r, "document", json_pack("{s:o}", "text", serve_json_text(q->g->docs[i], q->g->lens[i])));
        json_array_append_new(res, r);
    }
    free(order);
    return json_pack("{s:s, s:s, s:s, s:o, s:o}", "id", id, "object", "list", "model", h->info.model_id, "results", res,
                     "usage", usage_json(q));
}

static json_t *render_score(const serve_http *h, const rr_req *q, const char *id)
{
    json_t *data = json_array();
    for (size_t i = 0; i < q->n_docs; i++)
        json_array_append_new(data, json_pack("{s:I, s:s, s:f}", "index", (json_int_t)i, "object", "score", "score",
                                              (double)q->scores[i]));
    return json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", id, "object", "list", "created", (json_int_t)time(NULL), "model",
                     h->info.model_id, "data", data, "usage", usage_json(q));
}

int serve_rerank(serve_http *h, const char *body, size_t len, int score_api, char **json, serve_error *e)
{
    rr_req q = {.score_api = score_api};
    json_t *model;
    int rc = parse(body, len, &q, e) ? -1 : 0; /* the route refused other roles (serve_http.c role_refuses) */
    if (!rc && (model = json_object_get(q.root, "model")) && !serve_model_known(h, json_string_value(model))) {
        serve_fail(e, 404, "invalid_request_error", "model", "model '%.100s' is not served here, expected '%s' (GET /v1/models)",
                   json_string_value(model), h->info.model_id);
        snprintf(e->code, sizeof e->code, "model_not_found");
        rc = -1;
    }
    if (!rc && !(q.scores = calloc(q.n_docs, sizeof *q.scores))) rc = serve_fail(e, 503, "server_error", "", "out of memory");
    if (!rc) {
        pthread_mutex_lock(serve_tokenizer_mutex(h->sched));
        rc = prepare(h, &q, e);
        pthread_mutex_unlock(serve_tokenizer_mutex(h->sched));
    }
    serve_task t = {.fn = run_groups, .ctx = &q};
    if (!rc && serve_sched_run(h->sched, &t))
        rc = serve_fail(e, t.rc == KIPP_ENOMEM ? 503 : 500, "server_error", "", "scoring failed: %s",
                        q.err[0] ? q.err : "the server is stopping");
    if (!rc) {
        pthread_mutex_lock(serve_sched_mutex(h->sched));
        serve_metrics_on_rerank(q.n_docs, &q.st);
        pthread_mutex_unlock(serve_sched_mutex(h->sched));
        serve_job *idj = calloc(1, sizeof *idj); /* for its random public id */
        if (idj) serve_job_set_id(idj, score_api ? "score-" : "rerank-");
        json_t *o = !idj ? NULL : score_api ? render_score(h, &q, idj->pub_id) : render_rerank(h, &q, idj->pub_id);
        free(idj);
        *json = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(o);
        if (!*json) rc = serve_fail(e, 503, "server_error", "", "out of memory");
    }
    req_free(&q);
    return rc;
}
