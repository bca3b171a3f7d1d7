/*
 * cpuinfo.h - what this CPU is: its vector features (CPUID on x86; none
 * elsewhere, so every other architecture runs the ref kernel level) and its
 * identity from /proc/cpuinfo ("unknown" where that file is missing or says
 * nothing). base/, below the kernels: kernels/common.h builds the ISA levels
 * on these flags.
 */
#ifndef KIPP_BASE_CPUINFO_H
#define KIPP_BASE_CPUINFO_H

#ifdef __cplusplus
extern "C" {
#endif

/** CPU features read once from CPUID (all 0 off x86). */
typedef struct {
    int avx2;        /* AVX2 + FMA + F16C */
    int avx512;      /* AVX-512 F/BW/VL/DQ */
    int avx512_bf16; /* AVX512_BF16 (vdpbf16ps) */
    int avx512_vnni; /* AVX512_VNNI (vpdpbusd) */
    /* vdpbf16ps outruns FP32 FMA: AMD cores (Zen 4/5) retire it at twice the
     * FMA's FLOP rate, Intel cores at half (profiles/: bf16_dot_gflops_all
     * 1098 vs fp32_fma 545 on Zen 4, 215 vs 449 on an Intel avx512_bf16 VM),
     * so the CPU backend reads projections through the dot by default only
     * where this and avx512_bf16 are both 1 (here: the vendor is AMD). */
    int bf16_dot_fast;
} kipp_cpu_features;

/** "model name" of /proc/cpuinfo (cached; "unknown" when unreadable). Hostnames
 * here are all `vm` while the CPUs differ, so results and profiles carry this. */
const char *kipp_cpu_model(void);

/** "<vendor>-f<cpu family>m<model>" of /proc/cpuinfo's first processor, e.g.
 * "amd-f26m2" (Zen 5), "amd-f25m17" (Zen 4), "intel-f6m85" (Skylake-SP);
 * "cpu-unknown" when those lines are missing (non-x86). Decimal, as
 * /proc/cpuinfo prints them; cached, static storage. Tags profile and result
 * file names (bench) and picks this CPU's results for the planner (engine/plan.c). */
const char *kipp_cpu_id(void);

/** Features of this CPU (cached after the first call). */
const kipp_cpu_features *kipp_cpu_get(void);

#ifdef __cplusplus
}
#endif

#endif
