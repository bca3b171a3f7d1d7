/*
 * api_embed.h - POST /v1/embeddings (server/api_embed.c): the request as the
 * HTTP layer holds it, its parsing and its rendering.
 */
#ifndef KIPP_API_EMBED_H
#define KIPP_API_EMBED_H

#include "server/serve_http.h"

/** A parsed embeddings request: token ids of each input and, once run, the results. */
typedef struct {
    uint32_t **ids;   /* [n] malloc'd token arrays */
    uint32_t *lens;   /* [n] tokens of each */
    size_t n;         /* inputs */
    uint32_t dims;    /* values per embedding: "dimensions", else d_model */
    uint32_t vocab;   /* token ids must be below this (the model's vocab_size) */
    int base64;       /* encoding_format "base64" */
    int text;         /* the inputs were text (tokenized here, <|endoftext|> appended) */
    int many;         /* input was an array of inputs (errors then name input[i]) */
    uint64_t tokens;  /* usage.prompt_tokens: every input's tokens */
    float *out;       /* [n][dims] results (malloc'd by the caller before running) */
} serve_embed_req;

/**
 * Parse and validate body into r: fields, input kinds, token ids, lengths
 * against the served context (text inputs tokenized under the tokenizer lock).
 * 0, or -1 with e filled (400 naming the field or input; 404 unknown model).
 * On failure r holds nothing to free.
 */
int serve_embed_parse(serve_http *h, const char *body, size_t len, serve_embed_req *r, serve_error *e);
/** The 200 body for a finished request; malloc'd JSON, NULL when out of memory. */
char *serve_embed_render(const serve_http *h, const serve_embed_req *r);
/** Free what r holds; r may be reused. */
void serve_embed_req_free(serve_embed_req *r);

#endif
