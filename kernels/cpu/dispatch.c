/* dispatch.c - the CPU kernel table per ISA level (ARCHITECTURE.md "ISA dispatch"). */
#include "kernels.h"

static const k_cpu_ops ref_ops = {
    "ref", k_matvec_bf16_ref, k_matmul_bf16_ref, k_rmsnorm_f32_ref, k_rope_f32_ref,
    k_swiglu_f32_ref, k_add_f32_ref, k_embed_bf16_ref, k_kv_write_bf16_ref, k_flash_gqa_bf16_ref,
    k_pack_bf16_ref, k_cvt_bf16_ref, k_matvec_bf16p_ref, k_matmul_bf16p_ref,
};

const k_cpu_ops *k_cpu_ops_get(kipp_isa isa)
{
    (void)isa;
    return &ref_ops;
}
