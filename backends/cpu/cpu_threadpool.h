/*
 * cpu_threadpool.h - the cpu backend's persistent worker pool (docs/ARCHITECTURE.md
 * "Threads"; seed 002 "Why it is fast on a CPU", item 5: one thread per
 * physical core, SMT siblings only add contention).
 *
 * One pool per backend model. The calling thread is worker 0 and the pool
 * owns n-1 more threads, each pinned through hwloc to one physical core's
 * first processing unit. kipp_cpu_pool_run() makes all n workers run the same
 * function once (SPMD); inside it they meet at kipp_cpu_pool_barrier(), which
 * spins briefly (the common case inside a forward pass is a wait of a few
 * microseconds) and then parks on a futex so an idle or oversubscribed pool
 * does not burn the core.
 */
#ifndef KIPP_CPU_THREADPOOL_H
#define KIPP_CPU_THREADPOOL_H

#include <stddef.h>

typedef struct kipp_cpu_pool kipp_cpu_pool;

/** Work run by every worker: ith in [0, nth). */
typedef void (*kipp_cpu_task_fn)(void *arg, int ith, int nth);

/**
 * Create a pool of n_threads workers (0 = one per physical core as hwloc
 * counts them). Worker i > 0 is pinned to core i mod cores; worker 0 (the
 * caller of kipp_cpu_pool_run) is pinned to core 0 for the duration of each
 * run and its binding restored afterwards. Pinning failures (e.g. a
 * restricted container) are recorded in the description, not fatal.
 * Errors: KIPP_EINVAL for n_threads < 0 or > 1024, KIPP_EBACKEND when hwloc
 * or pthread_create fails, KIPP_ENOMEM.
 */
int kipp_cpu_pool_create(int n_threads, kipp_cpu_pool **out, char *err, size_t errlen);

/** Join and free the workers; NULL accepted. Must not be called from inside a run. */
void kipp_cpu_pool_destroy(kipp_cpu_pool *pool);

/** Number of workers, including the caller. */
int kipp_cpu_pool_size(const kipp_cpu_pool *pool);

/** Physical cores hwloc found (for describe). */
int kipp_cpu_pool_cores(const kipp_cpu_pool *pool);

/** One sentence on pinning ("pinned n workers to n cores" or why not). */
const char *kipp_cpu_pool_pinning(const kipp_cpu_pool *pool);

/** Run fn(arg, ith, nth) on every worker; returns when all have returned. Not reentrant. */
void kipp_cpu_pool_run(kipp_cpu_pool *pool, kipp_cpu_task_fn fn, void *arg);

/** Wait until every worker of the current run has arrived (spin, then park). */
void kipp_cpu_pool_barrier(kipp_cpu_pool *pool);

#endif
