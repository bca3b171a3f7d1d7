/*
 * probe_simd.h - the machine probes of kernels/cpu/probe.h written once over
 * the vector vocabulary (kernels/cpu/simd_avx2.h or simd_avx512.h, included
 * first), compiled once per level by probe_avx2.c and probe_avx512.c with
 * K_PROBE_CHAINS set to that level's chain count.
 */
#include "kernels/cpu/probe.h"

/* Four independent accumulators over 256 B per step; the checksum is the
 * XOR of the accumulators' 64-bit words, so no load can be dropped. */
uint64_t K_SFX(kipp_prof_read)(const void *p, size_t n)
{
    const uint8_t *b = p;
    vi a[4];
    for (int k = 0; k < 4; k++) a[k] = vi_zero();
    for (size_t i = 0; i < n; i += 256)
        for (size_t j = 0; j < 256; j += sizeof(vi)) a[j / sizeof(vi) % 4] ^= vi_load(b + i + j);
    uint64_t w[4 * sizeof(vi) / 8], s = 0;
    memcpy(w, a, sizeof w);
    for (size_t k = 0; k < sizeof w / 8; k++) s ^= w[k];
    return s;
}

#define K_PROBE_FMA(v) vf_fma(v, vf_set1(0.999999f), vf_set1(1e-7f))
K_PEAK_F32_FN(K_SFX(kipp_prof_fma), K_PROBE_CHAINS, K_PROBE_FMA)
#undef K_PROBE_FMA
