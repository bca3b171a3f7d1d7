/*
 * kcuda.h - the CUDA kernel units (seed 000, phase 4): host launchers over
 * device pointers, each enqueued on the caller's stream. The contract between
 * kernels/cuda (which implements it) and backends/cuda (which composes it);
 * each unit is checked against its CPU *_ref by build/cuda/kcheck_cuda.
 *
 * Conventions:
 *   - every pointer is device memory unless it says "host";
 *   - activations are FP32, row-major [n_rows][width]; weights keep the GGUF
 *     file layout (bf16 row-major, Q8_0 and Q4_1 blocks as kernels/formats.h);
 *   - a batch of n_rows token rows may mix several sequences: kc_rows carries
 *     each row's position and block table, so one launch serves prefill,
 *     decode and a batched step of many sequences alike (and a CUDA graph can
 *     capture it with the metadata in fixed device buffers);
 *   - KV of one layer is [n_slots][n_kv_head][head_dim] bf16 with slot =
 *     block_table[pos / 32] * 32 + pos % 32 (kernels/cpu/kernels.h k_kv_off);
 *   - launchers return 0 or the cudaError_t of the launch as int; they never
 *     synchronise and never allocate, so they are legal inside stream capture.
 */
#ifndef KIPP_KCUDA_H
#define KIPP_KCUDA_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Per-row metadata of a batch of token rows (device memory, [n_rows] each). */
typedef struct {
    const int32_t *pos;    /* absolute position of each row */
    const int32_t *bt_off; /* offset of the row's sequence block table within bt */
    const uint32_t *bt;    /* concatenated block tables: logical block -> physical block */
} kc_rows;

/** out[r][c] = table[tokens[r]][c] as f32; table [vocab][d] in dtype (KIPP_DTYPE_*). */
int kc_embed(const void *table, uint32_t dtype, const uint32_t *tokens, uint32_t n_rows,
             uint32_t d, float *out, cudaStream_t s);

/**
 * y[r][o] = sum_c W[o][c] * x[r][c]. W: [out][in] in dtype (bf16, Q8_0, Q4_1;
 * in % 32 == 0), x: [n_rows][in] f32, y: [n_rows][out] f32, FP32 accumulation.
 * n_rows small (decode, batched decode): matvec path, one weight read per
 * launch; larger: matmul path (tensor cores for bf16; the quantized formats
 * dequantize one weight tile per 32-token tile).
 */
int kc_linear(const void *w, uint32_t dtype, uint32_t out, uint32_t in, const float *x,
              uint32_t n_rows, float *y, cudaStream_t s);

/** RMSNorm per row: y = x / sqrt(mean(x^2) + eps) * w; w [dim] bf16; y may equal x. */
int kc_rmsnorm(const uint16_t *w, const float *x, float *y, uint32_t n_rows, uint32_t dim,
               float eps, cudaStream_t s);

/** Per-head RMSNorm in place: x [n_rows][n_heads][head_dim], w [head_dim] bf16 (Qwen3 q_norm/k_norm). */
int kc_head_rmsnorm(const uint16_t *w, float *x, uint32_t n_rows, uint32_t n_heads,
                    uint32_t head_dim, float eps, cudaStream_t s);

/**
 * RoPE in place, rotate-half pairing (k_rope_f32_ref): x [n_rows][n_heads][128];
 * cs [n_pos][128] f32 is the host-built k_rope_table uploaded once, so the
 * angles round exactly as on the CPU; row r uses cs[pos[r]].
 */
int kc_rope(float *x, const int32_t *pos, const float *cs, uint32_t n_rows, uint32_t n_heads,
            cudaStream_t s);

/** out[i] = silu(gate[i]) * up[i] for i < n (k_swiglu_f32_ref). */
int kc_swiglu(const float *gate, const float *up, float *out, size_t n, cudaStream_t s);

/** x[i] += y[i] for i < n. */
int kc_add(float *x, const float *y, size_t n, cudaStream_t s);

/**
 * Paged KV write: row r's k and v ([n_rows][kv_dim] f32, kv_dim = n_kv_head *
 * 128) rounded to bf16 into the layer's caches at its slot (see top). A row
 * with pos < 0 writes nothing (and kc_attention gives it a zero output).
 */
int kc_kv_write(uint16_t *k_cache, uint16_t *v_cache, const float *k, const float *v,
                kc_rows rows, uint32_t n_rows, uint32_t kv_dim, cudaStream_t s);

/**
 * Causal flash GQA over the paged cache: row r's query heads (q [n_rows]
 * [n_q_head][128] f32, after RoPE) attend positions 0..pos[r] of the row's
 * sequence, query head h reading KV head h / (n_q_head / n_kv_head), scale
 * 1/sqrt(128), online softmax in FP32 (k_flash_gqa_bf16_ref). The rows' own K
 * and V must already be written. out [n_rows][n_q_head][128] f32. k_cache and
 * v_cache 16-byte aligned (else cudaErrorInvalidValue).
 */
int kc_attention(const float *q, const uint16_t *k_cache, const uint16_t *v_cache, kc_rows rows,
                 uint32_t n_rows, uint32_t n_q_head, uint32_t n_kv_head, float *out,
                 cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
