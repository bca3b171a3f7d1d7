/*
 * bench_rerank.c - rerank documents per second through the engine
 * (kipp_rerank_prepare + kipp_rerank_score, engine/rerank.c) on a pooled
 * model: B documents of --doc-tokens tokens each under one query, the query's
 * prefix evaluated once per request and forked. Each repetition asks a new
 * query (its number appended), so no repetition finds its prefix in the KV
 * pool: the prefix is evaluated every time, as for a stream of distinct queries.
 *
 * Prints one JSON object on stdout: per batch size the median, min and max
 * seconds per request (tokenizing included), documents/s at the median, the
 * documents' measured token count and the prefix counters of the last
 * repetition (kipp_rerank_stats) and of the pool (kipp_pool_stats).
 * tools/rerank_bench.py runs it beside llama-server and writes results/.
 *
 * Usage: bench_rerank --model F [--docs 1,16,64] [--doc-tokens 128] [--reps 3] [--threads N] [--pool-mib 2048]
 *                     [--batch-tokens 4096]
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_harness.h"
#include "engine/kipp.h"

/* Common English words, each one token with its leading space in the Qwen vocabulary (checked at run time). */
static const char *const WORDS[] = {"the", "city", "river", "north", "water", "house", "people", "time", "world", "light",
                                    "market", "bridge", "winter", "school", "garden", "music", "history", "paper",
                                    "summer", "forest", "road", "island", "church", "train", "field", "stone", "power",
                                    "book", "money", "night", "story", "place"};
#define N_WORDS (sizeof WORDS / sizeof WORDS[0])

/* Document d of n words: word (d + 7k) mod N_WORDS, k = 0..n-1, joined by spaces. */
static char *make_doc(size_t d, uint32_t n)
{
    size_t cap = (size_t)n * 10 + 1, len = 0;
    char *s = malloc(cap);
    for (uint32_t k = 0; s && k < n; k++)
        len += (size_t)snprintf(s + len, cap - len, "%s%s", k ? " " : "", WORDS[(d + 7u * k) % N_WORDS]);
    return s;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One request of B documents under query q; seconds, stats into *st. */
static double one_request(kipp_model *m, const char *q, char **docs, size_t *lens, size_t B, uint32_t batch_tokens,
                          float *scores, kipp_rerank_stats *st, uint32_t *doc_tokens)
{
    kipp_rerank_request rq = {.query = q, .query_len = strlen(q), .docs = (const char *const *)docs, .doc_lens = lens, .n_docs = B};
    kipp_rerank *r = NULL;
    char err[256] = "";
    double t0 = kipp_timer_now();
    if (kipp_rerank_prepare(m, &rq, &r, err, sizeof err) || kipp_rerank_score(m, r, batch_tokens, scores, st, err, sizeof err)) {
        fprintf(stderr, "bench_rerank: %s\n", err);
        exit(1);
    }
    double t = kipp_timer_now() - t0;
    kipp_rerank_free(r);
    /* the document's own tokens, as it follows "<Document>:" (with its leading space) */
    size_t n = 0, cap = lens[0] + 16;
    char *sp = malloc(lens[0] + 2);
    uint32_t *ids = malloc(cap * sizeof *ids);
    sp[0] = ' ', memcpy(sp + 1, docs[0], lens[0]);
    kipp_tokenize(m, sp, lens[0] + 1, 0, ids, cap, &n, err, sizeof err);
    *doc_tokens = (uint32_t)n;
    free(sp), free(ids);
    return t;
}

static json_t *run_batch(kipp_model *m, size_t B, uint32_t words, int reps, uint32_t batch_tokens, int *qn)
{
    char **docs = calloc(B, sizeof *docs);
    size_t *lens = calloc(B, sizeof *lens);
    float *scores = calloc(B, sizeof *scores);
    double *t = calloc((size_t)reps, sizeof *t);
    kipp_rerank_stats st = {0};
    uint32_t doc_tokens = 0;
    for (size_t d = 0; d < B; d++) docs[d] = make_doc(d, words), lens[d] = strlen(docs[d]);
    for (int r = 0; r < reps; r++) {
        char q[128];
        snprintf(q, sizeof q, "(query %d) Which passage describes the river that runs north of the old market?", (*qn)++);
        t[r] = one_request(m, q, docs, lens, B, batch_tokens, scores, &st, &doc_tokens);
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    double med = t[reps / 2];
    kipp_pool_stats ps = {0};
    kipp_model_pool_stats(m, &ps);
    json_t *o = json_pack("{s:I, s:I, s:f, s:f, s:f, s:f, s:I, s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I}, s:{s:I, s:I}}",
                          "documents", (json_int_t)B, "doc_tokens", (json_int_t)doc_tokens, "median_s", med, "min_s", t[0],
                          "max_s", t[reps - 1], "docs_per_s", (double)B / med, "reps", (json_int_t)reps, "last_stats",
                          "prompt_tokens", (json_int_t)st.prompt_tokens, "prefix_tokens", (json_int_t)st.prefix_tokens,
                          "prefix_cached", (json_int_t)st.prefix_cached, "prefix_evaluated", (json_int_t)st.prefix_evaluated,
                          "prefix_reused", (json_int_t)st.prefix_reused, "tokens_evaluated", (json_int_t)st.tokens_evaluated,
                          "eval_calls", (json_int_t)st.eval_calls, "pool", "hits", (json_int_t)ps.hits, "misses",
                          (json_int_t)ps.misses);
    for (size_t d = 0; d < B; d++) free(docs[d]);
    free(docs), free(lens), free(scores), free(t);
    return o;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *list = "1,16,64";
    int reps = 3, threads = 0;
    uint32_t words = 128, batch_tokens = 4096;
    uint64_t pool = 2048;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) model = argv[i + 1];
        else if (!strcmp(argv[i], "--docs")) list = argv[i + 1];
        else if (!strcmp(argv[i], "--doc-tokens")) words = (uint32_t)atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--pool-mib")) pool = (uint64_t)atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch-tokens")) batch_tokens = (uint32_t)atoi(argv[i + 1]);
        else return fprintf(stderr, "bench_rerank: unknown option %s\n", argv[i]), 2;
    }
    if (!model || reps < 1 || words < 1)
        return fprintf(stderr, "usage: bench_rerank --model F [--docs 1,16,64] [--doc-tokens N] [--reps N] [--threads N] "
                               "[--pool-mib M] [--batch-tokens T]\n"), 2;
    kipp_model_options mo = {.n_threads = threads};
    kipp_model *m = NULL;
    char err[256] = "";
    if (kipp_model_open_pooled(model, "cpu", &mo, pool, &m, err, sizeof err))
        return fprintf(stderr, "bench_rerank: %s\n", err), 1;
    json_t *rows = json_array();
    int qn = 0;
    char *l = strdup(list);
    for (char *tok = strtok(l, ","); tok; tok = strtok(NULL, ",")) json_array_append_new(rows, run_batch(m, (size_t)atol(tok), words, reps, batch_tokens, &qn));
    free(l);
    kipp_model_info info;
    kipp_model_get_info(m, &info);
    json_t *o = json_pack("{s:s, s:s, s:s, s:i, s:I, s:o}", "engine", "kipp", "model", model, "checkpoint", info.checkpoint_id,
                          "threads", threads, "batch_tokens", (json_int_t)batch_tokens, "rows", rows);
    char *s = json_dumps(o, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    puts(s);
    free(s);
    json_decref(o);
    kipp_model_close(m);
    return 0;
}
