/*
 * threadpool.c - persistent pinned workers with a spin-then-park barrier
 * (see threadpool.h). Waiters park through base/park.h (a futex on Linux);
 * hwloc finds and binds the physical cores.
 */
#include "base/threadpool.h"

#include <hwloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errbuf.h"
#include "base/park.h"

/* Pause-loop iterations before parking: ~10-50 us on current x86, far longer
 * than a balanced barrier inside a forward pass, far shorter than the gap
 * between two decode steps. */
#define KIPP_POOL_SPIN 4096

struct kipp_threadpool {
    int n;                     /* workers including the caller */
    int n_cores;               /* physical cores found by hwloc */
    hwloc_topology_t topo;
    hwloc_bitmap_t *pu_sets;   /* [n_cores] first PU of each core */
    hwloc_bitmap_t saved;      /* caller's binding during a run */
    pthread_t *threads;        /* [n-1] */
    int n_started;             /* threads actually created */
    kipp_task_fn fn;
    void *arg;
    atomic_int stop;
    atomic_int pin_failures;
    char pinning[160];
    _Alignas(64) atomic_uint bar_count;
    _Alignas(64) atomic_uint bar_gen;
    atomic_uint bar_sleepers;
    _Alignas(64) atomic_uint job_gen;
    atomic_uint job_sleepers;
};

typedef struct {
    kipp_threadpool *pool;
    int ith;
} worker_arg;

/* Wait until *addr != old: spin first, then park. The sleeper count and the
 * word are both seq_cst, so either the waker sees the sleeper or the park
 * sees the new value (Dekker ordering); no wake-up is lost. */
static void wait_change(atomic_uint *addr, unsigned old, atomic_uint *sleepers)
{
    for (int i = 0; i < KIPP_POOL_SPIN; i++) {
        if (atomic_load(addr) != old) return;
        kipp_cpu_pause();
    }
    atomic_fetch_add(sleepers, 1);
    while (atomic_load(addr) == old) kipp_park_wait(addr, old);
    atomic_fetch_sub(sleepers, 1);
}

static void bump_and_wake(atomic_uint *addr, atomic_uint *sleepers)
{
    atomic_fetch_add(addr, 1);
    if (atomic_load(sleepers) > 0) kipp_park_wake_all(addr);
}

void kipp_threadpool_barrier(kipp_threadpool *p)
{
    if (p->n == 1) return;
    unsigned gen = atomic_load(&p->bar_gen);
    if (atomic_fetch_add(&p->bar_count, 1) + 1 == (unsigned)p->n) {
        atomic_store(&p->bar_count, 0); /* before the release, so the next barrier counts from 0 */
        bump_and_wake(&p->bar_gen, &p->bar_sleepers);
    } else {
        wait_change(&p->bar_gen, gen, &p->bar_sleepers);
    }
}

static void pin_self(kipp_threadpool *p, int core)
{
    if (p->n_cores <= 0) return;
    if (hwloc_set_cpubind(p->topo, p->pu_sets[core % p->n_cores], HWLOC_CPUBIND_THREAD) != 0)
        atomic_fetch_add(&p->pin_failures, 1);
}

static void *worker_main(void *varg)
{
    worker_arg wa = *(worker_arg *)varg;
    free(varg);
    kipp_threadpool *p = wa.pool;
    pin_self(p, wa.ith);
    unsigned seen = 0;
    for (;;) {
        wait_change(&p->job_gen, seen, &p->job_sleepers);
        seen = atomic_load(&p->job_gen);
        if (atomic_load(&p->stop)) break;
        p->fn(p->arg, wa.ith, p->n);
        kipp_threadpool_barrier(p);
    }
    return NULL;
}

/* Count the physical cores this thread may run on and keep one single-PU
 * cpuset per core. Only cores inside the creating thread's CPU affinity count
 * (taskset, numactl --cpunodebind), so replicas started on disjoint core sets
 * pin to their own cores instead of all to the machine's first ones. */
static int topo_init(kipp_threadpool *p, char *err, size_t errlen)
{
    if (hwloc_topology_init(&p->topo) != 0 || hwloc_topology_load(p->topo) != 0)
        return kipp_err(err, errlen, KIPP_EBACKEND, "hwloc could not load the CPU topology; expected a readable /sys or /proc");
    hwloc_obj_type_t t = hwloc_get_nbobjs_by_type(p->topo, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
    int n_all = hwloc_get_nbobjs_by_type(p->topo, t);
    hwloc_bitmap_t allowed = hwloc_bitmap_alloc();
    if (!allowed) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for the affinity cpuset");
    int n = 0;
    if (hwloc_get_cpubind(p->topo, allowed, HWLOC_CPUBIND_THREAD) == 0)
        for (int i = 0; i < n_all; i++) n += hwloc_bitmap_intersects(hwloc_get_obj_by_type(p->topo, t, (unsigned)i)->cpuset, allowed);
    int all = n == 0; /* affinity unknown or outside every core: use them all */
    if (all) n = n_all > 0 ? n_all : 1;
    p->n_cores = n;
    p->pu_sets = calloc((size_t)n, sizeof *p->pu_sets);
    p->saved = hwloc_bitmap_alloc();
    if (!p->pu_sets || !p->saved) {
        hwloc_bitmap_free(allowed);
        return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for %d core cpusets", n);
    }
    for (int i = 0, k = 0; k < n; i++) {
        hwloc_obj_t o = i < n_all ? hwloc_get_obj_by_type(p->topo, t, (unsigned)i) : NULL;
        if (o && !all && !hwloc_bitmap_intersects(o->cpuset, allowed)) continue;
        p->pu_sets[k] = o ? hwloc_bitmap_dup(o->cpuset) : hwloc_bitmap_alloc();
        if (!p->pu_sets[k]) {
            hwloc_bitmap_free(allowed);
            return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for core %d cpuset", k);
        }
        if (o && !all) hwloc_bitmap_and(p->pu_sets[k], p->pu_sets[k], allowed);
        if (o) hwloc_bitmap_singlify(p->pu_sets[k]); /* first PU only: never an SMT sibling */
        k++;
    }
    hwloc_bitmap_free(allowed);
    return 0;
}

int kipp_threadpool_create(int n_threads, kipp_threadpool **out, char *err, size_t errlen)
{
    *out = NULL;
    if (n_threads < 0 || n_threads > 1024)
        return kipp_err(err, errlen, KIPP_EINVAL, "n_threads %d is out of range; expected 0 (one per core) to 1024", n_threads);
    kipp_threadpool *p = calloc(1, sizeof *p);
    if (!p) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for the thread pool");
    int rc = topo_init(p, err, errlen);
    if (rc) { kipp_threadpool_destroy(p); return rc; }
    p->n = n_threads > 0 ? n_threads : p->n_cores;
    p->threads = calloc((size_t)p->n, sizeof *p->threads);
    if (!p->threads) { kipp_threadpool_destroy(p); return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for %d threads", p->n); }
    for (int i = 1; i < p->n; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa || (wa->pool = p, wa->ith = i, pthread_create(&p->threads[i - 1], NULL, worker_main, wa) != 0)) {
            free(wa);
            kipp_threadpool_destroy(p);
            return kipp_err(err, errlen, KIPP_EBACKEND, "pthread_create failed for worker %d of %d", i, n_threads);
        }
        p->n_started++;
    }
    /* Probe whether the caller (worker 0) can be pinned, then restore its binding. */
    if (hwloc_get_cpubind(p->topo, p->saved, HWLOC_CPUBIND_THREAD) == 0) {
        if (hwloc_set_cpubind(p->topo, p->pu_sets[0], HWLOC_CPUBIND_THREAD) != 0)
            atomic_fetch_add(&p->pin_failures, 1);
        hwloc_set_cpubind(p->topo, p->saved, HWLOC_CPUBIND_THREAD);
    }
    *out = p;
    return 0;
}

void kipp_threadpool_destroy(kipp_threadpool *p)
{
    if (!p) return;
    if (p->n_started > 0) {
        atomic_store(&p->stop, 1);
        bump_and_wake(&p->job_gen, &p->job_sleepers);
        for (int i = 0; i < p->n_started; i++) pthread_join(p->threads[i], NULL);
    }
    free(p->threads);
    if (p->pu_sets)
        for (int i = 0; i < p->n_cores; i++) hwloc_bitmap_free(p->pu_sets[i]);
    free(p->pu_sets);
    if (p->saved) hwloc_bitmap_free(p->saved);
    if (p->topo) hwloc_topology_destroy(p->topo);
    free(p);
}

int kipp_threadpool_size(const kipp_threadpool *p) { return p->n; }
int kipp_threadpool_cores(const kipp_threadpool *p) { return p->n_cores; }

const char *kipp_threadpool_pinning(const kipp_threadpool *p)
{
    kipp_threadpool *mp = (kipp_threadpool *)p; /* the text is a cache, refreshed on read */
    int fails = atomic_load(&mp->pin_failures);
    if (fails)
        snprintf(mp->pinning, sizeof mp->pinning, "%d of %d workers could not be pinned (hwloc_set_cpubind refused); they float", fails, p->n);
    else
        snprintf(mp->pinning, sizeof mp->pinning, "%d workers pinned one per physical core (%d cores%s)", p->n, p->n_cores,
                 p->n > p->n_cores ? ", oversubscribed" : "");
    return mp->pinning;
}

void kipp_threadpool_run(kipp_threadpool *p, kipp_task_fn fn, void *arg)
{
    int restore = hwloc_get_cpubind(p->topo, p->saved, HWLOC_CPUBIND_THREAD) == 0;
    if (p->n_cores > 0) /* a refusal here leaves the caller floating; counted once at create */
        hwloc_set_cpubind(p->topo, p->pu_sets[0], HWLOC_CPUBIND_THREAD);
    p->fn = fn;
    p->arg = arg;
    bump_and_wake(&p->job_gen, &p->job_sleepers); /* seq_cst: fn/arg are visible first */
    fn(arg, 0, p->n);
    kipp_threadpool_barrier(p);
    if (restore) hwloc_set_cpubind(p->topo, p->saved, HWLOC_CPUBIND_THREAD);
}
