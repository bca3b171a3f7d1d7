/*
 * harness.h - the minimal C test harness (no framework dependency).
 *
 * A test is `static void test_x(void)` run with RUN(test_x). CHECK records a
 * failure with file:line and a message but keeps going; a test passes when no
 * CHECK in it failed. th_finish() prints "RESULT <passed> <failed>", which
 * tests/run_tests.sh sums into the closing "N passed, N failed" line, and
 * returns the process exit status.
 */
#ifndef KIPP_TEST_HARNESS_H
#define KIPP_TEST_HARNESS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int th_passed, th_failed, th_cur_failed;

#define CHECK(cond, ...)                                                         \
    do {                                                                         \
        if (!(cond)) {                                                           \
            th_cur_failed++;                                                     \
            fprintf(stderr, "  check failed %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                        \
            fputc('\n', stderr);                                                 \
        }                                                                        \
    } while (0)

#define RUN(fn)                                                  \
    do {                                                         \
        th_cur_failed = 0;                                       \
        fn();                                                    \
        if (th_cur_failed) { th_failed++; printf("FAIL %s\n", #fn); } \
        else { th_passed++; printf("PASS %s\n", #fn); }          \
        fflush(stdout);                                          \
    } while (0)

static inline int th_finish(void)
{
    printf("RESULT %d %d\n", th_passed, th_failed);
    return th_failed ? 1 : 0;
}

/** Directory holding converted test models (set by tests/run_tests.sh). */
static inline const char *th_models_dir(void)
{
    const char *d = getenv("KIPP_TEST_MODELS");
    return d ? d : "build/models";
}

#ifdef KIPP_H
/** Opens th_models_dir()/<name>.gguf on the cpu backend into *m. On failure
 * prints "FAIL open <path>: <why>", counts one failed test and returns -1:
 * the caller returns th_finish(). Only where engine/kipp.h came first. */
static inline int th_open_model(const char *name, kipp_model **m)
{
    char path[512], err[256] = "";
    snprintf(path, sizeof path, "%s/%s.gguf", th_models_dir(), name);
    if (!kipp_model_open(path, "cpu", NULL, m, err, sizeof err)) return 0;
    printf("FAIL open %s: %s\n", path, err);
    th_failed++;
    return -1;
}
#endif

/** Normalised mean squared error sum((a-b)^2)/sum(b^2), b = reference. */
static inline double th_nmse(const float *a, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? num / den : num;
}

#endif
