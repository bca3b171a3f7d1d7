/*
 * harness.h - Kipp's own benchmark harness (no Google Benchmark): monotonic timing with warm-up and N repetitions
 * (median/min/max), a team of threads pinned one per physical core through
 * hwloc, PAPI counters where the machine exposes them, the machine profile
 * (profiles/<host>.json, written by `make profile`) for roofline shares, and
 * result files in the kipp.bench.v1 schema written with jansson
 * (bench/README.md documents the schema).
 *
 * Errors: functions returning int give 0 or a negative KIPP_E*-style code (-1)
 * and fill (err, errlen) with one sentence naming the bad value.
 */
#ifndef KIPP_BENCH_HARNESS_H
#define KIPP_BENCH_HARNESS_H

#include <jansson.h>

#include "kernels/common.h"
#include <stddef.h>
#include <stdint.h>

/** Seconds on CLOCK_MONOTONIC. */
double kipp_timer_now(void);

/** 1-minute load average (getloadavg), -1 when unavailable: recorded beside
 * every figure, since other processes on the cores change rates. */
double kipp_load_average(void);

/** Share (0..1) of all CPUs' time that other processes and the hypervisor (steal) used during the next
 * `secs` seconds, this process's own time left out: whether the run about to start has the cores to
 * itself, which a load average that still remembers the previous run cannot say. -1 when /proc/stat or
 * /proc/self/stat cannot be read. Sleeps secs. */
double kipp_cpu_busy_others(double secs);

/** Timing of one benchmark: seconds per repetition. */
typedef struct {
    double median, min, max; /* seconds */
    int reps;                /* measured repetitions (after warm-up) */
    double cycles, instructions; /* PAPI per repetition on the calling thread; < 0 when unavailable */
} kipp_bench_stats;

/* ---- thread team ---- */

/** A team of nth threads, thread 0 being the caller, each pinned to its own
 * physical core: the pool the cpu backend runs on (base/threadpool.h). */
typedef struct kipp_team kipp_team;

/** Physical cores of this machine (hwloc); >= 1. */
int kipp_team_cores(void);

/**
 * Create a team of nth threads (0 = one per physical core; nth > cores is
 * refused). The caller becomes thread 0 and is pinned too. NULL on failure
 * with err filled. Free with kipp_team_destroy (accepts NULL).
 */
kipp_team *kipp_team_create(int nth, char *err, size_t errlen);
void kipp_team_destroy(kipp_team *team);
int kipp_team_size(const kipp_team *team);

/** Run fn(arg, ith, nth) on every thread of the team and wait for all. */
void kipp_team_run(kipp_team *team, void (*fn)(void *arg, int ith, int nth), void *arg);

/**
 * Warm up (warmup runs) then time reps runs of fn on the team; fills st.
 * PAPI (PAPI_TOT_CYC, PAPI_TOT_INS) counts the calling thread when available.
 * reps < 1 runs once; when the heap array for more than 64 reps cannot be
 * had, 64 run, and st->reps says how many did.
 */
void kipp_bench_run(kipp_team *team, void (*fn)(void *arg, int ith, int nth), void *arg,
                    int warmup, int reps, kipp_bench_stats *st);

/** Whether PAPI counters work here; *why gets a sentence when they do not. */
int kipp_papi_available(const char **why);

/* ---- machine profile ---- */

/** What the roofline needs from profiles/<host>-<level>.json (bench/README.md). */
typedef struct {
    char path[512];            /* "profiles/<host>-<level>-<cpu id>.json" (kipp_profile_key) */
    int loaded;                /* 0 when the file is missing or unreadable */
    double read_gbps_1t;       /* streaming DRAM read, one core, GB/s (1e9 B/s) */
    double read_gbps_all;      /* all physical cores */
    double fp32_gflops_all;    /* FP32 FMA peak, all cores, best ISA */
    double bf16_gflops_all;    /* vdpbf16ps peak, all cores; 0 when the CPU lacks it */
    double int8_gops_all;      /* vpdpbusd peak, all cores, 2 ops per byte product; 0 when absent or not recorded */
} kipp_profile;

/** Host name (gethostname), "unknown-host" on failure. */
const char *kipp_host_name(void);

/**
 * Name of this machine's profile file without ".json": "<host>-<best ISA
 * level>-<cpu id>", e.g. "vm-avx512_bf16-amd-f26m2". Every machine here is
 * called "vm" while their CPUs differ (AVX2 EPYC, Skylake-SP, Zen 4, Zen 5),
 * and Zen 4 and Zen 5 share both the model name "AMD EPYC" and the ISA level,
 * so anything less would let one CPU's profile overwrite another's. Static
 * storage.
 */
const char *kipp_profile_key(void);

/* kipp_cpu_model and kipp_cpu_id are base/cpuinfo.h (the planner uses them too). */

/** {"model", "cpu_id", "avx2", "avx512", "avx512_bf16", "avx512_vnni", "best_level"}: new reference. */
json_t *kipp_cpu_json(void);

/** Read <kipp_profile_key()>.json below dir (usually "profiles"); p->loaded says if
 * found. -1 with err when it is missing, unreadable, or records another CPU
 * (model name, cpu_id or ISA level differ). */
int kipp_profile_load(kipp_profile *p, const char *dir, char *err, size_t errlen);

/* ---- results ---- */

/** git rev-parse --short HEAD of the working directory, "unknown" outside git. */
const char *kipp_git_sha(void);

/**
 * A new kipp.bench.v1 document: schema, kind ("kernel", "model", "tokenizer"),
 * git_sha, date (ISO-8601 UTC), host, profile path, config (stolen reference,
 * may be NULL) and an empty results array. Owned by the caller (json_decref).
 */
json_t *kipp_result_create(const char *kind, const char *profile_path, json_t *config);

/**
 * Append one result {name, unit: "s", median, min, max, reps, gbps, gflops,
 * roofline_share, bound, papi} to doc. bytes / flops are per repetition (0 =
 * not meaningful); the roofline share is the achieved rate over the profile's
 * bandwidth (bound "memory") or peak (bound "compute"), null without a profile.
 */
json_t *kipp_result_add(json_t *doc, const char *name, const kipp_bench_stats *st, double bytes,
                        double flops, const char *bound, double roof_rate);

/** The file kipp_result_write would write now (UTC date): dir/<YYYYMMDD>-<host>-<cpu
 * id>-<tag>-<sha>.json into the caller's buffer path_out (path_len bytes,
 * truncated to fit, always terminated). Touches no file and cannot fail; a
 * caller checks for an existing file with it before timing anything. */
void kipp_result_path(const char *dir, const char *tag, char *path_out, size_t path_len);

/**
 * Write doc to dir/<YYYYMMDD>-<host>-<cpu id>-<tag>-<sha>.json (dir created if
 * needed; the cpu id keeps two CPUs' runs of one commit apart);
 * path_out gets the file name. 0 or -1 with err.
 */
int kipp_result_write(json_t *doc, const char *dir, const char *tag, char *path_out,
                      size_t path_len, char *err, size_t errlen);

/**
 * Write doc as JSON (json_dumpf flags) to path through a temporary file and a
 * rename (base/safe_io.h), refusing a path that is the same file as one of
 * inputs[n]. 0 or -1 with err naming the path.
 */
int kipp_json_write_file(json_t *doc, const char *path, size_t flags, const char *const *inputs, size_t n,
                         char *err, size_t errlen);

#endif
