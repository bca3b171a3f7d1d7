/*
 * serve_ops.c - what an operator needs around the API: the API-key check and
 * vLLM's /tokenize and /detokenize (logs: serve_log.c). Tokenizing reuses serve_parse + serve_prepare,
 * so /tokenize counts exactly the tokens a completion request would use.
 */
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/serve_http.h"

void serve_log_ignored(const serve_req *r)
{
    const char *name;
    for (unsigned b = 0; (name = serve_ignored_name(b)); b++)
        if (r->ignored & (1u << b))
            serve_log_once(name, "request field '%s' is accepted and ignored: it has no effect in kipp-serve (logged once)", name);
}

/* Equal strings, in time that depends on the lengths only. */
static int same_secret(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    unsigned diff = na != nb;
    for (size_t i = 0; i < na; i++) diff |= (unsigned char)a[i] ^ (unsigned char)b[i % (nb ? nb : 1)];
    return diff == 0;
}

int serve_auth_ok(const serve_http *h, struct MHD_Connection *c, const char *url)
{
    if (!h->api_key) return 1;
    if (!h->protect_ops && (!strcmp(url, "/health") || !strcmp(url, "/metrics"))) return 1;
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Api-Key");
    if (auth && !strncasecmp(auth, "Bearer ", 7) && same_secret(auth + 7, h->api_key)) return 1;
    return x && same_secret(x, h->api_key);
}

int serve_model_known(const serve_http *h, const char *name)
{
    if (!name) return 1;
    for (int i = 0; i < h->n_names; i++)
        if (!strcmp(name, h->names[i])) return 1;
    return 0;
}

static int model_fail(const serve_http *h, const char *name, serve_error *e)
{
    serve_fail(e, 404, "invalid_request_error", "model", "model '%.100s' is not served here, expected '%s' (GET /v1/models)",
               name, h->info.model_id);
    snprintf(e->code, sizeof e->code, "model_not_found");
    return -1;
}

/* Check the top-level object of a /tokenize or /detokenize body: an object
 * whose keys are all in allowed (NULL-terminated); 400 naming the first other. */
static json_t *load_body(const char *body, size_t len, const char *const *allowed, serve_error *e)
{
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o || !json_is_object(o)) {
        json_decref(o);
        serve_fail(e, 400, "invalid_request_error", "", "the body is not a JSON object%s%s", o ? "" : ": ", o ? "" : je.text);
        return NULL;
    }
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        int ok = 0;
        for (const char *const *a = allowed; *a && !ok; a++) ok = !strcmp(k, *a);
        if (!ok) {
            serve_fail(e, 400, "invalid_request_error", k, "unknown field '%.60s'", k);
            json_decref(o);
            return NULL;
        }
    }
    return o;
}

/* The completion request a /tokenize body stands for: its prompt or messages
 * (and chat_template_kwargs), with max_tokens 1, as JSON text; NULL with e. */
static char *as_request(json_t *o, int *chat, serve_error *e)
{
    json_t *prompt = json_object_get(o, "prompt"), *msgs = json_object_get(o, "messages");
    json_t *agp = json_object_get(o, "add_generation_prompt"), *ast = json_object_get(o, "add_special_tokens");
    if (!prompt == !msgs)
        return serve_fail(e, 400, "invalid_request_error", prompt ? "messages" : "prompt",
                          "send exactly one of \"prompt\" (text or token ids) and \"messages\""), NULL;
    if (ast && !json_is_boolean(ast))
        return serve_fail(e, 400, "invalid_request_error", "add_special_tokens", "add_special_tokens must be a boolean"), NULL;
    if (agp && !json_is_true(agp))
        return serve_fail(e, 400, "invalid_request_error", "add_generation_prompt",
                          "add_generation_prompt must be true: the chat template is always rendered with the "
                          "assistant's generation prompt, as /v1/chat/completions uses it"), NULL;
    if (!msgs && json_object_get(o, "chat_template_kwargs"))
        return serve_fail(e, 400, "invalid_request_error", "chat_template_kwargs", "chat_template_kwargs needs \"messages\""), NULL;
    if (!msgs && json_object_get(o, "tools"))
        return serve_fail(e, 400, "invalid_request_error", "tools", "tools needs \"messages\""), NULL;
    *chat = msgs != NULL;
    json_t *r = json_pack("{s:O, s:i}", *chat ? "messages" : "prompt", *chat ? msgs : prompt, "max_tokens", 1);
    if (*chat && json_object_get(o, "chat_template_kwargs"))
        json_object_set(r, "chat_template_kwargs", json_object_get(o, "chat_template_kwargs"));
    if (*chat && json_object_get(o, "tools")) /* rendered into the prompt as chat renders them: their cost counts */
        json_object_set(r, "tools", json_object_get(o, "tools"));
    char *s = json_dumps(r, JSON_COMPACT);
    json_decref(r);
    if (!s) serve_fail(e, 503, "server_error", "", "out of memory");
    return s;
}

int serve_tokenize(serve_http *h, const char *body, size_t len, char **json, serve_error *e)
{
    static const char *const allowed[] = {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt",
                                          "chat_template_kwargs", "tools", NULL};
    json_t *o = load_body(body, len, allowed, e);
    if (!o) return -1;
    json_t *model = json_object_get(o, "model");
    int chat = 0, rc = -1;
    char *req = NULL;
    if (model && (!json_is_string(model) || !serve_model_known(h, json_string_value(model))))
        model_fail(h, json_is_string(model) ? json_string_value(model) : "(not a string)", e);
    else if ((req = as_request(o, &chat, e))) {
        serve_req r;
        if (!serve_parse(req, strlen(req), chat, &r, e)) {
            pthread_mutex_lock(serve_tokenizer_mutex(h->sched));
            rc = serve_prepare(h->info.model, h->info.n_ctx, &r, e);
            pthread_mutex_unlock(serve_tokenizer_mutex(h->sched));
            json_t *ids = json_array();
            for (size_t i = 0; !rc && i < r.n_prompt; i++) json_array_append_new(ids, json_integer(r.prompt_ids[i]));
            json_t *out = json_pack("{s:I, s:I, s:o}", "count", (json_int_t)r.n_prompt, "max_model_len",
                                    (json_int_t)h->info.n_ctx, "tokens", ids);
            if (!rc) *json = json_dumps(out, JSON_COMPACT | JSON_PRESERVE_ORDER);
            json_decref(out);
            serve_req_free(&r);
        }
    }
    free(req);
    json_decref(o);
    return rc;
}


int serve_detokenize(serve_http *h, const char *body, size_t len, char **json, serve_error *e)
{
    static const char *const allowed[] = {"model", "tokens", NULL};
    json_t *o = load_body(body, len, allowed, e);
    if (!o) return -1;
    json_t *model = json_object_get(o, "model"), *toks = json_object_get(o, "tokens");
    kipp_model_info info;
    kipp_model_get_info(h->info.model, &info);
    size_t n = json_array_size(toks);
    uint32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    int rc = -1;
    if (model && (!json_is_string(model) || !serve_model_known(h, json_string_value(model))))
        model_fail(h, json_is_string(model) ? json_string_value(model) : "(not a string)", e);
    else if (!json_is_array(toks))
        serve_fail(e, 400, "invalid_request_error", "tokens", "tokens must be an array of token ids");
    else if (!ids)
        serve_fail(e, 503, "server_error", "", "out of memory");
    else {
        rc = 0;
        for (size_t i = 0; i < n && !rc; i++) {
            json_t *t = json_array_get(toks, i);
            if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= (json_int_t)info.vocab_size)
                rc = serve_fail(e, 400, "invalid_request_error", "tokens",
                                "tokens[%zu] is not a token id, expected an integer in 0..%u", i, info.vocab_size - 1);
            else ids[i] = (uint32_t)json_integer_value(t);
        }
    }
    size_t need = 0;
    char err[128], *text = NULL;
    if (!rc && kipp_detokenize(h->info.model, ids, n, NULL, 0, &need, err, sizeof err) != 0 && need == 0 && n)
        rc = serve_fail(e, 500, "server_error", "", "detokenize failed: %s", err);
    if (!rc && !(text = malloc(need + 1))) rc = serve_fail(e, 503, "server_error", "", "out of memory");
    if (!rc && kipp_detokenize(h->info.model, ids, n, text, need + 1, &need, err, sizeof err))
        rc = serve_fail(e, 500, "server_error", "", "detokenize failed: %s", err);
    if (!rc) {
        json_t *out = json_pack("{s:o}", "prompt", serve_json_text(text, need));
        *json = json_dumps(out, JSON_COMPACT);
        json_decref(out);
    }
    free(text), free(ids);
    json_decref(o);
    return rc;
}
