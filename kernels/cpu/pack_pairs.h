/*
 * pack_pairs.h - a fast packer for the bf16 packed layout (kernels.h "weight
 * formats": [rows/16][cols/2][16][2] bf16), used where packing runs per token:
 * the cpu backend's streaming path (backends/cpu/cpu_stream.c) packs each
 * slice of file rows into a small per-worker buffer just before the format's
 * own matvec or matmul reads it.
 */
#ifndef KIPP_KERNELS_CPU_PACK_PAIRS_H
#define KIPP_KERNELS_CPU_PACK_PAIRS_H

#include <stddef.h>

/**
 * k_pack_fn of the bf16 and bf16dot formats, the same bytes as
 * k_pack_bf16_ref (kcheck-free: test_cpu_backend compares the two), moving
 * whole k-pairs (32 bits) instead of single values through k_packed_index.
 * w: [rows][cols] bf16 file layout; wp: packed; rows % 16 == 0, cols % 32 == 0.
 */
void k_pack_bf16_pairs(const void *w, void *wp, size_t rows, size_t cols, int ith, int nth);

#endif
