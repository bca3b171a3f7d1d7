/*
 * test_planner.c - kipp_plan_make's arithmetic on a machine given as numbers
 * (seed 002 "Planner"): residency and streaming, the context, and the predicted
 * rates with and without streamed layers. The oracle is the README's rule
 * written out here from the model's dimensions (kipp_model_get_info), not the
 * planner's code; no measurement runs, so the figures are exact. The shares
 * come from result files written here, the RAM figures from meminfo and cgroup
 * files written here, each with the answer the README's rule gives by hand.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/internal.h"
#include "engine/kipp.h"
#include "tests/test_harness.h"

/* synthetic-tiny on the "none" backend, its info in *in; NULL (reported) when it cannot be opened. */
static kipp_model *open_tiny(kipp_model_info *in)
{
    char path[512], err[256] = "";
    snprintf(path, sizeof path, "%s/synthetic-tiny.gguf", th_models_dir());
    kipp_model *m = NULL;
    int rc = kipp_model_open(path, "none", NULL, &m, err, sizeof err);
    CHECK(rc == 0, "open %s: %s", path, err);
    if (m) kipp_model_get_info(m, in);
    return m;
}

/* Bytes of one layer in BF16 (projections + norms) and of the head, from the dimensions. */
static void sizes(const kipp_model_info *in, double *layer, double *head, double *params_per_layer)
{
    double D = in->d_model, A = (double)in->n_q_head * in->head_dim, KV = (double)in->n_kv_head * in->head_dim;
    *params_per_layer = (A + 2 * KV) * D + D * A + 3.0 * in->d_ff * D;
    *layer = 2 * *params_per_layer + 2 * (2 * D + 2 * in->head_dim);
    *head = 2.0 * in->vocab_size * D;
}

/* open_tiny, and sizes() of its dimensions. */
static kipp_model *open_tiny_sized(kipp_model_info *in, double *layer, double *head, double *params_per_layer)
{
    kipp_model *m = open_tiny(in);
    if (m) sizes(in, layer, head, params_per_layer);
    return m;
}

static kipp_machine machine(uint64_t avail)
{
    return (kipp_machine){.cpu_id = "test-cpu", .isa = "avx2", .physical_cores = 2, .logical_cpus = 4,
                          .ram_total_bytes = avail * 2, .ram_available_bytes = avail, .ram_read_gbps = 10,
                          .peak_gflops = 100, .disk_read_gbps = 1, .disk_sample_bytes = 1 << 20};
}

static void test_resident_when_it_fits(void)
{
    kipp_model_info in;
    double layer, head, ppl;
    kipp_model *m = open_tiny_sized(&in, &layer, &head, &ppl);
    if (!m) return;
    kipp_machine mc = machine(20ull << 30);
    kipp_plan p;
    char err[256] = "";
    CHECK(kipp_plan_make(m, &mc, NULL, &p, err, sizeof err) == 0, "%s", err);
    CHECK(!p.streamed && p.layers_resident == in.n_layer && p.layers_streamed == 0, "streamed %d resident %u",
          p.streamed, p.layers_resident);
    CHECK(p.usable_ram_bytes == mc.ram_available_bytes - in.weight_bytes, "usable %llu",
          (unsigned long long)p.usable_ram_bytes);
    CHECK(p.ctx == in.context_length, "ctx %u, expected the trained %u (RAM is plenty)", p.ctx, in.context_length);
    CHECK(p.n_formats == 3 && !strcmp(p.formats[0].format, "bf16"), "%zu formats", p.n_formats);
    const kipp_plan_format *f = &p.formats[0];
    double decode_bytes = in.n_layer * layer + head + 4.0 * in.d_model + 80.5 * in.kv_bytes_per_token;
    double want = 10e9 * 0.80 / decode_bytes; /* no results dir: the assumed 80% */
    CHECK(fabs(f->decode_tps / want - 1) < 1e-9, "decode %.6f, expected %.6f", f->decode_tps, want);
    double A = (double)in.n_q_head * in.head_dim;
    double flops = 2 * in.n_layer * ppl + in.n_layer * 4 * A * 256.5 + 2 * head / 2 / 512;
    want = 100e9 * 0.60 / flops; /* all on FP32 FMA here (avx2: no dot), at the assumed 60% */
    CHECK(fabs(f->prefill_tps / want - 1) < 1e-9, "prefill %.3f, expected %.3f", f->prefill_tps, want);
    CHECK(!strcmp(f->decode_source, "assumed") && !strcmp(f->prefill_source, "assumed"), "%s", f->decode_source);
    CHECK(p.head_resident && !p.results_skipped[0], "head %d, skipped \"%s\"", p.head_resident, p.results_skipped);
    kipp_model_close(m);
}

static void test_streamed_layers_cost_disk_time(void)
{
    kipp_model_info in;
    double layer, head, ppl;
    kipp_model *m = open_tiny_sized(&in, &layer, &head, &ppl);
    if (!m) return;
    /* 0.75 x available holds the head and exactly one layer */
    uint64_t avail = (uint64_t)((head + 1.5 * layer) / 0.75);
    kipp_machine mc = machine(avail);
    kipp_plan p;
    char err[256] = "";
    CHECK(kipp_plan_make(m, &mc, NULL, &p, err, sizeof err) == 0, "%s", err);
    CHECK(p.streamed && p.layers_resident == 1 && p.layers_streamed == in.n_layer - 1, "streamed %d resident %u",
          p.streamed, p.layers_resident);
    uint64_t resident = (uint64_t)(head + 2.0 * in.d_model + layer); /* the head's segment has output_norm */
    CHECK(p.usable_ram_bytes == avail - resident, "usable %llu, expected %llu",
          (unsigned long long)p.usable_ram_bytes, (unsigned long long)(avail - resident));
    uint32_t ctx = (uint32_t)((avail - resident) / 4 / in.kv_bytes_per_token / 32 * 32);
    CHECK(p.ctx == ctx, "ctx %u, expected %u", p.ctx, ctx);
    double decode_bytes = in.n_layer * layer + head + 4.0 * in.d_model + 80.5 * in.kv_bytes_per_token;
    double streamed = layer * (in.n_layer - 1);
    double want = 1 / ((decode_bytes - streamed) / (10e9 * 0.80) + streamed / 1e9);
    CHECK(fabs(p.formats[0].decode_tps / want - 1) < 1e-9, "decode %.6f, expected %.6f", p.formats[0].decode_tps, want);
    CHECK(strstr(p.formats[0].rationale, "streamed layers come from the file"), "%s", p.formats[0].rationale);
    /* other formats are not this file: no streaming term */
    CHECK(!strstr(p.formats[1].rationale, "streamed"), "%s", p.formats[1].rationale);
    /* the JSON says the same */
    char *js = kipp_plan_json(&p);
    json_t *o = js ? json_loads(js, 0, NULL) : NULL;
    CHECK(o && json_is_true(json_object_get(o, "streamed")) &&
              json_integer_value(json_object_get(o, "layers_streamed")) == in.n_layer - 1 &&
              json_integer_value(json_object_get(o, "ctx")) == ctx, "%s", js ? js : "(null)");
    json_decref(o);
    free(js);
    char *txt = kipp_plan_text(&p);
    CHECK(txt && strstr(txt, "1 resident, 1 streamed"), "%s", txt ? txt : "(null)");
    free(txt);
    kipp_model_close(m);
}

/* A head alone over the budget: the cpu backend keeps nothing (cpu_stream.c keeps the head first, then layers,
 * while they fit), so the plan counts nothing resident and reads the head from the file per token too. */
static void test_head_over_budget_is_streamed(void)
{
    kipp_model_info in;
    double layer, head, ppl;
    kipp_model *m = open_tiny_sized(&in, &layer, &head, &ppl);
    if (!m) return;
    uint64_t avail = (uint64_t)(0.9 * head / 0.75); /* 0.75 x available is 90% of the head */
    kipp_machine mc = machine(avail);
    kipp_plan p;
    char err[256] = "";
    CHECK(kipp_plan_make(m, &mc, NULL, &p, err, sizeof err) == 0, "%s", err);
    CHECK(p.streamed && !p.head_resident && p.layers_resident == 0 && p.usable_ram_bytes == avail,
          "streamed %d head %d layers %u usable %llu, expected 1 0 0 %llu", p.streamed, p.head_resident,
          p.layers_resident, (unsigned long long)p.usable_ram_bytes, (unsigned long long)avail);
    double decode_bytes = in.n_layer * layer + head + 4.0 * in.d_model + 80.5 * in.kv_bytes_per_token;
    double streamed = in.n_layer * layer + head;
    double want = 1 / ((decode_bytes - streamed) / (10e9 * 0.80) + streamed / 1e9);
    CHECK(fabs(p.formats[0].decode_tps / want - 1) < 1e-9, "decode %.6f, expected %.6f", p.formats[0].decode_tps, want);
    CHECK(strstr(p.formats[0].rationale, "and the head come from the file"), "%s", p.formats[0].rationale);
    char *txt = kipp_plan_text(&p);
    CHECK(txt && strstr(txt, "the head is streamed too"), "%s", txt ? txt : "(null)");
    free(txt);
    /* room for the head but not output_norm, which cpu_stream.c keeps in the head's segment: nothing kept */
    mc = machine((uint64_t)((head + in.d_model) / 0.75));
    CHECK(kipp_plan_make(m, &mc, NULL, &p, err, sizeof err) == 0, "%s", err);
    CHECK(!p.head_resident, "the head kept without room for its segment's output_norm");
    /* with room for the head and half a layer, the head stays */
    mc = machine((uint64_t)((head + 0.5 * layer) / 0.75));
    CHECK(kipp_plan_make(m, &mc, NULL, &p, err, sizeof err) == 0, "%s", err);
    CHECK(p.head_resident && p.layers_resident == 0 && !strstr(p.formats[0].rationale, "and the head"),
          "head %d layers %u: %s", p.head_resident, p.layers_resident, p.formats[0].rationale);
    kipp_model_close(m);
}

static void test_no_room_and_bad_arguments(void)
{
    kipp_model_info in;
    kipp_model *m = open_tiny(&in);
    if (!m) return;
    /* room for 100 positions of KV: no head, no layer, and a quarter of it holds less than one 32-token block */
    kipp_machine mc = machine(100 * in.kv_bytes_per_token);
    kipp_plan p;
    char err[256] = "";
    CHECK(kipp_plan_make(m, &mc, NULL, &p, err, sizeof err) == 0, "%s", err);
    CHECK(p.streamed && !p.head_resident && p.layers_resident == 0 && p.ctx == 0, "head %d resident %u ctx %u",
          p.head_resident, p.layers_resident, p.ctx);
    CHECK(kipp_plan_make(NULL, &mc, NULL, &p, err, sizeof err) == KIPP_EINVAL && strstr(err, "NULL"), "%s", err);
    kipp_model_close(m);
}


static kipp_model *open_file(const char *name)
{
    char path[512], err[256] = "";
    snprintf(path, sizeof path, "%s/%s", th_models_dir(), name);
    kipp_model *m = NULL;
    int rc = kipp_model_open(path, "none", NULL, &m, err, sizeof err);
    CHECK(rc == 0, "open %s: %s", path, err);
    return m;
}

/* A --quant-head file keeps its BF16 token embedding apart from the head; the cpu backend keeps the head and
 * whole layers in the page cache, not the embedding (a step reads only its tokens' rows), so the plan counts
 * the same: room for the head and 1.5 layers keeps one layer, whatever the embedding's size. */
static void test_embedding_not_counted_as_resident(void)
{
    kipp_model *m = open_file("synthetic-tiny-affine4_gs32-head_affine4_gs32.gguf");
    if (!m) return;
    kipp_model_info in;
    kipp_model_get_info(m, &in);
    double layer, head_bf16, ppl;
    sizes(&in, &layer, &head_bf16, &ppl);
    layer = ppl * 20 / 32 + 2 * (2.0 * in.d_model + 2 * in.head_dim); /* affine4_gs32: 20 bytes per 32 weights */
    double head = (double)in.vocab_size * in.d_model * 20 / 32;
    CHECK(head_bf16 > layer, "the embedding (%.0f B) must outweigh a layer (%.0f B) for this test to mean anything",
          head_bf16, layer);
    uint64_t avail = (uint64_t)((head + 1.5 * layer) / 0.75);
    kipp_machine mc = machine(avail);
    kipp_plan p;
    char err[256] = "";
    CHECK(kipp_plan_make(m, &mc, NULL, &p, err, sizeof err) == 0, "%s", err);
    CHECK(p.streamed && p.layers_resident == 1, "streamed %d, %u layers resident, expected 1", p.streamed,
          p.layers_resident);
    uint64_t resident = (uint64_t)(head + 2.0 * in.d_model + layer);
    CHECK(p.usable_ram_bytes == avail - resident, "usable %llu, expected %llu", (unsigned long long)p.usable_ram_bytes,
          (unsigned long long)(avail - resident));
    kipp_model_close(m);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f && fputs(text, f) >= 0, "cannot write %s", path);
    if (f) fclose(f);
}

/* A kipp.bench.v1 results file with one tg128 and one pp512 row of `model` in bf16: the decode share of the
 * read bandwidth, the prefill share of the plan's limit as make bench records it (plan.limit_share). */
static void write_result(const char *dir, const char *name, const char *cpu, const char *isa, const char *date,
                         double load, double busy, const char *model, double dec, double pre)
{
    char path[1024], text[2048], busy_key[64] = "";
    if (busy >= 0) snprintf(busy_key, sizeof busy_key, ", \"cpu_busy_others_at_start\": %g", busy);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(text, sizeof text,
             "{\"schema\": \"kipp.bench.v1\", \"date\": \"%s\", \"cpu\": {\"cpu_id\": \"%s\"},"
             " \"config\": {\"isa\": \"%s\", \"load_avg_1min_at_start\": %g%s}, \"results\": ["
             "{\"name\": \"tg128\", \"model\": \"%s\", \"format\": \"bf16\", \"roofline_ref\": \"read_gbps_all\","
             " \"roofline_share\": %g},"
             "{\"name\": \"pp512\", \"model\": \"%s\", \"format\": \"bf16\", \"roofline_ref\": \"bf16_gflops_all\","
             " \"roofline_share\": 0.3, \"plan\": {\"limit_share\": %g}}]}",
             date, cpu, isa, load, busy_key, model, dec, model, pre);
    write_file(path, text);
}

/* The shares are the median of the newest three runs of this CPU and level: of this model when it has rows
 * (the other model's newer rows are ignored), of quiet runs when there are any (the newest, loaded run is
 * ignored); prefill, with rows of another model only, takes theirs. */
static void test_shares_are_a_median_of_recent_runs(void)
{
    kipp_model_info in;
    kipp_model *m = open_tiny(&in);
    if (!m) return;
    char dir[] = "/tmp/kipp-test-shares-XXXXXX";
    CHECK(mkdtemp(dir), "mkdtemp");
    const char *me = in.checkpoint_id, *other = "synthetic-0.6b";
    /* quiet runs of this model, oldest first: 0.50, then 0.90, 0.70, 0.60; quiet is others' CPU share below
     * 0.25 in the second before the run where recorded (c: load 3 left by the run before it, yet quiet),
     * else a load average below half the cores (2 here) */
    write_result(dir, "20260101-vm-test-cpu-cpu-a.json", "test-cpu", "avx2", "2026-01-01T00:00:00Z", 0.1, -1, me, 0.50, -1);
    write_result(dir, "20260102-vm-test-cpu-cpu-b.json", "test-cpu", "avx2", "2026-01-02T00:00:00Z", 0.1, -1, me, 0.90, -1);
    write_result(dir, "20260103-vm-test-cpu-cpu-c.json", "test-cpu", "avx2", "2026-01-03T00:00:00Z", 3.0, 0.05, me, 0.70, -1);
    write_result(dir, "20260104-vm-test-cpu-cpu-d.json", "test-cpu", "avx2", "2026-01-04T00:00:00Z", 0.2, -1, me, 0.60, -1);
    /* newer, but loaded (others used 60% of the CPUs, though the load average was low); another model;
     * another level; another CPU */
    write_result(dir, "20260105-vm-test-cpu-cpu-e.json", "test-cpu", "avx2", "2026-01-05T00:00:00Z", 0.1, 0.6, me, 0.20, -1);
    write_result(dir, "20260106-vm-test-cpu-cpu-f.json", "test-cpu", "avx2", "2026-01-06T00:00:00Z", 0.1, -1, other, 0.10, 1.2);
    write_result(dir, "20260107-vm-test-cpu-cpu-g.json", "test-cpu", "avx2", "2026-01-07T00:00:00Z", 0.1, -1, other, 0.10, 0.8);
    write_result(dir, "20260108-vm-test-cpu-cpu-h.json", "test-cpu", "avx512", "2026-01-08T00:00:00Z", 0.1, -1, me, 0.30, 2.0);
    write_result(dir, "20260109-vm-test-cpux-cpu-i.json", "test-cpux", "avx2", "2026-01-09T00:00:00Z", 0.1, -1, me, 0.30, 2.0);
    /* a truncated file and another schema under a model benchmark's name: named, not used, not fatal */
    char bad[1024];
    snprintf(bad, sizeof bad, "%s/20260110-vm-test-cpu-cpu-j.json", dir);
    write_file(bad, "{\"schema\": \"kipp.bench.v1\", \"results\": [");
    snprintf(bad, sizeof bad, "%s/20260111-vm-test-cpu-cpu-k.json", dir);
    write_file(bad, "{\"schema\": \"kipp.peers.v1\"}");
    kipp_machine mc = machine(20ull << 30);
    kipp_plan p;
    char err[256] = "";
    CHECK(kipp_plan_make(m, &mc, dir, &p, err, sizeof err) == 0, "%s", err);
    const kipp_plan_format *f = &p.formats[0];
    CHECK(fabs(f->decode_eff - 0.70) < 1e-12, "decode share %.6f, expected the median 0.70 of 0.90, 0.70, 0.60 (%s)",
          f->decode_eff, f->decode_source);
    CHECK(strstr(f->decode_source, "cpu-b.json") && strstr(f->decode_source, "cpu-c.json") &&
              strstr(f->decode_source, "cpu-d.json") && !strstr(f->decode_source, "cpu-a.json"),
          "%s", f->decode_source);
    CHECK(fabs(f->prefill_eff - 1.0) < 1e-12, "prefill share %.6f, expected the mean 1.0 of the other model's 1.2 "
          "and 0.8 (%s)", f->prefill_eff, f->prefill_source);
    CHECK(strstr(f->prefill_source, "other-model"), "%s", f->prefill_source);
    CHECK(!strcmp(p.formats[1].decode_source, "assumed"), "q8_0 has no rows: %s", p.formats[1].decode_source);
    CHECK(strstr(p.results_skipped, "20260110-vm-test-cpu-cpu-j.json (line ") &&
              strstr(p.results_skipped, "20260111-vm-test-cpu-cpu-k.json (schema \"kipp.peers.v1\""),
          "results_skipped: %s", p.results_skipped);
    char *txt = kipp_plan_text(&p);
    CHECK(txt && strstr(txt, "results not read") && strstr(txt, "cpu-j.json"), "%s", txt ? txt : "(null)");
    free(txt);
    unlink(bad);
    snprintf(bad, sizeof bad, "%s/20260110-vm-test-cpu-cpu-j.json", dir);
    unlink(bad);
    const char *names[] = {"a", "b", "c", "d", "e", "f", "g", "h"};
    char path[1024];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(path, sizeof path, "%s/2026010%zu-vm-test-cpu-cpu-%s.json", dir, i + 1, names[i]);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/20260109-vm-test-cpux-cpu-i.json", dir);
    unlink(path);
    rmdir(dir);
    kipp_model_close(m);
}

/* What cannot be read is named, never waited on, and the plan's JSON stays whole: a FIFO under a
 * result's name (opening it would block), a name with a byte that is not UTF-8 (its rows are used), more
 * unreadable files than the note holds (it ends with the count), a results directory that does not exist. */
static void test_unreadable_results_are_named(void)
{
    kipp_model_info in;
    kipp_model *m = open_tiny(&in);
    if (!m) return;
    char dir[] = "/tmp/kipp-test-unreadable-XXXXXX", path[1024];
    CHECK(mkdtemp(dir), "mkdtemp");
    snprintf(path, sizeof path, "%s/20260101-vm-test-cpu-cpu-fifo.json", dir);
    CHECK(mkfifo(path, 0600) == 0, "mkfifo %s", path);
    write_result(dir, "20260102-vm-test-cpu-cpu-\xff.json", "test-cpu", "avx2", "2026-01-02T00:00:00Z", 0.1, -1,
                 in.checkpoint_id, 0.40, 0.9);
    kipp_machine mc = machine(20ull << 30);
    kipp_plan p;
    char err[256] = "";
    CHECK(kipp_plan_make(m, &mc, dir, &p, err, sizeof err) == 0, "%s", err);
    CHECK(!strcmp(p.results_skipped, "20260101-vm-test-cpu-cpu-fifo.json (not a regular file)"), "results_skipped: %s",
          p.results_skipped);
    for (int i = 0; i < 12; i++) {
        snprintf(path, sizeof path, "%s/20260103-vm-test-cpu-cpu-bad%02d.json", dir, i);
        write_file(path, "{");
    }
    CHECK(kipp_plan_make(m, &mc, dir, &p, err, sizeof err) == 0, "%s", err);
    CHECK(strstr(p.results_skipped, "more, 13 in all") && strlen(p.results_skipped) < sizeof p.results_skipped - 1,
          "results_skipped: %s", p.results_skipped);
    CHECK(fabs(p.formats[0].decode_eff - 0.40) < 1e-12 && strstr(p.formats[0].decode_source, "cpu-?.json"),
          "decode share %.3f from %s", p.formats[0].decode_eff, p.formats[0].decode_source);
    char *js = kipp_plan_json(&p);
    json_t *o = js ? json_loads(js, 0, NULL) : NULL;
    CHECK(o && json_array_size(json_object_get(o, "formats")) == p.n_formats &&
              !strcmp(json_string_value(json_object_get(o, "results_dir")), dir),
          "%s", js ? js : "(null)");
    json_decref(o);
    free(js);
    snprintf(path, sizeof path, "%s/20260101-vm-test-cpu-cpu-fifo.json", dir), unlink(path);
    snprintf(path, sizeof path, "%s/20260102-vm-test-cpu-cpu-\xff.json", dir), unlink(path);
    for (int i = 0; i < 12; i++) snprintf(path, sizeof path, "%s/20260103-vm-test-cpu-cpu-bad%02d.json", dir, i), unlink(path);
    CHECK(rmdir(dir) == 0, "rmdir %s: a file was left", dir);
    /* the directory is gone now */
    CHECK(kipp_plan_make(m, &mc, dir, &p, err, sizeof err) == 0, "%s", err);
    CHECK(strstr(p.results_skipped, dir) && strstr(p.results_skipped, "No such file"), "results_skipped: %s",
          p.results_skipped);
    CHECK(!strcmp(p.formats[0].decode_source, "assumed"), "%s", p.formats[0].decode_source);
    kipp_model_close(m);
}

/* Write cgroup files limit_file = limit and usage_file = usage in the directory dir/rel (made here). */
static void write_cgroup(const char *dir, const char *rel, const char *limit_file, const char *limit,
                         const char *usage_file, const char *usage)
{
    char p[300], q[400];
    snprintf(p, sizeof p, "%s", dir);
    for (const char *s = rel; *s; s++) /* mkdir -p of rel, one level at a time */
        if (s[1] == '/' || !s[1]) {
            snprintf(p, sizeof p, "%s%.*s", dir, (int)(s - rel + 1), rel);
            mkdir(p, 0700);
        }
    snprintf(q, sizeof q, "%s/%s", p, limit_file), write_file(q, limit);
    snprintf(q, sizeof q, "%s/%s", p, usage_file), write_file(q, usage);
}

static void expect_ram(const kipp_ram_paths *at, uint64_t want_total, uint64_t want_avail, const char *what)
{
    uint64_t total = 0, avail = 0;
    char err[256] = "";
    CHECK(kipp_plan_ram_at(at, &total, &avail, err, sizeof err) == 0, "%s: %s", what, err);
    CHECK(total == want_total && avail == want_avail, "%s: total %llu avail %llu, expected %llu and %llu", what,
          (unsigned long long)total, (unsigned long long)avail, (unsigned long long)want_total,
          (unsigned long long)want_avail);
}

/* kipp_plan_ram over meminfo and cgroup files written here: v2 (one "0::" line, memory.max/current under
 * the root), v1 on a hybrid host (the memory controller's line wins over "0::"), and the unlimited forms. */
static void test_ram_from_cgroup_files(void)
{
    char dir[] = "/tmp/kipp-test-cgroup-XXXXXX", mi[100], sc[100];
    CHECK(mkdtemp(dir), "mkdtemp");
    snprintf(mi, sizeof mi, "%s/meminfo", dir);
    snprintf(sc, sizeof sc, "%s/self_cgroup", dir);
    write_file(mi, "MemTotal:       24000000 kB\nMemFree:        1000 kB\nMemAvailable:   20000000 kB\n");
    const uint64_t mem_total = 24000000ull * 1024, mem_avail = 20000000ull * 1024;
    kipp_ram_paths at = {.meminfo = mi, .self_cgroup = sc, .cgroup_root = dir};
    write_file(sc, "0::/kipp.slice/job\n");
    write_cgroup(dir, "/kipp.slice/job", "memory.max", "104857600\n", "memory.current", "4194304\n");
    expect_ram(&at, 104857600, 100663296, "v2, 100 MiB limit, 4 MiB charged");
    write_cgroup(dir, "/kipp.slice/job", "memory.max", "max\n", "memory.current", "4194304\n");
    expect_ram(&at, mem_total, mem_avail, "v2 max");
    write_file(sc, "12:memory:/grp\n3:cpu:/other\n0::/kipp.slice/job\n");
    write_cgroup(dir, "/memory/grp", "memory.limit_in_bytes", "62914560\n", "memory.usage_in_bytes", "70000000\n");
    expect_ram(&at, 62914560, 0, "v1 on a hybrid host, usage above the limit");
    write_cgroup(dir, "/memory/grp", "memory.limit_in_bytes", "9223372036854771712\n", "memory.usage_in_bytes",
                 "70000000\n");
    expect_ram(&at, mem_total, mem_avail, "v1 no limit (a huge page-rounded number)");
    /* no MemTotal: an error naming the file */
    uint64_t total, avail;
    char err[256] = "";
    write_file(mi, "MemFree: 1 kB\n");
    CHECK(kipp_plan_ram_at(&at, &total, &avail, err, sizeof err) == KIPP_EIO && strstr(err, mi), "%s", err);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "%s", cmd);
}

/* YaRN (docs/PLANNING.md "RoPE scaling"): the plan's limit is original x factor, from the file or an override;
 * the context is that limit when RAM is plenty, else the KV rule below it. */
static void test_yarn_context(void)
{
    char path[512], err[256] = "";
    kipp_machine mc = machine(20ull << 30);
    kipp_plan p;
    snprintf(path, sizeof path, "%s/synthetic-tiny-yarn.gguf", th_models_dir());
    kipp_model *m = NULL;
    CHECK(kipp_model_open(path, "none", NULL, &m, err, sizeof err) == 0, "open %s: %s", path, err);
    if (m && !kipp_plan_make(m, &mc, NULL, &p, err, sizeof err)) {
        CHECK(p.context_length == 64 * 4 && p.ctx == 256 && p.rope_factor == 4 && p.rope_original_context == 64,
              "limit %u ctx %u factor %g orig %u, expected 256 = 64 x 4", p.context_length, p.ctx, p.rope_factor,
              p.rope_original_context);
        CHECK(strstr(p.context_limit, "YaRN limit 64 x 4") != NULL, "context_limit '%s'", p.context_limit);
    }
    kipp_model_close(m);
    /* synthetic-tiny with yarn:64 over its 4096: 262144 tokens; 8192 B of KV each, so 1 GiB available holds
     * (1 GiB - weights) / 4 / 8192 of them, below the limit. */
    snprintf(path, sizeof path, "%s/synthetic-tiny.gguf", th_models_dir());
    kipp_model_options o = {.rope_override = 1};
    CHECK(kipp_rope_scaling_parse("yarn:64", &o.rope, err, sizeof err) == 0, "%s", err);
    m = NULL;
    CHECK(kipp_model_open(path, "none", &o, &m, err, sizeof err) == 0, "open %s yarn:64: %s", path, err);
    kipp_model_info in;
    if (m && !kipp_model_get_info(m, &in)) {
        mc = machine(1ull << 30);
        CHECK(kipp_plan_make(m, &mc, NULL, &p, err, sizeof err) == 0, "%s", err);
        uint32_t want = (uint32_t)(((1ull << 30) - in.weight_bytes) / 4 / in.kv_bytes_per_token / 32 * 32);
        CHECK(p.context_length == 262144 && p.ctx == want && want < 262144 && want > 4096,
              "limit %u ctx %u, expected 262144 and %u", p.context_length, p.ctx, want);
        CHECK(p.card_yarn_context == 0, "synthetic-tiny's card gives no YaRN, plan says %u", p.card_yarn_context);
    }
    kipp_model_close(m);
}

/* Per format and KV type, the longest context whose KV fits beside the weights: floor((RAM - weights) / KV
 * bytes per token) to 32, with the KV bytes written out here (bf16: L x 2 x 8 x 128 x 2; q8_0: 34 bytes per
 * 32 values), against kv_fit[].ram_ctx (uncapped) and max_ctx (capped at the model's context). */
static void test_fit_context_per_kv_type(void)
{
    kipp_model_info in;
    kipp_model *m = open_tiny(&in);
    if (!m) return;
    kipp_machine mc = machine(1ull << 30);
    kipp_plan p;
    char err[256] = "";
    CHECK(kipp_plan_make(m, &mc, NULL, &p, err, sizeof err) == 0, "%s", err);
    uint64_t kv[2] = {(uint64_t)in.n_layer * 2 * 8 * 128 * 2, (uint64_t)in.n_layer * 2 * 8 * 128 / 32 * 34};
    CHECK(p.kv_type_bytes[KIPP_KV_BF16] == kv[0] && p.kv_type_bytes[KIPP_KV_Q8_0] == kv[1] && kv[1] * 64 == kv[0] * 34,
          "KV bytes per token %llu and %llu, expected %llu and %llu", (unsigned long long)p.kv_type_bytes[0],
          (unsigned long long)p.kv_type_bytes[1], (unsigned long long)kv[0], (unsigned long long)kv[1]);
    for (size_t i = 0; i < p.n_formats; i++)
        for (int t = 0; t < 2; t++) {
            const kipp_plan_kv_fit *x = &p.formats[i].kv_fit[t];
            double want = floor(((double)mc.ram_available_bytes - p.formats[i].weight_bytes) / (double)kv[t] / 32) * 32;
            uint32_t capped = (uint32_t)(want < in.context_length ? want : in.context_length / 32 * 32);
            CHECK(x->ram_ctx == (uint32_t)want && x->max_ctx == capped && !strcmp(x->kv_type, kipp_kv_type_name(t)),
                  "%s with %s KV: fits %u (capped %u), expected %.0f (%u)", p.formats[i].format, x->kv_type, x->ram_ctx,
                  x->max_ctx, want, capped);
        }
    kipp_model_close(m);
}

int main(void)
{
    RUN(test_resident_when_it_fits);
    RUN(test_streamed_layers_cost_disk_time);
    RUN(test_head_over_budget_is_streamed);
    RUN(test_no_room_and_bad_arguments);
    RUN(test_embedding_not_counted_as_resident);
    RUN(test_shares_are_a_median_of_recent_runs);
    RUN(test_unreadable_results_are_named);
    RUN(test_ram_from_cgroup_files);
    RUN(test_yarn_context);
    RUN(test_fit_context_per_kv_type);
    return th_finish();
}
