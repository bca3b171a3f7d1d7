/*
 * cuda_mock.c - a host-memory stand-in for the CUDA runtime calls and the
 * kcuda.h kernel units the CUDA backend uses, so its host logic (rounds of
 * interleaved items, block-table offsets of the KV arena, arena growth, the
 * pooled slab, logits rows, decode graphs captured per batch size and
 * replayed) runs on a machine without a GPU, in CI.
 *
 * "Device" memory is host memory; a stream runs each call at once; the
 * kernel units are the CPU *_ref kernels the ref backend uses, in the ref
 * backend's order, so build/cuda/kipp-cuda-gate-mock must match the ref
 * backend bitwise (NMSE 0). Stream capture records the kernel calls and
 * cudaGraphLaunch replays them. Not a CUDA emulator: only what
 * backends/cuda/cuda_backend.c calls, with the semantics it relies on.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backends/cuda/cuda_util.h"
#include "engine/backend.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cuda/kcuda.h"

/* ---- recorded kernel calls (stream capture) ---- */

typedef struct {
    void (*fn)(const void *args);
    unsigned char args[160];
} mock_call;

static int capturing;
static mock_call *rec;
static size_t n_rec, cap_rec;

typedef struct {
    mock_call *calls;
    size_t n;
} mock_graph;

static int run_or_record(void (*fn)(const void *), const void *args, size_t size)
{
    if (size > sizeof rec[0].args) return (int)cudaErrorInvalidValue;
    if (!capturing) {
        fn(args);
        return 0;
    }
    if (n_rec == cap_rec) {
        size_t cap = cap_rec ? 2 * cap_rec : 256;
        mock_call *r = realloc(rec, cap * sizeof *r);
        if (!r) return (int)cudaErrorMemoryAllocation;
        rec = r;
        cap_rec = cap;
    }
    rec[n_rec].fn = fn;
    memcpy(rec[n_rec].args, args, size);
    n_rec++;
    return 0;
}

/* ---- runtime ---- */

cudaError_t cudaGetDeviceCount(int *count)
{
    *count = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    (void)device;
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "mock (host memory)");
    prop->major = 9;
    prop->multiProcessorCount = 1;
    prop->totalGlobalMem = (size_t)64 << 30;
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total)
{
    *free_b = (size_t)32 << 30;
    *total = (size_t)64 << 30;
    return cudaSuccess;
}
const char *cudaGetErrorString(cudaError_t e) { return e ? "mock error" : "no error"; }
const char *cudaGetErrorName(cudaError_t e) { return e ? "cudaErrorMock" : "cudaSuccess"; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    (void)flags;
    *s = (cudaStream_t)malloc(1);
    return *s ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    free(s);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    (void)s;
    return capturing ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t n)
{
    *p = malloc(n ? n : 1);
    if (*p) memset(*p, 0xff, n); /* garbage, as device memory: the backend must not rely on zeros it did not write */
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaMallocHost(void **p, size_t n) { return cudaMalloc(p, n); }
cudaError_t cudaFree(void *p)
{
    free(p);
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void *p) { return cudaFree(p); }
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    (void)kind;
    if (capturing) return cudaErrorStreamCaptureUnsupported;
    memcpy(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s)
{
    (void)s;
    return cudaMemcpy(dst, src, n, kind);
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s)
{
    (void)s;
    if (capturing) return cudaErrorStreamCaptureUnsupported;
    memset(p, v, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind kind, cudaStream_t s)
{
    (void)kind;
    (void)s;
    if (capturing) return cudaErrorStreamCaptureUnsupported;
    if (width > dpitch || width > spitch) return cudaErrorInvalidPitchValue;
    for (size_t i = 0; i < height; i++) memmove((char *)dst + i * dpitch, (const char *)src + i * spitch, width);
    return cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    (void)s;
    (void)mode;
    if (capturing) return cudaErrorIllegalState;
    capturing = 1;
    n_rec = 0;
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g)
{
    (void)s;
    if (!capturing) return cudaErrorIllegalState;
    capturing = 0;
    mock_graph *mg = malloc(sizeof *mg);
    if (!mg) return cudaErrorMemoryAllocation;
    mg->calls = malloc((n_rec ? n_rec : 1) * sizeof *mg->calls);
    if (!mg->calls) {
        free(mg);
        return cudaErrorMemoryAllocation;
    }
    memcpy(mg->calls, rec, n_rec * sizeof *mg->calls);
    mg->n = n_rec;
    *g = (cudaGraph_t)mg;
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t g, unsigned long long flags)
{
    (void)flags;
    const mock_graph *src = (const mock_graph *)g;
    mock_graph *mg = malloc(sizeof *mg);
    if (!mg) return cudaErrorMemoryAllocation;
    mg->calls = malloc((src->n ? src->n : 1) * sizeof *mg->calls);
    if (!mg->calls) {
        free(mg);
        return cudaErrorMemoryAllocation;
    }
    memcpy(mg->calls, src->calls, src->n * sizeof *mg->calls);
    mg->n = src->n;
    *exec = (cudaGraphExec_t)mg;
    return cudaSuccess;
}
static void graph_free(void *p)
{
    mock_graph *mg = p;
    if (mg) free(mg->calls);
    free(mg);
}
cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
    graph_free(g);
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e)
{
    graph_free(e);
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s)
{
    (void)s;
    const mock_graph *mg = (const mock_graph *)e;
    for (size_t i = 0; i < mg->n; i++) mg->calls[i].fn(mg->calls[i].args);
    return cudaSuccess;
}

/* ---- kernel units: the ref backend's kernels, row by row ---- */

typedef struct { const void *table; uint32_t dtype; const uint32_t *tokens; uint32_t n, d; float *out; } embed_args;
static void embed_run(const void *p)
{
    const embed_args *a = p;
    for (uint32_t r = 0; r < a->n; r++) k_embed_bf16_ref(a->table, a->tokens[r], a->out + (size_t)r * a->d, a->d);
}
int kc_embed(const void *table, uint32_t dtype, const uint32_t *tokens, uint32_t n_rows, uint32_t d, float *out,
             cudaStream_t s)
{
    (void)s;
    if (dtype != KIPP_DTYPE_BF16) return (int)cudaErrorInvalidValue;
    embed_args a = {table, dtype, tokens, n_rows, d, out};
    return run_or_record(embed_run, &a, sizeof a);
}

typedef struct { const void *w; uint32_t dtype, out, in; const float *x; uint32_t n; float *y; } linear_args;
static void linear_run(const void *p)
{
    const linear_args *a = p;
    k_fmt_get((k_fmt)k_fmt_from_gguf(a->dtype))->linear_ref(a->w, a->x, a->y, a->out, a->in, a->n, 0, 1);
}
int kc_linear(const void *w, uint32_t dtype, uint32_t out, uint32_t in, const float *x, uint32_t n_rows, float *y,
              cudaStream_t s)
{
    (void)s;
    if (k_fmt_from_gguf(dtype) < 0 || n_rows == 0) return (int)cudaErrorInvalidValue;
    linear_args a = {w, dtype, out, in, x, n_rows, y};
    return run_or_record(linear_run, &a, sizeof a);
}

typedef struct { const uint16_t *w; const float *x; float *y; size_t n, dim; float eps; } rmsnorm_args;
static void rmsnorm_run(const void *p)
{
    const rmsnorm_args *a = p;
    k_rmsnorm_f32_ref(a->x, (const kipp_bf16 *)a->w, a->y, a->n, a->dim, a->eps);
}
int kc_rmsnorm(const uint16_t *w, const float *x, float *y, uint32_t n_rows, uint32_t dim, float eps, cudaStream_t s)
{
    (void)s;
    rmsnorm_args a = {w, x, y, n_rows, dim, eps};
    return run_or_record(rmsnorm_run, &a, sizeof a);
}

int kc_head_rmsnorm(const uint16_t *w, float *x, uint32_t n_rows, uint32_t n_heads, uint32_t head_dim, float eps,
                    cudaStream_t s)
{
    (void)s;
    rmsnorm_args a = {w, x, x, (size_t)n_rows * n_heads, head_dim, eps};
    return run_or_record(rmsnorm_run, &a, sizeof a);
}

typedef struct { float *x; const int32_t *pos; const float *cs; uint32_t n, heads; } rope_args;
static void rope_run(const void *p)
{
    const rope_args *a = p;
    for (uint32_t r = 0; r < a->n; r++)
            k_rope_f32_ref(a->x + (size_t)r * a->heads * KIPP_HEAD_DIM, a->heads,
                           a->cs + (size_t)a->pos[r] * KIPP_HEAD_DIM);
}
int kc_rope(float *x, const int32_t *pos, const float *cs, uint32_t n_rows, uint32_t n_heads, cudaStream_t s)
{
    (void)s;
    rope_args a = {x, pos, cs, n_rows, n_heads};
    return run_or_record(rope_run, &a, sizeof a);
}

typedef struct { const float *g, *u; float *o; size_t n; } swiglu_args;
static void swiglu_run(const void *p)
{
    const swiglu_args *a = p;
    k_swiglu_f32_ref(a->g, a->u, a->o, a->n);
}
int kc_swiglu(const float *gate, const float *up, float *out, size_t n, cudaStream_t s)
{
    (void)s;
    swiglu_args a = {gate, up, out, n};
    return run_or_record(swiglu_run, &a, sizeof a);
}

typedef struct { float *x; const float *y; size_t n; } add_args;
static void add_run(const void *p)
{
    const add_args *a = p;
    k_add_f32_ref(a->x, a->y, a->n);
}
int kc_add(float *x, const float *y, size_t n, cudaStream_t s)
{
    (void)s;
    add_args a = {x, y, n};
    return run_or_record(add_run, &a, sizeof a);
}

typedef struct { uint16_t *kc, *vc; const float *k, *v; kc_rows rows; uint32_t n, kv_dim; } kv_write_args;
static void kv_write_run(const void *p)
{
    const kv_write_args *a = p;
    for (uint32_t r = 0; r < a->n; r++)
            k_kv_write_bf16_ref((kipp_bf16 *)a->kc, (kipp_bf16 *)a->vc, a->rows.bt + a->rows.bt_off[r],
                                (uint32_t)a->rows.pos[r], a->k + (size_t)r * a->kv_dim, a->v + (size_t)r * a->kv_dim);
}
int kc_kv_write(uint16_t *k_cache, uint16_t *v_cache, const float *k, const float *v, kc_rows rows, uint32_t n_rows,
                uint32_t kv_dim, cudaStream_t s)
{
    (void)s;
    if (kv_dim != KIPP_N_KV_HEAD * KIPP_HEAD_DIM) return (int)cudaErrorInvalidValue;
    kv_write_args a = {k_cache, v_cache, k, v, rows, n_rows, kv_dim};
    return run_or_record(kv_write_run, &a, sizeof a);
}

static void attention_row(const float *q, const uint16_t *kc, const uint16_t *vc, const uint32_t *bt, uint32_t pos,
                          uint32_t n_q_head, float *out)
{
    uint32_t group = n_q_head / KIPP_N_KV_HEAD;
    float m[64], l[64], *acc = malloc((size_t)group * KIPP_HEAD_DIM * sizeof(float));
    if (!acc || group > 64) abort(); /* a test double: fail loudly */
    const float scale = 1.0f / sqrtf((float)KIPP_HEAD_DIM);
    for (uint32_t kvh = 0; kvh < KIPP_N_KV_HEAD; kvh++) {
        size_t off = (size_t)kvh * group * KIPP_HEAD_DIM;
        k_attn_init(group, m, l, acc);
        k_flash_gqa_bf16_ref(q + off, group, (const kipp_bf16 *)kc, (const kipp_bf16 *)vc, kvh, bt, 0, pos + 1, scale,
                             m, l, acc);
        for (uint32_t g = 0; g < group; g++)
            for (uint32_t i = 0; i < KIPP_HEAD_DIM; i++)
                out[off + g * KIPP_HEAD_DIM + i] = acc[g * KIPP_HEAD_DIM + i] / l[g];
    }
    free(acc);
}

typedef struct { const float *q; const uint16_t *kc, *vc; kc_rows rows; uint32_t n, n_q_head; float *out; } attention_args;
static void attention_run(const void *p)
{
    const attention_args *a = p;
    size_t A = (size_t)a->n_q_head * KIPP_HEAD_DIM;
        for (uint32_t r = 0; r < a->n; r++)
            attention_row(a->q + r * A, a->kc, a->vc, a->rows.bt + a->rows.bt_off[r], (uint32_t)a->rows.pos[r],
                          a->n_q_head, a->out + r * A);
}
int kc_attention(const float *q, const uint16_t *k_cache, const uint16_t *v_cache, kc_rows rows, uint32_t n_rows,
                 uint32_t n_q_head, uint32_t n_kv_head, float *out, cudaStream_t s)
{
    (void)s;
    if (n_kv_head != KIPP_N_KV_HEAD || n_q_head % n_kv_head) return (int)cudaErrorInvalidValue;
    attention_args a = {q, k_cache, v_cache, rows, n_rows, n_q_head, out};
    return run_or_record(attention_run, &a, sizeof a);
}

typedef struct { const float *x; const int32_t *idx; uint32_t n, width; float *out; } gather_args;
static void gather_run(const void *p)
{
    const gather_args *a = p;
    for (uint32_t j = 0; j < a->n; j++)
            memcpy(a->out + (size_t)j * a->width, a->x + (size_t)a->idx[j] * a->width, a->width * sizeof(float));
}
int kb_gather_rows(const float *x, const int32_t *idx, uint32_t n, uint32_t width, float *out, cudaStream_t s)
{
    (void)s;
    gather_args a = {x, idx, n, width, out};
    return run_or_record(gather_run, &a, sizeof a);
}

typedef struct { float *x; const float *y; const uint16_t *w; float *xn; size_t n, dim; float eps; } add_rmsnorm_args;
static void add_rmsnorm_run(const void *p)
{
    const add_rmsnorm_args *a = p;
    k_add_f32_ref(a->x, a->y, a->n * a->dim);
    k_rmsnorm_f32_ref(a->x, (const kipp_bf16 *)a->w, a->xn, a->n, a->dim, a->eps);
}
int kb_add_rmsnorm(float *x, const float *y, const uint16_t *w, float *xn, uint32_t n_rows, uint32_t dim, float eps,
                   cudaStream_t s)
{
    (void)s;
    add_rmsnorm_args a = {x, y, w, xn, n_rows, dim, eps};
    return run_or_record(add_rmsnorm_run, &a, sizeof a);
}
