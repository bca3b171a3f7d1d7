/*
 * kcase_linear.c - kernel-case kinds of the weight formats (kcase.h): pack,
 * matvec, matmul (against the format's scalar kernel on the same quantized
 * activations: the kernel's own error), matmul_f32 (activation quantization
 * plus matmul against the FP32 oracle over the file layout: what the format
 * costs in accuracy), rowinv (row invariance: each row of the level's matmul
 * equals the level's matvec on that row, bit for bit), matmul_outl (matmul_f32
 * with one outlier per Q8 block: the format's outlier_fix) and act (the
 * activation quantizers, bit-exact).
 *
 * NMSE bounds (kcase_table.c) and why: FP32 sums in another order carry a
 * relative rounding of ~2^-24 * sqrt(cols) per partial, NMSE ~1e-11 at cols
 * 3072: bound 1e-9, 100x margin, while a wrong index or a lost tail gives
 * NMSE >= 1e-4.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/check/kcase.h"

/* ---- weights and activations of one format ---- */

typedef struct {
    const kcase *c;
    const k_cpu_ops *k;
    const k_fmt_info *fi;
    size_t rows, cols, n_tok, copies;
    void *w;       /* [rows][cols] file layout (copy 0) */
    char *wp;      /* [copies] packed copies, kc_alloc_big */
    size_t wp_bytes;
    float *x;      /* [n_tok][cols] f32 */
    void *xa;      /* [n_tok][cols] in the activation format the path reads */
    float *y, *y0, *ref; /* [copies][n_tok][rows] */
    int acc;       /* matmul accumulate flag */
} lin_state;

static void lin_release(void *p)
{
    lin_state *s = p;
    if (!s) return;
    kipp_aligned_free(s->w);
    free(s->wp);
    kipp_aligned_free(s->x);
    kipp_aligned_free(s->xa);
    kipp_aligned_free(s->y);
    kipp_aligned_free(s->y0);
    kipp_aligned_free(s->ref);
    free(s);
}

/* Quantize x into the act format a with table k (F32: a copy). */
static void act_quantize(const k_cpu_ops *k, k_act a, const float *x, void *xa, size_t n)
{
    if (a == K_ACT_F32) memcpy(xa, x, n * sizeof(float));
    else k->act[a](x, xa, n);
}

/* Common setup: file-layout weights from FP32, packed `copies` times (only a
 * benchmark sweeps several, past the LLC), and activations in act, the format
 * the path reads. */
static lin_state *lin_setup(const kcase *c, const k_cpu_ops *k, size_t copies, size_t n_tok, k_act act)
{
    lin_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->c = c;
    s->k = k;
    s->fi = k_fmt_get((k_fmt)c->fmt);
    s->rows = c->s[0];
    s->cols = c->s[1];
    s->n_tok = n_tok;
    s->copies = copies;
    float *wf = kc_rand_f32(s->rows * s->cols, -0.05f, 0.05f);
    s->w = kipp_aligned_alloc(k_fmt_file_bytes(s->fi, s->rows, s->cols));
    s->wp_bytes = s->fi->packed_bytes(s->rows, s->cols);
    s->wp = kc_alloc_big(s->wp_bytes * s->copies);
    s->x = kc_rand_f32(n_tok * s->cols, -1, 1);
    s->xa = kipp_aligned_alloc(k_act_row_bytes(act, n_tok * s->cols) + 64);
    size_t ny = s->copies * n_tok * s->rows;
    s->y = kc_rand_f32(ny, 0, 0);
    s->y0 = kc_rand_f32(ny, -1, 1);
    s->ref = kc_rand_f32(ny, 0, 0);
    if (!wf || !s->w || !s->wp || !s->x || !s->xa || !s->y || !s->y0 || !s->ref) {
        kipp_aligned_free(wf);
        lin_release(s);
        return NULL;
    }
    s->fi->from_f32(wf, s->w, s->rows, s->cols);
    kipp_aligned_free(wf);
    k->fmt[c->fmt].pack(s->w, s->wp, s->rows, s->cols, 0, 1);
    for (size_t i = 1; i < s->copies; i++) memcpy(s->wp + i * s->wp_bytes, s->wp, s->wp_bytes); /* same bytes: timing only */
    act_quantize(k, act, s->x, s->xa, n_tok * s->cols);
    return s;
}

static double lin_error(void *p)
{
    lin_state *s = p;
    size_t n = s->n_tok * s->rows;
    if (s->acc)
        for (size_t i = 0; i < n; i++) s->y[i] -= s->y0[i];
    return kc_nmse(s->y, s->ref, n);
}

/* ---- matvec: s = rows cols copies; oracle linear_ref (FP32, file layout) ---- */

static void *matvec_setup(const kcase *c, const k_cpu_ops *k, kc_mode mode)
{
    const k_fmt_info *fi = k_fmt_get((k_fmt)c->fmt);
    lin_state *s = lin_setup(c, k, mode == KC_BENCH && c->s[2] > 1 ? c->s[2] : 1, 1, fi->act);
    if (s && mode == KC_CHECK) fi->linear_ref(s->w, s->x, s->ref, s->rows, s->cols, 1, 0, 1);
    return s;
}

static void matvec_run(void *p, int ith, int nth)
{
    lin_state *s = p;
    for (size_t i = 0; i < s->copies; i++) {
        s->k->fmt[s->c->fmt].matvec(s->wp + i * s->wp_bytes, s->xa, s->y + i * s->rows, s->rows, s->cols, ith, nth);
        if (s->fi->outlier_fix)
            s->fi->outlier_fix(s->wp + i * s->wp_bytes, s->xa, s->y + i * s->rows, s->rows, s->cols, 1, ith, nth);
    }
}

static double matvec_bytes(const kcase *c)
{
    return (double)k_fmt_get((k_fmt)c->fmt)->packed_bytes(c->s[0], c->s[1]) * (double)(c->s[2] ? c->s[2] : 1);
}
static double matvec_flops(const kcase *c) { return 2.0 * (double)c->s[0] * (double)c->s[1] * (double)(c->s[2] ? c->s[2] : 1); }

/* A check runs at most this many tokens of a row: 64 covers every tile and
 * tail shape of every level (tiles of 6 and 12 tokens), and the benchmark
 * rows' 512 only repeat them, at minutes of scalar oracle under emulation. */
#define KC_CHECK_MAX_TOK 64u

static size_t row_tokens(const kcase *c, kc_mode mode)
{
    return mode == KC_CHECK && c->s[2] > KC_CHECK_MAX_TOK ? KC_CHECK_MAX_TOK : c->s[2];
}

/* ---- matmul: s = rows cols n_tok accumulate; oracle the format's scalar matmul ---- */

static void *matmul_setup(const kcase *c, const k_cpu_ops *k, kc_mode mode)
{
    const k_fmt_info *fi = k_fmt_get((k_fmt)c->fmt);
    lin_state *s = lin_setup(c, k, 1, row_tokens(c, mode), fi->act);
    if (!s) return NULL;
    s->acc = (int)c->s[3];
    if (s->acc) memcpy(s->y, s->y0, s->n_tok * s->rows * sizeof(float));
    if (mode == KC_CHECK) {
        const k_cpu_ops *r = k_cpu_ops_table(KIPP_ISA_REF, NULL);
        void *wr = kipp_aligned_alloc(s->wp_bytes);
        if (!wr) { lin_release(s); return NULL; }
        r->fmt[c->fmt].pack(s->w, wr, s->rows, s->cols, 0, 1);
        r->fmt[c->fmt].matmul(wr, s->xa, s->ref, s->rows, s->cols, s->n_tok, 0, 0, 1);
        kipp_aligned_free(wr);
    }
    return s;
}

static void matmul_run(void *p, int ith, int nth)
{
    lin_state *s = p;
    s->k->fmt[s->c->fmt].matmul(s->wp, s->xa, s->y, s->rows, s->cols, s->n_tok, s->acc, ith, nth);
}

static double matmul_bytes(const kcase *c) { return (double)k_fmt_get((k_fmt)c->fmt)->packed_bytes(c->s[0], c->s[1]); }
static double matmul_flops(const kcase *c) { return 2.0 * (double)c->s[0] * (double)c->s[1] * (double)c->s[2]; }

/* ---- matmul_f32: s = rows cols n_tok; the path's activation quantizer and
 * matmul against the FP32 oracle over the file layout ---- */

static void *matmul_f32_setup(const kcase *c, const k_cpu_ops *k, kc_mode mode)
{
    const k_fmt_info *fi = k_fmt_get((k_fmt)c->fmt);
    lin_state *s = lin_setup(c, k, 1, row_tokens(c, mode), fi->act);
    if (s && mode == KC_CHECK) fi->linear_ref(s->w, s->x, s->ref, s->rows, s->cols, s->n_tok, 0, 1);
    return s;
}

static void matmul_f32_run(void *p, int ith, int nth)
{
    lin_state *s = p;
    k_act a = s->fi->act;
    /* check threads run in order, so thread 0 quantizes before any matmul
     * share; not a benchmark row (kcase_table.c), where threads overlap */
    if (ith == 0) act_quantize(s->k, a, s->x, s->xa, s->n_tok * s->cols);
    s->k->fmt[s->c->fmt].matmul(s->wp, s->xa, s->y, s->rows, s->cols, s->n_tok, 0, ith, nth);
    if (s->fi->outlier_fix) s->fi->outlier_fix(s->wp, s->xa, s->y, s->rows, s->cols, s->n_tok, ith, nth);
}

/* ---- matmul_outl: s = rows cols n_tok; matmul_f32 on activations where
 * every 32-block has one value 50x the others' range (k_act_q8_block's
 * outlier): the quantizer keeps it in FP32 and the format's outlier_fix adds
 * it back, so the bound is matmul_f32's; without the fix the NMSE is ~1 ---- */

static void *matmul_outl_setup(const kcase *c, const k_cpu_ops *k, kc_mode mode)
{
    const k_fmt_info *fi = k_fmt_get((k_fmt)c->fmt);
    lin_state *s = lin_setup(c, k, 1, row_tokens(c, mode), fi->act);
    if (!s) return NULL;
    for (size_t b = 0; b < s->n_tok * s->cols / 32; b++) s->x[32 * b + (b * 7) % 32] *= 50.0f;
    if (mode == KC_CHECK) fi->linear_ref(s->w, s->x, s->ref, s->rows, s->cols, s->n_tok, 0, 1);
    return s;
}

/* ---- rowinv: s = rows cols n_tok; the matmul's rows against the same
 * level's matvec per row, bit for bit (kernels.h "row invariance") ---- */

static void *rowinv_setup(const kcase *c, const k_cpu_ops *k, kc_mode mode)
{
    const k_fmt_info *fi = k_fmt_get((k_fmt)c->fmt);
    lin_state *s = lin_setup(c, k, 1, row_tokens(c, mode), fi->act);
    if (!s) return NULL;
    size_t xb = k_act_row_bytes(fi->act, s->cols);
    for (size_t t = 0; t < s->n_tok; t++)
        k->fmt[c->fmt].matvec(s->wp, (const char *)s->xa + t * xb, s->ref + t * s->rows, s->rows, s->cols, 0, 1);
    return s;
}

static double rowinv_error(void *p)
{
    lin_state *s = p;
    return memcmp(s->y, s->ref, s->n_tok * s->rows * sizeof(float)) == 0 ? 0.0 : 1.0;
}

/* ---- pack: s = rows cols; the path's layout equals the scalar packer's, byte for byte ---- */

static void *pack_setup(const kcase *c, const k_cpu_ops *k, kc_mode mode)
{
    (void)mode;
    lin_state *s = lin_setup(c, k, 1, 1, K_ACT_F32);
    if (!s) return NULL;
    memset(s->wp, 0, s->wp_bytes);
    kipp_aligned_free(s->ref); /* replaced by the scalar packer's layout */
    s->ref = kipp_aligned_alloc(s->wp_bytes);
    if (!s->ref) { lin_release(s); return NULL; }
    k_cpu_ops_table(KIPP_ISA_REF, NULL)->fmt[c->fmt].pack(s->w, s->ref, s->rows, s->cols, 0, 1);
    return s;
}

static void pack_run(void *p, int ith, int nth)
{
    lin_state *s = p;
    s->k->fmt[s->c->fmt].pack(s->w, s->wp, s->rows, s->cols, ith, nth);
}

static double pack_error(void *p)
{
    lin_state *s = p;
    return memcmp(s->wp, s->ref, s->wp_bytes) == 0 ? 0.0 : 1.0;
}

static double pack_bytes(const kcase *c)
{
    const k_fmt_info *fi = k_fmt_get((k_fmt)c->fmt);
    return (double)(k_fmt_file_bytes(fi, c->s[0], c->s[1]) + fi->packed_bytes(c->s[0], c->s[1]));
}
static double no_flops(const kcase *c) { (void)c; return 0; }

/* ---- act: s = n act; the quantizer equals the scalar one bit for bit, specials included ---- */

typedef struct {
    const k_cpu_ops *k;
    k_act a;
    size_t n, bytes;
    float *x;
    void *out, *ref;
} act_state;

static void act_release(void *p)
{
    act_state *s = p;
    if (!s) return;
    kipp_aligned_free(s->x);
    kipp_aligned_free(s->out);
    kipp_aligned_free(s->ref);
    free(s);
}

static void *act_setup(const kcase *c, const k_cpu_ops *k, kc_mode mode)
{
    act_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->k = k;
    s->a = (k_act)c->s[1];
    s->n = c->s[0];
    s->bytes = k_act_row_bytes(s->a, s->n);
    s->x = kc_rand_f32(s->n, -3e4f, 3e4f);
    s->out = kipp_aligned_alloc(s->bytes + 64);
    s->ref = kipp_aligned_alloc(s->bytes + 64);
    if (!s->x || !s->out || !s->ref || s->a == K_ACT_F32 || !k->act[s->a]) { act_release(s); return NULL; }
    const float special[] = {0.0f, -0.0f, 1e-40f, -3e-39f, 1.0f / 0.0f, -1.0f / 0.0f, 0.0f / 0.0f,
                             1.00390625f, 1.01171875f, 3.4e38f, -1e-45f};
    memcpy(s->x, special, sizeof special < s->n * 4 ? sizeof special : s->n * 4);
    if (s->a == K_ACT_Q8 && s->n >= 128) { /* Q8 outliers (k_act_q8_block): a tie of two, then one per third block */
        s->x[64] = s->x[65] = 1e6f;
        for (size_t b = 3; b < s->n / 32; b += 3) s->x[32 * b + (b * 5) % 32] *= 100.0f;
    }
    if (mode == KC_CHECK) k_cpu_ops_table(KIPP_ISA_REF, NULL)->act[s->a](s->x, s->ref, s->n);
    return s;
}

static void act_run(void *p, int ith, int nth)
{
    act_state *s = p;
    size_t e0, e1;
    k_split_rows(s->n, ith, nth, 32, &e0, &e1);
    if (e1 > e0) s->k->act[s->a](s->x + e0, (char *)s->out + k_act_row_bytes(s->a, e0), e1 - e0);
}

static double act_error(void *p)
{
    act_state *s = p;
    return memcmp(s->out, s->ref, s->bytes) == 0 ? 0.0 : 1.0;
}

static double act_bytes(const kcase *c) { return (double)c->s[0] * 4 + (double)k_act_row_bytes((k_act)c->s[1], c->s[0]); }

const kcase_kind kcase_kind_matvec = {"matvec", "rows cols copies(bench)", matvec_setup, matvec_run, lin_error, lin_release, matvec_bytes, matvec_flops, "memory"};
const kcase_kind kcase_kind_matmul = {"matmul", "rows cols n_tok accumulate", matmul_setup, matmul_run, lin_error, lin_release, matmul_bytes, matmul_flops, "compute"};
const kcase_kind kcase_kind_matmul_f32 = {"matmul_f32", "rows cols n_tok", matmul_f32_setup, matmul_f32_run, lin_error, lin_release, matmul_bytes, matmul_flops, "compute"};
const kcase_kind kcase_kind_matmul_outl = {"matmul_outl", "rows cols n_tok", matmul_outl_setup, matmul_f32_run, lin_error, lin_release, matmul_bytes, matmul_flops, "compute"};
const kcase_kind kcase_kind_rowinv = {"rowinv", "rows cols n_tok", rowinv_setup, matmul_run, rowinv_error, lin_release, matmul_bytes, matmul_flops, "compute"};
const kcase_kind kcase_kind_pack = {"pack", "rows cols", pack_setup, pack_run, pack_error, lin_release, pack_bytes, no_flops, "memory"};
const kcase_kind kcase_kind_act = {"act", "n act_format", act_setup, act_run, act_error, act_release, act_bytes, no_flops, "memory"};
