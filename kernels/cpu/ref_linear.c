/*
 * ref_linear.c - the one scalar driver of every format's reference kernels
 * (kernels.h "weight formats"): a format's ref file writes only its per-row
 * and per-block arithmetic (a packed row dot, a file-layout row dot, a block
 * packer), and these loops run it over the rows, tokens and thread split.
 * The call per row costs nothing next to the row's dot.
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
