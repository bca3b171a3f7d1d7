/*
 * detok.c - the streaming detokenizer of kipp.h (kipp_detok_stream_*; seed
 * 000, "Tokenizer"). The whole-buffer entry points, kipp_tokenize and
 * kipp_detokenize, are in tokenizer_api.c.
 *
 * The stream turns token ids into text a piece at a time and emits only
 * complete UTF-8: a multi-byte character split across tokens (emoji, CJK
 * byte-fallback pieces) is held back until its last byte arrives. Bytes that
 * can never become valid are replaced by U+FFFD exactly as Python's
 * bytes.decode("utf-8", "replace") does, so the concatenated stream equals
 * the Hugging Face decode of the same ids.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/internal.h"
#include "engine/tokenizer_impl.h"

#define FFFD "\xEF\xBF\xBD"

struct kipp_detok_stream {
    const kipp_tokenizer *t;
    char *buf;   /* [cap] bytes decoded but not yet emitted */
    size_t len, cap;
};

kipp_detok_stream *kipp_detok_stream_create(const kipp_model *model)
{
    if (!model || !model->tok) return NULL;
    kipp_detok_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->t = model->tok;
    s->cap = 256;
    s->buf = malloc(s->cap);
    if (!s->buf) {
        free(s);
        return NULL;
    }
    return s;
}

void kipp_detok_stream_destroy(kipp_detok_stream *s)
{
    if (!s) return;
    free(s->buf);
    free(s);
}

/* Move whole characters from s->buf to out while they fit. An incomplete
 * trailing sequence stays unless final; ill-formed bytes become U+FFFD. */
static size_t drain(kipp_detok_stream *s, char *out, size_t cap, int final)
{
    const uint8_t *p = (const uint8_t *)s->buf;
    size_t i = 0, o = 0, bad;
    while (i < s->len) {
        size_t k = kipp_utf8_seq(p, i, s->len, &bad);
        if (!k && !final && p[i] >= 0xC2 && p[i] <= 0xF4 && i + bad == s->len) break; /* may complete */
        const char *src = k ? s->buf + i : FFFD;
        size_t w = k ? k : 3;
        if (o + w > cap) break;
        memcpy(out + o, src, w);
        o += w;
        i += k ? k : bad;
    }
    memmove(s->buf, s->buf + i, s->len - i);
    s->len -= i;
    return o;
}

int kipp_detok_stream_push(kipp_detok_stream *s, uint32_t id, char *out, size_t cap, size_t *n_out,
                           char *err, size_t errlen)
{
    if (!s || !out || !n_out || cap < 64)
        return kipp_err(err, errlen, KIPP_EINVAL, "stream push needs a stream, out, n_out and cap >= 64 (got %zu)",
                        cap);
    *n_out = 0;
    if (id >= KIPP_VOCAB_SIZE)
        return kipp_err(err, errlen, KIPP_ERANGE, "token id %u is out of range; expected < %u", id,
                        KIPP_VOCAB_SIZE);
    char tmp[4096];
    kipp_str b = kipp_tokenizer_token_bytes(s->t, id, tmp, sizeof tmp);
    KIPP_ASSERT(b.ptr != NULL);
    if (s->len + b.len > s->cap) {
        size_t nc = (s->len + b.len) * 2;
        char *nb = realloc(s->buf, nc);
        if (!nb) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory growing the stream to %zu bytes", nc);
        s->buf = nb;
        s->cap = nc;
    }
    memcpy(s->buf + s->len, b.ptr, b.len);
    s->len += b.len;
    *n_out = drain(s, out, cap, 0);
    return KIPP_OK;
}

int kipp_detok_stream_flush(kipp_detok_stream *s, char *out, size_t cap, size_t *n_out)
{
    if (!s || !out || !n_out) return KIPP_EINVAL;
    *n_out = drain(s, out, cap, 1);
    return s->len ? KIPP_ERANGE : KIPP_OK;
}
