/* tokenizer.c - placeholder until the native tokenizer lands. */
#include "internal.h"

int kipp_tokenizer_create(const kipp_tokenizer_data *d, kipp_tokenizer **out, char *err, size_t errlen)
{
    (void)d;
    *out = NULL;
    return kipp_err(err, errlen, KIPP_ENOTSUP, "tokenizer not implemented yet");
}
void kipp_tokenizer_destroy(kipp_tokenizer *t) { (void)t; }
