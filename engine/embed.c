/*
 * embed.c - text embeddings from an embedding model (Qwen3-Embedding, issue 56).
 *
 * The recipe is the model card's (huggingface.co/Qwen/Qwen3-Embedding-0.6B,
 * "Transformers Usage") and sentence-transformers' config of the same repo:
 * a query may carry an instruction, formatted by the card's
 * get_detailed_instruct as "Instruct: {task}\nQuery:{query}"; every input
 * ends with <|endoftext|> (151643), which the Hub tokenizer's post-processor
 * appends (the card's older tokenize() appended eod_id by hand); the
 * embedding is the final-norm hidden state of that last token (last-token
 * pooling), L2-normalized. Matryoshka truncation keeps the first `dims`
 * values and normalizes again. docs/SERVING.md "Embeddings" cites the sources.
 *
 * All inputs of one call are evaluated in one kipp_eval_batch, each on its own
 * fresh session, with no logits rows: the weights are read once per backend
 * round and the output head never runs.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/errbuf.h"
#include "engine/internal.h"

static const char instruct_head[] = "Instruct: ";
static const char instruct_mid[] = "\nQuery:";

int kipp_embed_tokenize(const kipp_model *m, const char *instruct, const char *text, size_t len, uint32_t **ids,
                        uint32_t *n, char *err, size_t errlen)
{
    if (!m || !text || !ids || !n) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_embed_tokenize: NULL argument");
    *ids = NULL, *n = 0;
    size_t il = instruct ? strlen(instruct) : 0, tl = instruct ? sizeof instruct_head + il + sizeof instruct_mid + len : len;
    char *buf = malloc(tl + 1);
    if (!buf) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for a %zu-byte embedding input", tl);
    size_t o = 0;
    if (instruct) {
        memcpy(buf, instruct_head, sizeof instruct_head - 1), o += sizeof instruct_head - 1;
        memcpy(buf + o, instruct, il), o += il;
        memcpy(buf + o, instruct_mid, sizeof instruct_mid - 1), o += sizeof instruct_mid - 1;
    }
    memcpy(buf + o, text, len), o += len;
    size_t cnt = 0;
    /* User text: no special-token matching, so "<|endoftext|>" typed in the text stays plain text. */
    int rc = kipp_tokenize(m, buf, o, 0, NULL, 0, &cnt, err, errlen);
    if (rc && rc != KIPP_ERANGE) {
        free(buf);
        return rc;
    }
    uint32_t *out = malloc((cnt + 1) * sizeof *out);
    rc = out ? kipp_tokenize(m, buf, o, 0, out, cnt, &cnt, err, errlen)
             : kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for %zu token ids", cnt + 1);
    free(buf);
    if (rc || cnt + 1 > UINT32_MAX) {
        free(out);
        return rc ? rc : kipp_err(err, errlen, KIPP_ERANGE, "%zu tokens in one embedding input", cnt);
    }
    out[cnt++] = KIPP_EMBED_EOT;
    *ids = out, *n = (uint32_t)cnt;
    return 0;
}

/* Truncate hidden [d] to its first dims values and L2-normalize them into out. */
static int pool_row(const float *hidden, uint32_t dims, float *out, size_t idx, char *err, size_t errlen)
{
    double ss = 0;
    for (uint32_t i = 0; i < dims; i++) ss += (double)hidden[i] * hidden[i];
    if (!(ss > 0) || !isfinite(ss))
        return kipp_err(err, errlen, KIPP_ENUMERIC, "input %zu: the pooled hidden state has norm^2 %g, expected a "
                        "positive finite value", idx, ss);
    double inv = 1.0 / sqrt(ss);
    for (uint32_t i = 0; i < dims; i++) out[i] = (float)(hidden[i] * inv);
    return 0;
}

int kipp_embed(kipp_model *m, const uint32_t *const *ids, const uint32_t *lens, size_t n, uint32_t dims, float *out,
               char *err, size_t errlen)
{
    if (!m || !ids || !lens || !out || n == 0) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_embed: NULL argument or no inputs");
    uint32_t D = m->view.dims.d_model;
    if (dims == 0 || dims > D)
        return kipp_err(err, errlen, KIPP_ERANGE, "dimensions %u is out of range, expected 1..%u (d_model)", dims, D);
    kipp_session **ss = calloc(n, sizeof *ss);
    kipp_batch_item *it = calloc(n, sizeof *it);
    float *hid = malloc(n * (size_t)D * sizeof *hid);
    int rc = ss && it && hid ? 0 : kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for %zu embedding inputs", n);
    for (size_t i = 0; i < n && !rc; i++) {
        if (lens[i] == 0) rc = kipp_err(err, errlen, KIPP_EINVAL, "input %zu has no tokens, expected at least 1", i);
        else rc = kipp_session_create(m, lens[i], &ss[i], err, errlen);
        if (rc == KIPP_ERANGE)
            kipp_err(err, errlen, KIPP_ERANGE, "input %zu has %u tokens, more than the context length %u", i, lens[i],
                     m->view.dims.context_length);
        if (!rc) it[i] = (kipp_batch_item){.session = ss[i], .tokens = ids[i], .token_count = lens[i],
                                           .hidden = hid + i * (size_t)D};
    }
    if (!rc) rc = kipp_eval_batch(m, it, n, err, errlen);
    for (size_t i = 0; i < n && !rc; i++) rc = pool_row(hid + i * (size_t)D, dims, out + i * (size_t)dims, i, err, errlen);
    for (size_t i = 0; ss && i < n; i++) kipp_session_destroy(ss[i]);
    free(ss), free(it), free(hid);
    return rc;
}
