/*
 * kcase.h - the kernel case table (docs/ARCHITECTURE.md "Kernel cases"): each row
 * is one kernel case (op, format, shape, tolerance, split, bench flag), and
 * the same row drives its check against the scalar oracle (`make test`) and
 * its benchmark on the backend's thread pool (`make bench`). The driver is
 * kcheck.c beside it (it times rows through bench/bench_harness.h, which the
 * Makefile links in; the table itself includes nothing of bench):
 *   kcheck [--op OP] [--fmt FMT] [--isa LEVEL] [--list] [--bench ...]
 * Kinds (what an op's row means and how it is checked and timed) live in
 * kcase_linear.c (formats) and kcase_ops.c (format-free ops); the rows in
 * kcase_table.c. Adding a format adds rows, not kinds.
 */
#ifndef KIPP_KCASE_H
#define KIPP_KCASE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/kernels.h"

/** One row. s[] is the shape; its meaning is the kind's `shape` string. */
typedef struct {
    const char *op; /* kind name: "matvec", "matmul", ... */
    int fmt;        /* k_fmt for format kinds, -1 for format-free ops */
    size_t s[4];    /* shape */
    double tol;     /* bound on the error against the oracle: NMSE, or 0 = bit-exact */
    int split;      /* check: run as `split` sequential threads to cover the row split */
    int bench;      /* 1: also timed by `kcheck --bench` */
} kcase;

typedef enum { KC_CHECK, KC_BENCH } kc_mode;

/** What a kind does with a row. setup returns NULL on allocation failure. */
typedef struct {
    const char *op;
    const char *shape; /* meaning of s[0..3], e.g. "rows cols copies" */
    /** Inputs (and in check mode the oracle's output) for row c on table k. */
    void *(*setup)(const kcase *c, const k_cpu_ops *k, kc_mode mode);
    /** The path under test, thread ith of nth (bench: the timed body). */
    void (*run)(void *st, int ith, int nth);
    /** After run in check mode: the error against the oracle (NMSE; bitwise kinds 0 or 1). */
    double (*error)(void *st);
    void (*release)(void *st);
    double (*bytes)(const kcase *c); /* bytes a run moves from memory */
    double (*flops)(const kcase *c); /* floating-point operations per run */
    const char *bound;               /* "memory" or "compute": the roofline a run is held to */
} kcase_kind;

/** The rows (kcase_table.c), terminated by op == NULL. */
extern const kcase kcase_rows[];

/** The kind of op; NULL when unknown. */
const kcase_kind *kcase_kind_find(const char *op);

/** Names of all kinds, space-separated (for error messages). */
const char *kcase_kind_names(void);

/* ---- shared by the kinds ---- */

/** Deterministic inputs (splitmix64), 64-byte aligned, kipp_aligned_free. NULL on failure. */
float *kc_rand_f32(size_t n, float lo, float hi);
kipp_bf16 *kc_rand_bf16(size_t n, float amp);
/** kipp_huge_alloc (base/hugepage.h), as the backend allocates weights and KV; free(). */
void *kc_alloc_big(size_t bytes);
/** NMSE sum((a-b)^2)/sum(b^2), b the oracle. */
double kc_nmse(const float *a, const float *ref, size_t n);

#endif
