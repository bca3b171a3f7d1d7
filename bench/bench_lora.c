/*
 * bench_lora.c - LoRA merge time at real model shapes:
 * all seven projections of every layer of a registry checkpoint's shape
 * (default synthetic-0.6b and synthetic-1.7b), each weight format Kipp stores
 * them in (bf16, q8_0, affine4_gs32), one kipp_lora_merge call over all
 * tensors as kipp_model_open makes it. Source tensors are synthetic (valid
 * block scales, random codes), one distinct buffer per tensor so no layer
 * reads another's bytes from cache; factors are rank --rank with a delta of
 * about a third of a Q8_0 step. Adapter file reading and validation are not
 * included (they touch only the factors, r*(n_in+n_out) values per target).
 *
 * Writes results/<date>-<host>-<cpu>-lora-<sha>.json (kipp.bench.v1): one
 * row per (checkpoint, format), seconds per merge, with bytes (read + write)
 * and FLOPs (2*r per weight for the delta) per repetition.
 *
 * Usage: bench_lora [--checkpoint ID]... [--rank R] [--reps N] [--threads N] [--results DIR] [--no-write]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_harness.h"
#include "engine/lora.h"
#include "kernels/common.h"

#define MAX_CKPT 4
#define N_PROJ 7

static uint64_t rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* One [rows][cols] tensor of format fmt: valid scales (~0.01), random codes or BF16 values. */
static void fill(uint32_t fmt, uint8_t *p, size_t rows, size_t cols, uint64_t *s)
{
    if (fmt == KIPP_DTYPE_BF16) {
        uint16_t *w = (uint16_t *)p;
        for (size_t i = 0; i < rows * cols; i++) w[i] = kipp_f32_to_bf16((float)((int64_t)(rng(s) % 2001) - 1000) * 2e-5f);
        return;
    }
    size_t bb = fmt == KIPP_DTYPE_Q8_0 ? 34 : 20, nb = rows * cols / 32;
    uint16_t d = kipp_f32_to_f16(0.01f), m = kipp_f32_to_f16(-0.08f);
    for (size_t b = 0; b < nb; b++) {
        uint8_t *q = p + bb * b;
        memcpy(q, &d, 2);
        if (fmt == KIPP_DTYPE_Q4_1) memcpy(q + 2, &m, 2);
        for (size_t j = fmt == KIPP_DTYPE_Q8_0 ? 2 : 4; j < bb; j += 8) {
            uint64_t r = rng(s);
            memcpy(q + j, &r, bb - j < 8 ? bb - j : 8);
        }
        if (fmt == KIPP_DTYPE_Q8_0) /* codes in -127..127, as the converter writes */
            for (size_t j = 2; j < bb; j++) if (q[j] == 0x80) q[j] = 0x81;
    }
}

typedef struct {
    kipp_lora_job *jobs;
    size_t n;
    uint64_t seed;
    int threads;
    int rc;
} merge_arg;

static void run_merge(void *arg, int ith, int nth)
{
    (void)nth;
    merge_arg *a = arg;
    if (ith) return; /* the merge starts its own workers, as at model open */
    char err[256];
    a->rc |= kipp_lora_merge(a->jobs, a->n, a->threads, a->seed++, KIPP_LORA_STOCHASTIC, NULL, err, sizeof err);
}

/* Time the merge of every projection of checkpoint c stored as fmt; one result row. */
static int bench_one(const kipp_checkpoint *c, uint32_t fmt, const char *fname, uint32_t r, int reps, int threads,
                     json_t *res)
{
    const uint64_t d = c->d_model, a = kipp_attn_width(c), kv = (uint64_t)c->n_kv_head * c->head_dim, ff = c->d_ff;
    const uint64_t shape[N_PROJ][2] = {{a, d}, {kv, d}, {kv, d}, {d, a}, {ff, d}, {ff, d}, {d, ff}};
    size_t n = (size_t)N_PROJ * c->n_layer;
    kipp_lora_job *jobs = calloc(n, sizeof *jobs);
    kipp_lora_term *terms = calloc(N_PROJ, sizeof *terms);
    const kipp_fmt_facts *f = kipp_fmt_by_gguf(fmt);
    double bytes = 0, weights = 0;
    uint64_t s = 1;
    int rc = jobs && terms ? 0 : -1;
    for (int k = 0; k < N_PROJ && !rc; k++) { /* one factor pair per projection shape, shared by the layers */
        float *p = malloc(shape[k][0] * r * sizeof *p), *q = malloc(r * shape[k][1] * sizeof *q);
        if (!p || !q) { rc = -1; free(p); free(q); break; }
        for (size_t i = 0; i < shape[k][0] * r; i++) p[i] = (float)((int64_t)(rng(&s) % 2001) - 1000) * 1e-3f;
        for (size_t i = 0; i < r * shape[k][1]; i++) q[i] = (float)((int64_t)(rng(&s) % 2001) - 1000) * 1e-3f * 0.003f / (float)r;
        terms[k] = (kipp_lora_term){.p = p, .q = q, .r = r};
    }
    for (size_t i = 0; i < n && !rc; i++) {
        int k = (int)(i % N_PROJ);
        size_t nb = kipp_fmt_file_bytes(f, shape[k][0], shape[k][1]);
        uint8_t *src = kipp_aligned_alloc(nb), *dst = kipp_aligned_alloc(nb);
        if (!src || !dst) { rc = -1; kipp_aligned_free(src); kipp_aligned_free(dst); break; }
        if (i < N_PROJ) fill(fmt, src, shape[k][0], shape[k][1], &s);
        else memcpy(src, jobs[k].src, nb); /* same content, distinct memory */
        jobs[i] = (kipp_lora_job){.dtype = fmt, .rows = shape[k][0], .cols = shape[k][1], .src = src, .dst = dst,
                                  .tensor_id = (uint32_t)i, .terms = &terms[k], .n_terms = 1};
        bytes += 2.0 * nb;
        weights += (double)shape[k][0] * shape[k][1];
    }
    if (!rc) {
        char err[256];
        kipp_team *team = kipp_team_create(1, err, sizeof err);
        merge_arg ma = {.jobs = jobs, .n = n, .threads = threads};
        kipp_bench_stats st;
        kipp_bench_run(team, run_merge, &ma, 1, reps, &st);
        kipp_team_destroy(team);
        rc = ma.rc;
        char name[128];
        snprintf(name, sizeof name, "merge/%s/%s/r%u", c->id, fname, r);
        json_t *row = kipp_result_add(res, name, &st, bytes, 2.0 * r * weights, "compute", 0);
        json_object_set_new(row, "tensors", json_integer((json_int_t)n));
        json_object_set_new(row, "weights", json_real(weights));
        json_object_set_new(row, "merged_bytes", json_real(bytes / 2));
        printf("%-34s %3zu tensors %6.0f MiB  merge median %.3f s (min %.3f, max %.3f)\n", name, n, bytes / 2 / 1048576.0,
               st.median, st.min, st.max);
    }
    for (size_t i = 0; jobs && i < n; i++) kipp_aligned_free((void *)jobs[i].src), kipp_aligned_free(jobs[i].dst);
    for (int k = 0; terms && k < N_PROJ; k++) free((void *)terms[k].p), free((void *)terms[k].q);
    free(jobs), free(terms);
    return rc;
}

int main(int argc, char **argv)
{
    const char *ids[MAX_CKPT] = {0}, *dir = "results";
    int n_ids = 0, reps = 3, threads = 0, write = 1;
    unsigned rank = 16;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--checkpoint") && v && n_ids < MAX_CKPT) ids[n_ids++] = argv[++i];
        else if (!strcmp(argv[i], "--rank") && v) rank = (unsigned)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && v) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && v) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--results") && v) dir = argv[++i];
        else if (!strcmp(argv[i], "--no-write")) write = 0;
        else {
            fprintf(stderr, "usage: bench_lora [--checkpoint ID]... [--rank R] [--reps N] [--threads N] "
                            "[--results DIR] [--no-write]\n");
            return 2;
        }
    }
    if (rank < 1 || rank > 1024 || reps < 1 || reps > 64 || threads < 0) {
        fprintf(stderr, "bench_lora: --rank %u, --reps %d, --threads %d: expected 1..1024, 1..64, >= 0\n", rank, reps, threads);
        return 2;
    }
    if (!n_ids) ids[n_ids++] = "synthetic-0.6b", ids[n_ids++] = "synthetic-1.7b";
    json_t *cfg = json_pack("{s:i, s:i, s:i, s:f, s:s}", "rank", rank, "reps", reps, "threads", threads,
                            "load_avg_1min_at_start", kipp_load_average(), "rounding", "stochastic");
    json_object_set_new(cfg, "cpu", kipp_cpu_json());
    json_t *doc = kipp_result_create("lora", NULL, cfg), *res = json_object_get(doc, "results");
    static const struct { uint32_t fmt; const char *name; } fmts[] = {
        {KIPP_DTYPE_BF16, "bf16"}, {KIPP_DTYPE_Q8_0, "q8_0"}, {KIPP_DTYPE_Q4_1, "affine4_gs32"}};
    for (int i = 0; i < n_ids; i++) {
        const kipp_checkpoint *c = kipp_checkpoint_by_id(ids[i]);
        if (!c) {
            fprintf(stderr, "bench_lora: unknown checkpoint id '%s' (`kipp registry` lists them)\n", ids[i]);
            return 2;
        }
        for (size_t k = 0; k < sizeof fmts / sizeof fmts[0]; k++)
            if (bench_one(c, fmts[k].fmt, fmts[k].name, rank, reps, threads, doc)) {
                fprintf(stderr, "bench_lora: %s/%s failed (out of memory?)\n", ids[i], fmts[k].name);
                return 1;
            }
    }
    (void)res;
    char path[1024], err[512];
    if (write && kipp_result_write(doc, dir, "lora", path, sizeof path, err, sizeof err)) {
        fprintf(stderr, "bench_lora: %s\n", err);
        return 1;
    }
    if (write) printf("wrote %s\n", path);
    json_decref(doc);
    return 0;
}
