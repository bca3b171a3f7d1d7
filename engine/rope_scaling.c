/*
 * rope_scaling.c - YaRN RoPE scaling of a model (docs/FORMAT.md "RoPE
 * scaling"): the --rope-scaling parser, the file's qwen3.rope.scaling.* keys
 * (llama.cpp's names) and the resolution into the backend's dims, whose
 * context_length becomes the scaled limit original_context x factor.
 *
 * The formula itself (inv_freq blend and the cos/sin factor) is
 * k_rope_table_yarn (kernels/cpu/ref.c), after Hugging Face transformers'
 * modeling_rope_utils._compute_yarn_parameters.
 */
#include <errno.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/internal.h"
#include "engine/rope_scaling.h"

#define YARN_BETA_FAST 32.0 /* transformers: rope_scaling.get("beta_fast") or 32 */
#define YARN_BETA_SLOW 1.0  /* transformers: rope_scaling.get("beta_slow") or 1 */
#define YARN_MIN_ORIGINAL 32u

/* A whole-string finite double; 0 when s is not one. */
static int parse_double(const char *s, double *out)
{
    if (!*s) return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || errno || !isfinite(v)) return 0;
    *out = v;
    return 1;
}

/* A whole-string decimal count of tokens in 1..UINT32_MAX; 0 when s is not one. */
static int parse_tokens(const char *s, uint32_t *out)
{
    if (*s < '0' || *s > '9') return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end || errno || v == 0 || v > UINT32_MAX) return 0;
    *out = (uint32_t)v;
    return 1;
}

int kipp_rope_scaling_parse(const char *s, kipp_rope_scaling *out, char *err, size_t errlen)
{
    static const char form[] = "expected 'none', 'yarn:F' or 'yarn:F:ORIG' (F the factor, above 1 and at most 64; "
                               "ORIG original_max_position_embeddings in tokens), e.g. 'yarn:4'";
    if (!s || !out) return kipp_err(err, errlen, KIPP_EINVAL, "rope scaling: value and out must be non-NULL");
    memset(out, 0, sizeof *out);
    if (!strcmp(s, "none")) return KIPP_OK;
    if (strncmp(s, "yarn:", 5) != 0)
        return kipp_err(err, errlen, KIPP_EINVAL, "--rope-scaling '%.64s': unknown scaling type, %s", s, form);
    char buf[64];
    if (strlen(s + 5) >= sizeof buf)
        return kipp_err(err, errlen, KIPP_EINVAL, "--rope-scaling '%.64s...': too long, %s", s, form);
    strcpy(buf, s + 5);
    char *orig = strchr(buf, ':');
    if (orig) *orig++ = '\0';
    double f;
    if (!parse_double(buf, &f) || !(f > 1.0) || f > KIPP_ROPE_MAX_FACTOR)
        return kipp_err(err, errlen, KIPP_EINVAL, "--rope-scaling '%s': factor '%s' is not a number above 1 and at "
                        "most %g; %s", s, buf, KIPP_ROPE_MAX_FACTOR, form);
    if (orig && !parse_tokens(orig, &out->original_context))
        return kipp_err(err, errlen, KIPP_EINVAL, "--rope-scaling '%s': original context '%s' is not a count of "
                        "tokens; %s", s, orig, form);
    out->yarn = 1;
    out->factor = f;
    return KIPP_OK;
}

/* One rope-scaling key's value as a double (f32 or u32 keys); NULL kv = absent. */
static const kipp_gguf_kv *find_typed(const kipp_gguf *g, const char *key, uint32_t type, int *n_present,
                                      char *err, size_t errlen, int *rc)
{
    const kipp_gguf_kv *kv = kipp_gguf_find(g, key);
    if (!kv) return NULL;
    (*n_present)++;
    if (kv->type != type)
        *rc = kipp_err(err, errlen, KIPP_EFORMAT, "metadata key '%s' has GGUF type %u, expected %s", key, kv->type,
                       type == KIPP_GGUF_F32 ? "f32 (6)" : type == KIPP_GGUF_U32 ? "u32 (4)" : "string (8)");
    return kv;
}

int kipp_rope_from_file(const kipp_gguf *g, kipp_rope_scaling *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    int n = 0, rc = KIPP_OK;
    const kipp_gguf_kv *type = find_typed(g, KIPP_KEY_ROPE_TYPE, KIPP_GGUF_STRING, &n, err, errlen, &rc);
    const kipp_gguf_kv *fac = find_typed(g, KIPP_KEY_ROPE_FACTOR, KIPP_GGUF_F32, &n, err, errlen, &rc);
    const kipp_gguf_kv *orig = find_typed(g, KIPP_KEY_ROPE_ORIG, KIPP_GGUF_U32, &n, err, errlen, &rc);
    const kipp_gguf_kv *bf = find_typed(g, KIPP_KEY_ROPE_BETA_FAST, KIPP_GGUF_F32, &n, err, errlen, &rc);
    const kipp_gguf_kv *bs = find_typed(g, KIPP_KEY_ROPE_BETA_SLOW, KIPP_GGUF_F32, &n, err, errlen, &rc);
    if (rc) return rc;
    if (n == 0) return KIPP_OK;
    if (n != 5)
        return kipp_err(err, errlen, KIPP_EFORMAT, "RoPE scaling keys: %d of the 5 qwen3.rope.scaling.* keys are "
                        "present (type %s, factor %s, original_context_length %s, yarn_beta_fast %s, yarn_beta_slow "
                        "%s); docs/FORMAT.md expects all five or none", n, type ? "yes" : "no", fac ? "yes" : "no",
                        orig ? "yes" : "no", bf ? "yes" : "no", bs ? "yes" : "no");
    if (!kipp_str_eq(type->v.s, "yarn"))
        return kipp_err(err, errlen, KIPP_EFORMAT, "%s is '%.*s', expected 'yarn' (the only scaling Kipp runs)",
                        KIPP_KEY_ROPE_TYPE, (int)(type->v.s.len > 32 ? 32 : type->v.s.len), type->v.s.ptr);
    *out = (kipp_rope_scaling){.yarn = 1, .factor = fac->v.f, .original_context = (uint32_t)orig->v.u,
                               .beta_fast = bf->v.f, .beta_slow = bs->v.f};
    return KIPP_OK;
}

/* Range checks of a resolved YaRN scaling; origin names where it came from in messages. */
static int check_yarn(const kipp_rope_scaling *r, const char *origin, char *err, size_t errlen)
{
    if (!isfinite(r->factor) || !(r->factor > 1.0) || r->factor > KIPP_ROPE_MAX_FACTOR)
        return kipp_err(err, errlen, KIPP_EINVAL, "%s: YaRN factor %g, expected above 1 and at most %g", origin,
                        r->factor, KIPP_ROPE_MAX_FACTOR);
    if (r->original_context < YARN_MIN_ORIGINAL)
        return kipp_err(err, errlen, KIPP_EINVAL, "%s: original context %u tokens, expected at least %u", origin,
                        r->original_context, YARN_MIN_ORIGINAL);
    double lim = floor((double)r->original_context * r->factor);
    if (lim > (double)KIPP_ROPE_MAX_CONTEXT)
        return kipp_err(err, errlen, KIPP_EINVAL, "%s: original context %u x factor %g = %.0f tokens, above Kipp's "
                        "limit of %u tokens", origin, r->original_context, r->factor, lim, KIPP_ROPE_MAX_CONTEXT);
    if (!isfinite(r->beta_fast) || !isfinite(r->beta_slow) || !(r->beta_slow > 0) || !(r->beta_fast > r->beta_slow))
        return kipp_err(err, errlen, KIPP_EINVAL, "%s: YaRN beta_fast %g and beta_slow %g, expected beta_fast > "
                        "beta_slow > 0 (defaults 32 and 1)", origin, r->beta_fast, r->beta_slow);
    return KIPP_OK;
}

int kipp_rope_apply(kipp_model *m, const kipp_rope_scaling *want, const char *origin, char *err, size_t errlen)
{
    const kipp_checkpoint *c = m->ckpt;
    kipp_dims *d = &m->view.dims;
    kipp_rope_scaling r = *want;
    d->context_length = c->context_length;
    d->rope_yarn = (k_rope_yarn){0};
    m->rope = (kipp_rope_scaling){0};
    if (!r.yarn) return KIPP_OK;
    r.factor = (double)(float)r.factor; /* as the file stores it (f32), so an override equals its file */
    if (!r.original_context) r.original_context = c->yarn_original ? c->yarn_original : c->context_length;
    if (r.beta_fast == 0) r.beta_fast = YARN_BETA_FAST;
    if (r.beta_slow == 0) r.beta_slow = YARN_BETA_SLOW;
    int rc = check_yarn(&r, origin, err, errlen);
    if (rc) return rc;
    d->context_length = (uint32_t)floor((double)r.original_context * r.factor);
    d->rope_yarn = (k_rope_yarn){.factor = r.factor, .original_context = r.original_context,
                                 .beta_fast = r.beta_fast, .beta_slow = r.beta_slow};
    m->rope = r;
    return KIPP_OK;
}

const char *kipp_context_limit_note(const kipp_model_info *info, char *buf, size_t len)
{
    if (!buf || !len) return buf;
    if (!info) return snprintf(buf, len, "this model's context length"), buf;
    if (info->rope.yarn) {
        snprintf(buf, len, "the YaRN limit %u x %g of %s", info->rope.original_context, info->rope.factor,
                 info->checkpoint_id);
        return buf;
    }
    const kipp_checkpoint *c = kipp_checkpoint_by_id(info->checkpoint_id);
    if (c && c->yarn_factor > 0)
        snprintf(buf, len, "the context length of %s (no RoPE scaling; --rope-scaling yarn:%g allows %u, its model "
                 "card's YaRN)", info->checkpoint_id, c->yarn_factor, kipp_yarn_context(c));
    else
        snprintf(buf, len, "the context length of %s (no RoPE scaling; --rope-scaling yarn:F:ORIG allows ORIG x F)",
                 info->checkpoint_id);
    return buf;
}
