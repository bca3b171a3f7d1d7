/*
 * api_compat.c - the request fields clients send that are not Kipp's core
 * sampling fields (api_parse.c): reasoning controls, vLLM's sampling
 * extensions, and OpenAI fields that carry no behaviour here.
 *
 * Three kinds, each checked for its type and range (a bad value is a 400
 * naming the field and what is expected, never ignored):
 *   - honoured: reasoning_effort, thinking_token_budget (vLLM) and
 *     thinking_budget_tokens (llama-server), min_tokens,
 *     include_stop_str_in_output, guided_json and guided_choice (compiled as
 *     response_format json_schema), best_of 1, an empty suffix;
 *   - accepted and ignored, logged once per process (as vLLM warns about
 *     fields it ignores): store, metadata, service_tier, user,
 *     prompt_cache_key, safety_identifier, prediction, modalities ["text"],
 *     and null refusal / audio / function_call / annotations on an assistant
 *     message (what an SDK's message.model_dump() sends back);
 *   - refused with a message that says why: guided_regex and guided_grammar
 *     (the grammar compiles JSON Schema only), audio output, web search,
 *     best_of > 1, a non-empty suffix (no fill-in-the-middle template), and
 *     vLLM extensions Kipp has no counterpart for.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/serve.h"

#define BAD(param, ...) serve_fail(e, 400, "invalid_request_error", param, __VA_ARGS__)

/* The ignored fields, one bit each in serve_req.ignored (their log names). */
static const char *const IGNORED[] = {
    "store", "metadata", "service_tier", "user", "prompt_cache_key", "safety_identifier", "prediction", "modalities",
    "messages[].refusal", "messages[].audio", "messages[].function_call", "messages[].annotations",
};
#define N_IGNORED (sizeof IGNORED / sizeof IGNORED[0])

const char *serve_ignored_name(unsigned bit) { return bit < N_IGNORED ? IGNORED[bit] : NULL; }

static void ignore(serve_req *r, const char *name)
{
    for (unsigned i = 0; i < N_IGNORED; i++)
        if (!strcmp(IGNORED[i], name)) r->ignored |= 1u << i;
}


/* metadata: up to 16 string values of at most 512 characters, keys of at most 64 (OpenAI's limits). */
static int check_metadata(const json_t *v, serve_error *e)
{
    if (!json_is_object(v)) return BAD("metadata", "metadata is %s, expected an object of string values", serve_json_type(v));
    if (json_object_size(v) > 16) return BAD("metadata", "metadata has %zu keys, expected at most 16", json_object_size(v));
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) {
        if (strlen(k) > 64) return BAD("metadata", "metadata key '%.40s...' is longer than 64 characters", k);
        if (!json_is_string(x) || json_string_length(x) > 512)
            return BAD("metadata", "metadata.%.40s is %s, expected a string of at most 512 characters", k,
                       json_is_string(x) ? "too long" : serve_json_type(x));
    }
    return 0;
}

/* OpenAI fields with no behaviour here: checked, then ignored. 1 when k is one (rc set). */
static int ignored_field(serve_req *r, const char *k, const json_t *v, int *rc, serve_error *e)
{
    static const char *const STRINGS[] = {"user", "prompt_cache_key", "safety_identifier"};
    for (size_t i = 0; i < sizeof STRINGS / sizeof STRINGS[0]; i++)
        if (!strcmp(k, STRINGS[i])) {
            *rc = json_is_string(v) ? (ignore(r, k), 0) : BAD(k, "%s is %s, expected a string", k, serve_json_type(v));
            return 1;
        }
    if (!strcmp(k, "store")) {
        *rc = json_is_boolean(v) ? (ignore(r, k), 0) : BAD(k, "store is %s, expected a boolean", serve_json_type(v));
    } else if (!strcmp(k, "metadata")) {
        *rc = check_metadata(v, e) ? -1 : (ignore(r, k), 0);
    } else if (!strcmp(k, "service_tier")) {
        const char *s = json_string_value(v);
        int ok = s && (!strcmp(s, "auto") || !strcmp(s, "default") || !strcmp(s, "flex") || !strcmp(s, "scale") ||
                       !strcmp(s, "priority"));
        *rc = ok ? (ignore(r, k), 0)
                 : BAD(k, "service_tier is %s%.40s%s, expected \"auto\", \"default\", \"flex\", \"scale\" or \"priority\"",
                       s ? "'" : "", s ? s : serve_json_type(v), s ? "'" : "");
    } else if (r->chat && !strcmp(k, "prediction")) { /* predicted outputs only speed up a reply: none to speed up here */
        const json_t *t = json_object_get(v, "type"), *c = json_object_get(v, "content");
        int ok = json_is_object(v) && json_is_string(t) && !strcmp(json_string_value(t), "content") &&
                 (json_is_string(c) || json_is_array(c));
        *rc = ok ? (ignore(r, k), 0)
                 : BAD(k, "prediction is not {\"type\": \"content\", \"content\": text or text parts}");
    } else if (r->chat && !strcmp(k, "modalities")) {
        size_t n = json_is_array(v) ? json_array_size(v) : 0, i;
        for (i = 0; i < n && json_is_string(json_array_get(v, i)) &&
                    !strcmp(json_string_value(json_array_get(v, i)), "text");
             i++) {
        }
        *rc = n && i == n ? (ignore(r, k), 0)
                          : BAD(k, "modalities must be [\"text\"]: Kipp's Qwen3 models produce text only (no audio)");
    } else {
        return 0;
    }
    return 1;
}

/* guided_json: a schema object, or its JSON text, as response_format json_schema. */
static int guided_json(serve_req *r, const json_t *v, serve_error *e)
{
    json_t *sch = NULL;
    if (json_is_string(v)) {
        json_error_t je;
        sch = json_loadb(json_string_value(v), json_string_length(v), JSON_REJECT_DUPLICATES, &je);
        if (!json_is_object(sch)) {
            json_decref(sch);
            return BAD("guided_json", "guided_json is a string that is not a JSON object: expected a JSON Schema");
        }
    } else if (json_is_object(v)) {
        sch = json_incref((json_t *)v);
    } else {
        return BAD("guided_json", "guided_json is %s, expected a JSON Schema object (or its JSON text)", serve_json_type(v));
    }
    free(r->rf_schema);
    r->rf_schema = json_dumps(sch, JSON_COMPACT);
    json_decref(sch);
    r->response_format = SERVE_RF_JSON_SCHEMA;
    return r->rf_schema ? 0 : serve_fail(e, 503, "server_error", "guided_json", "out of memory");
}

/* guided_choice: 1..256 strings, compiled as {"enum": [...]}: the reply is one of them as a JSON string. */
static int guided_choice(serve_req *r, const json_t *v, serve_error *e)
{
    size_t n = json_is_array(v) ? json_array_size(v) : 0;
    if (n == 0 || n > 256) return BAD("guided_choice", "guided_choice is %s, expected an array of 1..256 strings",
                                      json_is_array(v) ? (n ? "too long" : "empty") : serve_json_type(v));
    for (size_t i = 0; i < n; i++)
        if (!json_is_string(json_array_get(v, i)))
            return BAD("guided_choice", "guided_choice[%zu] is %s, expected a string", i, serve_json_type(json_array_get(v, i)));
    json_t *sch = json_pack("{s:s, s:O}", "type", "string", "enum", v);
    free(r->rf_schema);
    r->rf_schema = sch ? json_dumps(sch, JSON_COMPACT) : NULL;
    json_decref(sch);
    r->response_format = SERVE_RF_JSON_SCHEMA;
    return r->rf_schema ? 0 : serve_fail(e, 503, "server_error", "guided_choice", "out of memory");
}

/* thinking_token_budget / thinking_budget_tokens: -1 (unbounded) or a token count. */
static int thinking_budget(serve_req *r, const char *k, const json_t *v, serve_error *e)
{
    if (!json_is_integer(v) || json_integer_value(v) < -1 || json_integer_value(v) > (1 << 30))
        return BAD(k, "%s is %s, expected an integer in [-1, %d] (-1: no budget, 0: end reasoning at once)", k,
                   json_is_integer(v) ? "out of range" : serve_json_type(v), 1 << 30);
    int64_t b = (int64_t)json_integer_value(v);
    if (r->thinking_budget_set && b != r->thinking_budget)
        return BAD(k, "thinking_token_budget and thinking_budget_tokens disagree (%lld and %lld); send one of them",
                   (long long)r->thinking_budget, (long long)b);
    r->thinking_budget = b, r->thinking_budget_set = 1;
    return 0;
}

/* reasoning_effort: "none" / "minimal" turn thinking off; "low" / "medium" / "high" leave it as it is. */
static int reasoning_effort(serve_req *r, const json_t *v, serve_error *e)
{
    static const char *const OK[] = {"none", "minimal", "low", "medium", "high"};
    const char *s = json_string_value(v);
    for (size_t i = 0; s && i < sizeof OK / sizeof OK[0]; i++)
        if (!strcmp(s, OK[i])) {
            if (i < 2) r->effort_off = 1;
            return 0;
        }
    return BAD("reasoning_effort", "reasoning_effort is %s%.40s%s, expected \"none\", \"minimal\", \"low\", \"medium\" or "
               "\"high\"", s ? "'" : "", s ? s : serve_json_type(v), s ? "'" : "");
}

/* vLLM request extensions Kipp has no counterpart for: refused by name. */
static const char *const VLLM_REFUSED[] = {
    "use_beam_search", "length_penalty", "stop_token_ids", "bad_words", "allowed_token_ids", "prompt_logprobs",
    "truncate_prompt_tokens", "guided_decoding_backend", "guided_whitespace_pattern", "structured_outputs",
    "spaces_between_special_tokens", "logits_processors", "return_tokens_as_token_ids", "add_special_tokens",
    "documents", "chat_template", "mm_processor_kwargs", "cache_salt", "kv_transfer_params", "vllm_xargs",
};

int serve_parse_compat(serve_req *r, const char *k, const json_t *v, int *rc, serve_error *e)
{
    if (ignored_field(r, k, v, rc, e)) return 1;
    if (!strcmp(k, "min_tokens")) {
        int ok = json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= (1 << 30);
        *rc = ok ? (r->min_tokens = (uint32_t)json_integer_value(v), 0)
                 : BAD(k, "min_tokens is %s, expected an integer in [0, %d]", json_is_integer(v) ? "out of range" : serve_json_type(v),
                       1 << 30);
    } else if (!strcmp(k, "include_stop_str_in_output")) {
        *rc = json_is_boolean(v) ? (r->include_stop = json_is_true(v), 0)
                                 : BAD(k, "include_stop_str_in_output is %s, expected a boolean", serve_json_type(v));
    } else if (!strcmp(k, "guided_json") || !strcmp(k, "guided_choice")) {
        int json = !strcmp(k, "guided_json");
        if (r->guided) *rc = BAD(k, "%s and %s both constrain the reply; send one of them", r->guided, k);
        else if (!(*rc = json ? guided_json(r, v, e) : guided_choice(r, v, e))) r->guided = json ? "guided_json" : "guided_choice";
    } else if (!strcmp(k, "guided_regex") || !strcmp(k, "guided_grammar")) {
        *rc = BAD(k, "%s is not supported: Kipp's grammar compiles JSON Schema only; use guided_json, guided_choice or "
                  "response_format", k);
    } else if (!strcmp(k, "thinking_token_budget") || !strcmp(k, "thinking_budget_tokens")) {
        *rc = thinking_budget(r, k, v, e);
    } else if (r->chat && !strcmp(k, "reasoning_effort")) {
        *rc = reasoning_effort(r, v, e);
    } else if (r->chat && (!strcmp(k, "audio") || !strcmp(k, "web_search_options") || !strcmp(k, "functions") ||
                           !strcmp(k, "function_call"))) {
        *rc = BAD(k, "%s is not supported: %s", k,
                  k[0] == 'a' ? "Kipp's Qwen3 models produce text only" : k[0] == 'w' ? "Kipp does not search the web"
                                                                                      : "use tools and tool_choice");
    } else if (!r->chat && !strcmp(k, "best_of")) {
        int one = json_is_integer(v) && json_integer_value(v) == 1;
        *rc = one ? 0 : BAD(k, "best_of is %s, expected 1: Kipp does not rank candidates server-side (use n for several "
                            "samples)", json_is_integer(v) ? "above 1" : serve_json_type(v));
    } else if (!r->chat && !strcmp(k, "suffix")) {
        int empty = json_is_string(v) && json_string_length(v) == 0;
        *rc = empty ? 0 : BAD(k, "suffix is not supported: Qwen3 dense checkpoints have no fill-in-the-middle template "
                              "(send no suffix, or \"\")");
    } else {
        for (size_t i = 0; i < sizeof VLLM_REFUSED / sizeof VLLM_REFUSED[0]; i++)
            if (!strcmp(k, VLLM_REFUSED[i])) {
                *rc = BAD(k, "field '%s' (a vLLM extension) is not supported by Kipp", k);
                return 1;
            }
        return 0;
    }
    return 1;
}

int serve_parse_compat_msg(serve_req *r, const char *k, const json_t *v, size_t i, int *rc, serve_error *e)
{
    static const char *const NULLS[] = {"refusal", "audio", "function_call", "annotations"};
    for (size_t q = 0; q < sizeof NULLS / sizeof NULLS[0]; q++) {
        if (strcmp(k, NULLS[q])) continue;
        int empty = json_is_null(v) || (q == 0 && json_is_string(v) && !json_string_length(v)) ||
                    (q == 3 && json_is_array(v) && !json_array_size(v));
        char name[48];
        snprintf(name, sizeof name, "messages[].%s", k);
        *rc = empty ? (ignore(r, name), 0)
                    : BAD("messages", "messages[%zu].%s is not supported unless null%s (an SDK's model_dump() sends it "
                          "null)", i, k, q == 0 ? " or \"\"" : q == 3 ? " or []" : "");
        return 1;
    }
    return 0;
}

int serve_parse_compat_done(serve_req *r, const json_t *root, serve_error *e)
{
    if (r->effort_off) r->enable_thinking = 0; /* off wins over chat_template_kwargs.enable_thinking true */
    if (r->guided && json_object_get(root, "response_format") && !json_is_null(json_object_get(root, "response_format")))
        return BAD(r->guided, "%s and response_format both constrain the reply; send one of them", r->guided);
    if (r->min_tokens && r->max_tokens_asked >= 0 && r->min_tokens > r->max_tokens_asked)
        return BAD("min_tokens", "min_tokens %u is above %s %lld; expected at most that", r->min_tokens,
                   r->max_tokens_field, (long long)r->max_tokens_asked);
    return 0;
}
