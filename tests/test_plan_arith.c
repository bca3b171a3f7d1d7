/*
 * test_plan_arith.c - the planner's per-format arithmetic on a machine given
 * as numbers (issue 52 item 6): prefill from each format's own peak, batched
 * decode at B = 8 and the server's --max-batch and aggregate, each against
 * figures worked out by hand below for synthetic-tiny's shape (no
 * measurement runs, so they are exact up to rounding), and the shares taken
 * from results rows that make bench writes (plan.limit_share).
 *
 * The hand figures, synthetic-tiny: d_model 256, 2 layers, 16 query heads and
 * 8 KV heads of 128, d_ff 512, vocab 151936, tied embeddings, 8192 KV bytes
 * per token. Per token: Q|K|V 2 x 2 x (2048 + 2 x 1024) x 256 = 4194304 FLOPs;
 * O, gate|up, down 2 x 2 x (256 x 2048 + 3 x 512 x 256) = 3670016; attention
 * 2 x 4 x 2048 = 16384 per attended position; the head 2 x 151936 x 256 =
 * 77791232 per sampling row. Bytes: layers 3932160 weights (x 2 in bf16, x
 * 34/32 in q8_0, x 20/32 in affine4) + 3072 of norms; head 77791232 (BF16).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/kipp.h"
#include "tests/test_harness.h"

#define QKV 4194304.0
#define REST 3670016.0
#define ATTN 16384.0
#define HEAD 77791232.0
#define PP_ATTN (ATTN * 256.5) /* pp512: mean context (512 + 1) / 2 */
#define B8_CTX 32.5            /* kipp-bench's batch rows: 16-token prompts and 32 steps */

static const double LAYER_BYTES[3] = {2 * 3932160.0 + 3072, 3932160.0 * 34 / 32 + 3072, 3932160.0 * 20 / 32 + 3072};

static kipp_model *open_model(const char *name)
{
    char path[512], err[256] = "";
    snprintf(path, sizeof path, "%s/%s", th_models_dir(), name);
    kipp_model *m = NULL;
    CHECK(kipp_model_open(path, "none", NULL, &m, err, sizeof err) == 0, "open %s: %s", path, err);
    if (!m) return NULL;
    kipp_model_info in;
    kipp_model_get_info(m, &in);
    CHECK(in.d_model == 256 && in.n_layer == 2 && in.n_q_head == 16 && in.n_kv_head == 8 && in.head_dim == 128 &&
              in.d_ff == 512 && in.vocab_size == 151936 && in.kv_bytes_per_token == 8192,
          "%s is not the shape the hand figures are for", name);
    return m;
}

/* 10 GB/s, FP32 FMA fp32, BF16 dot bf16, int8 dot int8 (0: the level lacks it), read in mode act. */
static kipp_machine machine(double fp32, double bf16, double int8, const char *act)
{
    kipp_machine mc = {.cpu_id = "test-cpu", .isa = "avx512_bf16", .physical_cores = 2, .logical_cpus = 2,
                       .ram_total_bytes = 40ull << 30, .ram_available_bytes = 20ull << 30, .ram_read_gbps = 10,
                       .peak_gflops = fp32, .bf16_dot_gflops = bf16, .int8_dot_gops = int8, .disk_read_gbps = 1};
    snprintf(mc.bf16_act, sizeof mc.bf16_act, "%s", act);
    snprintf(mc.peaks_from, sizeof mc.peaks_from, "test");
    return mc;
}

#define NEAR(got, want, what) \
    CHECK(fabs((got) / (want) - 1) < 1e-9, "%s: %.9g, expected %.9g", what, (double)(got), (double)(want))

/* The plan of file on mc without results; formats[k] checked against a prefill time per token pre_s and a
 * per-row compute time of a batch step row_s (both by hand), at the assumed shares. */
static void expect(const char *file, const kipp_machine *mc, int k, double pre_s, double row_s, const char *arith)
{
    kipp_model *m = open_model(file);
    if (!m) return;
    kipp_plan p;
    char err[256] = "";
    CHECK(kipp_plan_make(m, mc, NULL, &p, err, sizeof err) == 0, "%s", err);
    const kipp_plan_format *f = &p.formats[k];
    NEAR(f->prefill_flops_per_token, QKV + REST + PP_ATTN + HEAD / 512, "prefill FLOPs per token");
    NEAR(f->prefill_limit_tps, 1 / pre_s, "prefill limit");
    NEAR(f->prefill_tps, 0.60 / pre_s, "prefill at the assumed 60%");
    NEAR(f->prefill_peak_gflops, (QKV + REST + PP_ATTN + HEAD / 512) / pre_s * 1e-9, "the format's peak");
    CHECK(!strcmp(f->arith, arith), "arith \"%s\", expected \"%s\"", f->arith, arith);
    double bytes = LAYER_BYTES[k] + HEAD + 8 * (4 * 256 + B8_CTX * 8192), read_s = bytes / 10e9;
    double step = read_s > 8 * row_s ? read_s : 8 * row_s;
    NEAR(f->batch_bytes_per_step, bytes, "batch8 bytes per step");
    NEAR(f->batch_flops_per_step, 8 * (QKV + REST + ATTN * B8_CTX + HEAD), "batch8 FLOPs per step");
    NEAR(f->batch_limit_tps, 8 / step, "batch8 step limit");
    NEAR(f->batch_tps, 0.60 * 8 / step, "batch8 at the assumed 60%");
    NEAR(f->batch_overhead_ms, step * (1 / 0.60 - 1) * 1e3, "batch8 overhead");
    CHECK(!strcmp(f->prefill_source, "assumed") && !strcmp(f->batch_source, "assumed"), "%s / %s", f->prefill_source,
          f->batch_source);
    kipp_model_close(m);
}

/* bf16 in each mode: mixed keeps Q|K|V on FP32 FMA and reads the rest and the head through the dot, bf16
 * reads Q|K|V through the dot too, f32 (or no dot) runs everything on FP32 FMA. */
static void test_bf16_prefill_and_batch_per_mode(void)
{
    kipp_machine mc = machine(100, 200, 400, "mixed");
    double pre = QKV / 100e9 + (REST + PP_ATTN + HEAD / 512) / 200e9; /* 82.06528 us */
    double row = QKV / 100e9 + (REST + ATTN * B8_CTX + HEAD) / 200e9; /* 451.91168 us */
    expect("synthetic-tiny.gguf", &mc, 0, pre, row, "q|k|v fp32, o/gate|up/down bf16, attention bf16, head bf16");
    NEAR(pre, 82.06528e-6, "the hand sum");
    NEAR(row, 451.91168e-6, "the hand sum");
    mc = machine(100, 200, 400, "bf16");
    pre = (QKV + REST + PP_ATTN + HEAD / 512) / 200e9;
    row = (QKV + REST + ATTN * B8_CTX + HEAD) / 200e9;
    expect("synthetic-tiny.gguf", &mc, 0, pre, row, "q|k|v bf16, o/gate|up/down bf16, attention bf16, head bf16");
    mc = machine(100, 200, 400, "f32");
    pre = (QKV + REST + PP_ATTN + HEAD / 512) / 100e9;
    row = (QKV + REST + ATTN * B8_CTX + HEAD) / 100e9;
    expect("synthetic-tiny.gguf", &mc, 0, pre, row, "q|k|v fp32, o/gate|up/down fp32, attention fp32, head fp32");
    /* no BF16 dot nor VNNI, FP32 at 50: a batch step is compute-bound (8 x 861.9 us > 8.78 ms of reads) */
    mc = machine(50, 0, 0, "f32");
    pre = (QKV + REST + PP_ATTN + HEAD / 512) / 50e9;
    row = (QKV + REST + ATTN * B8_CTX + HEAD) / 50e9;
    CHECK(8 * row > (LAYER_BYTES[0] + HEAD + 8 * (1024 + B8_CTX * 8192)) / 10e9, "this case must be compute-bound");
    expect("synthetic-tiny.gguf", &mc, 0, pre, row, "q|k|v fp32, o/gate|up/down fp32, attention fp32, head fp32");
}

/* q8_0 and affine4: the projections on the int8 dot where the level has VNNI, FP32 below it. */
static void test_quantized_prefill_and_batch(void)
{
    kipp_machine mc = machine(100, 200, 400, "mixed");
    double pre = (QKV + REST) / 400e9 + PP_ATTN / 200e9 + HEAD / 512 / 100e9; /* 42.19264 us */
    double row = (QKV + REST) / 400e9 + ATTN * B8_CTX / 200e9 + HEAD / 100e9;
    NEAR(pre, 42.19264e-6, "the hand sum");
    const char *vnni = "q|k|v int8, o/gate|up/down int8, attention bf16, head fp32";
    expect("synthetic-tiny-q8_0.gguf", &mc, 1, pre, row, vnni);
    expect("synthetic-tiny-q8_0.gguf", &mc, 2, pre, row, vnni);
    expect("synthetic-tiny-affine4_gs32.gguf", &mc, 2, pre, row, vnni); /* the file's format changes nothing */
    mc = machine(50, 0, 0, "f32");
    pre = (QKV + REST + PP_ATTN + HEAD / 512) / 50e9;
    row = (QKV + REST + ATTN * B8_CTX + HEAD) / 50e9;
    const char *fp32 = "q|k|v fp32, o/gate|up/down fp32, attention fp32, head fp32";
    expect("synthetic-tiny-q8_0.gguf", &mc, 1, pre, row, fp32);
    expect("synthetic-tiny-q8_0.gguf", &mc, 2, pre, row, fp32);
    /* a q8_0 head runs the int8 dot too, and the step reads it in q8_0 */
    kipp_model *m = open_model("synthetic-tiny-q8_0-head_q8_0.gguf");
    if (!m) return;
    mc = machine(100, 200, 400, "mixed");
    kipp_plan p;
    char err[256] = "";
    CHECK(kipp_plan_make(m, &mc, NULL, &p, err, sizeof err) == 0, "%s", err);
    pre = (QKV + REST + HEAD / 512) / 400e9 + PP_ATTN / 200e9;
    NEAR(p.formats[1].prefill_limit_tps, 1 / pre, "q8_0 head: prefill limit");
    NEAR(p.formats[1].batch_bytes_per_step, LAYER_BYTES[1] + HEAD / 2 * 34 / 32 + 8 * (1024 + B8_CTX * 8192),
         "q8_0 head: bytes per step");
    kipp_model_close(m);
}

/* The server: the smallest of 8, 16, 32, 64 streams within 10% of 64's decode rate, at a mean context of
 * 110 + 64 / 2; its aggregate is 64 tokens of every stream over all prompts' prefill plus 63 steps. */
static void test_serve_pick_and_aggregate(void)
{
    kipp_model *m = open_model("synthetic-tiny.gguf");
    if (!m) return;
    kipp_machine mc = machine(100, 200, 400, "mixed");
    kipp_plan p;
    char err[256] = "";
    CHECK(kipp_plan_make(m, &mc, NULL, &p, err, sizeof err) == 0, "%s", err);
    double row = QKV / 100e9 + (REST + ATTN * 142 + HEAD) / 200e9; /* 460.88192 us (the head on the BF16 dot) */
    double rate[4], step[4];
    for (int i = 0; i < 4; i++) {
        double n = 8 << i, rd = (LAYER_BYTES[0] + HEAD + n * (1024 + 142 * 8192)) / 10e9;
        step[i] = (rd > n * row ? rd : n * row) / 0.60;
        rate[i] = n / step[i];
    }
    /* by hand: 8 and 16 streams read-bound (9.50 ms > 3.69 ms, 10.43 ms > 7.37 ms), 32 and 64
     * compute-bound (14.75 ms > 12.30 ms, 29.50 ms > 16.02 ms): 32 runs at 64's rate */
    CHECK(rate[1] < 0.9 * rate[3] && rate[2] >= 0.9 * rate[3], "the hand case must pick 32");
    const kipp_plan_format *f = &p.formats[0];
    CHECK(f->serve_max_batch == 32, "--max-batch %u, expected 32", f->serve_max_batch);
    double pre = QKV / 100e9 + (REST + ATTN * 55.5 + HEAD / 110) / 200e9; /* a 110-token prompt's token */
    NEAR(f->serve_tps, 32 * 64 / (32 * 110 * pre / 0.60 + 63 * step[2]), "serve aggregate");
    kipp_model_close(m);
}

static void write_file(const char *path, const char *text)
{
    FILE *fp = fopen(path, "w");
    CHECK(fp && fputs(text, fp) >= 0, "cannot write %s", path);
    if (fp) fclose(fp);
}

/* Shares from results: pp512 and batch8 rows' plan.limit_share (what make bench writes), not a pp512 row's
 * older FP32/BF16 peak shares; a q8_0 file's rows that kipp-bench labelled "bf16" count as q8_0 rows of the
 * planned model by their name. */
static void test_shares_from_plan_limits(void)
{
    kipp_model *m = open_model("synthetic-tiny.gguf");
    if (!m) return;
    char dir[] = "/tmp/kipp-test-plan-arith-XXXXXX", a[600], b[600];
    CHECK(mkdtemp(dir), "mkdtemp");
    snprintf(a, sizeof a, "%s/20260101-vm-test-cpu-cpu-a.json", dir);
    snprintf(b, sizeof b, "%s/20260102-vm-test-cpu-cpu-b.json", dir);
    const char *head = "{\"schema\": \"kipp.bench.v1\", \"date\": \"%s\", \"cpu\": {\"cpu_id\": \"test-cpu\"}, "
                       "\"config\": {\"isa\": \"avx512_bf16\", \"cpu_busy_others_at_start\": 0.01}, \"results\": [%s]}";
    char text[2048];
    snprintf(text, sizeof text, head, "2026-01-01T00:00:00Z",
             "{\"name\": \"pp512\", \"model\": \"synthetic-tiny\", \"format\": \"bf16\", \"roofline_ref\": "
             "\"bf16_gflops_all\", \"roofline_share\": 0.3, \"fp32_peak_share\": 0.9},"
             "{\"name\": \"pp512\", \"model\": \"synthetic-tiny-q8_0\", \"format\": \"bf16\", \"plan\": "
             "{\"limit_share\": 0.45}},"
             "{\"name\": \"batch8\", \"model\": \"synthetic-tiny-q8_0\", \"format\": \"bf16\", \"plan\": "
             "{\"limit_share\": 0.75}}");
    write_file(a, text);
    snprintf(text, sizeof text, head, "2026-01-02T00:00:00Z",
             "{\"name\": \"pp512\", \"model\": \"synthetic-tiny\", \"format\": \"bf16\", \"plan\": "
             "{\"limit_share\": 0.55}},"
             "{\"name\": \"batch8\", \"model\": \"synthetic-tiny\", \"format\": \"bf16\", \"plan\": "
             "{\"limit_share\": 0.65}}");
    write_file(b, text);
    kipp_machine mc = machine(100, 200, 400, "mixed");
    kipp_plan p;
    char err[256] = "";
    CHECK(kipp_plan_make(m, &mc, dir, &p, err, sizeof err) == 0, "%s", err);
    const kipp_plan_format *bf = &p.formats[0], *q8 = &p.formats[1];
    CHECK(fabs(bf->prefill_eff - 0.55) < 1e-12 && strstr(bf->prefill_source, "same-model") &&
              strstr(bf->prefill_source, "cpu-b.json") && !strstr(bf->prefill_source, "cpu-a.json"),
          "bf16 prefill share %.3f from %s", bf->prefill_eff, bf->prefill_source);
    CHECK(fabs(bf->batch_eff - 0.65) < 1e-12, "bf16 batch share %.3f from %s", bf->batch_eff, bf->batch_source);
    CHECK(fabs(q8->prefill_eff - 0.45) < 1e-12 && strstr(q8->prefill_source, "same-model"), "q8_0 prefill %.3f (%s)",
          q8->prefill_eff, q8->prefill_source);
    CHECK(fabs(q8->batch_eff - 0.75) < 1e-12, "q8_0 batch share %.3f (%s)", q8->batch_eff, q8->batch_source);
    NEAR(q8->batch_tps, 0.75 * q8->batch_limit_tps, "q8_0 batch at its share");
    NEAR(bf->prefill_tps, 0.55 * bf->prefill_limit_tps, "bf16 prefill at its share");
    /* the JSON carries the batch and server figures */
    char *js = kipp_plan_json(&p);
    json_t *o = js ? json_loads(js, 0, NULL) : NULL;
    json_t *f0 = json_array_get(json_object_get(o, "formats"), 0);
    CHECK(f0 && json_real_value(json_object_get(json_object_get(f0, "batch8"), "share")) == 0.65 &&
              json_integer_value(json_object_get(json_object_get(f0, "serve"), "max_batch")) == bf->serve_max_batch &&
              json_real_value(json_object_get(json_object_get(o, "machine"), "int8_dot_gops")) == 400,
          "%s", js ? js : "(null)");
    json_decref(o);
    free(js);
    unlink(a), unlink(b);
    CHECK(rmdir(dir) == 0, "rmdir %s", dir);
    kipp_model_close(m);
}

/* The longest context per weight format and KV type: the KV of every token in all the RAM beside the
 * format's weights (kipp_plan_kv_fit), in whole 32-token blocks, capped at synthetic-tiny's 4096. At 100 MiB
 * available: bf16 weights 85658624 bytes (layers 7867392 + head 77791232, tied) leave 19198976, 2343.6
 * tokens of BF16 KV (8192 bytes each) -> 2336; of q8_0 KV (34 bytes per 32 values: 4352 bytes) 4411.5 ->
 * 4384, over the cap -> 4096. q8_0 weights (layers 4180992 + head) leave 22885376: 2784 and 5248 -> 4096. */
static void test_kv_fit_per_format_and_kv_type(void)
{
    kipp_model *m = open_model("synthetic-tiny.gguf");
    if (!m) return;
    kipp_machine mc = machine(100, 200, 400, "mixed");
    mc.ram_available_bytes = 100ull << 20;
    kipp_plan p;
    char err[256] = "";
    CHECK(kipp_plan_make(m, &mc, NULL, &p, err, sizeof err) == 0, "%s", err);
    static const struct { uint64_t free_bytes; uint32_t max_ctx[2], ram_ctx[2]; } want[2] = {
        {104857600 - 85658624, {2336, 4096}, {2336, 4384}}, {104857600 - 81972224, {2784, 4096}, {2784, 5248}}};
    static const double kv[2] = {8192, 4352};
    for (int f = 0; f < 2; f++)
        for (int k = 0; k < KIPP_PLAN_KV_TYPES; k++) {
            const kipp_plan_kv_fit *x = &p.formats[f].kv_fit[k];
            CHECK(!strcmp(x->kv_type, k ? "q8_0" : "bf16") && x->kv_bytes_per_token == kv[k] &&
                      x->free_bytes == want[f].free_bytes && x->max_ctx == want[f].max_ctx[k] &&
                      x->ram_ctx == want[f].ram_ctx[k],
                  "%s weights, %s KV: %.0f bytes per token, %llu free, max %u (RAM %u); expected %.0f, %llu, %u (%u)",
                  p.formats[f].format, x->kv_type, x->kv_bytes_per_token, (unsigned long long)x->free_bytes,
                  x->max_ctx, x->ram_ctx, kv[k], (unsigned long long)want[f].free_bytes, want[f].max_ctx[k],
                  want[f].ram_ctx[k]);
        }
    mc.ram_available_bytes = 80ull << 20; /* below the bf16 weights: nothing left, no context */
    CHECK(kipp_plan_make(m, &mc, NULL, &p, err, sizeof err) == 0, "%s", err);
    CHECK(p.formats[0].kv_fit[0].free_bytes == 0 && p.formats[0].kv_fit[0].max_ctx == 0 &&
              p.formats[0].kv_fit[1].max_ctx == 0, "bf16 weights over the RAM: %u", p.formats[0].kv_fit[0].max_ctx);
    kipp_model_close(m);
}

int main(void)
{
    RUN(test_kv_fit_per_format_and_kv_type);
    RUN(test_bf16_prefill_and_batch_per_mode);
    RUN(test_quantized_prefill_and_batch);
    RUN(test_serve_pick_and_aggregate);
    RUN(test_shares_from_plan_limits);
    return th_finish();
}
