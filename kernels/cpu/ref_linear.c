/*
 * ref_linear.c - the one scalar driver of every format's reference kernels
 * (kernels.h "weight formats"): a format's ref file writes only its per-row
 * and per-block arithmetic (a packed row dot, a file-layout row dot, a block
 * packer), and these loops run it over the rows, tokens and thread split.
 * The 32-column block formats with a 16-row panel layout (q8_0, affine4) go one
 * step further: they give only the decode of one block (k_block_fmt), and the
 * block walkers below are their file-layout row dot, packed row dot and
 * outlier_fix. The call per row, block or column costs nothing next to the
 * arithmetic it feeds.
 */
#include <string.h>

#include "kernels/cpu/kernels.h"

void k_ref_matvec(k_row_dot_fn dot, const void *wp, const void *x, float *y, size_t rows, size_t cols, int ith,
                  int nth)
{
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    for (size_t r = r0; r < r1; r++) y[r] = dot(wp, r, cols, x);
}

void k_ref_matmul(k_row_dot_fn dot, k_act act, const void *wp, const void *xa, float *y, size_t rows, size_t cols,
                  size_t n_tok, int accumulate, int ith, int nth)
{
    const size_t xs = k_act_row_bytes(act, cols);
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    for (size_t t = 0; t < n_tok; t++)
        for (size_t r = r0; r < r1; r++) {
            float acc = dot(wp, r, cols, (const uint8_t *)xa + t * xs);
            y[t * rows + r] = accumulate ? y[t * rows + r] + acc : acc;
        }
}

void k_ref_linear(k_file_row_dot_fn dot, size_t row_bytes, const void *w, const float *x, float *y, size_t rows,
                  size_t cols, size_t n_tok, int ith, int nth)
{
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 1, &r0, &r1);
    for (size_t t = 0; t < n_tok; t++)
        for (size_t r = r0; r < r1; r++) y[t * rows + r] = dot((const uint8_t *)w + r * row_bytes, x + t * cols, cols);
}

void k_ref_pack16(k_pack_block_fn pack, size_t file_block, size_t packed_block, const void *w, void *wp,
                  size_t rows, size_t cols, int ith, int nth)
{
    const size_t nb = cols / 32;
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    for (size_t r = r0; r < r1; r++)
        for (size_t b = 0; b < nb; b++)
            pack((const uint8_t *)w + (r * nb + b) * file_block, (uint8_t *)wp + ((r / 16) * nb + b) * packed_block,
                 (unsigned)(r % 16));
}

float k_block_file_row_dot(const k_block_fmt *f, const void *w_row, const float *x, size_t cols)
{
    const uint8_t *blk = w_row;
    float acc = 0.0f;
    for (size_t b = 0; b < cols / 32; b++, blk += f->file_block) {
        float w[32];
        f->file_f32(blk, w);
        for (unsigned c = 0; c < 32; c++) acc += w[c] * x[b * 32 + c];
    }
    return acc;
}

/* The lane's scale d and, affine, minimum m (k_block_fmt: fp16 d[16], then fp16 m[16]). */
static float lane_d(const uint8_t *pb, unsigned lane) { return k_f16_at(pb + 2 * lane); }
static float lane_m(const uint8_t *pb, unsigned lane) { return k_f16_at(pb + 32 + 2 * lane); }

float k_block_row_dot(const k_block_fmt *f, const void *wp, size_t r, size_t cols, const void *xq)
{
    const k_act_q8_block *xb = xq;
    const size_t nb = cols / 32;
    const unsigned lane = (unsigned)(r % 16);
    const uint8_t *panel = (const uint8_t *)wp + (r / 16) * nb * f->panel_block;
    float acc = 0.0f;
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *pb = panel + b * f->panel_block;
        int32_t q[32], isum = 0;
        f->lane_q(pb, lane, q);
        for (unsigned c = 0; c < 32; c++) isum += q[c] * xb[b].q[c];
        acc += (float)isum * (lane_d(pb, lane) * xb[b].d);
        if (f->affine) acc += lane_m(pb, lane) * (xb[b].d * (float)xb[b].sum);
    }
    return acc;
}

/* Outliers are rare and scattered, so the walk is column by column down the
 * panels, with the scale lines and the column's line prefetched K_FIX_PF
 * panels ahead. */
void k_block_outlier_fix(const k_block_fmt *f, const void *wp, const void *xa, float *y, size_t rows, size_t cols,
                         size_t n_tok, int ith, int nth)
{
    const size_t nb = cols / 32, ahead = K_FIX_PF * nb * f->panel_block;
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    for (size_t t = 0; t < n_tok; t++) {
        const k_act_q8_block *xb = (const k_act_q8_block *)xa + t * nb;
        float *yt = y + t * rows;
        for (size_t b = 0; b < nb; b++) {
            if (xb[b].io < 0) continue;
            unsigned c = (unsigned)xb[b].io;
            float xo = xb[b].xo;
            size_t line = f->q_line(c);
            for (size_t P = r0 / 16; P < r1 / 16; P++) {
                const uint8_t *pb = (const uint8_t *)wp + (P * nb + b) * f->panel_block;
                __builtin_prefetch(pb + ahead);
                __builtin_prefetch(pb + ahead + line);
                __builtin_prefetch(pb + ahead + line + 63); /* q8p16's q lines straddle two cache lines */
                int32_t q[16];
                f->col_q(pb, c, q);
                for (unsigned i = 0; i < 16; i++) {
                    float w = f->affine ? lane_d(pb, i) * (float)q[i] + lane_m(pb, i) : lane_d(pb, i) * (float)q[i];
                    yt[16 * P + i] += w * xo;
                }
            }
        }
    }
}
