/* safe_io.c - output files written through tmp + rename, refused over an input;
 * escaping of file-derived text for the terminal (base/safe_io.h). */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utf8proc.h>

#include "base/errbuf.h"
#include "base/safe_io.h"

int kipp_out_check(const char *path, const char *const *inputs, size_t n, char *err, size_t errlen)
{
    struct stat so, si;
    if (!path) return kipp_err(err, errlen, KIPP_EINVAL, "output path is NULL; expected a file path");
    if (stat(path, &so) != 0) return KIPP_OK; /* not there yet: cannot be an input */
    for (size_t i = 0; i < n; i++) {
        if (!inputs[i] || stat(inputs[i], &si) != 0) continue;
        if (so.st_dev == si.st_dev && so.st_ino == si.st_ino)
            return kipp_err(err, errlen, KIPP_EINVAL,
                            "output '%s' is the same file as the input '%s'; expected a different output path "
                            "(refusing to overwrite an input)", path, inputs[i]);
    }
    return KIPP_OK;
}

int kipp_outfile_open(kipp_outfile *o, const char *path, const char *const *inputs, size_t n, char *err,
                      size_t errlen)
{
    memset(o, 0, sizeof *o);
    int rc = kipp_out_check(path, inputs, n, err, errlen);
    if (rc) return rc;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return kipp_err(err, errlen, KIPP_EINVAL, "output '%s' is a directory; expected a file path", path);
    size_t len = strlen(path);
    o->path = strdup(path);
    o->tmp = malloc(len + sizeof ".tmp.XXXXXX");
    if (!o->path || !o->tmp) {
        kipp_outfile_abort(o);
        return kipp_err(err, errlen, KIPP_ENOMEM, "out of memory for output path '%s'", path);
    }
    memcpy(o->tmp, path, len);
    memcpy(o->tmp + len, ".tmp.XXXXXX", sizeof ".tmp.XXXXXX");
    int fd = mkstemp(o->tmp);
    if (fd < 0) {
        int e = errno;
        free(o->tmp);
        o->tmp = NULL;
        kipp_outfile_abort(o);
        return kipp_err(err, errlen, KIPP_EIO, "cannot create a temporary file next to output '%s': %s", path,
                        strerror(e));
    }
    mode_t mask = umask(0);
    umask(mask);
    (void)fchmod(fd, 0666 & ~mask); /* mkstemp makes 0600; a plain create would give this */
    o->f = fdopen(fd, "wb");
    if (!o->f) {
        int e = errno;
        close(fd);
        kipp_outfile_abort(o);
        return kipp_err(err, errlen, KIPP_EIO, "cannot open output '%s': %s", path, strerror(e));
    }
    return KIPP_OK;
}

int kipp_outfile_commit(kipp_outfile *o, char *err, size_t errlen)
{
    if (!o->f) {
        kipp_outfile_abort(o);
        return kipp_err(err, errlen, KIPP_EINVAL, "output file is not open");
    }
    int bad = ferror(o->f) || fflush(o->f) != 0, e = errno;
    if (!bad && fsync(fileno(o->f)) != 0 && errno != EINVAL) bad = 1, e = errno;
    if (fclose(o->f) != 0 && !bad) bad = 1, e = errno;
    o->f = NULL;
    if (!bad && rename(o->tmp, o->path) != 0) bad = 1, e = errno;
    if (bad) {
        int rc = kipp_err(err, errlen, KIPP_EIO, "cannot write output '%s': %s", o->path,
                          e ? strerror(e) : "write error");
        kipp_outfile_abort(o);
        return rc;
    }
    free(o->tmp);
    free(o->path);
    o->tmp = o->path = NULL;
    return KIPP_OK;
}

void kipp_outfile_abort(kipp_outfile *o)
{
    if (!o) return;
    if (o->f) fclose(o->f);
    if (o->tmp) unlink(o->tmp);
    free(o->tmp);
    free(o->path);
    memset(o, 0, sizeof *o);
}

/* Append c to out[cap] at *k, counting past the end. */
static void put(char *out, size_t cap, size_t *k, char c)
{
    if (*k + 1 < cap) out[*k] = c;
    (*k)++;
}

size_t kipp_text_escape(const char *p, size_t n, char *out, size_t cap)
{
    static const char hex[] = "0123456789abcdef";
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        const unsigned char *u = (const unsigned char *)p + i;
        utf8proc_int32_t cp = -1;
        utf8proc_ssize_t len = u[0] < 0x80 ? 1 : utf8proc_iterate(u, (utf8proc_ssize_t)(n - i), &cp);
        if (u[0] < 0x80) cp = u[0];
        if (len > 0 && cp >= 0x20 && cp != 0x7f && !(cp >= 0x80 && cp <= 0x9f)) {
            for (utf8proc_ssize_t j = 0; j < len; j++) put(out, cap, &k, (char)u[j]);
            i += (size_t)len;
            continue;
        }
        if (len == 1 && (cp == '\n' || cp == '\r' || cp == '\t')) {
            put(out, cap, &k, '\\');
            put(out, cap, &k, cp == '\n' ? 'n' : cp == '\r' ? 'r' : 't');
            i++;
            continue;
        }
        /* a control character, a C1 control (every byte of it) or one ill-formed byte */
        size_t m = len > 0 ? (size_t)len : 1;
        for (size_t j = 0; j < m; j++) {
            put(out, cap, &k, '\\');
            put(out, cap, &k, 'x');
            put(out, cap, &k, hex[u[j] >> 4]);
            put(out, cap, &k, hex[u[j] & 15]);
        }
        i += m;
    }
    if (cap) out[k < cap ? k : cap - 1] = 0;
    return k;
}

void kipp_fput_escaped(FILE *f, const char *p, size_t n)
{
    char buf[1024];
    for (size_t i = 0; i < n;) {
        /* whole chunks of at most 64 bytes: one UTF-8 sequence is at most 4, one escape 4x */
        size_t m = n - i < 64 ? n - i : 64;
        while (m < n - i && m > 0 && ((unsigned char)p[i + m] & 0xc0) == 0x80 && m > 60) m--;
        size_t k = kipp_text_escape(p + i, m, buf, sizeof buf);
        fwrite(buf, 1, k < sizeof buf ? k : sizeof buf - 1, f);
        i += m;
    }
}

/* ---- SIGBUS on a mapped file that shrank ---- */

#define GUARD_MAX 8
#define GUARD_PATH 1024
static char guard_paths[GUARD_MAX][GUARD_PATH];
static long long guard_sizes[GUARD_MAX];
static volatile sig_atomic_t guard_n;

static void w(const char *s) { ssize_t r = write(2, s, strlen(s)); (void)r; }

/* Decimal of v into a static-free buffer: async-signal-safe. */
static void w_num(long long v)
{
    char b[24];
    int i = sizeof b;
    b[--i] = 0;
    if (v < 0) v = 0;
    do b[--i] = (char)('0' + v % 10); while ((v /= 10) && i > 0);
    w(b + i);
}

static void on_sigbus(int sig)
{
    (void)sig;
    /* Only async-signal-safe calls here: write, stat, _exit. */
    w("kipp: fatal: a memory-mapped model file changed under the process (SIGBUS): ");
    int named = 0;
    for (int i = 0; i < guard_n; i++) {
        struct stat st;
        int gone = stat(guard_paths[i], &st) != 0;
        if (!gone && (long long)st.st_size >= guard_sizes[i]) continue;
        w(named++ ? "; '" : "'");
        w(guard_paths[i]);
        w("' was ");
        w_num(guard_sizes[i]);
        w(" bytes when opened and is ");
        if (gone) w("gone"); else { w_num((long long)st.st_size); w(" bytes now"); }
    }
    if (!named) {
        for (int i = 0; i < guard_n; i++) {
            w(i ? ", '" : "one of '");
            w(guard_paths[i]);
            w("'");
        }
    }
    w(". Kipp maps model files read-only and needs them unchanged while it runs: do not truncate or "
      "rewrite a model in place (write a new file and rename it). Stopping.\n");
    _exit(1);
}

int kipp_mapped_file_guard(const char *path)
{
    if (guard_n == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_sigbus;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGBUS, &sa, NULL);
    }
    if (guard_n >= GUARD_MAX) return -1;
    struct stat st;
    int i = guard_n;
    snprintf(guard_paths[i], GUARD_PATH, "%s", path);
    guard_sizes[i] = stat(path, &st) == 0 ? (long long)st.st_size : 0;
    guard_n = i + 1;
    return 0;
}
