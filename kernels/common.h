/*
 * common.h - the only header kernels share: BF16/FP16 conversion, aligned
 * allocation, ISA levels; the CPU feature flags they rest on come from
 * base/cpuinfo.h (docs/ARCHITECTURE.md, "Layers").
 */
#ifndef KIPP_KERNELS_COMMON_H
#define KIPP_KERNELS_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/cpuinfo.h"

/** BF16 as stored: the top 16 bits of an IEEE-754 binary32. */
typedef uint16_t kipp_bf16;

/** Exact widening BF16 -> FP32. */
static inline float kipp_bf16_to_f32(kipp_bf16 h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/** FP32 -> BF16, round to nearest even; NaN stays NaN (quiet). Matches torch's .to(bfloat16). */
static inline kipp_bf16 kipp_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (kipp_bf16)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (kipp_bf16)(u >> 16);
}

/** FP32 rounded through BF16 and back (the KV storage contract). */
static inline float kipp_round_bf16(float f) { return kipp_bf16_to_f32(kipp_f32_to_bf16(f)); }

/** IEEE half -> FP32 (for Q8_0 block scales). */
float kipp_f16_to_f32(uint16_t h);
/** FP32 -> IEEE half, round to nearest even. */
uint16_t kipp_f32_to_f16(float f);

/** 64-byte aligned allocation (zmm loads, cache lines); free with kipp_aligned_free. NULL on failure. */
void *kipp_aligned_alloc(size_t bytes);
void kipp_aligned_free(void *p);

/** qsort comparator of doubles, ascending (NaN compares equal to everything: it stays where qsort leaves it). */
int kipp_cmp_double(const void *a, const void *b);
/** Sorts v[0..n) ascending in place and returns its median (the mean of the middle two when n is even);
 *  0 when n is 0. The one median of the benches and the planner. */
double kipp_median(double *v, size_t n);

/**
 * Kernel ISA levels, each a superset of the one before (docs/ARCHITECTURE.md "ISA
 * dispatch"): avx2 = AVX2+FMA+F16C; avx512 = AVX-512 F/BW/VL/DQ (Skylake-SP and
 * later); avx512_bf16 = avx512 + AVX512_BF16 (vdpbf16ps; Zen 4/5, Sapphire
 * Rapids). KIPP_ISA=ref|avx2|avx512|avx512_bf16 forces one (capped by the CPU).
 */
typedef enum {
    KIPP_ISA_REF = 0,
    KIPP_ISA_AVX2 = 1,
    KIPP_ISA_AVX512 = 2,
    KIPP_ISA_AVX512_BF16 = 3,
    KIPP_ISA_COUNT = 4
} kipp_isa;

/* Whether this build has the x86 levels (avx2 and up) at all: only an x86-64
 * build that is not portable compiles their files (Makefile: the uname switch,
 * KIPP_PORTABLE=1 forces the portable build, which defines KIPP_PORTABLE).
 * Without them the ref level is the only one, whatever the CPU has. */
#if defined(__x86_64__) && !defined(KIPP_PORTABLE)
#define KIPP_X86_LEVELS 1
#else
#define KIPP_X86_LEVELS 0
#endif

/** The best level this CPU runs (from kipp_cpu_get) that this build has (ref without KIPP_X86_LEVELS). */
kipp_isa kipp_isa_cpu_max(void);

/**
 * The ISA kernels should use: the best this CPU has, or the level forced by the
 * KIPP_ISA environment variable. A forced level the CPU lacks falls back to the
 * best available and *note (if non-NULL) gets a sentence saying so.
 */
kipp_isa kipp_isa_select(const char **note);

/** Name of an ISA level: "ref", "avx2", "avx512", "avx512_bf16"; "?" out of range. */
const char *kipp_isa_name(kipp_isa isa);

#endif
