/*
 * dispatch.c - the CPU kernel table per ISA level (ARCHITECTURE.md "ISA
 * dispatch"). One static table per level; k_cpu_ops_get caps the asked level
 * at what this CPU runs, so a caller can never get an illegal-instruction path.
 * Packing is a one-time layout copy, so every level shares k_pack_bf16_ref.
 */
#include "kernels/cpu/kernels_isa.h"

static const k_cpu_ops ref_ops = {
    "ref", k_matvec_bf16_ref, k_matmul_bf16_ref, k_rmsnorm_f32_ref, k_rope_f32_ref,
    k_swiglu_f32_ref, k_add_f32_ref, k_embed_bf16_ref, k_kv_write_bf16_ref, k_flash_gqa_bf16_ref,
    k_pack_bf16_ref, k_cvt_bf16_ref, k_matvec_bf16p_ref, k_matmul_bf16p_ref, k_flash_rows_bf16_ref,
};

#define ISA_OPS(sfx)                                                                          \
    {                                                                                         \
        #sfx, k_matvec_bf16_##sfx, k_matmul_bf16_##sfx, k_rmsnorm_f32_##sfx, k_rope_f32_##sfx, \
            k_swiglu_f32_##sfx, k_add_f32_##sfx, k_embed_bf16_##sfx, k_kv_write_bf16_##sfx,   \
            k_flash_gqa_bf16_##sfx, k_pack_bf16_ref, k_cvt_bf16_##sfx, k_matvec_bf16p_##sfx,   \
            k_matmul_bf16p_##sfx, k_flash_rows_bf16_##sfx,                                    \
    }

static const k_cpu_ops avx2_ops = ISA_OPS(avx2);
static const k_cpu_ops avx512_ops = ISA_OPS(avx512);

const k_cpu_ops *k_cpu_ops_table(kipp_isa isa)
{
    return isa == KIPP_ISA_AVX512 ? &avx512_ops : isa == KIPP_ISA_AVX2 ? &avx2_ops : &ref_ops;
}

/* The best level this CPU runs: AVX-512 needs the BF16 dot as well (the
 * prefill kernel is built on it), exactly as kipp_isa_select decides. */
static kipp_isa cpu_max_isa(void)
{
    const kipp_cpu_features *f = kipp_cpu_get();
    return f->avx512 && f->avx512_bf16 ? KIPP_ISA_AVX512 : f->avx2 ? KIPP_ISA_AVX2 : KIPP_ISA_REF;
}

const k_cpu_ops *k_cpu_ops_get(kipp_isa isa)
{
    kipp_isa best = cpu_max_isa();
    return k_cpu_ops_table(isa > best ? best : isa);
}
