/*
 * bench_elementwise.c - the small ops of a 512-token prefill round at the
 * 0.6B shape: RMSNorm (d 1024, and per-head 128), RoPE (16+8 heads), SwiGLU
 * (d_ff 3072), residual add, embedding gather and the paged KV write. Their
 * working sets are cache-resident, so the "memory" roofline share (against
 * DRAM bandwidth) may exceed 1; the figure shows they cost little next to the
 * matmuls. Single-threaded calls split by rows over the team.
 */
#include "bench/kernels/kbench.h"

#define NT 512u
#define D 1024u
#define FF 3072u

typedef struct {
    const k_cpu_ops *ops;
    float *x, *y, *g, *u, *cs;
    kipp_bf16 *w, *table, *kc, *vc;
    uint32_t *bt;
    int op;
} ew_job;

static void ew(void *arg, int ith, int nth)
{
    ew_job *j = arg;
    size_t t0, t1;
    k_split_rows(NT, ith, nth, 1, &t0, &t1);
    for (size_t t = t0; t < t1; t++) {
        switch (j->op) {
        case 0: j->ops->rmsnorm_f32(j->x + t * D, j->w, j->y + t * D, 1, D, 1e-6f); break;
        case 1: j->ops->rmsnorm_f32(j->x + t * 3072, j->w, j->y + t * 3072, 24, KIPP_HEAD_DIM, 1e-6f); break;
        case 2: j->ops->rope_f32(j->y + t * 3072, 24, j->cs + t * KIPP_HEAD_DIM); break;
        case 3: j->ops->swiglu_f32(j->g + t * FF, j->u + t * FF, j->y + t * FF, FF); break;
        case 4: j->ops->add_f32(j->x + t * D, j->y + t * D, D); break;
        case 5: j->ops->embed_bf16(j->table, (uint32_t)(t * 97 % 4096), j->y + t * D, D); break;
        default: j->ops->kv_write_bf16(j->kc, j->vc, j->bt, (uint32_t)t, j->x + t * D, j->y + t * D); break;
        }
    }
}

int main(int argc, char **argv)
{
    kbench b;
    if (kbench_begin(&b, "elementwise", argc, argv)) return 2;
    ew_job j = {b.ops, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    j.x = kipp_aligned_alloc(NT * FF * 4); j.y = kipp_aligned_alloc(NT * FF * 4);
    j.g = kipp_aligned_alloc(NT * FF * 4); j.u = kipp_aligned_alloc(NT * FF * 4);
    j.cs = kipp_aligned_alloc(NT * KIPP_HEAD_DIM * 4); j.w = kipp_aligned_alloc(D * 2);
    j.table = kipp_aligned_alloc(4096 * D * 2);
    j.kc = kipp_aligned_alloc((size_t)NT * D * 2); j.vc = kipp_aligned_alloc((size_t)NT * D * 2);
    j.bt = kipp_aligned_alloc(NT / KIPP_KV_BLOCK * 4);
    if (!j.x || !j.y || !j.g || !j.u || !j.cs || !j.w || !j.table || !j.kc || !j.vc || !j.bt) return 1;
    kbench_fill_f32(j.x, NT * FF, 2.0f); kbench_fill_f32(j.y, NT * FF, 2.0f);
    kbench_fill_f32(j.g, NT * FF, 4.0f); kbench_fill_f32(j.u, NT * FF, 2.0f);
    kbench_fill_bf16(j.w, D, 1.0f); kbench_fill_bf16(j.table, 4096 * D, 1.0f);
    k_rope_table(j.cs, NT, 1000000.0);
    for (uint32_t i = 0; i < NT / KIPP_KV_BLOCK; i++) j.bt[i] = NT / KIPP_KV_BLOCK - 1 - i;
    struct { const char *name; double bytes, flops; } cases[] = {
        {"rmsnorm 512x1024", NT * D * 8.0, NT * D * 4.0},
        {"qk_norm 512x24x128", NT * 3072 * 8.0, NT * 3072 * 4.0},
        {"rope 512x24 heads", NT * 3072 * 8.0 + NT * 512.0, NT * 3072 * 3.0},
        {"swiglu 512x3072", NT * FF * 12.0, NT * FF * 20.0},
        {"add 512x1024", NT * D * 12.0, NT * D * 1.0},
        {"embed 512 rows of 1024", NT * D * 6.0, 0},
        {"kv_write 512 positions", NT * D * 12.0, 0},
    };
    for (int op = 0; op < 7; op++) {
        j.op = op;
        kbench_case(&b, cases[op].name, ew, &j, cases[op].bytes, cases[op].flops, "memory", 0);
    }
    kipp_aligned_free(j.x); kipp_aligned_free(j.y); kipp_aligned_free(j.g); kipp_aligned_free(j.u);
    kipp_aligned_free(j.cs); kipp_aligned_free(j.w); kipp_aligned_free(j.table);
    kipp_aligned_free(j.kc); kipp_aligned_free(j.vc); kipp_aligned_free(j.bt);
    return kbench_end(&b);
}
