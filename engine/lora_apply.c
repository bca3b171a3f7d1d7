/*
 * lora_apply.c - merge validated adapters into a loaded model:
 * gather each target's terms across adapters, check that the merged copies
 * fit the available RAM, merge (engine/lora_merge.c) into owned aligned
 * buffers, and point the model's views at them. Runs inside kipp_model_open
 * after the loader has bound the views and before the backend packs them, so
 * every backend sees ordinary tensors and decode speed does not change.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "engine/lora.h"
#include "kernels/common.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* MemAvailable of /proc/meminfo in bytes; 0 when unknown (then nothing is refused). */
static uint64_t mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024u;
}

/* The FP32 term of one pair on its [rows][cols] target: p [rows][r] (factor folded in), q [r][cols].
 * Ordinary: p = factor*b, q = a. token_embd: p = factor*a (one row per token), q = b transposed. */
static int make_term(const kipp_lora_pair *pr, uint64_t rows, uint64_t cols, kipp_lora_term *t)
{
    uint32_t r = pr->rank;
    float *p = malloc(rows * r * sizeof *p), *q = malloc((size_t)r * cols * sizeof *q);
    if (!p || !q) {
        free(p), free(q);
        return KIPP_ENOMEM;
    }
    const void *ps = pr->embed ? pr->a : pr->b;
    uint32_t pt = pr->embed ? pr->a_type : pr->b_type;
    for (size_t i = 0; i < rows * r; i++) p[i] = pr->factor * kipp_lora_factor_at(ps, pt, i);
    for (uint32_t k = 0; k < r; k++)
        for (uint64_t j = 0; j < cols; j++)
            q[(size_t)k * cols + j] = pr->embed ? kipp_lora_factor_at(pr->b, pr->b_type, j * r + k)
                                                : kipp_lora_factor_at(pr->a, pr->a_type, (size_t)k * cols + j);
    *t = (kipp_lora_term){.p = p, .q = q, .r = r};
    return KIPP_OK;
}

/* Point every view of target's file data at buf. Tied embeddings: w.output keeps the
 * file's tensor (the head is not an input lookup), as llama.cpp and PEFT apply it. */
static uint32_t rebind(kipp_model *m, const void *file_data, const void *buf)
{
    enum { PER_LAYER = sizeof(kipp_qwen3_layer) / sizeof(kipp_tensor_view) };
    _Static_assert(sizeof(kipp_qwen3_layer) % sizeof(kipp_tensor_view) == 0, "layer is an array of views");
    uint32_t n = 0;
    kipp_qwen3_weights *w = &m->view.w;
    if (w->token_embd.data == file_data) w->token_embd.data = buf, n++;
    if (!m->view.dims.tied_embeddings && w->output.data == file_data) w->output.data = buf, n++;
    for (uint32_t l = 0; l < m->view.dims.n_layer; l++) {
        kipp_tensor_view *v = (kipp_tensor_view *)&m->layers[l];
        for (unsigned j = 0; j < PER_LAYER; j++)
            if (v[j].data == file_data) v[j].data = buf, n++;
    }
    return n;
}

/* Hand the file pages a merged copy replaced back to the kernel: the mapping is private
 * and never written, so they only re-read from the file if touched again. Whole pages. */
static void drop_file_pages(const void *p, size_t n)
{
    const uintptr_t pg = 4096, a = ((uintptr_t)p + pg - 1) / pg * pg, e = ((uintptr_t)p + n) / pg * pg;
    if (e > a) (void)madvise((void *)a, e - a, MADV_DONTNEED);
}

typedef struct {
    uint64_t target;        /* model tensor index */
    kipp_lora_term *terms;  /* [n_terms] */
    uint32_t n_terms;
    char scales[64];        /* the scales of the adapters that change it, "1, 0.5", for a refusal */
} target_plan;

/* Append one adapter's scale to tp's list (truncated: it only names the culprits). */
static void add_scale(target_plan *tp, float scale)
{
    size_t used = strlen(tp->scales);
    snprintf(tp->scales + used, sizeof tp->scales - used, "%s%g", used ? ", " : "", (double)scale);
}

static void free_plan(target_plan *tp, uint32_t n)
{
    for (uint32_t i = 0; tp && i < n; i++) {
        for (uint32_t k = 0; k < tp[i].n_terms; k++) free((void *)tp[i].terms[k].p), free((void *)tp[i].terms[k].q);
        free(tp[i].terms);
    }
    free(tp);
}

/* Distinct targets over all adapters, with one FP32 term per pair. */
static int build_plan(const kipp_model *m, kipp_lora *const *ads, uint32_t n_ads, target_plan **out, uint32_t *n_out,
                      char *err, size_t errlen)
{
    uint32_t cap = 0, n = 0;
    for (uint32_t i = 0; i < n_ads; i++) cap += ads[i]->n_pairs;
    target_plan *tp = calloc(cap ? cap : 1, sizeof *tp);
    if (!tp) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for %u LoRA targets", cap);
    for (uint32_t i = 0; i < n_ads; i++)
        for (uint32_t p = 0; p < ads[i]->n_pairs; p++) {
            const kipp_lora_pair *pr = &ads[i]->pairs[p];
            const kipp_gguf_tensor *t = &m->gguf.tensors[pr->target];
            uint32_t k = 0;
            while (k < n && tp[k].target != pr->target) k++;
            if (k == n) tp[n++].target = pr->target;
            kipp_lora_term *grown = realloc(tp[k].terms, (tp[k].n_terms + 1) * sizeof *grown);
            if (!grown || make_term(pr, t->dims[1], t->dims[0], &grown[tp[k].n_terms])) {
                if (grown) tp[k].terms = grown;
                free_plan(tp, n);
                return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for the FP32 factors of '%.*s'",
                                (int)t->name.len, t->name.ptr);
            }
            tp[k].terms = grown;
            tp[k].n_terms++;
            add_scale(&tp[k], ads[i]->scale);
        }
    *out = tp;
    *n_out = n;
    return KIPP_OK;
}

#define LABEL_LEN 192 /* "'<tensor name>' (LoRA scale <scales>)" */

/* Merge the plan into new buffers and rebind; on failure m is unchanged. */
static int merge_plan(kipp_model *m, const target_plan *tp, uint32_t n, const kipp_lora_apply_opts *o, char *err,
                      size_t errlen)
{
    uint64_t need = 0;
    for (uint32_t i = 0; i < n; i++) need += m->gguf.tensors[tp[i].target].nbytes;
    uint64_t avail = o->mem_available ? o->mem_available : mem_available();
    if (avail && need > avail)
        return kipp_err(err, errlen, KIPP_ENOMEM,
                        "the merged LoRA targets need %.1f MiB of private RAM (%u tensors) but only %.1f MiB is "
                        "available; expected the merged copies to fit (fewer targets or a smaller model)",
                        need / 1048576.0, n, avail / 1048576.0);
    kipp_lora_job *jobs = calloc(n ? n : 1, sizeof *jobs);
    void **bufs = calloc(n ? n : 1, sizeof *bufs);
    char(*labels)[LABEL_LEN] = calloc(n ? n : 1, sizeof *labels);
    int rc = jobs && bufs && labels ? KIPP_OK : kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for %u merge jobs", n);
    for (uint32_t i = 0; i < n && !rc; i++) {
        const kipp_gguf_tensor *t = &m->gguf.tensors[tp[i].target];
        bufs[i] = kipp_aligned_alloc(t->nbytes);
        if (!bufs[i]) {
            rc = kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for the merged copy of '%.*s' (%llu bytes)",
                          (int)t->name.len, t->name.ptr, (unsigned long long)t->nbytes);
            break;
        }
        snprintf(labels[i], LABEL_LEN, "'%.*s' (LoRA scale %s)", (int)t->name.len, t->name.ptr, tp[i].scales);
        jobs[i] = (kipp_lora_job){.dtype = t->type, .rows = t->dims[1], .cols = t->dims[0], .src = t->data,
                                  .dst = bufs[i], .tensor_id = (uint32_t)tp[i].target, .terms = tp[i].terms,
                                  .n_terms = tp[i].n_terms, .label = labels[i]};
    }
    if (!rc) rc = kipp_lora_merge(jobs, n, o->n_threads, o->seed, o->rounding, NULL, err, errlen);
    free(labels);
    if (rc) {
        for (uint32_t i = 0; bufs && i < n; i++) kipp_aligned_free(bufs[i]);
        free(bufs);
        free(jobs);
        return rc;
    }
    for (uint32_t i = 0; i < n; i++) {
        const kipp_gguf_tensor *t = &m->gguf.tensors[tp[i].target];
        uint32_t views = rebind(m, t->data, bufs[i]);
        KIPP_ASSERT(views >= 1);
        if (!(m->view.dims.tied_embeddings && t->data == m->view.w.output.data)) /* a tied head still reads it */
            drop_file_pages(t->data, t->nbytes);
    }
    m->lora_bufs = bufs;
    m->lora_tensors = n;
    m->lora_bytes = need;
    free(jobs);
    return KIPP_OK;
}

int kipp_lora_apply(kipp_model *m, const kipp_lora_spec *specs, uint32_t n, const kipp_lora_apply_opts *o,
                    char *err, size_t errlen)
{
    if (n && !specs)
        return kipp_err(err, errlen, KIPP_EINVAL, "n_lora is %u but lora is NULL; expected %u adapter specs", n, n);
    if (!m || !o) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_lora_apply: NULL model or options");
    if (m->lora_bufs) return kipp_err(err, errlen, KIPP_EINVAL, "the model already has merged adapters; expected one apply");
    if (n == 0) return KIPP_OK;
    double t0 = now_ms();
    kipp_lora **ads = calloc(n, sizeof *ads);
    if (!ads) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for %u adapters", n);
    int rc = KIPP_OK;
    for (uint32_t i = 0; i < n && !rc; i++) {
        if (!specs[i].path) rc = kipp_err(err, errlen, KIPP_EINVAL, "LoRA adapter %u has no path", i);
        else rc = kipp_lora_open(specs[i].path, specs[i].scale, m, &ads[i], err, errlen);
    }
    target_plan *tp = NULL;
    uint32_t nt = 0;
    if (!rc) rc = build_plan(m, ads, n, &tp, &nt, err, errlen);
    if (!rc) rc = merge_plan(m, tp, nt, o, err, errlen);
    free_plan(tp, nt);
    for (uint32_t i = 0; i < n; i++) kipp_lora_close(ads[i]);
    free(ads);
    if (rc) return rc;
    m->n_lora = n;
    m->lora_merge_ms = now_ms() - t0;
    return KIPP_OK;
}

int kipp_lora_apply_open(kipp_model *m, const kipp_model_options *opts, char *err, size_t errlen)
{
    const char *r = getenv("KIPP_LORA_ROUNDING");
    kipp_lora_apply_opts lo = {.n_threads = opts->n_threads,
                               .rounding = r && !strcmp(r, "nearest") ? KIPP_LORA_NEAREST : KIPP_LORA_STOCHASTIC};
    return kipp_lora_apply(m, opts->lora, opts->n_lora, &lo, err, errlen);
}

void kipp_lora_release(kipp_model *m)
{
    for (uint32_t i = 0; m->lora_bufs && i < m->lora_tensors; i++) kipp_aligned_free(m->lora_bufs[i]);
    free(m->lora_bufs);
    m->lora_bufs = NULL;
    m->lora_tensors = 0;
}

void kipp_lora_release_packed(kipp_model *m)
{
    enum { PER_LAYER = sizeof(kipp_qwen3_layer) / sizeof(kipp_tensor_view) };
    kipp_qwen3_weights *w = &m->view.w;
    for (uint32_t i = 0; m->lora_bufs && i < m->lora_tensors; i++) {
        void *b = m->lora_bufs[i];
        if (!b || b == w->token_embd.data) continue; /* the embedding lookup still reads it */
        uint64_t freed = 0;
        if (w->output.data == b) w->output.data = NULL, freed = w->output.nbytes;
        for (uint32_t l = 0; l < m->view.dims.n_layer; l++) {
            kipp_tensor_view *v = (kipp_tensor_view *)&m->layers[l];
            for (unsigned j = 0; j < PER_LAYER; j++)
                if (v[j].data == b) v[j].data = NULL, freed = v[j].nbytes;
        }
        kipp_aligned_free(b);
        m->lora_bufs[i] = NULL;
        m->lora_bytes -= freed;
    }
}
