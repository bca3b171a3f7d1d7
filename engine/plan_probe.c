/*
 * plan_probe.c - kipp_machine_measure: what the planner needs to know about
 * this machine, measured at start (seed 002 "Planner").
 *
 * The RAM read, FP32 FMA, BF16 dot and int8 dot loops are the ones `make
 * profile` uses (kernels/cpu/probe.h), so the planner's bandwidth and peaks
 * are on the same scale as the profiles that results/ quote Kipp's shares
 * against; kipp_machine_measure_with takes them from such a profile instead. Threads are
 * plain pthreads, one per physical core: a probe runs once, before any backend
 * pool exists. The memory limits of the process's cgroup (v2 memory.max and
 * memory.current, or v1's limit and usage) cap the /proc/meminfo figures, so a
 * container's plan sees its own budget.
 */
#include <errno.h>
#include <fcntl.h>
#include <hwloc.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/errbuf.h"
#include "base/hugepage.h"
#include "engine/internal.h"
#include "engine/kipp.h"
#include "kernels/common.h"
#include "kernels/cpu/probe.h"

#define RAM_PROBE_BYTES (256u << 20)   /* >> any LLC here, small next to RAM */
#define RAM_PROBE_MIN_REPS 5       /* timed passes at least ... */
#define RAM_PROBE_SEC 1.5          /* ... and for at least this long: a shared VM's bandwidth swings within seconds */
#define RAM_PROBE_MAX_REPS 512     /* the median of at most this many passes is reported */
#define DISK_SAMPLE_MAX (256ull << 20) /* bytes of the model file read at most */
#define DISK_SAMPLE_SEC 1.0            /* ... or this long, whichever comes first */
#define DISK_CHUNK (4u << 20)
#define MAX_PROBE_THREADS 256

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- RAM: /proc/meminfo, capped by the memory cgroup (v2 or v1) ---- */

static uint64_t meminfo_kib(const char *meminfo, const char *key)
{
    FILE *f = fopen(meminfo, "r");
    char line[256];
    uint64_t v = 0;
    size_t n = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ':') {
            v = strtoull(line + n + 1, NULL, 10);
            break;
        }
    if (f) fclose(f);
    return v;
}

/* The file `file` of this process's memory cgroup as a number: v2 ("0::<path>", files memory.max and
 * memory.current) or, on a v1/hybrid host, the memory controller's line ("N:memory:<path>", v1 names
 * memory.limit_in_bytes and memory.usage_in_bytes). UINT64_MAX for "max", an unlimited v1 value, or when absent. */
static uint64_t cgroup_value(const kipp_ram_paths *at, const char *file)
{
    char path[1100] = "", rel[520] = "", line[512];
    int v1 = 0;
    FILE *f = fopen(at->self_cgroup, "r");
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        const char *mem = strstr(line, ":memory:");
        if (mem) snprintf(rel, sizeof rel, "%s", mem + 8), v1 = 1;
        else if (!v1 && !strncmp(line, "0::", 3)) snprintf(rel, sizeof rel, "%s", line + 3);
    }
    if (f) fclose(f);
    const char *name = !v1 ? file : !strcmp(file, "memory.max") ? "memory.limit_in_bytes" : "memory.usage_in_bytes";
    snprintf(path, sizeof path, "%s%s%s/%s", at->cgroup_root, v1 ? "/memory" : "", strcmp(rel, "/") ? rel : "", name);
    f = fopen(path, "r");
    uint64_t v = UINT64_MAX;
    if (f && fgets(line, sizeof line, f) && strncmp(line, "max", 3)) v = strtoull(line, NULL, 10);
    if (f) fclose(f);
    return v >= (1ull << 62) ? UINT64_MAX : v; /* v1 writes "no limit" as a huge page-rounded number */
}

int kipp_plan_ram_at(const kipp_ram_paths *at, uint64_t *total, uint64_t *avail, char *err, size_t errlen)
{
    uint64_t t = meminfo_kib(at->meminfo, "MemTotal") * 1024, a = meminfo_kib(at->meminfo, "MemAvailable") * 1024;
    if (!t) return kipp_err(err, errlen, KIPP_EIO, "cannot read MemTotal from %s", at->meminfo);
    uint64_t max = cgroup_value(at, "memory.max"), cur = cgroup_value(at, "memory.current");
    if (max != UINT64_MAX) {
        if (max < t) t = max;
        uint64_t room = cur != UINT64_MAX && cur < max ? max - cur : 0;
        if (room < a) a = room;
    }
    *total = t, *avail = a;
    return 0;
}

/** RAM total and available in bytes, cgroup-capped; KIPP_EIO when /proc/meminfo has no MemTotal. */
int kipp_plan_ram(uint64_t *total, uint64_t *avail, char *err, size_t errlen)
{
    static const kipp_ram_paths sys = {.meminfo = "/proc/meminfo", .self_cgroup = "/proc/self/cgroup",
                                       .cgroup_root = "/sys/fs/cgroup"};
    return kipp_plan_ram_at(&sys, total, avail, err, errlen);
}

/* ---- RAM read bandwidth and FP32 peak: one pthread per physical core ---- */

/* The probe loops are x86 level files (kernels/cpu/probe_avx*.c): a portable build has none, and its
 * plan leaves bandwidth and peak at 0 as on a ref-level CPU. */
#if KIPP_X86_LEVELS

typedef struct {
    const unsigned char *buf;
    size_t bytes;            /* this thread's slice */
    int use512;
    float (*loop)(long, float); /* peak: the register-only loop */
    long iters;              /* peak: loop iterations */
    pthread_barrier_t *bar;
    double t0, t1;
    volatile uint64_t sink;
    volatile float fsink;
} probe_job;

static void *read_thread(void *arg)
{
    probe_job *j = arg;
    pthread_barrier_wait(j->bar);
    j->t0 = now_s();
    j->sink ^= j->use512 ? kipp_prof_read_avx512(j->buf, j->bytes) : kipp_prof_read_avx2(j->buf, j->bytes);
    j->t1 = now_s();
    return NULL;
}

static void *peak_thread(void *arg)
{
    probe_job *j = arg;
    pthread_barrier_wait(j->bar);
    j->t0 = now_s();
    j->fsink += j->loop(j->iters, (float)j->t0);
    j->t1 = now_s();
    return NULL;
}

/* Run fn on n threads at once; the wall time from the first start to the last end, s. */
static double run_team(int n, probe_job *jobs, void *(*fn)(void *))
{
    pthread_t th[MAX_PROBE_THREADS];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)n);
    int started = 0;
    for (int i = 0; i < n; i++) {
        jobs[i].bar = &bar;
        if (pthread_create(&th[i], NULL, fn, &jobs[i])) break;
        started++;
    }
    if (started < n) { /* cannot happen with a few threads; the barrier would never open */
        for (int i = started; i < n; i++) pthread_barrier_wait(&bar);
    }
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);
    double t0 = jobs[0].t0, t1 = jobs[0].t1;
    for (int i = 1; i < started; i++) {
        if (jobs[i].t0 < t0) t0 = jobs[i].t0;
        if (jobs[i].t1 > t1) t1 = jobs[i].t1;
    }
    return t1 - t0;
}

/* The probe buffer: RAM_PROBE_BYTES, or a quarter of the available RAM where that is less (a memory
 * cgroup far below the model, as when layers are streamed: the probe must not be what gets killed). */
static size_t probe_bytes(uint64_t avail)
{
    uint64_t q = avail / 4 & ~(uint64_t)((1u << 20) - 1);
    return q >= RAM_PROBE_BYTES ? RAM_PROBE_BYTES : q > (8u << 20) ? (size_t)q : (8u << 20);
}

/* Read bandwidth the way the cpu backend's packed weights are read, so the plan's bytes-over-bandwidth
 * matches what decode reaches: a 2 MiB-aligned buffer with transparent huge pages (as cpu_backend.c packs
 * weights and bench/profile.c probes; 4 KiB pages cost TLB misses the weights do not pay), one warm-up
 * pass, then the median of the passes of RAM_PROBE_SEC (at least RAM_PROBE_MIN_REPS). */
static double ram_read_gbps(int n, int use512, size_t bytes)
{
    bytes = kipp_huge_round(bytes);
    unsigned char *buf = kipp_huge_alloc(bytes);
    if (!buf) return 0;
    memset(buf, 1, bytes); /* fault every page in before timing */
    probe_job jobs[MAX_PROBE_THREADS];
    size_t per = (bytes / (size_t)n) & ~(size_t)255;
    double g[RAM_PROBE_MAX_REPS];
    int reps = 0;
    double t_end = 0;
    for (int r = -1; r < RAM_PROBE_MAX_REPS; r++) { /* r = -1: the warm-up pass */
        for (int i = 0; i < n; i++) jobs[i] = (probe_job){.buf = buf + per * (size_t)i, .bytes = per, .use512 = use512};
        double dt = run_team(n, jobs, read_thread);
        if (r < 0) {
            t_end = now_s() + RAM_PROBE_SEC;
            continue;
        }
        g[reps++] = dt > 0 ? (double)per * n / dt * 1e-9 : 0;
        if (reps >= RAM_PROBE_MIN_REPS && now_s() >= t_end) break;
    }
    free(buf);
    return kipp_median(g, (size_t)reps);
}

/* GFLOP/s (Gop/s) of n threads each running loop, flops per iteration: the fastest of three runs of 0.1 s. */
static double peak_gflops(int n, float (*loop)(long, float), double flops)
{
    probe_job jobs[MAX_PROBE_THREADS];
    double best = 0;
    long iters = 100000;
    for (int i = 0; i < n; i++) jobs[i] = (probe_job){.iters = iters, .loop = loop};
    double dt = run_team(n, jobs, peak_thread); /* size the runs to about 0.1 s each */
    iters = (long)(iters * (0.1 / (dt > 1e-6 ? dt : 1e-6)));
    if (iters < 1000) iters = 1000;
    for (int r = 0; r < 3; r++) { /* the fastest run: a peak is what the core can do, not what it did */
        for (int i = 0; i < n; i++) jobs[i] = (probe_job){.iters = iters, .loop = loop};
        dt = run_team(n, jobs, peak_thread);
        double g = dt > 0 ? (double)iters * flops * n / dt * 1e-9 : 0;
        if (g > best) best = g;
    }
    return best;
}

#endif

/* ---- the model file's sequential read speed ---- */

static double disk_gbps(const char *path, uint64_t *sampled, int *direct)
{
    *sampled = 0, *direct = 1;
    int fd = open(path, O_RDONLY | O_DIRECT);
    if (fd < 0) {
        *direct = 0;
        fd = open(path, O_RDONLY);
    }
    if (fd < 0) return 0;
    struct stat st;
    unsigned char *buf = kipp_aligned_alloc(DISK_CHUNK);
    if (fstat(fd, &st) || !buf) {
        close(fd);
        kipp_aligned_free(buf);
        return 0;
    }
    uint64_t size = (uint64_t)st.st_size, want = size < DISK_SAMPLE_MAX ? size : DISK_SAMPLE_MAX;
    /* Without O_DIRECT: drop the sample's cached pages first, so the read comes from the device (pages
     * mapped by a running process stay; `kipp plan` measures before it maps the model). */
    if (!*direct) posix_fadvise(fd, 0, (off_t)want, POSIX_FADV_DONTNEED);
    double t0 = now_s();
    uint64_t off = 0;
    while (off < want && now_s() - t0 < DISK_SAMPLE_SEC) {
        size_t n = want - off < DISK_CHUNK ? (size_t)(want - off) : DISK_CHUNK;
        ssize_t got = pread(fd, buf, *direct ? (n + 4095) & ~(size_t)4095 : n, (off_t)off);
        if (got < 0 && *direct && errno == EINVAL && off == 0) { /* the file system refuses O_DIRECT */
            close(fd);
            fd = open(path, O_RDONLY);
            if (fd < 0) break;
            *direct = 0;
            posix_fadvise(fd, 0, (off_t)want, POSIX_FADV_DONTNEED);
            t0 = now_s();
            continue;
        }
        if (got <= 0) break;
        off += (uint64_t)got;
    }
    double dt = now_s() - t0;
    if (fd >= 0) close(fd);
    kipp_aligned_free(buf);
    *sampled = off;
    return off && dt > 0 ? (double)off / dt * 1e-9 : 0;
}

/* ---- how bf16 projections will be read ---- */

/* The cpu backend's KIPP_BF16_ACT mode (cpu_backend.c choose_bf16_read): the variable when it names a mode
 * the level can run (otherwise the backend refuses the model, and the plan shows the default), else "mixed"
 * where the level has the BF16 dot and it outruns FP32 FMA (dot_fast), else "f32". */
static void pick_bf16_act(kipp_machine *mc, int dot_fast)
{
    const char *e = getenv("KIPP_BF16_ACT");
    int has_dot = !strcmp(mc->isa, "avx512_bf16");
    if (e && (!strcmp(e, "f32") || (has_dot && (!strcmp(e, "mixed") || !strcmp(e, "bf16"))))) {
        snprintf(mc->bf16_act, sizeof mc->bf16_act, "%s", e);
        return;
    }
    snprintf(mc->bf16_act, sizeof mc->bf16_act, "%s", has_dot && dot_fast ? "mixed" : "f32");
}

/* ---- a machine profile in place of the probes ---- */

/* o[sect][key] as a number; 0 when absent or null (older profiles lack some peaks). */
static double prof_num(const json_t *o, const char *sect, const char *key)
{
    const json_t *v = json_object_get(json_object_get(o, sect), key);
    return json_is_number(v) ? json_number_value(v) : 0;
}

static const char *prof_str(const json_t *o, const char *sect, const char *key)
{
    const json_t *v = json_object_get(json_object_get(o, sect), key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* Fill mc's bandwidth, peaks, level and CPU id from the profile at path (kipp_machine_measure_with). */
static int from_profile(const char *path, kipp_machine *mc, char *err, size_t errlen)
{
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    if (!o)
        return kipp_err(err, errlen, KIPP_EIO, "machine profile '%s': line %d: %s; expected a kipp.profile.v1 file "
                        "(make profile)", path, je.line, je.text);
    const json_t *schema = json_object_get(o, "schema");
    double rd = prof_num(o, "bandwidth", "read_gbps_all"), r1 = prof_num(o, "bandwidth", "read_gbps_1t");
    double fp32 = prof_num(o, "peaks", "fp32_fma_gflops_all");
    const char *isa = prof_str(o, "isa", "kernel_isa"), *cpu = prof_str(o, "cpu", "cpu_id");
    int rc = 0;
    if (!json_is_string(schema) || strcmp(json_string_value(schema), "kipp.profile.v1"))
        rc = kipp_err(err, errlen, KIPP_EINVAL, "machine profile '%s': schema %s, expected \"kipp.profile.v1\"", path,
                      json_is_string(schema) ? json_string_value(schema) : "missing");
    else if (rd <= 0 || fp32 <= 0 || !isa)
        rc = kipp_err(err, errlen, KIPP_EINVAL, "machine profile '%s' lacks %s; expected bandwidth.read_gbps_all, "
                      "peaks.fp32_fma_gflops_all and isa.kernel_isa", path,
                      rd <= 0 ? "bandwidth.read_gbps_all" : fp32 <= 0 ? "peaks.fp32_fma_gflops_all" : "isa.kernel_isa");
    if (!rc) {
        mc->ram_read_gbps = rd > r1 ? rd : r1; /* an all-core figure below one core's: a disturbed profile run */
        mc->peak_gflops = fp32;
        mc->bf16_dot_gflops = prof_num(o, "peaks", "bf16_dot_gflops_all");
        mc->int8_dot_gops = prof_num(o, "peaks", "int8_dot_gops_all");
        snprintf(mc->isa, sizeof mc->isa, "%s", isa);
        if (cpu) snprintf(mc->cpu_id, sizeof mc->cpu_id, "%s", cpu);
        snprintf(mc->peaks_from, sizeof mc->peaks_from, "%s", path);
        for (char *c = mc->peaks_from; *c; c++) /* the plan's JSON needs UTF-8 */
            if ((unsigned char)*c >= 0x80) *c = '?';
        pick_bf16_act(mc, mc->bf16_dot_gflops > mc->peak_gflops);
    }
    json_decref(o);
    return rc;
}

int kipp_machine_measure(const char *model_path, kipp_machine *out, char *err, size_t errlen)
{
    return kipp_machine_measure_with(model_path, NULL, out, err, errlen);
}

int kipp_machine_measure_with(const char *model_path, const char *profile_path, kipp_machine *out, char *err,
                              size_t errlen)
{
    if (!out) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_machine_measure: out is NULL, expected a kipp_machine");
    *out = (kipp_machine){0};
    snprintf(out->cpu_id, sizeof out->cpu_id, "%s", kipp_cpu_id());
    kipp_isa isa = kipp_isa_select(NULL);
    snprintf(out->isa, sizeof out->isa, "%s", kipp_isa_name(isa));
    snprintf(out->peaks_from, sizeof out->peaks_from, "probe");
    hwloc_topology_t t;
    if (hwloc_topology_init(&t) == 0 && hwloc_topology_load(t) == 0) {
        out->physical_cores = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE);
        out->logical_cpus = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU);
        hwloc_topology_destroy(t);
    }
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (out->logical_cpus <= 0) out->logical_cpus = online > 0 ? (int)online : 1;
    if (out->physical_cores <= 0) out->physical_cores = out->logical_cpus;
    int rc = kipp_plan_ram(&out->ram_total_bytes, &out->ram_available_bytes, err, errlen);
    if (rc) return rc;
    if (model_path) out->disk_read_gbps = disk_gbps(model_path, &out->disk_sample_bytes, &out->disk_direct);
    if (profile_path) return from_profile(profile_path, out, err, errlen);
    pick_bf16_act(out, kipp_cpu_get()->bf16_dot_fast);
    if (isa == KIPP_ISA_REF) return 0; /* no vector loops to run: bandwidth and peak stay 0 */
#if KIPP_X86_LEVELS
    int n = out->physical_cores < MAX_PROBE_THREADS ? out->physical_cores : MAX_PROBE_THREADS;
    int use512 = isa >= KIPP_ISA_AVX512;
    out->ram_read_gbps = ram_read_gbps(n, use512, probe_bytes(out->ram_available_bytes));
    out->peak_gflops = use512 ? peak_gflops(n, kipp_prof_fma_avx512, KIPP_PROF_FMA_AVX512_FLOPS)
                              : peak_gflops(n, kipp_prof_fma_avx2, KIPP_PROF_FMA_AVX2_FLOPS);
    if (isa == KIPP_ISA_AVX512_BF16) { /* the level whose kernels run vdpbf16ps and vpdpbusd */
        out->bf16_dot_gflops = peak_gflops(n, kipp_prof_bf16_avx512, KIPP_PROF_BF16_AVX512_FLOPS);
        out->int8_dot_gops = peak_gflops(n, kipp_prof_int8_avx512, KIPP_PROF_INT8_AVX512_OPS);
    }
    if (out->ram_read_gbps <= 0) return kipp_err(err, errlen, KIPP_ENOMEM, "no memory for the %zu MiB read probe",
                                                 probe_bytes(out->ram_available_bytes) >> 20);
#endif
    return 0;
}
