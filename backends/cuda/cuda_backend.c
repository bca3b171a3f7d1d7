/*
 * cuda_backend.c - the "cuda" backend (seed 000, phase 4 "CUDA"):
 * the Qwen3 forward of backends/cpu/ref_backend.c composed from the kernel
 * units of kernels/cuda/kcuda.h, behind the same kipp_backend_ops contract.
 *
 *   - Weights are uploaded once at model_create into one device allocation
 *     and never read through the views again (packs_weights = 1).
 *   - KV lives in device memory in the engine's paged layout, one arena per
 *     model ([layer][block*32+i][8][128] bf16 K and V), so one kernel launch
 *     addresses every sequence of a batch: a private session owns a range of
 *     arena blocks (its block table entries are offset by the range start),
 *     a pooled model's arena is the slab and block tables index it directly.
 *     The arena grows (copy to a larger one) when a new private session does
 *     not fit; pooled slabs are fixed.
 *   - eval interleaves the rows of all items into rounds of up to CU_ROUND
 *     token rows, so a step reads the weights once for every sequence; each
 *     row carries its position and block table (kc_rows), and only the rows
 *     that need logits are gathered, normed and sent through the head.
 *   - A decode step (every item one token, at most CU_GRAPH_MAX items) runs
 *     as a CUDA graph captured once per batch size (at its second step; the
 *     first runs eagerly): its per-row metadata sits in fixed device buffers
 *     that are refreshed before each launch. KIPP_CUDA_GRAPHS=0 disables them;
 *     a failed capture disables them for the model and says why in describe.
 *   - Fewer launches per layer (decode of small models is launch-bound): the
 *     residual add and the next RMSNorm are one kernel (kb_add_rmsnorm,
 *     backends/cuda/cuda_util.cu), and a one-row step projects Q|K|V and
 *     Gate|Up with one matvec each and ropes Q|K in one launch.
 *   - Every CUDA failure becomes a sentence in err (no device, out of device
 *     memory with the numbers, unsupported dtype), never an abort.
 *
 * The engine serialises calls on one model (as for the other backends); the
 * backend uses one stream and synchronises before eval returns.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/cuda_util.h"
#include "base/errbuf.h"
#include "engine/backend.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cuda/kcuda.h"

static int fail(char *err, size_t errlen, int code, const char *fmt, const char *a, const char *b)
{
    if (err && errlen) snprintf(err, errlen, fmt, a, b);
    return code;
}

/* A sticky error (illegal address, launch failure, ...) poisons the context:
 * remember it so later calls report it instead of computing garbage. */
int cu_report_cuda(cu_model *m, cudaError_t e, const char *what, char *err, size_t errlen)
{
    int sticky = e == cudaErrorIllegalAddress || e == cudaErrorLaunchFailure ||
                 e == cudaErrorIllegalInstruction || e == cudaErrorMisalignedAddress ||
                 e == cudaErrorHardwareStackError || e == cudaErrorInvalidPc ||
                 e == cudaErrorAssert || e == cudaErrorECCUncorrectable;
    if (err && errlen)
        snprintf(err, errlen, "cuda backend: %s failed: %s (%s)%s", what, cudaGetErrorString(e), cudaGetErrorName(e),
                 sticky ? "; the device context is unusable, reopen the model" : "");
    if (m && sticky && !m->broken[0])
        snprintf(m->broken, sizeof m->broken, "%s failed earlier: %s", what, cudaGetErrorName(e));
    (void)cudaGetLastError(); /* clear a non-sticky error */
    return e == cudaErrorMemoryAllocation ? KIPP_ENOMEM : KIPP_EBACKEND;
}

/* ---------------------------------------------------------------- model */

void cu_destroy_graphs(cu_model *m)
{
    for (uint32_t i = 0; i <= CU_GRAPH_MAX; i++)
        if (m->graph[i]) {
            cudaGraphExecDestroy(m->graph[i]);
            m->graph[i] = NULL;
        }
}

static void cu_model_destroy(void *bm)
{
    cu_model *m = bm;
    if (!m) return;
    cudaSetDevice(m->device);
    if (m->st) cudaStreamSynchronize(m->st);
    cu_destroy_graphs(m);
    void *dev[] = {m->warena, m->rope, m->x, m->xn, m->q, m->k, m->v, m->att, m->tmp, m->gate, m->up,
                   m->xl, m->logits, m->meta_d, m->kc, m->vc};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) cudaFree(dev[i]);
    void *host[] = {m->meta_h};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        if (host[i]) cudaFreeHost(host[i]);
    if (m->st) cudaStreamDestroy(m->st);
    free(m->ldst);
    free(m->ranges);
    free(m->L);
    free(m);
}

static const char *dtype_name(uint32_t t)
{
    switch (t) {
    case KIPP_DTYPE_BF16: return "bf16";
    case KIPP_DTYPE_Q8_0: return "q8_0";
    case KIPP_DTYPE_Q4_1: return "affine4_gs32 (Q4_1)";
    case KIPP_DTYPE_F32: return "f32";
    default: return "unknown";
    }
}

/* The engine checked the view's shape (kipp_view_check, engine/view_check.c);
 * what stays is what the CUDA kernels take: BF16 norms and embedding, and
 * projections and head in BF16, Q8_0 or Q4_1 (KIPP_ENOTSUP otherwise). */
static int check_dtype(const kipp_tensor_view *t, const char *name, int weight, char *err, size_t errlen)
{
    if (t->dtype == KIPP_DTYPE_BF16 || (weight && (t->dtype == KIPP_DTYPE_Q8_0 || t->dtype == KIPP_DTYPE_Q4_1)))
        return 0;
    if (err)
        snprintf(err, errlen, "cuda backend: tensor %s has dtype %u (%s), which the CUDA kernels do not take; expected %s",
                 name, t->dtype, dtype_name(t->dtype), weight ? "bf16, q8_0 or affine4_gs32 (Q4_1)" : "bf16");
    return KIPP_ENOTSUP;
}

static int check_view(const kipp_model_view *mv, char *err, size_t errlen)
{
    int rc = check_dtype(&mv->w.token_embd, "token_embd", 0, err, errlen);
    if (!rc) rc = check_dtype(&mv->w.output_norm, "output_norm", 0, err, errlen);
    if (!rc) rc = check_dtype(&mv->w.output, "output", 1, err, errlen);
    for (uint32_t i = 0; !rc && i < mv->dims.n_layer; i++) {
        const kipp_qwen3_layer *L = &mv->w.layers[i];
        const kipp_tensor_view *t[] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->q_norm, &L->k_norm,
                                       &L->wo, &L->ffn_norm, &L->w_gate, &L->w_up, &L->w_down};
        static const char *const names[] = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm",
                                            "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"};
        static const int weight[] = {0, 1, 1, 1, 0, 0, 1, 0, 1, 1, 1};
        for (size_t j = 0; !rc && j < sizeof t / sizeof t[0]; j++) rc = check_dtype(t[j], names[j], weight[j], err, errlen);
    }
    return rc;
}

/* The weight arena: every tensor at a 256-byte aligned offset. Pass 1 (base
 * NULL) only sizes it; pass 2 records device pointers and copies. */
typedef struct {
    char *base;
    size_t off;
    cudaError_t e;
} cu_upload;

static const void *put(cu_upload *u, const kipp_tensor_view *t)
{
    size_t at = u->off;
    u->off += (t->nbytes + 255) & ~(size_t)255;
    if (!u->base) return NULL;
    if (u->e == cudaSuccess) u->e = cudaMemcpy(u->base + at, t->data, t->nbytes, cudaMemcpyHostToDevice);
    return u->base + at;
}

static cu_w put_w(cu_upload *u, const kipp_tensor_view *t)
{
    return (cu_w){put(u, t), t->dtype, (uint32_t)t->rows, (uint32_t)t->cols, (size_t)t->nbytes};
}

/* b starts where a ends (no alignment padding between them), same dtype and width. */
static int adjacent(const cu_w *a, const cu_w *b)
{
    return a->dtype == b->dtype && a->cols == b->cols && (const char *)a->p + a->bytes == (const char *)b->p;
}

static void upload_all(cu_model *m, const kipp_model_view *mv, cu_upload *u)
{
    const kipp_qwen3_weights *w = &mv->w;
    m->embd = put_w(u, &w->token_embd);
    m->out_norm = put(u, &w->output_norm);
    m->out = w->output.data == w->token_embd.data ? m->embd : put_w(u, &w->output); /* tied: one copy */
    for (uint32_t l = 0; l < m->d.n_layer; l++) {
        const kipp_qwen3_layer *S = &w->layers[l];
        cu_layer *L = &m->L[l];
        L->attn_norm = put(u, &S->attn_norm);
        L->q_norm = put(u, &S->q_norm);
        L->k_norm = put(u, &S->k_norm);
        L->ffn_norm = put(u, &S->ffn_norm);
        L->wq = put_w(u, &S->wq);
        L->wk = put_w(u, &S->wk);
        L->wv = put_w(u, &S->wv);
        L->wo = put_w(u, &S->wo);
        L->gate = put_w(u, &S->w_gate);
        L->up = put_w(u, &S->w_up);
        L->down = put_w(u, &S->w_down);
        L->qkv_fused = u->base && adjacent(&L->wq, &L->wk) && adjacent(&L->wk, &L->wv);
        L->gu_fused = u->base && adjacent(&L->gate, &L->up);
    }
}

static cudaError_t dalloc(void **p, size_t bytes, size_t *total)
{
    *total += bytes;
    return cudaMalloc(p, bytes);
}

static int cu_model_create(const kipp_model_view *mv, void **backend_model, char *err, size_t errlen)
{
    *backend_model = NULL;
    if (mv->kv_type != 0) { /* KIPP_KV_BF16 only: its KV kernels read BF16 rows */
        if (err)
            snprintf(err, errlen, "cuda backend: --kv-type q8_0 is not supported (its KV cache is bf16 only); use "
                     "--kv-type bf16, or --backend cpu for a q8_0 KV cache");
        return KIPP_ENOTSUP;
    }
    int n_dev = 0;
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || n_dev == 0) {
        if (err)
            snprintf(err, errlen,
                     "cuda backend: no CUDA device available (cudaGetDeviceCount: %s); this machine has no "
                     "usable NVIDIA GPU or driver, use --backend cpu",
                     e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        (void)cudaGetLastError();
        return KIPP_EBACKEND;
    }
    int rc = check_view(mv, err, errlen);
    if (rc) return rc;
    cu_model *m = calloc(1, sizeof *m);
    if (!m) return fail(err, errlen, KIPP_ENOMEM, "cuda backend: out of host memory%s%s", "", "");
    m->d = mv->dims;
    m->A = m->d.n_q_head * KIPP_HEAD_DIM;
    m->max_blocks = (m->d.context_length + KIPP_KV_BLOCK - 1) / KIPP_KV_BLOCK;
    const char *dev_env = getenv("KIPP_CUDA_DEVICE");
    m->device = dev_env ? atoi(dev_env) : 0;
    if (m->device < 0 || m->device >= n_dev) {
        if (err)
            snprintf(err, errlen, "cuda backend: KIPP_CUDA_DEVICE=%s, expected 0..%d (%d device%s)", dev_env,
                     n_dev - 1, n_dev, n_dev == 1 ? "" : "s");
        free(m);
        return KIPP_EINVAL;
    }
    struct cudaDeviceProp prop;
    if ((e = cudaSetDevice(m->device)) != cudaSuccess || (e = cudaGetDeviceProperties(&prop, m->device)) != cudaSuccess) {
        rc = cu_report_cuda(NULL, e, "selecting the device", err, errlen);
        free(m);
        return rc;
    }
    snprintf(m->dev_name, sizeof m->dev_name, "%s", prop.name);
    m->cc_major = prop.major;
    m->cc_minor = prop.minor;
    m->n_sm = prop.multiProcessorCount;
    m->dev_total = prop.totalGlobalMem;
    m->graphs_off = getenv("KIPP_CUDA_GRAPHS") && !strcmp(getenv("KIPP_CUDA_GRAPHS"), "0");
    if (m->graphs_off) snprintf(m->graph_note, sizeof m->graph_note, "KIPP_CUDA_GRAPHS=0");
    m->fuse = !(getenv("KIPP_CUDA_FUSE") && !strcmp(getenv("KIPP_CUDA_FUSE"), "0"));
    m->L = calloc(m->d.n_layer, sizeof *m->L);
    m->ldst = calloc(CU_ROUND, sizeof *m->ldst);
    m->bt_cap = (size_t)CU_ROUND * m->max_blocks;
    if (!m->L || !m->ldst) {
        cu_model_destroy(m);
        return fail(err, errlen, KIPP_ENOMEM, "cuda backend: out of host memory%s%s", "", "");
    }

    /* What it needs, against what the device has free, before allocating. */
    cu_upload u = {0};
    upload_all(m, mv, &u);
    size_t D = m->d.d_model, F = m->d.d_ff, A = m->A, V = m->d.vocab_size;
    size_t n_pos = (size_t)m->max_blocks * KIPP_KV_BLOCK;
    size_t act = ((3 * D + 2 * A + 2 * CU_KV_WIDTH + 2 * F + D) * CU_ROUND + CU_HEAD_ROWS * V) * sizeof(float);
    size_t meta = 4 * CU_ROUND * sizeof(int32_t) + m->bt_cap * sizeof(uint32_t);
    size_t need = u.off + act + meta + n_pos * KIPP_HEAD_DIM * sizeof(float);
    size_t free_b = 0, total_b = 0;
    if ((e = cudaMemGetInfo(&free_b, &total_b)) != cudaSuccess) {
        rc = cu_report_cuda(NULL, e, "cudaMemGetInfo", err, errlen);
        cu_model_destroy(m);
        return rc;
    }
    if (need > free_b) {
        if (err)
            snprintf(err, errlen,
                     "cuda backend: out of device memory: the model needs %.0f MiB (weights %.0f MiB, activations "
                     "and tables %.0f MiB) but %s (device %d) has %.0f MiB free of %.0f MiB",
                     CU_MIB(need), CU_MIB(u.off), CU_MIB(need - u.off), m->dev_name, m->device, CU_MIB(free_b),
                     CU_MIB(total_b));
        cu_model_destroy(m);
        return KIPP_ENOMEM;
    }
    size_t tot = 0;
    const char *what = "cudaStreamCreate";
    e = cudaStreamCreateWithFlags(&m->st, cudaStreamNonBlocking);
    if (!e) what = "allocating the weights", e = dalloc(&m->warena, u.off, &tot);
    if (!e) {
        what = "uploading the weights";
        m->wbytes = u.off;
        u = (cu_upload){.base = m->warena};
        upload_all(m, mv, &u);
        e = u.e;
    }
    float **act_bufs[] = {&m->x, &m->xn, &m->tmp, &m->xl};
    for (size_t i = 0; !e && i < sizeof act_bufs / sizeof act_bufs[0]; i++)
        what = "allocating activations", e = dalloc((void **)act_bufs[i], CU_ROUND * D * sizeof(float), &tot);
    if (!e) e = dalloc((void **)&m->q, CU_ROUND * A * sizeof(float), &tot);
    if (!e) e = dalloc((void **)&m->att, CU_ROUND * A * sizeof(float), &tot);
    if (!e) e = dalloc((void **)&m->k, CU_ROUND * CU_KV_WIDTH * sizeof(float), &tot);
    if (!e) e = dalloc((void **)&m->v, CU_ROUND * CU_KV_WIDTH * sizeof(float), &tot);
    if (!e) e = dalloc((void **)&m->gate, CU_ROUND * F * sizeof(float), &tot);
    if (!e) e = dalloc((void **)&m->up, CU_ROUND * F * sizeof(float), &tot);
    if (!e) e = dalloc((void **)&m->logits, CU_HEAD_ROWS * V * sizeof(float), &tot);
    if (!e) e = dalloc(&m->meta_d, meta, &tot);
    if (!e) what = "allocating pinned host staging", e = cudaMallocHost(&m->meta_h, meta);
    if (!e) {
        m->tok_d = m->meta_d;
        m->pos_d = (int32_t *)(m->tok_d + CU_ROUND);
        m->btoff_d = m->pos_d + CU_ROUND;
        m->lidx_d = m->btoff_d + CU_ROUND;
        m->bt_d = (uint32_t *)(m->lidx_d + CU_ROUND);
        m->tok_h = m->meta_h;
        m->pos_h = (int32_t *)(m->tok_h + CU_ROUND);
        m->btoff_h = m->pos_h + CU_ROUND;
        m->lidx_h = m->btoff_h + CU_ROUND;
        m->bt_h = (uint32_t *)(m->lidx_h + CU_ROUND);
    }
    if (!e) {
        /* RoPE: the host table, so angles round exactly as on the CPU (kcuda.h kc_rope). */
        what = "uploading the RoPE table";
        float *cs = malloc(n_pos * KIPP_HEAD_DIM * sizeof(float));
        if (!cs) {
            cu_model_destroy(m);
            return fail(err, errlen, KIPP_ENOMEM, "cuda backend: out of host memory for the RoPE table%s%s", "", "");
        }
        k_rope_table_yarn(cs, n_pos, m->d.rope_theta, &m->d.rope_yarn);
        e = dalloc((void **)&m->rope, n_pos * KIPP_HEAD_DIM * sizeof(float), &tot);
        if (!e) e = cudaMemcpy(m->rope, cs, n_pos * KIPP_HEAD_DIM * sizeof(float), cudaMemcpyHostToDevice);
        free(cs);
    }
    if (e) {
        if (e == cudaErrorMemoryAllocation && err) {
            size_t fb = 0, tb = 0;
            (void)cudaGetLastError();
            cudaMemGetInfo(&fb, &tb);
            snprintf(err, errlen,
                     "cuda backend: out of device memory %s: the model needs %.0f MiB (weights %.0f MiB), %.0f MiB "
                     "were allocated, %s (device %d) has %.0f MiB free of %.0f MiB",
                     what, CU_MIB(need), CU_MIB(u.off), CU_MIB(tot), m->dev_name, m->device, CU_MIB(fb), CU_MIB(tb));
            rc = KIPP_ENOMEM;
        } else
            rc = cu_report_cuda(NULL, e, what, err, errlen);
        cu_model_destroy(m);
        return rc;
    }
    m->scratch_bytes = tot - m->wbytes;
    *backend_model = m;
    return 0;
}

static void cu_describe(void *bm, char *out, size_t outlen)
{
    cu_model *m = bm;
    snprintf(out, outlen,
             "cuda: device %d %s (sm_%d%d, %d SMs, %.0f MiB)\n"
             "cuda: weights resident %.0f MiB (embedding %s, head %s, layer-0 projections %s), scratch %.0f MiB\n"
             "cuda: rounds of up to %u token rows, items interleaved; logits rows through the head %u at a time\n"
             "cuda: decode graphs for batches of 1..%u rows: %s%s%s\n"
             "cuda: one-row steps: Q|K|V and Gate|Up as one matvec each: %s\n",
             m->device, m->dev_name, m->cc_major, m->cc_minor, m->n_sm, CU_MIB(m->dev_total), CU_MIB(m->wbytes),
             dtype_name(m->embd.dtype), dtype_name(m->out.dtype), dtype_name(m->L[0].wq.dtype),
             CU_MIB(m->scratch_bytes), CU_ROUND, CU_HEAD_ROWS, CU_GRAPH_MAX, m->graphs_off ? "off" : "on",
             m->graph_note[0] ? ", " : "", m->graph_note,
             !m->fuse ? "off (KIPP_CUDA_FUSE=0)" : m->L[0].qkv_fused && m->L[0].gu_fused ? "on" : "off (weights not adjacent)");
}

/* ---------------------------------------------------------------- KV arena */

static size_t arena_bytes(const cu_model *m, uint32_t blocks)
{
    return (size_t)m->d.n_layer * blocks * CU_BLOCK_ELEMS * sizeof(uint16_t);
}

static int arena_err(cu_model *m, uint32_t blocks, const char *what, char *err, size_t errlen)
{
    size_t fb = 0, tb = 0;
    (void)cudaGetLastError();
    cudaMemGetInfo(&fb, &tb);
    if (err)
        snprintf(err, errlen,
                 "cuda backend: out of device memory %s: K and V of %u blocks of 32 positions need %.0f MiB, %s "
                 "(device %d) has %.0f MiB free of %.0f MiB (weights %.0f MiB, KV arena now %u blocks)",
                 what, blocks, CU_MIB(2 * arena_bytes(m, blocks)), m->dev_name, m->device, CU_MIB(fb), CU_MIB(tb),
                 CU_MIB(m->wbytes), m->kv_blocks);
    return KIPP_ENOMEM;
}

/* Resize the arena to blocks (> kv_blocks), keeping every layer's existing
 * blocks; the new tail is zeroed. Graphs hold the old pointers: dropped. */
static int arena_grow(cu_model *m, uint32_t blocks, char *err, size_t errlen)
{
    uint16_t *k = NULL, *v = NULL;
    size_t bytes = arena_bytes(m, blocks);
    cudaError_t e = cudaMalloc((void **)&k, bytes);
    if (!e) e = cudaMalloc((void **)&v, bytes);
    if (e == cudaErrorMemoryAllocation) {
        if (k) cudaFree(k);
        return arena_err(m, blocks, "for the KV cache", err, errlen);
    }
    if (!e) e = cudaMemsetAsync(k, 0, bytes, m->st);
    if (!e) e = cudaMemsetAsync(v, 0, bytes, m->st);
    if (!e && m->kv_blocks) {
        size_t old_pitch = (size_t)m->kv_blocks * CU_BLOCK_ELEMS * sizeof(uint16_t);
        size_t new_pitch = (size_t)blocks * CU_BLOCK_ELEMS * sizeof(uint16_t);
        e = cudaMemcpy2DAsync(k, new_pitch, m->kc, old_pitch, old_pitch, m->d.n_layer, cudaMemcpyDeviceToDevice, m->st);
        if (!e) e = cudaMemcpy2DAsync(v, new_pitch, m->vc, old_pitch, old_pitch, m->d.n_layer, cudaMemcpyDeviceToDevice, m->st);
    }
    if (!e) e = cudaStreamSynchronize(m->st);
    if (e) {
        if (k) cudaFree(k);
        if (v) cudaFree(v);
        return cu_report_cuda(m, e, "growing the KV arena", err, errlen);
    }
    cu_destroy_graphs(m);
    if (m->kc) cudaFree(m->kc);
    if (m->vc) cudaFree(m->vc);
    m->kc = k;
    m->vc = v;
    m->kv_blocks = blocks;
    return 0;
}

/* First fit among the private ranges (sorted by start); grow the arena when none fits. */
static int range_alloc(cu_model *m, uint32_t len, uint32_t *start, char *err, size_t errlen)
{
    uint32_t at = 0;
    size_t i = 0;
    for (; i < m->n_ranges; i++) {
        if (m->ranges[i].start - at >= len) break;
        at = m->ranges[i].start + m->ranges[i].len;
    }
    if (i == m->n_ranges && m->kv_blocks - at < len) {
        uint64_t want = (uint64_t)at + len, dbl = 2 * (uint64_t)m->kv_blocks;
        uint64_t limit = 0xffffffffu / 2;
        if (want > limit)
            return fail(err, errlen, KIPP_ERANGE, "cuda backend: the KV arena would exceed 2^31 blocks%s%s", "", "");
        int rc = arena_grow(m, (uint32_t)(dbl > want && dbl <= limit ? dbl : want), err, errlen);
        if (rc == KIPP_ENOMEM && dbl > want) rc = arena_grow(m, (uint32_t)want, err, errlen);
        if (rc) return rc;
    }
    if (m->n_ranges == m->cap_ranges) {
        size_t cap = m->cap_ranges ? 2 * m->cap_ranges : 16;
        cu_range *r = realloc(m->ranges, cap * sizeof *r);
        if (!r) return fail(err, errlen, KIPP_ENOMEM, "cuda backend: out of host memory%s%s", "", "");
        m->ranges = r;
        m->cap_ranges = cap;
    }
    memmove(m->ranges + i + 1, m->ranges + i, (m->n_ranges - i) * sizeof *m->ranges);
    m->ranges[i] = (cu_range){at, len};
    m->n_ranges++;
    *start = at;
    return 0;
}

static void range_free(cu_model *m, uint32_t start)
{
    for (size_t i = 0; i < m->n_ranges; i++)
        if (m->ranges[i].start == start) {
            memmove(m->ranges + i, m->ranges + i + 1, (m->n_ranges - i - 1) * sizeof *m->ranges);
            m->n_ranges--;
            return;
        }
}

static int session_new(cu_model *m, uint32_t n_blocks, int pooled, void **backend_session, char *err, size_t errlen)
{
    *backend_session = NULL;
    KIPP_ASSERT(n_blocks >= 1 && n_blocks <= m->max_blocks); /* the engine sized it from a validated capacity */
    cu_session *s = calloc(1, sizeof *s);
    if (!s) return fail(err, errlen, KIPP_ENOMEM, "cuda backend: out of host memory%s%s", "", "");
    *s = (cu_session){m, n_blocks, 0, pooled};
    cudaSetDevice(m->device);
    if (!pooled) {
        int rc = range_alloc(m, n_blocks, &s->base, err, errlen);
        if (rc) {
            free(s);
            return rc;
        }
    }
    *backend_session = s;
    return 0;
}

static int cu_session_create(void *bm, uint32_t n_blocks, void **backend_session, char *err, size_t errlen)
{
    cu_model *m = bm;
    KIPP_ASSERT(!m->pooled); /* the engine makes pooled sessions of a pooled model */
    return session_new(m, n_blocks, 0, backend_session, err, errlen);
}

static void cu_session_destroy(void *bs)
{
    cu_session *s = bs;
    if (!s) return;
    if (!s->pooled) range_free(s->m, s->base);
    free(s);
}

static int cu_pool_create(void *bm, uint32_t n_blocks, char *err, size_t errlen)
{
    cu_model *m = bm;
    KIPP_ASSERT(!m->pooled && !m->n_ranges && n_blocks >= 1); /* one pool before any session: engine/session_pool.c */
    cudaSetDevice(m->device);
    if (m->kc) { /* an arena left by private sessions that are all gone */
        cu_destroy_graphs(m);
        cudaFree(m->kc);
        cudaFree(m->vc);
        m->kc = m->vc = NULL;
        m->kv_blocks = 0;
    }
    int rc = arena_grow(m, n_blocks, err, errlen);
    if (rc == KIPP_ENOMEM && err) {
        char tmp[512];
        snprintf(tmp, sizeof tmp, "%s; ask for a smaller pool (kipp-serve --kv-pool-mib)", err);
        snprintf(err, errlen, "%s", tmp);
    }
    if (!rc) m->pooled = 1;
    return rc;
}

static int cu_session_create_pooled(void *bm, uint32_t n_blocks, void **backend_session, char *err, size_t errlen)
{
    cu_model *m = bm;
    KIPP_ASSERT(m->pooled);
    return session_new(m, n_blocks, 1, backend_session, err, errlen);
}

static void cu_pool_copy_block(void *bm, uint32_t src, uint32_t dst)
{
    cu_model *m = bm;
    if (!m->pooled || src >= m->kv_blocks || dst >= m->kv_blocks || src == dst || m->broken[0]) return;
    cudaSetDevice(m->device);
    size_t blk = CU_BLOCK_ELEMS * sizeof(uint16_t), pitch = (size_t)m->kv_blocks * blk;
    cudaError_t e = cudaMemcpy2DAsync((char *)m->kc + dst * blk, pitch, (char *)m->kc + src * blk, pitch, blk,
                                      m->d.n_layer, cudaMemcpyDeviceToDevice, m->st);
    if (!e) e = cudaMemcpy2DAsync((char *)m->vc + dst * blk, pitch, (char *)m->vc + src * blk, pitch, blk,
                                  m->d.n_layer, cudaMemcpyDeviceToDevice, m->st);
    if (!e) e = cudaStreamSynchronize(m->st);
    if (e) { /* no error channel here: the next eval reports it */
        snprintf(m->broken, sizeof m->broken, "copying KV block %u to %u failed earlier: %s", src, dst,
                 cudaGetErrorName(e));
        (void)cudaGetLastError();
    }
}

const kipp_backend_ops cuda_backend_ops = {
    .name = "cuda",
    .model_create = cu_model_create,
    .model_destroy = cu_model_destroy,
    .session_create = cu_session_create,
    .session_destroy = cu_session_destroy,
    .eval = cu_eval,
    .describe = cu_describe,
    .pool_create = cu_pool_create,
    .session_create_pooled = cu_session_create_pooled,
    .pool_copy_block = cu_pool_copy_block,
    .packs_weights = 1,
};
