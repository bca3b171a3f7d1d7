/*
 * test_loader.c - the strict loader (engine/model.c) on converted synthetic
 * checkpoints (build/models, made by `make models-test`).
 *
 * Positive tests compare the bound views and kipp_model_info against two
 * independent oracles: the registry entry (dimensions) and the raw file bytes
 * (tensor data at the directory's offsets). Rejection tests apply one minimal
 * corruption each to the tied tiny model, and check both
 * the error code and a substring of the message naming the bad value. The
 * ~90 MB image is read once; each corruption is patched into it and into one
 * temp file copy with pwrite, checked through kipp_model_load (file) and
 * kipp_model_validate_image (memory), then undone. Only the two variants that
 * change the header size (a dropped key, a dropped tensor) are rewritten whole.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/test_harness.h"
#include "engine/internal.h"

static uint8_t *img;        /* pristine bytes of synthetic-tiny.gguf (restored after each patch) */
static size_t img_size;
static kipp_gguf dir;       /* its parsed directory; views point into img */
static char tmp[64];        /* full copy kept in sync with img */
static char tmp2[64];       /* scratch file for truncated and rewritten variants */
static int tmp_fd = -1;

/* ---- fixture ---- */

static char *model_path(const char *name)
{
    static char p[2][512];
    static int k;
    k ^= 1;
    snprintf(p[k], sizeof p[k], "%s/%s.gguf", th_models_dir(), name);
    return p[k];
}

static int write_all(int fd, const void *p, size_t n, off_t off)
{
    for (size_t done = 0; done < n;) {
        ssize_t w = pwrite(fd, (const uint8_t *)p + done, n - done, off + (off_t)done);
        if (w <= 0) return -1;
        done += (size_t)w;
    }
    return 0;
}

static int fixture_open(void)
{
    const char *path = model_path("synthetic-tiny");
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "cannot read %s: run `make models-test`\n", path); return -1; }
    fseek(f, 0, SEEK_END);
    img_size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    img = malloc(img_size);
    size_t got = img ? fread(img, 1, img_size, f) : 0;
    fclose(f);
    char err[256];
    if (got != img_size || kipp_gguf_parse(img, img_size, &dir, err, sizeof err)) return -1;
    snprintf(tmp, sizeof tmp, "/tmp/kipp_test_loader_%d.gguf", (int)getpid());
    snprintf(tmp2, sizeof tmp2, "/tmp/kipp_test_loader_%d_b.gguf", (int)getpid());
    tmp_fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC, 0600);
    return tmp_fd < 0 || write_all(tmp_fd, img, img_size, 0) ? -1 : 0;
}

static void fixture_close(void)
{
    if (tmp_fd >= 0) { close(tmp_fd); unlink(tmp); }
    unlink(tmp2);
    kipp_gguf_free(&dir);
    free(img);
}

/* ---- patching with undo ---- */

static struct { size_t off, n; uint8_t old[64]; } undo[8];
static int n_undo;

static void patch(size_t off, const void *bytes, size_t n)
{
    KIPP_ASSERT(n_undo < 8 && n <= 64 && off + n <= img_size);
    undo[n_undo].off = off;
    undo[n_undo].n = n;
    memcpy(undo[n_undo++].old, img + off, n);
    memcpy(img + off, bytes, n);
    KIPP_ASSERT(write_all(tmp_fd, bytes, n, (off_t)off) == 0);
}
static void patch_u32(size_t off, uint32_t v) { patch(off, &v, 4); }
static void patch_u64(size_t off, uint64_t v) { patch(off, &v, 8); }

static void undo_all(void)
{
    while (n_undo > 0) {
        n_undo--;
        memcpy(img + undo[n_undo].off, undo[n_undo].old, undo[n_undo].n);
        KIPP_ASSERT(write_all(tmp_fd, undo[n_undo].old, undo[n_undo].n, (off_t)undo[n_undo].off) == 0);
    }
}

/* Byte offsets of fields in the original image. */
static size_t at(const void *p) { return (size_t)((const uint8_t *)p - img); }
static const kipp_gguf_kv *kv(const char *key)
{
    const kipp_gguf_kv *k = kipp_gguf_find(&dir, key);
    KIPP_ASSERT(k != NULL);
    return k;
}
static size_t kv_type_at(const char *key) { return at(kv(key)->key.ptr) + kv(key)->key.len; }
static size_t kv_value_at(const char *key) { return kv_type_at(key) + 4; }
static const kipp_gguf_tensor *tensor_named(const char *name, size_t *index)
{
    for (size_t i = 0; i < dir.n_tensors; i++)
        if (kipp_str_eq(dir.tensors[i].name, name)) { if (index) *index = i; return &dir.tensors[i]; }
    KIPP_ASSERT(0);
}
static size_t t_dims_at(const char *name) { const kipp_gguf_tensor *t = tensor_named(name, NULL); return at(t->name.ptr) + t->name.len + 4; }
static size_t t_type_at(const char *name) { return t_dims_at(name) + 8 * tensor_named(name, NULL)->n_dims; }
static size_t t_offset_at(const char *name) { return t_type_at(name) + 4; }

/* ---- expectations ---- */

/* Load path: must fail with code and a message containing want. */
static void expect_load(const char *path, int code, const char *want, const char *what)
{
    kipp_model *m = (kipp_model *)1;
    char err[512] = "";
    int rc = kipp_model_load(path, &m, err, sizeof err);
    CHECK(rc == code, "%s: rc %s, expected %s (%s)", what, kipp_strerror(rc), kipp_strerror(code), err);
    CHECK(strstr(err, want) != NULL, "%s: message '%s' lacks '%s'", what, err, want);
    CHECK(m == NULL, "%s: *out must be NULL on error", what);
    if (rc == 0) kipp_model_close(m);
}

/* The patched image, through the file and through memory, with the same message. */
static void expect_reject(const char *want, const char *what)
{
    expect_load(tmp, KIPP_EFORMAT, want, what);
    char err[512] = "", err2[512] = "";
    kipp_model *m = NULL;
    kipp_model_load(tmp, &m, err, sizeof err);
    int rc = kipp_model_validate_image(img, img_size, err2, sizeof err2);
    CHECK(rc == KIPP_EFORMAT && !strcmp(err, err2), "%s: validate_image gave %d '%s', load gave '%s'",
          what, rc, err2, err);
    undo_all();
}

/* Write the first n bytes of the image to tmp2 (a truncated file). */
static void write_prefix(size_t n)
{
    int fd = open(tmp2, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    KIPP_ASSERT(fd >= 0 && write_all(fd, img, n, 0) == 0);
    close(fd);
}

/*
 * Write tmp2 = the image without directory bytes [off, off+n): the count at
 * count_field drops by one, the directory shrinks, the zero padding is redone
 * so the data section (unchanged, offsets are relative to it) starts 64-aligned.
 */
static void write_without(size_t off, size_t n, size_t count_field)
{
    uint64_t cnt;
    memcpy(&cnt, img + count_field, 8);
    patch_u64(count_field, cnt - 1);
    const kipp_gguf_tensor *last = &dir.tensors[dir.n_tensors - 1];
    size_t dir_end = at(last->name.ptr) + last->name.len + 4 + 8 * last->n_dims + 4 + 8;
    size_t new_end = dir_end - n, new_data = (new_end + 63) / 64 * 64;
    static const uint8_t zero[64];
    int fd = open(tmp2, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    KIPP_ASSERT(fd >= 0);
    KIPP_ASSERT(write_all(fd, img, off, 0) == 0);
    KIPP_ASSERT(write_all(fd, img + off + n, dir_end - off - n, (off_t)off) == 0);
    KIPP_ASSERT(write_all(fd, zero, new_data - new_end, (off_t)new_end) == 0);
    KIPP_ASSERT(write_all(fd, img + dir.data_offset, img_size - dir.data_offset, (off_t)new_data) == 0);
    close(fd);
    undo_all();
}

/* ---- positive tests ---- */

static uint64_t expected_weight_bytes(const kipp_checkpoint *c)
{
    uint64_t d = c->d_model, a = kipp_attn_width(c), kvw = 1024, f = c->d_ff;
    uint64_t layer = d + a * d + 2 * kvw * d + 2 * 128 + d * a + d + 3 * f * d;
    return 2 * ((uint64_t)c->vocab_size * d * (c->tied_embeddings ? 1 : 2) + c->n_layer * layer + d);
}

static void check_model(const char *name, int tied)
{
    const kipp_checkpoint *c = kipp_checkpoint_by_id(name);
    kipp_model *m = NULL;
    char err[512] = "";
    int rc = kipp_model_load(model_path(name), &m, err, sizeof err);
    CHECK(rc == 0 && c, "%s: load failed: %s", name, err);
    if (rc || !c) return;
    kipp_model_info in;
    kipp_model_get_info(m, &in);
    CHECK(!strcmp(in.checkpoint_id, name) && !strcmp(in.repository, c->repository) &&
          !strcmp(in.revision, c->revision) && !strcmp(in.quant, "bf16") && !strcmp(in.backend, "none"),
          "%s: info strings %s %s %s %s", name, in.checkpoint_id, in.repository, in.revision, in.backend);
    CHECK(in.d_model == c->d_model && in.n_layer == c->n_layer && in.n_q_head == c->n_q_head &&
          in.n_kv_head == 8 && in.head_dim == 128 && in.d_ff == c->d_ff && in.vocab_size == 151936 &&
          in.context_length == c->context_length && in.tied_embeddings == tied &&
          in.has_chat == (c->chat != KIPP_CHAT_NONE), "%s: info dims", name);
    CHECK(in.kv_bytes_per_token == (uint64_t)c->n_layer * 2 * 8 * 128 * 2, "%s: kv bytes %llu", name,
          (unsigned long long)in.kv_bytes_per_token);
    CHECK(in.weight_bytes == expected_weight_bytes(c), "%s: weight bytes %llu, expected %llu", name,
          (unsigned long long)in.weight_bytes, (unsigned long long)expected_weight_bytes(c));
    CHECK(in.n_stop == c->n_stop && in.stop_ids[0] == c->stop_ids[0], "%s: stops", name);

    const kipp_qwen3_weights *w = &m->view.w;
    const uint8_t *map = m->map;
    const kipp_gguf_tensor *t0 = &m->gguf.tensors[0], *tl = &m->gguf.tensors[m->gguf.n_tensors - 1];
    CHECK(w->token_embd.data == map + m->gguf.data_offset + t0->offset, "%s: embd pointer", name);
    CHECK((uintptr_t)w->token_embd.data % 64 == 0, "%s: embd not 64-aligned", name);
    CHECK(w->token_embd.rows == 151936 && w->token_embd.cols == c->d_model &&
          w->token_embd.dtype == KIPP_DTYPE_BF16, "%s: embd shape", name);
    CHECK(w->layers == m->layers && m->view.dims.n_layer == c->n_layer, "%s: layers", name);
    const kipp_qwen3_layer *L = &w->layers[c->n_layer - 1];
    CHECK(L->wq.rows == kipp_attn_width(c) && L->wq.cols == c->d_model, "%s: wq shape", name);
    CHECK(L->wo.rows == c->d_model && L->wo.cols == kipp_attn_width(c), "%s: wo shape", name);
    CHECK(L->wk.rows == 1024 && L->w_down.rows == c->d_model && L->w_down.cols == c->d_ff &&
          L->q_norm.rows == 1 && L->q_norm.cols == 128, "%s: layer shapes", name);
    CHECK(L->w_down.nbytes == 2ull * c->d_model * c->d_ff, "%s: w_down bytes", name);
    if (tied) {
        CHECK(w->output.data == w->token_embd.data, "%s: tied output must alias token_embd", name);
        CHECK(w->output_norm.data == map + m->gguf.data_offset + tl->offset, "%s: norm pointer", name);
    } else {
        CHECK(w->output.data != w->token_embd.data, "%s: untied output aliases token_embd", name);
        CHECK(w->output.data == map + m->gguf.data_offset + tl->offset, "%s: output pointer", name);
    }
    CHECK(m->tok != NULL, "%s: tokenizer not built", name);
    kipp_model_close(m);
}

/* Independent of the loader: the weight bytes at the view equal the file's bytes there. */
static void test_views_match_file_bytes(void)
{
    kipp_model *m = NULL;
    char err[512] = "";
    CHECK(kipp_model_load(tmp, &m, err, sizeof err) == 0, "load: %s", err);
    if (!m) return;
    const kipp_tensor_view *v[3] = {&m->view.w.token_embd, &m->view.w.layers[1].w_up, &m->view.w.output_norm};
    const char *names[3] = {"token_embd.weight", "blk.1.ffn_up.weight", "output_norm.weight"};
    for (int i = 0; i < 3; i++) {
        const kipp_gguf_tensor *t = tensor_named(names[i], NULL);
        size_t off = dir.data_offset + t->offset;
        CHECK(v[i]->nbytes == t->nbytes && !memcmp(v[i]->data, img + off, t->nbytes),
              "%s: view bytes differ from file bytes at %zu", names[i], off);
    }
    kipp_model_close(m);
}

static void test_load_tied(void) { check_model("synthetic-tiny", 1); }
static void test_load_untied(void) { check_model("synthetic-tiny-untied", 0); }

static void test_open_backends(void)
{
    kipp_model *m = (kipp_model *)1;
    char err[512] = "";
    int rc = kipp_model_open(tmp, "nope", NULL, &m, err, sizeof err);
    CHECK(rc == KIPP_EBACKEND && m == NULL, "unknown backend: rc %d", rc);
    CHECK(strstr(err, "'nope'") && strstr(err, "ref") && strstr(err, "cpu"), "message: %s", err);
    kipp_model_options o = {.n_threads = -1};
    rc = kipp_model_open(tmp, "cpu", &o, &m, err, sizeof err);
    CHECK(rc == KIPP_EINVAL && strstr(err, "n_threads is -1"), "negative threads: %d %s", rc, err);
    rc = kipp_model_open(tmp, NULL, NULL, &m, err, sizeof err); /* NULL = "cpu" */
    CHECK(rc == 0, "default backend: %s", err);
    if (rc) return;
    kipp_model_info in;
    kipp_model_get_info(m, &in);
    CHECK(!strcmp(in.backend, "cpu"), "backend name %s", in.backend);
    char rep[4096] = "";
    CHECK(kipp_model_describe(m, rep, sizeof rep) == 0 && rep[0], "describe: '%s'", rep);
    kipp_model_close(m);
    kipp_model_close(NULL);
}

/* kipp_model_get_info refuses a NULL model or info with KIPP_EINVAL (it used to
 * abort), zeroes the info it was given, and returns 0 for an open model. */
static void test_get_info_null(void)
{
    kipp_model_info in;
    memset(&in, 0xab, sizeof in);
    CHECK(kipp_model_get_info(NULL, &in) == KIPP_EINVAL, "NULL model accepted");
    CHECK(in.checkpoint_id == NULL && in.vocab_size == 0, "info not zeroed on refusal");
    kipp_model *m = NULL;
    char err[512] = "";
    CHECK(kipp_model_open(tmp, "ref", NULL, &m, err, sizeof err) == 0, "open: %s", err);
    if (!m) return;
    CHECK(kipp_model_get_info(m, NULL) == KIPP_EINVAL, "NULL info accepted");
    CHECK(kipp_model_get_info(m, &in) == 0 && in.vocab_size > 0, "open model: vocab %u", in.vocab_size);
    kipp_model_close(m);
}

/* Run `kipp inspect ARGS` (the CLI next to the test binaries) under a 60 s timeout(1), so a
 * blocked CLI fails (exit 124) instead of hanging; output in out, exit status returned. */
static int run_inspect(const char *args, char *out, size_t cap)
{
    const char *bin = getenv("KIPP_TEST_BIN"); /* build/bin or build-asan/bin: the CLI is one up */
    char dirbuf[512], cmd[1024];
    snprintf(dirbuf, sizeof dirbuf, "%s", bin ? bin : "build/bin");
    char *slash = strrchr(dirbuf, '/');
    if (slash) *slash = 0;
    else snprintf(dirbuf, sizeof dirbuf, ".");
    snprintf(cmd, sizeof cmd, "timeout 60 %s/kipp inspect %s 2>&1", dirbuf, args);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_inspect_cli(void)
{
    static char out[16384];
    int rc = run_inspect(tmp, out, sizeof out);
    CHECK(rc == 0, "kipp inspect exited %d: %s", rc, out);
    char embd[96];
    snprintf(embd, sizeof embd, "[151936][256]    %12llu", 151936ull * 256 * 2); /* shape, bytes */
    const char *want[] = {"checkpoint      synthetic-tiny", "synthetic/qwen3-tiny@kipp-synth-v1-seed1",
                          "quant scheme    bf16", "attention width 2048", "KV bytes/token  8192",
                          "blk.1.ffn_down.weight", embd, "24 tensors"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECK(strstr(out, want[i]) != NULL, "inspect output lacks '%s'", want[i]);
    patch_u32(kv_value_at("kipp.d_model"), 512);
    rc = run_inspect(tmp, out, sizeof out);
    undo_all();
    CHECK(rc == 1 && !strncmp(out, "kipp inspect: kipp.d_model is 512 but", 37), "rejected file: exit %d, '%s'",
          rc, out);
}

/* A FIFO or directory given as the model is refused by name, without blocking in open()
 * (trial defect 9). SIGALRM kills the binary, failing it, if the loader ever blocks. */
static void test_reject_non_regular(void)
{
    char d[] = "/tmp/kipp_loader_XXXXXX", fifo[64], path[128], out[2048];
    if (!mkdtemp(d)) { CHECK(0, "mkdtemp failed: %s", strerror(errno)); return; }
    snprintf(fifo, sizeof fifo, "%s/model.gguf", d);
    CHECK(mkfifo(fifo, 0600) == 0, "mkfifo %s: %s", fifo, strerror(errno));
    alarm(20);
    snprintf(path, sizeof path, "'%s' is a FIFO; expected a regular GGUF file", fifo);
    expect_load(fifo, KIPP_EIO, path, "fifo");
    snprintf(path, sizeof path, "'%s' is a directory; expected a regular GGUF file", d);
    expect_load(d, KIPP_EIO, path, "directory");
    kipp_model *m = (kipp_model *)1;
    char err[512] = "";
    int rc = kipp_model_open(fifo, "ref", NULL, &m, err, sizeof err);
    CHECK(rc == KIPP_EIO && strstr(err, "is a FIFO") && m == NULL, "open fifo: %s (%s)", kipp_strerror(rc), err);
    alarm(0);
    rc = run_inspect(fifo, out, sizeof out); /* under timeout(1): a blocked CLI exits 124 */
    CHECK(rc == 1 && strstr(out, "is a FIFO; expected a regular GGUF file"), "inspect fifo: exit %d, '%s'",
          rc, out);
    unlink(fifo);
    rmdir(d);
}

/* ---- rejections: one test per reason ---- */

static void test_reject_magic(void) { patch(0, "GGUX", 4); expect_reject("bad magic 47 47 55 58", "magic"); }
static void test_reject_version(void) { patch_u32(4, 2); expect_reject("GGUF version 2, expected 3", "version"); }

static void test_reject_truncated(void)
{
    write_prefix(20);
    expect_load(tmp2, KIPP_EFORMAT, "shorter than the 24-byte GGUF header", "header cut");
    write_prefix(dir.data_offset / 2);
    expect_load(tmp2, KIPP_EFORMAT, "truncated file", "directory cut");
    write_prefix(img_size - 4096);
    expect_load(tmp2, KIPP_EFORMAT, "beyond the end of the file", "data cut");
    char err[512] = "";
    CHECK(kipp_model_validate_image(img, img_size - 4096, err, sizeof err) == KIPP_EFORMAT &&
          strstr(err, "beyond the end of the file"), "data cut in memory: %s", err);
    expect_load("/nonexistent/dir/x.gguf", KIPP_EIO, "/nonexistent/dir/x.gguf", "missing file");
}

static void test_reject_absurd_counts(void)
{
    patch_u64(16, 1ull << 40);
    expect_reject("metadata count 1099511627776 is absurd", "kv count");
    patch_u64(8, 1ull << 40);
    expect_reject("tensor count 1099511627776 is absurd", "tensor count");
    patch_u64(kv_value_at("kipp.stop_token_ids") + 4, 1ull << 30);
    expect_reject("array count 1073741824", "array count");
    patch_u64(kv_value_at("general.architecture"), 1ull << 40);
    expect_reject("string length 1099511627776", "string length");
}

static void test_reject_unknown_checkpoint(void)
{
    const kipp_gguf_kv *rev = kv("kipp.source.revision");
    patch(at(rev->v.s.ptr) + rev->v.s.len - 1, "9", 1);
    expect_reject("unknown checkpoint synthetic/qwen3-tiny@kipp-synth-v1-seed9", "revision");
}

static void test_reject_dimension(void)
{
    patch_u32(kv_value_at("kipp.d_model"), 512);
    expect_reject("kipp.d_model is 512 but registry entry 'synthetic-tiny' expects 256", "d_model");
    patch_u32(kv_value_at("kipp.n_q_head"), 8);
    expect_reject("kipp.n_q_head is 8 but registry entry 'synthetic-tiny' expects 16", "n_q_head");
    float theta = 1e4f;
    patch(kv_value_at("kipp.rope_theta"), &theta, 4);
    expect_reject("kipp.rope_theta is 10000 but registry entry 'synthetic-tiny' expects 1000000", "theta");
    patch(kv_value_at("kipp.tied_embeddings"), "\0", 1);
    expect_reject("kipp.tied_embeddings is false", "tied");
    patch_u32(kv_value_at("general.alignment"), 32);
    expect_reject("general.alignment is 32 but registry entry 'synthetic-tiny' expects 64", "alignment key");
    patch_u32(kv_value_at("kipp.tokenizer.added_ids") + 12 + 4 * 3, 7);
    expect_reject("kipp.tokenizer.added_ids[3] is 7, expected 151646", "added ids");
}

static void test_reject_dtype(void)
{
    patch_u32(kv_type_at("kipp.d_model"), KIPP_GGUF_I32);
    expect_reject("metadata key 'kipp.d_model' has GGUF type i32 (5), expected u32 (4)", "key type");
    patch_u32(t_type_at("blk.0.attn_v.weight"), 1); /* F16: same size, so only the type differs */
    expect_reject("tensor 'blk.0.attn_v.weight' has GGUF type F16 (1), but kipp.quant.scheme bf16 stores the "
                  "seven projections as BF16 (30)", "tensor type");
}

/* ---- quantized schemes (seed 000 "Weight quantization") ---- */

static void test_reject_scheme(void)
{
    const kipp_gguf_kv *q = kv("kipp.quant.scheme");
    patch(at(q->v.s.ptr), "fp16", 4);
    expect_reject("kipp.quant.scheme is 'fp16', expected one of bf16, q8_0, affine4_gs32", "unknown scheme");
    /* Scheme says q8_0 but the projections are BF16 (the same 4-byte string length). */
    patch(at(q->v.s.ptr), "q8_0", 4);
    expect_reject("tensor 'blk.0.attn_q.weight' has GGUF type BF16 (30), but kipp.quant.scheme q8_0 stores the "
                  "seven projections as Q8_0 (8)", "scheme vs tensor types");
    /* A quantized norm or embedding: refused by type before its size is looked at. */
    patch_u32(t_type_at("blk.0.attn_norm.weight"), 8);
    expect_reject("tensor 'blk.0.attn_norm.weight' has GGUF type Q8_0 (8), expected BF16 (30): norms, the token "
                  "embedding and the output head stay BF16", "quantized norm");
    patch_u32(t_type_at("token_embd.weight"), 8);
    expect_reject("tensor 'token_embd.weight' has GGUF type Q8_0 (8), expected BF16 (30)", "quantized embedding");
    patch_u32(t_type_at("blk.1.attn_k_norm.weight"), 3);
    expect_reject("tensor 'blk.1.attn_k_norm.weight' has GGUF type Q4_1 (3), expected BF16 (30)", "quantized k norm");
}

/* The q8_0 conversion: loads with its scheme and types, and its own mismatches
 * are refused naming the tensor (patched in memory, kipp_model_validate_image). */
static void test_quantized_file(void)
{
    const char *path = model_path("synthetic-tiny-q8_0");
    kipp_model *m = NULL;
    char err[512] = "";
    int rc = kipp_model_load(path, &m, err, sizeof err);
    CHECK(rc == 0, "load %s: %s (run `make models-test`)", path, err);
    if (rc) return;
    kipp_model_info in;
    kipp_model_get_info(m, &in);
    CHECK(!strcmp(in.quant, "q8_0"), "quant is '%s', expected q8_0", in.quant);
    int n_q8 = 0;
    for (uint64_t i = 0; i < in.n_tensors; i++) {
        kipp_tensor_info t;
        CHECK(kipp_model_tensor(m, i, &t) == 0, "tensor %llu", (unsigned long long)i);
        int proj = t.name_len > 4 && !strncmp(t.name, "blk.", 4) &&
                   (strstr(t.name, "attn_q.") || strstr(t.name, "attn_k.") || strstr(t.name, "attn_v.") ||
                    strstr(t.name, "attn_output.") || strstr(t.name, "ffn_gate.") || strstr(t.name, "ffn_up.") ||
                    strstr(t.name, "ffn_down."));
        CHECK(t.type == (proj ? 8u : 30u), "%.*s: type %u", (int)t.name_len, t.name, t.type);
        if (proj) {
            n_q8++;
            CHECK(!strcmp(t.type_name, "Q8_0") && t.nbytes == t.rows * (t.cols / 32) * 34,
                  "%.*s: %s, %llu bytes", (int)t.name_len, t.name, t.type_name, (unsigned long long)t.nbytes);
        }
    }
    CHECK(n_q8 == 7 * (int)in.n_layer, "%d Q8_0 tensors, expected %u", n_q8, 7 * in.n_layer);
    kipp_model_close(m);

    FILE *f = fopen(path, "rb");
    KIPP_ASSERT(f);
    fseek(f, 0, SEEK_END);
    size_t n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *q = malloc(n);
    KIPP_ASSERT(q && fread(q, 1, n, f) == n);
    fclose(f);
    kipp_gguf g;
    KIPP_ASSERT(kipp_gguf_parse(q, n, &g, err, sizeof err) == 0);
    const kipp_gguf_tensor *wk = NULL, *norm = NULL;
    const kipp_gguf_kv *sch = kipp_gguf_find(&g, "kipp.quant.scheme");
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        if (kipp_str_eq(g.tensors[i].name, "blk.0.attn_k.weight")) wk = &g.tensors[i];
        if (kipp_str_eq(g.tensors[i].name, "blk.0.ffn_norm.weight")) norm = &g.tensors[i];
    }
    KIPP_ASSERT(wk && norm && sch);
    size_t type_at = (size_t)((const uint8_t *)wk->name.ptr - q) + wk->name.len + 4 + 8 * wk->n_dims;
    size_t norm_type_at = (size_t)((const uint8_t *)norm->name.ptr - q) + norm->name.len + 4 + 8 * norm->n_dims;
    size_t sch_at = (size_t)((const uint8_t *)sch->v.s.ptr - q);
    kipp_gguf_free(&g);
    struct { size_t off; uint64_t val; size_t len; const char *want; } cases[] = {
        {type_at, 30, 4, "tensor 'blk.0.attn_k.weight' has GGUF type BF16 (30), but kipp.quant.scheme q8_0 "
                         "stores the seven projections as Q8_0 (8)"},
        {type_at, 3, 4, "tensor 'blk.0.attn_k.weight' has GGUF type Q4_1 (3), but kipp.quant.scheme q8_0"},
        {norm_type_at, 8, 4, "tensor 'blk.0.ffn_norm.weight' has GGUF type Q8_0 (8), expected BF16 (30)"},
        {sch_at, 0x36316662u /* "bf16" */, 4, "tensor 'blk.0.attn_q.weight' has GGUF type Q8_0 (8), but kipp.quant.scheme bf16"},
        {type_at - 16, 16, 8, "tensor 'blk.0.attn_k.weight' row length 16 is not a multiple of the 32-element block"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t old[8];
        memcpy(old, q + cases[i].off, cases[i].len);
        memcpy(q + cases[i].off, &cases[i].val, cases[i].len); /* little-endian */
        err[0] = 0;
        rc = kipp_model_validate_image(q, n, err, sizeof err);
        CHECK(rc == KIPP_EFORMAT && strstr(err, cases[i].want), "q8_0 case %zu: rc %d, '%s' lacks '%s'", i, rc, err,
              cases[i].want);
        memcpy(q + cases[i].off, old, cases[i].len);
    }
    CHECK(kipp_model_validate_image(q, n, err, sizeof err) == 0, "restored image: %s", err);
    free(q);
}

static void test_reject_unknown_tensor(void)
{
    const kipp_gguf_tensor *t = tensor_named("blk.0.attn_q.weight", NULL);
    patch(at(t->name.ptr) + 11, "x", 1);
    expect_reject("unknown tensor 'blk.0.attn_x.weight'", "renamed tensor");
}

static void test_reject_missing_tensor(void)
{
    size_t i;
    const kipp_gguf_tensor *t = tensor_named("blk.1.ffn_up.weight", &i);
    size_t off = at(t->name.ptr) - 8, end = at(dir.tensors[i + 1].name.ptr) - 8;
    write_without(off, end - off, 8);
    expect_load(tmp2, KIPP_EFORMAT, "missing tensor 'blk.1.ffn_up.weight'", "dropped tensor");
}

static void test_reject_duplicate_tensor(void)
{
    const kipp_gguf_tensor *t = tensor_named("blk.0.attn_k.weight", NULL);
    patch(at(t->name.ptr) + 11, "q", 1);
    expect_reject("duplicate tensor 'blk.0.attn_q.weight'", "duplicate");
}

static void test_reject_order(void)
{
    size_t k = at(tensor_named("blk.0.attn_k.weight", NULL)->name.ptr) + 11;
    size_t v = at(tensor_named("blk.0.attn_v.weight", NULL)->name.ptr) + 11;
    patch(k, "v", 1);
    patch(v, "k", 1);
    expect_reject("tensor 'blk.0.attn_v.weight' is at directory index 3 where 'blk.0.attn_k.weight' belongs",
                  "swapped");
}

static void test_reject_shape(void)
{
    size_t d = t_dims_at("blk.0.attn_q.weight");
    patch_u64(d, 512);
    patch_u64(d + 8, 1024); /* same element count, so only the shape is wrong */
    expect_reject("wrong shape: tensor 'blk.0.attn_q.weight' is [1024][512], expected [2048][256]", "shape");
}

static void test_reject_alignment(void)
{
    size_t o = t_offset_at("output_norm.weight");
    uint64_t v;
    memcpy(&v, img + o, 8);
    char want[160];
    snprintf(want, sizeof want, "tensor 'output_norm.weight' offset %llu is not a multiple of the alignment 64",
             (unsigned long long)v + 32);
    patch_u64(o, v + 32);
    expect_reject(want, "misaligned offset");
}

static void test_reject_layout(void)
{
    size_t o1 = t_offset_at("blk.0.attn_norm.weight"), o2 = t_offset_at("blk.0.attn_q.weight");
    uint64_t v1, v2;
    memcpy(&v1, img + o1, 8);
    memcpy(&v2, img + o2, 8);
    char want[200];
    snprintf(want, sizeof want, "tensor 'blk.0.attn_q.weight' at offset %llu overlaps the previous tensor",
             (unsigned long long)v1);
    patch_u64(o2, v1);
    expect_reject(want, "overlap");
    snprintf(want, sizeof want, "at offset %llu leaves a gap: expected offset %llu",
             (unsigned long long)v2 + 64, (unsigned long long)v2);
    patch_u64(o2, v2 + 64);
    expect_reject(want, "gap");
}

static void test_reject_outside_file(void)
{
    patch_u64(t_offset_at("output_norm.weight"), 1ull << 40);
    expect_reject("tensor 'output_norm.weight' (offset 1099511627776", "offset");
    patch_u64(t_offset_at("output_norm.weight"), UINT64_MAX - 63);
    expect_reject("beyond the end of the file", "offset wraps");
    patch_u64(t_dims_at("blk.1.ffn_down.weight"), 1u << 30);
    expect_reject("'blk.1.ffn_down.weight' (offset", "size");
    /* Trailing bytes after the last tensor are refused too. */
    uint8_t junk[4096] = {1};
    KIPP_ASSERT(write_all(tmp_fd, junk, sizeof junk, (off_t)img_size) == 0);
    expect_load(tmp, KIPP_EFORMAT, "4096 bytes after the last tensor", "trailing bytes");
    KIPP_ASSERT(ftruncate(tmp_fd, (off_t)img_size) == 0);
}

static void test_reject_metadata_keys(void)
{
    const kipp_gguf_kv *k = kv("kipp.tokenizer.normalizer");
    patch(at(k->key.ptr) + k->key.len - 1, "x", 1);
    expect_reject("unknown metadata key 'kipp.tokenizer.normalizex'", "unknown key");
    k = kv("kipp.n_layer");
    patch(at(k->key.ptr) + 5, "d_model", 7); /* kipp.n_layer -> kipp.d_model */
    expect_reject("duplicate metadata key 'kipp.d_model'", "duplicate key");
    /* Drop kipp.rope_theta entirely (key, type, value). */
    k = kv("kipp.rope_theta");
    size_t off = at(k->key.ptr) - 8;
    write_without(off, 8 + k->key.len + 4 + 4, 16);
    expect_load(tmp2, KIPP_EFORMAT, "missing metadata key 'kipp.rope_theta' (GGUF type f32)", "dropped key");
}

int main(void)
{
    if (fixture_open()) {
        fprintf(stderr, "test_loader: fixture unavailable\n");
        printf("FAIL fixture\n");
        th_failed++;
        fixture_close();
        return th_finish();
    }
    RUN(test_load_tied);
    RUN(test_load_untied);
    RUN(test_views_match_file_bytes);
    RUN(test_open_backends);
    RUN(test_get_info_null);
    RUN(test_inspect_cli);
    RUN(test_reject_non_regular);
    RUN(test_reject_magic);
    RUN(test_reject_version);
    RUN(test_reject_truncated);
    RUN(test_reject_absurd_counts);
    RUN(test_reject_unknown_checkpoint);
    RUN(test_reject_dimension);
    RUN(test_reject_dtype);
    RUN(test_reject_scheme);
    RUN(test_quantized_file);
    RUN(test_reject_unknown_tensor);
    RUN(test_reject_missing_tensor);
    RUN(test_reject_duplicate_tensor);
    RUN(test_reject_order);
    RUN(test_reject_shape);
    RUN(test_reject_alignment);
    RUN(test_reject_layout);
    RUN(test_reject_outside_file);
    RUN(test_reject_metadata_keys);
    fixture_close();
    return th_finish();
}
