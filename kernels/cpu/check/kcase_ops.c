/*
 * kcase_ops.c - kernel-case kinds of the format-free ops (kcase.h): RMSNorm,
 * RoPE, SwiGLU, residual add, embedding gather, paged KV write and the two
 * flash-attention walks, each against its k_<op>_ref.
 *
 * Bounds (kcase_table.c): add, embed, kv_write and rope are bit-exact (same
 * single operation per element; integer RNE for BF16; RoPE without FMA
 * contraction). RMSNorm reorders one sum: NMSE ~1e-14. SwiGLU and attention
 * use a polynomial exp (~2 ulp, NMSE ~1e-13) and attention reorders 128-wide
 * dots: bound 1e-9 for all, and the softmax denominators l*e^m within 1e-5.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/check/kcase.h"

#define KV_ROW (KIPP_N_KV_HEAD * KIPP_HEAD_DIM)

/* ---- elementwise: one state shape for all ---- */

typedef struct {
    const kcase *c;
    const k_cpu_ops *k;
    size_t n;             /* elements written */
    float *x, *x2, *y, *ref, *cs;
    kipp_bf16 *w;
    int bitwise;
} ew_state;

static void ew_release(void *p)
{
    ew_state *s = p;
    if (!s) return;
    float *f[] = {s->x, s->x2, s->y, s->ref, s->cs};
    for (size_t i = 0; i < 5; i++) kipp_aligned_free(f[i]);
    kipp_aligned_free(s->w);
    free(s);
}

static ew_state *ew_alloc(const kcase *c, const k_cpu_ops *k, size_t n, size_t nw, float lo, float hi)
{
    ew_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->c = c;
    s->k = k;
    s->n = n;
    s->x = kc_rand_f32(n, lo, hi);
    s->x2 = kc_rand_f32(n, -3, 3);
    s->y = kc_rand_f32(n, 0, 0);
    s->ref = kc_rand_f32(n, 0, 0);
    s->w = kc_rand_bf16(nw ? nw : 1, 2.0f);
    if (!s->x || !s->x2 || !s->y || !s->ref || !s->w) { ew_release(s); return NULL; }
    return s;
}

static double ew_error(void *p)
{
    ew_state *s = p;
    if (s->bitwise) return memcmp(s->y, s->ref, s->n * sizeof(float)) == 0 ? 0.0 : 1.0;
    return kc_nmse(s->y, s->ref, s->n);
}

static double ew_bytes(const kcase *c) { return (double)c->s[0] * (c->s[1] ? (double)c->s[1] : 1.0) * 12.0; }
static double ew_flops(const kcase *c) { return (double)c->s[0] * (c->s[1] ? (double)c->s[1] : 1.0) * 3.0; }

/* rmsnorm: s = n_rows n in_place */
static void *rmsnorm_setup(const kcase *c, const k_cpu_ops *k, kc_mode mode)
{
    ew_state *s = ew_alloc(c, k, c->s[0] * c->s[1], c->s[1], -4, 4);
    if (s && mode == KC_CHECK) k_rmsnorm_f32_ref(s->x, s->w, s->ref, c->s[0], c->s[1], 1e-6f);
    return s;
}

static void rmsnorm_run(void *p, int ith, int nth)
{
    ew_state *s = p;
    size_t r0, r1, n = s->c->s[1];
    k_split_rows(s->c->s[0], ith, nth, 1, &r0, &r1);
    const float *src = s->x + r0 * n;
    float *dst = s->y + r0 * n;
    if (s->c->s[2]) { /* in place (x == y): y starts as a copy of x */
        memcpy(dst, src, (r1 - r0) * n * sizeof(float));
        src = dst;
    }
    s->k->rmsnorm_f32(src, s->w, dst, r1 - r0, n, 1e-6f);
}

/* rope: s = n_head pos (table row pos of theta 1e6) */
static void *rope_setup(const kcase *c, const k_cpu_ops *k, kc_mode mode)
{
    (void)mode;
    ew_state *s = ew_alloc(c, k, c->s[0] * KIPP_HEAD_DIM, 0, -2, 2);
    float *table = s ? kipp_aligned_alloc((c->s[1] + 1) * KIPP_HEAD_DIM * sizeof(float)) : NULL;
    if (s) s->cs = kipp_aligned_alloc(KIPP_HEAD_DIM * sizeof(float));
    if (!table || !s->cs) { kipp_aligned_free(table); ew_release(s); return NULL; }
    k_rope_table(table, c->s[1] + 1, 1000000.0);
    memcpy(s->cs, table + c->s[1] * KIPP_HEAD_DIM, KIPP_HEAD_DIM * sizeof(float));
    kipp_aligned_free(table);
    memcpy(s->ref, s->x, s->n * sizeof(float));
    k_rope_f32_ref(s->ref, c->s[0], s->cs);
    s->bitwise = 1;
    return s;
}

static void rope_run(void *p, int ith, int nth)
{
    ew_state *s = p;
    size_t h0, h1;
    k_split_rows(s->c->s[0], ith, nth, 1, &h0, &h1);
    memcpy(s->y + h0 * KIPP_HEAD_DIM, s->x + h0 * KIPP_HEAD_DIM, (h1 - h0) * KIPP_HEAD_DIM * sizeof(float));
    s->k->rope_f32(s->y + h0 * KIPP_HEAD_DIM, h1 - h0, s->cs);
}

/* swiglu: s = n */
static void *swiglu_setup(const kcase *c, const k_cpu_ops *k, kc_mode mode)
{
    ew_state *s = ew_alloc(c, k, c->s[0], 0, -20, 20);
    if (s && mode == KC_CHECK) k_swiglu_f32_ref(s->x, s->x2, s->ref, s->n);
    return s;
}

static void swiglu_run(void *p, int ith, int nth)
{
    ew_state *s = p;
    size_t e0, e1;
    k_split_rows(s->n, ith, nth, 32, &e0, &e1);
    s->k->swiglu_f32(s->x + e0, s->x2 + e0, s->y + e0, e1 - e0);
}

/* add: s = n (bit-exact) */
static void *add_setup(const kcase *c, const k_cpu_ops *k, kc_mode mode)
{
    (void)mode;
    ew_state *s = ew_alloc(c, k, c->s[0], 0, -5, 5);
    if (!s) return NULL;
    memcpy(s->ref, s->x, s->n * sizeof(float));
    k_add_f32_ref(s->ref, s->x2, s->n);
    s->bitwise = 1;
    return s;
}

static void add_run(void *p, int ith, int nth)
{
    ew_state *s = p;
    size_t e0, e1;
    k_split_rows(s->n, ith, nth, 32, &e0, &e1);
    memcpy(s->y + e0, s->x + e0, (e1 - e0) * sizeof(float));
    s->k->add_f32(s->y + e0, s->x2 + e0, e1 - e0);
}

/* embed: s = d vocab token (bit-exact, and the row is the right one) */
static void *embed_setup(const kcase *c, const k_cpu_ops *k, kc_mode mode)
{
    (void)mode;
    ew_state *s = ew_alloc(c, k, c->s[0], c->s[0] * c->s[1], 0, 0);
    if (!s) return NULL;
    for (size_t i = 0; i < s->n; i++) s->ref[i] = kipp_bf16_to_f32(s->w[c->s[2] * c->s[0] + i]); /* independent */
    s->bitwise = 1;
    return s;
}

static void embed_run(void *p, int ith, int nth)
{
    ew_state *s = p;
    if (ith == nth - 1) s->k->embed_bf16(s->w, (uint32_t)s->c->s[2], s->y, s->n);
}

/* ---- paged KV write: s = n_blocks (bit-exact, and the page mapping is right) ---- */

typedef struct {
    const k_cpu_ops *k;
    size_t total;
    uint32_t bt[64];
    kipp_bf16 *kr, *vr, *kc, *vc;
    float *kx, *vx;
} kv_state;

static const uint32_t kv_pos[] = {0, 31, 32, 77, 127};

static void kv_release(void *p)
{
    kv_state *s = p;
    if (!s) return;
    kipp_aligned_free(s->kr); kipp_aligned_free(s->vr); kipp_aligned_free(s->kc); kipp_aligned_free(s->vc);
    kipp_aligned_free(s->kx); kipp_aligned_free(s->vx);
    free(s);
}

static void *kv_setup(const kcase *c, const k_cpu_ops *k, kc_mode mode)
{
    (void)mode;
    kv_state *s = calloc(1, sizeof *s);
    uint32_t nb = (uint32_t)(c->s[0] < 64 ? c->s[0] : 64);
    if (!s) return NULL;
    s->k = k;
    s->total = (size_t)nb * KIPP_KV_BLOCK * KV_ROW;
    for (uint32_t b = 0; b < nb; b++) s->bt[b] = (b * 5 + 2) % nb; /* scrambled: nb not a multiple of 5 */
    s->kr = kc_rand_bf16(s->total, 0); s->vr = kc_rand_bf16(s->total, 0);
    s->kc = kc_rand_bf16(s->total, 0); s->vc = kc_rand_bf16(s->total, 0);
    s->kx = kc_rand_f32(KV_ROW, -8, 8); s->vx = kc_rand_f32(KV_ROW, -8, 8);
    if (!s->kr || !s->vr || !s->kc || !s->vc || !s->kx || !s->vx || nb < 4) { kv_release(s); return NULL; }
    s->kx[0] = 1e-40f; s->kx[1] = NAN; s->vx[2] = -INFINITY; s->vx[3] = 1.00390625f;
    for (size_t i = 0; i < sizeof kv_pos / sizeof kv_pos[0]; i++) k_kv_write_bf16_ref(s->kr, s->vr, s->bt, kv_pos[i], s->kx, s->vx);
    return s;
}

static void kv_run(void *p, int ith, int nth)
{
    kv_state *s = p;
    for (size_t i = 0; i < sizeof kv_pos / sizeof kv_pos[0]; i++)
        if ((int)(i % (size_t)nth) == ith) s->k->kv_write_bf16(s->kc, s->vc, s->bt, kv_pos[i], s->kx, s->vx);
}

static double kv_error(void *p)
{
    kv_state *s = p;
    int same = !memcmp(s->kc, s->kr, s->total * 2) && !memcmp(s->vc, s->vr, s->total * 2);
    /* independent page mapping: pos 77 -> block bt[2], slot 13 */
    size_t row = ((size_t)s->bt[2] * KIPP_KV_BLOCK + 13) * KV_ROW;
    same &= s->kc[row + 5] == kipp_f32_to_bf16(s->kx[5]) && s->vc[row + 9] == kipp_f32_to_bf16(s->vx[9]);
    return same ? 0.0 : 1.0;
}

static double kv_bytes(const kcase *c) { (void)c; return 5.0 * KV_ROW * 12; }

/* ---- flash attention: s = group p0 p1 layers ---- */

typedef struct {
    const kcase *c;
    const k_cpu_ops *k;
    size_t group, layers, n_blocks, layer_elems;
    uint32_t p0, p1, *bt;
    kipp_bf16 *kc, *vc;                       /* [layers][n_blocks*32][8][128] */
    float *q;                                 /* [8][group][128] */
    float *m, *l, *acc;                       /* [layers*8][group], [..][group][128] path */
    float *mr, *lr, *accr;                    /* oracle for layer 0 */
    k_flash_gqa_bf16_fn gqa, gqa_ref;         /* the walk under test and its oracle: FP32 or BF16-dot */
    k_flash_rows_bf16_fn rows;
    int split_heads;                          /* check mode: rows calls over head ranges, as more threads split them */
} fa_state;

static void fa_release(void *p)
{
    fa_state *s = p;
    if (!s) return;
    free(s->kc); free(s->vc);
    float *f[] = {s->q, s->m, s->l, s->acc, s->mr, s->lr, s->accr};
    for (size_t i = 0; i < 7; i++) kipp_aligned_free(f[i]);
    free(s->bt);
    free(s);
}

/* The oracle of flash_rows_dot: k_flash_gqa_dot_ref walked per lane (page
 * parity) and merged, as the backend's decode splits. Rounding the softmax
 * weights to BF16 relative to each lane's own running max is part of the
 * dot's arithmetic, so a one-pass oracle would differ by ~1e-6 for that
 * reason alone. -1 on allocation failure. */
static int fa_lane_oracle(fa_state *s)
{
    const size_t G = s->group, H = KIPP_N_KV_HEAD * G, HD = KIPP_HEAD_DIM;
    float *m1 = kc_rand_f32(H, 0, 0), *l1 = kc_rand_f32(H, 0, 0), *a1 = kc_rand_f32(H * HD, 0, 0);
    if (!m1 || !l1 || !a1) { kipp_aligned_free(m1); kipp_aligned_free(l1); kipp_aligned_free(a1); return -1; }
    k_attn_init(H, m1, l1, a1);
    for (uint32_t a = s->p0 / KIPP_KV_BLOCK * KIPP_KV_BLOCK; a < s->p1; a += KIPP_KV_BLOCK) {
        uint32_t lo = a > s->p0 ? a : s->p0, hi = a + KIPP_KV_BLOCK < s->p1 ? a + KIPP_KV_BLOCK : s->p1;
        int odd = k_attn_lane(a) != 0;
        k_flash_rows_dot_ref(s->q, G, s->kc, s->vc, s->bt, 0, KIPP_N_KV_HEAD, lo, hi, K_ATTN_NO_NEXT, 1.0f / sqrtf((float)HD),
                             odd ? m1 : s->mr, odd ? l1 : s->lr, odd ? a1 : s->accr);
    }
    k_attn_merge(H, s->mr, s->lr, s->accr, m1, l1, a1);
    kipp_aligned_free(m1); kipp_aligned_free(l1); kipp_aligned_free(a1);
    return 0;
}

static void *fa_setup(const kcase *c, const k_cpu_ops *k, kc_mode mode)
{
    fa_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->c = c;
    s->k = k;
    int dot = strstr(c->op, "_dot") != NULL; /* flash_gqa_dot, flash_rows_dot: the BF16-dot walks */
    s->gqa = dot ? k->flash_gqa_dot : k->flash_gqa_bf16;
    s->rows = dot ? k->flash_rows_dot : k->flash_rows_bf16;
    s->gqa_ref = dot ? k_flash_gqa_dot_ref : k_flash_gqa_bf16_ref;
    s->group = c->s[0];
    s->split_heads = mode == KC_CHECK;
    s->p0 = (uint32_t)c->s[1];
    s->p1 = (uint32_t)c->s[2];
    s->layers = mode == KC_BENCH && c->s[3] > 1 ? c->s[3] : 1;
    const size_t nbt = (s->p1 + KIPP_KV_BLOCK - 1) / KIPP_KV_BLOCK; /* logical pages the walks touch */
    s->n_blocks = nbt + 2;                                         /* physical pages: 2 spare */
    s->layer_elems = s->n_blocks * KIPP_KV_BLOCK * KV_ROW;
    size_t H = KIPP_N_KV_HEAD * s->group;
    size_t units = s->layers * KIPP_N_KV_HEAD; /* state slots: one per (layer, KV head) */
    s->kc = kc_alloc_big(s->layers * s->layer_elems * 2);
    s->vc = kc_alloc_big(s->layers * s->layer_elems * 2);
    /* the walks' pages only, at its exact size, so that ASan flags a block-table read past the
     * range a call may touch (a pnext beyond the last page); the 2 spare physical pages stay */
    s->bt = malloc(nbt * sizeof(uint32_t));
    s->q = kc_rand_f32(H * KIPP_HEAD_DIM, -3, 3); /* scores spread over ~+-10: a peaked softmax */
    s->m = kc_rand_f32(units * H, 0, 0); s->l = kc_rand_f32(units * H, 0, 0);
    s->acc = kc_rand_f32(units * H * KIPP_HEAD_DIM, 0, 0);
    s->mr = kc_rand_f32(H, 0, 0); s->lr = kc_rand_f32(H, 0, 0); s->accr = kc_rand_f32(H * KIPP_HEAD_DIM, 0, 0);
    if (!s->kc || !s->vc || !s->bt || !s->q || !s->m || !s->l || !s->acc || !s->mr || !s->lr || !s->accr) { fa_release(s); return NULL; }
    k_attn_init(units * H, s->m, s->l, s->acc); /* the walks continue a state: every slot fresh (flash_rows lanes use 2 per layer) */
    k_attn_init(H, s->mr, s->lr, s->accr);
    kipp_bf16 *kr = kc_rand_bf16(s->layer_elems, 1.0f), *vr = kc_rand_bf16(s->layer_elems, 1.0f);
    if (!kr || !vr) { kipp_aligned_free(kr); kipp_aligned_free(vr); fa_release(s); return NULL; }
    for (size_t L = 0; L < s->layers; L++) { /* same bytes per layer: timing only */
        memcpy(s->kc + L * s->layer_elems, kr, s->layer_elems * 2);
        memcpy(s->vc + L * s->layer_elems, vr, s->layer_elems * 2);
    }
    kipp_aligned_free(kr); kipp_aligned_free(vr);
    for (size_t b = 0; b < nbt; b++) s->bt[b] = (uint32_t)((b * 37u + 11u) % s->n_blocks); /* scrambled pages */
    if (s->n_blocks % 37 == 0) /* 37 is prime: the map above is a permutation unless 37 divides n_blocks */ for (size_t b = 0; b < nbt; b++) s->bt[b] = (uint32_t)(s->n_blocks - 1 - b);
    if (mode == KC_CHECK && !(dot && !strcmp(c->op, "flash_rows_dot")))
        for (uint32_t h = 0; h < KIPP_N_KV_HEAD; h++)
            s->gqa_ref(s->q + h * s->group * KIPP_HEAD_DIM, s->group, s->kc, s->vc, h, s->bt, s->p0, s->p1,
                       1.0f / sqrtf((float)KIPP_HEAD_DIM), s->mr + h * s->group, s->lr + h * s->group,
                       s->accr + h * s->group * KIPP_HEAD_DIM);
    else if (mode == KC_CHECK && fa_lane_oracle(s)) {
        fa_release(s);
        return NULL;
    }
    return s;
}

/* flash_gqa: units (layer, KV head) split over threads, as a prefill split. */
static void fa_gqa_run(void *p, int ith, int nth)
{
    fa_state *s = p;
    size_t u0, u1, G = s->group;
    k_split_rows(s->layers * KIPP_N_KV_HEAD, ith, nth, 1, &u0, &u1);
    for (size_t u = u0; u < u1; u++) {
        size_t L = u / KIPP_N_KV_HEAD, h = u % KIPP_N_KV_HEAD;
        s->gqa(s->q + h * G * KIPP_HEAD_DIM, G, s->kc + L * s->layer_elems, s->vc + L * s->layer_elems,
                             (uint32_t)h, s->bt, s->p0, s->p1, 1.0f / sqrtf((float)KIPP_HEAD_DIM), s->m + u * G,
                             s->l + u * G, s->acc + u * G * KIPP_HEAD_DIM);
    }
}

/* Page a (a multiple of 32) cut to the case's [p0, p1). */
static void fa_page(const fa_state *s, uint32_t a, uint32_t *lo, uint32_t *hi)
{
    *lo = a > s->p0 ? a : s->p0;
    *hi = a + KIPP_KV_BLOCK < s->p1 ? a + KIPP_KV_BLOCK : s->p1;
}

/* The walk [p0, p1) of lane `lane` (its pages only) with flash_rows over
 * every KV head, into the state at slot (m, l, acc) for all H query heads. */
static void fa_rows_lane(const fa_state *s, size_t L, uint32_t lane, float *m, float *l, float *acc)
{
    for (uint32_t a = s->p0 / KIPP_KV_BLOCK * KIPP_KV_BLOCK, lo, hi; a < s->p1; a += KIPP_KV_BLOCK) {
        if (k_attn_lane(a) != lane) continue;
        fa_page(s, a, &lo, &hi);
        uint32_t an = a + K_ATTN_LANES * KIPP_KV_BLOCK, next = an < s->p1 ? an : K_ATTN_NO_NEXT; /* the lane's next page */
        /* the backend's decode gives a unit the heads [h0, h0 + w) once a row has more
         * workers than lanes (attend_rows): checks walk page i in ranges of 8 >> (i % 4) */
        uint32_t w = s->split_heads ? KIPP_N_KV_HEAD >> (a / KIPP_KV_BLOCK % 4) : KIPP_N_KV_HEAD;
        for (uint32_t h0 = 0; h0 < KIPP_N_KV_HEAD; h0 += w)
            s->rows(s->q, s->group, s->kc + L * s->layer_elems, s->vc + L * s->layer_elems, s->bt, h0, h0 + w, lo,
                    hi, next, 1.0f / sqrtf((float)KIPP_HEAD_DIM), m, l, acc);
    }
}

/* flash_rows: units (layer, lane), lanes dealt round-robin so two workers
 * walk alternate pages of the same layer, as the backend's decode does. Lane
 * i of layer L is state slot 2L + i. */
static void fa_rows_run(void *p, int ith, int nth)
{
    fa_state *s = p;
    size_t H = KIPP_N_KV_HEAD * s->group;
    for (size_t u = (size_t)ith; u < s->layers * K_ATTN_LANES; u += (size_t)nth)
        fa_rows_lane(s, u / K_ATTN_LANES, (uint32_t)(u % K_ATTN_LANES), s->m + u * H, s->l + u * H,
                     s->acc + u * H * KIPP_HEAD_DIM);
}

/* Worst of: NMSE of acc/l over all heads, and the softmax denominators l*e^m. */
static double fa_compare(const fa_state *s, const float *m, const float *l, const float *acc)
{
    size_t H = KIPP_N_KV_HEAD * s->group;
    double num = 0, den = 0, worst = 0;
    for (size_t h = 0; h < H; h++) {
        for (size_t i = 0; i < KIPP_HEAD_DIM; i++) {
            double a = acc[h * KIPP_HEAD_DIM + i] / l[h], r = s->accr[h * KIPP_HEAD_DIM + i] / s->lr[h];
            num += (a - r) * (a - r);
            den += r * r;
        }
        double d = fabs((double)l[h] * exp((double)m[h]) / ((double)s->lr[h] * exp((double)s->mr[h])) - 1.0);
        worst = d > worst ? d : worst;
    }
    double e = den > 0 ? num / den : num;
    /* The BF16-dot walks round each softmax weight to BF16; where the SIMD exp
     * and the oracle's expf straddle a rounding boundary one weight moves by
     * up to 2^-8 of itself, so their denominators are held to 2^-8. */
    double lmax = s->gqa_ref == k_flash_gqa_dot_ref ? 0x1p-8 : 1e-5;
    return worst > lmax ? (e > 1.0 ? e : 1.0) : e; /* a wrong denominator fails every bound */
}

/* flash_gqa over KV head h into (m, l, acc) from a fresh state, as walks
 * [p0, cut) then [cut, p1), with query vectors taken `per` at a time. */
static void fa_gqa_walk(const fa_state *s, uint32_t h, uint32_t cut, size_t per, float *m, float *l, float *acc)
{
    size_t G = s->group;
    float sc = 1.0f / sqrtf((float)KIPP_HEAD_DIM);
    k_attn_init(G, m, l, acc);
    for (size_t g = 0; g < G; g += per) {
        const float *q = s->q + (h * G + g) * KIPP_HEAD_DIM;
        float *ag = acc + g * KIPP_HEAD_DIM;
        if (cut > s->p0) s->gqa(q, per, s->kc, s->vc, h, s->bt, s->p0, cut, sc, m + g, l + g, ag);
        if (cut < s->p1) s->gqa(q, per, s->kc, s->vc, h, s->bt, cut, s->p1, sc, m + g, l + g, ag);
    }
}

/* Row invariance of the walk: split at a multiple of K_ATTN_CHUNK, or taken
 * one query vector at a time, it is bitwise the one-pass result. 1 if not. */
static double fa_invariance(const fa_state *s, const float *m, const float *l, const float *acc)
{
    size_t G = s->group;
    uint32_t cut = (s->p0 + (s->p1 - s->p0) / 3) / K_ATTN_CHUNK * K_ATTN_CHUNK + K_ATTN_CHUNK;
    cut = cut < s->p1 ? cut : s->p1;
    float *m2 = kc_rand_f32(G, 0, 0), *l2 = kc_rand_f32(G, 0, 0), *a2 = kc_rand_f32(G * KIPP_HEAD_DIM, 0, 0);
    int bad = !m2 || !l2 || !a2;
    for (uint32_t h = 0; h < KIPP_N_KV_HEAD && !bad; h++)
        for (int v = 0; v < 2 && !bad; v++) {
            fa_gqa_walk(s, h, v ? s->p1 : cut, v ? 1 : G, m2, l2, a2);
            bad = memcmp(m2, m + h * G, G * 4) || memcmp(l2, l + h * G, G * 4) ||
                  memcmp(a2, acc + h * G * KIPP_HEAD_DIM, G * KIPP_HEAD_DIM * 4);
        }
    kipp_aligned_free(m2); kipp_aligned_free(l2); kipp_aligned_free(a2);
    return bad ? 1.0 : 0.0;
}

static double fa_error(void *p)
{
    fa_state *s = p;
    double e = fa_compare(s, s->m, s->l, s->acc), inv = fa_invariance(s, s->m, s->l, s->acc);
    return e > inv ? e : inv;
}

/* KV head h's lanes walked by flash_gqa page by page, from fresh states
 * (lane i at m + i*G, l + i*G, acc + i*G*128), then merged into lane 0. */
static void fa_gqa_lanes(const fa_state *s, uint32_t h, float *m, float *l, float *acc)
{
    const size_t G = s->group;
    k_attn_init(K_ATTN_LANES * G, m, l, acc);
    for (uint32_t a = s->p0 / KIPP_KV_BLOCK * KIPP_KV_BLOCK, lo, hi; a < s->p1; a += KIPP_KV_BLOCK) {
        size_t o = k_attn_lane(a) * G;
        fa_page(s, a, &lo, &hi);
        s->gqa(s->q + h * G * KIPP_HEAD_DIM, G, s->kc, s->vc, h, s->bt, lo, hi,
                             1.0f / sqrtf((float)KIPP_HEAD_DIM), m + o, l + o, acc + o * KIPP_HEAD_DIM);
    }
    k_attn_merge(G, m, l, acc, m + G, l + G, acc + G * KIPP_HEAD_DIM);
}

/* flash_rows: the lanes of layer 0 (slots 0 and 1) merged by k_attn_merge,
 * against the oracle, and bitwise against fa_gqa_lanes per head (1 if not). */
static double fa_rows_error(void *p)
{
    fa_state *s = p;
    const size_t H = KIPP_N_KV_HEAD * s->group, G = s->group, HD = KIPP_HEAD_DIM, n = K_ATTN_LANES * H;
    float *m = kc_rand_f32(n, 0, 0), *l = kc_rand_f32(n, 0, 0), *acc = kc_rand_f32(n * HD, 0, 0);
    float *m2 = kc_rand_f32(n, 0, 0), *l2 = kc_rand_f32(n, 0, 0), *a2 = kc_rand_f32(n * HD, 0, 0);
    double e = 1.0, inv = 0.0;
    if (m && l && acc && m2 && l2 && a2) {
        memcpy(m, s->m, n * 4); memcpy(l, s->l, n * 4); memcpy(acc, s->acc, n * HD * 4);
        k_attn_merge(H, m, l, acc, m + H, l + H, acc + H * HD);
        e = fa_compare(s, m, l, acc);
        for (uint32_t h = 0; h < KIPP_N_KV_HEAD; h++) {
            fa_gqa_lanes(s, h, m2, l2, a2);
            if (memcmp(m2, m + h * G, G * 4) || memcmp(l2, l + h * G, G * 4) || memcmp(a2, acc + h * G * HD, G * HD * 4))
                inv = 1.0;
        }
    }
    float *f[] = {m, l, acc, m2, l2, a2};
    for (size_t i = 0; i < 6; i++) kipp_aligned_free(f[i]);
    return e > inv ? e : inv;
}

static double fa_bytes(const kcase *c)
{
    return (double)(c->s[3] ? c->s[3] : 1) * (double)(c->s[2] - c->s[1]) * KV_ROW * 2 * 2;
}
static double fa_flops(const kcase *c)
{
    return (double)(c->s[3] ? c->s[3] : 1) * (double)(c->s[2] - c->s[1]) * KV_ROW * (double)c->s[0] * 4;
}

static double no_flops(const kcase *c) { (void)c; return 0; }

const kcase_kind kcase_kind_rmsnorm = {"rmsnorm", "n_rows n in_place", rmsnorm_setup, rmsnorm_run, ew_error, ew_release, ew_bytes, ew_flops, "memory"};
const kcase_kind kcase_kind_rope = {"rope", "n_head pos", rope_setup, rope_run, ew_error, ew_release, ew_bytes, ew_flops, "memory"};
const kcase_kind kcase_kind_swiglu = {"swiglu", "n", swiglu_setup, swiglu_run, ew_error, ew_release, ew_bytes, ew_flops, "memory"};
const kcase_kind kcase_kind_add = {"add", "n", add_setup, add_run, ew_error, ew_release, ew_bytes, no_flops, "memory"};
const kcase_kind kcase_kind_embed = {"embed", "d vocab token", embed_setup, embed_run, ew_error, ew_release, ew_bytes, no_flops, "memory"};
const kcase_kind kcase_kind_kv_write = {"kv_write", "n_blocks", kv_setup, kv_run, kv_error, kv_release, kv_bytes, no_flops, "memory"};
const kcase_kind kcase_kind_flash_gqa = {"flash_gqa", "group p0 p1 layers(bench)", fa_setup, fa_gqa_run, fa_error, fa_release, fa_bytes, fa_flops, "memory"};
const kcase_kind kcase_kind_flash_gqa_dot = {"flash_gqa_dot", "group p0 p1 layers(bench)", fa_setup, fa_gqa_run, fa_error, fa_release, fa_bytes, fa_flops, "memory"};
const kcase_kind kcase_kind_flash_rows = {"flash_rows", "group p0 p1 layers(bench)", fa_setup, fa_rows_run, fa_rows_error, fa_release, fa_bytes, fa_flops, "memory"};
const kcase_kind kcase_kind_flash_rows_dot = {"flash_rows_dot", "group p0 p1 layers(bench)", fa_setup, fa_rows_run, fa_rows_error, fa_release, fa_bytes, fa_flops, "memory"};
