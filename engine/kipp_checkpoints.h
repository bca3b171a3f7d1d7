/*
 * kipp_checkpoints.h - the compiled-in registry of supported Qwen3 dense
 * checkpoints.
 *
 * A checkpoint outside this table is a rejection, not an extension point.
 * tools/checkpoints.py mirrors this table; tests/test_tooling.py compares the
 * two field by field through `kipp registry --json`.
 *
 * Sources: data/qwen3/qwen3-registry.md and data/qwen3/qwen3-configs/ (one config.json per checkpoint).
 * Revisions of real checkpoints are public pins, "pinned, unverified" until a
 * user with network access runs tools/download_model.sh.
 *
 * Synthetic entries (repository "synthetic/...") describe deterministic
 * random-weight checkpoints written by tools/make_checkpoint.py; their
 * revision is "<generator version>-seed<N>".
 */
#ifndef KIPP_CHECKPOINTS_H
#define KIPP_CHECKPOINTS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/qwen3_shape.h"

/* Family invariants, validated for every entry (seed 000). */
#define KIPP_VOCAB_SIZE 151936u   /* logits rows; ids >= 151669 are padding */
/* KIPP_N_KV_HEAD, KIPP_HEAD_DIM, KIPP_KV_BLOCK: kernels/qwen3_shape.h */
#define KIPP_RMS_EPS 1e-6f
#define KIPP_BOS_ID 151643u       /* <|endoftext|> */
#define KIPP_N_TOKENS 151669u     /* 151643 BPE tokens + 26 added tokens */

/**
 * Checkpoint variant (GGUF kipp.variant): base models have no chat template;
 * embedding and reranker checkpoints (Qwen3-Embedding-*, Qwen3-Reranker-*)
 * have none either, and are served for retrieval only (kipp_model_task).
 */
typedef enum {
    KIPP_VARIANT_BASE = 0,
    KIPP_VARIANT_INSTRUCT = 1,  /* hybrid Qwen3 and Instruct-2507 */
    KIPP_VARIANT_THINKING = 2,  /* Thinking-2507 */
    KIPP_VARIANT_EMBEDDING = 3, /* Qwen3-Embedding: last-token pooled final-norm state */
    KIPP_VARIANT_RERANKER = 4   /* Qwen3-Reranker: "yes"/"no" logits at the last position */
} kipp_variant;

/** Which chat template the checkpoint ships (registry.md, "Chat template facts"). */
typedef enum {
    KIPP_CHAT_NONE = 0,          /* base: chat requests are refused */
    KIPP_CHAT_HYBRID = 1,        /* Qwen3 hybrid: enable_thinking switch */
    KIPP_CHAT_INSTRUCT_2507 = 2, /* no thinking branch */
    KIPP_CHAT_THINKING_2507 = 3  /* generation prompt ends "<think>\n" */
} kipp_chat_kind;

/** One registry entry. All strings are static; dimensions are counts. */
typedef struct {
    const char *id;          /* short id, e.g. "qwen3-0.6b" */
    const char *repository;  /* Hugging Face repo, e.g. "Qwen/Qwen3-0.6B" */
    const char *revision;    /* 40-hex commit, or synthetic "<gen>-seed<N>" */
    int synthetic;           /* 1: tools/make_checkpoint.py writes it */
    kipp_variant variant;
    kipp_chat_kind chat;
    uint32_t d_model;        /* hidden_size */
    uint32_t n_layer;        /* num_hidden_layers */
    uint32_t n_q_head;       /* num_attention_heads; attention width n_q_head*128 */
    uint32_t n_kv_head;      /* always 8 */
    uint32_t head_dim;       /* always 128 */
    uint32_t d_ff;           /* intermediate_size */
    uint32_t vocab_size;     /* always 151936 */
    uint32_t context_length; /* max_position_embeddings, tokens */
    double rope_theta;       /* RoPE base */
    int tied_embeddings;     /* 1: head is the transposed token embedding */
    uint32_t eos_token_id;   /* eos in config.json */
    uint32_t n_stop;         /* entries used in stop_ids */
    uint32_t stop_ids[2];    /* generation stops at any of these */
    double yarn_factor;      /* YaRN the model card gives: factor (0 = none) ... */
    uint32_t yarn_original;  /* ... and original_max_position_embeddings, tokens (0 = none) */
} kipp_checkpoint;

#define KIPP_STOP_BASE 1, { 151643u, 0u }
#define KIPP_STOP_CHAT 2, { 151645u, 151643u }
#define KIPP_SYNTH_REV "kipp-synth-v1-seed"
/* Qwen3-4B/8B/14B/32B cards: "32,768 natively and 131,072 tokens with YaRN" (factor 4 over 32768);
 * the 0.6B/1.7B cards give 32,768 only, Base cards no YaRN, 2507 cards 262,144 natively. */
#define KIPP_YARN_CARD , 4.0, 32768u
#define KIPP_YARN_NONE , 0.0, 0u

/* Columns: id, repository, revision, synthetic, variant, chat,
 * d_model, n_layer, n_q_head, n_kv_head, head_dim, d_ff, vocab, ctx, theta, tied,
 * eos, stops, YaRN of the card (factor, original context). */
#define KIPP_CHECKPOINT_TABLE \
  {"qwen3-0.6b-base", "Qwen/Qwen3-0.6B-Base", "da87bfb608c14b7cf20ba1ce41287e8de496c0cd", 0, KIPP_VARIANT_BASE, KIPP_CHAT_NONE,              1024, 28, 16, 8, 128,  3072, KIPP_VOCAB_SIZE,  32768, 1e6, 1, 151643u, KIPP_STOP_BASE KIPP_YARN_NONE}, \
  {"qwen3-0.6b",      "Qwen/Qwen3-0.6B",      "c1899de289a04d12100db370d81485cdf75e47ca", 0, KIPP_VARIANT_INSTRUCT, KIPP_CHAT_HYBRID,        1024, 28, 16, 8, 128,  3072, KIPP_VOCAB_SIZE,  40960, 1e6, 1, 151645u, KIPP_STOP_CHAT KIPP_YARN_NONE}, \
  {"qwen3-1.7b-base", "Qwen/Qwen3-1.7B-Base", "ea980cb0a6c2ae4b936e82123acc929f1cec04c1", 0, KIPP_VARIANT_BASE, KIPP_CHAT_NONE,              2048, 28, 16, 8, 128,  6144, KIPP_VOCAB_SIZE,  32768, 1e6, 1, 151643u, KIPP_STOP_BASE KIPP_YARN_NONE}, \
  {"qwen3-1.7b",      "Qwen/Qwen3-1.7B",      "70d244cc86ccca08cf5af4e1e306ecf908b1ad5e", 0, KIPP_VARIANT_INSTRUCT, KIPP_CHAT_HYBRID,        2048, 28, 16, 8, 128,  6144, KIPP_VOCAB_SIZE,  40960, 1e6, 1, 151645u, KIPP_STOP_CHAT KIPP_YARN_NONE}, \
  {"qwen3-4b-base",   "Qwen/Qwen3-4B-Base",   "906bfd4b4dc7f14ee4320094d8b41684abff8539", 0, KIPP_VARIANT_BASE, KIPP_CHAT_NONE,              2560, 36, 32, 8, 128,  9728, KIPP_VOCAB_SIZE,  32768, 1e6, 1, 151643u, KIPP_STOP_BASE KIPP_YARN_NONE}, \
  {"qwen3-4b",        "Qwen/Qwen3-4B",        "1cfa9a7208912126459214e8b04321603b3df60c", 0, KIPP_VARIANT_INSTRUCT, KIPP_CHAT_HYBRID,        2560, 36, 32, 8, 128,  9728, KIPP_VOCAB_SIZE,  40960, 1e6, 1, 151645u, KIPP_STOP_CHAT KIPP_YARN_CARD}, \
  {"qwen3-4b-instruct-2507", "Qwen/Qwen3-4B-Instruct-2507", "cdbee75f17c01a7cc42f958dc650907174af0554", 0, KIPP_VARIANT_INSTRUCT, KIPP_CHAT_INSTRUCT_2507, 2560, 36, 32, 8, 128, 9728, KIPP_VOCAB_SIZE, 262144, 5e6, 1, 151645u, KIPP_STOP_CHAT KIPP_YARN_NONE}, \
  {"qwen3-4b-thinking-2507", "Qwen/Qwen3-4B-Thinking-2507", "768f209d9ea81521153ed38c47d515654e938aea", 0, KIPP_VARIANT_THINKING, KIPP_CHAT_THINKING_2507, 2560, 36, 32, 8, 128, 9728, KIPP_VOCAB_SIZE, 262144, 5e6, 1, 151645u, KIPP_STOP_CHAT KIPP_YARN_NONE}, \
  {"qwen3-8b-base",   "Qwen/Qwen3-8B-Base",   "49e3418fbbbca6ecbdf9608b4d22e5a407081db4", 0, KIPP_VARIANT_BASE, KIPP_CHAT_NONE,              4096, 36, 32, 8, 128, 12288, KIPP_VOCAB_SIZE,  32768, 1e6, 0, 151643u, KIPP_STOP_BASE KIPP_YARN_NONE}, \
  {"qwen3-8b",        "Qwen/Qwen3-8B",        "b968826d9c46dd6066d109eabc6255188de91218", 0, KIPP_VARIANT_INSTRUCT, KIPP_CHAT_HYBRID,        4096, 36, 32, 8, 128, 12288, KIPP_VOCAB_SIZE,  40960, 1e6, 0, 151645u, KIPP_STOP_CHAT KIPP_YARN_CARD}, \
  {"qwen3-14b-base",  "Qwen/Qwen3-14B-Base",  "0b0bd3732e2c374d483664439ea334928b65f304", 0, KIPP_VARIANT_BASE, KIPP_CHAT_NONE,              5120, 40, 40, 8, 128, 17408, KIPP_VOCAB_SIZE,  32768, 1e6, 0, 151643u, KIPP_STOP_BASE KIPP_YARN_NONE}, \
  {"qwen3-14b",       "Qwen/Qwen3-14B",       "40c069824f4251a91eefaf281ebe4c544efd3e18", 0, KIPP_VARIANT_INSTRUCT, KIPP_CHAT_HYBRID,        5120, 40, 40, 8, 128, 17408, KIPP_VOCAB_SIZE,  40960, 1e6, 0, 151645u, KIPP_STOP_CHAT KIPP_YARN_CARD}, \
  {"qwen3-32b",       "Qwen/Qwen3-32B",       "9216db5781bf21249d130ec9da846c4624c16137", 0, KIPP_VARIANT_INSTRUCT, KIPP_CHAT_HYBRID,        5120, 64, 64, 8, 128, 25600, KIPP_VOCAB_SIZE,  40960, 1e6, 0, 151645u, KIPP_STOP_CHAT KIPP_YARN_CARD}, \
  /* Retrieval checkpoints (issue 56): the Qwen3 shapes of the same size; revisions are public   \
   * snapshot pins, unverified; the Hub files have 151669 (8B embedding: 151665) embedding rows,   \
   * padded to the family's 151936 by the converter (docs/FORMAT.md "Retrieval checkpoints"); */   \
  /* eos is <|endoftext|> for both roles: the token an embedding pools; a reranker never generates. */ \
  /* An embedding file is always tied (token_embd only): Qwen3-Embedding-8B is untied on the Hub but */ \
  /* has no lm_head, and an embedding model never runs its head (tools/checkpoints.py hub_tied). */    \
  {"qwen3-embedding-0.6b", "Qwen/Qwen3-Embedding-0.6B", "97b0c614be4d77ee51c0cef4e5f07c00f9eb65b3", 0, KIPP_VARIANT_EMBEDDING, KIPP_CHAT_NONE, 1024, 28, 16, 8, 128,  3072, KIPP_VOCAB_SIZE, 32768, 1e6, 1, 151643u, KIPP_STOP_BASE KIPP_YARN_NONE}, \
  {"qwen3-embedding-4b",   "Qwen/Qwen3-Embedding-4B",   "5cf2132abc99cad020ac570b19d031efec650f2b", 0, KIPP_VARIANT_EMBEDDING, KIPP_CHAT_NONE, 2560, 36, 32, 8, 128,  9728, KIPP_VOCAB_SIZE, 40960, 1e6, 1, 151643u, KIPP_STOP_BASE KIPP_YARN_NONE}, \
  {"qwen3-embedding-8b",   "Qwen/Qwen3-Embedding-8B",   "1d8ad4ca9b3dd8059ad90a75d4983776a23d44af", 0, KIPP_VARIANT_EMBEDDING, KIPP_CHAT_NONE, 4096, 36, 32, 8, 128, 12288, KIPP_VOCAB_SIZE, 40960, 1e6, 1, 151643u, KIPP_STOP_BASE KIPP_YARN_NONE}, \
  {"qwen3-reranker-0.6b",  "Qwen/Qwen3-Reranker-0.6B",  "e61197ed45024b0ed8a2d74b80b4d909f1255473", 0, KIPP_VARIANT_RERANKER,  KIPP_CHAT_NONE, 1024, 28, 16, 8, 128,  3072, KIPP_VOCAB_SIZE, 40960, 1e6, 1, 151643u, KIPP_STOP_BASE KIPP_YARN_NONE}, \
  {"qwen3-reranker-4b",    "Qwen/Qwen3-Reranker-4B",    "22e683669bc0f0bd69640a1354a6d0aebcfeede5", 0, KIPP_VARIANT_RERANKER,  KIPP_CHAT_NONE, 2560, 36, 32, 8, 128,  9728, KIPP_VOCAB_SIZE, 40960, 1e6, 1, 151643u, KIPP_STOP_BASE KIPP_YARN_NONE}, \
  {"qwen3-reranker-8b",    "Qwen/Qwen3-Reranker-8B",    "77d193c791ed757ca307ee72715aa132723da912", 0, KIPP_VARIANT_RERANKER,  KIPP_CHAT_NONE, 4096, 36, 32, 8, 128, 12288, KIPP_VOCAB_SIZE, 40960, 1e6, 0, 151643u, KIPP_STOP_BASE KIPP_YARN_NONE}, \
  /* Synthetic: tiny test shapes (attention width != d_model) and real benchmark shapes. */ \
  {"synthetic-tiny",        "synthetic/qwen3-tiny",        KIPP_SYNTH_REV "1", 1, KIPP_VARIANT_INSTRUCT, KIPP_CHAT_HYBRID,  256, 2, 16, 8, 128,   512, KIPP_VOCAB_SIZE, 4096, 1e6, 1, 151645u, KIPP_STOP_CHAT KIPP_YARN_NONE}, \
  {"synthetic-tiny-untied", "synthetic/qwen3-tiny-untied", KIPP_SYNTH_REV "2", 1, KIPP_VARIANT_BASE, KIPP_CHAT_NONE,      384, 3,  8, 8, 128,   640, KIPP_VOCAB_SIZE, 4096, 1e6, 0, 151643u, KIPP_STOP_BASE KIPP_YARN_NONE}, \
  {"synthetic-tiny-outliers", "synthetic/qwen3-tiny-outliers", KIPP_SYNTH_REV "7", 1, KIPP_VARIANT_INSTRUCT, KIPP_CHAT_HYBRID, 256, 4, 16, 8, 128, 768, KIPP_VOCAB_SIZE, 4096, 1e6, 1, 151645u, KIPP_STOP_CHAT KIPP_YARN_NONE}, \
  {"synthetic-0.6b", "synthetic/qwen3-0.6b-shape", KIPP_SYNTH_REV "3", 1, KIPP_VARIANT_INSTRUCT, KIPP_CHAT_HYBRID, 1024, 28, 16, 8, 128,  3072, KIPP_VOCAB_SIZE, 40960, 1e6, 1, 151645u, KIPP_STOP_CHAT KIPP_YARN_NONE}, \
  {"synthetic-1.7b", "synthetic/qwen3-1.7b-shape", KIPP_SYNTH_REV "4", 1, KIPP_VARIANT_INSTRUCT, KIPP_CHAT_HYBRID, 2048, 28, 16, 8, 128,  6144, KIPP_VOCAB_SIZE, 40960, 1e6, 1, 151645u, KIPP_STOP_CHAT KIPP_YARN_NONE}, \
  {"synthetic-4b",   "synthetic/qwen3-4b-shape",   KIPP_SYNTH_REV "5", 1, KIPP_VARIANT_INSTRUCT, KIPP_CHAT_HYBRID, 2560, 36, 32, 8, 128,  9728, KIPP_VOCAB_SIZE, 40960, 1e6, 1, 151645u, KIPP_STOP_CHAT KIPP_YARN_CARD}, \
  {"synthetic-8b",   "synthetic/qwen3-8b-shape",   KIPP_SYNTH_REV "6", 1, KIPP_VARIANT_INSTRUCT, KIPP_CHAT_HYBRID, 4096, 36, 32, 8, 128, 12288, KIPP_VOCAB_SIZE, 40960, 1e6, 0, 151645u, KIPP_STOP_CHAT KIPP_YARN_CARD}, \
  /* Synthetic retrieval twins: synthetic-tiny's shape, and the 0.6B shape for make bench-embed. */ \
  {"synthetic-tiny-embedding", "synthetic/qwen3-tiny-embedding", KIPP_SYNTH_REV "8", 1, KIPP_VARIANT_EMBEDDING, KIPP_CHAT_NONE, 256, 2, 16, 8, 128, 512, KIPP_VOCAB_SIZE, 4096, 1e6, 1, 151643u, KIPP_STOP_BASE KIPP_YARN_NONE}, \
  {"synthetic-tiny-reranker",  "synthetic/qwen3-tiny-reranker",  KIPP_SYNTH_REV "9", 1, KIPP_VARIANT_RERANKER,  KIPP_CHAT_NONE, 256, 2, 16, 8, 128, 512, KIPP_VOCAB_SIZE, 4096, 1e6, 1, 151643u, KIPP_STOP_BASE KIPP_YARN_NONE}, \
  {"synthetic-0.6b-embedding", "synthetic/qwen3-0.6b-embedding", KIPP_SYNTH_REV "10", 1, KIPP_VARIANT_EMBEDDING, KIPP_CHAT_NONE, 1024, 28, 16, 8, 128, 3072, KIPP_VOCAB_SIZE, 32768, 1e6, 1, 151643u, KIPP_STOP_BASE KIPP_YARN_NONE}

/** The registry, in table order. */
extern const kipp_checkpoint kipp_checkpoints[];
/** Number of entries in kipp_checkpoints. */
extern const size_t kipp_checkpoints_count;

/**
 * Find the entry whose (repository, revision) match exactly.
 * Returns NULL when the pair is not in the registry. Strings are not
 * NUL-terminated (they point into a GGUF mmap): pass their lengths.
 */
const kipp_checkpoint *kipp_checkpoint_find(const char *repo, size_t repo_len,
                                            const char *rev, size_t rev_len);

/** kipp.variant's string for v ("base", "instruct", "thinking", "embedding", "reranker"); "?" outside the enum. */
const char *kipp_variant_name(kipp_variant v);

/** Find an entry by short id (NUL-terminated); NULL when unknown. */
const kipp_checkpoint *kipp_checkpoint_by_id(const char *id);

/** Attention width in floats: n_q_head * head_dim (seed 000: not d_model). */
static inline uint32_t kipp_attn_width(const kipp_checkpoint *c) { return c->n_q_head * c->head_dim; }

/** Logical KV bytes per token: n_layer * 2 (K,V) * 8 * 128 * 2 (BF16). */
static inline uint64_t kipp_kv_bytes_per_token(const kipp_checkpoint *c)
{
    return (uint64_t)c->n_layer * 2u * c->n_kv_head * c->head_dim * 2u;
}

/** The card's YaRN context in tokens (original x factor), 0 when the card gives none. */
static inline uint32_t kipp_yarn_context(const kipp_checkpoint *c)
{
    return (uint32_t)((double)c->yarn_original * c->yarn_factor);
}

#endif
