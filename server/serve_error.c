/*
 * serve_error.c - the server's error helpers in one place: filling a
 * serve_error, its OpenAI JSON body, and the UTF-8-safe JSON string every
 * renderer uses for bytes a client or the model wrote.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/serve.h"

int serve_fail(serve_error *e, int status, const char *type, const char *param, const char *fmt, ...)
{
    memset(e, 0, sizeof *e);
    e->status = status;
    e->type = type;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

#define FFFD "\xEF\xBF\xBD"

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when invalid. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (k == 0 || k > n || (k == 2 && c < 0xC2)) return 0;
    for (size_t i = 1; i < k; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    if (k == 3 && ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] >= 0xA0))) return 0;
    if (k == 4 && ((c == 0xF0 && s[1] < 0x90) || c > 0xF4 || (c == 0xF4 && s[1] >= 0x90))) return 0;
    return k;
}

json_t *serve_json_text(const char *p, size_t n)
{
    serve_buf b = {0};
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq((const unsigned char *)p + i, n - i);
        serve_buf_put(&b, k ? p + i : FFFD, k ? k : 3);
        i += k ? k : 1;
    }
    json_t *j = json_stringn(b.p ? b.p : "", b.n);
    free(b.p);
    return j;
}

char *serve_error_json(const serve_error *e)
{
    /* the message may quote client bytes cut mid-character */
    json_t *o = json_pack("{s:{s:o, s:s, s:o, s:o}}", "error", "message", serve_json_text(e->message, strlen(e->message)), "type",
                          e->type ? e->type : "server_error", "param",
                          e->param[0] ? serve_json_text(e->param, strlen(e->param)) : json_null(), "code",
                          e->code[0] ? json_string(e->code) : json_null());
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s ? s : strdup("{\"error\":{\"message\":\"error\",\"type\":\"server_error\",\"param\":null,\"code\":null}}");
}

const char *serve_json_type(const json_t *v)
{
    if (!v) return "missing";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

char *serve_dupn(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n), d[n] = 0;
    return d;
}
