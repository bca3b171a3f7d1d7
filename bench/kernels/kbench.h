/*
 * kbench.h - what every kernel microbenchmark shares (bench/kernels/bench_x.c):
 * arguments, the pinned team, the kernel table of the selected ISA, the
 * machine profile for roofline shares, one result line per case, and the
 * results/<date>-<host>-kernels_<bench>-<sha>.json file (bench/README.md).
 *
 *   bench_<x> [--threads N] [--reps N] [--out DIR]   (KIPP_ISA=ref|avx2|avx512 picks the path)
 */
#ifndef KIPP_KBENCH_H
#define KIPP_KBENCH_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bench/bench_harness.h"
#include "kernels/cpu/kernels.h"

typedef struct {
    const char *bench;
    kipp_team *team;
    const k_cpu_ops *ops;
    kipp_profile prof;
    json_t *doc;
    int reps, nth;
    const char *out;
} kbench;

static int kbench_begin(kbench *b, const char *bench, int argc, char **argv)
{
    memset(b, 0, sizeof *b);
    b->bench = bench;
    b->reps = 15;
    b->out = "results";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) b->nth = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) b->reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) b->out = argv[++i];
        else {
            fprintf(stderr, "%s: unknown argument '%s'; expected [--threads N] [--reps N] [--out DIR]\n", bench, argv[i]);
            return -1;
        }
    }
    if (b->reps < 1) {
        fprintf(stderr, "%s: --reps %d must be >= 1\n", bench, b->reps);
        return -1;
    }
    char err[256];
    b->team = kipp_team_create(b->nth, err, sizeof err);
    if (!b->team) {
        fprintf(stderr, "%s: %s\n", bench, err);
        return -1;
    }
    b->nth = kipp_team_size(b->team);
    const char *note = NULL;
    b->ops = k_cpu_ops_get(kipp_isa_select(&note));
    if (note) fprintf(stderr, "%s: %s (%s)\n", bench, note, b->ops->isa);
    if (kipp_profile_load(&b->prof, "profiles", err, sizeof err) != 0)
        fprintf(stderr, "%s: %s; roofline shares are left null\n", bench, err);
    json_t *cfg = json_pack("{s:s, s:s, s:i, s:i}", "bench", bench, "isa", b->ops->isa, "threads",
                            b->nth, "reps", b->reps);
    b->doc = kipp_result_create("kernel", b->prof.path, cfg);
    printf("%s: isa %s, %d threads, profile %s\n", bench, b->ops->isa, b->nth,
           b->prof.loaded ? b->prof.path : "(none)");
    printf("%-44s %10s %10s %10s %9s %9s %7s\n", "case", "median_us", "min_us", "max_us", "GB/s", "GFLOP/s", "roof");
    return 0;
}

/* Roofline rate for a bound: DRAM read bandwidth of the thread count used,
 * or the compute peak (BF16 dot when the kernel runs on it, else FP32 FMA). */
static double kbench_roof(const kbench *b, const char *bound, int bf16_dot)
{
    if (!b->prof.loaded) return 0;
    if (!strcmp(bound, "memory")) return b->nth == 1 ? b->prof.read_gbps_1t : b->prof.read_gbps_all;
    if (bf16_dot && b->prof.bf16_gflops_all > 0) return b->prof.bf16_gflops_all * b->nth / kipp_team_cores();
    return b->prof.fp32_gflops_all * b->nth / kipp_team_cores();
}

/* Time fn over the team and record one result. */
static void kbench_case(kbench *b, const char *name, void (*fn)(void *, int, int), void *arg,
                        double bytes, double flops, const char *bound, int bf16_dot)
{
    kipp_bench_stats st;
    kipp_bench_run(b->team, fn, arg, 2, b->reps, &st);
    double roof = kbench_roof(b, bound, bf16_dot);
    json_t *r = kipp_result_add(b->doc, name, &st, bytes, flops, bound, roof);
    json_t *share = json_object_get(r, "roofline_share");
    printf("%-44s %10.1f %10.1f %10.1f %9.2f %9.2f %6.1f%%\n", name, st.median * 1e6, st.min * 1e6,
           st.max * 1e6, bytes / st.median * 1e-9, flops / st.median * 1e-9,
           json_is_number(share) ? 100 * json_number_value(share) : 0.0);
    fflush(stdout);
}

static int kbench_end(kbench *b)
{
    char path[700], err[256], tag[64];
    snprintf(tag, sizeof tag, "kernels_%s", b->bench);
    int rc = kipp_result_write(b->doc, b->out, tag, path, sizeof path, err, sizeof err);
    if (rc) fprintf(stderr, "%s: %s\n", b->bench, err);
    else printf("wrote %s\n", path);
    json_decref(b->doc);
    kipp_team_destroy(b->team);
    return rc ? 1 : 0;
}

/* Deterministic bf16 fill in [-amp, amp) (xorshift): benchmarks need values, not an oracle. */
/* A large benchmark buffer as the cpu backend allocates its packed weights
 * and KV (alloc_big): 2 MiB aligned and marked for transparent huge pages, so
 * kernel rates match the model's. NULL on failure; release with free(). */
static void *kbench_alloc_big(size_t bytes)
{
    void *p = NULL;
    const size_t huge = (size_t)2 << 20, n = (bytes + huge - 1) / huge * huge;
    if (posix_memalign(&p, huge, n) != 0) return NULL;
    madvise(p, n, MADV_HUGEPAGE); /* advisory: a refusal only costs TLB misses */
    return p;
}

static void kbench_fill_bf16(kipp_bf16 *p, size_t n, float amp)
{
    uint32_t s = 0x9e3779b9u;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13; s ^= s >> 17; s ^= s << 5;
        p[i] = kipp_f32_to_bf16(amp * ((float)(s >> 8) / 8388608.0f - 1.0f));
    }
}
static void kbench_fill_f32(float *p, size_t n, float amp)
{
    uint32_t s = 0x85ebca6bu;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13; s ^= s >> 17; s ^= s << 5;
        p[i] = amp * ((float)(s >> 8) / 8388608.0f - 1.0f);
    }
}

#endif
