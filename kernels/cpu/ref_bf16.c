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

const k_fmt_info k_fmt_info_bf16 = {.name = "bf16", .file = &kipp_fmts[KIPP_FMT_BF16], .row_align = 16,
    .col_align = 32, .packed_bytes = k_bf16_bytes, .act = K_ACT_F32, .linear_ref = k_linear_bf16_ref,
    .from_f32 = k_bf16_from_f32};

/* Each token row is a plain dot per output row, so multi-row logits on the
 * ref backend are bitwise-equal to per-position evaluation. */
static float bf16_file_row_dot(const void *wv, const float *x, size_t cols)
{
    const kipp_bf16 *wr = wv;
    float acc = 0.0f;
    for (size_t c = 0; c < cols; c++) acc += kipp_bf16_to_f32(wr[c]) * x[c];
    return acc;
}

void k_linear_bf16_ref(const void *w, const float *x, float *y, size_t rows, size_t cols, size_t n_tok, int ith,
                       int nth)
{
    k_ref_linear(bf16_file_row_dot, cols * sizeof(kipp_bf16), w, x, y, rows, cols, n_tok, ith, nth);
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

/* Row r of the packed layout against FP32 activations, FP32 in column order. */
static float bf16_row_dot(const void *wpv, size_t r, size_t cols, const void *xv)
{
    const kipp_bf16 *wp = wpv;
    const float *x = xv;
    float acc = 0.0f;
    for (size_t c = 0; c < cols; c++) acc += kipp_bf16_to_f32(wp[k_packed_index(r, c, cols)]) * x[c];
    return acc;
}

K_REF_ROW_KERNELS(bf16, bf16_row_dot, K_ACT_F32)
