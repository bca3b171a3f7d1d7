/*
 * plan.c - kipp_plan_make: from the measured machine (plan_probe.c) and the
 * model's shape to a context size, resident vs streamed layers and predicted
 * tok/s per weight format, with the arithmetic as text (seed 002 "Planner").
 *
 * The model: decode reads every weight byte once per token, so its rate is
 * the read bandwidth over the bytes per token; prefill does 2 FLOPs per weight
 * per token, so its rate is the FP32 FMA peak over the FLOPs per token. Each is
 * multiplied by the share of that roofline Kipp's own kernels reached on this
 * CPU and level: the median over the newest model benchmarks in results/ of
 * this model (else any), from quiet runs where there are any (pick_share; the
 * same byte and FLOP counts as bench/bench_model.c, so the shares carry over);
 * the shares assumed without one are the bench's targets, stated as assumed.
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
#define ASSUMED_DECODE_EFF 0.80  /* without results: the bench's decode target share (TARGET_DECODE is 0.95) less a margin */
#define ASSUMED_PREFILL_EFF 0.50 /* without results: about what the FP32 path reached in results/ of other CPUs */

/* Bytes and FLOPs of the model's shape in one format (as bench/bench_model.c cost_of counts them). */
typedef struct {
    double layer_params;     /* projection weights, all layers */
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

/* A row's share of the FP32 FMA peak (prefill) or of the read bandwidth (decode); < 0 when it has none. */
static double row_share(const json_t *r, int prefill)
{
    const char *ref = str(r, "roofline_ref");
    double s = num(r, "roofline_share");
    if (!prefill) return !strncmp(ref, "read_gbps", 9) ? s : -1;
    if (!strcmp(ref, "fp32_gflops_all")) return s;
    return !strcmp(ref, "bf16_gflops_all") ? num(r, "fp32_peak_share") : -1;
}

/* Append row r of file `name` when it has a share; a row that cannot be kept (out of memory) is left out,
 * which only narrows the median. */
static void add_row(share_rows *rows, const json_t *r, const char *name, const char *date, int quiet, int same,
                    int prefill)
{
    double s = row_share(r, prefill);
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

/* Every format's tg128 and pp512 rows of this cpu_id and ISA level in results/. */
typedef struct {
    share_rows dec[KIPP_FMT_COUNT], pre[KIPP_FMT_COUNT];
} share_set;

/* Add file `name`'s rows (parsed as o) to set when it is a model benchmark of this machine's cpu_id and level. */
static void add_file(share_set *set, const json_t *o, const char *name, const kipp_machine *mc, const char *model_id)
{
    const json_t *cpu = json_object_get(o, "cpu"), *cfg = json_object_get(o, "config");
    if (strcmp(str(cpu, "cpu_id"), mc->cpu_id) || strcmp(str(cfg, "isa"), mc->isa)) return;
    double busy = num(cfg, "cpu_busy_others_at_start"), load = num(cfg, "load_avg_1min_at_start");
    int quiet = busy >= 0 ? busy < KIPP_QUIET_BUSY_MAX : load < 0.5 * mc->physical_cores; /* neither: quiet */
    const json_t *rows = json_object_get(o, "results");
    for (size_t i = 0; i < json_array_size(rows); i++) {
        const json_t *r = json_array_get(rows, i);
        const char *fmt = str(r, "format");
        const kipp_fmt_facts *f = kipp_fmt_by_scheme(fmt, strlen(fmt));
        if (!f) continue;
        size_t k = (size_t)(f - kipp_fmts);
        int same = !strcmp(str(r, "model"), model_id);
        if (!strcmp(str(r, "name"), "tg128")) add_row(&set->dec[k], r, name, str(o, "date"), quiet, same, 0);
        if (!strcmp(str(r, "name"), "pp512")) add_row(&set->pre[k], r, name, str(o, "date"), quiet, same, 1);
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
static void load_shares(const char *dir, const kipp_machine *mc, const char *model_id, share_set *set, char *note,
                        size_t notelen)
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
            else add_file(set, o, e->d_name, mc, model_id);
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

static void plan_format(const kipp_plan *p, const kipp_model_info *in, const kipp_fmt_facts *f, share_set *set,
                        kipp_plan_format *o)
{
    const kipp_machine *mc = &p->machine;
    shape_cost c;
    cost_of(in, f, &c);
    snprintf(o->format, sizeof o->format, "%s", f->scheme);
    o->weight_bytes = c.layer_bytes + c.head_bytes + c.embd_bytes;
    o->decode_bytes_per_token = c.layer_bytes + c.head_bytes + 4.0 * in->d_model + TG_CONTEXT * in->kv_bytes_per_token;
    o->prefill_flops_per_token = 2 * c.layer_params + c.attn_flops_per_pos * (PP_TOKENS + 1) / 2 +
                                 2.0 * in->vocab_size * in->d_model / PP_TOKENS;
    size_t k = (size_t)(f - kipp_fmts);
    char dsrc[sizeof o->decode_source], psrc[sizeof o->prefill_source];
    double dec = pick_share(&set->dec[k], "tg128", dsrc, sizeof dsrc);
    double pre = pick_share(&set->pre[k], "pp512", psrc, sizeof psrc);
    o->decode_eff = dec > 0 ? dec : ASSUMED_DECODE_EFF;
    o->prefill_eff = pre > 0 ? pre : ASSUMED_PREFILL_EFF;
    snprintf(o->decode_source, sizeof o->decode_source, "%s", dec > 0 ? dsrc : "assumed");
    snprintf(o->prefill_source, sizeof o->prefill_source, "%s", pre > 0 ? psrc : "assumed");
    double ram = mc->ram_read_gbps * 1e9 * o->decode_eff;
    o->decode_tps = ram > 0 ? ram / o->decode_bytes_per_token : 0;
    double stream_note_bytes = 0;
    if (p->streamed && !strcmp(f->scheme, p->file_format) && (p->layers_streamed || !p->head_resident)) {
        /* the streamed layers (and a head that does not fit) come from the file every token, at disk speed */
        double per_layer = c.layer_bytes / in->n_layer;
        stream_note_bytes = per_layer * p->layers_streamed + (p->head_resident ? 0 : c.head_bytes);
        double disk = mc->disk_read_gbps * 1e9;
        double sec = (o->decode_bytes_per_token - stream_note_bytes) / (ram > 0 ? ram : 1) +
                     (disk > 0 ? stream_note_bytes / disk : INFINITY);
        o->decode_tps = isfinite(sec) && sec > 0 ? 1 / sec : 0;
    }
    o->prefill_tps = mc->peak_gflops > 0 ? mc->peak_gflops * 1e9 * o->prefill_eff / o->prefill_flops_per_token : 0;
    char stream[200] = "";
    if (stream_note_bytes > 0)
        snprintf(stream, sizeof stream, ", of which %.3g GB of %u streamed layers%s come from the file at %.2f GB/s",
                 stream_note_bytes * 1e-9, p->layers_streamed, p->head_resident ? "" : " and the head",
                 mc->disk_read_gbps);
    snprintf(o->rationale, sizeof o->rationale,
             "decode: %.3g GB read per token%s over %.1f GB/s RAM read x %.0f%% = %.1f tok/s; prefill: %.3g "
             "GFLOP per token over %.0f GFLOP/s FP32 peak x %.0f%% = %.1f tok/s; decode share: %s; prefill share: %s",
             o->decode_bytes_per_token * 1e-9, stream, mc->ram_read_gbps, 100 * o->decode_eff, o->decode_tps,
             o->prefill_flops_per_token * 1e-9, mc->peak_gflops, 100 * o->prefill_eff, o->prefill_tps,
             dec > 0 ? dsrc : "assumed", pre > 0 ? psrc : "assumed");
}

int kipp_plan_make(const kipp_model *model, const kipp_machine *mc, const char *results_dir, kipp_plan *out,
                   char *err, size_t errlen)
{
    if (!model || !mc || !out) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_plan_make: NULL argument");
    kipp_model_info in;
    kipp_model_get_info(model, &in);
    *out = (kipp_plan){.machine = *mc, .kv_bytes_per_token = in.kv_bytes_per_token, .n_layer = in.n_layer,
                       .context_length = in.context_length};
    snprintf(out->model_id, sizeof out->model_id, "%s", in.checkpoint_id);
    snprintf(out->file_format, sizeof out->file_format, "%s", in.quant);
    uint64_t res = resident_bytes(&in, mc->ram_available_bytes, &out->layers_resident, &out->streamed,
                                  &out->head_resident);
    out->layers_streamed = in.n_layer - out->layers_resident;
    out->usable_ram_bytes = mc->ram_available_bytes > res ? mc->ram_available_bytes - res : 0;
    out->ctx = pick_ctx(out->usable_ram_bytes, in.kv_bytes_per_token, in.context_length);
    share_set set = {0};
    snprintf(out->results_dir, sizeof out->results_dir, "%s", results_dir ? results_dir : "");
    ascii_only(out->results_dir);
    load_shares(results_dir, mc, in.checkpoint_id, &set, out->results_skipped, sizeof out->results_skipped);
    for (size_t i = 0; i < KIPP_FMT_COUNT && out->n_formats < KIPP_PLAN_MAX_FORMATS; i++)
        plan_format(out, &in, &kipp_fmts[i], &set, &out->formats[out->n_formats++]);
    for (size_t i = 0; i < KIPP_FMT_COUNT; i++) free(set.dec[i].v), free(set.pre[i].v);
    return 0;
}

char *kipp_plan_json(const kipp_plan *p)
{
    const kipp_machine *m = &p->machine;
    json_t *fm = json_array();
    for (size_t i = 0; fm && i < p->n_formats; i++) {
        const kipp_plan_format *f = &p->formats[i];
        json_array_append_new(fm, json_pack("{s:s, s:f, s:f, s:f, s:f, s:f, s:s, s:s, s:f, s:f, s:s}", "format", f->format,
                                            "weight_bytes", f->weight_bytes, "decode_bytes_per_token",
                                            f->decode_bytes_per_token, "prefill_flops_per_token",
                                            f->prefill_flops_per_token, "decode_share", f->decode_eff, "prefill_share",
                                            f->prefill_eff, "decode_share_source", f->decode_source,
                                            "prefill_share_source", f->prefill_source, "decode_tok_s",
                                            f->decode_tps, "prefill_tok_s", f->prefill_tps, "rationale", f->rationale));
    }
    json_t *mj = json_pack("{s:s, s:s, s:i, s:i, s:I, s:I, s:f, s:f, s:f, s:I, s:b}", "cpu_id", m->cpu_id, "isa",
                           m->isa, "physical_cores", m->physical_cores, "logical_cpus", m->logical_cpus,
                           "ram_total_bytes", (json_int_t)m->ram_total_bytes, "ram_available_bytes",
                           (json_int_t)m->ram_available_bytes, "ram_read_gbps", m->ram_read_gbps, "peak_gflops",
                           m->peak_gflops, "disk_read_gbps", m->disk_read_gbps, "disk_sample_bytes",
                           (json_int_t)m->disk_sample_bytes, "disk_direct", m->disk_direct);
    json_t *o = json_pack("{s:s, s:o, s:s, s:s, s:I, s:I, s:i, s:i, s:i, s:i, s:i, s:b, s:b, s:s, s:s, s:o}", "schema",
                          "kipp.plan.v1",
                          "machine", mj, "model", p->model_id, "file_format", p->file_format, "kv_bytes_per_token",
                          (json_int_t)p->kv_bytes_per_token, "usable_ram_bytes", (json_int_t)p->usable_ram_bytes, "ctx",
                          (int)p->ctx, "context_length", (int)p->context_length, "n_layer", (int)p->n_layer,
                          "layers_resident", (int)p->layers_resident, "layers_streamed", (int)p->layers_streamed,
                          "streamed", p->streamed, "head_resident", p->head_resident, "results_dir",
                          p->results_dir, "results_skipped", p->results_skipped, "formats", fm);
    char *s = o ? json_dumps(o, JSON_INDENT(1) | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(o);
    return s;
}

char *kipp_plan_text(const kipp_plan *p)
{
    const kipp_machine *m = &p->machine;
    size_t cap = 4096 + p->n_formats * 1024, l = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
#define OUT(...) (l += (size_t)snprintf(s + l, l < cap ? cap - l : 0, __VA_ARGS__))
    OUT("machine: %s, ISA level %s, %d physical cores / %d logical CPUs\n", m->cpu_id, m->isa, m->physical_cores,
        m->logical_cpus);
    OUT("  RAM %.2f GB total, %.2f GB available; read %.1f GB/s (all cores); FP32 peak %.0f GFLOP/s\n",
        m->ram_total_bytes * 1e-9, m->ram_available_bytes * 1e-9, m->ram_read_gbps, m->peak_gflops);
    OUT("  model file read %.2f GB/s over %.0f MiB (%s)\n", m->disk_read_gbps, m->disk_sample_bytes / 1048576.0,
        m->disk_direct ? "O_DIRECT" : "page cache dropped first");
    OUT("model: %s (%s), %u layers: %u resident, %u streamed%s%s\n", p->model_id, p->file_format, p->n_layer,
        p->layers_resident, p->layers_streamed, p->streamed ? " (weights exceed 0.75 x available RAM)" : "",
        p->head_resident ? "" : "; the head is streamed too");
    OUT("  KV %llu bytes per token; context %u tokens (KV in a quarter of %.2f GB usable RAM, at most %u)\n",
        (unsigned long long)p->kv_bytes_per_token, p->ctx, p->usable_ram_bytes * 1e-9, p->context_length);
    for (size_t i = 0; i < p->n_formats; i++) {
        const kipp_plan_format *f = &p->formats[i];
        OUT("%-13s decode %8.1f tok/s  prefill %8.1f tok/s  (%.2f GB of weights)%s\n  %s\n", f->format, f->decode_tps,
            f->prefill_tps, f->weight_bytes * 1e-9, strcmp(f->format, p->file_format) ? "" : "  <- this file",
            f->rationale);
    }
    if (p->results_dir[0]) OUT("shares from the model benchmarks in %s\n", p->results_dir);
    if (p->results_skipped[0]) OUT("results not read (shares taken without them): %s\n", p->results_skipped);
#undef OUT
    if (l >= cap) s[cap - 1] = 0;
    return s;
}
