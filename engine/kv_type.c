/*
 * kv_type.c - the KV cache types (kipp.h kipp_model_options.kv_type,
 * --kv-type): names, parsing, bytes per token, and the model's choice.
 * The layouts are the backend's (backends/cpu/kv_store.h); q8_0 is ggml's
 * block, 32 int8 values and one fp16 scale (34 bytes per 32 values).
 */
#include <string.h>

#include "base/errbuf.h"
#include "engine/internal.h"

static const char *const names[KIPP_KV_TYPE_COUNT] = {[KIPP_KV_BF16] = "bf16", [KIPP_KV_Q8_0] = "q8_0"};

const char *kipp_kv_type_name(int t) { return t >= 0 && t < KIPP_KV_TYPE_COUNT ? names[t] : "?"; }

int kipp_kv_type_parse(const char *s, int *out, char *err, size_t errlen)
{
    for (int t = 0; s && t < KIPP_KV_TYPE_COUNT; t++)
        if (!strcmp(s, names[t])) return *out = t, 0;
    return kipp_err(err, errlen, KIPP_EINVAL, "--kv-type '%s' is not a KV cache type; expected bf16 or q8_0",
                    s ? s : "(null)");
}

uint64_t kipp_kv_type_bytes(uint32_t n_layer, uint32_t n_kv_head, uint32_t head_dim, int t)
{
    uint64_t values = 2ull * n_layer * n_kv_head * head_dim; /* K and V of every layer */
    switch (t) {
    case KIPP_KV_BF16: return values * 2;
    case KIPP_KV_Q8_0: return values / 32 * 34;
    default: return 0;
    }
}

int kipp_kv_type_set(kipp_model *m, int kv_type, char *err, size_t errlen)
{
    if (kv_type < 0 || kv_type >= KIPP_KV_TYPE_COUNT)
        return kipp_err(err, errlen, KIPP_EINVAL, "kv_type %d is not a KV cache type; expected %d (bf16) or %d (q8_0)",
                        kv_type, KIPP_KV_BF16, KIPP_KV_Q8_0);
    m->view.kv_type = kv_type;
    return 0;
}
