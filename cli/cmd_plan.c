/*
 * cmd_plan.c - `kipp plan --model FILE | --shape ID [--json] [--results DIR] [--profile FILE]`:
 * measure this machine (or take its peaks from a machine profile) and print the
 * planner's prediction for the model (seed 002 "Planner").
 *
 * The file's read speed is measured before the model is mapped, so no page of
 * it is pinned by this process while the sample is read. The model is opened
 * with backend "none": planning needs the shape and the file, not a prepared
 * copy. --shape plans a registry entry's shape as a BF16 file of it would be
 * (kipp_plan_shape), without a file: nothing is read from disk. Kipp's measured shares come from results/ of the source tree beside
 * the binary (build/kipp -> results/), or from --results DIR.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "engine/kipp.h"

static int usage(FILE *f)
{
    fprintf(f, "usage: kipp plan --model FILE.gguf | --shape ID [--json] [--results DIR] [--profile FILE]\n"
               "                 [--rope-scaling none|yarn:F[:ORIG]] [--kv-type bf16|q8_0]\n"
               "  measures cores, ISA level, RAM, RAM read bandwidth, the FP32 FMA, BF16 dot and int8 dot peaks\n"
               "  and the model file's read speed, then prints resident vs streamed layers, the context whose\n"
               "  KV fits a quarter of the usable RAM and, per weight format, predicted decode, prefill and\n"
               "  batch-of-8 tok/s and the server's aggregate at the --max-batch it picks, with the arithmetic,\n"
               "  and the longest context the RAM beside each format's weights holds per KV type (bf16, q8_0).\n"
               "  --shape    plan a registry id's shape (`kipp registry`) as a BF16 file of it, without the file\n"
               "  --json     print the plan as JSON (schema kipp.plan.v1)\n"
               "  --results  where the model benchmarks are (default: results/ beside the build directory)\n"
               "  --profile  take the read bandwidth, peaks, ISA level and CPU id from this machine profile\n"
               "             (make profile: profiles/<host>-<level>-<cpu id>.json) instead of probing them\n"
               "  --rope-scaling  plan with this RoPE scaling instead of the file's: YaRN raises the context\n"
               "             limit to ORIG x F (kipp generate --help; `kipp registry` lists the cards' yarn_ctx)\n"
               "  --kv-type  plan with this KV cache type (default bf16; q8_0: 34/64 of its bytes per token)\n");
    return f == stdout ? 0 : 2;
}

/* <dir of the binary>/../results, or "" when /proc/self/exe cannot be read. */
static void default_results(char *out, size_t n)
{
    char exe[PATH_MAX];
    ssize_t l = readlink("/proc/self/exe", exe, sizeof exe - 1);
    out[0] = 0;
    if (l <= 0) return;
    exe[l] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return;
    *slash = 0;
    snprintf(out, n, "%s/../results", exe);
}

int cmd_plan(int argc, char **argv)
{
    const char *model = NULL, *results = NULL, *profile = NULL, *shape = NULL;
    int json = 0;
    kipp_model_options mo = {0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return usage(stdout);
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--kv-type")) {
            char err[256];
            if (i + 1 == argc) return cli_errorf("plan", "--kv-type needs a value: bf16 or q8_0"), 2;
            if (kipp_kv_type_parse(argv[++i], &mo.kv_type, err, sizeof err)) return cli_errorf("plan", "%s", err), 2;
        }
        else if (!strcmp(argv[i], "--rope-scaling")) {
            char err[384];
            if (i + 1 == argc) return cli_errorf("plan", "--rope-scaling needs a value: none, yarn:F or yarn:F:ORIG"), 2;
            if (kipp_rope_scaling_parse(argv[++i], &mo.rope, err, sizeof err)) return cli_errorf("plan", "%s", err), 2;
            mo.rope_override = 1;
        }
        else if (!strcmp(argv[i], "--model") || !strcmp(argv[i], "--results") || !strcmp(argv[i], "--profile") ||
                 !strcmp(argv[i], "--shape")) {
            char k = argv[i][3];
            if (i + 1 == argc) {
                cli_errorf("plan", "%s needs a value: %s", argv[i],
                           k == 'o' ? "a .gguf path" : k == 'e' ? "a directory" : k == 'h' ? "a registry id" :
                           "a machine profile (.json)");
                return usage(stderr);
            }
            *(k == 'o' ? &model : k == 'e' ? &results : k == 'h' ? &shape : &profile) = argv[i + 1], i++;
        } else {
            cli_errorf("plan", "unexpected argument '%s'; expected --model FILE, --shape ID, --json, --results DIR, "
                       "--profile FILE, --rope-scaling SPEC or --kv-type bf16|q8_0",
                       argv[i]);
            return usage(stderr);
        }
    }
    if (model && shape) return cli_errorf("plan", "--model '%s' and --shape '%s': give one of them", model, shape), 2;
    if (shape && mo.rope_override)
        return cli_errorf("plan", "--rope-scaling applies to a --model file; --shape plans the card's own context"), 2;
    if (!model && !shape) return cli_missing("plan", "--model", "a .gguf path (or --shape ID)");
    char dir[PATH_MAX + 16], err[512] = "";
    if (results) { /* a directory named by the user must exist; the default one may not (assumed shares) */
        struct stat st;
        const char *why = stat(results, &st) != 0 ? strerror(errno) : !S_ISDIR(st.st_mode) ? "not a directory" : NULL;
        if (why) {
            cli_errorf("plan", "--results '%s': %s; expected a directory of model benchmarks (results/*.json)",
                       results, why);
            return 1;
        }
    }
    if (!results) default_results(dir, sizeof dir), results = dir;
    kipp_model *m = NULL;
    kipp_model_info in;
    int rc;
    if (shape) {
        if (kipp_plan_shape(shape, &in, err, sizeof err)) return cli_errorf("plan", "--shape %s", err), 2;
    } else {
        rc = kipp_model_open(model, "none", &mo, &m, err, sizeof err);
        if (rc) return cli_model_error("plan", model, err), 1;
        kipp_model_get_info(m, &in);
    }
    kipp_machine mc;
    rc = kipp_machine_measure_with(model, profile, &mc, err, sizeof err);
    kipp_plan p;
    if (!rc) rc = kipp_plan_make_info(&in, &mc, results, &p, err, sizeof err);
    kipp_model_close(m);
    if (rc) {
        cli_errorf("plan", "%s", err[0] ? err : kipp_strerror(rc));
        return 1;
    }
    char *s = json ? kipp_plan_json(&p) : kipp_plan_text(&p);
    if (!s) {
        cli_errorf("plan", "out of memory");
        return 1;
    }
    fputs(s, stdout);
    if (json) fputc('\n', stdout);
    free(s);
    return 0;
}
