/*
 * profile.h - the measurement loops of `make profile` (bench/profile.c), one
 * per ISA so each file gets its flags from the Makefile pattern rules.
 */
#ifndef KIPP_BENCH_PROFILE_H
#define KIPP_BENCH_PROFILE_H

#include <stddef.h>
#include <stdint.h>

/* The read and FP32 FMA loops live in kernels/cpu/probe.h, shared with the planner. */
#include "kernels/cpu/probe.h"

/* Register-only loops: iters x 30 independent FMA (or vdpbf16ps) chains (12
 * for ymm FMA, whose 16 registers must also hold the operands); return a
 * value derived from the accumulators. Flops per call:
 *   fma_avx2:   iters * 12 * 8 lanes * 2
 *   fma_avx512: iters * 30 * 16 lanes * 2
 *   bf16_avx512: iters * 30 * 16 lanes * 2 pairs * 2
 *   int8_avx512: iters * 16 chains * 16 lanes * 4 byte products * 2 (ops, as FLOPs count) */
float kipp_prof_bf16_avx512(long iters, float seed);
float kipp_prof_int8_avx512(long iters, float seed);

#define KIPP_PROF_BF16_AVX512_FLOPS (30.0 * 16 * 2 * 2)
#define KIPP_PROF_INT8_AVX512_OPS (16.0 * 16 * 4 * 2)

#endif
