/*
 * test_gguf.c - unit tests of the GGUF container parser (engine/gguf.c) on
 * small images built here, byte by byte, from the published GGUF v3 layout.
 * The builder below is the oracle: every value read back must equal what it
 * wrote, and every malformed image must be refused with a message naming the
 * bad field. The Kipp-subset checks are in tests/test_loader.c.
 */
#include <stdint.h>
#include <string.h>

#include "tests/test_harness.h"
#include "engine/internal.h"

/* ---- a tiny GGUF image builder ---- */
typedef struct {
    uint8_t b[4096];
    size_t n;
} img;

static void put(img *m, const void *p, size_t n)
{
    if (m->n + n > sizeof m->b) abort(); /* test bug, not a parser result */
    memcpy(m->b + m->n, p, n);
    m->n += n;
}
static void put_u32(img *m, uint32_t v) { put(m, &v, 4); }
static void put_u64(img *m, uint64_t v) { put(m, &v, 8); }
static void put_str(img *m, const char *s) { put_u64(m, strlen(s)); put(m, s, strlen(s)); }
static void header(img *m, uint64_t n_tensors, uint64_t n_kv)
{
    m->n = 0;
    put(m, "GGUF", 4);
    put_u32(m, 3);
    put_u64(m, n_tensors);
    put_u64(m, n_kv);
}
static void pad_to(img *m, size_t align) { while (m->n % align) m->b[m->n++] = 0; }

/* Tensor entry: name, dims (GGUF order), type, offset. */
static void tensor(img *m, const char *name, uint32_t nd, const uint64_t *dims, uint32_t type,
                   uint64_t off)
{
    put_str(m, name);
    put_u32(m, nd);
    for (uint32_t i = 0; i < nd; i++) put_u64(m, dims[i]);
    put_u32(m, type);
    put_u64(m, off);
}

static int parse(const img *m, kipp_gguf *g, char *err, size_t errlen)
{
    return kipp_gguf_parse(m->b, m->n, g, err, errlen);
}

/* Parse must fail with KIPP_EFORMAT and a message containing want. */
static void expect_reject(const img *m, const char *want, const char *what)
{
    kipp_gguf g;
    char err[256] = "";
    int rc = parse(m, &g, err, sizeof err);
    CHECK(rc == KIPP_EFORMAT, "%s: rc %d (%s), expected EFORMAT", what, rc, err);
    CHECK(strstr(err, want) != NULL, "%s: message '%s' lacks '%s'", what, err, want);
    CHECK(g.kv == NULL && g.tensors == NULL, "%s: *out not freed on error", what);
}

/* ---- tests ---- */

static void test_scalars_roundtrip(void)
{
    img m;
    header(&m, 0, 8);
    put_str(&m, "u8"); put_u32(&m, KIPP_GGUF_U8); put(&m, "\xfe", 1);
    put_str(&m, "i16"); put_u32(&m, KIPP_GGUF_I16); put(&m, "\x00\x80", 2);
    put_str(&m, "u32"); put_u32(&m, KIPP_GGUF_U32); put_u32(&m, 4000000000u);
    put_str(&m, "i64"); put_u32(&m, KIPP_GGUF_I64); put_u64(&m, (uint64_t)-5);
    float f = 1.5f; double d = -0.25;
    put_str(&m, "f32"); put_u32(&m, KIPP_GGUF_F32); put(&m, &f, 4);
    put_str(&m, "f64"); put_u32(&m, KIPP_GGUF_F64); put(&m, &d, 8);
    put_str(&m, "b"); put_u32(&m, KIPP_GGUF_BOOL); put(&m, "\x01", 1);
    put_str(&m, "s"); put_u32(&m, KIPP_GGUF_STRING); put_str(&m, "hello");
    size_t dir_end = m.n;
    pad_to(&m, 32); /* the data section starts aligned even when it is empty */
    kipp_gguf g;
    char err[256] = "";
    int rc = parse(&m, &g, err, sizeof err);
    CHECK(rc == 0, "parse: %s", err);
    if (rc) return;
    CHECK(g.version == 3 && g.n_kv == 8 && g.n_tensors == 0, "header %u %llu", g.version,
          (unsigned long long)g.n_kv);
    CHECK(kipp_gguf_find(&g, "u8")->v.u == 254, "u8");
    CHECK(kipp_gguf_find(&g, "i16")->v.i == -32768, "i16 %lld", (long long)kipp_gguf_find(&g, "i16")->v.i);
    CHECK(kipp_gguf_find(&g, "u32")->v.u == 4000000000u, "u32");
    CHECK(kipp_gguf_find(&g, "i64")->v.i == -5, "i64");
    CHECK(kipp_gguf_find(&g, "f32")->v.f == 1.5, "f32");
    CHECK(kipp_gguf_find(&g, "f64")->v.f == -0.25, "f64");
    CHECK(kipp_gguf_find(&g, "b")->v.b == 1, "bool");
    CHECK(kipp_str_eq(kipp_gguf_find(&g, "s")->v.s, "hello"), "string");
    CHECK(kipp_gguf_find(&g, "missing") == NULL, "absent key found");
    CHECK(g.alignment == 32, "default alignment %u, expected 32 (GGUF spec)", g.alignment);
    CHECK(g.data_offset == (dir_end + 31) / 32 * 32, "data offset %llu", (unsigned long long)g.data_offset);
    kipp_gguf_free(&g);
    kipp_gguf_free(&g); /* freeing twice is safe: the struct is zeroed */
}

static void test_arrays(void)
{
    img m;
    header(&m, 0, 2); /* the u32 array data lands at byte 51: unaligned on purpose */
    put_str(&m, "ids"); put_u32(&m, KIPP_GGUF_ARRAY); put_u32(&m, KIPP_GGUF_U32); put_u64(&m, 3);
    put_u32(&m, 7); put_u32(&m, 8); put_u32(&m, 0xdeadbeef);
    put_str(&m, "strs"); put_u32(&m, KIPP_GGUF_ARRAY); put_u32(&m, KIPP_GGUF_STRING); put_u64(&m, 3);
    put_str(&m, "a"); put_str(&m, ""); put_str(&m, "b c");
    pad_to(&m, 32);
    kipp_gguf g;
    char err[256] = "";
    int rc = parse(&m, &g, err, sizeof err);
    CHECK(rc == 0, "parse: %s", err);
    if (rc) return;
    const kipp_gguf_kv *ids = kipp_gguf_find(&g, "ids");
    uint32_t v[3];
    memcpy(v, ids->arr_data, sizeof v);
    CHECK(ids->arr_type == KIPP_GGUF_U32 && ids->arr_n == 3, "ids meta");
    CHECK(v[0] == 7 && v[1] == 8 && v[2] == 0xdeadbeef, "ids values %u %u %x", v[0], v[1], v[2]);
    CHECK((const uint8_t *)ids->arr_data >= m.b && (const uint8_t *)ids->arr_data < m.b + m.n,
          "numeric array must point into the buffer");
    const kipp_gguf_kv *s = kipp_gguf_find(&g, "strs");
    CHECK(s->arr_n == 3 && kipp_str_eq(s->arr_str[0], "a") && kipp_str_eq(s->arr_str[1], "") &&
          kipp_str_eq(s->arr_str[2], "b c"), "string array");
    kipp_gguf_free(&g);
}

static void test_tensors_and_alignment(void)
{
    img m;
    header(&m, 3, 1);
    put_str(&m, "general.alignment"); put_u32(&m, KIPP_GGUF_U32); put_u32(&m, 64);
    const uint64_t w[2] = {4, 3}, v[1] = {8}, q[2] = {64, 2};
    tensor(&m, "w", 2, w, 0, 0);    /* F32 [3][4]: 48 bytes */
    tensor(&m, "v", 1, v, 30, 64);  /* BF16 [8]: 16 bytes */
    tensor(&m, "q", 2, q, 8, 128);  /* Q8_0 [2][64]: 4 blocks of 34 bytes */
    pad_to(&m, 64);
    size_t data = m.n;
    for (int i = 0; i < 128 + 136; i++) m.b[m.n++] = (uint8_t)i;
    kipp_gguf g;
    char err[256] = "";
    int rc = parse(&m, &g, err, sizeof err);
    CHECK(rc == 0, "parse: %s", err);
    if (rc) return;
    CHECK(g.alignment == 64 && g.data_offset == data, "alignment %u data %llu (want %zu)",
          g.alignment, (unsigned long long)g.data_offset, data);
    CHECK(g.tensors[0].nbytes == 48 && g.tensors[1].nbytes == 16 && g.tensors[2].nbytes == 136,
          "nbytes %llu %llu %llu", (unsigned long long)g.tensors[0].nbytes,
          (unsigned long long)g.tensors[1].nbytes, (unsigned long long)g.tensors[2].nbytes);
    CHECK(g.tensors[1].data == m.b + data + 64, "tensor data pointer");
    CHECK(kipp_str_eq(g.tensors[2].name, "q") && g.tensors[2].dims[1] == 2, "q entry");
    kipp_gguf_free(&g);
    m.n -= 1; /* the Q8_0 tensor now ends one byte past the file */
    expect_reject(&m, "beyond the end of the file", "data cut by one byte");
}

static void test_header_rejections(void)
{
    img m;
    header(&m, 0, 0);
    m.b[0] = 'X';
    expect_reject(&m, "bad magic 58 47 55 46", "magic");
    header(&m, 0, 0);
    m.b[4] = 2;
    expect_reject(&m, "GGUF version 2, expected 3", "version");
    header(&m, 0, 0);
    m.n = 23;
    expect_reject(&m, "shorter than the 24-byte GGUF header", "short header");
    header(&m, 0, 5000);
    expect_reject(&m, "metadata count 5000 is absurd", "kv cap");
    header(&m, 0, 3); /* three keys promised, zero bytes follow */
    expect_reject(&m, "metadata count 3 is absurd", "kv count vs bytes");
    header(&m, 70000, 0);
    expect_reject(&m, "tensor count 70000 is absurd", "tensor cap");
}

static void test_value_rejections(void)
{
    img m;
    header(&m, 0, 1);
    put_str(&m, "k"); put_u32(&m, KIPP_GGUF_BOOL); put(&m, "\x02", 1);
    expect_reject(&m, "bool byte 2, expected 0 or 1", "bool");
    header(&m, 0, 1);
    put_str(&m, "k"); put_u32(&m, 13); put_u64(&m, 0);
    expect_reject(&m, "value type 13", "unknown type");
    header(&m, 0, 1);
    put_str(&m, "k"); put_u32(&m, KIPP_GGUF_ARRAY); put_u32(&m, KIPP_GGUF_ARRAY); put_u64(&m, 1);
    expect_reject(&m, "array element type 9", "nested array");
    header(&m, 0, 1);
    put_str(&m, "k"); put_u32(&m, KIPP_GGUF_ARRAY); put_u32(&m, KIPP_GGUF_U8);
    put_u64(&m, KIPP_GGUF_MAX_ARRAY + 1ull);
    expect_reject(&m, "array count 16777217", "array cap");
    header(&m, 0, 1);
    put_str(&m, "k"); put_u32(&m, KIPP_GGUF_ARRAY); put_u32(&m, KIPP_GGUF_STRING); put_u64(&m, 1000);
    expect_reject(&m, "truncated file: string array", "string array count vs bytes");
    header(&m, 0, 1);
    put_str(&m, "k"); put_u32(&m, KIPP_GGUF_STRING); put_u64(&m, (1ull << 20) + 1); put_u64(&m, 0);
    expect_reject(&m, "string length 1048577", "string cap");
    header(&m, 0, 1);
    put_str(&m, "k"); put_u32(&m, KIPP_GGUF_STRING); put_u64(&m, 100); put(&m, "abc", 3);
    expect_reject(&m, "truncated file: metadata string value", "string past end");
    header(&m, 0, 1);
    put_str(&m, "general.alignment"); put_u32(&m, KIPP_GGUF_U32); put_u32(&m, 48);
    expect_reject(&m, "general.alignment is 48, expected a power of two", "alignment value");
    header(&m, 0, 1);
    put_str(&m, "general.alignment"); put_u32(&m, KIPP_GGUF_U64); put_u64(&m, 64);
    expect_reject(&m, "general.alignment has GGUF type 10, expected u32", "alignment type");
}

static void test_tensor_rejections(void)
{
    static const struct {
        uint32_t nd;
        uint64_t dims[2];
        uint32_t type;
        uint64_t off;
        const char *want;
    } cases[] = {
        {0, {4, 1}, 30, 0, "n_dims 0, expected 1..4"},
        {2, {4, 0}, 30, 0, "dimension 1 is 0"},
        {2, {1ull << 33, 1}, 30, 0, "dimension 0 is 8589934592"},
        {1, {4, 1}, 2, 0, "has type 2, expected F32 (0), F16 (1), Q4_1 (3), Q8_0 (8) or BF16 (30)"},
        {1, {48, 1}, 8, 0, "row length 48 is not a multiple of the 32-element block"},
        {1, {4, 1}, 30, 16, "offset 16 is not a multiple of the alignment 32"},
        {1, {4, 1}, 30, 1ull << 40, "beyond the end of the file"},
        {1, {4, 1}, 30, UINT64_MAX - 31, "beyond the end of the file"},
        {2, {UINT32_MAX, UINT32_MAX}, 0, 0, "byte size overflows"},
        {2, {UINT32_MAX, 2}, 30, 0, "beyond the end of the file"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        img m;
        header(&m, 1, 0);
        tensor(&m, "t", cases[i].nd, cases[i].dims, cases[i].type, cases[i].off);
        pad_to(&m, 32);
        for (int k = 0; k < 64; k++) m.b[m.n++] = 0;
        char what[32];
        snprintf(what, sizeof what, "tensor case %zu", i);
        expect_reject(&m, cases[i].want, what);
    }
    img m;
    header(&m, 1, 0);
    put_str(&m, "t"); put_u32(&m, 4); /* directory cut inside the fourth dim */
    put_u64(&m, 1); put_u64(&m, 1); put_u64(&m, 1);
    expect_reject(&m, "truncated file: tensor dimension", "directory cut");
}

/* Every prefix of a valid image is rejected cleanly (never crashes, never accepted). */
static void test_every_prefix(void)
{
    img m;
    header(&m, 1, 2);
    put_str(&m, "general.alignment"); put_u32(&m, KIPP_GGUF_U32); put_u32(&m, 32);
    put_str(&m, "a"); put_u32(&m, KIPP_GGUF_ARRAY); put_u32(&m, KIPP_GGUF_STRING); put_u64(&m, 2);
    put_str(&m, "xy"); put_str(&m, "z");
    const uint64_t d[1] = {16};
    tensor(&m, "t", 1, d, 30, 0);
    pad_to(&m, 32);
    for (int k = 0; k < 32; k++) m.b[m.n++] = (uint8_t)k;
    kipp_gguf g;
    char err[256];
    CHECK(parse(&m, &g, err, sizeof err) == 0, "full image: %s", err);
    kipp_gguf_free(&g);
    int accepted = 0;
    for (size_t n = 0; n < m.n; n++) {
        if (kipp_gguf_parse(m.b, n, &g, err, sizeof err) == 0) { accepted++; kipp_gguf_free(&g); }
    }
    CHECK(accepted == 0, "%d strict prefixes were accepted", accepted);
}

int main(void)
{
    RUN(test_scalars_roundtrip);
    RUN(test_arrays);
    RUN(test_tensors_and_alignment);
    RUN(test_header_rejections);
    RUN(test_value_rejections);
    RUN(test_tensor_rejections);
    RUN(test_every_prefix);
    return th_finish();
}
