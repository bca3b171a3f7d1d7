/*
 * threadpool.h - the persistent worker pool (docs/ARCHITECTURE.md "Threads";
 * seed 002 "Why it is fast on a CPU", item 5: one thread per physical core,
 * SMT siblings only add contention).
 *
 * Generic pthread + hwloc code with no model in it, so it lives in base/, the
 * floor beneath both of its users: a CPU backend owns one pool per backend
 * model (backends/cpu), and the bench harness times kernels on the same
 * workers, pinning and barriers (bench/bench_harness.c, linked into kcheck
 * with the kernels and base/ only). The calling thread is worker 0 and the pool
 * owns n-1 more threads, each pinned through hwloc to one physical core's
 * first processing unit. kipp_threadpool_run() makes all n workers run the same
 * function once (SPMD); inside it they meet at kipp_threadpool_barrier(), which
 * spins briefly (the common case inside a forward pass is a wait of a few
 * microseconds) and then parks (base/park.h: a futex on Linux) so an idle or
 * oversubscribed pool does not burn the core.
 */
#ifndef KIPP_THREADPOOL_H
#define KIPP_THREADPOOL_H

#include <stddef.h>

typedef struct kipp_threadpool kipp_threadpool;

/** Work run by every worker: ith in [0, nth). */
typedef void (*kipp_task_fn)(void *arg, int ith, int nth);

/**
 * Create a pool of n_threads workers (0 = one per physical core as hwloc
 * counts them). Worker i > 0 is pinned to core i mod cores; worker 0 (the
 * caller of kipp_threadpool_run) is pinned to core 0 for the duration of each
 * run and its binding restored afterwards. Pinning failures (e.g. a
 * restricted container) are recorded in the description, not fatal.
 * Errors: KIPP_EINVAL for n_threads < 0 or > 1024, KIPP_EBACKEND when hwloc
 * or pthread_create fails, KIPP_ENOMEM.
 */
int kipp_threadpool_create(int n_threads, kipp_threadpool **out, char *err, size_t errlen);

/** Join and free the workers; NULL accepted. Must not be called from inside a run. */
void kipp_threadpool_destroy(kipp_threadpool *pool);

/** Number of workers, including the caller. */
int kipp_threadpool_size(const kipp_threadpool *pool);

/** Physical cores hwloc found (for describe). */
int kipp_threadpool_cores(const kipp_threadpool *pool);

/** One sentence on pinning ("pinned n workers to n cores" or why not). */
const char *kipp_threadpool_pinning(const kipp_threadpool *pool);

/** Run fn(arg, ith, nth) on every worker; returns when all have returned. Not reentrant. */
void kipp_threadpool_run(kipp_threadpool *pool, kipp_task_fn fn, void *arg);

/** Wait until every worker of the current run has arrived (spin, then park). */
void kipp_threadpool_barrier(kipp_threadpool *pool);

#endif
