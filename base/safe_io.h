/*
 * safe_io.h - output-file and terminal-text helpers shared by the kipp CLI,
 * kipp-bench and the other bench programs.
 *
 * Output files: no command may write over one of its own inputs, and an
 * interrupted or failed write never leaves a half-written file at the
 * destination. kipp_outfile_open refuses a destination that is the same file
 * as an input, by (st_dev, st_ino) rather than by path string, so "./m.gguf",
 * a hard link or a symlink to the model are all caught; it then writes to a
 * unique temporary file in the destination's directory, which
 * kipp_outfile_commit flushes, fsyncs and renames into place.
 *
 * Terminal text: text taken from a file (tensor names, metadata, error
 * messages quoting them) may hold ANSI escape sequences. kipp_text_escape
 * copies it with every control byte, C1 control and non-UTF-8 byte written as
 * \xNN (\n, \r, \t as such), so it cannot drive the terminal.
 */
#ifndef KIPP_SAFE_IO_H
#define KIPP_SAFE_IO_H

#include <stddef.h>
#include <stdio.h>

/** A destination file being written through a temporary file. */
typedef struct {
    FILE *f;        /* write here */
    char *path;     /* final path (malloc'd) */
    char *tmp;      /* temporary path in the same directory (malloc'd) */
} kipp_outfile;

/**
 * 0 when path names no existing file or a file other than each of inputs[n]
 * (NULL entries and inputs that do not exist are skipped); else KIPP_EINVAL
 * with err naming both paths. Compares (st_dev, st_ino) after following links.
 */
int kipp_out_check(const char *path, const char *const *inputs, size_t n, char *err, size_t errlen);

/**
 * Check path against inputs[n] (kipp_out_check), then create a unique
 * temporary file next to path and open it for writing in o->f. Returns 0 or a
 * KIPP_E* code with err filled (an existing directory at path is refused).
 */
int kipp_outfile_open(kipp_outfile *o, const char *path, const char *const *inputs, size_t n, char *err,
                      size_t errlen);

/**
 * Flush, fsync and close o->f, then rename the temporary file onto the final
 * path. On any failure the temporary file is removed and the destination is
 * untouched. Returns 0 or KIPP_EIO with err filled; o is released either way.
 */
int kipp_outfile_commit(kipp_outfile *o, char *err, size_t errlen);

/** Close and delete the temporary file, leaving the destination untouched; o may be zeroed. */
void kipp_outfile_abort(kipp_outfile *o);

/**
 * Copy p[n] to out[cap] (always NUL-terminated when cap > 0) with control
 * bytes (0x00-0x1f, 0x7f), C1 controls (U+0080-U+009F) and bytes that are not
 * part of well-formed UTF-8 written as \xNN, and \n \r \t as two characters.
 * Returns the length the full escape needs (excluding the NUL), like snprintf.
 */
size_t kipp_text_escape(const char *p, size_t n, char *out, size_t cap);

/** fputs of kipp_text_escape(p, n) without a size limit. */
void kipp_fput_escaped(FILE *f, const char *p, size_t n);

/**
 * For programs (kipp, kipp-bench), never called by the library itself: remember
 * path as a file that is memory-mapped, and on the first call install a SIGBUS
 * handler. A mapped file that shrinks under the process (truncated or rewritten
 * in place by another program) raises SIGBUS on the next access to a lost page;
 * the handler then writes one line naming the file(s) and its size now, and
 * ends the process with status 1 instead of dying of the signal. Returns 0, or
 * -1 when more than 8 files are registered (the extra one is not named).
 */
int kipp_mapped_file_guard(const char *path);
#endif
