/*
 * formats.h - the weight formats' file facts, written once: the GGUF loader
 * (engine/model.c), both backends, the CPU kernel table (kernels/cpu/kernels.h
 * k_fmt_info) and engine/backend.h's KIPP_DTYPE_* all read this list, and the
 * Python tools mirror it (tools/quant_blocks.py FORMATS; tests/test_tooling.py
 * parses this file and compares row by row). A small shared header in the
 * sense of docs/ARCHITECTURE.md "Layers", like qwen3_shape.h.
 *
 * X(ID, gguf_type, type_name, scheme, block, block_bytes):
 *   gguf_type    the tensor type id in the GGUF file (GGML numbering)
 *   type_name    GGML's name of that type, as errors and `kipp inspect` print it
 *   scheme       the kipp.quant.scheme value that stores the seven per-layer
 *                projections in this type (seed 000 "Weight quantization");
 *                every other tensor is BF16 under every scheme
 *   block        weights per block along a row (cols % block == 0)
 *   block_bytes  bytes of one block in the file
 */
#ifndef KIPP_FORMATS_H
#define KIPP_FORMATS_H

#include <stddef.h>
#include <stdint.h>

#define KIPP_FMT_LIST(X)                              \
    X(BF16, 30, "BF16", "bf16", 1, 2)                 \
    X(Q8_0, 8, "Q8_0", "q8_0", 32, 34)                \
    X(Q4_1, 3, "Q4_1", "affine4_gs32", 32, 20)

/* The tensors of a layer that a scheme may quantize (the seven projections),
 * as GGUF names blk.<i>.<name>.weight; norms and the token embedding stay
 * BF16, and so does the output head unless the file opts in with
 * kipp.quant.head (any block format of this table; docs/FORMAT.md
 * "Quantized head"). */
#define KIPP_QUANTIZABLE_LIST(X) X(attn_q) X(attn_k) X(attn_v) X(attn_output) X(ffn_gate) X(ffn_up) X(ffn_down)

/* The plain float types a GGUF tensor may also have (F32 or F16 tensors of
 * LoRA adapters, which the loader reads and lora.c converts), one element per
 * block: X(ID, gguf_type, type_name, bytes per element). With KIPP_FMT_LIST,
 * every tensor type the GGUF parser (engine/gguf.c) accepts. */
#define KIPP_PLAIN_TYPE_LIST(X) \
    X(F32, 0, "F32", 4)         \
    X(F16, 1, "F16", 2)

/** GGUF type ids: KIPP_TTYPE_BF16 = 30, ..., KIPP_TTYPE_F32 = 0, KIPP_TTYPE_F16 = 1 */
#define KIPP_FMT_GGUF(ID, gguf, tname, scheme, block, bbytes) KIPP_TTYPE_##ID = gguf,
#define KIPP_PLAIN_GGUF(ID, gguf, tname, bytes) KIPP_TTYPE_##ID = gguf,
enum { KIPP_FMT_LIST(KIPP_FMT_GGUF) KIPP_PLAIN_TYPE_LIST(KIPP_PLAIN_GGUF) };
#undef KIPP_FMT_GGUF
#undef KIPP_PLAIN_GGUF

/** Row indices of the table: KIPP_FMT_BF16, ... */
#define KIPP_FMT_INDEX(ID, gguf, tname, scheme, block, bbytes) KIPP_FMT_##ID,
enum { KIPP_FMT_LIST(KIPP_FMT_INDEX) KIPP_FMT_COUNT };
#undef KIPP_FMT_INDEX

/** One row of KIPP_FMT_LIST. */
typedef struct {
    uint32_t gguf_type;
    const char *type_name;   /* "Q8_0" */
    const char *scheme;      /* "q8_0" */
    uint32_t block;          /* weights per block */
    uint32_t block_bytes;    /* file bytes per block */
} kipp_fmt_facts;

/** The table, in KIPP_FMT_LIST order (index KIPP_FMT_<ID>). */
extern const kipp_fmt_facts kipp_fmts[KIPP_FMT_COUNT];

/** The row of GGUF type t; NULL when no weight format has that type. */
const kipp_fmt_facts *kipp_fmt_by_gguf(uint32_t t);
/** The row whose scheme is s[0, len); NULL when none. */
const kipp_fmt_facts *kipp_fmt_by_scheme(const char *s, size_t len);
/** Bytes of a [rows][cols] tensor of format f in the file (cols % f->block == 0). */
size_t kipp_fmt_file_bytes(const kipp_fmt_facts *f, size_t rows, size_t cols);
/** GGML's name of type t: a format's type_name, "F32", "F16", else "unknown". */
const char *kipp_gguf_type_name(uint32_t t);
/**
 * File bytes per block of GGUF tensor type t, and in *block its weights per
 * block, from KIPP_FMT_LIST and KIPP_PLAIN_TYPE_LIST; 0 (and *block = 1) when
 * no tensor of type t is read here.
 */
uint32_t kipp_gguf_type_block(uint32_t t, uint32_t *block);
/**
 * Every type kipp_gguf_type_block knows, by ascending id, as an error message
 * lists them: "F32 (0), F16 (1), Q4_1 (3), Q8_0 (8) or BF16 (30)". Writes
 * into buf[len] (NUL-terminated, truncated to fit); returns buf.
 */
const char *kipp_gguf_type_list(char *buf, size_t len);
/** 1 when name (a layer tensor's short name, e.g. "attn_q") is one a scheme may quantize. */
int kipp_quantizable(const char *name);

#endif
