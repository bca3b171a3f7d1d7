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
 * operands) or 30 (zmm) independent FMA chains; return the sum of the
 * accumulators. FLOPs per call: iters * KIPP_PROF_FMA_*_FLOPS. */
float kipp_prof_fma_avx2(long iters, float seed);
float kipp_prof_fma_avx512(long iters, float seed);

#define KIPP_PROF_FMA_AVX2_FLOPS (12.0 * 8 * 2)
#define KIPP_PROF_FMA_AVX512_FLOPS (30.0 * 16 * 2)

/* The avx512_bf16 level's dot peaks (probe_avx512_bf16.c): iters x 30
 * vdpbf16ps chains (2 BF16 pairs per lane: 4 FLOPs) and iters x 16 vpdpbusd
 * chains (4 byte products per lane, each a multiply and an add: 8 ops, counted
 * as FLOPs are). Ops per call: iters * KIPP_PROF_*_AVX512_*. */
float kipp_prof_bf16_avx512(long iters, float seed);
float kipp_prof_int8_avx512(long iters, float seed);

#define KIPP_PROF_BF16_AVX512_FLOPS (30.0 * 16 * 2 * 2)
#define KIPP_PROF_INT8_AVX512_OPS (16.0 * 16 * 4 * 2)

/* Define `float fn(long iters, float seed)`, a register-only peak loop: n
 * independent vf chains a[i] = STEP(a[i]) (STEP a macro of one vf), seeded
 * seed + i, iters rounds fully unrolled so the chains stay in registers (n <=
 * 32), returning the sum of every lane. Expanded after a
 * kernels/cpu/simd_*.h (the vf vocabulary): kernels/cpu/probe_simd.h (FMA)
 * and kernels/cpu/probe_avx512_bf16.c (BF16 dot). */
#define K_PEAK_F32_FN(fn, n, STEP)                                                \
    float fn(long iters, float seed)                                              \
    {                                                                             \
        vf a[n];                                                                  \
        for (int i = 0; i < (n); i++) a[i] = vf_set1(seed + (float)i);           \
        for (long it = 0; it < iters; it++) {                                     \
            _Pragma("GCC unroll 32") for (int i = 0; i < (n); i++) a[i] = STEP(a[i]); \
        }                                                                         \
        vf s = a[0];                                                              \
        for (int i = 1; i < (n); i++) s = vf_add(s, a[i]);                        \
        return vf_hsum(s);                                                        \
    }

#endif
