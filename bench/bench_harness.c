/*
 * bench_harness.c - timing, the thread team (base/threadpool.h), PAPI, machine profile and
 * kipp.bench.v1 result files (bench/harness.h, bench/README.md).
 */
#include "bench/bench_harness.h"
#include "base/safe_io.h"

#include "base/threadpool.h"
#include "kernels/common.h"

#include <ctype.h>
#include <errno.h>
#include <hwloc.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef KIPP_HAVE_PAPI
#include <papi.h>
#endif

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

double kipp_timer_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double kipp_load_average(void)
{
    double l;
    return getloadavg(&l, 1) == 1 ? l : -1;
}

/* Ticks since boot of all CPUs from /proc/stat's "cpu" line: *busy (user, nice, system, irq, softirq,
 * steal) and *all (those plus idle and iowait); 0 on success. */
static int cpu_ticks(unsigned long long *busy, unsigned long long *all)
{
    unsigned long long v[8] = {0};
    FILE *f = fopen("/proc/stat", "r");
    int n = f ? fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                       &v[6], &v[7]) : 0;
    if (f) fclose(f);
    if (n != 8) return -1;
    *busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
    *all = *busy + v[3] + v[4];
    return 0;
}

/* This process's user + system ticks (/proc/self/stat fields 14 and 15, after the parenthesised name). */
static int self_ticks(unsigned long long *t)
{
    char line[1024];
    FILE *f = fopen("/proc/self/stat", "r");
    char *ok = f ? fgets(line, sizeof line, f) : NULL;
    if (f) fclose(f);
    const char *p = ok ? strrchr(line, ')') : NULL;
    unsigned long long ut, st;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2) return -1;
    *t = ut + st;
    return 0;
}

double kipp_cpu_busy_others(double secs)
{
    unsigned long long b0, a0, s0, b1, a1, s1;
    if (cpu_ticks(&b0, &a0) || self_ticks(&s0)) return -1;
    struct timespec ts = {.tv_sec = (time_t)secs, .tv_nsec = (long)((secs - (double)(time_t)secs) * 1e9)};
    nanosleep(&ts, NULL);
    if (cpu_ticks(&b1, &a1) || self_ticks(&s1) || a1 <= a0) return -1;
    double others = (double)(b1 - b0) - (double)(s1 - s0);
    return others > 0 ? others / (double)(a1 - a0) : 0;
}

/* ---- hwloc topology, shared by the team ---- */

static hwloc_topology_t topo;
static pthread_once_t topo_once = PTHREAD_ONCE_INIT;

static void topo_init(void)
{
    if (hwloc_topology_init(&topo) == 0 && hwloc_topology_load(topo) == 0) return;
    topo = NULL;
}

int kipp_team_cores(void)
{
    pthread_once(&topo_once, topo_init);
    int n = topo ? hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE) : 0;
    return n > 0 ? n : 1;
}

/* ---- thread team: the pool the cpu backend runs on (base/threadpool.c),
 * so kernels are timed with the workers, pinning and barriers the forward
 * pass runs on ---- */

struct kipp_team {
    kipp_threadpool *pool;
};

kipp_team *kipp_team_create(int nth, char *err, size_t errlen)
{
    int cores = kipp_team_cores();
    if (nth == 0) nth = cores;
    if (nth < 1 || nth > cores) {
        set_err(err, errlen, "thread count %d is out of range; expected 1..%d (physical cores)", nth, cores);
        return NULL;
    }
    kipp_team *t = calloc(1, sizeof *t);
    if (!t) {
        set_err(err, errlen, "out of memory creating a team of %d threads", nth);
        return NULL;
    }
    if (kipp_threadpool_create(nth, &t->pool, err, errlen) != 0) {
        free(t);
        return NULL;
    }
    return t;
}

void kipp_team_run(kipp_team *t, void (*fn)(void *arg, int ith, int nth), void *arg)
{
    kipp_threadpool_run(t->pool, fn, arg);
}

void kipp_team_destroy(kipp_team *t)
{
    if (!t) return;
    kipp_threadpool_destroy(t->pool);
    free(t);
}

int kipp_team_size(const kipp_team *t) { return kipp_threadpool_size(t->pool); }

/* ---- PAPI ---- */

#ifdef KIPP_HAVE_PAPI
static int papi_state; /* 0 untried, 1 ok, -1 unavailable */
static const char *papi_why = "PAPI was not tried";

static int papi_init(void)
{
    if (papi_state) return papi_state > 0;
    papi_state = -1;
    if (PAPI_library_init(PAPI_VER_CURRENT) != PAPI_VER_CURRENT) {
        papi_why = "PAPI_library_init failed";
        return 0;
    }
    int es = PAPI_NULL;
    if (PAPI_create_eventset(&es) != PAPI_OK || PAPI_add_event(es, PAPI_TOT_CYC) != PAPI_OK ||
        PAPI_add_event(es, PAPI_TOT_INS) != PAPI_OK || PAPI_start(es) != PAPI_OK) {
        papi_why = "PAPI_TOT_CYC/PAPI_TOT_INS cannot be counted here (VM without a PMU?)";
        return 0;
    }
    long long v[2];
    PAPI_stop(es, v);
    PAPI_cleanup_eventset(es);
    PAPI_destroy_eventset(&es);
    papi_state = 1;
    papi_why = NULL;
    return 1;
}
#endif

int kipp_papi_available(const char **why)
{
#ifdef KIPP_HAVE_PAPI
    int ok = papi_init();
    if (why) *why = papi_why;
    return ok;
#else
    if (why) *why = "built without libpapi";
    return 0;
#endif
}

/* ---- timing ---- */

void kipp_bench_run(kipp_team *team, void (*fn)(void *arg, int ith, int nth), void *arg,
                    int warmup, int reps, kipp_bench_stats *st)
{
    if (reps < 1) reps = 1;
    /* up to 64 reps on the stack; more in a heap array, or 64 when that cannot be had (st->reps says so) */
    double stack[64], *t = reps <= 64 ? stack : malloc((size_t)reps * sizeof(double));
    if (!t) t = stack, reps = 64;
    for (int i = 0; i < warmup; i++) kipp_team_run(team, fn, arg);
    st->cycles = st->instructions = -1;
#ifdef KIPP_HAVE_PAPI
    int es = PAPI_NULL, papi = papi_init() && PAPI_create_eventset(&es) == PAPI_OK &&
                               PAPI_add_event(es, PAPI_TOT_CYC) == PAPI_OK &&
                               PAPI_add_event(es, PAPI_TOT_INS) == PAPI_OK && PAPI_start(es) == PAPI_OK;
#endif
    for (int i = 0; i < reps; i++) {
        double t0 = kipp_timer_now();
        kipp_team_run(team, fn, arg);
        t[i] = kipp_timer_now() - t0;
    }
#ifdef KIPP_HAVE_PAPI
    if (papi) {
        long long v[2];
        if (PAPI_stop(es, v) == PAPI_OK) {
            st->cycles = (double)v[0] / reps;
            st->instructions = (double)v[1] / reps;
        }
    }
    if (es != PAPI_NULL) {
        PAPI_cleanup_eventset(es);
        PAPI_destroy_eventset(&es);
    }
#endif
    st->reps = reps;
    st->median = kipp_median(t, (size_t)reps);
    st->min = t[0];
    st->max = t[reps - 1];
    if (t != stack) free(t);
}

/* ---- host, git, profile ---- */

const char *kipp_host_name(void)
{
    static char host[128];
    if (!host[0] && gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "unknown-host");
    for (char *c = host; *c; c++) /* keep file names plain */
        if (*c == '/' || *c == ' ') *c = '_';
    return host;
}

const char *kipp_profile_key(void)
{
    static char key[160];
    if (!key[0])
        snprintf(key, sizeof key, "%s-%s-%s", kipp_host_name(), kipp_isa_name(kipp_isa_cpu_max()), kipp_cpu_id());
    return key;
}

const char *kipp_git_sha(void)
{
    static char sha[64];
    if (sha[0]) return sha;
    FILE *f = popen("git rev-parse --short HEAD 2>/dev/null", "r");
    if (!f || !fgets(sha, sizeof sha, f)) snprintf(sha, sizeof sha, "unknown");
    if (f) pclose(f);
    sha[strcspn(sha, "\r\n")] = 0;
    if (!sha[0]) snprintf(sha, sizeof sha, "unknown");
    return sha;
}

static double json_num(json_t *o, const char *a, const char *b)
{
    json_t *v = json_object_get(json_object_get(o, a), b);
    return json_is_number(v) ? json_number_value(v) : 0.0;
}

json_t *kipp_cpu_json(void)
{
    const kipp_cpu_features *f = kipp_cpu_get();
    return json_pack("{s:s, s:s, s:b, s:b, s:b, s:b, s:s}", "model", kipp_cpu_model(), "cpu_id", kipp_cpu_id(),
                     "avx2", f->avx2, "avx512",
                     f->avx512, "avx512_bf16", f->avx512_bf16, "avx512_vnni", f->avx512_vnni, "best_level",
                     kipp_isa_name(kipp_isa_cpu_max()));
}

int kipp_profile_load(kipp_profile *p, const char *dir, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    snprintf(p->path, sizeof p->path, "%s/%s.json", dir, kipp_profile_key());
    json_error_t je;
    json_t *root = json_load_file(p->path, 0, &je);
    if (!root) {
        set_err(err, errlen, "profile %s is missing or unreadable (%s); run `make profile` first",
                p->path, je.text);
        return -1;
    }
    /* the key holds the CPU's family and model, but a profile copied or
     * renamed by hand would still give another CPU's roofline shares */
    json_t *cpu = json_object_get(root, "cpu");
    const char *pm = json_string_value(json_object_get(cpu, "model"));
    const char *pl = json_string_value(json_object_get(cpu, "best_level"));
    const char *pi = json_string_value(json_object_get(cpu, "cpu_id"));
    const char *here = kipp_isa_name(kipp_isa_cpu_max());
    if (!pm || !pl || !pi || strcmp(pm, kipp_cpu_model()) || strcmp(pl, here) || strcmp(pi, kipp_cpu_id())) {
        set_err(err, errlen, "profile %s was measured on CPU '%s' %s (%s), this is '%s' %s (%s); run `make profile` first",
                p->path, pm ? pm : "(not recorded)", pi ? pi : "(no cpu_id)", pl ? pl : "?", kipp_cpu_model(),
                kipp_cpu_id(), here);
        json_decref(root);
        return -1;
    }
    p->read_gbps_1t = json_num(root, "bandwidth", "read_gbps_1t");
    p->read_gbps_all = json_num(root, "bandwidth", "read_gbps_all");
    p->fp32_gflops_all = json_num(root, "peaks", "fp32_fma_gflops_all");
    p->bf16_gflops_all = json_num(root, "peaks", "bf16_dot_gflops_all");
    p->int8_gops_all = json_num(root, "peaks", "int8_dot_gops_all");
    json_decref(root);
    if (p->read_gbps_all <= 0 || p->fp32_gflops_all <= 0) {
        set_err(err, errlen, "profile %s lacks bandwidth.read_gbps_all or peaks.fp32_fma_gflops_all", p->path);
        return -1;
    }
    p->loaded = 1;
    return 0;
}

/* ---- results ---- */

json_t *kipp_result_create(const char *kind, const char *profile_path, json_t *config)
{
    char date[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:o, s:s?, s:o, s:[]}", "schema", "kipp.bench.v1",
                     "kind", kind, "git_sha", kipp_git_sha(), "date", date, "host",
                     kipp_host_name(), "cpu", kipp_cpu_json(), "profile", profile_path, "config",
                     config ? config : json_object(), "results");
}

json_t *kipp_result_add(json_t *doc, const char *name, const kipp_bench_stats *st, double bytes,
                        double flops, const char *bound, double roof_rate)
{
    json_t *r = json_pack("{s:s, s:s, s:f, s:f, s:f, s:i}", "name", name, "unit", "s", "median",
                          st->median, "min", st->min, "max", st->max, "reps", st->reps);
    double gbps = bytes > 0 ? bytes / st->median * 1e-9 : 0, gflops = flops > 0 ? flops / st->median * 1e-9 : 0;
    json_object_set_new(r, "bytes", json_real(bytes));
    json_object_set_new(r, "flops", json_real(flops));
    json_object_set_new(r, "gbps", bytes > 0 ? json_real(gbps) : json_null());
    json_object_set_new(r, "gflops", flops > 0 ? json_real(gflops) : json_null());
    json_object_set_new(r, "bound", json_string(bound));
    double achieved = !strcmp(bound, "memory") ? gbps : gflops;
    json_object_set_new(r, "roofline_share", roof_rate > 0 ? json_real(achieved / roof_rate) : json_null());
    json_object_set_new(r, "roofline_rate", roof_rate > 0 ? json_real(roof_rate) : json_null());
    if (st->cycles >= 0)
        json_object_set_new(r, "papi", json_pack("{s:f, s:f}", "cycles", st->cycles, "instructions", st->instructions));
    else
        json_object_set_new(r, "papi", json_string("unavailable"));
    json_array_append_new(json_object_get(doc, "results"), r);
    return r;
}

void kipp_result_path(const char *dir, const char *tag, char *path_out, size_t path_len)
{
    char day[16];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(day, sizeof day, "%Y%m%d", &tm);
    snprintf(path_out, path_len, "%s/%s-%s-%s-%s-%s.json", dir, day, kipp_host_name(), kipp_cpu_id(), tag,
             kipp_git_sha());
}

int kipp_result_write(json_t *doc, const char *dir, const char *tag, char *path_out,
                      size_t path_len, char *err, size_t errlen)
{
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        set_err(err, errlen, "cannot create results directory %s: %s", dir, strerror(errno));
        return -1;
    }
    kipp_result_path(dir, tag, path_out, path_len);
    return kipp_json_write_file(doc, path_out, JSON_INDENT(1) | JSON_REAL_PRECISION(6), NULL, 0, err, errlen);
}

int kipp_json_write_file(json_t *doc, const char *path, size_t flags, const char *const *inputs, size_t n,
                         char *err, size_t errlen)
{
    kipp_outfile of;
    if (kipp_outfile_open(&of, path, inputs, n, err, errlen)) return -1;
    if (json_dumpf(doc, of.f, flags) != 0 || fputc('\n', of.f) == EOF) {
        kipp_outfile_abort(&of);
        set_err(err, errlen, "cannot write %s", path);
        return -1;
    }
    return kipp_outfile_commit(&of, err, errlen) ? -1 : 0;
}
