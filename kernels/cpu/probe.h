/*
 * probe.h - machine probes shared by `make profile` (bench/profile.c) and the
 * planner (engine/plan_probe.c): a streaming read loop and a register-only FP32
 * FMA loop per ISA level, each file built with its level's flags (Makefile
 * pattern rules). Pure compute on plain pointers, as every kernel.
 */
#ifndef KIPP_KERNELS_PROBE_H
#define KIPP_KERNELS_PROBE_H

#include <stddef.h>
#include <stdint.h>

/* Stream-read bytes [p, p+n) (p 64-byte aligned, n % 256 == 0) and return a
 * checksum so the loads cannot be dropped. Four independent 32/64-byte loads per step. */
uint64_t kipp_prof_read_avx2(const void *p, size_t n);
uint64_t kipp_prof_read_avx512(const void *p, size_t n);

/* Register-only loops: iters x 12 (ymm: its 16 registers must also hold the
 * operands) or 30 (zmm) independent FMA chains; return a value derived from the
 * accumulators. FLOPs per call: iters * KIPP_PROF_FMA_*_FLOPS. */
float kipp_prof_fma_avx2(long iters, float seed);
float kipp_prof_fma_avx512(long iters, float seed);

#define KIPP_PROF_FMA_AVX2_FLOPS (12.0 * 8 * 2)
#define KIPP_PROF_FMA_AVX512_FLOPS (30.0 * 16 * 2)

#endif
