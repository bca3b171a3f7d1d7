/*
 * gguf.c - bounds-checked GGUF v3 container parser (engine/gguf.h, docs/FORMAT.md).
 *
 * Written from the published GGUF layout (header, key/value metadata, tensor
 * directory, aligned data section); no ggml code. All reads go through a
 * cursor that checks the remaining length first and copies with memcpy, so an
 * unaligned or truncated buffer can never cause an out-of-bounds or misaligned
 * load. Numeric arrays are left in the buffer as raw little-endian bytes;
 * string arrays get a malloc'd kipp_str index. The Kipp subset rules live in
 * engine/model.c.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/internal.h"
#include "kernels/formats.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF parser reads little-endian values with memcpy; big-endian hosts are unsupported"
#endif

#define GGUF_HEADER_BYTES 24u   /* magic, version, tensor_count, kv_count */
#define GGUF_MIN_KV_BYTES 13u   /* key length (8) + type (4) + smallest value (1) */
#define GGUF_MIN_TENSOR_BYTES 32u /* name length, n_dims, one dim, type, offset */

/** Read cursor over buf[size]; every read checks bounds first. */
typedef struct {
    const uint8_t *buf;
    size_t size;
    size_t pos;
    char *err;
    size_t errlen;
} cursor;

static int need(cursor *c, uint64_t n, const char *what)
{
    if (n > c->size - c->pos)
        return kipp_err(c->err, c->errlen, KIPP_EFORMAT,
                        "truncated file: %s at byte %zu needs %llu bytes but only %zu remain",
                        what, c->pos, (unsigned long long)n, c->size - c->pos);
    return KIPP_OK;
}

static int rd(cursor *c, void *dst, size_t n, const char *what)
{
    int rc = need(c, n, what);
    if (rc) return rc;
    memcpy(dst, c->buf + c->pos, n);
    c->pos += n;
    return KIPP_OK;
}

static int rd_u32(cursor *c, uint32_t *v, const char *what) { return rd(c, v, 4, what); }
static int rd_u64(cursor *c, uint64_t *v, const char *what) { return rd(c, v, 8, what); }

/* A GGUF string: u64 length, then bytes (no NUL). The view points into buf. */
static int rd_str(cursor *c, kipp_str *s, const char *what)
{
    uint64_t len;
    int rc = rd_u64(c, &len, what);
    if (rc) return rc;
    if (len > KIPP_GGUF_MAX_STRING)
        return kipp_err(c->err, c->errlen, KIPP_EFORMAT,
                        "%s at byte %zu has string length %llu, above the %u-byte limit",
                        what, c->pos - 8, (unsigned long long)len, KIPP_GGUF_MAX_STRING);
    if ((rc = need(c, len, what))) return rc;
    s->ptr = (const char *)c->buf + c->pos;
    s->len = len;
    c->pos += len;
    return KIPP_OK;
}

/** Size in bytes of one scalar of GGUF value type t; 0 for string/array/unknown. */
static size_t scalar_size(uint32_t t)
{
    switch (t) {
    case KIPP_GGUF_U8: case KIPP_GGUF_I8: case KIPP_GGUF_BOOL: return 1;
    case KIPP_GGUF_U16: case KIPP_GGUF_I16: return 2;
    case KIPP_GGUF_U32: case KIPP_GGUF_I32: case KIPP_GGUF_F32: return 4;
    case KIPP_GGUF_U64: case KIPP_GGUF_I64: case KIPP_GGUF_F64: return 8;
    default: return 0;
    }
}

/* Widen one scalar (already bounds-checked raw bytes) into the kv union. */
static int widen_scalar(cursor *c, kipp_gguf_kv *kv, const uint8_t *p)
{
    uint8_t u8; uint16_t u16; uint32_t u32; uint64_t u64; float f32; double f64;
    switch (kv->type) {
    case KIPP_GGUF_U8: memcpy(&u8, p, 1); kv->v.u = u8; break;
    case KIPP_GGUF_I8: memcpy(&u8, p, 1); kv->v.i = (int8_t)u8; break;
    case KIPP_GGUF_U16: memcpy(&u16, p, 2); kv->v.u = u16; break;
    case KIPP_GGUF_I16: memcpy(&u16, p, 2); kv->v.i = (int16_t)u16; break;
    case KIPP_GGUF_U32: memcpy(&u32, p, 4); kv->v.u = u32; break;
    case KIPP_GGUF_I32: memcpy(&u32, p, 4); kv->v.i = (int32_t)u32; break;
    case KIPP_GGUF_F32: memcpy(&f32, p, 4); kv->v.f = f32; break;
    case KIPP_GGUF_U64: memcpy(&u64, p, 8); kv->v.u = u64; break;
    case KIPP_GGUF_I64: memcpy(&u64, p, 8); kv->v.i = (int64_t)u64; break;
    case KIPP_GGUF_F64: memcpy(&f64, p, 8); kv->v.f = f64; break;
    case KIPP_GGUF_BOOL:
        /* Only 0 and 1 are booleans; anything else is a corrupt byte, not "true". */
        if (p[0] > 1)
            return kipp_err(c->err, c->errlen, KIPP_EFORMAT,
                            "metadata key '%.*s' holds bool byte %u, expected 0 or 1",
                            (int)kv->key.len, kv->key.ptr, p[0]);
        kv->v.b = p[0];
        break;
    default: KIPP_ASSERT(0);
    }
    return KIPP_OK;
}

/* Array value: element type, count, then elements (strings or raw scalars). */
static int parse_array(cursor *c, kipp_gguf_kv *kv)
{
    int rc;
    if ((rc = rd_u32(c, &kv->arr_type, "array element type"))) return rc;
    if ((rc = rd_u64(c, &kv->arr_n, "array length"))) return rc;
    const int ky = (int)(kv->key.len > 64 ? 64 : kv->key.len);
    if (kv->arr_n > KIPP_GGUF_MAX_ARRAY)
        return kipp_err(c->err, c->errlen, KIPP_EFORMAT,
                        "metadata key '%.*s' has array count %llu, above the limit %u", ky,
                        kv->key.ptr, (unsigned long long)kv->arr_n, KIPP_GGUF_MAX_ARRAY);
    if (kv->arr_type == KIPP_GGUF_STRING) {
        /* Every string needs at least its 8-byte length: reject absurd counts before malloc. */
        if ((rc = need(c, kv->arr_n * 8u, "string array"))) return rc;
        kv->arr_str = calloc(kv->arr_n ? kv->arr_n : 1, sizeof *kv->arr_str);
        if (!kv->arr_str) return kipp_err(c->err, c->errlen, KIPP_ENOMEM, "out of memory for a string array");
        for (uint64_t i = 0; i < kv->arr_n; i++)
            if ((rc = rd_str(c, &kv->arr_str[i], "string array element"))) return rc;
        return KIPP_OK;
    }
    size_t es = scalar_size(kv->arr_type);
    if (!es)
        return kipp_err(c->err, c->errlen, KIPP_EFORMAT,
                        "metadata key '%.*s' has array element type %u, expected a scalar or string type",
                        ky, kv->key.ptr, kv->arr_type);
    if ((rc = need(c, kv->arr_n * es, "array data"))) return rc;
    if (kv->arr_type == KIPP_GGUF_BOOL)
        for (uint64_t i = 0; i < kv->arr_n; i++)
            if (c->buf[c->pos + i] > 1)
                return kipp_err(c->err, c->errlen, KIPP_EFORMAT,
                                "metadata key '%.*s' element %llu is bool byte %u, expected 0 or 1",
                                ky, kv->key.ptr, (unsigned long long)i, c->buf[c->pos + i]);
    kv->arr_data = c->buf + c->pos;
    c->pos += kv->arr_n * es;
    return KIPP_OK;
}

static int parse_kv(cursor *c, kipp_gguf_kv *kv)
{
    int rc;
    if ((rc = rd_str(c, &kv->key, "metadata key"))) return rc;
    if ((rc = rd_u32(c, &kv->type, "metadata value type"))) return rc;
    if (kv->type == KIPP_GGUF_STRING) return rd_str(c, &kv->v.s, "metadata string value");
    if (kv->type == KIPP_GGUF_ARRAY) return parse_array(c, kv);
    size_t es = scalar_size(kv->type);
    if (!es)
        return kipp_err(c->err, c->errlen, KIPP_EFORMAT,
                        "metadata key '%.*s' has value type %u, expected a GGUF type 0..12",
                        (int)(kv->key.len > 64 ? 64 : kv->key.len), kv->key.ptr, kv->type);
    if ((rc = need(c, es, "metadata value"))) return rc;
    if ((rc = widen_scalar(c, kv, c->buf + c->pos))) return rc;
    c->pos += es;
    return KIPP_OK;
}

/* n_dims, dims, type; computes nbytes with overflow checks. */
static int parse_tensor_shape(cursor *c, kipp_gguf_tensor *t)
{
    int rc;
    const int nl = (int)(t->name.len > 64 ? 64 : t->name.len);
    if ((rc = rd_u32(c, &t->n_dims, "tensor n_dims"))) return rc;
    if (t->n_dims < 1 || t->n_dims > KIPP_GGUF_MAX_DIMS)
        return kipp_err(c->err, c->errlen, KIPP_EFORMAT, "tensor '%.*s' has n_dims %u, expected 1..%u",
                        nl, t->name.ptr, t->n_dims, KIPP_GGUF_MAX_DIMS);
    uint64_t elems = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if ((rc = rd_u64(c, &t->dims[d], "tensor dimension"))) return rc;
        /* Each dim is capped at 2^32 so a product of four cannot hide an overflow past the check. */
        if (t->dims[d] == 0 || t->dims[d] > UINT32_MAX || elems > UINT64_MAX / t->dims[d])
            return kipp_err(c->err, c->errlen, KIPP_EFORMAT,
                            "tensor '%.*s' dimension %u is %llu, expected 1..2^32-1", nl, t->name.ptr,
                            d, (unsigned long long)t->dims[d]);
        elems *= t->dims[d];
    }
    if ((rc = rd_u32(c, &t->type, "tensor type"))) return rc;
    uint32_t be, bb = kipp_gguf_type_block(t->type, &be);
    if (!bb) {
        char types[128];
        return kipp_err(c->err, c->errlen, KIPP_EFORMAT, "tensor '%.*s' has type %u, expected %s", nl,
                        t->name.ptr, t->type, kipp_gguf_type_list(types, sizeof types));
    }
    if (t->dims[0] % be)
        return kipp_err(c->err, c->errlen, KIPP_EFORMAT,
                        "tensor '%.*s' row length %llu is not a multiple of the %u-element block",
                        nl, t->name.ptr, (unsigned long long)t->dims[0], be);
    if (elems / be > UINT64_MAX / bb)
        return kipp_err(c->err, c->errlen, KIPP_EFORMAT, "tensor '%.*s' byte size overflows",
                        nl, t->name.ptr);
    t->nbytes = elems / be * bb;
    return KIPP_OK;
}

static int parse_tensor(cursor *c, kipp_gguf_tensor *t)
{
    int rc;
    if ((rc = rd_str(c, &t->name, "tensor name"))) return rc;
    if ((rc = parse_tensor_shape(c, t))) return rc;
    return rd_u64(c, &t->offset, "tensor offset");
}

/* general.alignment decides where the data section starts; default 32 per the GGUF spec. */
static int find_alignment(cursor *c, kipp_gguf *g)
{
    g->alignment = 32;
    const kipp_gguf_kv *a = kipp_gguf_find(g, "general.alignment");
    if (!a) return KIPP_OK;
    if (a->type != KIPP_GGUF_U32)
        return kipp_err(c->err, c->errlen, KIPP_EFORMAT,
                        "general.alignment has GGUF type %u, expected u32 (%d)", a->type,
                        KIPP_GGUF_U32);
    if (a->v.u == 0 || (a->v.u & (a->v.u - 1)) || a->v.u > 65536)
        return kipp_err(c->err, c->errlen, KIPP_EFORMAT,
                        "general.alignment is %llu, expected a power of two up to 65536",
                        (unsigned long long)a->v.u);
    g->alignment = (uint32_t)a->v.u;
    return KIPP_OK;
}

/* Place every tensor: offsets aligned, [offset, offset+nbytes) inside the data section. */
static int place_tensors(cursor *c, kipp_gguf *g)
{
    uint64_t pad = (g->alignment - c->pos % g->alignment) % g->alignment;
    g->data_offset = c->pos + pad;
    if (g->data_offset > c->size)
        return kipp_err(c->err, c->errlen, KIPP_EFORMAT,
                        "truncated file: tensor data should start at byte %llu but the file is %zu bytes",
                        (unsigned long long)g->data_offset, c->size);
    uint64_t avail = c->size - g->data_offset;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        kipp_gguf_tensor *t = &g->tensors[i];
        const int nl = (int)(t->name.len > 64 ? 64 : t->name.len);
        if (t->offset % g->alignment)
            return kipp_err(c->err, c->errlen, KIPP_EFORMAT,
                            "tensor '%.*s' offset %llu is not a multiple of the alignment %u", nl,
                            t->name.ptr, (unsigned long long)t->offset, g->alignment);
        if (t->offset > avail || t->nbytes > avail - t->offset)
            return kipp_err(c->err, c->errlen, KIPP_EFORMAT,
                            "tensor '%.*s' (offset %llu, %llu bytes) lies beyond the end of the file: "
                            "the data section holds %llu bytes (truncated file or bad offset)",
                            nl, t->name.ptr, (unsigned long long)t->offset,
                            (unsigned long long)t->nbytes, (unsigned long long)avail);
        t->data = c->buf + g->data_offset + t->offset;
    }
    return KIPP_OK;
}

static int parse_header(cursor *c, kipp_gguf *g)
{
    if (c->size < GGUF_HEADER_BYTES)
        return kipp_err(c->err, c->errlen, KIPP_EFORMAT,
                        "truncated file: %zu bytes is shorter than the %u-byte GGUF header",
                        c->size, GGUF_HEADER_BYTES);
    if (memcmp(c->buf, "GGUF", 4)) {
        const uint8_t *m = c->buf;
        return kipp_err(c->err, c->errlen, KIPP_EFORMAT,
                        "bad magic %02x %02x %02x %02x, expected 'GGUF' (47 47 55 46)", m[0], m[1],
                        m[2], m[3]);
    }
    c->pos = 4;
    rd_u32(c, &g->version, "version");
    rd_u64(c, &g->n_tensors, "tensor count");
    rd_u64(c, &g->n_kv, "metadata count");
    if (g->version != 3)
        return kipp_err(c->err, c->errlen, KIPP_EFORMAT, "GGUF version %u, expected 3", g->version);
    /* Counts are bounded by the caps and by the bytes left, before anything is allocated. */
    if (g->n_kv > KIPP_GGUF_MAX_KV || g->n_kv * GGUF_MIN_KV_BYTES > c->size - c->pos)
        return kipp_err(c->err, c->errlen, KIPP_EFORMAT,
                        "metadata count %llu is absurd: the limit is %u and %zu bytes remain",
                        (unsigned long long)g->n_kv, KIPP_GGUF_MAX_KV, c->size - c->pos);
    if (g->n_tensors > KIPP_GGUF_MAX_TENSORS ||
        g->n_tensors * GGUF_MIN_TENSOR_BYTES > c->size - c->pos)
        return kipp_err(c->err, c->errlen, KIPP_EFORMAT,
                        "tensor count %llu is absurd: the limit is %u and %zu bytes remain",
                        (unsigned long long)g->n_tensors, KIPP_GGUF_MAX_TENSORS, c->size - c->pos);
    return KIPP_OK;
}

static int parse_all(cursor *c, kipp_gguf *g)
{
    int rc = parse_header(c, g);
    if (rc) return rc;
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors)
        return kipp_err(c->err, c->errlen, KIPP_ENOMEM, "out of memory for the GGUF directory");
    for (uint64_t i = 0; i < g->n_kv; i++)
        if ((rc = parse_kv(c, &g->kv[i]))) return rc;
    if ((rc = find_alignment(c, g))) return rc;
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if ((rc = parse_tensor(c, &g->tensors[i]))) return rc;
    return place_tensors(c, g);
}

int kipp_gguf_parse(const void *buf, size_t size, kipp_gguf *out, char *err, size_t errlen)
{
    KIPP_ASSERT(out != NULL);
    memset(out, 0, sizeof *out);
    if (!buf && size)
        return kipp_err(err, errlen, KIPP_EINVAL, "GGUF buffer is NULL but size is %zu", size);
    cursor c = {buf, size, 0, err, errlen};
    int rc = parse_all(&c, out);
    if (rc) kipp_gguf_free(out);
    return rc;
}

void kipp_gguf_free(kipp_gguf *g)
{
    if (!g) return;
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++) free(g->kv[i].arr_str);
    free(g->kv);
    free(g->tensors);
    memset(g, 0, sizeof *g);
}

const kipp_gguf_kv *kipp_gguf_find(const kipp_gguf *g, const char *key)
{
    for (uint64_t i = 0; g && key && i < g->n_kv; i++)
        if (kipp_str_eq(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

int kipp_str_eq(kipp_str a, const char *b)
{
    size_t n = strlen(b);
    return a.len == n && (n == 0 || !memcmp(a.ptr, b, n));
}
