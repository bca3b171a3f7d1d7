/*
 * bench_tokenizer.c - single-threaded encode throughput of the native
 * tokenizer. Driven by tools/bench_tokenizer.py, which
 * writes the corpus, runs Hugging Face `tokenizers` on the same bytes and
 * writes the results/ JSON (schema kipp.bench.v1, bench/README.md).
 *
 *   bench_tokenizer --model F.gguf (--corpus FILE | --repeat STR --bytes N)
 *                   [--reps N] [--warmup N] [--special] [--ids-out FILE]
 *
 * The whole input is encoded in one kipp_tokenize call per repetition.
 * Prints one JSON object: bytes, tokens, reps and the median/min/max of MB/s
 * (1 MB = 10^6 bytes) and tokens/s over the timed repetitions.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/safe_io.h"
#include "engine/internal.h"
#include "kernels/common.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char *load_input(const char *corpus, const char *repeat, size_t want, size_t *len)
{
    if (repeat) { /* one synthetic line: STR repeated to `want` bytes */
        size_t k = strlen(repeat);
        char *s = k ? malloc(want) : NULL;
        for (size_t i = 0; s && i < want; i++) s[i] = repeat[i % k];
        *len = want;
        return s;
    }
    FILE *f = fopen(corpus, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n > 0 ? malloc((size_t)n) : NULL;
    *len = s ? fread(s, 1, (size_t)n, f) : 0;
    fclose(f);
    return s;
}

/* "bench_tokenizer: err" with file-derived text escaped (base/safe_io.h). */
static void report(const char *err)
{
    fputs("bench_tokenizer: ", stderr);
    kipp_fput_escaped(stderr, err, strlen(err));
    fputc('\n', stderr);
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *corpus = NULL, *repeat = NULL, *ids_out = NULL;
    size_t want = 10u << 20;
    int reps = 5, warmup = 1, flags = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: bench_tokenizer --model F.gguf (--corpus FILE | --repeat STR --bytes N) "
                   "[--reps 1..1000] [--warmup N] [--special] [--ids-out FILE]\n");
            return 0;
        }
        if (!strcmp(a, "--special")) { flags = KIPP_TOK_SPECIAL; continue; }
        if (!v) { fprintf(stderr, "bench_tokenizer: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--model")) model_path = v;
        else if (!strcmp(a, "--corpus")) corpus = v;
        else if (!strcmp(a, "--repeat")) repeat = v;
        else if (!strcmp(a, "--bytes")) want = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--reps")) reps = atoi(v);
        else if (!strcmp(a, "--warmup")) warmup = atoi(v);
        else if (!strcmp(a, "--ids-out")) ids_out = v;
        else { fprintf(stderr, "bench_tokenizer: unknown argument %s\n", a); return 2; }
    }
    if (!model_path || !!corpus == !!repeat || reps < 1 || reps > 1000 || warmup < 0) {
        fprintf(stderr, "usage: bench_tokenizer --model F.gguf (--corpus FILE | --repeat STR --bytes N) "
                        "[--reps 1..1000] [--warmup N] [--special] [--ids-out FILE]\n");
        return 2;
    }
    char err[512];
    kipp_model *m = NULL;
    if (kipp_model_load(model_path, &m, err, sizeof err)) {
        report(err);
        return 1;
    }
    size_t len = 0, n_ids = 0;
    char *text = load_input(corpus, repeat, want, &len);
    uint32_t *ids = text ? malloc((len + 1) * sizeof *ids) : NULL; /* >= 1 byte per token */
    double *t = malloc((size_t)reps * sizeof *t);
    if (!text || !ids || !t) {
        fprintf(stderr, "bench_tokenizer: cannot load the input (%s) or allocate for %zu bytes\n",
                corpus ? corpus : "--repeat", len);
        return 1;
    }
    for (int r = -warmup; r < reps; r++) {
        double t0 = now_s();
        if (kipp_tokenize(m, text, len, flags, ids, len + 1, &n_ids, err, sizeof err)) {
            report(err);
            return 1;
        }
        if (r >= 0) t[r] = now_s() - t0;
    }
    if (ids_out) { /* u32 little-endian, for the HF cross-check; never over an input */
        const char *inputs[] = {model_path, corpus};
        kipp_outfile of;
        int wrc = kipp_outfile_open(&of, ids_out, inputs, 2, err, sizeof err);
        if (!wrc && fwrite(ids, sizeof *ids, n_ids, of.f) != n_ids) {
            kipp_outfile_abort(&of);
            snprintf(err, sizeof err, "cannot write --ids-out %s", ids_out);
            wrc = -1;
        } else if (!wrc) {
            wrc = kipp_outfile_commit(&of, err, sizeof err);
        }
        if (wrc) {
            report(err);
            return 1;
        }
    }
    double med = kipp_median(t, (size_t)reps);
    json_t *o = json_pack("{s:I, s:I, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "bytes", (json_int_t)len,
                          "tokens", (json_int_t)n_ids, "reps", reps, "warmup", warmup, "median_s", med, "min_s",
                          t[0], "max_s", t[reps - 1], "mb_s_median", len / med / 1e6, "mb_s_min",
                          len / t[reps - 1] / 1e6, "mb_s_max", len / t[0] / 1e6, "tokens_per_s", n_ids / med);
    json_dumpf(o, stdout, JSON_COMPACT);
    putchar('\n');
    json_decref(o);
    free(t);
    free(ids);
    free(text);
    kipp_model_close(m);
    return 0;
}
