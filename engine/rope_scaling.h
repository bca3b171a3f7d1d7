/*
 * rope_scaling.h - the engine's side of YaRN RoPE scaling (engine/rope_scaling.c;
 * docs/FORMAT.md "RoPE scaling"). Internal to the engine.
 */
#ifndef KIPP_ROPE_SCALING_H
#define KIPP_ROPE_SCALING_H

#include "engine/gguf.h"
#include "engine/kipp.h"

/* llama.cpp's key names (LLM_KV_ROPE_SCALING_*, architecture qwen3): optional, all five or none. */
#define KIPP_KEY_ROPE_TYPE "qwen3.rope.scaling.type"
#define KIPP_KEY_ROPE_FACTOR "qwen3.rope.scaling.factor"
#define KIPP_KEY_ROPE_ORIG "qwen3.rope.scaling.original_context_length"
#define KIPP_KEY_ROPE_BETA_FAST "qwen3.rope.scaling.yarn_beta_fast"
#define KIPP_KEY_ROPE_BETA_SLOW "qwen3.rope.scaling.yarn_beta_slow"

/**
 * The file's scaling into *out (yarn 0 when the file has none). Errors:
 * KIPP_EFORMAT for a partial key set, a wrong GGUF type or a type other than
 * "yarn", naming the key. Ranges are checked by kipp_rope_apply.
 */
int kipp_rope_from_file(const kipp_gguf *g, kipp_rope_scaling *out, char *err, size_t errlen);

/**
 * Resolve *want against m's registry entry (original context 0: the card's
 * yarn_original, else the file's context_length; betas 0: 32 and 1; factor
 * rounded to f32 as files store it), check its ranges and set
 * m->view.dims.rope_yarn, m->view.dims.context_length (floor(original x
 * factor), or the file's context_length without scaling) and m->rope.
 * Errors: KIPP_EINVAL naming origin, the value and the limit.
 */
int kipp_rope_apply(kipp_model *m, const kipp_rope_scaling *want, const char *origin, char *err, size_t errlen);

#endif
