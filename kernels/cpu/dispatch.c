/*
 * dispatch.c - the CPU kernel table (docs/ARCHITECTURE.md "ISA dispatch", "Weight
 * formats"). Each level lists, with designated initializers, only the slots it
 * implements; k_cpu_ops_table merges them per slot from the asked level down
 * to ref, so every slot gets the best variant at or below that level and a
 * level whose only new instruction is a dot product lists one tile.
 * k_cpu_ops_get caps the level at what this CPU runs, so a caller can never get
 * an illegal-instruction path. Packing is a one-time layout copy: every level
 * shares k_pack_bf16_ref.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cpu/kernels.h"

/* ---- formats ---- */

#define K_FMT_EXTERN(ID, name) extern const k_fmt_info k_fmt_info_##name;
K_READ_MODE_LIST(K_FMT_EXTERN)
#undef K_FMT_EXTERN

#define K_FMT_INFO(ID, name) [K_FMT_##ID] = &k_fmt_info_##name,
static const k_fmt_info *const fmt_info[K_FMT_COUNT] = {K_READ_MODE_LIST(K_FMT_INFO)};
#undef K_FMT_INFO

const k_fmt_info *k_fmt_get(k_fmt f) { return (unsigned)f < K_FMT_COUNT ? fmt_info[f] : NULL; }

int k_fmt_from_gguf(uint32_t gguf_type)
{
    for (int f = 0; f < K_FMT_COUNT; f++)
        if (fmt_info[f]->file->gguf_type == gguf_type) return f;
    return -1;
}

#define K_ACT_BLOCK(ID, name, block, bytes) [K_ACT_##ID] = block,
#define K_ACT_BYTES(ID, name, block, bytes) [K_ACT_##ID] = bytes,
#define K_ACT_NAME(ID, name, block, bytes) [K_ACT_##ID] = #name,
static const size_t act_block[K_ACT_COUNT] = {K_ACT_LIST(K_ACT_BLOCK)};
static const size_t act_bytes[K_ACT_COUNT] = {K_ACT_LIST(K_ACT_BYTES)};
static const char *const act_names[K_ACT_COUNT] = {K_ACT_LIST(K_ACT_NAME)};
#undef K_ACT_BLOCK
#undef K_ACT_BYTES
#undef K_ACT_NAME

size_t k_act_row_bytes(k_act a, size_t n)
{
    return (unsigned)a < K_ACT_COUNT ? n / act_block[a] * act_bytes[a] : 0;
}
const char *k_act_name(k_act a) { return (unsigned)a < K_ACT_COUNT ? act_names[a] : "?"; }

/* ---- the levels: only what each one implements ---- */

#define K_OP_INIT(sfx) K_CPU_OP_LIST(K_OP_INIT_##sfx)
#define K_OP_INIT_ref(name, params) .name = k_##name##_ref,
#define K_OP_INIT_avx2(name, params) .name = k_##name##_avx2,
#define K_OP_INIT_avx512(name, params) .name = k_##name##_avx512,

static const k_cpu_ops level_ref = {
    .isa = "ref",
    K_OP_INIT(ref)
    .fmt[K_FMT_BF16] = {.pack = k_pack_bf16_ref, .matvec = k_matvec_bf16_ref, .matmul = k_matmul_bf16_ref},
    .fmt[K_FMT_Q8_0] = {.pack = k_pack_q8_0_ref, .matvec = k_matvec_q8_0_ref, .matmul = k_matmul_q8_0_ref},
    .fmt[K_FMT_AFFINE4] = {.pack = k_pack_affine4_ref, .matvec = k_matvec_affine4_ref, .matmul = k_matmul_affine4_ref},
    .fmt[K_FMT_BF16DOT] = {.pack = k_pack_bf16_ref, .matvec = k_matvec_bf16dot_ref, .matmul = k_matmul_bf16dot_ref},
    .act[K_ACT_Q8] = k_quant_q8_ref,
    .act[K_ACT_BF16] = k_quant_bf16_ref,
    .flash_gqa_dot = k_flash_gqa_dot_ref,
    .flash_rows_dot = k_flash_rows_dot_ref,
    .kv_write_q8_0 = k_kv_write_q8_0_ref,
    .flash_gqa_q8_0 = k_flash_gqa_q8_0_ref,
    .flash_rows_q8_0 = k_flash_rows_q8_0_ref,
};

/* x86 builds only: a portable build (KIPP_X86_LEVELS 0, kernels/common.h)
 * compiles no *_avx* file, and every level there merges to ref. */
#if KIPP_X86_LEVELS
static const k_cpu_ops level_avx2 = {
    .isa = "avx2",
    K_OP_INIT(avx2)
    .fmt[K_FMT_BF16] = {.matvec = k_matvec_bf16_avx2, .matmul = k_matmul_bf16_avx2},
    .fmt[K_FMT_Q8_0] = {.matvec = k_matvec_q8_0_avx2, .matmul = k_matmul_q8_0_avx2},
    .fmt[K_FMT_AFFINE4] = {.matvec = k_matvec_affine4_avx2, .matmul = k_matmul_affine4_avx2},
    .act[K_ACT_Q8] = k_quant_q8_avx2,
    .flash_gqa_q8_0 = k_flash_gqa_q8_0_avx2,
    .flash_rows_q8_0 = k_flash_rows_q8_0_avx2,
};

static const k_cpu_ops level_avx512 = {
    .isa = "avx512",
    K_OP_INIT(avx512)
    .fmt[K_FMT_BF16] = {.matvec = k_matvec_bf16_avx512, .matmul = k_matmul_bf16_avx512},
    .fmt[K_FMT_Q8_0] = {.matvec = k_matvec_q8_0_avx512, .matmul = k_matmul_q8_0_avx512},
    .fmt[K_FMT_AFFINE4] = {.matvec = k_matvec_affine4_avx512, .matmul = k_matmul_affine4_avx512},
    .flash_gqa_q8_0 = k_flash_gqa_q8_0_avx512,
    .flash_rows_q8_0 = k_flash_rows_q8_0_avx512,
};

static const k_cpu_ops level_avx512_bf16 = {
    .isa = "avx512_bf16",
    .fmt[K_FMT_Q8_0] = {.matmul = k_matmul_q8_0_avx512_bf16},
    .fmt[K_FMT_AFFINE4] = {.matmul = k_matmul_affine4_avx512_bf16},
    .fmt[K_FMT_BF16DOT] = {.matvec = k_matvec_bf16dot_avx512_bf16, .matmul = k_matmul_bf16dot_avx512_bf16},
    .act[K_ACT_BF16] = k_quant_bf16_avx512_bf16,
    .flash_gqa_dot = k_flash_gqa_dot_avx512_bf16,
    .flash_rows_dot = k_flash_rows_dot_avx512_bf16,
};
#endif

static const k_cpu_ops *const levels[KIPP_ISA_COUNT] = {
    [KIPP_ISA_REF] = &level_ref,
#if KIPP_X86_LEVELS
    [KIPP_ISA_AVX2] = &level_avx2,
    [KIPP_ISA_AVX512] = &level_avx512,
    [KIPP_ISA_AVX512_BF16] = &level_avx512_bf16,
#endif
};

/* ---- merging ---- */

#define TAKE(dst, src_slot, lvl_slot, lv) \
    do { if (!(dst) && (src_slot)) { (dst) = (src_slot); (lvl_slot) = (lv); } } while (0)

static void merge(kipp_isa isa, k_cpu_ops *out, k_cpu_src *src)
{
    memset(out, 0, sizeof *out);
    memset(src, 0, sizeof *src);
    out->isa = kipp_isa_name(isa);
    for (int lv = (int)isa; lv >= 0; lv--) {
        const k_cpu_ops *L = levels[lv];
        if (!L) continue; /* not in this build */
#define K_OP_MERGE(name, params) TAKE(out->name, L->name, src->name, (kipp_isa)lv);
        K_CPU_OP_LIST(K_OP_MERGE)
#undef K_OP_MERGE
        TAKE(out->flash_gqa_dot, L->flash_gqa_dot, src->flash_gqa_dot, (kipp_isa)lv);
        TAKE(out->flash_rows_dot, L->flash_rows_dot, src->flash_rows_dot, (kipp_isa)lv);
        TAKE(out->kv_write_q8_0, L->kv_write_q8_0, src->kv_write_q8_0, (kipp_isa)lv);
        TAKE(out->flash_gqa_q8_0, L->flash_gqa_q8_0, src->flash_gqa_q8_0, (kipp_isa)lv);
        TAKE(out->flash_rows_q8_0, L->flash_rows_q8_0, src->flash_rows_q8_0, (kipp_isa)lv);
        for (int f = 0; f < K_FMT_COUNT; f++) {
            TAKE(out->fmt[f].pack, L->fmt[f].pack, src->fmt[f][0], (kipp_isa)lv);
            TAKE(out->fmt[f].matvec, L->fmt[f].matvec, src->fmt[f][1], (kipp_isa)lv);
            TAKE(out->fmt[f].matmul, L->fmt[f].matmul, src->fmt[f][2], (kipp_isa)lv);
        }
        for (int a = 0; a < K_ACT_COUNT; a++) TAKE(out->act[a], L->act[a], src->act[a], (kipp_isa)lv);
    }
}
#undef TAKE

static k_cpu_ops merged[KIPP_ISA_COUNT];
static k_cpu_src merged_src[KIPP_ISA_COUNT];

static void build_once(void)
{
    for (int i = 0; i < KIPP_ISA_COUNT; i++) merge((kipp_isa)i, &merged[i], &merged_src[i]);
}

/* Built once (pthread_once: models may open on several threads) and never changed. */
static void build_all(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, build_once);
}

const k_cpu_ops *k_cpu_ops_table(kipp_isa isa, k_cpu_src *src)
{
    build_all();
    if ((unsigned)isa >= KIPP_ISA_COUNT) isa = KIPP_ISA_REF;
    if (src) *src = merged_src[isa];
    return &merged[isa];
}

const k_cpu_ops *k_cpu_ops_get(kipp_isa isa)
{
    kipp_isa best = kipp_isa_cpu_max();
    return k_cpu_ops_table(isa > best ? best : isa, NULL);
}

void k_cpu_ops_describe(kipp_isa isa, char *out, size_t outlen)
{
    kipp_isa best = kipp_isa_cpu_max();
    k_cpu_src s;
    k_cpu_ops_table(isa > best ? best : isa, &s);
    size_t o = 0;
    if (outlen == 0) return;
    out[0] = '\0';
#define PUT(...) do { if (o < outlen) o += (size_t)snprintf(out + o, outlen - o, __VA_ARGS__); } while (0)
#define K_OP_LINE(name, params) PUT("  k_%s_%s\n", #name, kipp_isa_name(s.name));
    K_CPU_OP_LIST(K_OP_LINE)
#undef K_OP_LINE
    PUT("  k_flash_gqa_dot_%s\n  k_flash_rows_dot_%s\n", kipp_isa_name(s.flash_gqa_dot), kipp_isa_name(s.flash_rows_dot));
    PUT("  k_kv_write_q8_0_%s\n  k_flash_gqa_q8_0_%s\n  k_flash_rows_q8_0_%s\n", kipp_isa_name(s.kv_write_q8_0),
        kipp_isa_name(s.flash_gqa_q8_0), kipp_isa_name(s.flash_rows_q8_0));
    for (int f = 0; f < K_FMT_COUNT; f++) {
        const k_fmt_info *fi = fmt_info[f];
        PUT("  format %s: pack %s, matvec %s, matmul %s (%s activations)\n", fi->name,
            kipp_isa_name(s.fmt[f][0]), kipp_isa_name(s.fmt[f][1]), kipp_isa_name(s.fmt[f][2]),
            k_act_name(fi->act));
    }
    for (int a = 0; a < K_ACT_COUNT; a++)
        if (a != K_ACT_F32) PUT("  activations %s: quantize %s\n", act_names[a], kipp_isa_name(s.act[a]));
#undef PUT
}

int k_fmt_native(const k_cpu_ops *k, k_fmt f)
{
    const k_cpu_ops *ref = k_cpu_ops_table(KIPP_ISA_REF, NULL);
    if (!k || (unsigned)f >= K_FMT_COUNT || !k->fmt[f].matvec || !k->fmt[f].matmul) return 0;
    return k->fmt[f].matvec != ref->fmt[f].matvec && k->fmt[f].matmul != ref->fmt[f].matmul;
}
