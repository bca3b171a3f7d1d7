/*
 * tokenizer_json.h - test-only: build kipp_tokenizer_data straight from
 * data/qwen3/qwen3-tokenizer/tokenizer.json (+ tokenizer_config.json's
 * added_tokens_decoder merged over it, as transformers does), with jansson.
 *
 * This is a second, independent path to the tokenizer tables: the tests run
 * the golden cases through both it and the GGUF written by
 * tools/convert_to_gguf.py, so a converter bug cannot hide behind a matching
 * tokenizer bug.
 */
#ifndef KIPP_TEST_TOKENIZER_JSON_H
#define KIPP_TEST_TOKENIZER_JSON_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer.h"

typedef struct {
    json_t *tj, *cfg;              /* parsed files; the views point into their strings */
    kipp_str *tokens;              /* [n_tokens] */
    kipp_str *merges;              /* [n_merges], "l r" strings malloc'd in merge_buf */
    char *merge_buf;
    uint32_t added_ids[64];
    uint8_t added_special[64];
    kipp_tokenizer_data d;
} tj_tokenizer;

/** Directory of the vendored Qwen3 reference data: $KIPP_QWEN3_DATA, else data/qwen3
 *  (relative to the repository root, where tests/run_tests.sh runs the tests). */
static inline const char *tj_data_dir(void)
{
    const char *s = getenv("KIPP_QWEN3_DATA");
    return s ? s : "data/qwen3";
}

static inline void tj_free(tj_tokenizer *x)
{
    json_decref(x->tj);
    json_decref(x->cfg);
    free(x->tokens);
    free(x->merges);
    free(x->merge_buf);
    memset(x, 0, sizeof *x);
}

static inline int tj_set_token(tj_tokenizer *x, size_t id, const char *s, size_t n)
{
    if (id >= x->d.n_tokens) return -1;
    x->tokens[id].ptr = s;
    x->tokens[id].len = n;
    return 0;
}

static inline int tj_merges(tj_tokenizer *x, json_t *merges)
{
    size_t n = json_array_size(merges), total = 0, i;
    json_t *m;
    json_array_foreach(merges, i, m)
        total += json_string_length(json_array_get(m, 0)) + json_string_length(json_array_get(m, 1)) + 1;
    x->merges = calloc(n ? n : 1, sizeof *x->merges);
    x->merge_buf = malloc(total + 1);
    if (!x->merges || !x->merge_buf) return -1;
    char *p = x->merge_buf;
    json_array_foreach(merges, i, m) {
        json_t *l = json_array_get(m, 0), *r = json_array_get(m, 1);
        if (!json_is_string(l) || !json_is_string(r)) return -1;
        size_t nl = json_string_length(l), nr = json_string_length(r);
        x->merges[i].ptr = p;
        x->merges[i].len = nl + 1 + nr;
        memcpy(p, json_string_value(l), nl);
        p[nl] = ' ';
        memcpy(p + nl + 1, json_string_value(r), nr);
        p += nl + 1 + nr;
    }
    x->d.merges = x->merges;
    x->d.n_merges = n;
    return 0;
}

/* Added tokens: tokenizer.json's list, then added_tokens_decoder on top. */
static inline int tj_added(tj_tokenizer *x)
{
    json_t *added = json_object_get(x->tj, "added_tokens"), *a;
    json_t *dec = json_object_get(x->cfg, "added_tokens_decoder");
    size_t i, n = 0;
    json_array_foreach(added, i, a) {
        size_t id = (size_t)json_integer_value(json_object_get(a, "id"));
        json_t *c = json_object_get(a, "content");
        if (n >= 64 || tj_set_token(x, id, json_string_value(c), json_string_length(c))) return -1;
        x->added_ids[n] = (uint32_t)id;
        x->added_special[n++] = json_is_true(json_object_get(a, "special"));
    }
    const char *key;
    json_object_foreach(dec, key, a) {
        size_t id = strtoul(key, NULL, 10), k;
        json_t *c = json_object_get(a, "content");
        if (tj_set_token(x, id, json_string_value(c), json_string_length(c))) return -1;
        for (k = 0; k < n && x->added_ids[k] != id; k++) {}
        if (k == n) {
            if (n >= 64) return -1;
            x->added_ids[n++] = (uint32_t)id;
        }
        x->added_special[k] = json_is_true(json_object_get(a, "special"));
    }
    for (size_t p = 1; p < n; p++) /* ids ascending, as the GGUF stores them */
        for (size_t q = p; q > 0 && x->added_ids[q - 1] > x->added_ids[q]; q--) {
            uint32_t t = x->added_ids[q]; x->added_ids[q] = x->added_ids[q - 1]; x->added_ids[q - 1] = t;
            uint8_t s = x->added_special[q]; x->added_special[q] = x->added_special[q - 1]; x->added_special[q - 1] = s;
        }
    x->d.added_ids = x->added_ids;
    x->d.added_special = x->added_special;
    x->d.n_added = n;
    return 0;
}

/** Load the reference tokenizer data; 0 on success, -1 (message on stderr) otherwise. */
static inline int tj_load(tj_tokenizer *x, const char *data)
{
    char path[1024];
    json_error_t je;
    memset(x, 0, sizeof *x);
    snprintf(path, sizeof path, "%s/qwen3-tokenizer/tokenizer.json", data);
    x->tj = json_load_file(path, 0, &je);
    snprintf(path, sizeof path, "%s/qwen3-tokenizer/tokenizer_config.json", data);
    x->cfg = json_load_file(path, 0, &je);
    if (!x->tj || !x->cfg) {
        fprintf(stderr, "cannot load %s/qwen3-tokenizer: %s\n", data, je.text);
        return -1;
    }
    json_t *model = json_object_get(x->tj, "model");
    json_t *vocab = json_object_get(model, "vocab");
    json_t *pre = json_object_get(json_array_get(json_object_get(json_object_get(x->tj, "pre_tokenizer"),
                                                                 "pretokenizers"), 0), "pattern");
    json_t *re = json_object_get(pre, "Regex");
    json_t *added = json_object_get(x->tj, "added_tokens");
    x->d.n_tokens = json_object_size(vocab) + json_array_size(added);
    x->tokens = calloc(x->d.n_tokens, sizeof *x->tokens);
    if (!x->tokens || !json_is_string(re)) return -1;
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v)
        if (tj_set_token(x, (size_t)json_integer_value(v), key, strlen(key))) return -1;
    if (tj_merges(x, json_object_get(model, "merges")) || tj_added(x)) return -1;
    x->d.tokens = x->tokens;
    x->d.pre_regex.ptr = json_string_value(re);
    x->d.pre_regex.len = json_string_length(re);
    return 0;
}

#endif
