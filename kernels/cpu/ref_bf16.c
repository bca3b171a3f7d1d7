/*
 * ref_bf16.c - the bf16 weight format: its level-independent facts
 * (k_fmt_info) and its scalar kernels, the oracle for every SIMD level
 * (kernels.h "weight formats"). FP32 accumulation in column order, so the
 * packed matvec equals the file-layout linear bit for bit.
 */
#include "kernels/cpu/kernels.h"

size_t k_bf16_bytes(size_t rows, size_t cols) { return rows * cols * sizeof(kipp_bf16); }

/* RNE, as torch's .to(bfloat16) and tools/convert_to_gguf.py. */
void k_bf16_from_f32(const float *w, void *out, size_t rows, size_t cols)
{
    kipp_bf16 *o = out;
    for (size_t i = 0; i < rows * cols; i++) o[i] = kipp_f32_to_bf16(w[i]);
}

const k_fmt_info k_fmt_info_bf16 = {
    .name = "bf16",
    .gguf_type = 30,
    .row_align = 16,
    .col_align = 32,
    .file_bytes = k_bf16_bytes,
    .packed_bytes = k_bf16_bytes,
    .act = K_ACT_F32,
    .linear_ref = k_linear_bf16_ref,
    .from_f32 = k_bf16_from_f32,
};

/* Each token row is a plain dot per output row, so multi-row logits on the
 * ref backend are bitwise-equal to per-position evaluation. */
void k_linear_bf16_ref(const void *wv, const float *x, float *y, size_t rows, size_t cols,
                       size_t n_tok, int ith, int nth)
{
    const kipp_bf16 *w = wv;
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 1, &r0, &r1);
    for (size_t t = 0; t < n_tok; t++)
        for (size_t r = r0; r < r1; r++) {
            const kipp_bf16 *wr = w + r * cols;
            const float *xt = x + t * cols;
            float acc = 0.0f;
            for (size_t c = 0; c < cols; c++) acc += kipp_bf16_to_f32(wr[c]) * xt[c];
            y[t * rows + r] = acc;
        }
}

void k_pack_bf16_ref(const void *wv, void *wpv, size_t rows, size_t cols, int ith, int nth)
{
    const kipp_bf16 *w = wv;
    kipp_bf16 *wp = wpv;
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    for (size_t r = r0; r < r1; r++)
        for (size_t c = 0; c < cols; c++) wp[k_packed_index(r, c, cols)] = w[r * cols + c];
}

void k_matvec_bf16_ref(const void *wpv, const void *xv, float *y, size_t rows, size_t cols,
                       int ith, int nth)
{
    const kipp_bf16 *wp = wpv;
    const float *x = xv;
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    for (size_t r = r0; r < r1; r++) {
        float acc = 0.0f;
        for (size_t c = 0; c < cols; c++) acc += kipp_bf16_to_f32(wp[k_packed_index(r, c, cols)]) * x[c];
        y[r] = acc;
    }
}

void k_matmul_bf16_ref(const void *wpv, const void *xv, float *y, size_t rows, size_t cols,
                       size_t n_tok, int accumulate, int ith, int nth)
{
    const kipp_bf16 *wp = wpv;
    const float *x = xv;
    size_t r0, r1;
    k_split_rows(rows, ith, nth, 16, &r0, &r1);
    for (size_t t = 0; t < n_tok; t++) {
        const float *xt = x + t * cols;
        for (size_t r = r0; r < r1; r++) {
            float acc = 0.0f;
            for (size_t c = 0; c < cols; c++)
                acc += kipp_bf16_to_f32(wp[k_packed_index(r, c, cols)]) * xt[c];
            y[t * rows + r] = accumulate ? y[t * rows + r] + acc : acc;
        }
    }
}
