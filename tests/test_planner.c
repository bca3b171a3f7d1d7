/*
 * test_planner.c - kipp_plan_make's arithmetic on a machine given as numbers
 * (seed 002 "Planner"): residency and streaming, the context, and the predicted
 * rates with and without streamed layers. The oracle is the README's rule
 * written out here from the model's dimensions (kipp_model_get_info), not the
 * planner's code; no measurement runs, so the figures are exact.
 */
#include <jansson.h>
#include <string.h>

#include "engine/kipp.h"
#include "tests/test_harness.h"

static kipp_model *open_tiny(void)
{
    char path[512], err[256] = "";
    snprintf(path, sizeof path, "%s/synthetic-tiny.gguf", th_models_dir());
    kipp_model *m = NULL;
    int rc = kipp_model_open(path, "none", NULL, &m, err, sizeof err);
    CHECK(rc == 0, "open %s: %s", path, err);
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

static kipp_machine machine(uint64_t avail)
{
    return (kipp_machine){.cpu_id = "test-cpu", .isa = "avx2", .physical_cores = 2, .logical_cpus = 4,
                          .ram_total_bytes = avail * 2, .ram_available_bytes = avail, .ram_read_gbps = 10,
                          .peak_gflops = 100, .disk_read_gbps = 1, .disk_sample_bytes = 1 << 20};
}

static void test_resident_when_it_fits(void)
{
    kipp_model *m = open_tiny();
    if (!m) return;
    kipp_model_info in;
    kipp_model_get_info(m, &in);
    double layer, head, ppl;
    sizes(&in, &layer, &head, &ppl);
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
    want = 100e9 * 0.50 / flops;
    CHECK(fabs(f->prefill_tps / want - 1) < 1e-9, "prefill %.3f, expected %.3f", f->prefill_tps, want);
    CHECK(!strcmp(f->decode_source, "assumed") && !strcmp(f->prefill_source, "assumed"), "%s", f->decode_source);
    kipp_model_close(m);
}

static void test_streamed_layers_cost_disk_time(void)
{
    kipp_model *m = open_tiny();
    if (!m) return;
    kipp_model_info in;
    kipp_model_get_info(m, &in);
    double layer, head, ppl;
    sizes(&in, &layer, &head, &ppl);
    /* 0.75 x available holds the head and exactly one layer */
    uint64_t avail = (uint64_t)((head + 1.5 * layer) / 0.75);
    kipp_machine mc = machine(avail);
    kipp_plan p;
    char err[256] = "";
    CHECK(kipp_plan_make(m, &mc, NULL, &p, err, sizeof err) == 0, "%s", err);
    CHECK(p.streamed && p.layers_resident == 1 && p.layers_streamed == in.n_layer - 1, "streamed %d resident %u",
          p.streamed, p.layers_resident);
    uint64_t resident = (uint64_t)(head + layer);
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

static void test_no_room_and_bad_arguments(void)
{
    kipp_model *m = open_tiny();
    if (!m) return;
    kipp_machine mc = machine(1 << 20); /* 1 MiB: nothing fits */
    kipp_plan p;
    char err[256] = "";
    CHECK(kipp_plan_make(m, &mc, NULL, &p, err, sizeof err) == 0, "%s", err);
    CHECK(p.streamed && p.layers_resident == 0 && p.ctx == 0, "resident %u ctx %u", p.layers_resident, p.ctx);
    CHECK(kipp_plan_make(NULL, &mc, NULL, &p, err, sizeof err) == KIPP_EINVAL && strstr(err, "NULL"), "%s", err);
    kipp_model_close(m);
}

int main(void)
{
    RUN(test_resident_when_it_fits);
    RUN(test_streamed_layers_cost_disk_time);
    RUN(test_no_room_and_bad_arguments);
    return th_finish();
}
