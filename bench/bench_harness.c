/*
 * harness.c - timing, pinned thread team, PAPI, machine profile and
 * kipp.bench.v1 result files (bench/harness.h, bench/README.md).
 */
#include "bench/bench_harness.h"
#include "engine/safe_io.h"

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

/* Pin the calling thread to physical core i (its first PU): one thread per
 * core, never two on SMT siblings (seed 002: siblings only add contention). */
static void pin_to_core(int i)
{
    if (!topo) return;
    hwloc_obj_t core = hwloc_get_obj_by_type(topo, HWLOC_OBJ_CORE, (unsigned)i);
    if (!core || !core->cpuset) return;
    hwloc_cpuset_t set = hwloc_bitmap_dup(core->cpuset);
    hwloc_bitmap_singlify(set);
    hwloc_set_cpubind(topo, set, HWLOC_CPUBIND_THREAD);
    hwloc_bitmap_free(set);
}

/* ---- thread team: two barriers per run (start, done) ---- */

struct team_slot {
    struct kipp_team *team;
    int ith;
};

struct kipp_team {
    int nth, quit;
    pthread_t *tid;
    struct team_slot *slots; /* [nth]: what each worker gets */
    pthread_barrier_t start, done;
    void (*fn)(void *, int, int);
    void *arg;
};

static void *team_worker(void *p)
{
    const struct team_slot *slot = p;
    kipp_team *t = slot->team;
    int ith = slot->ith;
    pin_to_core(ith);
    for (;;) {
        pthread_barrier_wait(&t->start);
        if (t->quit) break;
        t->fn(t->arg, ith, t->nth);
        pthread_barrier_wait(&t->done);
    }
    return NULL;
}

kipp_team *kipp_team_create(int nth, char *err, size_t errlen)
{
    int cores = kipp_team_cores();
    if (nth == 0) nth = cores;
    if (nth < 1 || nth > cores) {
        set_err(err, errlen, "thread count %d is out of range; expected 1..%d (physical cores)", nth, cores);
        return NULL;
    }
    kipp_team *t = calloc(1, sizeof *t);
    if (t) {
        t->tid = calloc((size_t)nth, sizeof(pthread_t));
        t->slots = calloc((size_t)nth, sizeof(struct team_slot));
    }
    if (!t || !t->tid || !t->slots) {
        set_err(err, errlen, "out of memory creating a team of %d threads", nth);
        if (t) {
            free(t->tid);
            free(t->slots);
        }
        free(t);
        return NULL;
    }
    t->nth = nth;
    pthread_barrier_init(&t->start, NULL, (unsigned)nth);
    pthread_barrier_init(&t->done, NULL, (unsigned)nth);
    pin_to_core(0);
    for (int i = 1; i < nth; i++) {
        t->slots[i].team = t;
        t->slots[i].ith = i;
        if (pthread_create(&t->tid[i], NULL, team_worker, &t->slots[i]) != 0) {
            set_err(err, errlen, "pthread_create failed for team thread %d (errno %d)", i, errno);
            /* workers 1..i-1 exist: shrink the barriers to them and let them exit */
            pthread_barrier_destroy(&t->start);
            pthread_barrier_init(&t->start, NULL, (unsigned)i);
            t->nth = i;
            kipp_team_destroy(t);
            return NULL;
        }
    }
    return t;
}

void kipp_team_run(kipp_team *t, void (*fn)(void *arg, int ith, int nth), void *arg)
{
    t->fn = fn;
    t->arg = arg;
    if (t->nth > 1) pthread_barrier_wait(&t->start);
    fn(arg, 0, t->nth);
    if (t->nth > 1) pthread_barrier_wait(&t->done);
}

void kipp_team_destroy(kipp_team *t)
{
    if (!t) return;
    if (t->nth > 1) {
        t->quit = 1;
        pthread_barrier_wait(&t->start);
        for (int i = 1; i < t->nth; i++) pthread_join(t->tid[i], NULL);
    }
    pthread_barrier_destroy(&t->start);
    pthread_barrier_destroy(&t->done);
    free(t->tid);
    free(t->slots);
    free(t);
}

int kipp_team_size(const kipp_team *t) { return t->nth; }

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

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void kipp_bench_run(kipp_team *team, void (*fn)(void *arg, int ith, int nth), void *arg,
                    int warmup, int reps, kipp_bench_stats *st)
{
    if (reps < 1) reps = 1;
    double *t = malloc((size_t)reps * sizeof(double));
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
    qsort(t, (size_t)reps, sizeof(double), cmp_double);
    st->reps = reps;
    st->min = t[0];
    st->max = t[reps - 1];
    st->median = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
    free(t);
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

int kipp_profile_load(kipp_profile *p, const char *dir, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    snprintf(p->path, sizeof p->path, "%s/%s.json", dir, kipp_host_name());
    json_error_t je;
    json_t *root = json_load_file(p->path, 0, &je);
    if (!root) {
        set_err(err, errlen, "profile %s is missing or unreadable (%s); run `make profile` first",
                p->path, je.text);
        return -1;
    }
    p->read_gbps_1t = json_num(root, "bandwidth", "read_gbps_1t");
    p->read_gbps_all = json_num(root, "bandwidth", "read_gbps_all");
    p->fp32_gflops_all = json_num(root, "peaks", "fp32_fma_gflops_all");
    p->bf16_gflops_all = json_num(root, "peaks", "bf16_dot_gflops_all");
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
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s?, s:o, s:[]}", "schema", "kipp.bench.v1",
                     "kind", kind, "git_sha", kipp_git_sha(), "date", date, "host",
                     kipp_host_name(), "profile", profile_path, "config",
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

int kipp_result_write(json_t *doc, const char *dir, const char *tag, char *path_out,
                      size_t path_len, char *err, size_t errlen)
{
    char day[16];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(day, sizeof day, "%Y%m%d", &tm);
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        set_err(err, errlen, "cannot create results directory %s (errno %d)", dir, errno);
        return -1;
    }
    snprintf(path_out, path_len, "%s/%s-%s-%s-%s.json", dir, day, kipp_host_name(), tag, kipp_git_sha());
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
