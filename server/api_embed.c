/*
 * api_embed.c - POST /v1/embeddings in OpenAI's shape (issue 56).
 *
 * Request: {"input": string | [string] | [int] | [[int]], "model"?,
 * "encoding_format"?: "float" | "base64", "dimensions"?: 1..d_model, "user"?}.
 * A text input is tokenized the Qwen3-Embedding way (kipp_embed_tokenize, no
 * instruction: a client that wants one sends "Instruct: ...\nQuery:..." as
 * text, as with vLLM and llama-server) and ends with <|endoftext|>; a token
 * input is used exactly as given. Every input must fit the served context.
 * Response: {"object":"list","data":[{"object":"embedding","index":i,
 * "embedding":[floats] | base64 of little-endian float32}],"model",
 * "usage":{"prompt_tokens","total_tokens"}}. The evaluation itself is the
 * scheduler's (sched_embed.c); this file only parses, validates and renders.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api_embed.h"

#define BAD(param, ...) serve_fail(e, 400, "invalid_request_error", param, __VA_ARGS__)

static const char *const FIELDS = "input, model, encoding_format, dimensions, user";

/* One token-array input: integers 0..vocab-1 (as /detokenize takes them), at least one. */
static int token_input(serve_embed_req *r, const json_t *a, const char *where, serve_error *e)
{
    size_t n = json_array_size(a);
    if (n == 0) return BAD("input", "%s is an empty token array; expected at least one token id", where);
    uint32_t *ids = malloc(n * sizeof *ids);
    if (!ids) return serve_fail(e, 503, "server_error", "", "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(a, i);
        json_int_t t = json_is_integer(v) ? json_integer_value(v) : -1;
        if (!json_is_integer(v) || t < 0 || t >= (json_int_t)r->vocab) {
            free(ids);
            return json_is_integer(v) ? BAD("input", "%s[%zu] is %lld, not a token id; expected 0..%u", where, i, (long long)t,
                                            r->vocab - 1)
                                      : BAD("input", "%s[%zu] is %s; expected a token id (integer)", where, i, serve_json_type(v));
        }
        ids[i] = (uint32_t)t;
    }
    r->ids[r->n] = ids, r->lens[r->n++] = (uint32_t)n;
    return 0;
}

/* One text input, tokenized with <|endoftext|> appended (tokenizer lock held by the caller). */
static int text_input(serve_http *h, serve_embed_req *r, const json_t *v, const char *where, serve_error *e)
{
    if (json_string_length(v) == 0) return BAD("input", "%s is an empty string; expected text to embed", where);
    char err[256] = "";
    uint32_t n = 0;
    if (kipp_embed_tokenize(h->info.model, NULL, json_string_value(v), json_string_length(v), &r->ids[r->n], &n, err, sizeof err))
        return serve_fail(e, 503, "server_error", "", "tokenizing %s failed: %s", where, err);
    r->lens[r->n++] = n;
    return 0;
}

/* The inputs of "input" into r->ids/lens (counted and typed first, so the arrays are sized once). */
static int parse_input(serve_http *h, serve_embed_req *r, const json_t *in, serve_error *e)
{
    if (!in) return BAD("input", "input is missing; expected a string, an array of strings, or token arrays");
    int texts = json_is_string(in), flat = 0, nested = 0;
    size_t n = 1;
    if (json_is_array(in)) {
        n = json_array_size(in);
        if (n == 0) return BAD("input", "input is an empty array; expected at least one string or token array");
        const json_t *f = json_array_get(in, 0);
        texts = json_is_string(f), flat = json_is_integer(f), nested = json_is_array(f);
        if (!texts && !flat && !nested)
            return BAD("input", "input[0] is %s; expected a string, a token id or a token array", serve_json_type(f));
        for (size_t i = 1; i < n; i++) {
            const json_t *v = json_array_get(in, i);
            if (texts ? !json_is_string(v) : flat ? !json_is_integer(v) : !json_is_array(v))
                return BAD("input", "input[%zu] is %s but input[0] is %s; expected every item of one kind", i,
                           serve_json_type(v), serve_json_type(f));
        }
        if (flat) n = 1;
    } else if (!texts) {
        return BAD("input", "input is %s; expected a string, an array of strings, or token arrays", serve_json_type(in));
    }
    if (n > SERVE_EMBED_MAX_INPUTS) return BAD("input", "input has %zu items, more than the %d allowed", n, SERVE_EMBED_MAX_INPUTS);
    r->ids = calloc(n, sizeof *r->ids), r->lens = calloc(n, sizeof *r->lens);
    if (!r->ids || !r->lens) return serve_fail(e, 503, "server_error", "", "out of memory");
    int rc = 0;
    char where[48];
    if (flat) return token_input(r, in, "input", e);
    if (texts) pthread_mutex_lock(serve_tokenizer_mutex(h->sched));
    for (size_t i = 0; i < n && !rc; i++) {
        const json_t *v = json_is_array(in) ? json_array_get(in, i) : in;
        snprintf(where, sizeof where, json_is_array(in) ? "input[%zu]" : "input", i);
        rc = texts ? text_input(h, r, v, where, e) : token_input(r, v, where, e);
    }
    if (texts) pthread_mutex_unlock(serve_tokenizer_mutex(h->sched));
    return rc;
}

/* Every input within the served context; the usage count. */
static int check_lengths(const serve_http *h, serve_embed_req *r, serve_error *e)
{
    kipp_model_info mi;
    kipp_model_get_info(h->info.model, &mi);
    uint64_t pool_pos = mi.kv_pool_blocks ? (uint64_t)mi.kv_pool_blocks * SERVE_KV_BLOCK : UINT64_MAX;
    for (size_t i = 0; i < r->n; i++) {
        char where[40] = "input";
        if (r->many) snprintf(where, sizeof where, "input[%zu]", i);
        if (r->lens[i] > h->info.n_ctx)
            return BAD("input", "%s has %u tokens%s, more than the context length %u: shorten it", where, r->lens[i],
                       r->text ? " (with the <|endoftext|> appended)" : "", h->info.n_ctx);
        if (r->lens[i] > pool_pos) /* it could never be evaluated: a 400, not a 503 to retry */
            return BAD("input", "%s has %u tokens%s, more than the %llu positions the KV pool holds (--kv-pool-mib): "
                       "shorten it", where, r->lens[i], r->text ? " (with the <|endoftext|> appended)" : "",
                       (unsigned long long)pool_pos);
        r->tokens += r->lens[i];
    }
    return 0;
}

int serve_embed_parse(serve_http *h, const char *body, size_t len, serve_embed_req *r, serve_error *e)
{
    memset(r, 0, sizeof *r);
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(o)) { /* the message reads o's type before o is released */
        int rc = o ? BAD("", "request body is %s, expected a JSON object", serve_json_type(o))
                   : BAD("", "request body is not valid JSON: %s", je.text);
        json_decref(o);
        return rc;
    }
    kipp_model_info info;
    kipp_model_get_info(h->info.model, &info);
    r->dims = info.d_model, r->vocab = info.vocab_size;
    const char *k;
    json_t *v;
    int rc = 0;
    json_object_foreach(o, k, v) {
        if (rc) break;
        if (!strcmp(k, "model")) {
            if (!json_is_string(v)) rc = BAD("model", "model is %s, expected a string", serve_json_type(v));
            else if (!serve_model_known(h, json_string_value(v))) {
                rc = serve_fail(e, 404, "invalid_request_error", "model", "model '%.100s' is not served here, expected '%s' "
                                "(GET /v1/models)", json_string_value(v), h->info.model_id);
                snprintf(e->code, sizeof e->code, "model_not_found");
            }
        } else if (!strcmp(k, "encoding_format")) {
            const char *f = json_string_value(v);
            if (!f || (strcmp(f, "float") && strcmp(f, "base64")))
                rc = f ? BAD("encoding_format", "encoding_format '%.40s' is not supported; expected \"float\" or \"base64\"", f)
                       : BAD("encoding_format", "encoding_format is %s; expected \"float\" or \"base64\"", serve_json_type(v));
            else r->base64 = !strcmp(f, "base64");
        } else if (!strcmp(k, "dimensions")) {
            json_int_t d = json_integer_value(v);
            if (!json_is_integer(v))
                rc = BAD("dimensions", "dimensions is %s; expected an integer in 1..%u", serve_json_type(v), info.d_model);
            else if (d < 1 || d > (json_int_t)info.d_model)
                rc = BAD("dimensions", "dimensions %lld is out of range; expected 1..%u (%s's d_model)", (long long)d,
                         info.d_model, info.checkpoint_id);
            else r->dims = (uint32_t)d;
        } else if (!strcmp(k, "user")) {
            if (!json_is_string(v)) rc = BAD("user", "user is %s, expected a string", serve_json_type(v));
        } else if (strcmp(k, "input")) {
            rc = BAD(k, "unknown field '%.60s' in an embeddings request; expected only %s", k, FIELDS);
        }
    }
    json_t *in = json_object_get(o, "input");
    r->text = json_is_string(in) || (json_is_array(in) && json_is_string(json_array_get(in, 0)));
    r->many = json_is_array(in) && !json_is_integer(json_array_get(in, 0));
    if (!rc) rc = parse_input(h, r, in, e);
    if (!rc) rc = check_lengths(h, r, e);
    json_decref(o);
    if (rc) serve_embed_req_free(r);
    return rc;
}

void serve_embed_req_free(serve_embed_req *r)
{
    for (size_t i = 0; r->ids && i < r->n; i++) free(r->ids[i]);
    free(r->ids), free(r->lens), free(r->out);
    r->ids = NULL, r->lens = NULL, r->out = NULL, r->n = 0;
}

static void put_base64(serve_buf *b, const unsigned char *p, size_t n)
{
    static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char q[4];
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        q[0] = t[v >> 18], q[1] = t[(v >> 12) & 63];
        q[2] = i + 1 < n ? t[(v >> 6) & 63] : '=', q[3] = i + 2 < n ? t[v & 63] : '=';
        serve_buf_put(b, q, 4);
    }
}

char *serve_embed_render(const serve_http *h, const serve_embed_req *r)
{
    serve_buf b = {0};
    char num[72];
    serve_buf_put(&b, "{\"object\":\"list\",\"data\":[", 25);
    for (size_t i = 0; i < r->n; i++) {
        const float *v = r->out + i * (size_t)r->dims;
        int k = snprintf(num, sizeof num, "%s{\"object\":\"embedding\",\"index\":%zu,\"embedding\":", i ? "," : "", i);
        serve_buf_put(&b, num, (size_t)k);
        if (r->base64) { /* little-endian float32 bytes, as OpenAI sends them (x86 and arm64 hosts are little-endian) */
            serve_buf_put(&b, "\"", 1), put_base64(&b, (const unsigned char *)v, r->dims * sizeof *v), serve_buf_put(&b, "\"", 1);
        } else {
            serve_buf_put(&b, "[", 1);
            for (uint32_t j = 0; j < r->dims; j++) {
                k = snprintf(num, sizeof num, j ? ",%.9g" : "%.9g", (double)v[j]);
                serve_buf_put(&b, num, (size_t)k);
            }
            serve_buf_put(&b, "]", 1);
        }
        serve_buf_put(&b, "}", 1);
    }
    json_t *model = serve_json_text(h->info.model_id, strlen(h->info.model_id));
    char *m = json_dumps(model, JSON_ENCODE_ANY);
    json_decref(model);
    int k = snprintf(num, sizeof num, "],\"model\":");
    serve_buf_put(&b, num, (size_t)k);
    serve_buf_put(&b, m ? m : "\"\"", m ? strlen(m) : 2);
    free(m);
    char tail[96];
    k = snprintf(tail, sizeof tail, ",\"usage\":{\"prompt_tokens\":%llu,\"total_tokens\":%llu}}", (unsigned long long)r->tokens,
                 (unsigned long long)r->tokens);
    if (serve_buf_put(&b, tail, (size_t)k) || b.n < 40) { /* the last put failed, or an earlier one: the text is cut */
        serve_buf_free(&b);
        return NULL;
    }
    return b.p;
}
