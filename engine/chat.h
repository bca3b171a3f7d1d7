/*
 * chat.h - engine-internal entry of the native Qwen3 ChatML renderer
 * (engine/chat.c), usable without a model (tests, tools).
 */
#ifndef KIPP_CHAT_H
#define KIPP_CHAT_H

#include <stddef.h>

#include "engine/kipp.h"
#include "engine/kipp_checkpoints.h"

/**
 * Render msgs[n] with the chat template of the given kind, byte-identical to
 * Hugging Face apply_chat_template on that template (tokenizer_config.json's
 * chat_template of the hybrid, Instruct-2507 or Thinking-2507 checkpoints).
 * opts may be NULL: HF's defaults (no generation prompt, thinking on, no tools).
 * *out is malloc'd and NUL-terminated; the caller frees it.
 * Errors: KIPP_ENOTSUP for KIPP_CHAT_NONE (base checkpoints have no template),
 * KIPP_EINVAL for a bad role, a NULL first system content, a message with both
 * content and content_parts or a NULL part, or tools_json that is not a JSON
 * array (the message names the position), KIPP_ENOMEM. Content parts are
 * joined with "\n" first (kipp.h, kipp_chat_message).
 */
int kipp_chat_render_kind(kipp_chat_kind kind, const kipp_chat_message *msgs, size_t n,
                          const kipp_chat_options *opts, char **out, char *err, size_t errlen);

/** kipp_chat_render_kind that also stores the rendered length in *out_len (when non-NULL). */
int kipp_chat_render_kind_n(kipp_chat_kind kind, const kipp_chat_message *msgs, size_t n,
                            const kipp_chat_options *opts, char **out, size_t *out_len, char *err, size_t errlen);

#endif
