/*
 * fuzz_gguf.c - libFuzzer target for the loader: `make fuzz`.
 *
 * Each input is parsed as a GGUF container (engine/gguf.c) and then run
 * through the full Kipp subset validation (kipp_model_validate_image in
 * engine/model.c: registry match, metadata, tensor directory, tokenizer
 * counts, then the bound view through kipp_view_check as kipp_model_open
 * runs it). Built with ASan+UBSan, so any out-of-bounds or misaligned read,
 * overflow or leak is a finding. Beyond memory safety it asserts the error
 * contract: a failure returns a negative code with a non-empty message.
 * Seeds: tools/fuzz_seed.py.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Never a positive code; a failure must return a negative code and say why. */
static void check_contract(int rc, const char *err, const char *what)
{
    if (rc > 0 || (rc < 0 && err[0] == 0)) {
        fprintf(stderr, "fuzz_gguf: %s returned %d with message '%s'\n", what, rc, err);
        abort();
    }
}

static void touch(kipp_str s)
{
    volatile uint8_t sink = 0;
    for (uint64_t j = 0; j < s.len; j++) sink ^= (uint8_t)s.ptr[j];
    (void)sink;
}

/* Read every byte of every string view so ASan sees any view outside the input. */
static void touch_views(const kipp_gguf *g, const uint8_t *data, size_t size)
{
    for (uint64_t i = 0; i < g->n_kv; i++) {
        touch(g->kv[i].key);
        if (g->kv[i].type == KIPP_GGUF_STRING) touch(g->kv[i].v.s);
        for (uint64_t j = 0; g->kv[i].arr_str && j < g->kv[i].arr_n; j++) touch(g->kv[i].arr_str[j]);
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        touch(g->tensors[i].name);
        const uint8_t *p = g->tensors[i].data; /* tensor data: check the range, don't read 90 MB */
        if (p < data || (size_t)(p - data) > size || g->tensors[i].nbytes > size - (size_t)(p - data))
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512] = "";
    kipp_gguf g;
    int rc = kipp_gguf_parse(data, size, &g, err, sizeof err);
    check_contract(rc, err, "kipp_gguf_parse");
    if (rc == 0) {
        touch_views(&g, data, size);
        kipp_gguf_free(&g);
    }
    err[0] = 0;
    rc = kipp_model_validate_image(data, size, err, sizeof err);
    check_contract(rc, err, "kipp_model_validate_image");
    return 0;
}
