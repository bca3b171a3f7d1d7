/*
 * plan_out.c - the planner's views: the rationale paragraph of each format,
 * the plan as JSON (kipp.plan.v1) and as text (engine/plan.c makes the plan).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/internal.h"
#include "engine/kipp.h"

void kipp_plan_rationale(const kipp_plan *p, kipp_plan_format *o, double streamed_bytes)
{
    const kipp_machine *mc = &p->machine;
    char stream[200] = "";
    if (streamed_bytes > 0)
        snprintf(stream, sizeof stream, ", of which %.3g GB of %u streamed layers%s come from the file at %.2f GB/s",
                 streamed_bytes * 1e-9, p->layers_streamed, p->head_resident ? "" : " and the head",
                 mc->disk_read_gbps);
    double step_ms = o->batch_limit_tps > 0 ? KIPP_PLAN_BATCH / o->batch_limit_tps * 1e3 : 0;
    /* the share sources close the paragraph, so a long list of them is what gets cut */
    int n = snprintf(o->rationale, sizeof o->rationale,
             "decode: %.3g GB read per token%s over %.1f GB/s RAM read x %.0f%% = %.1f tok/s; prefill: %.3g GFLOP "
             "per token over the format's peak %.0f GFLOP/s (%s; FP32 %.0f, BF16 dot %.0f, int8 dot %.0f) x %.0f%% = "
             "%.1f tok/s; batch of %d: a step reads %.3g GB and does %.3g GFLOP, limit %.1f ms = %.1f tok/s, plus "
             "%.1f ms overhead (share %.0f%%) = %.1f tok/s; server: --max-batch %u, %u streams of %d prompt and %d "
             "generated tokens = %.1f tok/s aggregate; decode share: %s; prefill share: %s; batch share: %s",
             o->decode_bytes_per_token * 1e-9, stream, mc->ram_read_gbps, 100 * o->decode_eff, o->decode_tps,
             o->prefill_flops_per_token * 1e-9, o->prefill_peak_gflops, o->arith, mc->peak_gflops,
             mc->bf16_dot_gflops, mc->int8_dot_gops, 100 * o->prefill_eff, o->prefill_tps, KIPP_PLAN_BATCH,
             o->batch_bytes_per_step * 1e-9, o->batch_flops_per_step * 1e-9, step_ms, o->batch_limit_tps,
             o->batch_overhead_ms, 100 * o->batch_eff, o->batch_tps, o->serve_max_batch, o->serve_max_batch,
             KIPP_PLAN_SERVE_PROMPT, KIPP_PLAN_SERVE_TOKENS, o->serve_tps, o->decode_source, o->prefill_source,
             o->batch_source);
    (void)n;
}

/* One format as JSON: the figures, the shares with their sources, batch8 and the server. */
static json_t *format_json(const kipp_plan_format *f)
{
    json_t *o = json_pack("{s:s, s:f, s:f, s:f, s:f, s:s, s:f, s:f, s:s, s:s, s:f, s:f, s:f}", "format", f->format,
                          "weight_bytes", f->weight_bytes, "decode_bytes_per_token", f->decode_bytes_per_token,
                          "prefill_flops_per_token", f->prefill_flops_per_token, "prefill_peak_gflops",
                          f->prefill_peak_gflops, "arith", f->arith, "decode_share", f->decode_eff, "prefill_share",
                          f->prefill_eff, "decode_share_source", f->decode_source, "prefill_share_source",
                          f->prefill_source, "decode_tok_s", f->decode_tps, "prefill_tok_s", f->prefill_tps,
                          "prefill_limit_tok_s", f->prefill_limit_tps);
    json_t *b = json_pack("{s:i, s:f, s:f, s:f, s:f, s:f, s:s, s:f}", "batch", KIPP_PLAN_BATCH, "bytes_per_step",
                          f->batch_bytes_per_step, "flops_per_step", f->batch_flops_per_step, "limit_tok_s",
                          f->batch_limit_tps, "share", f->batch_eff, "overhead_ms", f->batch_overhead_ms,
                          "share_source", f->batch_source, "tok_s", f->batch_tps);
    json_t *s = json_pack("{s:i, s:i, s:i, s:f}", "max_batch", (int)f->serve_max_batch, "prompt_tokens",
                          KIPP_PLAN_SERVE_PROMPT, "generated_tokens", KIPP_PLAN_SERVE_TOKENS, "aggregate_tok_s",
                          f->serve_tps);
    if (!o || !b || !s) {
        json_decref(o), json_decref(b), json_decref(s);
        return NULL;
    }
    json_object_set_new(o, "batch8", b);
    json_object_set_new(o, "serve", s);
    json_t *kv = json_array();
    for (int k = 0; kv && k < KIPP_PLAN_KV_TYPES; k++) {
        const kipp_plan_kv_fit *x = &f->kv_fit[k];
        json_array_append_new(kv, json_pack("{s:s, s:f, s:I, s:i, s:I}", "kv_type", x->kv_type, "kv_bytes_per_token",
                                            x->kv_bytes_per_token, "free_bytes", (json_int_t)x->free_bytes, "max_ctx",
                                            (int)x->max_ctx, "ram_ctx", (json_int_t)x->ram_ctx));
    }
    json_object_set_new(o, "kv_fit", kv ? kv : json_null());
    json_object_set_new(o, "rationale", json_string(f->rationale));
    return o;
}

char *kipp_plan_json(const kipp_plan *p)
{
    const kipp_machine *m = &p->machine;
    json_t *fm = json_array();
    for (size_t i = 0; fm && i < p->n_formats; i++) json_array_append_new(fm, format_json(&p->formats[i]));
    json_t *mj = json_pack("{s:s, s:s, s:i, s:i, s:I, s:I, s:f, s:f, s:f, s:f, s:s, s:s, s:f, s:I, s:b}", "cpu_id",
                           m->cpu_id, "isa", m->isa, "physical_cores", m->physical_cores, "logical_cpus",
                           m->logical_cpus, "ram_total_bytes", (json_int_t)m->ram_total_bytes, "ram_available_bytes",
                           (json_int_t)m->ram_available_bytes, "ram_read_gbps", m->ram_read_gbps, "peak_gflops",
                           m->peak_gflops, "bf16_dot_gflops", m->bf16_dot_gflops, "int8_dot_gops", m->int8_dot_gops,
                           "bf16_act", m->bf16_act, "peaks_from", m->peaks_from, "disk_read_gbps", m->disk_read_gbps,
                           "disk_sample_bytes", (json_int_t)m->disk_sample_bytes, "disk_direct", m->disk_direct);
    json_t *o = json_pack("{s:s, s:o, s:s, s:s, s:I, s:I, s:i, s:i, s:i, s:i, s:i, s:b, s:b, s:s, s:s, s:o, s:s, s:f, "
                          "s:i, s:i}", "schema",
                          "kipp.plan.v1",
                          "machine", mj, "model", p->model_id, "file_format", p->file_format, "kv_bytes_per_token",
                          (json_int_t)p->kv_bytes_per_token, "usable_ram_bytes", (json_int_t)p->usable_ram_bytes, "ctx",
                          (int)p->ctx, "context_length", (int)p->context_length, "n_layer", (int)p->n_layer,
                          "layers_resident", (int)p->layers_resident, "layers_streamed", (int)p->layers_streamed,
                          "streamed", p->streamed, "head_resident", p->head_resident, "results_dir",
                          p->results_dir, "results_skipped", p->results_skipped, "formats", fm, "context_limit",
                          p->context_limit, "rope_factor", p->rope_factor, "rope_original_context",
                          (int)p->rope_original_context, "card_yarn_context", (int)p->card_yarn_context);
    char *s = o ? json_dumps(o, JSON_INDENT(1) | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(o);
    return s;
}

char *kipp_plan_text(const kipp_plan *p)
{
    const kipp_machine *m = &p->machine;
    size_t cap = 4096 + p->n_formats * 3584, l = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
#define OUT(...) (l += (size_t)snprintf(s + l, l < cap ? cap - l : 0, __VA_ARGS__))
    OUT("machine: %s, ISA level %s, %d physical cores / %d logical CPUs\n", m->cpu_id, m->isa, m->physical_cores,
        m->logical_cpus);
    OUT("  RAM %.2f GB total, %.2f GB available; read %.1f GB/s (all cores); peaks: FP32 FMA %.0f, BF16 dot %.0f, "
        "int8 dot %.0f GFLOP/s (%s); bf16 projections read as %s\n",
        m->ram_total_bytes * 1e-9, m->ram_available_bytes * 1e-9, m->ram_read_gbps, m->peak_gflops,
        m->bf16_dot_gflops, m->int8_dot_gops, strcmp(m->peaks_from, "probe") ? m->peaks_from : "probed now",
        m->bf16_act);
    if (m->disk_sample_bytes)
        OUT("  model file read %.2f GB/s over %.0f MiB (%s)\n", m->disk_read_gbps, m->disk_sample_bytes / 1048576.0,
            m->disk_direct ? "O_DIRECT" : "page cache dropped first");
    else
        OUT("  model file not read (no file, or it could not be read): streamed layers cannot be timed\n");
    OUT("model: %s (%s), %u layers: %u resident, %u streamed%s%s\n", p->model_id, p->file_format, p->n_layer,
        p->layers_resident, p->layers_streamed, p->streamed ? " (weights exceed 0.75 x available RAM)" : "",
        p->head_resident ? "" : "; the head is streamed too");
    OUT("  KV %s, %llu bytes per token (bf16 %llu, q8_0 %llu); context %u tokens (KV in a quarter of %.2f GB usable RAM, at most %u: %s)\n",
        p->kv_type, (unsigned long long)p->kv_bytes_per_token, (unsigned long long)p->kv_type_bytes[KIPP_KV_BF16],
        (unsigned long long)p->kv_type_bytes[KIPP_KV_Q8_0], p->ctx, p->usable_ram_bytes * 1e-9, p->context_length,
        p->context_limit);
    for (size_t i = 0; i < p->n_formats; i++) {
        const kipp_plan_format *f = &p->formats[i];
        OUT("%-13s decode %8.1f tok/s  prefill %8.1f tok/s  batch%d %8.1f tok/s  serve %8.1f tok/s at --max-batch "
            "%u  (%.2f GB of weights)%s\n  %s\n", f->format, f->decode_tps, f->prefill_tps, KIPP_PLAN_BATCH,
            f->batch_tps, f->serve_tps, f->serve_max_batch, f->weight_bytes * 1e-9,
            strcmp(f->format, p->file_format) ? "" : "  <- this file", f->rationale);
        OUT("  longest context beside these weights (all %.2f GB left for KV, no scratch counted):",
            f->kv_fit[0].free_bytes * 1e-9);
        for (int k = 0; k < KIPP_PLAN_KV_TYPES; k++) {
            const kipp_plan_kv_fit *x = &f->kv_fit[k];
            OUT("%s %s KV %u tokens (%.1f KiB per token", k ? ";" : "", x->kv_type, x->max_ctx,
                x->kv_bytes_per_token / 1024);
            if (x->ram_ctx > x->max_ctx) OUT("; the model's limit: the RAM would hold %u", x->ram_ctx);
            OUT(")");
        }
        OUT("\n");
    }
    if (p->results_dir[0]) OUT("shares from the model benchmarks in %s\n", p->results_dir);
    if (p->results_skipped[0]) OUT("results not read (shares taken without them): %s\n", p->results_skipped);
#undef OUT
    if (l >= cap) s[cap - 1] = 0;
    return s;
}
