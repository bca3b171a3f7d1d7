/*
 * kcheck.c - one driver for the kernel case table beside it (kcase.h): checks every
 * row on every level (or one op, format or level), or times the bench rows on
 * the backend's thread pool and writes results/<date>-<host>-<cpu id>-kernels-<sha>.json.
 *
 *   kcheck [--op OP] [--fmt FMT] [--isa LEVEL] [--list]
 *   kcheck --bench [--op OP] [--fmt FMT] [--isa LEVEL] [--threads N] [--reps N] [--out DIR]
 *
 * A bench run with any of the filters or settings is an experiment: it never
 * replaces an existing result file (a one-op A/B run at the same commit had
 * overwritten make bench's whole kernel table), and says so before timing.
 *
 * Built twice (Makefile): build/bin/kcheck runs the levels this CPU has;
 * build/bin/kcheck_emu links the AVX-512 sources compiled against SIMDe and
 * runs the levels this CPU lacks. Each (row, level) prints PASS or FAIL with
 * its error and bound; the RESULT line feeds tests/run_tests.sh. It times
 * through the bench harness (bench/bench_harness.c), which both link.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench_harness.h"
#include "kernels/cpu/check/kcase.h"
#include "kernels/names.h"

typedef struct {
    const char *op, *fmt, *isa, *out;
    int bench, list, threads, reps;
    int subset; /* --op, --fmt, --isa, --threads or --reps given: not make bench's full table */
} kc_args;

/* The format names of the table, space-separated (static storage). */
static const char *fmt_names(void)
{
    static char buf[256];
    const char *names[K_FMT_COUNT];
    for (int f = 0; f < K_FMT_COUNT; f++) names[f] = k_fmt_get((k_fmt)f)->name;
    return kipp_join_names(buf, sizeof buf, names, K_FMT_COUNT, " ");
}

/* The ISA level names, space-separated (static storage). */
static const char *level_names(void)
{
    static char buf[128];
    const char *names[KIPP_ISA_COUNT];
    for (int i = 0; i < KIPP_ISA_COUNT; i++) names[i] = kipp_isa_name((kipp_isa)i);
    return kipp_join_names(buf, sizeof buf, names, KIPP_ISA_COUNT, " ");
}

static int usage(FILE *f, int rc)
{
    fprintf(f, "usage: kcheck [--op OP] [--fmt FMT] [--isa LEVEL] [--list]\n"
               "       kcheck --bench [--op OP] [--fmt FMT] [--isa LEVEL] [--threads N] [--reps N] [--out DIR]\n"
               "  OP: %s\n  FMT: %s\n  LEVEL: %s\n"
               "  --bench with any option but --out is an experiment: it never replaces an existing result file\n",
               kcase_kind_names(), fmt_names(), level_names());
    return rc;
}

static int parse_level(const char *s)
{
    for (int i = 0; i < KIPP_ISA_COUNT; i++)
        if (!strcmp(s, kipp_isa_name((kipp_isa)i))) return i;
    return -1;
}

static int parse_fmt(const char *s)
{
    for (int f = 0; f < K_FMT_COUNT; f++)
        if (!strcmp(s, k_fmt_get((k_fmt)f)->name)) return f;
    return -1;
}

/* Returns -1 to continue, else the exit status. */
static int parse(int argc, char **argv, kc_args *a)
{
    memset(a, 0, sizeof *a);
    a->reps = 11;
    a->out = "results";
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        const char **slot = !strcmp(o, "--op") ? &a->op : !strcmp(o, "--fmt") ? &a->fmt
                          : !strcmp(o, "--isa") ? &a->isa : !strcmp(o, "--out") ? &a->out : NULL;
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) return usage(stdout, 0);
        if (!strcmp(o, "--bench")) a->bench = 1;
        else if (!strcmp(o, "--list")) a->list = 1;
        else if ((slot || !strcmp(o, "--threads") || !strcmp(o, "--reps")) && i + 1 < argc) {
            const char *v = argv[++i];
            if (slot != &a->out) a->subset = 1;
            if (slot) *slot = v;
            else {
                char *end;
                long n = strtol(v, &end, 10);
                if (*end || n < (!strcmp(o, "--reps") ? 1 : 0) || n > 1024) {
                    fprintf(stderr, "kcheck: %s '%s' is invalid; expected an integer in %s..1024\n", o, v, !strcmp(o, "--reps") ? "1" : "0");
                    return 2;
                }
                *(!strcmp(o, "--reps") ? &a->reps : &a->threads) = (int)n;
            }
        } else {
            fprintf(stderr, "kcheck: unknown or incomplete argument '%s'\n", o);
            return usage(stderr, 2);
        }
    }
    if (a->op && !kcase_kind_find(a->op)) {
        fprintf(stderr, "kcheck: --op '%s' is unknown; expected one of: %s\n", a->op, kcase_kind_names());
        return 2;
    }
    if (a->fmt && parse_fmt(a->fmt) < 0) {
        fprintf(stderr, "kcheck: --fmt '%s' is unknown; expected one of: %s\n", a->fmt, fmt_names());
        return 2;
    }
    if (a->isa && parse_level(a->isa) < 0) {
        fprintf(stderr, "kcheck: --isa '%s' is unknown; expected one of: %s\n", a->isa, level_names());
        return 2;
    }
    return -1;
}

static int row_selected(const kcase *c, const kc_args *a)
{
    if (a->op && strcmp(a->op, c->op)) return 0;
    if (a->fmt && c->fmt != parse_fmt(a->fmt)) return 0;
    return !a->bench || c->bench;
}

static void row_name(const kcase *c, char *out, size_t n)
{
    snprintf(out, n, "%s%s%s %zu %zu %zu %zu", c->op, c->fmt >= 0 ? " " : "",
             c->fmt >= 0 ? k_fmt_get((k_fmt)c->fmt)->name : "", c->s[0], c->s[1], c->s[2], c->s[3]);
}

/* ---- check mode ---- */

/* Levels this binary checks: native, those the CPU runs; emulated, those it lacks. */
static int level_in_scope(int lv, const kc_args *a)
{
    if (a->isa) return lv == parse_level(a->isa);
#ifdef KIPP_SIMDE_EMU
    return lv > (int)kipp_isa_cpu_max();
#else
    return lv <= (int)kipp_isa_cpu_max();
#endif
}

/* The level whose kernels a weight-format or activation row runs at level lv
 * (the highest source among the slots it calls); lv itself for format-free
 * ops. A row whose kernels all come from a lower level that this run checks
 * too (or that the native kcheck checks, for kcheck_emu) would compare the
 * same code twice (bf16dot at avx2/avx512 is the ref emulation), so it runs
 * once, at that level. */
static kipp_isa row_source(const kcase *c, kipp_isa lv)
{
    k_cpu_src s;
    k_cpu_ops_table(lv, &s);
    if (!strcmp(c->op, "act")) return s.act[c->s[1] < K_ACT_COUNT ? c->s[1] : 0];
    if (c->fmt < 0) return lv;
    if (!strcmp(c->op, "pack")) return s.fmt[c->fmt][0];
    kipp_isa src = s.fmt[c->fmt][1] > s.fmt[c->fmt][2] ? s.fmt[c->fmt][1] : s.fmt[c->fmt][2];
    k_act a = k_fmt_get((k_fmt)c->fmt)->act;
    if (a != K_ACT_F32 && s.act[a] > src) src = s.act[a];
    return src;
}

static int check_row(const kcase *c, kipp_isa lv, int *passed, int *failed)
{
    const kcase_kind *kind = kcase_kind_find(c->op);
    char name[128];
    row_name(c, name, sizeof name);
    void *st = kind->setup(c, k_cpu_ops_table(lv, NULL), KC_CHECK);
    if (!st) {
        printf("FAIL %s [%s]: setup failed (out of memory or no kernel for the row)\n", name, kipp_isa_name(lv));
        (*failed)++;
        return 1;
    }
    int split = c->split > 0 ? c->split : 1;
    for (int ith = 0; ith < split; ith++) kind->run(st, ith, split); /* sequential: covers the row split */
    double e = kind->error(st);
    kind->release(st);
    int ok = c->tol == 0 ? e == 0 : e <= c->tol;
    printf("%s %s [%s] %s %.3g (bound %s%.1g)\n", ok ? "PASS" : "FAIL", name, kipp_isa_name(lv),
           c->tol == 0 ? "diff" : "nmse", e, c->tol == 0 ? "bit-exact " : "", c->tol);
    fflush(stdout);
    *(ok ? passed : failed) += 1;
    return !ok;
}

/* The per-slot merge: every slot comes from the best level at or below the
 * asked one, avx512_bf16 adds exactly the VNNI matmuls of the integer formats
 * and the bf16dot read mode (bf16 keeps its FP32-FMA kernels), and the CPU cap holds. */
static void check_dispatch(int *passed, int *failed)
{
    k_cpu_src s;
    int ok = 1;
    for (int lv = 0; lv < KIPP_ISA_COUNT; lv++) {
        k_cpu_ops_table((kipp_isa)lv, &s);
#define K_OP_SRC_OK(name, params) \
    ok &= (int)s.name <= lv && (lv > 0 && KIPP_X86_LEVELS ? s.name != KIPP_ISA_REF : s.name == KIPP_ISA_REF);
        K_CPU_OP_LIST(K_OP_SRC_OK)
#undef K_OP_SRC_OK
        for (int f = 0; f < K_FMT_COUNT; f++) ok &= (int)s.fmt[f][2] <= lv && s.fmt[f][0] == KIPP_ISA_REF;
    }
#if KIPP_X86_LEVELS
    k_cpu_ops_table(KIPP_ISA_AVX512_BF16, &s);
    ok &= s.fmt[K_FMT_BF16][2] == KIPP_ISA_AVX512 && s.fmt[K_FMT_BF16][1] == KIPP_ISA_AVX512 && s.rope_f32 == KIPP_ISA_AVX512;
    ok &= s.fmt[K_FMT_AFFINE4][2] == KIPP_ISA_AVX512_BF16 && s.fmt[K_FMT_AFFINE4][1] == KIPP_ISA_AVX512;
    ok &= s.fmt[K_FMT_Q8_0][2] == KIPP_ISA_AVX512_BF16 && s.fmt[K_FMT_Q8_0][1] == KIPP_ISA_AVX512 && s.act[K_ACT_Q8] == KIPP_ISA_AVX2;
    ok &= s.fmt[K_FMT_BF16DOT][1] == KIPP_ISA_AVX512_BF16 && s.fmt[K_FMT_BF16DOT][2] == KIPP_ISA_AVX512_BF16 &&
          s.act[K_ACT_BF16] == KIPP_ISA_AVX512_BF16;
    /* bf16dot is native at avx512_bf16 only: a backend must not pick the scalar emulation below it */
    ok &= k_fmt_native(k_cpu_ops_table(KIPP_ISA_AVX512_BF16, NULL), K_FMT_BF16DOT) &&
          !k_fmt_native(k_cpu_ops_table(KIPP_ISA_AVX512, NULL), K_FMT_BF16DOT) &&
          k_fmt_native(k_cpu_ops_table(KIPP_ISA_AVX2, NULL), K_FMT_BF16) && !k_fmt_native(k_cpu_ops_table(KIPP_ISA_REF, NULL), K_FMT_BF16);
#else
    /* a portable build (kernels/common.h): every level is ref's kernels, and nothing is native */
    ok &= !k_fmt_native(k_cpu_ops_table(KIPP_ISA_AVX512_BF16, NULL), K_FMT_BF16DOT) &&
          !k_fmt_native(k_cpu_ops_table(KIPP_ISA_AVX2, NULL), K_FMT_BF16);
#endif
    ok &= !strcmp(k_cpu_ops_get(KIPP_ISA_AVX512_BF16)->isa, kipp_isa_name(kipp_isa_cpu_max()));
    ok &= !strcmp(k_cpu_ops_get(KIPP_ISA_REF)->isa, "ref");
    printf("%s dispatch: per-slot merge over levels and the CPU cap (best here: %s)\n", ok ? "PASS" : "FAIL",
           kipp_isa_name(kipp_isa_cpu_max()));
    *(ok ? passed : failed) += 1;
}

static int run_checks(const kc_args *a)
{
    int passed = 0, failed = 0, levels = 0;
    for (int lv = 0; lv < KIPP_ISA_COUNT; lv++) levels += level_in_scope(lv, a);
#ifndef KIPP_SIMDE_EMU
    if (a->isa && parse_level(a->isa) > (int)kipp_isa_cpu_max()) {
        fprintf(stderr, "kcheck: this CPU lacks %s (best: %s); run build/bin/kcheck_emu for the emulated level\n",
                a->isa, kipp_isa_name(kipp_isa_cpu_max()));
        return 2;
    }
    if (!a->op && !a->fmt) check_dispatch(&passed, &failed);
#endif
    printf("kcheck%s: levels", levels ? "" : " (no level in scope on this CPU)");
    for (int lv = 0; lv < KIPP_ISA_COUNT; lv++)
        if (level_in_scope(lv, a)) printf(" %s", kipp_isa_name((kipp_isa)lv));
    printf("\n");
    int inherited = 0;
    for (const kcase *c = kcase_rows; c->op; c++)
        if (row_selected(c, a))
            for (int lv = 0; lv < KIPP_ISA_COUNT; lv++) {
                if (!level_in_scope(lv, a)) continue;
                kipp_isa src = row_source(c, (kipp_isa)lv);
                /* checked at src in this run, or (emulated levels, no --isa) by the native kcheck of make test */
                int covered = level_in_scope((int)src, a) || (!a->isa && src <= kipp_isa_cpu_max());
                if ((int)src < lv && covered) inherited++;
                else check_row(c, (kipp_isa)lv, &passed, &failed);
            }
    if (inherited)
        printf("kcheck: %d row-level pairs run a lower level's kernels unchanged; each is checked at that level\n", inherited);
    printf("RESULT %d %d\n", passed, failed);
    return failed ? 1 : 0;
}

/* ---- bench mode ---- */

typedef struct {
    const kcase_kind *kind;
    void *st;
} bench_job;

static void bench_body(void *arg, int ith, int nth)
{
    bench_job *j = arg;
    j->kind->run(j->st, ith, nth);
}

static int run_bench(const kc_args *a)
{
    char err[256], path[700];
    const char *note = NULL;
    kipp_isa lv = a->isa ? (kipp_isa)parse_level(a->isa) : kipp_isa_select(&note);
    if (lv > kipp_isa_cpu_max()) {
        fprintf(stderr, "kcheck: --bench on %s needs a CPU that has it (best: %s)\n", kipp_isa_name(lv), kipp_isa_name(kipp_isa_cpu_max()));
        return 2;
    }
    if (note) fprintf(stderr, "kcheck: %s\n", note);
    kipp_result_path(a->out, "kernels", path, sizeof path);
    if (a->subset && access(path, F_OK) == 0) {
        fprintf(stderr,
                "kcheck: %s exists and this run times a subset or other settings (--op, --fmt, --isa, --threads, "
                "--reps), so it would replace that table: pass --out with another directory, or remove the file\n",
                path);
        return 2;
    }
    kipp_team *team = kipp_team_create(a->threads, err, sizeof err);
    if (!team) { fprintf(stderr, "kcheck: %s\n", err); return 2; }
    int nth = kipp_team_size(team);
    kipp_profile prof;
    if (kipp_profile_load(&prof, "profiles", err, sizeof err) != 0)
        fprintf(stderr, "kcheck: %s; roofline shares are left null\n", err);
    k_cpu_src src;
    const k_cpu_ops *k = k_cpu_ops_table(lv, &src);
    json_t *doc = kipp_result_create("kernel", prof.path,
                                     json_pack("{s:s, s:s, s:i, s:i}", "bench", "kcheck", "isa", kipp_isa_name(lv), "threads", nth, "reps", a->reps));
    printf("kcheck --bench: level %s, %d threads on the backend pool, profile %s\n", kipp_isa_name(lv), nth, prof.loaded ? prof.path : "(none)");
    printf("%-40s %10s %10s %10s %9s %9s %7s\n", "case", "median_us", "min_us", "max_us", "GB/s", "GFLOP/s", "roof");
    int rc = 0;
    for (const kcase *c = kcase_rows; c->op; c++) {
        if (!row_selected(c, a)) continue;
        const kcase_kind *kind = kcase_kind_find(c->op);
        char name[128];
        row_name(c, name, sizeof name);
        bench_job j = {kind, kind->setup(c, k, KC_BENCH)};
        if (!j.st) { fprintf(stderr, "kcheck: cannot set up %s\n", name); rc = 1; continue; }
        kipp_bench_stats st;
        kipp_bench_run(team, bench_body, &j, 2, a->reps, &st);
        kind->release(j.st);
        /* a matmul from the avx512_bf16 level runs a dot instruction: vdpbf16ps for
         * bf16dot, vpdpbusd (int8, twice its op rate) for the integer formats */
        int dot = c->fmt >= 0 && !strcmp(c->op, "matmul") && src.fmt[c->fmt][2] == KIPP_ISA_AVX512_BF16;
        double dot_peak = c->fmt == K_FMT_BF16DOT ? prof.bf16_gflops_all : prof.int8_gops_all;
        /* a dot row whose peak the profile lacks (made before the int8 loop existed) gets
         * no roofline rather than the FP32 one, which it would exceed */
        double roof = !prof.loaded ? 0 : !strcmp(kind->bound, "memory") ? (nth == 1 ? prof.read_gbps_1t : prof.read_gbps_all)
                    : (dot ? dot_peak : prof.fp32_gflops_all) * nth / kipp_team_cores();
        double bytes = kind->bytes(c), flops = kind->flops(c);
        json_t *r = kipp_result_add(doc, name, &st, bytes, flops, kind->bound, roof);
        json_t *share = json_object_get(r, "roofline_share");
        printf("%-40s %10.1f %10.1f %10.1f %9.2f %9.2f %6.1f%%\n", name, st.median * 1e6, st.min * 1e6, st.max * 1e6,
               bytes / st.median * 1e-9, flops / st.median * 1e-9, json_is_number(share) ? 100 * json_number_value(share) : 0.0);
        fflush(stdout);
    }
    if (kipp_result_write(doc, a->out, "kernels", path, sizeof path, err, sizeof err)) { fprintf(stderr, "kcheck: %s\n", err); rc = 1; }
    else printf("wrote %s\n", path);
    json_decref(doc);
    kipp_team_destroy(team);
    return rc;
}

int main(int argc, char **argv)
{
    kc_args a;
    int rc = parse(argc, argv, &a);
    if (rc >= 0) return rc;
    if (a.list) {
        for (const kcase *c = kcase_rows; c->op; c++) {
            char name[128];
            row_name(c, name, sizeof name);
            if (row_selected(c, &a)) printf("%-40s shape (%s) bound %g%s\n", name, kcase_kind_find(c->op)->shape, c->tol, c->bench ? " bench" : "");
        }
        return 0;
    }
    return a.bench ? run_bench(&a) : run_checks(&a);
}
