/* cli_util.c - messages shared by the kipp commands (cli/cli.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/safe_io.h"
#include "cli/cli.h"

void cli_errorf(const char *cmd, const char *fmt, ...)
{
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof buf) n = sizeof buf - 1;
    fprintf(stderr, "kipp %s: ", cmd);
    kipp_fput_escaped(stderr, buf, (size_t)n);
    fputc('\n', stderr);
}

void cli_model_error(const char *cmd, const char *path, const char *err)
{
    if (path && !strstr(err, path)) cli_errorf(cmd, "'%s': %s", path, err);
    else cli_errorf(cmd, "%s", err);
}

int cli_missing(const char *cmd, const char *flag, const char *what)
{
    fprintf(stderr, "kipp %s: missing required option %s (expected %s); `kipp %s --help` lists the options\n", cmd,
            flag, what, cmd);
    return 2;
}
