/*
 * bench_model.c - `kipp-bench`: model benchmarks pp512, tg128 and tg at a 4k
 * context, and batched decode,
 * through the public engine API.
 *
 *   kipp-bench --model models/synthetic-0.6b.gguf [--model ...] [--backend cpu]
 *              [--bench pp512,tg128,tg4k,pp4096,batch1,batch2,batch4,batch8,
 *                       batch16,batch32,pp8x128,pplong,tglong] [--long-ctx N]
 *              [--reps N] [--warmup N] [--threads N]
 *              [--profiles DIR] [--out DIR]
 *              [--draft-model FILE [--draft-max N] [--draft-min N]]  (the tg128_draft row, bench_draft.c)
 * (the machine profile comes from `make profile`, build/bin/kipp_profile)
 *
 * Each benchmark warms up, then times N repetitions of only the measured part
 * (prefill of 512 tokens; 128 decode steps after a 16-token prompt; 32 decode
 * steps after a 4096-token KV fill; batchB: 32 steps of B sessions decoding
 * one token each in one kipp_eval_batch per step, after a 16-token prompt
 * each; pp8x128: 8 prompts of 128 tokens in one kipp_eval_batch; the batched
 * rows live in bench_batch.c; pplong and tglong, a prefill of --long-ctx
 * tokens and decode after them, only when named: bench_long.c) with the monotonic clock, and reports
 * median/min/max tok/s, ms/token, effective GB/s (weight + KV bytes actually
 * read per token / time), GFLOP/s and the share of the roofline, next to the
 * targets (bench/README.md): prefill's from the machine profile's compute peak, decode's
 * from read probes run beside each rep (read_probe.h). Decode tokens are fixed
 * pseudo-random ids (as llama-bench), not sampled, so runs are comparable.
 * Results go to <out>/<YYYYMMDD>-<host>-<backend>-<sha>.json (kipp.bench.v1,
 * bench/README.md); results of the same (name, model) already in that file
 * are replaced, others kept, so models may be benchmarked one at a time.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/cpu/kernels.h"
#include "bench/bench_harness.h"
#include "bench/bench_model.h"
#include "bench/read_probe.h"
#include "engine/kipp.h"
#include "base/safe_io.h"

#ifdef KIPP_HAVE_PAPI
#include <papi.h>
#endif

#define LONG_CTX 4096u  /* KV positions before tg4k */
#define LONG_STEPS 32u  /* decode steps timed at the long context */

/* Targets as shares of the roofline (bench/README.md). */
#define TARGET_DECODE 0.95
#define TARGET_LONG 0.90
/* Target: filling a 4k context runs at >= 70% of the pp512 token rate. */
#define TARGET_PP4096_VS_PP512 0.70
#define PP4096_REPS_MAX 2 /* one rep is a 4096-token prefill: long enough to need no warmup */

/* A model's bytes and FLOPs from its dimensions (BF16 bytes; real_bytes then
 * puts the file's own bytes in their place). */
static void cost_of(const kipp_model_info *in, model_cost *c)
{
    double D = in->d_model, A = (double)in->n_q_head * in->head_dim, KV = (double)in->n_kv_head * in->head_dim;
    double F = in->d_ff, L = in->n_layer;
    c->info = *in;
    c->layer_params = L * ((A + 2 * KV) * D + D * A + 3 * F * D);
    c->layer_weight_bytes = 2 * (c->layer_params + L * (2 * D + 2 * in->head_dim));
    c->head_params = (double)in->vocab_size * D;
    c->head_bytes = 2.0 * c->head_params;
    c->kv_bytes_per_pos = (double)in->kv_bytes_per_token; /* L x 2 x KV x 2 in bf16, x 34/64 in q8_0 (--kv-type) */
    c->attn_flops_per_pos = L * 4 * A;
}

/* Replace the BF16 estimates by the file's real tensor bytes, so quantized
 * files (q8_0, affine4_gs32) report effective bandwidth on the bytes a token
 * really reads: every blk.* tensor, and the head: output.weight where the file
 * has one (untied, or a tied checkpoint's --quant-head, which the engine reads
 * in place of token_embd: engine/model.c), else the tied token_embd. */
static void real_bytes(const kipp_model *m, const kipp_model_info *in, model_cost *c)
{
    double layers = 0, head = 0, embd = 0;
    for (uint64_t i = 0; i < in->n_tensors; i++) {
        kipp_tensor_info t;
        if (kipp_model_tensor(m, i, &t)) continue;
        if (t.name_len > 4 && !strncmp(t.name, "blk.", 4)) layers += (double)t.nbytes;
        else if (t.name_len == 13 && !strncmp(t.name, "output.weight", 13)) head = (double)t.nbytes;
        else if (t.name_len == 17 && !strncmp(t.name, "token_embd.weight", 17)) embd = (double)t.nbytes;
    }
    c->layer_weight_bytes = layers;
    c->head_bytes = head > 0 ? head : embd;
}

/* Bytes one decode step reads at context ctx: all weights, one embedding row,
 * the final norm and the KV of ctx positions. */
static double decode_bytes(const model_cost *c, double ctx)
{
    return c->layer_weight_bytes + c->head_bytes + 4.0 * c->info.d_model + ctx * c->kv_bytes_per_pos;
}

/* Fixed pseudo-random token ids (LCG), below vocab. */
void fill_tokens(uint32_t *ids, size_t n, uint32_t vocab, uint32_t seed)
{
    uint64_t s = 0x9e3779b97f4a7c15ull ^ seed;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (uint32_t)((s >> 33) % vocab);
    }
}

/* ---- PAPI on the calling thread (worker 0), when available ---- */
typedef struct {
    int es;
    long long v[2];
} papi_ctr;

static void papi_start(papi_ctr *p)
{
    p->es = -1;
#ifdef KIPP_HAVE_PAPI
    if (!kipp_papi_available(NULL)) return;
    int es = PAPI_NULL;
    if (PAPI_create_eventset(&es) != PAPI_OK) return;
    if (PAPI_add_event(es, PAPI_TOT_CYC) != PAPI_OK || PAPI_add_event(es, PAPI_TOT_INS) != PAPI_OK ||
        PAPI_start(es) != PAPI_OK) {
        PAPI_cleanup_eventset(es);
        PAPI_destroy_eventset(&es);
        return;
    }
    p->es = es;
#endif
}

static void papi_stop(papi_ctr *p, double *cycles, double *instr)
{
    *cycles = *instr = -1;
    (void)p; /* unused without PAPI */
#ifdef KIPP_HAVE_PAPI
    if (p->es < 0) return;
    if (PAPI_stop(p->es, p->v) == PAPI_OK) {
        *cycles = (double)p->v[0];
        *instr = (double)p->v[1];
    }
    PAPI_cleanup_eventset(p->es);
    PAPI_destroy_eventset(&p->es);
#endif
}

static int run_once(const bench_case *bc, double *sec, char *err, size_t errlen)
{
    if (bc->n_seq) return run_batch_once(bc, sec, err, errlen);
    int rc = kipp_session_truncate(bc->s, bc->prefix, err, errlen);
    if (rc) return rc;
    double t0 = kipp_timer_now();
    if (bc->n_prompt) rc = kipp_session_eval(bc->s, bc->ids + bc->prefix, bc->n_prompt, bc->logits, err, errlen);
    for (uint32_t i = 0; i < bc->steps && !rc; i++)
        rc = kipp_session_eval(bc->s, bc->ids + bc->prefix + i, 1, bc->logits, err, errlen);
    *sec = kipp_timer_now() - t0;
    return rc;
}

/* Warm-up, then reps timed runs; st in seconds per run, and sec[i] the
 * seconds of rep i in the order run. With probe non-NULL (decode rows) the
 * read bandwidth is probed before each timed rep and after the last, so
 * probe[i] and probe[i + 1] bracket rep i (0 = that probe failed). PAPI spans
 * the timed runs only, never a probe. */
int measure(const bench_case *bc, int warmup, int reps, double *probe, double *sec, kipp_bench_stats *st,
                   char *err, size_t errlen)
{
    double t[REPS_MAX], cyc = 0, ins = 0, c, n, s;
    if (reps > REPS_MAX) reps = REPS_MAX;
    for (int i = 0; i < warmup; i++)
        if (run_once(bc, &s, err, errlen)) return -1;
    for (int i = 0; i < reps; i++) {
        if (probe) probe[i] = kipp_read_probe(i == 0 ? "before the row" : "between two reps");
        papi_ctr pc;
        papi_start(&pc);
        if (run_once(bc, &t[i], err, errlen)) return -1;
        papi_stop(&pc, &c, &n);
        cyc = cyc < 0 || c < 0 ? -1 : cyc + c;
        ins = ins < 0 || n < 0 ? -1 : ins + n;
        sec[i] = t[i];
    }
    if (probe) probe[reps] = kipp_read_probe("after the row");
    st->cycles = cyc < 0 ? -1 : cyc / reps;
    st->instructions = ins < 0 ? -1 : ins / reps;
    st->reps = reps;
    st->median = kipp_median(t, (size_t)reps);
    st->min = t[0];
    st->max = t[reps - 1];
    return 0;
}

/* A decode row: measure() with a read probe beside every rep (bm->probe). */
int measure_decode(const bench_case *bc, const options *o, bench_meta *bm, kipp_bench_stats *st, char *err,
                          size_t errlen)
{
    bm->probed = 1;
    return measure(bc, o->warmup, o->reps, bm->probe, bm->sec, st, err, errlen);
}

static double max2(double a, double b) { return a > b ? a : b; }

/* Median of v[n], 1 <= n <= REPS_MAX; v is left as it is. */
static double median_of(const double *v, int n)
{
    double s[REPS_MAX];
    memcpy(s, v, (size_t)n * sizeof s[0]);
    return kipp_median(s, (size_t)n);
}

/* A decode row's read share per rep: rep i's GB/s over the faster of the
 * probes before and after it (probe[i], probe[i + 1]): the read bandwidth
 * measured in the same run, since a shared VM's memory speed drifts within
 * seconds. Reps whose probes both failed are left out. Writes
 * share[k] in rep order, *roof = the median of those probes, and the probes
 * and shares (null where failed) into r; returns k (0: no share). */
static int decode_share(const bench_meta *bm, int reps, json_t *r, double *share, double *roof)
{
    double p[REPS_MAX];
    json_t *probes = json_array(), *shares = json_array();
    int k = 0;
    for (int i = 0; i < reps; i++) {
        double rp = max2(bm->probe[i], bm->probe[i + 1]);
        if (rp > 0) p[k] = rp, share[k] = bm->bytes_per_token * bm->tokens / bm->sec[i] / 1e9 / rp;
        json_array_append_new(shares, rp > 0 ? json_real(share[k++]) : json_null());
    }
    for (int i = 0; i <= reps; i++)
        json_array_append_new(probes, bm->probe[i] > 0 ? json_real(bm->probe[i]) : json_null());
    json_object_set_new(r, "read_gbps_probes", probes);
    json_object_set_new(r, "rep_read_shares", shares);
    json_object_set_new(r, "read_gbps_before", bm->probe[0] > 0 ? json_real(bm->probe[0]) : json_null());
    json_object_set_new(r, "read_gbps_after", bm->probe[reps] > 0 ? json_real(bm->probe[reps]) : json_null());
    if (k) *roof = median_of(p, k);
    return k;
}

json_t *result_json(const char *model_id, const bench_meta *bm, const kipp_bench_stats *st,
                           const kipp_profile *prof, const bf16_run *act)
{
    double tps_med = bm->tokens / st->median, tps_min = bm->tokens / st->max, tps_max = bm->tokens / st->min;
    json_t *r = json_object();
    json_object_set_new(r, "name", json_string(bm->name));
    json_object_set_new(r, "model", json_string(model_id));
    json_object_set_new(r, "format", json_string("bf16"));
    json_object_set_new(r, "unit", json_string("tok/s"));
    json_object_set_new(r, "median", json_real(tps_med));
    json_object_set_new(r, "min", json_real(tps_min));
    json_object_set_new(r, "max", json_real(tps_max));
    json_object_set_new(r, "reps", json_integer(st->reps));
    json_object_set_new(r, "tokens_per_rep", json_real(bm->tokens));
    json_t *secs = json_array();
    for (int i = 0; i < st->reps; i++) json_array_append_new(secs, json_real(bm->sec[i]));
    json_object_set_new(r, "rep_seconds", secs);
    json_object_set_new(r, "ms_per_token", json_real(1e3 / tps_med));
    json_object_set_new(r, "context_mean", json_real(bm->context));
    double gbps = bm->bytes_per_token * tps_med / 1e9, gflops = bm->flops_per_token * tps_med / 1e9;
    json_object_set_new(r, "bytes_per_token", json_real(bm->bytes_per_token));
    json_object_set_new(r, "flops_per_token", json_real(bm->flops_per_token));
    json_object_set_new(r, "gbps_effective", json_real(gbps));
    json_object_set_new(r, "gflops", json_real(gflops));
    json_object_set_new(r, "bound", json_string(bm->compute_bound ? "compute" : "memory"));
    /* Prefill's roofline is the peak of the instruction it runs: the BF16 dot
     * where the backend reads projections through it (KIPP_BF16_ACT mixed or
     * bf16: the BF16 dot where the CPU has one; in mixed
     * mode Q|K|V, attention and the head still run FP32 FMA, so that share is
     * strict), else the FP32 FMA peak. The other peak's share is recorded
     * beside it. */
    int dot = bm->compute_bound && prof->loaded && prof->bf16_gflops_all > 0 && act->dot;
    json_object_set_new(r, "bf16_act", json_string(act->mode));
    const char *roof_key = bm->compute_bound ? (dot ? "bf16_gflops_all" : "fp32_gflops_all") : "read_gbps_all";
    /* All cores can read at least as fast as one; an all-core figure below
     * the one-core figure means the profile run was disturbed (shared
     * machine), so the profile's read roofline is the larger of the two. */
    double read_roof = prof->read_gbps_all > prof->read_gbps_1t ? prof->read_gbps_all : prof->read_gbps_1t;
    if (!bm->compute_bound && prof->read_gbps_all < prof->read_gbps_1t) roof_key = "read_gbps_1t";
    double roof = !prof->loaded ? 0 : bm->compute_bound ? (dot ? prof->bf16_gflops_all : prof->fp32_gflops_all) : read_roof;
    double rep_share[REPS_MAX];
    int n_shared = bm->probed ? decode_share(bm, st->reps, r, rep_share, &roof) : 0;
    if (n_shared) {
        json_object_set_new(r, "profile_read_share", read_roof > 0 ? json_real(gbps / read_roof) : json_null());
        roof_key = "read_gbps_adjacent";
    }
    double share = n_shared ? median_of(rep_share, n_shared)
                   : roof > 0 ? (bm->compute_bound ? gflops : gbps) / roof : -1;
    json_object_set_new(r, "roofline_ref", json_string(roof_key));
    json_object_set_new(r, "roofline", roof > 0 ? json_real(roof) : json_null());
    json_object_set_new(r, "roofline_share", share >= 0 ? json_real(share) : json_null());
    if (bm->compute_bound && prof->loaded && prof->bf16_gflops_all > 0)
        json_object_set_new(r, dot ? "fp32_peak_share" : "bf16_peak_share",
                            json_real(gflops / (dot ? prof->fp32_gflops_all : prof->bf16_gflops_all)));
    json_object_set_new(r, "target_share", json_real(bm->target));
    json_object_set_new(r, "target_ratio", share >= 0 ? json_real(share / bm->target) : json_null());
    json_object_set_new(r, "target_met", share >= 0 ? json_boolean(share >= bm->target) : json_null());
    json_t *papi = json_object();
    json_object_set_new(papi, "cycles_per_rep_thread0", st->cycles >= 0 ? json_real(st->cycles) : json_null());
    json_object_set_new(papi, "instructions_per_rep_thread0", st->instructions >= 0 ? json_real(st->instructions) : json_null());
    json_object_set_new(r, "papi", papi);
    printf("  %-6s %-16s %9.2f tok/s (min %.2f max %.2f, %d reps) %8.2f ms/tok %7.2f GB/s %8.1f GFLOP/s\n",
           bm->name, model_id, tps_med, tps_min, tps_max, st->reps, 1e3 / tps_med, gbps, gflops);
    if (n_shared) {
        char tail[64] = "no profile";
        if (read_roof > 0) snprintf(tail, sizeof tail, "%.1f%% of the profile's", 100 * gbps / read_roof);
        printf("         %.1f%% of %s %.1f GB/s (median of %d reps, each against the faster probe beside it;"
               " target %.0f%%: %s); %s\n         probes",
               100 * share, roof_key, roof, n_shared, 100 * bm->target, share >= bm->target ? "met" : "not met", tail);
        for (int i = 0; i <= st->reps; i++) printf(" %.1f", bm->probe[i]);
        printf(" GB/s (0 = failed); rep shares");
        for (int i = 0; i < n_shared; i++) printf(" %.1f%%", 100 * rep_share[i]);
        putchar('\n');
    } else if (share >= 0) {
        printf("         %.1f%% of %s (target %.0f%%: %s)%s\n", 100 * share, roof_key, 100 * bm->target,
               share >= bm->target ? "met" : "not met",
               bm->compute_bound ? "" : "; every read probe failed, so the share is against the profile");
    } else
        printf("         no profile%s: roofline share not computed\n",
               bm->compute_bound ? "" : " and every read probe failed");
    fflush(stdout);
    return r;
}

/* The benchmarks --bench may name, in the order they run. */
static const char *const BENCH_NAMES[] = {"pp512", "tg128", "tg4k", "pp4096", "batch1", "batch2", "batch4",
                                           "batch8", "batch16", "batch32", "pp8x128", "pplong", "tglong"};
#define N_BENCH_NAMES (sizeof BENCH_NAMES / sizeof BENCH_NAMES[0])
#define N_DEFAULT_BENCH (N_BENCH_NAMES - 2) /* without --bench: all but pplong and tglong (minutes each) */

int wants(const options *o, const char *name)
{
    for (size_t i = 0; i < N_BENCH_NAMES; i++)
        if (!strcmp(name, BENCH_NAMES[i])) return (o->benches >> i) & 1u;
    return 0;
}

/* "--bench a,b": each comma-separated name must be one of BENCH_NAMES exactly;
 * an unknown or empty one is named with the list of known ones. Names are
 * added to *mask, so repeated --bench flags add up. */
static int parse_benches(const char *v, unsigned *mask)
{
    for (const char *p = v;;) {
        size_t n = strcspn(p, ","), i;
        for (i = 0; i < N_BENCH_NAMES; i++)
            if (strlen(BENCH_NAMES[i]) == n && !strncmp(p, BENCH_NAMES[i], n)) break;
        if (i == N_BENCH_NAMES) {
            fprintf(stderr, "kipp-bench: --bench '%s': unknown benchmark '%.*s'; expected a comma-separated list of",
                    v, (int)n, p);
            for (i = 0; i < N_BENCH_NAMES; i++) fprintf(stderr, "%s %s", i ? "," : "", BENCH_NAMES[i]);
            fputc('\n', stderr);
            return -1;
        }
        *mask |= 1u << i;
        if (!p[n]) return 0;
        p += n + 1;
    }
}

/* Model id from the path: basename without ".gguf" (matches the registry id
 * for files made by tools/bench_models.py). */
static void model_id_of(const char *path, char *id, size_t n)
{
    const char *b = strrchr(path, '/');
    snprintf(id, n, "%s", b ? b + 1 : path);
    char *dot = strstr(id, ".gguf");
    if (dot) *dot = '\0';
}

/* pp4096: a 4096-token prefill from an empty cache (filling a long context),
 * held to the compute roofline like pp512 and to >= 70% of pp512's token
 * rate from the same run (recorded as vs_pp512 when pp512 ran). */
static int pp4096(const options *o, kipp_session *s, const uint32_t *ids, const model_cost *c, const kipp_profile *prof, const bf16_run *act,
                  const char *id, double pp512_tps, json_t *results, char *err, size_t errlen)
{
    kipp_bench_stats st;
    float *logits = malloc((size_t)c->info.vocab_size * sizeof *logits);
    if (!logits) { snprintf(err, errlen, "out of memory for the logits row"); return -1; }
    int rc = kipp_session_truncate(s, 0, err, errlen);
    bench_case bc = {.s = s, .ids = ids, .prefix = 0, .n_prompt = LONG_CTX, .steps = 0, .logits = logits};
    bench_meta bm = {.name = "pp4096", .tokens = LONG_CTX, .context = (LONG_CTX + 1) / 2.0, .compute_bound = 1, .target = TARGET_PREFILL};
    bm.flops_per_token = 2 * c->layer_params + c->attn_flops_per_pos * bm.context + 2 * c->head_params / LONG_CTX;
    bm.bytes_per_token = (c->layer_weight_bytes + c->head_bytes) / LONG_CTX;
    if (!rc) rc = measure(&bc, 0, o->reps < PP4096_REPS_MAX ? o->reps : PP4096_REPS_MAX, NULL, bm.sec, &st, err, errlen);
    free(logits);
    if (rc) return rc;
    json_t *r = result_json(id, &bm, &st, prof, act);
    if (pp512_tps > 0) {
        double ratio = bm.tokens / st.median / pp512_tps;
        json_object_set_new(r, "vs_pp512", json_real(ratio));
        json_object_set_new(r, "target_vs_pp512", json_real(TARGET_PP4096_VS_PP512));
        json_object_set_new(r, "target_vs_pp512_met", json_boolean(ratio >= TARGET_PP4096_VS_PP512));
        printf("         %.2fx the pp512 token rate (target %.2fx: %s)\n", ratio, TARGET_PP4096_VS_PP512,
               ratio >= TARGET_PP4096_VS_PP512 ? "met" : "not met");
    }
    json_array_append_new(results, r);
    return 0;
}

/* Peak resident set (VmHWM) of this process in bytes, -1 when unreadable;
 * reset_peak_rss() restarts it (Linux >= 4.0: "5" > /proc/self/clear_refs),
 * so each model's figure covers its own load and runs. */
static double peak_rss(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = atof(line + 6);
    if (f) fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

static void reset_peak_rss(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) { fputs("5", f); fclose(f); }
}

/* Peak resident memory of loading the model (mapping,
 * packing, scratch: target <= 1.1x the GGUF) and of the whole run (plus the
 * session's KV cache, kv_bytes), on every result of the model. */
static void add_memory(json_t *results, size_t first, const char *path, double load_peak, double peak, double kv_bytes,
                       const kipp_model_info *info)
{
    struct stat st;
    double file = stat(path, &st) == 0 ? (double)st.st_size : -1;
    int ok = load_peak > 0 && file > 0;
    for (size_t i = first; i < json_array_size(results); i++) {
        json_t *r = json_array_get(results, i);
        json_object_set_new(r, "gguf_bytes", file > 0 ? json_real(file) : json_null());
        json_object_set_new(r, "load_peak_rss_bytes", load_peak > 0 ? json_real(load_peak) : json_null());
        json_object_set_new(r, "load_peak_rss_vs_gguf", ok ? json_real(load_peak / file) : json_null());
        json_object_set_new(r, "peak_rss_bytes", peak > 0 ? json_real(peak) : json_null());
        json_object_set_new(r, "kv_cache_bytes", json_real(kv_bytes));
        json_object_set_new(r, "kv_type", json_string(info->kv_type));
        json_object_set_new(r, "kv_bytes_per_token", json_integer((json_int_t)info->kv_bytes_per_token));
    }
    if (ok)
        printf("  memory: load peak RSS %.2f GB = %.2fx the GGUF (%.2f GB; target <= 1.10x: %s); run peak %.2f GB "
               "with a %.2f GB KV cache\n", load_peak / 1e9, load_peak / file, file / 1e9,
               load_peak / file <= 1.10 ? "met" : "not met", peak / 1e9, kv_bytes / 1e9);
}

/* The cpu backend's KIPP_BF16_ACT mode and whether any projection ran
 * through the BF16 dot, read from its describe line ("projections read as
 * (KIPP_BF16_ACT=mixed): q|k|v bf16/f32, o bf16dot/bf16, ..."), so a result
 * records what ran rather than what the environment asked. mode "-" and dot 0
 * for a backend without that line (ref). */
static void bf16_act_of(const kipp_model *m, bf16_run *r)
{
    static char desc[16384];
    snprintf(r->mode, sizeof r->mode, "-");
    r->dot = 0;
    if (kipp_model_describe(m, desc, sizeof desc) != 0) return;
    const char *p = strstr(desc, "(KIPP_BF16_ACT=");
    if (!p) return;
    p += strlen("(KIPP_BF16_ACT=");
    size_t n = strcspn(p, ")");
    if (n > 0 && n < sizeof r->mode) snprintf(r->mode, sizeof r->mode, "%.*s", (int)n, p);
    const char *eol = strchr(p, '\n'), *d = strstr(p, " bf16dot/");
    r->dot = d && (!eol || d < eol);
}

/* Run the chosen benchmarks on one model; appends results to `results`. */
static int bench_model(const options *o, const char *path, const kipp_profile *prof, json_t *results, char *err, size_t errlen)
{
    kipp_model *m = NULL;
    kipp_session *s = NULL;
    kipp_model_options mo = {.n_threads = o->threads, .lora = o->lora, .n_lora = o->n_lora,
                             .rope_override = o->rope_override, .rope = o->rope, .kv_type = o->kv_type};
    char id[256];
    model_id_of(path, id, sizeof id);
    double t0 = kipp_timer_now();
    size_t first = json_array_size(results);
    reset_peak_rss();
    kipp_mapped_file_guard(path);
    int rc = kipp_model_open(path, o->backend, &mo, &m, err, errlen);
    if (rc) return rc;
    printf("%s: opened with backend %s in %.1f s\n", id, o->backend, kipp_timer_now() - t0);
    kipp_model_info ri;
    kipp_model_get_info(m, &ri);
    if (ri.rope.yarn)
        printf("%s: YaRN RoPE scaling %g x %u: context %u tokens\n", id, ri.rope.factor, ri.rope.original_context,
               ri.context_length);
    double load_peak = peak_rss();
    bf16_run act;
    bf16_act_of(m, &act);
    kipp_model_info info;
    kipp_model_get_info(m, &info);
    model_cost c;
    cost_of(&info, &c);
    real_bytes(m, &info, &c);
    uint32_t cap = LONG_CTX + LONG_STEPS + 32;
    if (cap > info.context_length) cap = info.context_length;
    /* tg4k and pp4096 need a long context: named with --bench and not possible, the
     * model is refused before anything runs; in the default set they are skipped
     * with a note (they used to be skipped silently either way). */
    static const struct { const char *name; uint32_t need; } LONG[] = {{"tg4k", LONG_CTX + LONG_STEPS},
                                                                       {"pp4096", LONG_CTX}};
    for (size_t i = 0; i < sizeof LONG / sizeof LONG[0]; i++)
        if (wants(o, LONG[i].name) && info.context_length < LONG[i].need) {
            if (o->bench_given) {
                snprintf(err, errlen, "%s needs a context of %u positions; %s has a context length of %u",
                         LONG[i].name, LONG[i].need, id, info.context_length);
                kipp_model_close(m);
                return -1;
            }
            fprintf(stderr, "kipp-bench: %s: %s skipped: it needs a context of %u positions, the model has %u\n", id,
                    LONG[i].name, LONG[i].need, info.context_length);
        }
    uint32_t *ids = malloc(cap * sizeof *ids);
    float *logits = malloc((size_t)info.vocab_size * sizeof *logits);
    if (!ids || !logits) { rc = -1; snprintf(err, errlen, "out of memory for %u token ids", cap); goto out; }
    fill_tokens(ids, cap, info.vocab_size, 42);
    rc = kipp_session_create(m, cap, &s, err, errlen);
    if (rc) goto out;
    kipp_bench_stats st;
    double pp512_tps = 0;
    if (wants(o, "pp512")) {
        bench_case bc = {.s = s, .ids = ids, .prefix = 0, .n_prompt = 512, .steps = 0, .logits = logits};
        bench_meta bm = {.name = "pp512", .tokens = 512, .context = 256.5, .compute_bound = 1, .target = TARGET_PREFILL};
        bm.flops_per_token = 2 * c.layer_params + c.attn_flops_per_pos * bm.context + 2 * c.head_params / 512;
        bm.bytes_per_token = (c.layer_weight_bytes + c.head_bytes) / 512;
        if ((rc = measure(&bc, o->warmup, o->reps, NULL, bm.sec, &st, err, errlen))) goto out;
        json_array_append_new(results, result_json(id, &bm, &st, prof, &act));
        pp512_tps = bm.tokens / st.median;
    }
    if (wants(o, "tg128")) {
        rc = kipp_session_truncate(s, 0, err, errlen);
        if (!rc) rc = kipp_session_eval(s, ids, TG_PROMPT, logits, err, errlen);
        if (rc) goto out;
        bench_case bc = {.s = s, .ids = ids, .prefix = TG_PROMPT, .n_prompt = 0, .steps = 128, .logits = logits};
        bench_meta bm = {.name = "tg128", .tokens = 128, .context = TG_PROMPT + 64.5, .compute_bound = 0, .target = TARGET_DECODE};
        bm.bytes_per_token = decode_bytes(&c, bm.context);
        bm.flops_per_token = 2 * c.layer_params + 2 * c.head_params + c.attn_flops_per_pos * bm.context;
        if ((rc = measure_decode(&bc, o, &bm, &st, err, errlen))) goto out;
        json_array_append_new(results, result_json(id, &bm, &st, prof, &act));
    }
    if (wants(o, "tg4k") && cap >= LONG_CTX + LONG_STEPS) {
        t0 = kipp_timer_now();
        rc = kipp_session_truncate(s, 0, err, errlen);
        if (!rc) rc = kipp_session_eval(s, ids, LONG_CTX, logits, err, errlen);
        if (rc) goto out;
        printf("  (KV filled with %u tokens in %.1f s)\n", LONG_CTX, kipp_timer_now() - t0);
        bench_case bc = {.s = s, .ids = ids, .prefix = LONG_CTX, .n_prompt = 0, .steps = LONG_STEPS, .logits = logits};
        bench_meta bm = {.name = "tg4k", .tokens = LONG_STEPS, .context = LONG_CTX + (LONG_STEPS + 1) / 2.0, .compute_bound = 0, .target = TARGET_LONG};
        bm.bytes_per_token = decode_bytes(&c, bm.context);
        bm.flops_per_token = 2 * c.layer_params + 2 * c.head_params + c.attn_flops_per_pos * bm.context;
        if ((rc = measure_decode(&bc, o, &bm, &st, err, errlen))) goto out;
        json_array_append_new(results, result_json(id, &bm, &st, prof, &act));
    }
    if (wants(o, "pp4096") && cap >= LONG_CTX) {
        rc = pp4096(o, s, ids, &c, prof, &act, id, pp512_tps, results, err, errlen);
        if (rc) goto out;
    }
    if ((rc = batch_rows(o, m, &c, prof, &act, id, results, err, errlen))) goto out;
    if ((rc = long_rows(o, m, &c, prof, &act, id, results, err, errlen))) goto out;
    if (o->draft_model && (rc = draft_row(o, m, id, results, err, errlen))) goto out;
out:
    if (!rc) add_memory(results, first, path, load_peak, peak_rss(), c.kv_bytes_per_pos * ((double)cap + long_cap(o)), &c.info);
    for (size_t i = first; !rc && i < json_array_size(results); i++) /* the file's scheme, not result_json's "bf16" */
        json_object_set_new(json_array_get(results, i), "format", json_string(c.info.quant));
    for (size_t i = first; !rc && c.info.n_lora && i < json_array_size(results); i++) { /* the merge, timed in the open */
        json_t *r = json_array_get(results, i);
        json_object_set_new(r, "lora_merge_ms", json_real(c.info.lora_merge_ms));
        json_object_set_new(r, "lora_tensors", json_integer(c.info.lora_tensors));
        json_object_set_new(r, "lora_private_bytes", json_real((double)c.info.lora_bytes));
    }
    if (!rc && c.info.n_lora)
        printf("  lora: %u adapter(s) merged into %u tensors (%.1f MiB private) in %.0f ms at load\n", c.info.n_lora,
               c.info.lora_tensors, c.info.lora_bytes / 1048576.0, c.info.lora_merge_ms);
    kipp_session_destroy(s);
    kipp_model_close(m);
    free(ids);
    free(logits);
    return rc;
}

static void usage(FILE *f)
{
    char backends[128];
    fprintf(f,
            "usage: kipp-bench --model FILE.gguf [--model ...] [--backend %s]\n"
            "                  [--bench pp512,tg128,tg4k,pp4096,batch1,batch2,batch4,batch8,batch16,batch32,pp8x128]\n"
            "                  [--reps N] [--warmup N] [--threads N] [--profiles DIR] [--out DIR]\n"
            "                  [--long-ctx N]  (pplong/tglong, named only: prefill of N tokens, decode after N;\n"
            "                                   default 16384; rows ppN and tgNk)\n"
            "                  [--lora PATH[:SCALE]]...  (adapters merged at load, at most 8)\n"
            "                  [--rope-scaling none|yarn:F[:ORIG]]  (RoPE scaling instead of the file's)\n"
            "                  [--draft-model FILE [--draft-max N (1..16, default 8)] [--draft-min N]]\n"
            "                  (the tg128_draft row: speculative greedy with FILE drafting, against plain greedy)\n"

            "                  [--kv-type bf16|q8_0]  (the KV cache's type; default bf16)\n",
            kipp_backend_names(backends, sizeof backends, "|"));
}

static int parse_int(const char *flag, const char *v, int lo, int hi, int *out)
{
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || *end || x < lo || x > hi) {
        fprintf(stderr, "kipp-bench: %s '%s' is not an integer in %d..%d\n", flag, v ? v : "", lo, hi);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int parse_args(int argc, char **argv, options *o)
{
    *o = (options){.backend = "cpu", .reps = 3, .warmup = 1, .profiles = "profiles", .out = "results",
                   .long_ctx = 16384};
    for (int i = 1; i < argc; i += 2) { /* every option but --help takes one value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 1; }
        if (!strcmp(a, "--model") && v) {
            if (o->n_models == MAX_MODELS) { fprintf(stderr, "kipp-bench: more than %d --model flags\n", MAX_MODELS); return -1; }
            o->models[o->n_models++] = v;
        }
        else if (!strcmp(a, "--backend") && v) o->backend = v;
        else if (!strcmp(a, "--bench") && v) { if (parse_benches(v, &o->benches)) return -1; }
        else if (!strcmp(a, "--reps")) { if (parse_int(a, v, 1, 64, &o->reps)) return -1; }
        else if (!strcmp(a, "--warmup")) { if (parse_int(a, v, 0, 16, &o->warmup)) return -1; }
        else if (!strcmp(a, "--threads")) { if (parse_int(a, v, 0, 1024, &o->threads)) return -1; }
        else if (!strcmp(a, "--long-ctx")) {
            int n;
            if (parse_int(a, v, 64, 1 << 20, &n)) return -1;
            o->long_ctx = (uint32_t)n;
        }
        else if (!strcmp(a, "--profiles") && v) o->profiles = v;
        else if (!strcmp(a, "--out") && v) o->out = v;
        else if (!strcmp(a, "--draft-model") && v) o->draft_model = v;
        else if (!strcmp(a, "--draft-max")) { if (parse_int(a, v, 1, KIPP_SPEC_K_MAX, &o->draft_max)) return -1; }
        else if (!strcmp(a, "--draft-min")) { if (parse_int(a, v, 1, KIPP_SPEC_K_MAX, &o->draft_min)) return -1; }
        else if (!strcmp(a, "--kv-type") && v) {
            char err[256];
            if (kipp_kv_type_parse(v, &o->kv_type, err, sizeof err)) {
                fprintf(stderr, "kipp-bench: %s\n", err);
                return -1;
            }
        }
        else if (!strcmp(a, "--rope-scaling") && v) {
            char err[384];
            if (kipp_rope_scaling_parse(v, &o->rope, err, sizeof err)) {
                fprintf(stderr, "kipp-bench: %s\n", err);
                return -1;
            }
            o->rope_override = 1;
        }
        else if (!strcmp(a, "--lora") && v) {
            char err[256];
            if (o->n_lora >= MAX_LORA) { fprintf(stderr, "kipp-bench: --lora '%s': at most %d adapters\n", v, MAX_LORA); return -1; }
            if (kipp_lora_parse_arg(v, &o->lora[o->n_lora], o->lora_path[o->n_lora], sizeof o->lora_path[0], err, sizeof err)) {
                fprintf(stderr, "kipp-bench: %s\n", err);
                return -1;
            }
            o->n_lora++;
        }
        else { fprintf(stderr, "kipp-bench: unknown or incomplete argument '%s'\n", a); usage(stderr); return -1; }
    }
    if (!o->draft_model && (o->draft_max || o->draft_min)) {
        fprintf(stderr, "kipp-bench: %s applies to a draft model, expected it with --draft-model FILE\n",
                o->draft_max ? "--draft-max" : "--draft-min");
        return -1;
    }
    if (o->draft_min > (o->draft_max ? o->draft_max : 8)) {
        fprintf(stderr, "kipp-bench: --draft-min %d is above the longest draft %d, expected at most --draft-max\n",
                o->draft_min, o->draft_max ? o->draft_max : 8);
        return -1;
    }
    o->bench_given = o->benches != 0;
    if (!o->benches) o->benches = (1u << N_DEFAULT_BENCH) - 1; /* default: all but the long rows */
    if (o->n_models == 0) {
        fprintf(stderr, "kipp-bench: missing required option --model (expected a .gguf path)\n");
        usage(stderr);
        return -1;
    }
    /* Results are keyed by (bench, model id): two --model flags with one id would collide. */
    for (int i = 0; i < o->n_models; i++)
        for (int j = 0; j < i; j++) {
            char a[256], b[256];
            model_id_of(o->models[i], a, sizeof a);
            model_id_of(o->models[j], b, sizeof b);
            if (!strcmp(a, b)) {
                fprintf(stderr, "kipp-bench: --model '%s' has the model id '%s' of --model '%s' (results are keyed by "
                                "it); expected each model once, with distinct file names\n", o->models[i], a,
                        o->models[j]);
                return -1;
            }
        }
    /* The results directory is checked before anything runs (it used to fail after every benchmark). */
    struct stat st;
    if (mkdir(o->out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "kipp-bench: --out '%s': cannot create the results directory: %s\n", o->out, strerror(errno));
        return -1;
    }
    int bad = stat(o->out, &st) != 0 ? errno : !S_ISDIR(st.st_mode) ? ENOTDIR : 0;
    if (bad) {
        fprintf(stderr, "kipp-bench: --out '%s': %s; expected a directory for the result files (created if missing)\n",
                o->out, strerror(bad));
        return -1;
    }
    return 0;
}

/* Same (name, model) means the same measurement: the newer one replaces it. */
static int same_key(json_t *a, json_t *b)
{
    const char *na = json_string_value(json_object_get(a, "name")), *nb = json_string_value(json_object_get(b, "name"));
    const char *ma = json_string_value(json_object_get(a, "model")), *mb = json_string_value(json_object_get(b, "model"));
    return na && nb && ma && mb && !strcmp(na, nb) && !strcmp(ma, mb);
}

/* Write doc as <out>/<date>-<host>-<cpu id>-<backend>-<sha>.json, keeping the results
 * of an earlier run of the same day/host/CPU/backend/commit that this run did not
 * repeat. The harness names the file (written first under <out>/tmp). */
static int write_merged(json_t *doc, const options *o, char *err, size_t errlen)
{
    char tmpdir[512], tmp_path[1024], final[1280];
    snprintf(tmpdir, sizeof tmpdir, "%s/tmp", o->out);
    mkdir(o->out, 0755); /* the harness creates only the last level */
    if (kipp_result_write(doc, tmpdir, o->backend, tmp_path, sizeof tmp_path, err, errlen)) return -1;
    const char *base = strrchr(tmp_path, '/');
    snprintf(final, sizeof final, "%s/%s", o->out, base ? base + 1 : tmp_path);
    json_t *old = json_load_file(final, 0, NULL), *res = json_object_get(doc, "results");
    json_t *old_res = old ? json_object_get(old, "results") : NULL;
    size_t i, j;
    json_t *r, *n;
    json_array_foreach(old_res, i, r) {
        int replaced = 0;
        json_array_foreach(res, j, n) replaced |= same_key(r, n);
        if (!replaced) json_array_append(res, r);
    }
    json_decref(old);
    if (kipp_json_write_file(doc, final, JSON_INDENT(2) | JSON_REAL_PRECISION(6), o->models, (size_t)o->n_models,
                             err, errlen)) {
        remove(tmp_path);
        return -1;
    }
    remove(tmp_path);
    printf("wrote %s (%zu results)\n", final, json_array_size(res));
    return 0;
}


int main(int argc, char **argv)
{
    options o;
    char err[512] = "";
    int prc = parse_args(argc, argv, &o);
    if (prc) return prc > 0 ? 0 : 2; /* 1: --help printed */
    kipp_profile prof;
    memset(&prof, 0, sizeof prof);
    if (kipp_profile_load(&prof, o.profiles, err, sizeof err) || !prof.loaded)
        fprintf(stderr, "kipp-bench: no machine profile: %s; roofline shares are not computed\n",
                err[0] ? err : "run `make profile` first");
    else
        printf("profile %s: read %.1f GB/s (all cores), FP32 FMA %.0f GFLOP/s, BF16 dot %.0f GFLOP/s\n", prof.path,
               prof.read_gbps_all, prof.fp32_gflops_all, prof.bf16_gflops_all);
    json_t *config = json_object();
    json_object_set_new(config, "backend", json_string(o.backend));
    json_object_set_new(config, "threads", json_integer(o.threads ? o.threads : kipp_team_cores()));
    json_object_set_new(config, "reps", json_integer(o.reps));
    json_object_set_new(config, "warmup", json_integer(o.warmup));
    json_t *loras = json_array(); /* the adapters merged at load: a merged model is what was timed */
    for (uint32_t i = 0; i < o.n_lora; i++)
        json_array_append_new(loras, json_pack("{s:s, s:f}", "path", o.lora[i].path, "scale", (double)o.lora[i].scale));
    json_object_set_new(config, "lora", loras);
    json_object_set_new(config, "isa", json_string(kipp_isa_name(kipp_isa_select(NULL))));
    double load = kipp_load_average(), busy = kipp_cpu_busy_others(1.0);
    json_object_set_new(config, "load_avg_1min_at_start", json_real(load));
    json_object_set_new(config, "cpu_busy_others_at_start", json_real(busy));
    if (busy >= KIPP_QUIET_BUSY_MAX || (busy < 0 && load > 1.0))
        printf("warning: %s (load average %.2f): rates and shares are indicative only\n",
               busy >= 0 ? "other processes used a quarter or more of the CPUs in the second before the run"
                         : "the CPUs' use before the run could not be read", load);
    json_object_set_new(config, "tg_prompt_tokens", json_integer(TG_PROMPT));
    json_object_set_new(config, "long_context", json_integer(LONG_CTX));
    json_object_set_new(config, "long_context_steps", json_integer(LONG_STEPS));
    json_object_set_new(config, "batch_steps", json_integer(BATCH_STEPS));
    json_t *doc = kipp_result_create("model", prof.loaded ? prof.path : NULL, config);
    json_t *results = json_object_get(doc, "results");
    int rc = 0;
    for (int i = 0; i < o.n_models && !rc; i++) {
        rc = bench_model(&o, o.models[i], &prof, results, err, sizeof err);
        if (rc) {
            fprintf(stderr, "kipp-bench: %s: ", o.models[i]);
            kipp_fput_escaped(stderr, err, strlen(err));
            fputc('\n', stderr);
        }
    }
    json_object_set_new(config, "load_avg_1min_at_end", json_real(kipp_load_average()));
    if (json_array_size(results) > 0 && write_merged(doc, &o, err, sizeof err)) {
        fprintf(stderr, "kipp-bench: %s\n", err);
        rc = -1;
    }
    json_decref(doc);
    return rc ? 1 : 0;
}
