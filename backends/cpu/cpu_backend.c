/*
 * cpu_backend.c - the fast CPU backend's ops table (engine/backend.h, seed 000
 * "Backend boundary"): kernel table selection, pool and scratch lifetime,
 * paged KV sessions, and eval's packing of items into rounds.
 *
 * Everything that grows with the work is allocated here, at model or session
 * creation; the forward pass (cpu_forward.c) never allocates.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backends/cpu/cpu_internal.h"
#include "base/errbuf.h"
#include "base/hugepage.h"
#include "base/log.h"

static void cpu_model_destroy(void *bm);

/* How bf16 projections are read (kernels.h "bf16dot"), per projection of a
 * layer in plan_layer's order Q|K|V, O, Gate|Up, Down. BF16 activations
 * through vdpbf16ps double prefill's compute peak on AMD and cost one BF16 rounding
 * of the projection's input. Measured on the synthetic 0.6B shape, final-row
 * logits of a 38-token prompt against the ref backend (the FP32 oracle; the
 * CPU contract asks <= 5e-5): all four through the dot 8.8e-5, Q|K|V alone 4.9e-5
 * (its error passes through QK-norm, RoPE and the softmax), O 1.5e-5,
 * Gate|Up 1.5e-5, Down 1.1e-5, all but Q|K|V 3.5e-5. So the default where the
 * CPU has a fast dot ("mixed") keeps Q|K|V (27% of the matmul FLOPs) on FP32
 * activations. Where the dot is slower than FP32 FMA (Intel cores:
 * kipp_cpu_features.bf16_dot_fast) the default is f32: faster and exact. A hi/lo BF16 split of Q|K|V's input (two dots per k-pair) was
 * tried: FP32 accuracy, but no faster than the FP32-FMA kernels, so it was
 * not kept. KIPP_BF16_ACT=f32 keeps FP32
 * activations everywhere (the arithmetic of every other level), =bf16 reads
 * all four through the dot (llama.cpp's precision; faster prefill than mixed).
 * The output head (read[4]) goes through the dot in both dot modes: a
 * batched decode step runs it on every sampling row (B rows of vocab x
 * d_model), where on FP32 FMA it was the largest cost of the step (commit
 * ac57cd5 has the profile), and the one BF16 rounding of the final-norm row
 * keeps the logits inside the NMSE contract against the ref backend. A bf16
 * head beside quantized projections stays FP32 (kipp_cpu_head_fmt): there the
 * rounding added argmax flips on the outlier fixture. Decode and prefill read
 * a projection (and the head) the same way, so row invariance holds in every
 * mode. */
static const struct {
    const char *name;
    k_fmt read[5]; /* per projection, then the head */
} bf16_modes[] = {
    {"f32", {K_FMT_BF16, K_FMT_BF16, K_FMT_BF16, K_FMT_BF16, K_FMT_BF16}},
    {"mixed", {K_FMT_BF16, K_FMT_BF16DOT, K_FMT_BF16DOT, K_FMT_BF16DOT, K_FMT_BF16DOT}},
    {"bf16", {K_FMT_BF16DOT, K_FMT_BF16DOT, K_FMT_BF16DOT, K_FMT_BF16DOT, K_FMT_BF16DOT}},
};

static int choose_bf16_read(cpu_model *m, char *err, size_t errlen)
{
    const char *e = getenv("KIPP_BF16_ACT");
    int native = k_fmt_native(m->k, K_FMT_BF16DOT), pick = native && kipp_cpu_get()->bf16_dot_fast ? 1 : 0;
    if (e && *e) {
        for (pick = 2; pick >= 0 && strcmp(e, bf16_modes[pick].name); pick--) {}
        if (pick < 0)
            return kipp_err(err, errlen, KIPP_EINVAL, "KIPP_BF16_ACT=%s is not a bf16 activation mode; expected f32, mixed or bf16", e);
        if (pick > 0 && !native) {
            const char *forced = getenv("KIPP_ISA");
            char why[240];
            if (forced && *forced) snprintf(why, sizeof why, "KIPP_ISA=%s", forced);
            else snprintf(why, sizeof why, "%s", m->isa_note[0] ? m->isa_note : "the best level this CPU has");
            return kipp_err(err, errlen, KIPP_ENOTSUP,
                            "KIPP_BF16_ACT=%s needs the avx512_bf16 kernel level (vdpbf16ps); this model runs %s (%s)", e,
                            m->k->isa, why);
        }
    }
    m->bf16_mode = bf16_modes[pick].name;
    memcpy(m->bf16_read, bf16_modes[pick].read, sizeof m->bf16_read);
    m->flash_gqa = pick > 0 ? m->k->flash_gqa_dot : m->k->flash_gqa_bf16;
    m->flash_rows = pick > 0 ? m->k->flash_rows_dot : m->k->flash_rows_bf16;
    return 0;
}

/* Pick the kernel table (kernels/common.h kipp_isa_select) and record why a
 * slower path runs, so describe and stderr can say so. */
static void choose_kernels(cpu_model *m)
{
    static int warned;
    const char *note = NULL;
    const kipp_cpu_features *f = kipp_cpu_get();
    m->isa = kipp_isa_select(&note);
    m->k = k_cpu_ops_get(m->isa);
    if (note)
        snprintf(m->isa_note, sizeof m->isa_note, "%s (KIPP_ISA=%s, running %s)", note,
                 getenv("KIPP_ISA"), kipp_isa_name(m->isa));
    else if (m->isa < KIPP_ISA_AVX512_BF16 && !getenv("KIPP_ISA"))
        snprintf(m->isa_note, sizeof m->isa_note,
                 "best level on this CPU is %s (avx2=%d avx512=%d avx512_bf16=%d); the VNNI prefill tiles of q8_0 and affine4 need avx512_bf16",
                 kipp_isa_name(m->isa), f->avx2, f->avx512, f->avx512_bf16);
    if (m->isa_note[0] && !warned) {
        warned = 1;
        kipp_log("cpu backend: %s", m->isa_note);
    }
}

static int alloc_f32(float **p, size_t n, size_t *total)
{
    *p = kipp_aligned_alloc(n * sizeof(float));
    *total += n * sizeof(float);
    return *p ? 0 : -1;
}

/* Round scratch for KIPP_CPU_ROUND_TOKENS rows (docs/ARCHITECTURE.md "Scratch"). */
static int alloc_scratch(cpu_model *m)
{
    const kipp_dims *d = &m->d;
    size_t R = KIPP_CPU_ROUND_TOKENS, D = d->d_model, A = m->A, F = d->d_ff;
    size_t group = d->n_q_head / KIPP_N_KV_HEAD, t = 0;
    size_t xw = D > A ? (D > F ? D : F) : (A > F ? A : F);
    m->tile_tokens = group >= KIPP_CPU_ATTN_TILE_QUERIES ? 1 : KIPP_CPU_ATTN_TILE_QUERIES / (uint32_t)group;
    m->tile_q = m->tile_tokens * group;
    size_t act_row = 0; /* widest activation row any format's matmul reads */
    for (int f = 0; f < K_FMT_COUNT; f++) {
        size_t b = k_act_row_bytes(k_fmt_get((k_fmt)f)->act, xw);
        act_row = b > act_row ? b : act_row;
    }
    m->xa = kipp_aligned_alloc(R * act_row);
    t += R * act_row;
    int bad = alloc_f32(&m->x, R * D, &t) | alloc_f32(&m->xn, R * D, &t) |
              alloc_f32(&m->qkv, R * m->QKV, &t) | alloc_f32(&m->att, R * A, &t) |
              alloc_f32(&m->tmp, R * D, &t) | alloc_f32(&m->gu, R * 2 * F, &t) | alloc_f32(&m->sw, R * F, &t) |
              alloc_f32(&m->head_tmp, (size_t)m->nth * R * KIPP_CPU_HEAD_BLOCK, &t) |
              alloc_f32(&m->tile_buf, (size_t)m->nth * m->tile_q * KIPP_CPU_TILE_STATE, &t) |
              alloc_f32(&m->att1, R * A, &t) | alloc_f32(&m->lane_ml, R * K_ATTN_LANES * 2 * d->n_q_head, &t) |
              alloc_f32(&m->rope, (size_t)d->context_length * KIPP_HEAD_DIM, &t);
    m->row_item = malloc(R * sizeof *m->row_item);
    m->row_pos = malloc(R * sizeof *m->row_pos);
    m->row_tok = malloc(R * sizeof *m->row_tok);
    m->lrow = malloc(R * sizeof *m->lrow);
    m->ldst = malloc(R * sizeof *m->ldst);
    m->lhid = malloc(R * sizeof *m->lhid);
    m->tile_r0 = malloc(R * sizeof *m->tile_r0);
    m->tile_n = malloc(R * sizeof *m->tile_n);
    t += R * (6 * sizeof(uint32_t) + sizeof(float *));
    m->scratch_bytes = t;
    return bad || !m->xa || !m->row_item || !m->row_pos || !m->row_tok || !m->lrow || !m->ldst || !m->lhid || !m->tile_r0 || !m->tile_n ? -1 : 0;
}

/* One matrix to repack: src [rows][cols] in the file layout of fmt -> dst. */
typedef struct {
    k_fmt fmt;
    const void *src;
    void *dst;
    size_t rows, cols;
} pack_job;

typedef struct {
    const cpu_model *m;
    const pack_job *jobs;
    size_t n;
} pack_task;

static void pack_run(void *arg, int ith, int nth)
{
    const pack_task *t = arg;
    for (size_t i = 0; i < t->n; i++) {
        const pack_job *j = &t->jobs[i];
        t->m->k->fmt[j->fmt].pack(j->src, j->dst, j->rows, j->cols, ith, nth);
    }
}

/* Jobs and weights of one layer: Q|K|V and Gate|Up are packed back to back,
 * which is the packing of their row concatenation (kernels.h), so each is one
 * kernel call per layer. All members of a fused weight share one format
 * (check_view). Returns the bytes used from cur. */
static size_t plan_layer(const cpu_model *m, const kipp_qwen3_layer *L, cpu_layer *out, pack_job *jobs, size_t *nj, char *cur)
{
    const kipp_tensor_view *parts[4][2] = {{&L->wq, &L->wk}, {&L->wo, NULL}, {&L->w_gate, &L->w_up}, {&L->w_down, NULL}};
    k_weight *dst[4] = {&out->qkv, &out->o, &out->gu, &out->down};
    size_t used = 0;
    for (int w = 0; w < 4; w++) {
        k_fmt f = (k_fmt)k_fmt_from_gguf(parts[w][0]->dtype);
        if (f == K_FMT_BF16) f = m->bf16_read[w]; /* the same packed layout, another activation format */
        const k_fmt_info *fi = k_fmt_get(f);
        *dst[w] = (k_weight){f, cur + used, 0, parts[w][0]->cols};
        const kipp_tensor_view *list[3] = {parts[w][0], parts[w][1], w == 0 ? &L->wv : NULL};
        for (int i = 0; i < 3 && list[i]; i++) {
            const kipp_tensor_view *v = list[i];
            jobs[(*nj)++] = (pack_job){f, v->data, cur + used, v->rows, v->cols};
            used += fi->packed_bytes(v->rows, v->cols);
            dst[w]->rows += v->rows;
        }
    }
    return used;
}

/* Packed bytes of one tensor view in its format. */
static size_t view_packed_bytes(const kipp_tensor_view *v)
{
    return k_fmt_get((k_fmt)k_fmt_from_gguf(v->dtype))->packed_bytes(v->rows, v->cols);
}

/* After packing, the pages a packed copy replaces are handed back to the
 * kernel (MADV_PAGEOUT, Linux 5.4+): clean file pages of the model mapping
 * are reclaimed, so resident memory is the packed copy (the same bytes as
 * those tensors in the file, for every format) plus what stays mapped
 * (touched embedding rows, norms), not the copy on top of the file. PAGEOUT
 * never changes contents (a view built on anonymous memory, as in the tests,
 * keeps its bytes; MADV_DONTNEED would zero those), and a later read such as
 * the embedding rows of a tied head faults the page back in. Advisory: a
 * refusal or an older kernel only costs memory. Whole pages only. */
static void drop_pages(const void *p, size_t n)
{
#ifdef MADV_PAGEOUT
    const uintptr_t pg = 4096, a = ((uintptr_t)p + pg - 1) / pg * pg, e = ((uintptr_t)p + n) / pg * pg;
    if (e > a) (void)madvise((void *)a, e - a, MADV_PAGEOUT);
#else
    (void)p, (void)n;
#endif
}

/* Pack jobs [j0, j1) on the pool, then release the file pages they read, so
 * the file and its packed copy are both resident for one layer at most
 * (peak resident memory ~1x the GGUF, not 2x). */
static void pack_span(cpu_model *m, pack_job *jobs, size_t j0, size_t j1)
{
    pack_task t = {m, jobs + j0, j1 - j0};
    kipp_threadpool_run(m->pool, pack_run, &t);
    for (size_t i = j0; i < j1; i++) drop_pages(jobs[i].src, k_fmt_file_bytes(k_fmt_get(jobs[i].fmt), jobs[i].rows, jobs[i].cols));
}

/* Repack every projection and the head once, on the pool, into each
 * format's packed layout (the prepared copy docs/ARCHITECTURE.md "Ownership"
 * allows; reported by describe), layer by layer. */
static int pack_weights(cpu_model *m)
{
    const kipp_dims *d = &m->d;
    size_t bytes = view_packed_bytes(&m->w.output), nj = 0;
    for (uint32_t l = 0; l < d->n_layer; l++) {
        const kipp_qwen3_layer *L = &m->w.layers[l];
        const kipp_tensor_view *v[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < 7; i++) bytes += view_packed_bytes(v[i]);
    }
    m->lw = calloc(d->n_layer, sizeof *m->lw);
    pack_job *jobs = calloc((size_t)d->n_layer * 7 + 1, sizeof *jobs);
    m->packed = kipp_huge_alloc(bytes); /* huge pages: decode streams these bytes per token */
    if (!m->lw || !jobs || !m->packed) { free(jobs); return -1; }
    m->prepared_bytes = bytes;
    char *cur = m->packed;
    for (uint32_t l = 0; l < d->n_layer; l++) {
        size_t j0 = nj;
        cur += plan_layer(m, &m->w.layers[l], &m->lw[l], jobs, &nj, cur);
        pack_span(m, jobs, j0, nj);
    }
    k_fmt hf = kipp_cpu_head_fmt(m, &m->w);
    const k_fmt_info *hi = k_fmt_get(hf);
    m->head = (k_weight){hf, cur, m->w.output.rows, m->w.output.cols};
    /* The head (311 MB at 0.6B) in row slices of whole panels, each packed
     * and its file pages released before the next: a row range packs to a
     * contiguous range of the packed layout (kernels.h). */
    for (size_t r0 = 0, rows = m->w.output.rows, cols = m->w.output.cols; r0 < rows; r0 += KIPP_CPU_HEAD_PACK_ROWS) {
        size_t n = rows - r0 < KIPP_CPU_HEAD_PACK_ROWS ? rows - r0 : KIPP_CPU_HEAD_PACK_ROWS;
        jobs[0] = (pack_job){hf, (const char *)m->w.output.data + k_fmt_file_bytes(hi, r0, cols), cur + hi->packed_bytes(r0, cols), n, cols};
        pack_span(m, jobs, 0, 1);
    }
    free(jobs);
    return 0;
}

/* A projection the backend can pack: a format row exists for its file type
 * and its shape fits that format's packed layout. */
static int check_weight(const kipp_tensor_view *w, const char *name, char *err, size_t errlen)
{
    int f = w->data ? k_fmt_from_gguf(w->dtype) : -1;
    if (f < 0)
        return kipp_err(err, errlen, KIPP_ENOTSUP, "tensor %s has GGUF type %u; the cpu backend has no weight format for it (bf16 = 30)",
                        name, w->dtype);
    const k_fmt_info *fi = k_fmt_get((k_fmt)f);
    if (w->rows % fi->row_align || w->cols % fi->col_align)
        return kipp_err(err, errlen, KIPP_EINVAL, "tensor %s is [%llu][%llu]; format %s packs rows in multiples of %zu and cols of %zu",
                        name, (unsigned long long)w->rows, (unsigned long long)w->cols, fi->name, fi->row_align, fi->col_align);
    return 0;
}

/* What this backend can run beyond the shape the engine checked
 * (kipp_view_check): at most 64 query heads per KV head, a vocabulary of
 * whole 16-row head panels, and projections in a format it packs, one
 * format per fused weight. Anything else is KIPP_ENOTSUP/KIPP_EINVAL here. */
static int check_view(const kipp_model_view *v, char *err, size_t errlen)
{
    const kipp_dims *d = &v->dims;
    if (d->n_q_head / KIPP_N_KV_HEAD > 64)
        return kipp_err(err, errlen, KIPP_EINVAL, "n_q_head %u unsupported; the cpu backend takes at most 64 query heads per KV head (512)",
                        d->n_q_head);
    if (d->vocab_size % 16)
        return kipp_err(err, errlen, KIPP_EINVAL, "vocab %u unsupported; the cpu backend packs the head in panels of 16 rows (vocab %% 16 == 0)",
                        d->vocab_size);
    int rc = check_weight(&v->w.output, "output", err, errlen);
    for (uint32_t l = 0; !rc && l < d->n_layer; l++) {
        const kipp_qwen3_layer *L = &v->w.layers[l];
        const kipp_tensor_view *lt[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        static const char *names[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
        for (size_t i = 0; !rc && i < 7; i++) rc = check_weight(lt[i], names[i], err, errlen);
        if (!rc && (L->wk.dtype != L->wq.dtype || L->wv.dtype != L->wq.dtype || L->w_up.dtype != L->w_gate.dtype))
            rc = kipp_err(err, errlen, KIPP_ENOTSUP, "layer %u mixes formats inside Q|K|V (%u %u %u) or Gate|Up (%u %u); "
                          "expected one format per fused projection", l, L->wq.dtype, L->wk.dtype, L->wv.dtype,
                          L->w_gate.dtype, L->w_up.dtype);
    }
    return rc;
}

static int cpu_model_create(const kipp_model_view *v, void **out, char *err, size_t errlen)
{
    *out = NULL;
    int rc = check_view(v, err, errlen);
    if (rc) return rc;
    cpu_model *m = calloc(1, sizeof *m);
    if (!m) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for the cpu backend model");
    m->d = v->dims;
    m->w = v->w;
    m->kv_q8 = v->kv_type == 1; /* KIPP_KV_Q8_0; the engine checked the range */
    choose_kernels(m);
    rc = choose_bf16_read(m, err, errlen);
    if (rc) { cpu_model_destroy(m); return rc; }
    rc = kipp_threadpool_create(v->n_threads, &m->pool, err, errlen);
    if (rc) { cpu_model_destroy(m); return rc; }
    m->nth = kipp_threadpool_size(m->pool);
    m->A = (size_t)m->d.n_q_head * KIPP_HEAD_DIM;
    m->QKV = m->A + 2 * KIPP_N_KV_HEAD * KIPP_HEAD_DIM;
    if (v->stream) {
        if ((rc = kipp_cpu_stream_create(m, v, err, errlen))) { cpu_model_destroy(m); return rc; }
    } else if (pack_weights(m)) {
        cpu_model_destroy(m);
        return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for the packed weight copy of the %u-layer model", v->dims.n_layer);
    }
    if (alloc_scratch(m)) {
        size_t need = m->scratch_bytes;
        cpu_model_destroy(m);
        return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for %zu bytes of cpu round scratch", need);
    }
    k_rope_table_yarn(m->rope, m->d.context_length, m->d.rope_theta, &m->d.rope_yarn);
    *out = m;
    return 0;
}

static void cpu_model_destroy(void *bm)
{
    cpu_model *m = bm;
    if (!m) return;
    kipp_threadpool_destroy(m->pool);
    kipp_cpu_stream_destroy(m->st);
    kipp_kv_store_free(&m->slab);
    float *f[] = {m->x, m->xn, m->qkv, m->att, m->tmp, m->gu, m->sw, m->head_tmp, m->tile_buf, m->att1, m->lane_ml, m->rope};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) kipp_aligned_free(f[i]);
    kipp_aligned_free(m->xa);
    free(m->packed);
    free(m->lw);
    free(m->row_item);
    free(m->row_pos);
    free(m->row_tok);
    free(m->lrow);
    free(m->ldst);
    free(m->lhid);
    free(m->tile_r0);
    free(m->tile_n);
    free(m);
}

/* Sessions and the pool are sized by the engine, which has validated the
 * capacity (1..context, kipp_session_create) and the pool (one, >= 1 block,
 * before any session, engine/session_pool.c): these asserts keep the
 * backend's own invariants only. */
static void assert_n_blocks(const cpu_model *m, uint32_t n_blocks)
{
    KIPP_ASSERT(n_blocks >= 1 && n_blocks <= (m->d.context_length + KIPP_KV_BLOCK - 1) / KIPP_KV_BLOCK);
}

static int cpu_session_create(void *bm, uint32_t n_blocks, void **out, char *err, size_t errlen)
{
    cpu_model *m = bm;
    *out = NULL;
    assert_n_blocks(m, n_blocks);
    cpu_session *s = calloc(1, sizeof *s);
    if (!s || kipp_kv_store_alloc(&s->kv, m->d.n_layer, n_blocks, m->kv_q8, 0)) {
        free(s);
        return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for %zu bytes of KV (%u blocks)",
                        kipp_kv_store_bytes(m->d.n_layer, n_blocks, m->kv_q8), n_blocks);
    }
    s->m = m;
    s->n_blocks = n_blocks;
    *out = s;
    return 0;
}

static void cpu_session_destroy(void *bs)
{
    cpu_session *s = bs;
    if (!s) return;
    if (!s->pooled) kipp_kv_store_free(&s->kv);
    free(s);
}

/* The model's shared slab (seed 000 "Cross-session prefix sharing"). */
static int cpu_pool_create(void *bm, uint32_t n_blocks, char *err, size_t errlen)
{
    cpu_model *m = bm;
    KIPP_ASSERT(!m->slab.k && n_blocks >= 1);
    if (kipp_kv_store_alloc(&m->slab, m->d.n_layer, n_blocks, m->kv_q8, 0))
        return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for a KV pool of %u blocks (%zu bytes)", n_blocks,
                        kipp_kv_store_bytes(m->d.n_layer, n_blocks, m->kv_q8));
    return 0;
}

static int cpu_session_create_pooled(void *bm, uint32_t n_blocks, void **out, char *err, size_t errlen)
{
    cpu_model *m = bm;
    *out = NULL;
    KIPP_ASSERT(m->slab.k);
    assert_n_blocks(m, n_blocks);
    cpu_session *s = calloc(1, sizeof *s);
    if (!s) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for a pooled session");
    *s = (cpu_session){m, n_blocks, m->slab, 1};
    *out = s;
    return 0;
}

static void *cpu_pool_block_seg(void *bm, uint32_t b, uint32_t seg, size_t *bytes)
{
    cpu_model *m = bm;
    KIPP_ASSERT(b < m->slab.n_blocks && seg < 2 * m->slab.n_layer);
    return kipp_kv_store_block_seg(&m->slab, b, seg, bytes);
}

static void cpu_pool_copy_block(void *bm, uint32_t src, uint32_t dst)
{
    cpu_model *m = bm;
    KIPP_ASSERT(src < m->slab.n_blocks && dst < m->slab.n_blocks && src != dst);
    kipp_kv_store_copy_block(&m->slab, src, dst);
}

/* The engine has validated the items (engine/session.c, engine/backend.h);
 * what stays is this backend's own invariant, that every row lands inside
 * the session's KV. */
static void assert_items(const cpu_model *m, const kipp_eval_item *items, size_t n)
{
    KIPP_ASSERT(items && n);
    for (size_t i = 0; i < n; i++) {
        const cpu_session *s = items[i].session;
        KIPP_ASSERT(s && s->m == m && (uint64_t)items[i].start_position + items[i].token_count <= (uint64_t)s->n_blocks * KIPP_KV_BLOCK);
    }
}

/* Cut the round's rows into prefill query tiles: runs of consecutive rows of
 * one item, at most tile_tokens long. Decode rounds (one row per item) keep
 * per-row units (n_tiles = 0). Either way each query walks its positions
 * alike, so the choice is speed only. */
static void tile_round(cpu_round *r)
{
    cpu_model *m = r->m;
    r->n_tiles = 0;
    int multi = 0; /* some item has 2+ rows here: tiles share its prefix walk; else rows mode */
    for (uint32_t i = 1; i < r->n_rows && !multi; i++) multi = m->row_item[i] == m->row_item[i - 1];
    if (!multi) return;
    for (uint32_t i = 0; i < r->n_rows;) {
        uint32_t n = 1;
        while (i + n < r->n_rows && n < m->tile_tokens && m->row_item[i + n] == m->row_item[i]) n++;
        m->tile_r0[r->n_tiles] = i;
        m->tile_n[r->n_tiles++] = n;
        i += n;
    }
}

/* Fill the next round from the (item, offset) cursor; returns rows taken. */
static uint32_t pack_round(cpu_round *r, const kipp_eval_item *items, size_t n, size_t *ci, uint32_t *co)
{
    cpu_model *m = r->m;
    uint32_t rows = 0, nl = 0, nh = 0, R = KIPP_CPU_ROUND_TOKENS;
    while (*ci < n && rows < R) {
        const kipp_eval_item *it = &items[*ci];
        uint32_t o = *co, first_logit = it->token_count - it->logits_count;
        float *hid = o + 1 == it->token_count ? it->hidden : NULL;
        m->row_item[rows] = (uint32_t)*ci;
        m->row_pos[rows] = it->start_position + o;
        m->row_tok[rows] = it->tokens[o];
        if (o >= first_logit) {
            m->lrow[nl] = rows;
            m->lhid[nl] = hid;
            m->ldst[nl++] = it->logits + (size_t)(o - first_logit) * m->d.vocab_size;
        } else if (hid) { /* hidden only: parked at the end (nl + nh <= rows <= R), moved behind the logits below */
            m->lrow[R - 1 - nh] = rows;
            m->lhid[R - 1 - nh++] = hid;
        }
        rows++;
        if (++*co == it->token_count) { (*ci)++; *co = 0; }
    }
    for (uint32_t k = 0; k < nh; k++) {
        m->lrow[nl + k] = m->lrow[R - 1 - k];
        m->lhid[nl + k] = m->lhid[R - 1 - k];
    }
    r->n_rows = rows;
    r->n_logits = nl;
    r->n_hidden = nh;
    r->head_direct = 1;
    for (uint32_t j = 1; j < nl; j++)
        if (m->ldst[j] != m->ldst[0] + (size_t)j * m->d.vocab_size) r->head_direct = 0;
    tile_round(r);
    return rows;
}

static int cpu_eval(void *bm, kipp_eval_item *items, size_t n, char *err, size_t errlen)
{
    cpu_model *m = bm;
    (void)err, (void)errlen;
    assert_items(m, items, n);
    cpu_round r;
    memset(&r, 0, sizeof r);
    r.m = m;
    r.items = items;
    size_t ci = 0;
    uint32_t co = 0;
    while (pack_round(&r, items, n, &ci, &co) > 0) kipp_threadpool_run(m->pool, kipp_cpu_forward_round, &r);
    return 0;
}

/* The merged kernel table, one line per slot with the level it came from
 * (kernels/cpu/dispatch.c), then the schedule and the prepared bytes. */
static void cpu_describe(void *bm, char *out, size_t outlen)
{
    const cpu_model *m = bm;
    size_t o = 0;
    if (outlen == 0) return;
    out[0] = '\0';
#define PUT(...) do { if (o < outlen) o += (size_t)snprintf(out + o, outlen - o, __VA_ARGS__); } while (0)
    PUT("backend cpu: kernel level %s (%s)\n", m->k->isa, m->isa_note[0] ? m->isa_note : "best level this CPU has");
    if (o < outlen) k_cpu_ops_describe(m->isa, out + o, outlen - o);
    o += strlen(out + o);
    /* the read formats plan_layer gave layer 0 (every layer alike), so a
     * q8_0 model says q8_0 whatever the bf16 mode */
    const cpu_layer *L0 = &m->lw[0];
    const k_weight *ws[5] = {&L0->qkv, &L0->o, &L0->gu, &L0->down, &m->head};
    static const char *const proj[5] = {"q|k|v", "o", "gate|up", "down", "head"};
    PUT("projections read as (KIPP_BF16_ACT=%s):", m->bf16_mode);
    for (int w = 0; w < 5; w++) {
        const k_fmt_info *fi = k_fmt_get(ws[w]->fmt);
        PUT("%s %s %s/%s", w ? "," : "", proj[w], fi->name, k_act_name(fi->act));
    }
    PUT(" (format/activations)\n");
    PUT("threads: %d (%s)\n", m->nth, kipp_threadpool_pinning(m->pool));
    const char *att = m->kv_q8 ? "q8_0" : m->flash_gqa == m->k->flash_gqa_bf16 ? "bf16" : "dot";
    PUT("KV cache: %s (%zu bytes per position per layer, K and V)\n", m->kv_q8 ? "q8_0" : "bf16",
        2 * kipp_kv_row_bytes(m->kv_q8));
    PUT("paths: decode = the format's matvec, prefill = its tiled matmul (same per-row arithmetic); attention "
        "k_flash_gqa_%s in %u-token query tiles (prefill), k_flash_rows_%s per page of each lane (decode), "
        "two walks per query (even and odd pages, merged) in %u-position chunks either way%s\n", att, m->tile_tokens, att,
        K_ATTN_CHUNK, *att == 'd' ? "; q and the softmax weights rounded to BF16 for vdpbf16ps" : "");
    if (m->st && o < outlen) kipp_cpu_stream_describe(m, out + o, outlen - o), o += strlen(out + o);
    else PUT("prepared weights: %zu bytes (packed copy of every projection and the head in its format's layout, owned by the backend; "
             "the file pages it replaces are released after packing)\n", m->prepared_bytes);
    PUT("round: %u tokens; scratch %zu bytes\n", KIPP_CPU_ROUND_TOKENS, m->scratch_bytes);
#undef PUT
}

const kipp_backend_ops cpu_backend_ops = {
    .name = "cpu",
    .model_create = cpu_model_create,
    .model_destroy = cpu_model_destroy,
    .session_create = cpu_session_create,
    .session_destroy = cpu_session_destroy,
    .eval = cpu_eval,
    .describe = cpu_describe,
    .pool_create = cpu_pool_create,
    .session_create_pooled = cpu_session_create_pooled,
    .pool_copy_block = cpu_pool_copy_block,
    .pool_block_seg = cpu_pool_block_seg,
    .packs_weights = 1, /* pack_weights: projections and head repacked; forward reads embd and norms only */
};
