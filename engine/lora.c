/*
 * lora.c - LoRA adapter files: open, validate against the model, and merge
 * them into owned copies of their target tensors at model open (seed 002
 * "LoRA adapters (merge at load, ABI 3)"). The arithmetic is in
 * engine/lora_merge.c.
 *
 * The input is the GGUF llama.cpp's convert_lora_to_gguf.py writes (and
 * tools/convert_lora_to_gguf.py from a PEFT directory). It is checked as
 * strictly as the model: a file that would merge into something other than
 * what was trained (wrong architecture or checkpoint, a missing half of a
 * pair, a shape that only happens to fit) is refused, never half-applied.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/lora.h"
#include "kernels/common.h"

#define SHOWN 64 /* bytes of a file string quoted in errors */
#define SHOW(s) (int)((s).len > SHOWN ? SHOWN : (s).len), (s).ptr

/* --------------------------------------------------------------- metadata */

/* A string key that must be present with this value. */
static int want_key_str(const kipp_gguf *g, const char *key, const char *expect, const char *why, char *err,
                        size_t errlen)
{
    const kipp_gguf_kv *kv = kipp_gguf_find(g, key);
    if (!kv) return kipp_err(err, errlen, KIPP_EFORMAT, "missing metadata key '%s': expected '%s' (%s)", key, expect, why);
    if (kv->type != KIPP_GGUF_STRING)
        return kipp_err(err, errlen, KIPP_EFORMAT, "metadata key '%s' has GGUF type %u, expected a string '%s'", key,
                        kv->type, expect);
    if (!kipp_str_eq(kv->v.s, expect))
        return kipp_err(err, errlen, KIPP_EFORMAT, "%s is '%.*s', expected '%s' (%s)", key, SHOW(kv->v.s), expect, why);
    return KIPP_OK;
}

static int has_prefix(kipp_str s, const char *p)
{
    size_t n = strlen(p);
    return s.len >= n && memcmp(s.ptr, p, n) == 0;
}

/* Every key known: general.*, adapter.type, adapter.lora.*, kipp.checkpoint.id. */
static int check_keys(const kipp_gguf *g, const kipp_model *m, float *alpha, char *err, size_t errlen)
{
    int rc;
    if ((rc = want_key_str(g, "general.type", "adapter", "a LoRA adapter file, not a model", err, errlen)) ||
        (rc = want_key_str(g, "adapter.type", "lora", "the only adapter kind Kipp merges", err, errlen)) ||
        (rc = want_key_str(g, "general.architecture", "qwen3", "the model's architecture", err, errlen)))
        return rc;
    *alpha = 0.0f; /* llama.cpp's default when the key is absent: the factor is then the scale */
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const kipp_gguf_kv *kv = &g->kv[i];
        if (kipp_str_eq(kv->key, "adapter.lora.alpha")) {
            if (kv->type != KIPP_GGUF_F32)
                return kipp_err(err, errlen, KIPP_EFORMAT, "adapter.lora.alpha has GGUF type %u, expected f32 (6)",
                                kv->type);
            if (!isfinite(kv->v.f))
                return kipp_err(err, errlen, KIPP_ENUMERIC, "adapter.lora.alpha is %g, expected a finite number", kv->v.f);
            *alpha = (float)kv->v.f;
        } else if (kipp_str_eq(kv->key, "kipp.checkpoint.id")) {
            if (kv->type != KIPP_GGUF_STRING)
                return kipp_err(err, errlen, KIPP_EFORMAT, "kipp.checkpoint.id has GGUF type %u, expected a string",
                                kv->type);
            if (!kipp_str_eq(kv->v.s, m->ckpt->id))
                return kipp_err(err, errlen, KIPP_EFORMAT,
                                "kipp.checkpoint.id is '%.*s': the adapter was converted for that checkpoint, "
                                "expected '%s' (the model's)", SHOW(kv->v.s), m->ckpt->id);
        } else if (has_prefix(kv->key, "adapter.alora.")) {
            return kipp_err(err, errlen, KIPP_ENOTSUP,
                            "metadata key '%.*s': an activated LoRA applies only after its invocation tokens, "
                            "which a merge at load cannot express; expected a plain LoRA", SHOW(kv->key));
        } else if (!has_prefix(kv->key, "general.") && !kipp_str_eq(kv->key, "adapter.type") &&
                   !has_prefix(kv->key, "adapter.lora.")) {
            return kipp_err(err, errlen, KIPP_EFORMAT,
                            "unknown metadata key '%.*s': expected only general.*, adapter.type, adapter.lora.* "
                            "and kipp.checkpoint.id", SHOW(kv->key));
        }
    }
    return KIPP_OK;
}

/* ---------------------------------------------------------------- tensors */

static const char *factor_type_name(uint32_t t) { return kipp_gguf_type_name(t); }

static int factor_type_ok(uint32_t t)
{
    return t == KIPP_TTYPE_F32 || t == KIPP_TTYPE_F16 || t == KIPP_TTYPE_BF16;
}

float kipp_lora_factor_at(const void *p, uint32_t type, size_t i)
{
    if (type == KIPP_TTYPE_F32) {
        float f;
        memcpy(&f, (const char *)p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, (const char *)p + 2 * i, 2);
    return type == KIPP_TTYPE_F16 ? kipp_f16_to_f32(h) : kipp_bf16_to_f32(h);
}

/* Index of the model tensor named base[0, len); n_tensors when none. */
static uint64_t find_target(const kipp_model *m, const char *base, size_t len)
{
    for (uint64_t i = 0; i < m->gguf.n_tensors; i++) {
        kipp_str s = m->gguf.tensors[i].name;
        if (s.len == len && memcmp(s.ptr, base, len) == 0) return i;
    }
    return m->gguf.n_tensors;
}

static void dims_str(const kipp_gguf_tensor *t, char *buf, size_t cap)
{
    if (t->n_dims == 1) snprintf(buf, cap, "[%llu]", (unsigned long long)t->dims[0]);
    else snprintf(buf, cap, "[%llu, %llu]", (unsigned long long)t->dims[0], (unsigned long long)t->dims[1]);
}

/* The shapes llama.cpp checks (GGUF dims, fastest first): a [n_in, r], b [r, n_out];
 * token_embd: a [r, vocab], b [r, d]. */
static int check_pair_shape(const kipp_gguf_tensor *base, const kipp_gguf_tensor *a, const kipp_gguf_tensor *b,
                            int embed, char *err, size_t errlen)
{
    char got[64], gb[64];
    for (int h = 0; h < 2; h++) {
        const kipp_gguf_tensor *t = h ? b : a;
        if (t->n_dims != 2) {
            dims_str(t, got, sizeof got);
            return kipp_err(err, errlen, KIPP_EFORMAT, "tensor '%.*s' is %s, expected 2-D", SHOW(t->name), got);
        }
        if (!factor_type_ok(t->type))
            return kipp_err(err, errlen, KIPP_EFORMAT, "tensor '%.*s' has type %s (%u), expected F32, F16 or BF16",
                            SHOW(t->name), factor_type_name(t->type), t->type);
    }
    uint64_t r = b->dims[0], n_in = base->dims[0], n_out = base->dims[1];
    if (r == 0)
        return kipp_err(err, errlen, KIPP_EFORMAT, "tensor '%.*s' has rank 0, expected r >= 1", SHOW(b->name));
    uint64_t wa0 = embed ? r : n_in, wa1 = embed ? n_out : r, wb1 = embed ? n_in : n_out;
    dims_str(base, gb, sizeof gb);
    if (a->dims[0] != wa0 || a->dims[1] != wa1) {
        dims_str(a, got, sizeof got);
        return kipp_err(err, errlen, KIPP_EFORMAT,
                        "wrong shape: tensor '%.*s' is %s, expected [%llu, %llu] (rank %llu, model tensor %s)",
                        SHOW(a->name), got, (unsigned long long)wa0, (unsigned long long)wa1, (unsigned long long)r, gb);
    }
    if (b->dims[1] != wb1) {
        dims_str(b, got, sizeof got);
        return kipp_err(err, errlen, KIPP_EFORMAT,
                        "wrong shape: tensor '%.*s' is %s, expected [%llu, %llu] (rank %llu, model tensor %s)",
                        SHOW(b->name), got, (unsigned long long)r, (unsigned long long)wb1, (unsigned long long)r, gb);
    }
    return KIPP_OK;
}

/* Every value of a factor finite (a NaN would spread through its whole target). */
static int check_finite(const kipp_gguf_tensor *t, char *err, size_t errlen)
{
    size_t n = (size_t)(t->dims[0] * t->dims[1]);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(kipp_lora_factor_at(t->data, t->type, i)))
            return kipp_err(err, errlen, KIPP_ENUMERIC, "tensor '%.*s' holds %g at element %zu, expected finite values",
                            SHOW(t->name), (double)kipp_lora_factor_at(t->data, t->type, i), i);
    return KIPP_OK;
}

/* Pair every .lora_a with its .lora_b on a 2-D model tensor; no other tensor allowed. */
static int bind_pairs(kipp_lora *ad, const kipp_model *m, char *err, size_t errlen)
{
    const kipp_gguf *g = &ad->gguf;
    if (g->n_tensors == 0) return kipp_err(err, errlen, KIPP_EFORMAT, "the adapter holds no tensors, expected .lora_a/.lora_b pairs");
    const kipp_gguf_tensor **half = calloc(2 * g->n_tensors, sizeof *half); /* [pair][a, b] */
    uint64_t *tgt = calloc(g->n_tensors, sizeof *tgt);
    ad->pairs = calloc(g->n_tensors, sizeof *ad->pairs);
    if (!half || !tgt || !ad->pairs) {
        free(half), free(tgt);
        return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for %llu adapter tensors", (unsigned long long)g->n_tensors);
    }
    int rc = KIPP_OK;
    uint32_t np = 0;
    for (uint64_t i = 0; i < g->n_tensors && !rc; i++) {
        const kipp_gguf_tensor *t = &g->tensors[i];
        size_t n = t->name.len;
        int is_b = n > 7 && !memcmp(t->name.ptr + n - 7, ".lora_b", 7);
        if (!is_b && !(n > 7 && !memcmp(t->name.ptr + n - 7, ".lora_a", 7))) {
            rc = kipp_err(err, errlen, KIPP_EFORMAT, "unknown tensor '%.*s': expected only <model tensor>.lora_a and "
                          ".lora_b pairs", SHOW(t->name));
            break;
        }
        uint64_t ti = find_target(m, t->name.ptr, n - 7);
        if (ti == m->gguf.n_tensors) {
            rc = kipp_err(err, errlen, KIPP_EFORMAT, "unknown tensor '%.*s': the model (%s) has no tensor '%.*s'",
                          SHOW(t->name), m->ckpt->id, (int)(n - 7 > SHOWN ? SHOWN : n - 7), t->name.ptr);
            break;
        }
        if (m->gguf.tensors[ti].n_dims != 2) {
            char d[64];
            dims_str(&m->gguf.tensors[ti], d, sizeof d);
            rc = kipp_err(err, errlen, KIPP_EFORMAT, "tensor '%.*s' targets '%.*s', which is %s: LoRA targets must be 2-D",
                          SHOW(t->name), SHOW(m->gguf.tensors[ti].name), d);
            break;
        }
        uint32_t p = 0;
        while (p < np && tgt[p] != ti) p++;
        if (p == np) tgt[np++] = ti;
        if (half[2 * p + is_b]) {
            rc = kipp_err(err, errlen, KIPP_EFORMAT, "duplicate tensor '%.*s': each half of a pair must appear once", SHOW(t->name));
            break;
        }
        half[2 * p + is_b] = t;
    }
    for (uint32_t p = 0; p < np && !rc; p++) {
        const kipp_gguf_tensor *a = half[2 * p], *b = half[2 * p + 1], *base = &m->gguf.tensors[tgt[p]];
        if (!a || !b) {
            const kipp_gguf_tensor *have = a ? a : b;
            rc = kipp_err(err, errlen, KIPP_EFORMAT, "missing tensor '%.*s.%s': '%.*s' has no other half",
                          SHOW(base->name), a ? "lora_b" : "lora_a", SHOW(have->name));
            break;
        }
        int embed = kipp_str_eq(base->name, "token_embd.weight");
        if ((rc = check_pair_shape(base, a, b, embed, err, errlen)) || (rc = check_finite(a, err, errlen)) ||
            (rc = check_finite(b, err, errlen)))
            break;
        uint32_t r = (uint32_t)b->dims[0];
        ad->pairs[p] = (kipp_lora_pair){
            .target = tgt[p], .embed = embed, .rank = r, .a = a->data, .b = b->data,
            .a_type = a->type, .b_type = b->type,
            .factor = ad->alpha != 0.0f ? ad->scale * ad->alpha / (float)r : ad->scale};
    }
    ad->n_pairs = rc ? 0 : np;
    free(half);
    free(tgt);
    return rc;
}

int kipp_lora_open_image(const void *buf, size_t size, float scale, const kipp_model *m, kipp_lora **out,
                         char *err, size_t errlen)
{
    if (!buf || !m || !out) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_lora_open_image: NULL argument");
    *out = NULL;
    if (!isfinite(scale))
        return kipp_err(err, errlen, KIPP_EINVAL, "LoRA scale is %g, expected a finite number", (double)scale);
    kipp_lora *ad = calloc(1, sizeof *ad);
    if (!ad) return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for an adapter");
    ad->scale = scale;
    int rc = kipp_gguf_parse(buf, size, &ad->gguf, err, errlen);
    if (!rc) rc = check_keys(&ad->gguf, m, &ad->alpha, err, errlen);
    if (!rc) rc = bind_pairs(ad, m, err, errlen);
    if (rc) {
        kipp_lora_close(ad);
        return rc;
    }
    *out = ad;
    return KIPP_OK;
}

int kipp_lora_open(const char *path, float scale, const kipp_model *m, kipp_lora **out, char *err, size_t errlen)
{
    if (!path || !m || !out) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_lora_open: NULL argument");
    *out = NULL;
    struct stat st;
    if (stat(path, &st)) return kipp_err(err, errlen, KIPP_EIO, "cannot open LoRA adapter '%s': %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return kipp_err(err, errlen, KIPP_EIO, "LoRA adapter '%s' is not a regular file; expected a GGUF adapter", path);
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return kipp_err(err, errlen, KIPP_EIO, "cannot open LoRA adapter '%s': %s", path, strerror(errno));
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size < 24) {
        close(fd);
        return kipp_err(err, errlen, KIPP_EFORMAT, "LoRA adapter '%s' is %lld bytes or not a regular file; expected a GGUF "
                        "file of at least 24 bytes", path, (long long)st.st_size);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return kipp_err(err, errlen, KIPP_EIO, "cannot mmap LoRA adapter '%s': %s", path, strerror(errno));
    char why[400];
    int rc = kipp_lora_open_image(map, (size_t)st.st_size, scale, m, out, why, sizeof why);
    if (rc) {
        munmap(map, (size_t)st.st_size);
        return kipp_err(err, errlen, rc, "LoRA adapter '%s': %s", path, why);
    }
    (*out)->map = map;
    (*out)->map_size = (size_t)st.st_size;
    return KIPP_OK;
}

void kipp_lora_close(kipp_lora *a)
{
    if (!a) return;
    free(a->pairs);
    kipp_gguf_free(&a->gguf);
    if (a->map) munmap(a->map, a->map_size);
    free(a);
}

int kipp_lora_parse_arg(const char *arg, kipp_lora_spec *out, char *path_buf, size_t path_cap, char *err,
                        size_t errlen)
{
    if (!arg || !out || !path_buf || !path_cap) return kipp_err(err, errlen, KIPP_EINVAL, "kipp_lora_parse_arg: NULL argument");
    const char *colon = strrchr(arg, ':');
    size_t plen = strlen(arg);
    float scale = 1.0f;
    if (colon) {
        char *end;
        errno = 0;
        double v = strtod(colon + 1, &end);
        if (end != colon + 1 && *end == 0) { /* a number after the last ':' is the scale */
            if (!isfinite(v) || errno == ERANGE)
                return kipp_err(err, errlen, KIPP_EINVAL, "--lora '%s': scale '%s' is not finite, expected a number such as 0.5",
                                arg, colon + 1);
            scale = (float)v;
            plen = (size_t)(colon - arg);
        } else if (colon[1] == 0) {
            return kipp_err(err, errlen, KIPP_EINVAL, "--lora '%s': empty scale after ':', expected PATH[:SCALE]", arg);
        }
    }
    if (plen == 0) return kipp_err(err, errlen, KIPP_EINVAL, "--lora '%s': empty path, expected PATH[:SCALE]", arg);
    if (plen >= path_cap) return kipp_err(err, errlen, KIPP_EINVAL, "--lora '%s': path longer than %zu bytes", arg, path_cap - 1);
    memcpy(path_buf, arg, plen);
    path_buf[plen] = 0;
    *out = (kipp_lora_spec){.path = path_buf, .scale = scale};
    return KIPP_OK;
}
