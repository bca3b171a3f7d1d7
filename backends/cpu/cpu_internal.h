/*
 * cpu_internal.h - shared structures of the fast cpu backend (backends/cpu/cpu_*.c).
 *
 * The backend composes the kernel table (kernels/cpu/kernels.h) into the
 * Qwen3 forward pass of seed 000 ("Each layer performs these operations in
 * order"). One eval is cut into rounds of at most KIPP_CPU_ROUND_TOKENS token
 * rows; a round packs the tokens of every item so each weight matrix is read
 * once per round (seed 000 "Backend boundary": batched items), and all
 * workers run the whole round SPMD-style, meeting at pool barriers.
 */
#ifndef KIPP_CPU_INTERNAL_H
#define KIPP_CPU_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>

#include "backends/cpu/kv_store.h"
#include "base/threadpool.h"
#include "engine/backend.h"
#include "kernels/cpu/kernels.h"

/* Token rows per round. 256 keeps the tiled matmul's token loop long enough to
 * amortise each L1/L2 weight slab (seed 002 item 4) while bounding scratch to
 * ~35 MB at the 4B shape; pp512 reads each weight twice, ~3% of its time. */
#define KIPP_CPU_ROUND_TOKENS 256u

/* Head rows packed per slice at load (a multiple of 16: whole panels; 8 MB of
 * BF16 at d_model 1024), so the file and packed copies overlap by one slice. */
#define KIPP_CPU_HEAD_PACK_ROWS 4096u

/* Vocabulary rows per block when head outputs are scattered to several items. */
#define KIPP_CPU_HEAD_BLOCK 128u

/* Prefill attention runs query tiles: consecutive tokens of one item whose
 * query heads of a KV head together fill this many query vectors, so each K/V
 * chunk loaded from memory serves all of them for the shared causal prefix
 * (the kernel widens each chunk once into an L1 buffer for all of them).
 * 128 vectors (64 tokens at group 2) cut the prefix re-reads of a 4k prefill
 * 16-fold against 8 and halve the chunk loads per vector against 64
 * (Zen 5, pp4096 perf: the tile walk's samples against the bf16dot matmul's
 * 1.34-1.37 at 128, 1.41-1.47 at 64); the tile state (both lanes) is 198 KB
 * per worker, in L2. */
#define KIPP_CPU_ATTN_TILE_QUERIES 128u
/** Floats of tile state per query vector: q [128], then per lane m, l and acc [128]. */
#define KIPP_CPU_TILE_STATE (KIPP_HEAD_DIM + K_ATTN_LANES * (KIPP_HEAD_DIM + 2))

/** A backend session: paged KV storage (seed 000 "KV cache"), its own or the model's slab. */
typedef struct {
    struct cpu_model *m;
    uint32_t n_blocks; /* logical 32-position blocks: positions < n_blocks*32 */
    kipp_kv_store kv;  /* private: n_blocks physical blocks; pooled: a copy of the model's slab view */
    int pooled;        /* 1: kv is borrowed from m->slab, never freed here */
} cpu_session;

/**
 * One layer's weights in their format's packed layout (kernels.h "weight
 * formats"). Matrices that read the same input are concatenated by rows, so
 * one call computes Q|K|V and one Gate|Up.
 */
typedef struct {
    k_weight qkv;  /* [A + 2*1024][d_model]: Wq | Wk | Wv */
    k_weight o;    /* [d_model][A] */
    k_weight gu;   /* [2*d_ff][d_model]: W_gate | W_up */
    k_weight down; /* [d_model][d_ff] */
} cpu_layer;

/** Backend model: borrowed weight views, packed copies, kernel table, pool and round scratch. */
typedef struct cpu_model {
    kipp_dims d;
    kipp_qwen3_weights w;      /* views into the engine's mapping; layers owned by the engine */
    const k_cpu_ops *k;        /* chosen once at create */
    kipp_isa isa;
    char isa_note[200];        /* fallback sentence, "" when the best path runs */
    int kv_q8;                 /* 1: q8_0 KV (view.kv_type): kv_write_q8_0 and flash_*_q8_0 instead of the bf16 walks */
    const char *bf16_mode;     /* KIPP_BF16_ACT mode in force: "f32", "mixed" or "bf16" (cpu_backend.c) */
    k_fmt bf16_read[5];        /* the read format of a bf16 projection, in plan_layer's order Q|K|V, O,
                                  Gate|Up, Down, then the head: K_FMT_BF16 (FP32 activations) or
                                  K_FMT_BF16DOT (BF16 through vdpbf16ps) */
    k_flash_gqa_bf16_fn flash_gqa;   /* the mode's attention walks: flash_*_bf16 (f32) or flash_*_dot (mixed, bf16) */
    k_flash_rows_bf16_fn flash_rows;
    kipp_threadpool *pool;
    int nth;
    size_t A, QKV;             /* n_q_head*128; A + 2*1024 (row width of qkv) */
    cpu_layer *lw;             /* [n_layer] views into packed */
    k_weight head;             /* [vocab][d_model] (the tied embedding when tied) */
    void *packed;              /* the one allocation behind lw and head, owned here */
    size_t prepared_bytes;     /* bytes of packed */
    float *rope;               /* [context_length][128] f32: cos[64] then sin[64] per position */
    /* Round scratch, R = KIPP_CPU_ROUND_TOKENS rows. */
    float *x;                  /* [R][d_model] f32 residual stream */
    float *xn;                 /* [R][d_model] f32 normed input / final-norm rows */
    void *xa;                  /* [R][max(d_model, A, d_ff)] matmul input in the weight's activation format */
    float *qkv;                /* [R][QKV] f32: q [A], k [1024], v [1024] per row */
    float *att;                /* [R][A] f32 attention output */
    float *tmp;                /* [R][d_model] f32 projection output before the residual add */
    float *gu;                 /* [R][2*d_ff] f32: gate then up */
    float *sw;                 /* [R][d_ff] f32 SwiGLU output, compact rows: the down projection's input */
    float *head_tmp;           /* [nth][R][KIPP_CPU_HEAD_BLOCK] f32 scatter staging */
    uint32_t tile_tokens;      /* tokens per prefill query tile: max(1, TILE_QUERIES / group) */
    size_t tile_q;             /* query vectors per tile: tile_tokens * group */
    float *tile_buf;           /* [nth][tile_q*KIPP_CPU_TILE_STATE] f32 per-worker tile state: q, then per
                                  lane m and l, acc */
    float *att1;               /* [R][A] f32 decode rows' lane-1 accumulators (lane 0 walks in att) */
    float *lane_ml;            /* [R][K_ATTN_LANES][2][n_q_head] f32 decode rows' m then l per lane */
    uint32_t *tile_r0;         /* [R] first round row of each query tile */
    uint32_t *tile_n;          /* [R] rows in each query tile */
    uint32_t *row_item;        /* [R] item index of each round row */
    uint32_t *row_pos;         /* [R] position of each round row */
    uint32_t *row_tok;         /* [R] token id of each round row */
    uint32_t *lrow;            /* [R] round rows that need the final norm: n_logits with logits, then n_hidden without */
    float **ldst;              /* [R] destination logits row of each (the first n_logits) */
    float **lhid;              /* [R] destination hidden row of each (kipp_eval_item.hidden), or NULL */
    size_t scratch_bytes;      /* all round scratch above plus the RoPE table */
    kipp_kv_store slab;        /* pooled models: the shared KV slab (zeroed store when not pooled) */
    struct cpu_stream *st;     /* streamed model (cpu_stream.c): lw and head data point to file weights; else NULL */
} cpu_model;

/** One round: rows [0, n_rows) drawn from items, consumed by every worker. */
typedef struct {
    cpu_model *m;
    const kipp_eval_item *items;
    uint32_t n_rows;           /* token rows in this round */
    uint32_t n_logits;         /* rows needing logits (lrow/ldst) */
    uint32_t n_hidden;         /* rows after them needing only the final norm (an item's hidden, no logits) */
    int head_direct;           /* 1: logits rows are consecutive rows of one destination */
    uint32_t n_tiles;          /* query tiles of the round (tile_r0/tile_n) */
    atomic_uint attn_next;     /* dynamic attention work counter */
} cpu_round;

/** Run one round on the calling worker (SPMD body of kipp_threadpool_run). */
void kipp_cpu_forward_round(void *round, int ith, int nth);

/**
 * The activation copy that w reads: src [cnt] f32 quantized into the round's
 * [R][width] buffer xa at element offset dst (dst and cnt multiples of 32,
 * whole quantization blocks). Nothing when w reads F32: the kernel then takes
 * the f32 input itself. The same for decode and prefill rows (row invariance).
 * Inline here, below both its callers (cpu_forward.c and cpu_attention.c), so
 * the attention file calls nothing of the forward file: forward -> attention
 * is the only arrow between them.
 */
static inline void kipp_cpu_act(const cpu_model *m, const k_weight *w, const float *src, size_t dst, size_t cnt)
{
    k_act a = k_fmt_get(w->fmt)->act;
    if (a != K_ACT_F32) m->k->act[a](src, (char *)m->xa + k_act_row_bytes(a, dst), cnt);
}

/**
 * The read mode of the output head: its file format's, except that a bf16
 * head of a model whose projections are bf16 too follows the mode
 * (bf16_read[4], cpu_backend.c says why). A bf16 head beside quantized
 * projections keeps FP32 activations: their accuracy gates (test_quant_forward's
 * outlier fixture) are measured with it, and its rounding flipped one more
 * near-tie argmax there.
 */
static inline k_fmt kipp_cpu_head_fmt(const cpu_model *m, const kipp_qwen3_weights *w)
{
    k_fmt hf = (k_fmt)k_fmt_from_gguf(w->output.dtype);
    int bf16_model = k_fmt_from_gguf(w->layers[0].wq.dtype) == K_FMT_BF16;
    return hf == K_FMT_BF16 && bf16_model ? m->bf16_read[4] : hf;
}

/* ---- streaming (cpu_stream.c; seed 002 "Layer streaming") ----
 * A streamed model has no packed copy: lw[l] and head keep their format and
 * shape, but their data points to a cpu_file_weight (the file's row-major
 * parts), which kipp_cpu_stream_linear packs slice by slice into per-worker
 * buffers and hands to the format's own matvec/matmul, so every output row
 * runs the resident path's arithmetic (bitwise-equal logits). */

/** Create m->st for view v: file weights, worker buffers, prefetch thread; fills m->lw and m->head. */
int kipp_cpu_stream_create(cpu_model *m, const kipp_model_view *v, char *err, size_t errlen);
void kipp_cpu_stream_destroy(struct cpu_stream *st);
/**
 * Rows [rb, re) of a streamed weight w (w->data a cpu_file_weight) against the
 * activations in (the format's act, n rows): y[t*ldy + r - rb], share ith of
 * nth of the rows. The resident linear's result, bit for bit. wk: the calling
 * pool worker, whose slice buffers it packs into; it differs from ith where
 * the caller has split the rows itself and passes ith 0 of nth 1 (the head's
 * scattered path: every worker at once, each on its own vocabulary blocks).
 */
void kipp_cpu_stream_linear(const cpu_model *m, const k_weight *w, size_t rb, size_t re, const void *in, float *y,
                            size_t ldy, uint32_t n, int ith, int nth, int wk);
/** Worker 0, as segment seg starts (layer l = l, head = n_layer): prefetch segment next. */
void kipp_cpu_stream_begin(const cpu_model *m, uint32_t seg, uint32_t next);
/** One describe paragraph of the streamed model. */
void kipp_cpu_stream_describe(const cpu_model *m, char *out, size_t outlen);

/** Attention of layer `layer` for every row of the round: att = softmax(qK^T)V (all workers). */
void kipp_cpu_attention(cpu_round *r, uint32_t layer, int ith, int nth);

#endif
