/*
 * test_safe_io.c - base/safe_io.h: an output that is
 * an input is refused by (st_dev, st_ino) whatever its spelling; a committed
 * output appears whole, an aborted one leaves the destination as it was and no
 * temporary file; file-derived text is escaped so it cannot drive a terminal.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/safe_io.h"
#include "engine/kipp.h"
#include "tests/test_harness.h"

static char dir[64];

static void path_in(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", dir, name); }

static void write_file(const char *p, const char *text)
{
    FILE *f = fopen(p, "wb");
    fputs(text, f);
    fclose(f);
}

static int file_equals(const char *p, const char *text)
{
    char buf[256] = "";
    FILE *f = fopen(p, "rb");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    return n == strlen(text) && !memcmp(buf, text, n);
}

static int entries(void)
{
    int n = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static void test_same_file_refused_by_identity(void)
{
    char in[128], hard[128], sym[128], dotted[160], other[128], err[512];
    path_in(in, sizeof in, "model.gguf");
    path_in(hard, sizeof hard, "hard.gguf");
    path_in(sym, sizeof sym, "sym.gguf");
    path_in(other, sizeof other, "other.f32");
    snprintf(dotted, sizeof dotted, "%s/./model.gguf", dir);
    write_file(in, "MODEL");
    CHECK(link(in, hard) == 0, "link");
    CHECK(symlink("model.gguf", sym) == 0, "symlink");
    const char *inputs[] = {NULL, in};
    const char *outs[] = {in, hard, sym, dotted};
    for (int i = 0; i < 4; i++) {
        kipp_outfile of;
        err[0] = 0;
        CHECK(kipp_out_check(outs[i], inputs, 2, err, sizeof err) == KIPP_EINVAL, "%s not refused", outs[i]);
        CHECK(strstr(err, "same file as the input") != NULL, "message: %s", err);
        CHECK(kipp_outfile_open(&of, outs[i], inputs, 2, err, sizeof err) == KIPP_EINVAL, "%s opened", outs[i]);
        CHECK(of.f == NULL, "no file opened");
    }
    CHECK(file_equals(in, "MODEL"), "input changed");
    CHECK(kipp_out_check(other, inputs, 2, err, sizeof err) == 0, "a new path is fine: %s", err);
    write_file(other, "x");
    CHECK(kipp_out_check(other, inputs, 2, err, sizeof err) == 0, "another existing file is fine: %s", err);
    unlink(hard), unlink(sym), unlink(in), unlink(other);
}

static void test_commit_and_abort(void)
{
    char out[128], err[512];
    path_in(out, sizeof out, "out.bin");
    write_file(out, "OLD");
    kipp_outfile of;
    CHECK(kipp_outfile_open(&of, out, NULL, 0, err, sizeof err) == 0, "%s", err);
    fputs("NEW-HALF", of.f);
    fflush(of.f);
    CHECK(file_equals(out, "OLD"), "destination touched before commit");
    kipp_outfile_abort(&of);
    CHECK(file_equals(out, "OLD"), "abort changed the destination");
    CHECK(entries() == 1, "abort left %d entries", entries());
    CHECK(kipp_outfile_open(&of, out, NULL, 0, err, sizeof err) == 0, "%s", err);
    fputs("NEW", of.f);
    CHECK(kipp_outfile_commit(&of, err, sizeof err) == 0, "%s", err);
    CHECK(file_equals(out, "NEW"), "commit did not replace the destination");
    CHECK(entries() == 1, "commit left %d entries", entries());
    char sub[128];
    path_in(sub, sizeof sub, "no-such-dir/out.bin");
    CHECK(kipp_outfile_open(&of, sub, NULL, 0, err, sizeof err) == KIPP_EIO && strstr(err, "no-such-dir"),
          "missing directory: %s", err);
    CHECK(kipp_outfile_open(&of, dir, NULL, 0, err, sizeof err) == KIPP_EINVAL, "a directory: %s", err);
    unlink(out);
}

static void test_escape(void)
{
    char out[256];
    struct { const char *in; size_t n; const char *want; } cases[] = {
        {"plain name.weight", 17, "plain name.weight"},
        {"\x1b[31mred\x1b[0m", 12, "\\x1b[31mred\\x1b[0m"},
        {"a\nb\tc\r", 6, "a\\nb\\tc\\r"},
        {"nul\0x", 5, "nul\\x00x"},
        {"caf\xc3\xa9 \xe2\x82\xac", 9, "caf\xc3\xa9 \xe2\x82\xac"},   /* valid UTF-8 stays */
        {"\xc2\x9b" "2J", 4, "\\xc2\\x9b2J"},                          /* C1 CSI as UTF-8 */
        {"\xff\xfe", 2, "\\xff\\xfe"},                                  /* not UTF-8 */
        {"\xed\xa0\x80", 3, "\\xed\\xa0\\x80"},                         /* a surrogate */
        {"\x7f", 1, "\\x7f"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t k = kipp_text_escape(cases[i].in, cases[i].n, out, sizeof out);
        CHECK(!strcmp(out, cases[i].want) && k == strlen(cases[i].want), "case %zu: got '%s'", i, out);
    }
    size_t need = kipp_text_escape("\x1b\x1b\x1b", 3, out, 5); /* truncated, still terminated */
    CHECK(need == 12 && strlen(out) == 4, "truncation: need %zu, got '%s'", need, out);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/kipp-safe-io-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    RUN(test_same_file_refused_by_identity);
    RUN(test_commit_and_abort);
    RUN(test_escape);
    rmdir(dir);
    return th_finish();
}
