/*
 * profile.c - `make profile`: measure this machine once and write
 * profiles/<host>-<level>-<cpu id>.json (schema kipp.profile.v1 in
 * bench/README.md). Every benchmark result cites this file and takes its
 * roofline (read bandwidth, FP32 / BF16 peaks) from it.
 *
 *   kipp_profile [--out DIR] [--buffer-mib N]
 *
 * Measures: hwloc topology (physical cores, PUs, L1d/L2/L3 sizes, NUMA
 * nodes), ISA flags (kipp_cpu_get), streaming read bandwidth on one core and
 * on all cores (a buffer >> LLC, each thread its own slice, median of 5),
 * FP32 FMA and BF16 dot peaks from register-only loops, and PAPI availability.
 */
#include <errno.h>
#include <hwloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/hugepage.h"
#include "kernels/common.h"
#include "bench/bench_harness.h"
#include "bench/profile.h"

/* ---- topology ---- */

static json_t *topology_json(void)
{
    hwloc_topology_t t;
    if (hwloc_topology_init(&t) != 0 || hwloc_topology_load(t) != 0) return json_string("hwloc failed");
    json_t *o = json_object();
    json_object_set_new(o, "physical_cores", json_integer(hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE)));
    json_object_set_new(o, "pus", json_integer(hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU)));
    json_object_set_new(o, "numa_nodes", json_integer(hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE)));
    const struct { hwloc_obj_type_t type; const char *key; } caches[] = {
        {HWLOC_OBJ_L1CACHE, "l1d"}, {HWLOC_OBJ_L2CACHE, "l2"}, {HWLOC_OBJ_L3CACHE, "l3"}};
    for (size_t i = 0; i < 3; i++) {
        hwloc_obj_t c = hwloc_get_obj_by_type(t, caches[i].type, 0);
        json_t *cj = json_object();
        json_object_set_new(cj, "bytes", c ? json_integer((json_int_t)c->attr->cache.size) : json_null());
        json_object_set_new(cj, "count", json_integer(hwloc_get_nbobjs_by_type(t, caches[i].type)));
        json_object_set_new(o, caches[i].key, cj);
    }
    hwloc_topology_destroy(t);
    return o;
}

static json_t *isa_json(void)
{
    const kipp_cpu_features *f = kipp_cpu_get();
    const char *note = NULL;
    kipp_isa sel = kipp_isa_select(&note);
    return json_pack("{s:b, s:b, s:b, s:b, s:s}", "avx2", f->avx2, "avx512", f->avx512, "avx512_bf16",
                     f->avx512_bf16, "avx512_vnni", f->avx512_vnni, "kernel_isa", kipp_isa_name(sel));
}

/* ---- read bandwidth ---- */

typedef struct {
    const unsigned char *buf;
    size_t bytes;
    int use512;
    volatile uint64_t sink;
} read_job;

static void read_slice(void *arg, int ith, int nth)
{
    read_job *j = arg;
    size_t per = (j->bytes / (size_t)nth) & ~(size_t)255;
    const unsigned char *p = j->buf + per * (size_t)ith;
    j->sink ^= j->use512 ? kipp_prof_read_avx512(p, per) : kipp_prof_read_avx2(p, per);
}

static double read_gbps(kipp_team *team, read_job *j)
{
    kipp_bench_stats st;
    kipp_bench_run(team, read_slice, j, 1, 5, &st);
    size_t per = (j->bytes / (size_t)kipp_team_size(team)) & ~(size_t)255;
    return (double)per * kipp_team_size(team) / st.median * 1e-9;
}

/* ---- compute peaks ---- */

typedef struct {
    float (*loop)(long, float);
    long iters;
    volatile float sink;
} peak_job;

static void peak_run(void *arg, int ith, int nth)
{
    (void)nth;
    peak_job *j = arg;
    j->sink += j->loop(j->iters, (float)ith);
}

/* GFLOP/s of loop on the whole team; iters sized for ~0.2 s per run. */
static double peak_gflops(kipp_team *team, float (*loop)(long, float), double flops_per_iter)
{
    peak_job j = {loop, 100000, 0};
    double t0 = kipp_timer_now();
    kipp_team_run(team, peak_run, &j);
    double dt = kipp_timer_now() - t0;
    j.iters = (long)(100000 * (0.2 / (dt > 1e-6 ? dt : 1e-6)));
    kipp_bench_stats st;
    kipp_bench_run(team, peak_run, &j, 1, 5, &st);
    return (double)j.iters * flops_per_iter * kipp_team_size(team) / st.min * 1e-9;
}

static json_t *peaks_json(kipp_team *one, kipp_team *all)
{
    const kipp_cpu_features *f = kipp_cpu_get();
    json_t *o = json_object();
    float (*fma)(long, float) = f->avx512 ? kipp_prof_fma_avx512 : f->avx2 ? kipp_prof_fma_avx2 : NULL;
    double per = f->avx512 ? KIPP_PROF_FMA_AVX512_FLOPS : KIPP_PROF_FMA_AVX2_FLOPS;
    json_object_set_new(o, "fp32_fma_isa", json_string(f->avx512 ? "avx512 zmm" : f->avx2 ? "avx2 ymm" : "none"));
    json_object_set_new(o, "fp32_fma_gflops_1t", fma ? json_real(peak_gflops(one, fma, per)) : json_null());
    json_object_set_new(o, "fp32_fma_gflops_all", fma ? json_real(peak_gflops(all, fma, per)) : json_null());
    if (f->avx512_bf16) {
        json_object_set_new(o, "bf16_dot_gflops_1t",
                            json_real(peak_gflops(one, kipp_prof_bf16_avx512, KIPP_PROF_BF16_AVX512_FLOPS)));
        json_object_set_new(o, "bf16_dot_gflops_all",
                            json_real(peak_gflops(all, kipp_prof_bf16_avx512, KIPP_PROF_BF16_AVX512_FLOPS)));
    } else {
        json_object_set_new(o, "bf16_dot_gflops_1t", json_null());
        json_object_set_new(o, "bf16_dot_gflops_all", json_null());
        json_object_set_new(o, "bf16_dot_note", json_string("this CPU lacks AVX512_BF16 (vdpbf16ps); "
                                                            "the prefill roofline is the FP32 FMA peak"));
    }
    /* the int8 dot (vpdpbusd) of the q8_0 / affine4 prefill tiles of the avx512_bf16 level */
    if (f->avx512_vnni && f->avx512_bf16) {
        json_object_set_new(o, "int8_dot_gops_1t", json_real(peak_gflops(one, kipp_prof_int8_avx512, KIPP_PROF_INT8_AVX512_OPS)));
        json_object_set_new(o, "int8_dot_gops_all", json_real(peak_gflops(all, kipp_prof_int8_avx512, KIPP_PROF_INT8_AVX512_OPS)));
    } else {
        json_object_set_new(o, "int8_dot_gops_1t", json_null());
        json_object_set_new(o, "int8_dot_gops_all", json_null());
        json_object_set_new(o, "int8_dot_note", json_string("no avx512_bf16 level with VNNI (vpdpbusd) here; the integer "
                                                            "formats' prefill runs vpmaddubsw, held to the FP32 FMA peak"));
    }
    return o;
}

static int usage(const char *arg)
{
    fprintf(stderr, "kipp_profile: unknown or incomplete argument '%s'; expected [--out DIR] [--buffer-mib N], "
            "--read-bw [--buffer-mib N], --key or --cpu-id\n", arg);
    return 2;
}

int main(int argc, char **argv)
{
    const char *out = "profiles";
    size_t mib = 512;
    int read_only = 0, out_given = 0;
    const char *print = NULL; /* --key or --cpu-id */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: kipp_profile [--out DIR] [--buffer-mib N]\n"
                   "       kipp_profile --read-bw [--buffer-mib N]\n"
                   "       kipp_profile --key | --cpu-id\n"
                   "  measures read bandwidth, FMA/BF16 peaks and PAPI availability -> DIR/<host>-<level>-<cpu id>.json "
                   "(default profiles/; level = the best ISA level of this CPU)\n"
                   "  --key prints <host>-<level>-<cpu id>, the profile's file name without .json, and exits\n"
                   "  --cpu-id prints <vendor>-f<family>m<model> of /proc/cpuinfo (e.g. amd-f26m2) and exits\n"
                   "  --read-bw measures the all-core read bandwidth only, prints 'read_gbps_all X' and writes\n"
                   "    nothing (kipp-bench runs it beside each decode row, since this VM's memory speed drifts)\n");
            return 0;
        }
        if (!strcmp(argv[i], "--key")) print = kipp_profile_key();
        else if (!strcmp(argv[i], "--cpu-id")) print = kipp_cpu_id();
        else if (!strcmp(argv[i], "--read-bw")) read_only = 1;
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i], out_given = 1;
        else if (!strcmp(argv[i], "--buffer-mib") && i + 1 < argc) {
            const char *v = argv[++i];
            char *end;
            errno = 0;
            unsigned long long n = strtoull(v, &end, 10);
            /* digits only, and at most 64 GiB: a larger count would wrap mib << 20 */
            if (!*v || *v == '-' || *v == '+' || *end || errno || n > 65536) {
                fprintf(stderr, "kipp_profile: --buffer-mib '%s': expected a whole number of MiB in [64, 65536]\n", v);
                return 2;
            }
            mib = (size_t)n;
        } else return usage(argv[i]);
    }
    /* every argument is checked before anything acts on one */
    if (print && (read_only || out_given)) {
        fprintf(stderr, "kipp_profile: --key and --cpu-id print and exit; they take no --read-bw or --out\n");
        return 2;
    }
    if (read_only && out_given) {
        fprintf(stderr, "kipp_profile: --read-bw writes nothing; --out does not apply\n");
        return 2;
    }
    if (print) {
        printf("%s\n", print);
        return 0;
    }
    if (mib < 64) {
        fprintf(stderr, "kipp_profile: --buffer-mib %zu is too small; expected >= 64 (>> the LLC)\n", mib);
        return 2;
    }
    char err[256];
    kipp_team *one = kipp_team_create(1, err, sizeof err), *all = one ? kipp_team_create(0, err, sizeof err) : NULL;
    if (!all) {
        fprintf(stderr, "kipp_profile: %s\n", err);
        kipp_team_destroy(one);
        return 1;
    }
    read_job rj = {NULL, mib << 20, kipp_cpu_get()->avx512, 0};
    /* Huge pages, as the cpu backend maps its packed weights and KV (base/hugepage.h):
     * with 4 KiB pages this VM's nested page walks cap a stream well below what
     * decode reaches, and every share would read above 100%. */
    unsigned char *buf = kipp_huge_alloc(rj.bytes);
    if (!buf) {
        fprintf(stderr, "kipp_profile: cannot allocate a %zu MiB read buffer\n", mib);
        return 1;
    }
    for (size_t i = 0; i < rj.bytes; i += 4096) buf[i] = (unsigned char)i; /* fault pages in */
    rj.buf = buf;
    if (read_only) {
        printf("read_gbps_all %.4f\n", read_gbps(all, &rj));
        free(buf);
        kipp_team_destroy(all);
        kipp_team_destroy(one);
        return 0;
    }
    double bw1 = read_gbps(one, &rj), bwn = read_gbps(all, &rj);
    free(buf);
    const char *why = NULL;
    int papi = kipp_papi_available(&why);
    char date[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
    json_t *doc = json_pack("{s:s, s:s, s:s, s:s, s:o, s:o}", "schema", "kipp.profile.v1", "host",
                            kipp_host_name(), "date", date, "git_sha", kipp_git_sha(), "topology",
                            topology_json(), "isa", isa_json());
    json_object_set_new(doc, "cpu", kipp_cpu_json());
    json_object_set_new(doc, "bandwidth",
                        json_pack("{s:f, s:f, s:i, s:I, s:s}", "read_gbps_1t", bw1, "read_gbps_all", bwn,
                                  "threads_all", kipp_team_size(all), "buffer_bytes", (json_int_t)rj.bytes,
                                  "method", "streaming xor of aligned vector loads, transparent huge pages, median of 5"));
    json_object_set_new(doc, "peaks", peaks_json(one, all));
    json_object_set_new(doc, "papi", json_pack("{s:b, s:s?}", "available", papi, "why", papi ? NULL : why));
    kipp_team_destroy(all);
    kipp_team_destroy(one);
    char path[600];
    snprintf(path, sizeof path, "%s/%s.json", out, kipp_profile_key());
    if (mkdir(out, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "kipp_profile: cannot create %s\n", out);
        return 1;
    }
    char werr[700];
    if (kipp_json_write_file(doc, path, JSON_INDENT(1) | JSON_REAL_PRECISION(6), NULL, 0, werr, sizeof werr)) {
        fprintf(stderr, "kipp_profile: %s\n", werr);
        return 1;
    }
    char *s = json_dumps(doc, JSON_INDENT(1) | JSON_REAL_PRECISION(5));
    printf("%s\nwrote %s\n", s, path);
    free(s);
    json_decref(doc);
    return 0;
}
