/*
 * kcase_kvq8.c - kernel-case kinds of the q8_0 KV cache (kernels.h "q8_0 KV
 * cache"): the quantizing KV write against an independent reading of the
 * q8_0 rule, and the two flash walks against k_flash_gqa_q8_0_ref, with the
 * bf16 walks' invariance checks (splits at chunk multiples, one query vector
 * at a time, flash_rows per head and lane) held bitwise.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/check/kcase.h"

#define KV_ROW (KIPP_N_KV_HEAD * KIPP_HEAD_DIM)
#define HD KIPP_HEAD_DIM

/* ---- kv_write_q8_0: s = n_blocks ---- */

static const uint32_t kvq_pos[] = {0, 1, 31, 32, 77, 100};

typedef struct {
    const k_cpu_ops *k;
    uint32_t bt[64], nb;
    uint8_t *kc, *vc;
    float *kx, *vx; /* [6][8][128] inputs, one row per position */
} kvq_state;

static void kvq_release(void *p)
{
    kvq_state *s = p;
    if (!s) return;
    free(s->kc); free(s->vc);
    kipp_aligned_free(s->kx); kipp_aligned_free(s->vx);
    free(s);
}

static void *kvq_setup(const kcase *c, const k_cpu_ops *k, kc_mode mode)
{
    (void)mode;
    kvq_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->k = k;
    s->nb = (uint32_t)(c->s[0] < 64 ? c->s[0] : 64);
    for (uint32_t b = 0; b < s->nb; b++) s->bt[b] = (b * 5 + 2) % s->nb; /* scrambled */
    size_t bytes = (size_t)s->nb * KIPP_KV_BLOCK * K_KVQ8_ROW, n = 6 * KV_ROW;
    s->kc = calloc(1, bytes); s->vc = calloc(1, bytes);
    s->kx = kc_rand_f32(n, -8, 8); s->vx = kc_rand_f32(n, -0.01f, 0.01f);
    if (!s->kc || !s->vc || !s->kx || !s->vx || s->nb < 4) { kvq_release(s); return NULL; }
    for (size_t i = 0; i < 32; i++) s->kx[KV_ROW + i] = 0.0f; /* an all-zero block: scale 0 */
    s->kx[2 * KV_ROW + 7] = 1000.0f;                          /* an outlier block */
    s->vx[3 * KV_ROW + 40] = NAN;                             /* NaN stores 0, the block stays finite */
    return s;
}

static void kvq_run(void *p, int ith, int nth)
{
    kvq_state *s = p;
    for (size_t i = 0; i < 6; i++)
        if ((int)(i % (size_t)nth) == ith)
            s->k->kv_write_q8_0(s->kc, s->vc, s->bt, kvq_pos[i], s->kx + i * KV_ROW, s->vx + i * KV_ROW);
}

/* One written row against its input: per 32 values the fp16 scale is amax/127
 * (NaN ignored), and every value is within half a step of d*q (plus the scale's
 * own fp16 rounding times 127). 1 if not. */
static int kvq_row_bad(const uint8_t *r, const float *x)
{
    for (size_t b = 0; b < KV_ROW / 32; b++) {
        float amax = 0;
        for (size_t i = 0; i < 32; i++) amax = fabsf(x[32 * b + i]) > amax ? fabsf(x[32 * b + i]) : amax;
        float d = k_f16_at(r + K_KVQ8_Q + 2 * b), want = kipp_f16_to_f32(kipp_f32_to_f16(amax / 127.0f));
        if (d != want) return 1;
        double tol = 0.5 * d + 127.0 * fabs((double)amax / 127.0 - d) + 1e-30;
        for (size_t i = 0; i < 32; i++) {
            int q = ((const int8_t *)r)[32 * b + i];
            float xi = x[32 * b + i];
            if (q < -127 || (xi == xi && fabs((double)d * q - xi) > tol) || (xi != xi && q != 0)) return 1;
        }
    }
    return 0;
}

static double kvq_error(void *p)
{
    kvq_state *s = p;
    for (size_t i = 0; i < 6; i++) {
        uint32_t pos = kvq_pos[i];
        size_t off = ((size_t)s->bt[pos / 32] * 32 + pos % 32) * K_KVQ8_ROW; /* independent page mapping */
        if (kvq_row_bad(s->kc + off, s->kx + i * KV_ROW) || kvq_row_bad(s->vc + off, s->vx + i * KV_ROW)) return 1.0;
    }
    return 0.0;
}

static double kvq_bytes(const kcase *c) { (void)c; return 6.0 * KV_ROW * 4 * 2; }
static double kvq_no_flops(const kcase *c) { (void)c; return 0; }

/* ---- the walks: s = group p0 p1 layers(bench) ---- */

typedef struct {
    const k_cpu_ops *k;
    size_t group, layers, layer_bytes;
    uint32_t p0, p1, *bt;
    uint8_t *kc, *vc; /* [layers][n_blocks*32] rows */
    float *q, *m, *l, *acc, *mr, *lr, *accr;
    int rows;
} fq_state;

static void fq_release(void *p)
{
    fq_state *s = p;
    if (!s) return;
    free(s->kc); free(s->vc); free(s->bt);
    float *f[] = {s->q, s->m, s->l, s->acc, s->mr, s->lr, s->accr};
    for (size_t i = 0; i < 7; i++) kipp_aligned_free(f[i]);
    free(s);
}

/* Quantize random rows into every physical row of layer 0 (K +-1, V +-1), copy to the other layers. */
static int fq_fill(fq_state *s, size_t n_blocks)
{
    float *x = kc_rand_f32(2 * KV_ROW, -1, 1);
    uint32_t *id = malloc(n_blocks * sizeof *id);
    if (!x || !id) { kipp_aligned_free(x); free(id); return -1; }
    for (size_t b = 0; b < n_blocks; b++) id[b] = (uint32_t)b;
    for (uint32_t p = 0; p < n_blocks * KIPP_KV_BLOCK; p++) {
        for (size_t i = 0; i < 2 * KV_ROW; i++) x[i] = x[i] * -0.75f + 0.25f * sinf((float)(p * 7 + i)); /* vary rows */
        k_kv_write_q8_0_ref(s->kc, s->vc, id, p, x, x + KV_ROW);
    }
    for (size_t L = 1; L < s->layers; L++) {
        memcpy(s->kc + L * s->layer_bytes, s->kc, s->layer_bytes);
        memcpy(s->vc + L * s->layer_bytes, s->vc, s->layer_bytes);
    }
    kipp_aligned_free(x); free(id);
    return 0;
}

static void *fq_setup(const kcase *c, const k_cpu_ops *k, kc_mode mode)
{
    fq_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->k = k;
    s->rows = !strcmp(c->op, "flash_rows_q8_0");
    s->group = c->s[0];
    s->p0 = (uint32_t)c->s[1];
    s->p1 = (uint32_t)c->s[2];
    s->layers = mode == KC_BENCH && c->s[3] > 1 ? c->s[3] : 1;
    size_t nbt = (s->p1 + KIPP_KV_BLOCK - 1) / KIPP_KV_BLOCK, n_blocks = nbt + 2, H = KIPP_N_KV_HEAD * s->group;
    size_t units = s->layers * KIPP_N_KV_HEAD * K_ATTN_LANES;
    s->layer_bytes = n_blocks * KIPP_KV_BLOCK * K_KVQ8_ROW;
    s->kc = malloc(s->layers * s->layer_bytes); s->vc = malloc(s->layers * s->layer_bytes);
    s->bt = malloc(nbt * sizeof(uint32_t)); /* exact size: ASan flags a read past the walk's pages */
    s->q = kc_rand_f32(H * HD, -3, 3);
    s->m = kc_rand_f32(units * s->group, 0, 0); s->l = kc_rand_f32(units * s->group, 0, 0);
    s->acc = kc_rand_f32(units * s->group * HD, 0, 0);
    s->mr = kc_rand_f32(H, 0, 0); s->lr = kc_rand_f32(H, 0, 0); s->accr = kc_rand_f32(H * HD, 0, 0);
    if (!s->kc || !s->vc || !s->bt || !s->q || !s->m || !s->l || !s->acc || !s->mr || !s->lr || !s->accr ||
        fq_fill(s, n_blocks)) { fq_release(s); return NULL; }
    for (size_t b = 0; b < nbt; b++) s->bt[b] = (uint32_t)((b * 37u + 11u) % n_blocks);
    if (n_blocks % 37 == 0) for (size_t b = 0; b < nbt; b++) s->bt[b] = (uint32_t)(n_blocks - 1 - b);
    k_attn_init(units * s->group, s->m, s->l, s->acc);
    k_attn_init(H, s->mr, s->lr, s->accr);
    if (mode == KC_CHECK)
        k_flash_rows_q8_0_ref(s->q, s->group, s->kc, s->vc, s->bt, 0, KIPP_N_KV_HEAD, s->p0, s->p1, K_ATTN_NO_NEXT,
                              1.0f / sqrtf((float)HD), s->mr, s->lr, s->accr);
    return s;
}

/* Page a (a multiple of 32) cut to [p0, p1). */
static void fq_page(const fq_state *s, uint32_t a, uint32_t *lo, uint32_t *hi)
{
    *lo = a > s->p0 ? a : s->p0;
    *hi = a + KIPP_KV_BLOCK < s->p1 ? a + KIPP_KV_BLOCK : s->p1;
}

/* gqa: units (layer, KV head), one walk over [p0, p1). rows: units (layer,
 * lane), the lane's pages walked by flash_rows in head ranges of 8 >> (page % 4)
 * (as more decode workers split them); lane i of layer L at slot 2L + i. */
static void fq_run(void *p, int ith, int nth)
{
    fq_state *s = p;
    const size_t G = s->group, H = KIPP_N_KV_HEAD * G;
    const float sc = 1.0f / sqrtf((float)HD);
    if (!s->rows) {
        size_t u0, u1;
        k_split_rows(s->layers * KIPP_N_KV_HEAD, ith, nth, 1, &u0, &u1);
        for (size_t u = u0; u < u1; u++) {
            size_t L = u / KIPP_N_KV_HEAD, h = u % KIPP_N_KV_HEAD;
            s->k->flash_gqa_q8_0(s->q + h * G * HD, G, s->kc + L * s->layer_bytes, s->vc + L * s->layer_bytes,
                                 (uint32_t)h, s->bt, s->p0, s->p1, sc, s->m + u * G, s->l + u * G, s->acc + u * G * HD);
        }
        return;
    }
    for (size_t u = (size_t)ith; u < s->layers * K_ATTN_LANES; u += (size_t)nth) {
        size_t L = u / K_ATTN_LANES;
        float *m = s->m + u * H, *l = s->l + u * H, *acc = s->acc + u * H * HD;
        for (uint32_t a = s->p0 / KIPP_KV_BLOCK * KIPP_KV_BLOCK, lo, hi; a < s->p1; a += KIPP_KV_BLOCK) {
            if (k_attn_lane(a) != u % K_ATTN_LANES) continue;
            fq_page(s, a, &lo, &hi);
            uint32_t w = KIPP_N_KV_HEAD >> (a / KIPP_KV_BLOCK % 4);
            for (uint32_t h0 = 0; h0 < KIPP_N_KV_HEAD; h0 += w)
                s->k->flash_rows_q8_0(s->q, G, s->kc + L * s->layer_bytes, s->vc + L * s->layer_bytes, s->bt, h0,
                                      h0 + w, lo, hi, K_ATTN_NO_NEXT, sc, m, l, acc);
        }
    }
}

/* NMSE of acc/l against the oracle, 1 when a softmax denominator l e^m is off by > 1e-5. */
static double fq_compare(const fq_state *s, const float *m, const float *l, const float *acc)
{
    size_t H = KIPP_N_KV_HEAD * s->group;
    double num = 0, den = 0, worst = 0;
    for (size_t h = 0; h < H; h++) {
        for (size_t i = 0; i < HD; i++) {
            double a = acc[h * HD + i] / l[h], r = s->accr[h * HD + i] / s->lr[h];
            num += (a - r) * (a - r);
            den += r * r;
        }
        double d = fabs((double)l[h] * exp((double)m[h]) / ((double)s->lr[h] * exp((double)s->mr[h])) - 1.0);
        worst = d > worst ? d : worst;
    }
    double e = den > 0 ? num / den : num;
    return worst > 1e-5 || e != e ? 1.0 : e;
}

/* Head h's walk from a fresh state into (m, l, acc): as [p0, cut) + [cut, p1)
 * with `per` query vectors a call, or (lanes) page by page into two lane
 * states merged by k_attn_merge. m, l: [2G]; acc: [2G][128]. */
static void fq_walk(const fq_state *s, uint32_t h, uint32_t cut, size_t per, int lanes, float *m, float *l, float *acc)
{
    const size_t G = s->group;
    const float sc = 1.0f / sqrtf((float)HD);
    k_attn_init(2 * G, m, l, acc);
    if (lanes) {
        for (uint32_t a = s->p0 / KIPP_KV_BLOCK * KIPP_KV_BLOCK, lo, hi; a < s->p1; a += KIPP_KV_BLOCK) {
            size_t o = k_attn_lane(a) * G;
            fq_page(s, a, &lo, &hi);
            s->k->flash_gqa_q8_0(s->q + h * G * HD, G, s->kc, s->vc, h, s->bt, lo, hi, sc, m + o, l + o, acc + o * HD);
        }
        k_attn_merge(G, m, l, acc, m + G, l + G, acc + G * HD);
        return;
    }
    for (size_t g = 0; g < G; g += per) {
        const float *q = s->q + (h * G + g) * HD;
        if (cut > s->p0) s->k->flash_gqa_q8_0(q, per, s->kc, s->vc, h, s->bt, s->p0, cut, sc, m + g, l + g, acc + g * HD);
        if (cut < s->p1) s->k->flash_gqa_q8_0(q, per, s->kc, s->vc, h, s->bt, cut, s->p1, sc, m + g, l + g, acc + g * HD);
    }
}

/* Against the oracle, and bitwise: gqa split at a chunk multiple and one
 * vector at a time; rows (its two lanes merged) equal to gqa's lanes per head. */
static double fq_error(void *p)
{
    fq_state *s = p;
    const size_t G = s->group, H = KIPP_N_KV_HEAD * G;
    float *m = s->m, *l = s->l, *acc = s->acc;
    if (s->rows) k_attn_merge(H, m, l, acc, m + H, l + H, acc + H * HD);
    double e = fq_compare(s, m, l, acc);
    uint32_t cut = (s->p0 + (s->p1 - s->p0) / 3) / K_ATTN_CHUNK * K_ATTN_CHUNK + K_ATTN_CHUNK;
    cut = cut < s->p1 ? cut : s->p1;
    float *m2 = kc_rand_f32(2 * G, 0, 0), *l2 = kc_rand_f32(2 * G, 0, 0), *a2 = kc_rand_f32(2 * G * HD, 0, 0);
    int bad = !m2 || !l2 || !a2;
    for (uint32_t h = 0; h < KIPP_N_KV_HEAD && !bad; h++)
        for (int v = 0; v < (s->rows ? 1 : 2) && !bad; v++) {
            fq_walk(s, h, v ? s->p1 : cut, v ? 1 : G, s->rows, m2, l2, a2);
            bad = memcmp(m2, m + h * G, G * 4) || memcmp(l2, l + h * G, G * 4) ||
                  memcmp(a2, acc + h * G * HD, G * HD * 4);
        }
    kipp_aligned_free(m2); kipp_aligned_free(l2); kipp_aligned_free(a2);
    return bad ? 1.0 : e;
}

static double fq_bytes(const kcase *c)
{
    return (double)(c->s[3] ? c->s[3] : 1) * (double)(c->s[2] - c->s[1]) * K_KVQ8_ROW * 2;
}
static double fq_flops(const kcase *c)
{
    return (double)(c->s[3] ? c->s[3] : 1) * (double)(c->s[2] - c->s[1]) * KV_ROW * (double)c->s[0] * 4;
}

const kcase_kind kcase_kind_kv_write_q8_0 = {"kv_write_q8_0", "n_blocks", kvq_setup, kvq_run, kvq_error, kvq_release, kvq_bytes, kvq_no_flops, "memory"};
const kcase_kind kcase_kind_flash_gqa_q8_0 = {"flash_gqa_q8_0", "group p0 p1 layers(bench)", fq_setup, fq_run, fq_error, fq_release, fq_bytes, fq_flops, "memory"};
const kcase_kind kcase_kind_flash_rows_q8_0 = {"flash_rows_q8_0", "group p0 p1 layers(bench)", fq_setup, fq_run, fq_error, fq_release, fq_bytes, fq_flops, "memory"};
