/*
 * tokenizer_api.c - the public tokenizer entry points of kipp.h on an open
 * model (seed 000, "Tokenizer"): kipp_tokenize, kipp_detokenize and
 * kipp_token_is_added. Each checks the model and hands its tokenizer to
 * tokenizer_encode.c (encode) or tokenizer.c (decode); the streaming
 * detokenizer is detok.c.
 */
#include "engine/internal.h"
#include "engine/tokenizer_impl.h"

static const kipp_tokenizer *model_tok(const kipp_model *m, char *err, size_t errlen, int *rc)
{
    *rc = KIPP_OK;
    if (!m) *rc = kipp_err(err, errlen, KIPP_EINVAL, "model is NULL; expected an open model");
    else if (!m->tok) *rc = kipp_err(err, errlen, KIPP_ENOTSUP, "model has no tokenizer loaded");
    return m ? m->tok : NULL;
}

int kipp_token_is_added(const kipp_model *model, uint32_t id)
{
    return model && model->tok && id < model->tok->n_tokens && model->tok->is_added[id];
}

int kipp_tokenize(const kipp_model *model, const char *text, size_t len, int flags, uint32_t *ids,
                  size_t cap, size_t *n_out, char *err, size_t errlen)
{
    int rc;
    const kipp_tokenizer *t = model_tok(model, err, errlen, &rc);
    return rc ? rc : kipp_tokenizer_encode(t, text, len, flags, ids, cap, n_out, err, errlen);
}

int kipp_detokenize(const kipp_model *model, const uint32_t *ids, size_t n, char *out, size_t cap,
                    size_t *n_out, char *err, size_t errlen)
{
    int rc;
    const kipp_tokenizer *t = model_tok(model, err, errlen, &rc);
    return rc ? rc : kipp_tokenizer_decode(t, ids, n, out, cap, n_out, err, errlen);
}
