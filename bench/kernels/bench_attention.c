/*
 * bench_attention.c - flash GQA decode attention at a 4k context (issue 5
 * long-context target: the attention kernels must not become the bottleneck).
 * 8 layers of paged BF16 KV (8 KV heads, 4096 positions, scrambled block
 * table; 256 MiB >> LLC). Threads split over (layer, KV head) pairs, as the
 * backend splits over (token, KV head, chunk). Bound: memory (K+V bytes read).
 */
#include "bench/kernels/kbench.h"

#define N_LAYER 8u
#define CTX 4096u
#define N_BLK (CTX / KIPP_KV_BLOCK)

typedef struct {
    const k_cpu_ops *ops;
    const kipp_bf16 *kc, *vc; /* [N_LAYER][N_BLK*32][8][128] bf16 */
    const uint32_t *bt;       /* [N_BLK] */
    const float *q;           /* [8 kv heads][group][128] */
    float *m, *l, *acc;       /* per (layer, kv head): [group], [group], [group][128] */
    size_t group;
} attn_job;

static void attn(void *arg, int ith, int nth)
{
    attn_job *j = arg;
    const size_t layer_elems = (size_t)N_BLK * KIPP_KV_BLOCK * KIPP_N_KV_HEAD * KIPP_HEAD_DIM;
    size_t u0, u1;
    k_split_rows(N_LAYER * KIPP_N_KV_HEAD, ith, nth, 1, &u0, &u1);
    for (size_t u = u0; u < u1; u++) {
        size_t layer = u / KIPP_N_KV_HEAD, h = u % KIPP_N_KV_HEAD;
        j->ops->flash_gqa_bf16(j->q + h * j->group * KIPP_HEAD_DIM, j->group, j->kc + layer * layer_elems,
                               j->vc + layer * layer_elems, (uint32_t)h, j->bt, 0, CTX,
                               0.08838834764831845f, j->m + u * j->group, j->l + u * j->group,
                               j->acc + u * j->group * KIPP_HEAD_DIM);
    }
}

/* Decode as the backend runs it: units (layer, chunk of 512 positions) over all
 * 8 KV heads through flash_rows_bf16 (the partials are left unmerged). */
static void attn_rows(void *arg, int ith, int nth)
{
    attn_job *j = arg;
    const size_t layer_elems = (size_t)N_BLK * KIPP_KV_BLOCK * KIPP_N_KV_HEAD * KIPP_HEAD_DIM, nch = CTX / 512;
    const size_t H = KIPP_N_KV_HEAD * j->group;
    size_t u0, u1;
    k_split_rows(N_LAYER * nch, ith, nth, 1, &u0, &u1);
    for (size_t u = u0; u < u1; u++) {
        size_t layer = u / nch, c = u % nch, slot = (size_t)ith % 8; /* m/l/acc hold 8 slots of 64 heads */
        j->ops->flash_rows_bf16(j->q, j->group, j->kc + layer * layer_elems, j->vc + layer * layer_elems,
                                j->bt, (uint32_t)(c * 512), (uint32_t)(c * 512 + 512), 0.08838834764831845f,
                                j->m + slot * H, j->l + slot * H, j->acc + slot * H * KIPP_HEAD_DIM);
    }
}

int main(int argc, char **argv)
{
    kbench b;
    if (kbench_begin(&b, "attention", argc, argv)) return 2;
    const size_t elems = (size_t)N_LAYER * N_BLK * KIPP_KV_BLOCK * KIPP_N_KV_HEAD * KIPP_HEAD_DIM, gmax = 8;
    kipp_bf16 *kc = kbench_alloc_big(elems * 2), *vc = kbench_alloc_big(elems * 2);
    uint32_t *bt = kipp_aligned_alloc(N_BLK * 4);
    float *q = kipp_aligned_alloc(KIPP_N_KV_HEAD * gmax * KIPP_HEAD_DIM * 4);
    float *m = kipp_aligned_alloc(N_LAYER * KIPP_N_KV_HEAD * gmax * 4), *l = kipp_aligned_alloc(N_LAYER * KIPP_N_KV_HEAD * gmax * 4);
    float *acc = kipp_aligned_alloc(N_LAYER * KIPP_N_KV_HEAD * gmax * KIPP_HEAD_DIM * 4);
    if (!kc || !vc || !bt || !q || !m || !l || !acc) {
        fprintf(stderr, "bench_attention: cannot allocate %zu MiB of KV\n", elems * 4 >> 20);
        return 1;
    }
    kbench_fill_bf16(kc, elems, 1.0f);
    kbench_fill_bf16(vc, elems, 1.0f);
    kbench_fill_f32(q, KIPP_N_KV_HEAD * gmax * KIPP_HEAD_DIM, 1.0f);
    for (uint32_t i = 0; i < N_BLK; i++) bt[i] = (i * 37u + 11u) % N_BLK; /* 37 is odd: a permutation */
    const size_t groups[] = {2, 4, 8};
    for (size_t g = 0; g < 3; g++) {
        attn_job j = {b.ops, kc, vc, bt, q, m, l, acc, groups[g]};
        double bytes = (double)N_LAYER * CTX * KIPP_N_KV_HEAD * KIPP_HEAD_DIM * 2 * 2;
        double flops = (double)N_LAYER * CTX * KIPP_N_KV_HEAD * groups[g] * KIPP_HEAD_DIM * 4;
        char name[96];
        snprintf(name, sizeof name, "flash_gqa group %zu ctx %u x8 layers", groups[g], CTX);
        kbench_case(&b, name, attn, &j, bytes, flops, "memory", 0);
        snprintf(name, sizeof name, "flash_rows group %zu ctx %u x8 layers", groups[g], CTX);
        kbench_case(&b, name, attn_rows, &j, bytes, flops, "memory", 0);
    }
    free(kc); free(vc); /* kbench_alloc_big */
    kipp_aligned_free(bt); kipp_aligned_free(q);
    kipp_aligned_free(m); kipp_aligned_free(l); kipp_aligned_free(acc);
    return kbench_end(&b);
}
