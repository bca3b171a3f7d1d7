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

#endif
