/*
 * ref_packed.c - scalar references for the packed-weight ops (kernels.h,
 * "packed BF16 weights"): the oracle for their SIMD variants. FP32
 * accumulation in column order, exactly as k_matvec_bf16_ref, so the packed
 * matvec reference equals the unpacked one bit for bit.
 */
#include "kernels/cpu/kernels.h"

void k_pack_bf16_ref(const kipp_bf16 *w, kipp_bf16 *wp, size_t rows, size_t cols, int ith,
                     int nth)
{
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    for (size_t r = r0; r < r1; r++)
        for (size_t c = 0; c < cols; c++) wp[k_packed_index(r, c, cols)] = w[r * cols + c];
}

void k_cvt_bf16_ref(const float *x, kipp_bf16 *xb, size_t n)
{
    for (size_t i = 0; i < n; i++) xb[i] = kipp_f32_to_bf16(x[i]);
}

void k_matvec_bf16p_ref(const kipp_bf16 *wp, const float *x, float *y, size_t rows, size_t cols,
                        int ith, int nth)
{
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    for (size_t r = r0; r < r1; r++) {
        float acc = 0.0f;
        for (size_t c = 0; c < cols; c++) acc += kipp_bf16_to_f32(wp[k_packed_index(r, c, cols)]) * x[c];
        y[r] = acc;
    }
}

void k_matmul_bf16p_ref(const kipp_bf16 *wp, const kipp_bf16 *xb, float *y, size_t rows,
                        size_t cols, size_t n_tok, int accumulate, int ith, int nth)
{
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    for (size_t t = 0; t < n_tok; t++) {
        const kipp_bf16 *xt = xb + t * cols;
        for (size_t r = r0; r < r1; r++) {
            float acc = 0.0f;
            for (size_t c = 0; c < cols; c++)
                acc += kipp_bf16_to_f32(wp[k_packed_index(r, c, cols)]) * kipp_bf16_to_f32(xt[c]);
            y[t * rows + r] = accumulate ? y[t * rows + r] + acc : acc;
        }
    }
}
