/*
 * cmd_tokenize.c - `kipp tokenize` and `kipp detokenize`.
 *
 *   kipp tokenize --model FILE (--text T | --file F) [--special]
 *       prints the ids as a JSON array, e.g. [9707, 1879]
 *   kipp detokenize --model FILE --ids 1,2,3
 *       prints the decoded text followed by one newline
 *
 * The model is opened with the loader alone (no backend, weights untouched).
 * --help / -h prints the usage to stdout and exits 0.
 * Exit status: 0 ok, 1 model or I/O failure, 2 bad arguments (named on stderr).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/safe_io.h"
#include "cli/cli.h"
#include "engine/kipp.h"
#include "engine/kipp_checkpoints.h"

typedef struct {
    const char *model, *text, *file, *ids;
    int special;
} tok_args;

static void print_usage(FILE *f, const char *cmd)
{
    if (!strcmp(cmd, "tokenize"))
        fprintf(f, "usage: kipp tokenize --model FILE (--text T | --file F) [--special]\n"
                   "  --model FILE   converted .gguf model (only its tokenizer is used)\n"
                   "  --text T       the text to tokenize\n"
                   "  --file F       read the text from regular file F (- reads stdin)\n"
                   "  --special      match special tokens such as <|im_start|> in the text\n"
                   "  --help, -h     print this help\n"
                   "prints the token ids as a JSON array, e.g. [9707, 1879]\n");
    else
        fprintf(f, "usage: kipp detokenize --model FILE --ids 1,2,3\n"
                   "  --model FILE   converted .gguf model (only its tokenizer is used)\n"
                   "  --ids LIST     comma-separated token ids\n"
                   "  --help, -h     print this help\n"
                   "prints the decoded text followed by one newline\n");
}

static int usage_error(const char *cmd, const char *msg, const char *val)
{
    cli_errorf(cmd, "%s%s%s", msg, val ? " " : "", val ? val : "");
    print_usage(stderr, cmd);
    return 2;
}

/* Parse argv; returns 0, the exit status 2 after printing the problem, or -1 after
 * printing the usage for --help / -h (the caller exits 0). */
static int parse_args(const char *cmd, int argc, char **argv, tok_args *a)
{
    memset(a, 0, sizeof *a);
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            print_usage(stdout, cmd);
            return -1;
        }
        const char **slot = !strcmp(o, "--model") ? &a->model
                          : !strcmp(o, "--text") && !strcmp(cmd, "tokenize") ? &a->text
                          : !strcmp(o, "--file") && !strcmp(cmd, "tokenize") ? &a->file
                          : !strcmp(o, "--ids") && !strcmp(cmd, "detokenize") ? &a->ids : NULL;
        if (!strcmp(o, "--special") && !strcmp(cmd, "tokenize")) {
            a->special = 1;
        } else if (slot) {
            if (i + 1 >= argc) return usage_error(cmd, "option needs a value after it:", o);
            *slot = argv[++i];
        } else {
            return usage_error(cmd, "unknown argument", o);
        }
    }
    if (!a->model) return usage_error(cmd, "missing required option --model (expected a .gguf path)", NULL);
    if (!strcmp(cmd, "tokenize") && !!a->text == !!a->file)
        return usage_error(cmd, "give exactly one of --text T or --file F", NULL);
    if (!strcmp(cmd, "detokenize") && !a->ids)
        return usage_error(cmd, "missing required option --ids (expected comma-separated token ids)", NULL);
    return 0;
}

/* Read all of `path` ("-" = stdin) into a malloc'd buffer of *len bytes. Returns NULL
 * and a reason in `why` (strerror text or "not a regular file ...") on failure. A named
 * path must be a regular file: a directory would read as empty text and a FIFO would
 * block in open(), so it is opened non-blocking and checked with fstat first. */
static char *read_file(const char *path, size_t *len, char *why, size_t whylen)
{
    int is_stdin = !strcmp(path, "-");
    int fd = is_stdin ? fileno(stdin) : open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st)) {
        snprintf(why, whylen, "%s", strerror(errno));
        if (fd >= 0 && !is_stdin) close(fd);
        return NULL;
    }
    if (!is_stdin && !S_ISREG(st.st_mode)) {
        snprintf(why, whylen, "%s", S_ISDIR(st.st_mode) ? strerror(EISDIR)
                 : "not a regular file (expected a text file, or - for stdin)");
        close(fd);
        return NULL;
    }
    FILE *f = is_stdin ? stdin : fdopen(fd, "rb");
    if (!f) {
        snprintf(why, whylen, "%s", strerror(errno));
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    int failed = ferror(f), saved = errno;
    if (!is_stdin) fclose(f);
    if (!buf || failed) {
        snprintf(why, whylen, "%s", !buf ? "out of memory" : strerror(saved ? saved : EIO));
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

static kipp_model *open_model(const char *cmd, const char *path)
{
    char err[512];
    kipp_model *m = NULL;
    kipp_mapped_file_guard(path);
    if (kipp_model_open(path, "none", NULL, &m, err, sizeof err)) {
        cli_model_error(cmd, path, err);
        return NULL;
    }
    return m;
}

int cmd_tokenize(int argc, char **argv)
{
    tok_args a;
    int rc = parse_args("tokenize", argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    size_t len = a.text ? strlen(a.text) : 0;
    char why[160];
    char *text = a.file ? read_file(a.file, &len, why, sizeof why) : NULL;
    if (a.file && !text) {
        cli_errorf("tokenize", "cannot read --file %s: %s", a.file, why);
        return 1;
    }
    kipp_model *m = open_model("tokenize", a.model);
    char err[512];
    size_t n = 0;
    uint32_t *ids = NULL;
    rc = m ? 0 : 1;
    const char *src = a.file ? text : a.text;
    int flags = a.special ? KIPP_TOK_SPECIAL : 0;
    if (!rc) {
        int r = kipp_tokenize(m, src, len, flags, NULL, 0, &n, err, sizeof err); /* size it */
        if (r && r != KIPP_ERANGE) rc = 1;
    }
    if (!rc && !(ids = malloc((n + 1) * sizeof *ids))) rc = 1;
    if (!rc && kipp_tokenize(m, src, len, flags, ids, n, &n, err, sizeof err)) rc = 1;
    if (rc && m) cli_errorf("tokenize", "%s", err);
    if (!rc) {
        putchar('[');
        for (size_t i = 0; i < n; i++) printf(i ? ", %u" : "%u", ids[i]);
        puts("]");
    }
    free(ids);
    free(text);
    kipp_model_close(m);
    return rc;
}

/* "1,2, 3" -> ids; returns 0 or 2 after naming the bad piece. */
static int parse_ids(const char *s, uint32_t **ids, size_t *n)
{
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    *ids = malloc(cap * sizeof **ids);
    *n = 0;
    for (const char *p = s; *ids;) {
        char *end;
        while (*p == ' ') p++;
        errno = 0;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || *p == '-' || errno || v > UINT32_MAX) {
            fprintf(stderr, "kipp detokenize: --ids entry %zu (\"%.*s\") is not a token id; expected "
                            "comma-separated integers 0..%u\n", *n, (int)strcspn(p, ","), p, KIPP_VOCAB_SIZE - 1);
            return 2;
        }
        (*ids)[(*n)++] = (uint32_t)v;
        for (p = end; *p == ' '; p++) {}
        if (!*p) return 0;
        if (*p != ',') {
            fprintf(stderr, "kipp detokenize: unexpected '%c' in --ids; expected commas between ids\n", *p);
            return 2;
        }
        p++;
    }
    return 1;
}

int cmd_detokenize(int argc, char **argv)
{
    tok_args a;
    uint32_t *ids = NULL;
    size_t n = 0, len = 0;
    int rc = parse_args("detokenize", argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    rc = parse_ids(a.ids, &ids, &n);
    if (rc) {
        free(ids);
        return rc;
    }
    kipp_model *m = open_model("detokenize", a.model);
    char err[512], *out = NULL;
    rc = m ? 0 : 1;
    if (!rc) {
        int r = kipp_detokenize(m, ids, n, NULL, 0, &len, err, sizeof err);
        if (r && !(r == KIPP_ERANGE && len > 0)) rc = r == KIPP_ERANGE ? 2 : 1;
    }
    if (!rc && !(out = malloc(len + 1))) rc = 1;
    if (!rc && kipp_detokenize(m, ids, n, out, len, &len, err, sizeof err)) rc = 1;
    if (rc && m) cli_errorf("detokenize", "%s", err);
    if (!rc) {
        fwrite(out, 1, len, stdout);
        putchar('\n');
    }
    free(out);
    free(ids);
    kipp_model_close(m);
    return rc;
}
