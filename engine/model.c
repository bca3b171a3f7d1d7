/*
 * model.c - the strict Kipp artifact loader (seed 000, "Model artifact and
 * loader"; docs/FORMAT.md) and the public model lifecycle (kipp.h).
 *
 * One read-only mmap per model. After the container parse (engine/gguf.c)
 * the file must match a compiled-in registry entry exactly: every metadata key
 * present with its GGUF type and the entry's value, no other keys, and a tensor
 * directory with exactly the entry's names, order, dtype, shapes and packed
 * 64-byte aligned layout. Only then are kipp_qwen3_weights views bound (no
 * copies) and the tokenizer built. A file outside the registry is a rejection,
 * not an extension point.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/internal.h"
#include "engine/grammar_impl.h"
#include "engine/kv_disk.h"
#include "engine/kv_pool.h"
#include "engine/lora.h"
#include "engine/rope_scaling.h"
#include "kernels/formats.h"

#define KIPP_FORMAT_VERSION 1u
#define KIPP_ALIGNMENT 64u
#define KIPP_LAYER_TENSORS 11u
#define KIPP_N_ADDED (KIPP_N_TOKENS - KIPP_BOS_ID) /* 26 added tokens, 151643..151668 */
#define NAME_MAX_SHOWN 64                          /* bytes of a file string quoted in errors */

/* Quote at most NAME_MAX_SHOWN bytes of a file string in a message. */
#define SHOW(s) (int)((s).len > NAME_MAX_SHOWN ? NAME_MAX_SHOWN : (s).len), (s).ptr

/* ---------------------------------------------------------------- metadata */

/** One required metadata key and its exact GGUF type (docs/FORMAT.md table). */
typedef struct {
    const char *key;
    uint32_t type;
    uint32_t arr_type; /* element type when type == ARRAY */
    int optional;      /* 1: may be absent (kipp.quant.head) */
} key_spec;

static const key_spec keys[] = {
    {"general.architecture", KIPP_GGUF_STRING, 0, 0},
    {"general.alignment", KIPP_GGUF_U32, 0, 0},
    {"general.name", KIPP_GGUF_STRING, 0, 0},
    {"kipp.format_version", KIPP_GGUF_U32, 0, 0},
    {"kipp.checkpoint.id", KIPP_GGUF_STRING, 0, 0},
    {"kipp.source.repository", KIPP_GGUF_STRING, 0, 0},
    {"kipp.source.revision", KIPP_GGUF_STRING, 0, 0},
    {"kipp.quant.scheme", KIPP_GGUF_STRING, 0, 0},
    {"kipp.quant.head", KIPP_GGUF_STRING, 0, 1}, /* docs/FORMAT.md "Quantized head": absent = BF16 head */
    {"kipp.variant", KIPP_GGUF_STRING, 0, 0},
    {"kipp.chat_template", KIPP_GGUF_STRING, 0, 0},
    {"kipp.d_model", KIPP_GGUF_U32, 0, 0},
    {"kipp.n_layer", KIPP_GGUF_U32, 0, 0},
    {"kipp.n_q_head", KIPP_GGUF_U32, 0, 0},
    {"kipp.n_kv_head", KIPP_GGUF_U32, 0, 0},
    {"kipp.head_dim", KIPP_GGUF_U32, 0, 0},
    {"kipp.d_ff", KIPP_GGUF_U32, 0, 0},
    {"kipp.vocab_size", KIPP_GGUF_U32, 0, 0},
    {"kipp.context_length", KIPP_GGUF_U32, 0, 0},
    {"kipp.rope_theta", KIPP_GGUF_F32, 0, 0},
    {"kipp.rms_norm_eps", KIPP_GGUF_F32, 0, 0},
    {"kipp.tied_embeddings", KIPP_GGUF_BOOL, 0, 0},
    {"kipp.bos_token_id", KIPP_GGUF_U32, 0, 0},
    {"kipp.eos_token_id", KIPP_GGUF_U32, 0, 0},
    {"kipp.stop_token_ids", KIPP_GGUF_ARRAY, KIPP_GGUF_U32, 0},
    {"kipp.tokenizer.tokens", KIPP_GGUF_ARRAY, KIPP_GGUF_STRING, 0},
    {"kipp.tokenizer.merges", KIPP_GGUF_ARRAY, KIPP_GGUF_STRING, 0},
    {"kipp.tokenizer.added_ids", KIPP_GGUF_ARRAY, KIPP_GGUF_U32, 0},
    {"kipp.tokenizer.added_special", KIPP_GGUF_ARRAY, KIPP_GGUF_BOOL, 0},
    {"kipp.tokenizer.pre_regex", KIPP_GGUF_STRING, 0, 0},
    {"kipp.tokenizer.normalizer", KIPP_GGUF_STRING, 0, 0},
    /* docs/FORMAT.md "RoPE scaling": llama.cpp's names, all five or none (engine/rope_scaling.c) */
    {KIPP_KEY_ROPE_TYPE, KIPP_GGUF_STRING, 0, 1},
    {KIPP_KEY_ROPE_FACTOR, KIPP_GGUF_F32, 0, 1},
    {KIPP_KEY_ROPE_ORIG, KIPP_GGUF_U32, 0, 1},
    {KIPP_KEY_ROPE_BETA_FAST, KIPP_GGUF_F32, 0, 1},
    {KIPP_KEY_ROPE_BETA_SLOW, KIPP_GGUF_F32, 0, 1},
};
#define N_KEYS (sizeof keys / sizeof keys[0])

static const char *type_name(uint32_t t)
{
    static const char *const n[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                    "bool", "string", "array", "u64", "i64", "f64"};
    return t < sizeof n / sizeof n[0] ? n[t] : "unknown";
}

/* Type of one file key against its spec; arrays also check the element type. */
static int check_key_type(const kipp_gguf_kv *kv, const key_spec *ks, char *err, size_t errlen)
{
    if (kv->type != ks->type)
        return kipp_err(err, errlen, KIPP_EFORMAT,
                        "metadata key '%s' has GGUF type %s (%u), expected %s (%u)", ks->key,
                        type_name(kv->type), kv->type, type_name(ks->type), ks->type);
    if (ks->type == KIPP_GGUF_ARRAY && kv->arr_type != ks->arr_type)
        return kipp_err(err, errlen, KIPP_EFORMAT,
                        "metadata key '%s' is an array of %s (%u), expected an array of %s (%u)",
                        ks->key, type_name(kv->arr_type), kv->arr_type, type_name(ks->arr_type),
                        ks->arr_type);
    return KIPP_OK;
}

/* Every file key known and unique; every required key present with its exact type. */
static int check_key_set(const kipp_gguf *g, char *err, size_t errlen)
{
    uint32_t seen[N_KEYS] = {0};
    for (uint64_t i = 0; i < g->n_kv; i++) {
        size_t k = 0;
        while (k < N_KEYS && !kipp_str_eq(g->kv[i].key, keys[k].key)) k++;
        if (k == N_KEYS)
            return kipp_err(err, errlen, KIPP_EFORMAT,
                            "unknown metadata key '%.*s': the Kipp subset (docs/FORMAT.md) allows "
                            "only its %zu listed keys", SHOW(g->kv[i].key), N_KEYS);
        if (seen[k]++)
            return kipp_err(err, errlen, KIPP_EFORMAT,
                            "duplicate metadata key '%s': each key must appear once", keys[k].key);
        int rc = check_key_type(&g->kv[i], &keys[k], err, errlen);
        if (rc) return rc;
    }
    for (size_t k = 0; k < N_KEYS; k++)
        if (!seen[k] && !keys[k].optional)
            return kipp_err(err, errlen, KIPP_EFORMAT,
                            "missing metadata key '%s' (GGUF type %s) required by docs/FORMAT.md",
                            keys[k].key, type_name(keys[k].type));
    return KIPP_OK;
}

/* Value getters; check_key_set has already proved presence and type. */
static const kipp_gguf_kv *kv_of(const kipp_gguf *g, const char *key)
{
    const kipp_gguf_kv *kv = kipp_gguf_find(g, key);
    KIPP_ASSERT(kv != NULL);
    return kv;
}

static uint32_t arr_u32(const kipp_gguf_kv *kv, uint64_t i)
{
    uint32_t v;
    KIPP_ASSERT(kv->arr_type == KIPP_GGUF_U32 && i < kv->arr_n);
    memcpy(&v, (const uint8_t *)kv->arr_data + 4 * i, 4); /* may be unaligned in the file */
    return v;
}

static int want_str(const kipp_gguf *g, const char *key, const char *expect,
                    const kipp_checkpoint *c, char *err, size_t errlen)
{
    const kipp_gguf_kv *kv = kv_of(g, key);
    if (kipp_str_eq(kv->v.s, expect)) return KIPP_OK;
    return kipp_err(err, errlen, KIPP_EFORMAT,
                    "%s is '%.*s' but registry entry '%s' expects '%s'", key, SHOW(kv->v.s),
                    c ? c->id : "(any)", expect);
}

static int want_u32(const kipp_gguf *g, const char *key, uint64_t expect,
                    const kipp_checkpoint *c, char *err, size_t errlen)
{
    const kipp_gguf_kv *kv = kv_of(g, key);
    if (kv->v.u == expect) return KIPP_OK;
    return kipp_err(err, errlen, KIPP_EFORMAT,
                    "%s is %llu but registry entry '%s' expects %llu", key,
                    (unsigned long long)kv->v.u, c->id, (unsigned long long)expect);
}

static int want_f32(const kipp_gguf *g, const char *key, double expect,
                    const kipp_checkpoint *c, char *err, size_t errlen)
{
    const kipp_gguf_kv *kv = kv_of(g, key);
    /* Stored as f32: compare after rounding the registry value the way the converter did. */
    if ((float)kv->v.f == (float)expect) return KIPP_OK;
    return kipp_err(err, errlen, KIPP_EFORMAT,
                    "%s is %.9g but registry entry '%s' expects %.9g", key, kv->v.f, c->id,
                    (double)(float)expect);
}

static const char *chat_name(kipp_chat_kind k)
{
    static const char *const n[] = {"none", "hybrid", "instruct-2507", "thinking-2507"};
    return (unsigned)k < 4 ? n[k] : "?";
}

/* (repository, revision) -> registry entry; anything else is an unknown checkpoint. */
static int match_registry(const kipp_gguf *g, const kipp_checkpoint **out, char *err, size_t errlen)
{
    kipp_str repo = kv_of(g, "kipp.source.repository")->v.s;
    kipp_str rev = kv_of(g, "kipp.source.revision")->v.s;
    *out = kipp_checkpoint_find(repo.ptr, repo.len, rev.ptr, rev.len);
    if (*out) return KIPP_OK;
    return kipp_err(err, errlen, KIPP_EFORMAT,
                    "unknown checkpoint %.*s@%.*s: not in the compiled-in registry "
                    "(`kipp registry` lists the supported repository/revision pairs)",
                    SHOW(repo), SHOW(rev));
}

static int check_stop_ids(const kipp_gguf *g, const kipp_checkpoint *c, char *err, size_t errlen)
{
    const kipp_gguf_kv *kv = kv_of(g, "kipp.stop_token_ids");
    if (kv->arr_n != c->n_stop)
        return kipp_err(err, errlen, KIPP_EFORMAT,
                        "kipp.stop_token_ids has %llu entries but registry entry '%s' expects %u",
                        (unsigned long long)kv->arr_n, c->id, c->n_stop);
    for (uint32_t i = 0; i < c->n_stop; i++)
        if (arr_u32(kv, i) != c->stop_ids[i])
            return kipp_err(err, errlen, KIPP_EFORMAT,
                            "kipp.stop_token_ids[%u] is %u but registry entry '%s' expects %u", i,
                            arr_u32(kv, i), c->id, c->stop_ids[i]);
    return KIPP_OK;
}

/* Every scalar metadata value equals the matched entry (docs/FORMAT.md table). */
static int check_values(const kipp_gguf *g, const kipp_checkpoint *c, char *err, size_t errlen)
{
    int rc;
    const kipp_gguf_kv *tied = kv_of(g, "kipp.tied_embeddings");
    if ((rc = want_u32(g, "general.alignment", KIPP_ALIGNMENT, c, err, errlen)) ||
        (rc = want_u32(g, "kipp.format_version", KIPP_FORMAT_VERSION, c, err, errlen)) ||
        (rc = want_str(g, "general.architecture", "qwen3", c, err, errlen)) ||
        (rc = want_str(g, "general.name", c->id, c, err, errlen)) ||
        (rc = want_str(g, "kipp.checkpoint.id", c->id, c, err, errlen)) ||
        (rc = want_str(g, "kipp.variant", kipp_variant_name(c->variant), c, err, errlen)) ||
        (rc = want_str(g, "kipp.chat_template", chat_name(c->chat), c, err, errlen)) ||
        (rc = want_u32(g, "kipp.d_model", c->d_model, c, err, errlen)) ||
        (rc = want_u32(g, "kipp.n_layer", c->n_layer, c, err, errlen)) ||
        (rc = want_u32(g, "kipp.n_q_head", c->n_q_head, c, err, errlen)) ||
        (rc = want_u32(g, "kipp.n_kv_head", c->n_kv_head, c, err, errlen)) ||
        (rc = want_u32(g, "kipp.head_dim", c->head_dim, c, err, errlen)) ||
        (rc = want_u32(g, "kipp.d_ff", c->d_ff, c, err, errlen)) ||
        (rc = want_u32(g, "kipp.vocab_size", c->vocab_size, c, err, errlen)) ||
        (rc = want_u32(g, "kipp.context_length", c->context_length, c, err, errlen)) ||
        (rc = want_f32(g, "kipp.rope_theta", c->rope_theta, c, err, errlen)) ||
        (rc = want_f32(g, "kipp.rms_norm_eps", KIPP_RMS_EPS, c, err, errlen)) ||
        (rc = want_u32(g, "kipp.bos_token_id", KIPP_BOS_ID, c, err, errlen)) ||
        (rc = want_u32(g, "kipp.eos_token_id", c->eos_token_id, c, err, errlen)) ||
        (rc = want_str(g, "kipp.tokenizer.normalizer", "NFC", c, err, errlen)) ||
        (rc = check_stop_ids(g, c, err, errlen)))
        return rc;
    if (tied->v.b != c->tied_embeddings)
        return kipp_err(err, errlen, KIPP_EFORMAT,
                        "kipp.tied_embeddings is %s but registry entry '%s' expects %s",
                        tied->v.b ? "true" : "false", c->id, c->tied_embeddings ? "true" : "false");
    return KIPP_OK;
}

/* ------------------------------------------------------------ quant scheme */

/* A weight scheme (seed 000 "Weight quantization") is a row of
 * kernels/formats.h: the GGUF type of the seven per-layer projections, its
 * block rule and its name; every other tensor is BF16 under every scheme. */
typedef kipp_fmt_facts quant_scheme;

/* kipp.quant.scheme is one of the known schemes; *out gets it. */
static int check_scheme(const kipp_gguf *g, const quant_scheme **out, char *err, size_t errlen)
{
    kipp_str s = kv_of(g, "kipp.quant.scheme")->v.s;
    *out = kipp_fmt_by_scheme(s.ptr, (size_t)s.len);
    if (*out) return KIPP_OK;
    char known[128] = "";
    for (size_t i = 0; i < KIPP_FMT_COUNT; i++)
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", kipp_fmts[i].scheme);
    return kipp_err(err, errlen, KIPP_EFORMAT, "kipp.quant.scheme is '%.*s', expected one of %s", SHOW(s), known);
}

/* kipp.quant.head (docs/FORMAT.md "Quantized head"): absent means the
 * seed's BF16 head (*out = NULL); present, it names a quantized format of
 * kernels/formats.h, which output.weight must then have. "bf16" is refused:
 * a BF16 head is written without the key, so each head has one spelling. */
static int check_head_scheme(const kipp_gguf *g, const quant_scheme **out, char *err, size_t errlen)
{
    *out = NULL;
    const kipp_gguf_kv *kv = kipp_gguf_find(g, "kipp.quant.head");
    if (!kv) return KIPP_OK;
    kipp_str s = kv->v.s;
    const quant_scheme *f = kipp_fmt_by_scheme(s.ptr, (size_t)s.len);
    if (f && f->block > 1) {
        *out = f;
        return KIPP_OK;
    }
    char known[128] = "";
    for (size_t i = 0; i < KIPP_FMT_COUNT; i++)
        if (kipp_fmts[i].block > 1)
            snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", known[0] ? ", " : "",
                     kipp_fmts[i].scheme);
    return kipp_err(err, errlen, KIPP_EFORMAT,
                    "kipp.quant.head is '%.*s', expected one of %s (a BF16 head is written without the key)",
                    SHOW(s), known);
}

/* ----------------------------------------------------------------- tensors */

static const char *const layer_names[KIPP_LAYER_TENSORS] = {
    "attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm",
    "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"};

/* Where each layer tensor lands in kipp_qwen3_layer, in layer_names order. */
static const size_t layer_fields[KIPP_LAYER_TENSORS] = {
    offsetof(kipp_qwen3_layer, attn_norm), offsetof(kipp_qwen3_layer, wq),
    offsetof(kipp_qwen3_layer, wk),        offsetof(kipp_qwen3_layer, wv),
    offsetof(kipp_qwen3_layer, q_norm),    offsetof(kipp_qwen3_layer, k_norm),
    offsetof(kipp_qwen3_layer, wo),        offsetof(kipp_qwen3_layer, ffn_norm),
    offsetof(kipp_qwen3_layer, w_gate),    offsetof(kipp_qwen3_layer, w_up),
    offsetof(kipp_qwen3_layer, w_down)};

/* The file has its own output.weight: untied, or a quantized head (--quant-head),
 * which a tied checkpoint stores as a separate tensor after output_norm. */
static int has_output(const kipp_checkpoint *c, const quant_scheme *head)
{
    return !c->tied_embeddings || head != NULL;
}

/** Tensors the entry requires: 1 + 11*n_layer + 1 (+1 untied or quantized head). */
static uint64_t expected_count(const kipp_checkpoint *c, const quant_scheme *head)
{
    return 2u + (uint64_t)KIPP_LAYER_TENSORS * c->n_layer + (has_output(c, head) ? 1u : 0u);
}

/* Name of expected directory slot idx (FORMAT.md order). */
static void slot_name(const kipp_checkpoint *c, uint64_t idx, char *buf, size_t cap)
{
    uint64_t last_layer = 1u + (uint64_t)KIPP_LAYER_TENSORS * c->n_layer;
    if (idx == 0) snprintf(buf, cap, "token_embd.weight");
    else if (idx < last_layer)
        snprintf(buf, cap, "blk.%llu.%s.weight", (unsigned long long)((idx - 1) / KIPP_LAYER_TENSORS),
                 layer_names[(idx - 1) % KIPP_LAYER_TENSORS]);
    else if (idx == last_layer) snprintf(buf, cap, "output_norm.weight");
    else snprintf(buf, cap, "output.weight");
}

/* Expected row-major [rows][cols] of slot idx; rows == 0 means a vector [cols]. */
static void slot_shape(const kipp_checkpoint *c, uint64_t idx, uint64_t *rows, uint64_t *cols)
{
    const uint64_t d = c->d_model, a = kipp_attn_width(c), kv = (uint64_t)c->n_kv_head * c->head_dim;
    uint64_t last_layer = 1u + (uint64_t)KIPP_LAYER_TENSORS * c->n_layer;
    *rows = 0;
    *cols = d;
    if (idx == 0 || idx > last_layer) { *rows = c->vocab_size; return; }
    if (idx == last_layer) return;
    switch ((idx - 1) % KIPP_LAYER_TENSORS) {
    case 1: *rows = a; break;                                   /* attn_q  [A][d] */
    case 2: case 3: *rows = kv; break;                          /* attn_k/v [KV][d] */
    case 4: case 5: *cols = c->head_dim; break;                 /* q/k norm [128] */
    case 6: *rows = d; *cols = a; break;                        /* attn_output [d][A] */
    case 8: case 9: *rows = c->d_ff; break;                     /* gate/up [d_ff][d] */
    case 10: *rows = d; *cols = c->d_ff; break;                 /* down [d][d_ff] */
    default: break;                                             /* attn_norm, ffn_norm [d] */
    }
}

/* Parse "blk.<i>.<name>.weight" (no leading zeros) into a slot; -1 when not a layer name. */
static int64_t layer_slot(const kipp_checkpoint *c, const char *s)
{
    if (strncmp(s, "blk.", 4)) return -1;
    s += 4;
    if (*s < '0' || *s > '9' || (s[0] == '0' && s[1] != '.')) return -1;
    uint64_t layer = 0;
    while (*s >= '0' && *s <= '9' && layer < c->n_layer) layer = layer * 10 + (uint64_t)(*s++ - '0');
    if (*s++ != '.' || layer >= c->n_layer) return -1;
    for (unsigned j = 0; j < KIPP_LAYER_TENSORS; j++) {
        size_t n = strlen(layer_names[j]);
        if (!strncmp(s, layer_names[j], n) && !strcmp(s + n, ".weight"))
            return (int64_t)(1u + layer * KIPP_LAYER_TENSORS + j);
    }
    return -1;
}

/* Expected slot of a tensor name, or -1 when the entry has no such tensor. */
static int64_t tensor_slot(const kipp_checkpoint *c, const quant_scheme *head, kipp_str name)
{
    char s[96];
    if (name.len >= sizeof s || memchr(name.ptr, 0, name.len)) return -1;
    memcpy(s, name.ptr, name.len);
    s[name.len] = 0;
    uint64_t last_layer = 1u + (uint64_t)KIPP_LAYER_TENSORS * c->n_layer;
    if (!strcmp(s, "token_embd.weight")) return 0;
    if (!strcmp(s, "output_norm.weight")) return (int64_t)last_layer;
    if (!strcmp(s, "output.weight")) return has_output(c, head) ? (int64_t)last_layer + 1 : -1;
    return layer_slot(c, s);
}

/* Names: no unknown, no duplicate, none missing, FORMAT.md order. slot_of[i] = slot of file tensor i. */
static int check_tensor_names(const kipp_gguf *g, const kipp_checkpoint *c, const quant_scheme *head,
                              char *err, size_t errlen)
{
    const uint64_t n = expected_count(c, head);
    uint8_t *seen = calloc(n, 1);
    if (!seen) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory checking tensor names");
    int rc = KIPP_OK;
    char want[96];
    for (uint64_t i = 0; i < g->n_tensors && !rc; i++) {
        int64_t s = tensor_slot(c, head, g->tensors[i].name);
        if (s < 0)
            rc = kipp_err(err, errlen, KIPP_EFORMAT,
                          "unknown tensor '%.*s': checkpoint '%s' (%s, %u layers%s) has no such tensor",
                          SHOW(g->tensors[i].name), c->id, c->tied_embeddings ? "tied" : "untied",
                          c->n_layer, c->tied_embeddings ? ", no kipp.quant.head" : "");
        else if (seen[s]++)
            rc = kipp_err(err, errlen, KIPP_EFORMAT, "duplicate tensor '%.*s' in the directory",
                          SHOW(g->tensors[i].name));
    }
    for (uint64_t s = 0; s < n && !rc; s++)
        if (!seen[s]) {
            slot_name(c, s, want, sizeof want);
            rc = kipp_err(err, errlen, KIPP_EFORMAT,
                          "missing tensor '%s' required by checkpoint '%s' (%llu tensors expected, "
                          "%llu found)", want, c->id, (unsigned long long)n,
                          (unsigned long long)g->n_tensors);
        }
    free(seen);
    for (uint64_t i = 0; i < g->n_tensors && !rc; i++)
        if (tensor_slot(c, head, g->tensors[i].name) != (int64_t)i) {
            slot_name(c, i, want, sizeof want);
            rc = kipp_err(err, errlen, KIPP_EFORMAT,
                          "tensor '%.*s' is at directory index %llu where '%s' belongs "
                          "(docs/FORMAT.md fixes the order)", SHOW(g->tensors[i].name),
                          (unsigned long long)i, want);
        }
    return rc;
}

/* Slot idx holds one of the per-layer projections a scheme may quantize (kernels/formats.h). */
static int slot_quantizable(const kipp_checkpoint *c, uint64_t idx)
{
    uint64_t last_layer = 1u + (uint64_t)KIPP_LAYER_TENSORS * c->n_layer;
    return idx > 0 && idx < last_layer && kipp_quantizable(layer_names[(idx - 1) % KIPP_LAYER_TENSORS]);
}

/* The type the scheme gives slot i, its block rule and its exact byte size;
 * the head slot (output.weight) has kipp.quant.head's type when that is set. */
static int check_tensor_type(const kipp_gguf_tensor *t, const kipp_checkpoint *c, uint64_t i,
                             const quant_scheme *q, const quant_scheme *head, char *err, size_t errlen)
{
    int is_head = head && i == 2u + (uint64_t)KIPP_LAYER_TENSORS * c->n_layer;
    if (is_head) q = head;
    int proj = slot_quantizable(c, i) || is_head;
    uint32_t want = proj ? q->gguf_type : KIPP_DTYPE_BF16;
    if (t->type != want) {
        if (is_head)
            return kipp_err(err, errlen, KIPP_EFORMAT,
                            "dtype mismatch: tensor '%.*s' has GGUF type %s (%u), but kipp.quant.head is %s, "
                            "which stores the output head as %s (%u)", SHOW(t->name), kipp_gguf_type_name(t->type),
                            t->type, head->scheme, kipp_gguf_type_name(want), want);
        if (!proj && t->type != KIPP_DTYPE_BF16)
            return kipp_err(err, errlen, KIPP_EFORMAT,
                            "dtype mismatch: tensor '%.*s' has GGUF type %s (%u), expected BF16 (30): "
                            "norms, the token embedding and the output head stay BF16 under every scheme "
                            "(kipp.quant.scheme is %s; only kipp.quant.head quantizes the head)", SHOW(t->name),
                            kipp_gguf_type_name(t->type),
                            t->type, q->scheme);
        return kipp_err(err, errlen, KIPP_EFORMAT,
                        "dtype mismatch: tensor '%.*s' has GGUF type %s (%u), but kipp.quant.scheme "
                        "%s stores the seven projections as %s (%u)", SHOW(t->name),
                        kipp_gguf_type_name(t->type), t->type, q->scheme, kipp_gguf_type_name(want), want);
    }
    if (q->block > 1 && proj) {
        uint64_t cols = t->dims[0], rows = t->n_dims == 2 ? t->dims[1] : 1;
        if (cols % q->block)
            return kipp_err(err, errlen, KIPP_EFORMAT,
                            "tensor '%.*s' has %llu columns; scheme %s needs columns %% %u == 0",
                            SHOW(t->name), (unsigned long long)cols, q->scheme, q->block);
        uint64_t bytes = kipp_fmt_file_bytes(q, rows, cols);
        if (t->nbytes != bytes)
            return kipp_err(err, errlen, KIPP_EFORMAT,
                            "tensor '%.*s' spans %llu bytes, expected %llu (%llu x %llu %s: %u bytes "
                            "per %u weights)", SHOW(t->name), (unsigned long long)t->nbytes,
                            (unsigned long long)bytes, (unsigned long long)rows,
                            (unsigned long long)cols, kipp_gguf_type_name(want), q->block_bytes, q->block);
    }
    return KIPP_OK;
}

/* dtype and shape of file tensor i (already known to sit in slot i). */
static int check_tensor_shape(const kipp_gguf_tensor *t, const kipp_checkpoint *c, uint64_t i,
                              const quant_scheme *q, const quant_scheme *head, char *err, size_t errlen)
{
    uint64_t rows, cols;
    slot_shape(c, i, &rows, &cols);
    uint32_t want_dims = rows ? 2u : 1u;
    if (t->n_dims == want_dims && t->dims[0] == cols && (!rows || t->dims[1] == rows))
        return check_tensor_type(t, c, i, q, head, err, errlen);
    char got[96];
    int n = 0;
    for (uint32_t d = t->n_dims; d-- > 0 && n < (int)sizeof got - 24;)
        n += snprintf(got + n, sizeof got - (size_t)n, "[%llu]", (unsigned long long)t->dims[d]);
    if (rows)
        return kipp_err(err, errlen, KIPP_EFORMAT,
                        "wrong shape: tensor '%.*s' is %s, expected [%llu][%llu] for checkpoint '%s'",
                        SHOW(t->name), got, (unsigned long long)rows, (unsigned long long)cols, c->id);
    return kipp_err(err, errlen, KIPP_EFORMAT,
                    "wrong shape: tensor '%.*s' is %s, expected [%llu] for checkpoint '%s'",
                    SHOW(t->name), got, (unsigned long long)cols, c->id);
}

/* Packed layout: each offset is the previous end rounded up to 64; <= 63 bytes of tail. */
static int check_tensor_layout(const kipp_gguf *g, size_t size, char *err, size_t errlen)
{
    uint64_t end = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const kipp_gguf_tensor *t = &g->tensors[i];
        uint64_t want = (end + KIPP_ALIGNMENT - 1) / KIPP_ALIGNMENT * KIPP_ALIGNMENT;
        if (t->offset < want)
            return kipp_err(err, errlen, KIPP_EFORMAT,
                            "tensor '%.*s' at offset %llu overlaps the previous tensor, which ends "
                            "at %llu", SHOW(t->name), (unsigned long long)t->offset,
                            (unsigned long long)end);
        if (t->offset > want)
            return kipp_err(err, errlen, KIPP_EFORMAT,
                            "tensor '%.*s' at offset %llu leaves a gap: expected offset %llu "
                            "(tensors are packed in directory order)", SHOW(t->name),
                            (unsigned long long)t->offset, (unsigned long long)want);
        end = t->offset + t->nbytes;
    }
    uint64_t tail = size - g->data_offset - end;
    if (tail >= KIPP_ALIGNMENT)
        return kipp_err(err, errlen, KIPP_EFORMAT,
                        "file has %llu bytes after the last tensor, expected at most %u bytes of "
                        "padding", (unsigned long long)tail, KIPP_ALIGNMENT - 1);
    return KIPP_OK;
}

static int check_tensors(const kipp_gguf *g, const kipp_checkpoint *c, const quant_scheme *q,
                         const quant_scheme *head, size_t size, char *err, size_t errlen)
{
    int rc = check_tensor_names(g, c, head, err, errlen);
    for (uint64_t i = 0; i < g->n_tensors && !rc; i++)
        rc = check_tensor_shape(&g->tensors[i], c, i, q, head, err, errlen);
    return rc ? rc : check_tensor_layout(g, size, err, errlen);
}

/* ---------------------------------------------------------------- tokenizer */

static int check_tokenizer(const kipp_gguf *g, char *err, size_t errlen)
{
    const kipp_gguf_kv *tok = kv_of(g, "kipp.tokenizer.tokens");
    const kipp_gguf_kv *mer = kv_of(g, "kipp.tokenizer.merges");
    const kipp_gguf_kv *ids = kv_of(g, "kipp.tokenizer.added_ids");
    const kipp_gguf_kv *spc = kv_of(g, "kipp.tokenizer.added_special");
    if (tok->arr_n != KIPP_N_TOKENS)
        return kipp_err(err, errlen, KIPP_EFORMAT,
                        "kipp.tokenizer.tokens has %llu entries, expected %u",
                        (unsigned long long)tok->arr_n, KIPP_N_TOKENS);
    if (mer->arr_n == 0)
        return kipp_err(err, errlen, KIPP_EFORMAT, "kipp.tokenizer.merges is empty, expected the BPE merges");
    if (ids->arr_n != KIPP_N_ADDED)
        return kipp_err(err, errlen, KIPP_EFORMAT,
                        "kipp.tokenizer.added_ids has %llu entries, expected %u (ids %u..%u)",
                        (unsigned long long)ids->arr_n, KIPP_N_ADDED, KIPP_BOS_ID, KIPP_N_TOKENS - 1);
    for (uint32_t i = 0; i < KIPP_N_ADDED; i++)
        if (arr_u32(ids, i) != KIPP_BOS_ID + i)
            return kipp_err(err, errlen, KIPP_EFORMAT,
                            "kipp.tokenizer.added_ids[%u] is %u, expected %u (ascending %u..%u)", i,
                            arr_u32(ids, i), KIPP_BOS_ID + i, KIPP_BOS_ID, KIPP_N_TOKENS - 1);
    if (spc->arr_n != ids->arr_n)
        return kipp_err(err, errlen, KIPP_EFORMAT,
                        "kipp.tokenizer.added_special has %llu entries, expected %llu (one per added id)",
                        (unsigned long long)spc->arr_n, (unsigned long long)ids->arr_n);
    if (kv_of(g, "kipp.tokenizer.pre_regex")->v.s.len == 0)
        return kipp_err(err, errlen, KIPP_EFORMAT, "kipp.tokenizer.pre_regex is empty, expected the Split regex");
    return KIPP_OK;
}

/* ------------------------------------------------------------------ binding */

static kipp_tensor_view view_of(const kipp_gguf_tensor *t)
{
    kipp_tensor_view v = {t->data, t->type, t->n_dims == 2 ? t->dims[1] : 1, t->dims[0], t->nbytes};
    return v;
}

/* Weight views into the mapping (no copies); output aliases token_embd when tied
 * and the file has no output.weight of its own (no kipp.quant.head). */
static int bind_weights(kipp_model *m, char *err, size_t errlen)
{
    const kipp_checkpoint *c = m->ckpt;
    const kipp_gguf_tensor *t = m->gguf.tensors;
    m->layers = calloc(c->n_layer, sizeof *m->layers);
    if (!m->layers) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for %u layer views", c->n_layer);
    kipp_qwen3_weights *w = &m->view.w;
    w->token_embd = view_of(&t[0]);
    for (uint32_t l = 0; l < c->n_layer; l++)
        for (unsigned j = 0; j < KIPP_LAYER_TENSORS; j++) {
            kipp_tensor_view *dst = (kipp_tensor_view *)((char *)&m->layers[l] + layer_fields[j]);
            *dst = view_of(&t[1 + (uint64_t)l * KIPP_LAYER_TENSORS + j]);
        }
    w->layers = m->layers;
    uint64_t last = 1u + (uint64_t)KIPP_LAYER_TENSORS * c->n_layer;
    w->output_norm = view_of(&t[last]);
    w->output = m->gguf.n_tensors > last + 1 ? view_of(&t[last + 1]) : w->token_embd;
    m->weight_bytes = 0;
    for (uint64_t i = 0; i < m->gguf.n_tensors; i++) m->weight_bytes += t[i].nbytes;
    kipp_dims *d = &m->view.dims;
    *d = (kipp_dims){.d_model = c->d_model, .n_layer = c->n_layer, .n_q_head = c->n_q_head,
                     .n_kv_head = c->n_kv_head, .head_dim = c->head_dim, .d_ff = c->d_ff,
                     .vocab_size = c->vocab_size, .context_length = c->context_length,
                     .rope_theta = (float)c->rope_theta, .rms_eps = KIPP_RMS_EPS,
                     .tied_embeddings = c->tied_embeddings};
    m->view.checkpoint_id = c->id;
    return KIPP_OK;
}

/* Parse + validate buf[size] and bind views into m (no tokenizer, no backend). */
static int model_bind(kipp_model *m, const void *buf, size_t size, char *err, size_t errlen)
{
    int rc = kipp_gguf_parse(buf, size, &m->gguf, err, errlen);
    if (rc) return rc;
    const quant_scheme *q = NULL, *head = NULL;
    if ((rc = check_key_set(&m->gguf, err, errlen)) ||
        (rc = match_registry(&m->gguf, &m->ckpt, err, errlen)) ||
        (rc = check_values(&m->gguf, m->ckpt, err, errlen)) ||
        (rc = check_scheme(&m->gguf, &q, err, errlen)) ||
        (rc = check_head_scheme(&m->gguf, &head, err, errlen)) ||
        (rc = check_tensors(&m->gguf, m->ckpt, q, head, size, err, errlen)) ||
        (rc = check_tokenizer(&m->gguf, err, errlen)))
        return rc;
    m->quant = q->scheme;
    m->quant_head = head ? head->scheme : "bf16";
    m->view.map = buf;
    m->view.map_size = size;
    kipp_rope_scaling rope;
    if ((rc = bind_weights(m, err, errlen)) || (rc = kipp_rope_from_file(&m->gguf, &rope, err, errlen)))
        return rc;
    return kipp_rope_apply(m, &rope, "the file's " KIPP_KEY_ROPE_TYPE " keys", err, errlen);
}

/* Tokenizer views: string indexes from the parser, an aligned copy of the added ids. */
static int build_tokenizer(kipp_model *m, char *err, size_t errlen)
{
    const kipp_gguf *g = &m->gguf;
    const kipp_gguf_kv *ids = kv_of(g, "kipp.tokenizer.added_ids");
    m->tok_added_ids = malloc(ids->arr_n * sizeof *m->tok_added_ids);
    if (!m->tok_added_ids) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for added ids");
    for (uint64_t i = 0; i < ids->arr_n; i++) m->tok_added_ids[i] = arr_u32(ids, i);
    const kipp_gguf_kv *tok = kv_of(g, "kipp.tokenizer.tokens");
    const kipp_gguf_kv *mer = kv_of(g, "kipp.tokenizer.merges");
    kipp_tokenizer_data d = {
        tok->arr_str, tok->arr_n, mer->arr_str, mer->arr_n, m->tok_added_ids,
        kv_of(g, "kipp.tokenizer.added_special")->arr_data, ids->arr_n,
        kv_of(g, "kipp.tokenizer.pre_regex")->v.s};
    return kipp_tokenizer_create(&d, &m->tok, err, errlen);
}

static const char *file_kind(mode_t mode)
{
    return S_ISDIR(mode) ? "a directory" : S_ISFIFO(mode) ? "a FIFO" : S_ISCHR(mode) ? "a character device"
         : S_ISBLK(mode) ? "a block device" : S_ISSOCK(mode) ? "a socket" : "not a regular file";
}

/* Open `path` for mapping without ever blocking: open() on a FIFO waits for a writer and
 * on some devices has side effects, so the path is stat()ed first, then opened with
 * O_NONBLOCK (a FIFO swapped in after the stat still cannot block) and fstat()ed again
 * to catch that swap. Returns the descriptor (>= 0) with *st filled, or a KIPP_E* code. */
static int open_regular(const char *path, struct stat *st, char *err, size_t errlen)
{
    if (stat(path, st)) return kipp_err(err, errlen, KIPP_EIO, "cannot open '%s': %s", path, strerror(errno));
    if (!S_ISREG(st->st_mode))
        return kipp_err(err, errlen, KIPP_EIO, "'%s' is %s; expected a regular GGUF file", path,
                        file_kind(st->st_mode));
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return kipp_err(err, errlen, KIPP_EIO, "cannot open '%s': %s", path, strerror(errno));
    if (fstat(fd, st) || !S_ISREG(st->st_mode)) {
        int rc = kipp_err(err, errlen, KIPP_EIO, "'%s' is %s; expected a regular GGUF file", path,
                          file_kind(st->st_mode));
        close(fd);
        return rc;
    }
    return fd;
}

/* Map the whole file read-only; the mapping outlives the descriptor. */
static int map_file(kipp_model *m, const char *path, char *err, size_t errlen)
{
    struct stat st;
    int fd = open_regular(path, &st, err, errlen);
    if (fd < 0) return fd;
    int rc = KIPP_OK;
    if (st.st_size < 24)
        rc = kipp_err(err, errlen, KIPP_EFORMAT,
                      "truncated file: '%s' is %lld bytes, shorter than the 24-byte GGUF header",
                      path, (long long)st.st_size);
    if (!rc) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED)
            rc = kipp_err(err, errlen, KIPP_EIO, "cannot mmap '%s' (%lld bytes): %s", path,
                          (long long)st.st_size, strerror(errno));
        else {
            m->map = p;
            m->map_size = (size_t)st.st_size;
        }
    }
    close(fd);
    return rc;
}

int kipp_model_load(const char *path, kipp_model **out, char *err, size_t errlen)
{
    if (!path || !out) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_model_load: path and out must be non-NULL");
    *out = NULL;
    kipp_model *m = calloc(1, sizeof *m);
    if (!m) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for the model");
    int rc = map_file(m, path, err, errlen);
    if (!rc) rc = model_bind(m, m->map, m->map_size, err, errlen);
    if (!rc) rc = build_tokenizer(m, err, errlen);
    if (rc) {
        kipp_model_close(m);
        return rc;
    }
    *out = m;
    return KIPP_OK;
}

int kipp_model_validate_image(const void *buf, size_t size, char *err, size_t errlen)
{
    kipp_model m;
    memset(&m, 0, sizeof m);
    int rc = model_bind(&m, buf, size, err, errlen);
    if (!rc) rc = kipp_view_check(&m.view, err, errlen); /* what kipp_model_open checks before any backend */
    free(m.layers);
    kipp_gguf_free(&m.gguf);
    return rc;
}

/* ----------------------------------------------------------- public model */

/* The ref oracle reads every weight through the mapping on one thread: it has
 * no streamed mode with a prefetch thread, so an explicit request for one is
 * refused rather than ignored. n_threads stays accepted (kipp.h says why). */
static int check_ref_opts(const char *name, const kipp_model_options *opts, char *err, size_t errlen)
{
    if (!opts || strcmp(name, "ref") != 0) return 0;
    if (opts->stream == KIPP_STREAM_ON)
        return kipp_err(err, errlen, KIPP_EINVAL, "stream is KIPP_STREAM_ON but backend ref has no streamed mode "
                        "(it reads every weight through the file mapping on one thread), expected KIPP_STREAM_AUTO "
                        "or KIPP_STREAM_OFF, or backend cpu");
    if (opts->no_prefetch)
        return kipp_err(err, errlen, KIPP_EINVAL, "no_prefetch is %d but backend ref has no prefetch thread to "
                        "turn off, expected 0, or backend cpu", opts->no_prefetch);
    return 0;
}

int kipp_model_open(const char *path, const char *backend, const kipp_model_options *opts,
                    kipp_model **out, char *err, size_t errlen)
{
    if (!out) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_model_open: out must be non-NULL");
    *out = NULL;
    const char *name = backend ? backend : "cpu";
    const kipp_backend_ops *ops = kipp_backend_find(name);
    if (!ops && strcmp(name, "none") != 0) {
        const char *why = kipp_backend_missing(name);
        if (why) return kipp_err(err, errlen, KIPP_EBACKEND, "backend '%s': %s", name, why);
        char names[128];
        return kipp_err(err, errlen, KIPP_EBACKEND, "unknown backend '%s', expected one of: %s, none", name,
                        kipp_backend_names(names, sizeof names, ", "));
    }
    if (opts && opts->n_threads < 0)
        return kipp_err(err, errlen, KIPP_EINVAL, "n_threads is %d, expected 0 (auto) or more",
                        opts->n_threads);
    int rc = check_ref_opts(name, opts, err, errlen);
    if (rc) return rc;
    kipp_model *m;
    rc = kipp_model_load(path, &m, err, errlen);
    if (rc) return rc;
    /* Before the backend packs the weights: it then sees ordinary (merged) tensors. */
    if (opts && opts->n_lora && (rc = kipp_lora_apply_open(m, opts, err, errlen))) {
        kipp_model_close(m);
        return rc;
    }
    if (opts && opts->rope_override && (rc = kipp_rope_apply(m, &opts->rope, "--rope-scaling", err, errlen)))
        return kipp_model_close(m), rc;
    if (opts && (rc = kipp_kv_type_set(m, opts->kv_type, err, errlen))) return kipp_model_close(m), rc;
    if (!ops) { /* "none": read-only use of the file, no weights touched */
        *out = m;
        return KIPP_OK;
    }
    if ((rc = kipp_stream_resolve(m, opts, err, errlen))) return kipp_model_close(m), rc;
    /* A dense model reads every weight for every token: start readahead now, while
     * the backend prepares. Not in kipp_model_load, which `kipp inspect` uses on
     * multi-GB files it only needs the header of; not when streamed. Advisory. */
    if (!m->view.stream) (void)madvise(m->map, m->map_size, MADV_WILLNEED);
    m->ops = ops;
    m->view.n_threads = opts ? opts->n_threads : 0;
    if ((rc = kipp_view_check(&m->view, err, errlen))) return kipp_model_close(m), rc;
    rc = ops->model_create(&m->view, &m->bm, err, errlen);
    if (rc) {
        m->bm = NULL; /* a failed create owns nothing */
        kipp_model_close(m);
        return rc;
    }
    if (ops->packs_weights && !m->view.stream) kipp_lora_release_packed(m); /* merged copies the backend has repacked */
    *out = m;
    return KIPP_OK;
}

void kipp_model_close(kipp_model *m)
{
    if (!m) return;
    kipp_kv_disk_close(m->disk); /* finishes its writes: reads the slab */
    if (m->ops && m->bm) m->ops->model_destroy(m->bm);
    kipp_kv_pool_destroy(m->pool);
    kipp_vocab_index_free(m->gvi);
    kipp_tokenizer_destroy(m->tok);
    free(m->tok_added_ids);
    free(m->tok_strs);
    free(m->layers);
    kipp_lora_release(m);
    kipp_gguf_free(&m->gguf);
    if (m->map) munmap(m->map, m->map_size);
    free(m);
}

int kipp_model_get_info(const kipp_model *m, kipp_model_info *info)
{
    if (info) memset(info, 0, sizeof *info);
    /* A caller's NULL is a refusal, not an abort; a model without a registry
     * entry (one built in memory rather than opened) has no facts to give. */
    if (!m || !info || !m->ckpt) return KIPP_EINVAL;
    const kipp_checkpoint *c = m->ckpt;
    info->checkpoint_id = c->id;
    info->repository = c->repository;
    info->revision = c->revision;
    info->backend = m->ops ? m->ops->name : "none";
    info->quant = m->quant; /* kipp.quant.scheme, validated by check_scheme */
    info->quant_head = m->quant_head ? m->quant_head : "bf16"; /* kipp.quant.head, or "bf16" without it */
    info->has_chat = c->chat != KIPP_CHAT_NONE;
    info->variant = kipp_variant_name(c->variant);
    info->tied_embeddings = c->tied_embeddings;
    info->d_model = c->d_model;
    info->n_layer = c->n_layer;
    info->n_q_head = c->n_q_head;
    info->n_kv_head = c->n_kv_head;
    info->head_dim = c->head_dim;
    info->d_ff = c->d_ff;
    info->vocab_size = c->vocab_size;
    info->context_length = m->view.dims.context_length;
    info->file_context_length = c->context_length;
    info->rope = m->rope;
    info->n_stop = c->n_stop;
    memcpy(info->stop_ids, c->stop_ids, sizeof info->stop_ids);
    info->kv_bytes_per_token = kipp_kv_type_bytes(c->n_layer, c->n_kv_head, c->head_dim, m->view.kv_type);
    info->kv_type = kipp_kv_type_name(m->view.kv_type);
    info->weight_bytes = m->weight_bytes;
    info->rope_theta = m->view.dims.rope_theta;
    info->file_bytes = m->map_size;
    info->n_tensors = m->gguf.n_tensors;
    info->data_offset = m->gguf.data_offset;
    info->kv_pool_blocks = m->pool ? kipp_kv_pool_total(m->pool) : 0;
    info->n_lora = m->n_lora;
    info->lora_tensors = m->lora_tensors;
    info->lora_bytes = m->lora_bytes;
    info->lora_merge_ms = m->lora_merge_ms;
    return 0;
}

int kipp_model_task(const kipp_model *m)
{
    if (!m || !m->ckpt) return KIPP_EINVAL;
    return m->ckpt->variant == KIPP_VARIANT_EMBEDDING ? KIPP_TASK_EMBED
         : m->ckpt->variant == KIPP_VARIANT_RERANKER  ? KIPP_TASK_RERANK : KIPP_TASK_GENERATE;
}

int kipp_model_tensor(const kipp_model *m, uint64_t i, kipp_tensor_info *out)
{
    if (!m || !out) return KIPP_EINVAL;
    if (i >= m->gguf.n_tensors) return KIPP_ERANGE;
    const kipp_gguf_tensor *t = &m->gguf.tensors[i];
    memset(out, 0, sizeof *out);
    out->name = t->name.ptr;
    out->name_len = t->name.len;
    out->type = t->type;
    out->type_name = kipp_gguf_type_name(t->type);
    out->n_dims = t->n_dims;
    out->cols = t->dims[0];
    out->rows = t->n_dims == 2 ? t->dims[1] : 1;
    out->nbytes = t->nbytes;
    out->file_offset = m->gguf.data_offset + t->offset;
    return KIPP_OK;
}

int kipp_model_describe(const kipp_model *m, char *out, size_t outlen)
{
    if (!m || !out || !outlen)
        return KIPP_EINVAL;
    if (!m->ops) {
        snprintf(out, outlen, "model has no backend (loaded for inspection only)\n");
        return KIPP_EINVAL;
    }
    out[0] = 0;
    if (m->ops->describe) m->ops->describe(m->bm, out, outlen);
    else snprintf(out, outlen, "backend %s: no kernel report\n", m->ops->name);
    out[outlen - 1] = 0;
    return KIPP_OK;
}
