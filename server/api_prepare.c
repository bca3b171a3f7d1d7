/*
 * api_prepare.c - a parsed request against the model: prompt -> token ids,
 * context and vocabulary checks, max_tokens clamp, and a chat that is too
 * long fitted to the context by dropping its oldest turns (engine/chat_fit.c).
 *
 * Completions prompts are raw text: marker text in them is matched, as
 * llama-server and vLLM do. Chat messages go through kipp_chat_tokenize, so
 * only the template's own markers become control tokens.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/serve.h"

#define BAD(param, ...) serve_fail(e, 400, "invalid_request_error", param, __VA_ARGS__)

static int tokenize_prompt(kipp_model *m, serve_req *r, serve_error *e)
{
    size_t len = strlen(r->prompt_text), cap = len + 16, n = 0;
    char err[256] = "";
    r->prompt_ids = malloc(cap * sizeof *r->prompt_ids);
    if (!r->prompt_ids) return serve_fail(e, 503, "server_error", "prompt", "out of memory");
    int rc = kipp_tokenize(m, r->prompt_text, len, KIPP_TOK_SPECIAL, r->prompt_ids, cap, &n, err, sizeof err);
    if (rc) return BAD("prompt", "prompt cannot be tokenized: %s", err);
    r->n_prompt = n;
    return 0;
}

/* Tokens of msgs[n] rendered with co; 0 when it cannot be rendered. */
static size_t count_chat(kipp_model *m, const kipp_chat_message *msgs, size_t n, const kipp_chat_options *co)
{
    uint32_t *ids = NULL;
    size_t k = 0;
    if (kipp_chat_tokenize(m, msgs, n, co, &ids, &k, NULL, NULL, NULL, 0)) k = 0;
    free(ids);
    return k;
}

/* The 400 for a chat whose kept part (the system message, and the turns from
 * cm[first]) alone fills the context: it names what takes the room, the tool
 * definitions, the system message and the turns, each counted as the prompt
 * less that part rendered without it. */
static int chat_overflow(kipp_model *m, kipp_chat_message *cm, size_t n, size_t first, const kipp_chat_options *co,
                         uint32_t n_ctx, serve_req *r, serve_error *e)
{
    size_t head = n && cm[0].role == KIPP_ROLE_SYSTEM, k = head;
    for (size_t i = first; i < n; i++) cm[k++] = cm[i]; /* the kept messages, in place */
    size_t all = r->n_prompt, tools = 0, sys = 0;
    if (co->tools_json) {
        kipp_chat_options bare = *co;
        bare.tools_json = NULL;
        size_t without = count_chat(m, cm, k, &bare);
        tools = without && without < all ? all - without : 0;
    }
    if (head) {
        size_t without = count_chat(m, cm + 1, k - 1, co);
        sys = without && without < all ? all - without : 0;
    }
    char parts[200] = "";
    int at = 0;
    if (tools) at += snprintf(parts + at, sizeof parts - (size_t)at, "the tool definitions take %zu, ", tools);
    if (sys) at += snprintf(parts + at, sizeof parts - (size_t)at, "the system message %zu, ", sys);
    snprintf(parts + at, sizeof parts - (size_t)at, "the last turn %s%zu", k - head > 1 ? "(with the turns it needs) " : "",
             all - tools - sys);
    BAD(tools > all / 2 ? "tools" : "messages",
        "the prompt has %zu tokens (n_prompt_tokens) but the context holds %u (n_ctx), and at least one token must "
        "be generated: %s; shorten %s", all, n_ctx, parts,
        tools > all / 2 ? "or remove tool definitions" : sys > all / 2 ? "the system message" : "the last turn");
    snprintf(e->code, sizeof e->code, "context_length_exceeded");
    return -1;
}

static int chat_prompt(kipp_model *m, const kipp_model_info *info, uint32_t n_ctx, serve_req *r, serve_error *e)
{
    if (!info->has_chat) {
        serve_fail(e, 400, "invalid_request_error", "messages",
                   "model '%s' is a base checkpoint without a chat template; use /v1/completions", info->checkpoint_id);
        snprintf(e->code, sizeof e->code, "model_not_chat");
        return -1;
    }
    kipp_chat_message *cm = calloc(r->n_msgs, sizeof *cm);
    if (!cm) return serve_fail(e, 503, "server_error", "messages", "out of memory");
    for (size_t i = 0; i < r->n_msgs; i++)
        cm[i] = (kipp_chat_message){.role = r->msgs[i].role, .content = r->msgs[i].content,
                                    .content_len = r->msgs[i].content_len,
                                    .reasoning_content = r->msgs[i].reasoning_content,
                                    .reasoning_len = r->msgs[i].reasoning_len,
                                    .tool_calls = r->msgs[i].calls, .n_tool_calls = r->msgs[i].n_calls};
    /* tool_choice "none": the prompt offers no tools (as vLLM's
     * --exclude-tools-when-tool-choice-none), so the model has no call to make */
    kipp_chat_options co = {.add_generation_prompt = 1, .enable_thinking = r->enable_thinking,
                            .tools_json = serve_tools_active(r) ? r->tools_json : NULL};
    char *text = NULL, err[256] = "";
    size_t tl = 0; /* the text may hold NUL bytes: its length from the renderer, never strlen */
    /* Too long a conversation loses its oldest turns, keeping the system message and room for the answer: the
     * max_tokens asked for, or the engine's default share when none was sent. */
    int rc = kipp_chat_tokenize_fit(m, cm, r->n_msgs, &co, n_ctx, r->max_tokens_asked, &r->truncated_messages,
                                    &r->prompt_ids, &r->n_prompt, &text, &tl, err, sizeof err);
    if (!rc && r->n_prompt >= n_ctx) {
        size_t head = r->n_msgs && cm[0].role == KIPP_ROLE_SYSTEM;
        chat_overflow(m, cm, r->n_msgs, head + r->truncated_messages, &co, n_ctx, r, e);
        free(cm), free(text);
        return -1;
    }
    free(cm);
    if (rc) return BAD("messages", "messages cannot be rendered: %s", err);
    r->starts_in_reasoning = tl >= 8 && !strcmp(text + tl - 8, "<think>\n");
    r->thinking = !(tl >= 10 && !strcmp(text + tl - 10, "</think>\n\n"));
    free(text);
    return serve_tools_grammar(m, r, e);
}

/* The request's response_format as a grammar over the model's vocabulary: 400 naming what the schema
 * uses that is not supported. */
static int compile_format(kipp_model *m, serve_req *r, serve_error *e)
{
    kipp_grammar_spec spec = {.schema = r->response_format == SERVE_RF_JSON_SCHEMA ? r->rf_schema : NULL};
    char err[400] = "";
    int rc = kipp_grammar_create(m, &spec, &r->grammar, err, sizeof err);
    if (rc == KIPP_EINVAL) return BAD("response_format", "response_format.json_schema.schema: %s", err);
    if (rc) return serve_fail(e, 503, "server_error", "response_format", "cannot compile response_format: %s", err);
    return 0;
}

int serve_prepare(kipp_model *m, uint32_t n_ctx, serve_req *r, serve_error *e)
{
    kipp_model_info info;
    kipp_model_get_info(m, &info);
    if (r->chat ? chat_prompt(m, &info, n_ctx, r, e) : r->prompt_is_ids ? 0 : tokenize_prompt(m, r, e)) return -1;
    if (r->n_prompt == 0) return BAD(r->chat ? "messages" : "prompt", "the prompt gives 0 tokens, expected at least 1");
    for (size_t i = 0; i < r->n_prompt; i++)
        if (r->prompt_ids[i] >= info.vocab_size)
            return BAD("prompt", "prompt[%zu] = %u is not a token id, expected 0..%u", i, r->prompt_ids[i], info.vocab_size - 1);
    for (size_t i = 0; i < r->sp.n_logit_bias; i++)
        if (r->bias[i].token >= info.vocab_size)
            return BAD("logit_bias", "logit_bias token %u is out of range, expected 0..%u", r->bias[i].token, info.vocab_size - 1);
    if (r->n_prompt >= n_ctx) { /* a chat's is answered by chat_overflow */
        BAD("prompt",
            "the prompt has %zu tokens (n_prompt_tokens) but the context holds %u (n_ctx), and at least one "
            "token must be generated; shorten the prompt", r->n_prompt, n_ctx);
        snprintf(e->code, sizeof e->code, "context_length_exceeded");
        return -1;
    }
    if (r->max_tokens_asked >= 0 && (uint64_t)r->n_prompt + (uint64_t)r->max_tokens_asked > n_ctx) {
        /* as vLLM and OpenAI: a generation budget the context cannot hold is refused, not cut (one not sent
         * defaults to the room left) */
        int64_t over = (int64_t)r->n_prompt + r->max_tokens_asked - (int64_t)n_ctx;
        BAD(r->max_tokens_field,
            "the prompt has %zu tokens (n_prompt_tokens) and %s is %lld: %lld positions, %lld more than the context "
            "of %u (n_ctx) holds; send %s <= %lld or a shorter prompt", r->n_prompt, r->max_tokens_field,
            (long long)r->max_tokens_asked, (long long)r->n_prompt + (long long)r->max_tokens_asked, (long long)over,
            n_ctx, r->max_tokens_field, (long long)(n_ctx - r->n_prompt));
        snprintf(e->code, sizeof e->code, "context_length_exceeded");
        return -1;
    }
    if (r->response_format != SERVE_RF_TEXT && compile_format(m, r, e)) return -1;
    int64_t room = (int64_t)n_ctx - (int64_t)r->n_prompt;
    if (r->max_tokens < 0 || r->max_tokens > room) r->max_tokens = room; /* finish_reason "length" at the edge */
    if (!r->chat && r->echo && r->prompt_text == NULL) {
        /* echo of a token-id prompt: its text is the detokenized ids */
        size_t cap = r->n_prompt * 16 + 64, n = 0;
        r->prompt_text = malloc(cap + 1);
        if (!r->prompt_text) return serve_fail(e, 503, "server_error", "prompt", "out of memory");
        if (kipp_detokenize(m, r->prompt_ids, r->n_prompt, r->prompt_text, cap, &n, NULL, 0)) n = 0;
        r->prompt_text[n] = 0;
    }
    return 0;
}
