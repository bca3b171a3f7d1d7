/* tokenizer.c - placeholder until the native tokenizer lands: builds an empty
 * tokenizer so the loader can be developed; encode/decode report ENOTSUP. */
#include <stdlib.h>

#include "internal.h"

struct kipp_tokenizer {
    int unused;
};

int kipp_tokenizer_create(const kipp_tokenizer_data *d, kipp_tokenizer **out, char *err, size_t errlen)
{
    (void)d;
    *out = calloc(1, sizeof **out);
    return *out ? KIPP_OK : kipp_err(err, errlen, KIPP_ENOMEM, "out of memory");
}
void kipp_tokenizer_destroy(kipp_tokenizer *t) { free(t); }
