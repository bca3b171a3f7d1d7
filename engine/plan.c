/*
 * plan.c - kipp_plan_make: from the measured machine (plan_probe.c) and the
 * model's shape to a context size, resident vs streamed layers and predicted
 * tok/s per weight format, with the arithmetic as text (seed 002 "Planner";
 * the JSON and text views are plan_out.c).
 *
 * The model: decode reads every weight byte once per token, so its rate is
 * the read bandwidth over the bytes per token. Prefill does 2 FLOPs per weight
 * per token, each part with the instruction the cpu backend runs it with
 * (arith_of: FP32 FMA, the BF16 dot or the int8 VNNI dot), so its limit is the
 * time of each part's FLOPs at that instruction's peak. A batched decode step
 * of B sequences reads the weights once and does B tokens' FLOPs: its limit is
 * the larger of the read time and the compute time. Each limit is multiplied by
 * the share of it Kipp's own kernels reached on this CPU and level: the median
 * over the newest model benchmarks in results/ of this model (else any), from
 * quiet runs where there are any (pick_share; the same byte and FLOP counts as
 * bench/bench_model.c, so the shares carry over; make bench records the plan's
 * limit beside each pp512 and batch8 row); the shares assumed without one are
 * stated as assumed.
 *
 * Streaming: when the file's weights exceed 0.75 x available RAM, the layers
 * that do not fit are read from the file for every token, so a token costs
 * their bytes at the measured disk speed on top of the resident bytes at RAM
 * speed.
 */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/errbuf.h"
#include "engine/internal.h"
#include "engine/kipp.h"
#include "kernels/common.h"
#include "kernels/formats.h"

#define KV_SHARE 4          /* the KV cache gets a quarter of the usable RAM */
#define CTX_BLOCK 32u       /* the KV pool's block: contexts are whole blocks */
#define TG_CONTEXT 80.5     /* mean attended positions of the bench's tg128 row (16-token prompt, 128 tokens) */
#define PP_TOKENS 512.0     /* the bench's pp512 row: 512 tokens, mean context 256.5 */
#define BATCH_CONTEXT 32.5  /* mean attended positions of the bench's batch rows (16-token prompts, 32 steps) */
#define ASSUMED_DECODE_EFF 0.80  /* without results: the bench's decode target share (TARGET_DECODE is 0.95) less a margin */
#define ASSUMED_PREFILL_EFF 0.60 /* without results: of the format's own peak; pp512 reached 0.53-0.73 of it on
                                    Zen 4 and Zen 5 in every format (docs/PLANNING.md) */
#define ASSUMED_BATCH_EFF 0.60   /* without results: of the batch8 step limit; 0.56-0.77 on Zen 4 (issue 52) */
#define SERVE_NEAR_TOP 0.90      /* --max-batch: the smallest whose decode rate is within 10% of the largest's */

/* Bytes and FLOPs of the model's shape in one format (as bench/bench_model.c cost_of counts them). */
typedef struct {
    double layer_params;     /* projection weights, all layers */
    double qkv_params;       /* of which Q|K|V's (the part KIPP_BF16_ACT=mixed keeps on FP32 activations) */
    double layer_bytes;      /* projections in the format + norms in BF16, all layers */
    double head_bytes;       /* output head [vocab][d_model] in its format (BF16 unless kipp.quant.head) */
    double embd_bytes;       /* token embedding when stored apart from the head (untied or quant head), else 0 */
    double attn_flops_per_pos;
} shape_cost;

static void cost_of(const kipp_model_info *in, const kipp_fmt_facts *f, shape_cost *c)
{
    double D = in->d_model, A = (double)in->n_q_head * in->head_dim, KV = (double)in->n_kv_head * in->head_dim;
    double F = in->d_ff, L = in->n_layer;
    c->layer_params = L * ((A + 2 * KV) * D + D * A + 3 * F * D);
    c->qkv_params = L * (A + 2 * KV) * D;
    c->layer_bytes = c->layer_params * f->block_bytes / f->block + 2 * L * (2 * D + 2 * in->head_dim);
    /* A --quant-head file reads its head in that format at every token and
     * keeps the BF16 embedding as a separate tensor even when tied. */
    const char *qh = in->quant_head ? in->quant_head : "bf16";
    const kipp_fmt_facts *h = kipp_fmt_by_scheme(qh, strlen(qh));
    int qhead = h && h->block > 1;
    c->head_bytes = qhead ? (double)in->vocab_size * D * h->block_bytes / h->block : 2.0 * in->vocab_size * D;
    c->embd_bytes = in->tied_embeddings && !qhead ? 0 : 2.0 * in->vocab_size * D;
    c->attn_flops_per_pos = L * 4 * A;
}

/* ---- Kipp's measured shares from results/ ---- */

#define SHARE_RUNS 3 /* a share is the median of this many newest runs: one run on a shared VM swings by a third */

/* One tg128 or pp512 row of a results file that could give a share. */
typedef struct {
    double share;
    char date[32], file[96];
    int quiet; /* its run started quiet (KIPP_QUIET_BUSY_MAX; or recorded neither figure) */
    int same;  /* the row is of the planned model */
} share_row;

typedef struct {
    share_row *v;
    size_t n, cap;
} share_rows;

enum { ROW_DECODE, ROW_PREFILL, ROW_BATCH, ROW_KINDS }; /* the rows a share comes from: tg128, pp512, batch8 */
static const char *const ROW_NAMES[ROW_KINDS] = {"tg128", "pp512", "batch8"};

/* Bytes >= 0x80 of s become '?': file names go into the plan's JSON, which needs valid UTF-8. */
static void ascii_only(char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s >= 0x80) *s = '?';
}

static double num(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : -1;
}

static const char *str(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    return json_is_string(v) ? json_string_value(v) : "";
}

/* The row's share of its limit, < 0 when it has none: tg128 of the read bandwidth (the probes beside its reps);
 * pp512 and batch8 of the plan's limit (plan.limit_share, written by make bench from the plan made just
 * before the row: rows from before the format peaks have none, since their shares were of the FP32 or BF16
 * peak alone). */
static double row_share(const json_t *r, int kind)
{
    if (kind == ROW_DECODE) return !strncmp(str(r, "roofline_ref"), "read_gbps", 9) ? num(r, "roofline_share") : -1;
    return num(json_object_get(r, "plan"), "limit_share");
}

/* Append row r of file `name` when it has a share; a row that cannot be kept (out of memory) is left out,
 * which only narrows the median. */
static void add_row(share_rows *rows, const json_t *r, const char *name, const char *date, int quiet, int same,
                    int kind)
{
    double s = row_share(r, kind);
    if (s <= 0) return;
    if (rows->n == rows->cap) {
        size_t cap = rows->cap ? 2 * rows->cap : 16;
        share_row *v = realloc(rows->v, cap * sizeof *v);
        if (!v) return;
        rows->v = v, rows->cap = cap;
    }
    share_row *o = &rows->v[rows->n++];
    *o = (share_row){.share = s, .quiet = quiet, .same = same};
    snprintf(o->date, sizeof o->date, "%s", date);
    snprintf(o->file, sizeof o->file, "%s", name);
    ascii_only(o->file);
}

static int newer_first(const void *a, const void *b)
{
    return strcmp(((const share_row *)b)->date, ((const share_row *)a)->date);
}

/* The share the plan takes from rows (reordered): the planned model's rows when there are any (prefill
 * shares grow with the matrices), of those the quiet runs when there are any (a loaded run measures the
 * neighbours as much as Kipp), then the median of the newest SHARE_RUNS. < 0 when rows is empty; src
 * names the runs and their shares. */
static double pick_share(share_rows *rows, const char *what, char *src, size_t srclen)
{
    size_t n = rows->n, k = 0;
    int any_same = 0, any_quiet = 0;
    for (size_t i = 0; i < n; i++) any_same |= rows->v[i].same;
    for (size_t i = 0; i < n; i++)
        if (rows->v[i].same || !any_same) rows->v[k++] = rows->v[i];
    for (size_t i = 0; i < k; i++) any_quiet |= rows->v[i].quiet;
    n = k, k = 0;
    for (size_t i = 0; i < n; i++)
        if (rows->v[i].quiet || !any_quiet) rows->v[k++] = rows->v[i];
    if (!k) return -1;
    qsort(rows->v, k, sizeof *rows->v, newer_first);
    size_t m = k < SHARE_RUNS ? k : SHARE_RUNS, l;
    double s[SHARE_RUNS];
    l = (size_t)snprintf(src, srclen, "median of %zu%s %s %s run%s:", m, any_quiet ? " quiet" : "",
                         any_same ? "same-model" : "other-model", what, m > 1 ? "s" : "");
    for (size_t i = 0; i < m; i++) {
        s[i] = rows->v[i].share;
        if (l < srclen) l += (size_t)snprintf(src + l, srclen - l, " %s %.2f", rows->v[i].file, s[i]);
    }
    return kipp_median(s, m);
}

/* Every format's tg128, pp512 and batch8 rows of this cpu_id and ISA level in results/, and the model name
 * (kipp-bench's: the file's stem) a row of the planned model has in each format. */
typedef struct {
    share_rows rows[KIPP_FMT_COUNT][ROW_KINDS];
    char stem[KIPP_FMT_COUNT][160];
} share_set;

/* The stems tools/bench_models.py gives the planned checkpoint's files: <id>[-<scheme>][-head_<head>]. */
static void set_stems(share_set *set, const kipp_model_info *in)
{
    const char *qh = in->quant_head && strcmp(in->quant_head, "bf16") ? in->quant_head : NULL;
    for (size_t k = 0; k < KIPP_FMT_COUNT; k++)
        snprintf(set->stem[k], sizeof set->stem[k], "%s%s%s%s%s", in->checkpoint_id, k ? "-" : "",
                 k ? kipp_fmts[k].scheme : "", qh ? "-head_" : "", qh ? qh : "");
}

/* The format of row r: its "format", except that kipp-bench wrote "bf16" for every file before it read the
 * file's scheme; such a row's model stem still names it (<id>-<scheme>[-head_<head>]). NULL when unknown. */
static const kipp_fmt_facts *row_format(const json_t *r)
{
    const char *fmt = str(r, "format"), *model = str(r, "model");
    const kipp_fmt_facts *f = kipp_fmt_by_scheme(fmt, strlen(fmt));
    if (f != &kipp_fmts[KIPP_FMT_BF16]) return f;
    const char *h = strstr(model, "-head_");
    size_t n = h ? (size_t)(h - model) : strlen(model);
    for (size_t k = 1; k < KIPP_FMT_COUNT; k++) {
        size_t m = strlen(kipp_fmts[k].scheme);
        if (n > m && model[n - m - 1] == '-' && !strncmp(model + n - m, kipp_fmts[k].scheme, m)) return &kipp_fmts[k];
    }
    return f;
}

/* Add file `name`'s rows (parsed as o) to set when it is a model benchmark of this machine's cpu_id and level. */
static void add_file(share_set *set, const json_t *o, const char *name, const kipp_machine *mc)
{
    const json_t *cpu = json_object_get(o, "cpu"), *cfg = json_object_get(o, "config");
    if (strcmp(str(cpu, "cpu_id"), mc->cpu_id) || strcmp(str(cfg, "isa"), mc->isa)) return;
    double busy = num(cfg, "cpu_busy_others_at_start"), load = num(cfg, "load_avg_1min_at_start");
    int quiet = busy >= 0 ? busy < KIPP_QUIET_BUSY_MAX : load < 0.5 * mc->physical_cores; /* neither: quiet */
    const json_t *rows = json_object_get(o, "results");
    for (size_t i = 0; i < json_array_size(rows); i++) {
        const json_t *r = json_array_get(rows, i);
        const kipp_fmt_facts *f = row_format(r);
        if (!f) continue;
        size_t k = (size_t)(f - kipp_fmts);
        int same = !strcmp(str(r, "model"), set->stem[k]);
        for (int kind = 0; kind < ROW_KINDS; kind++)
            if (!strcmp(str(r, "name"), ROW_NAMES[kind]))
                add_row(&set->rows[k][kind], r, name, str(o, "date"), quiet, same, kind);
    }
}

/* Append "FILE (why)" to the note of files not read, keeping room for the count that ends a full note. */
static void note_skip(char *note, size_t notelen, size_t *l, size_t *shown, const char *name, const char *why)
{
    char item[400];
    snprintf(item, sizeof item, "%s%s (%s)", *shown ? "; " : "", name, why);
    ascii_only(item);
    if (*l + strlen(item) + 40 >= notelen) return;
    *l += (size_t)snprintf(note + *l, notelen - *l, "%s", item);
    ++*shown;
}

/* One pass over dir: the rows of every model benchmark (DATE-HOST-CPUID-cpu-SHA.json) of this cpu_id. A
 * directory that cannot be opened, or an entry of that name that is not a regular file, does not parse or
 * is not schema kipp.bench.v1, is named in note (the plan says which measurements it could not use; when
 * the note is full it ends with how many in all) and otherwise left out. */
static void load_shares(const char *dir, const kipp_machine *mc, share_set *set, char *note, size_t notelen)
{
    size_t l = 0, shown = 0, bad = 0;
    note[0] = 0;
    DIR *d = dir ? opendir(dir) : NULL;
    if (dir && !d) {
        note_skip(note, notelen, &l, &shown, dir, strerror(errno));
        return;
    }
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 10 || strcmp(e->d_name + n - 5, ".json") || !strstr(e->d_name, "-cpu-") ||
            !strstr(e->d_name, mc->cpu_id))
            continue;
        char path[1024], why[200] = "";
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        json_t *o = NULL;
        if (stat(path, &st) != 0) snprintf(why, sizeof why, "%s", strerror(errno));
        else if (!S_ISREG(st.st_mode)) snprintf(why, sizeof why, "not a regular file"); /* a FIFO would block */
        else {
            json_error_t je;
            o = json_load_file(path, 0, &je);
            const char *schema = str(o, "schema");
            if (!o) snprintf(why, sizeof why, "line %d: %s", je.line, je.text);
            else if (strcmp(schema, "kipp.bench.v1"))
                snprintf(why, sizeof why, "schema \"%s\", expected \"kipp.bench.v1\"", schema);
            else add_file(set, o, e->d_name, mc);
        }
        if (why[0]) bad++, note_skip(note, notelen, &l, &shown, e->d_name, why);
        json_decref(o);
    }
    if (bad > shown) snprintf(note + l, notelen - l, "%s%zu more, %zu in all", shown ? "; " : "", bad - shown, bad);
    if (d) closedir(d);
}

/* ---- the plan ---- */

/* Largest whole-block context whose KV fits usable / KV_SHARE, capped at the trained length; 0 when none. */
static uint32_t pick_ctx(uint64_t usable, uint64_t kv_per_tok, uint32_t context_length)
{
    uint64_t n = kv_per_tok ? usable / KV_SHARE / kv_per_tok : context_length;
    if (n > context_length) n = context_length;
    return (uint32_t)(n / CTX_BLOCK * CTX_BLOCK);
}

/* Bytes the file's weights keep resident: all of them, or what fits KIPP_RESIDENT_SHARE of available RAM,
 * kept as the cpu backend keeps them (cpu_stream.c): the head, then whole layers from the first. A token
 * embedding stored apart from the head is not counted: a step reads only its prompt rows from the mapping. */
static uint64_t resident_bytes(const kipp_model_info *in, uint64_t avail, uint32_t *resident_layers, int *streamed,
                               int *head_kept)
{
    const kipp_fmt_facts *f = kipp_fmt_by_scheme(in->quant, strlen(in->quant));
    shape_cost c;
    cost_of(in, f ? f : &kipp_fmts[KIPP_FMT_BF16], &c);
    double budget = KIPP_RESIDENT_SHARE * (double)avail, per_layer = c.layer_bytes / in->n_layer;
    *streamed = (double)in->weight_bytes > budget;
    *resident_layers = in->n_layer;
    *head_kept = 1;
    if (!*streamed) return in->weight_bytes;
    double head = c.head_bytes + 2.0 * in->d_model; /* the head's segment: the head and output_norm (BF16) */
    double room = budget - head;
    *head_kept = room >= 0; /* the backend keeps nothing when the head's segment alone exceeds the budget */
    *resident_layers = 0;
    if (!*head_kept) return 0;
    uint32_t k = (uint32_t)(room / per_layer);
    *resident_layers = k < in->n_layer ? k : in->n_layer;
    return (uint64_t)(head + per_layer * *resident_layers);
}

int kipp_plan_context(const kipp_model *model, uint32_t *ctx, char *err, size_t errlen)
{
    if (!model || !ctx) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_plan_context: NULL argument");
    kipp_model_info in;
    kipp_model_get_info(model, &in);
    uint64_t total, avail;
    int rc = kipp_plan_ram(&total, &avail, err, errlen), streamed;
    if (rc) return rc;
    uint32_t layers;
    int head_kept;
    uint64_t res = resident_bytes(&in, avail, &layers, &streamed, &head_kept);
    *ctx = pick_ctx(avail > res ? avail - res : 0, in.kv_bytes_per_token, in.context_length);
    if (*ctx == 0)
        return kipp_err(err, errlen, KIPP_ERANGE, "%llu bytes of RAM are available and the weights keep %llu: a "
                        "quarter of the rest holds less than %u positions of KV (%llu bytes each); expected room "
                        "for at least one 32-token block", (unsigned long long)avail, (unsigned long long)res,
                        CTX_BLOCK, (unsigned long long)in.kv_bytes_per_token);
    return 0;
}

/* ---- the arithmetic of a step ---- */

/* The instruction a part of a step runs, and its peak on mc (GFLOP/s; int8: Gop/s, counted as FLOPs are). */
typedef enum { AR_FP32, AR_BF16, AR_INT8 } arith;
static const char *const ARITH_NAMES[] = {"fp32", "bf16", "int8"};

static double arith_peak(const kipp_machine *mc, arith a)
{
    return a == AR_BF16 ? mc->bf16_dot_gflops : a == AR_INT8 ? mc->int8_dot_gops : mc->peak_gflops;
}

/* Which instruction each part of a layer step runs in format f, as the cpu backend picks its kernels
 * (cpu_backend.c): bf16 projections read FP32 activations, except through the BF16 dot where bf16_act says
 * so (mixed: all but Q|K|V; bf16: all four); q8_0 and affine4 tiles run the int8 VNNI dot at the level that
 * has it (int8_dot_gops > 0), FP32-held integer arithmetic below it; attention runs the BF16 dot in the
 * mixed and bf16 modes, whatever the format; a bf16 file's own head runs the BF16 dot in those modes too,
 * a quantized head the int8 dot where VNNI is, and a bf16 head beside quantized projections FP32 FMA. */
typedef struct {
    arith qkv, rest, attn, head;
} arith_map;

static arith_map arith_of(const kipp_machine *mc, const kipp_model_info *in, const kipp_fmt_facts *f)
{
    int dot = mc->bf16_dot_gflops > 0 && strcmp(mc->bf16_act, "f32"), vnni = mc->int8_dot_gops > 0;
    arith_map a = {.qkv = AR_FP32, .rest = AR_FP32, .attn = dot ? AR_BF16 : AR_FP32, .head = AR_FP32};
    if (f == &kipp_fmts[KIPP_FMT_BF16]) {
        a.rest = a.head = dot ? AR_BF16 : AR_FP32;
        a.qkv = dot && !strcmp(mc->bf16_act, "bf16") ? AR_BF16 : AR_FP32;
    } else
        a.qkv = a.rest = vnni ? AR_INT8 : AR_FP32;
    const char *qh = in->quant_head ? in->quant_head : "bf16";
    const kipp_fmt_facts *h = kipp_fmt_by_scheme(qh, strlen(qh));
    if (h && h->block > 1 && vnni) a.head = AR_INT8;
    return a;
}

/* FLOPs of `rows` tokens attending `ctx` positions each on average, `head_rows` of them through the head;
 * *sec = the seconds they take with each part at its instruction's peak (INFINITY when a peak is 0). */
static double step_flops(const kipp_model_info *in, const shape_cost *c, const arith_map *a, const kipp_machine *mc,
                         double rows, double ctx, double head_rows, double *sec)
{
    double part[4] = {rows * 2 * c->qkv_params, rows * 2 * (c->layer_params - c->qkv_params),
                      rows * c->attn_flops_per_pos * ctx, head_rows * 2.0 * in->vocab_size * in->d_model};
    arith ar[4] = {a->qkv, a->rest, a->attn, a->head};
    double flops = 0, s = 0;
    for (int i = 0; i < 4; i++) {
        double pk = arith_peak(mc, ar[i]);
        flops += part[i];
        s += part[i] <= 0 ? 0 : pk > 0 ? part[i] / (pk * 1e9) : INFINITY;
    }
    *sec = s;
    return flops;
}

/* Seconds to read `bytes` of format f's weights and KV at eff x the RAM bandwidth, the streamed layers (and a
 * head that does not fit) at the disk's speed when this is the streamed file's format; *streamed = those
 * bytes. INFINITY when a needed speed is 0. */
static double read_seconds(const kipp_plan *p, const kipp_model_info *in, const shape_cost *c,
                           const kipp_fmt_facts *f, double bytes, double eff, double *streamed)
{
    const kipp_machine *mc = &p->machine;
    double ram = mc->ram_read_gbps * 1e9 * eff, disk = mc->disk_read_gbps * 1e9;
    *streamed = 0;
    if (p->streamed && !strcmp(f->scheme, p->file_format) && (p->layers_streamed || !p->head_resident))
        *streamed = c->layer_bytes / in->n_layer * p->layers_streamed + (p->head_resident ? 0 : c->head_bytes);
    double s = (bytes - *streamed) / ram + (*streamed > 0 ? *streamed / disk : 0);
    return ram > 0 && isfinite(s) && s > 0 ? s : INFINITY;
}

/* Seconds of one decode step of n sequences at mean context ctx at the whole limit: the larger of reading the
 * weights once and the KV of n sequences, and the n rows' FLOPs (every row sampling) at their peaks. */
static double batch_step_limit(const kipp_plan *p, const kipp_model_info *in, const shape_cost *c,
                               const kipp_fmt_facts *f, const arith_map *a, double n, double ctx, double *bytes,
                               double *flops)
{
    double streamed, sc;
    *bytes = c->layer_bytes + c->head_bytes + n * (4.0 * in->d_model + ctx * in->kv_bytes_per_token);
    double sm = read_seconds(p, in, c, f, *bytes, 1, &streamed);
    *flops = step_flops(in, c, a, &p->machine, n, ctx, n, &sc);
    return sm > sc ? sm : sc;
}

/* Share of a limit: the median of the rows (pick_share), else the assumed one; src says which. */
static double share_of(share_rows *rows, const char *what, double assumed, char *src, size_t srclen)
{
    double s = pick_share(rows, what, src, srclen);
    if (s > 0) return s;
    snprintf(src, srclen, "assumed");
    return assumed;
}

/* The server's --max-batch and aggregate (kipp_plan_format.serve_*): decode steps of n streams at their mean
 * context, at the batch share; every prompt prefilled at the prefill share. */
static void plan_serve(const kipp_plan *p, const kipp_model_info *in, const shape_cost *c, const kipp_fmt_facts *f,
                       const arith_map *a, kipp_plan_format *o)
{
    const double P = KIPP_PLAN_SERVE_PROMPT, G = KIPP_PLAN_SERVE_TOKENS, ctx = P + G / 2;
    static const uint32_t sizes[] = {8, 16, 32, 64};
    double rate[4], step[4], b, fl;
    for (int i = 0; i < 4; i++) {
        step[i] = batch_step_limit(p, in, c, f, a, sizes[i], ctx, &b, &fl) / o->batch_eff;
        rate[i] = isfinite(step[i]) ? sizes[i] / step[i] : 0;
    }
    int k = 0;
    while (k < 3 && rate[k] < SERVE_NEAR_TOP * rate[3]) k++;
    double pre_s, N = sizes[k];
    step_flops(in, c, a, &p->machine, 1, (P + 1) / 2, 1 / P, &pre_s);
    double wall = N * P * pre_s / o->prefill_eff + (G - 1) * step[k];
    o->serve_max_batch = sizes[k];
    o->serve_tps = isfinite(wall) && wall > 0 ? N * G / wall : 0;
}

/* o->kv_fit: per KV type, the whole 32-token blocks of KV that fit the RAM beside the format's weights. */
static void plan_kv_fit(const kipp_plan *p, const kipp_model_info *in, kipp_plan_format *o)
{
    uint64_t avail = p->machine.ram_available_bytes, w = (uint64_t)o->weight_bytes;
    for (int k = 0; k < KIPP_PLAN_KV_TYPES; k++) {
        kipp_plan_kv_fit *x = &o->kv_fit[k];
        snprintf(x->kv_type, sizeof x->kv_type, "%s", kipp_kv_type_name(k));
        x->kv_bytes_per_token = (double)kipp_kv_type_bytes(in->n_layer, in->n_kv_head, in->head_dim, k);
        x->free_bytes = avail > w ? avail - w : 0;
        double n = floor((double)x->free_bytes / x->kv_bytes_per_token);
        uint32_t ram = n >= (double)UINT32_MAX ? UINT32_MAX : (uint32_t)n;
        x->ram_ctx = ram / CTX_BLOCK * CTX_BLOCK;
        x->max_ctx = (ram < in->context_length ? ram : in->context_length) / CTX_BLOCK * CTX_BLOCK;
    }
}

static void plan_format(const kipp_plan *p, const kipp_model_info *in, const kipp_fmt_facts *f, share_set *set,
                        kipp_plan_format *o)
{
    const kipp_machine *mc = &p->machine;
    shape_cost c;
    cost_of(in, f, &c);
    arith_map a = arith_of(mc, in, f);
    snprintf(o->format, sizeof o->format, "%s", f->scheme);
    snprintf(o->arith, sizeof o->arith, "q|k|v %s, o/gate|up/down %s, attention %s, head %s", ARITH_NAMES[a.qkv],
             ARITH_NAMES[a.rest], ARITH_NAMES[a.attn], ARITH_NAMES[a.head]);
    o->weight_bytes = c.layer_bytes + c.head_bytes + c.embd_bytes;
    o->decode_bytes_per_token = c.layer_bytes + c.head_bytes + 4.0 * in->d_model + TG_CONTEXT * in->kv_bytes_per_token;
    double pre_s;
    o->prefill_flops_per_token = step_flops(in, &c, &a, mc, 1, (PP_TOKENS + 1) / 2, 1 / PP_TOKENS, &pre_s);
    size_t k = (size_t)(f - kipp_fmts);
    share_rows *rows = set->rows[k];
    o->decode_eff = share_of(&rows[ROW_DECODE], "tg128", ASSUMED_DECODE_EFF, o->decode_source, sizeof o->decode_source);
    o->prefill_eff = share_of(&rows[ROW_PREFILL], "pp512", ASSUMED_PREFILL_EFF, o->prefill_source,
                              sizeof o->prefill_source);
    o->batch_eff = share_of(&rows[ROW_BATCH], "batch8", ASSUMED_BATCH_EFF, o->batch_source, sizeof o->batch_source);
    double streamed, dec_s = read_seconds(p, in, &c, f, o->decode_bytes_per_token, o->decode_eff, &streamed);
    o->decode_tps = isfinite(dec_s) ? 1 / dec_s : 0;
    o->prefill_peak_gflops = isfinite(pre_s) ? o->prefill_flops_per_token / pre_s * 1e-9 : 0;
    o->prefill_limit_tps = isfinite(pre_s) ? 1 / pre_s : 0;
    o->prefill_tps = o->prefill_limit_tps * o->prefill_eff;
    double lim = batch_step_limit(p, in, &c, f, &a, KIPP_PLAN_BATCH, BATCH_CONTEXT, &o->batch_bytes_per_step,
                                  &o->batch_flops_per_step);
    o->batch_limit_tps = isfinite(lim) ? KIPP_PLAN_BATCH / lim : 0;
    o->batch_tps = o->batch_limit_tps * o->batch_eff;
    o->batch_overhead_ms = isfinite(lim) ? lim * (1 / o->batch_eff - 1) * 1e3 : 0;
    plan_serve(p, in, &c, f, &a, o);
    plan_kv_fit(p, in, o);
    kipp_plan_rationale(p, o, streamed);
}

int kipp_plan_make(const kipp_model *model, const kipp_machine *mc, const char *results_dir, kipp_plan *out,
                   char *err, size_t errlen)
{
    if (!model || !mc || !out) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_plan_make: NULL argument");
    kipp_model_info in;
    kipp_model_get_info(model, &in);
    return kipp_plan_make_info(&in, mc, results_dir, out, err, errlen);
}

int kipp_plan_shape(const char *checkpoint_id, kipp_model_info *out, char *err, size_t errlen)
{
    if (!checkpoint_id || !out) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_plan_shape: NULL argument");
    const kipp_checkpoint *ck = kipp_checkpoint_by_id(checkpoint_id);
    if (!ck)
        return kipp_err(err, errlen, KIPP_EINVAL, "'%s' is not a registry id; expected one of `kipp registry`'s ids "
                        "(e.g. qwen3-4b-instruct-2507)", checkpoint_id);
    *out = (kipp_model_info){.checkpoint_id = ck->id, .repository = ck->repository, .revision = ck->revision,
                             .backend = "none", .quant = "bf16", .quant_head = "bf16",
                             .variant = kipp_variant_name(ck->variant), .tied_embeddings = ck->tied_embeddings,
                             .d_model = ck->d_model, .n_layer = ck->n_layer, .n_q_head = ck->n_q_head,
                             .n_kv_head = ck->n_kv_head, .head_dim = ck->head_dim, .d_ff = ck->d_ff,
                             .vocab_size = ck->vocab_size, .context_length = ck->context_length,
                             .file_context_length = ck->context_length, .rope_theta = (float)ck->rope_theta,
                             .kv_bytes_per_token = kipp_kv_bytes_per_token(ck)};
    shape_cost c;
    cost_of(out, &kipp_fmts[KIPP_FMT_BF16], &c);
    out->weight_bytes = (uint64_t)(c.layer_bytes + c.head_bytes + c.embd_bytes + 2.0 * ck->d_model); /* + output_norm */
    return 0;
}

int kipp_plan_make_info(const kipp_model_info *inp, const kipp_machine *mc, const char *results_dir, kipp_plan *out,
                        char *err, size_t errlen)
{
    if (!inp || !mc || !out) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_plan_make_info: NULL argument");
    const kipp_model_info in = *inp;
    *out = (kipp_plan){.machine = *mc, .kv_bytes_per_token = in.kv_bytes_per_token, .n_layer = in.n_layer,
                       .context_length = in.context_length};
    snprintf(out->model_id, sizeof out->model_id, "%s", in.checkpoint_id);
    snprintf(out->file_format, sizeof out->file_format, "%s", in.quant);
    snprintf(out->kv_type, sizeof out->kv_type, "%s", in.kv_type);
    for (int t = 0; t < KIPP_KV_TYPE_COUNT; t++)
        out->kv_type_bytes[t] = kipp_kv_type_bytes(in.n_layer, in.n_kv_head, in.head_dim, t);
    kipp_context_limit_note(&in, out->context_limit, sizeof out->context_limit);
    out->rope_factor = in.rope.yarn ? in.rope.factor : 0;
    out->rope_original_context = in.rope.yarn ? in.rope.original_context : 0;
    const kipp_checkpoint *ck = kipp_checkpoint_by_id(in.checkpoint_id);
    out->card_yarn_context = ck ? kipp_yarn_context(ck) : 0;
    uint64_t res = resident_bytes(&in, mc->ram_available_bytes, &out->layers_resident, &out->streamed,
                                  &out->head_resident);
    out->layers_streamed = in.n_layer - out->layers_resident;
    out->usable_ram_bytes = mc->ram_available_bytes > res ? mc->ram_available_bytes - res : 0;
    out->ctx = pick_ctx(out->usable_ram_bytes, in.kv_bytes_per_token, in.context_length);
    share_set *set = calloc(1, sizeof *set);
    if (!set) return kipp_err(err, errlen, KIPP_ENOMEM, "kipp_plan_make: out of memory");
    set_stems(set, &in);
    snprintf(out->results_dir, sizeof out->results_dir, "%s", results_dir ? results_dir : "");
    ascii_only(out->results_dir);
    load_shares(results_dir, mc, set, out->results_skipped, sizeof out->results_skipped);
    for (size_t i = 0; i < KIPP_FMT_COUNT && out->n_formats < KIPP_PLAN_MAX_FORMATS; i++)
        plan_format(out, &in, &kipp_fmts[i], set, &out->formats[out->n_formats++]);
    for (size_t i = 0; i < KIPP_FMT_COUNT; i++)
        for (int kind = 0; kind < ROW_KINDS; kind++) free(set->rows[i][kind].v);
    free(set);
    return 0;
}
