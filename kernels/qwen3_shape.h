/*
 * qwen3_shape.h - the Qwen3 family's fixed shapes, shared by the engine, the
 * kernels and GPU code (docs/ARCHITECTURE.md "Layers": the only model facts a
 * kernel may know without being told). Seed 000, "Checkpoint registry":
 * every dense Qwen3 has 8 KV heads of 128; the KV cache pages 32 positions.
 */
#ifndef KIPP_QWEN3_SHAPE_H
#define KIPP_QWEN3_SHAPE_H

#define KIPP_HEAD_DIM 128u  /* elements per attention head */
#define KIPP_N_KV_HEAD 8u   /* KV heads; n_q_head is a multiple of this */
#define KIPP_KV_BLOCK 32u   /* positions per KV page (block table entry) */

#include <stdint.h>

/**
 * YaRN RoPE scaling of a model (docs/FORMAT.md "RoPE scaling"; factor 0 =
 * none): the engine fills it from the file or --rope-scaling, every backend's
 * RoPE table (k_rope_table_yarn) reads it.
 */
typedef struct {
    double factor;             /* context multiplier, > 1; 0 = no scaling */
    uint32_t original_context; /* original_max_position_embeddings, tokens */
    double beta_fast;          /* rotations where extrapolation ends (32 by default) */
    double beta_slow;          /* rotations where interpolation starts (1 by default) */
} k_rope_yarn;

#endif
