/*
 * tool_calls.c - Qwen3's tool-call blocks in a reply's content -> calls and
 * the text around them.
 *
 * The Qwen3 chat template teaches the model to answer a tool turn with
 * "<tool_call>\n{\"name\": ..., \"arguments\": {...}}\n</tool_call>" blocks
 * (Hermes-style, the format vLLM's hermes parser reads). A block whose inner
 * text is not exactly that, or names a function the request did not offer,
 * stays plain text: a model's malformed output is shown, never dropped and
 * never an error. The parse is a pure function of the text and of whether it
 * is final, and holds back what later bytes could still change, so streamed
 * deltas add up to the non-streamed message.
 */
#include <stdlib.h>
#include <string.h>

#include "server/serve.h"

#define OPEN "<tool_call>"
#define CLOSE "</tool_call>"
#define OPEN_LEN 11
#define CLOSE_LEN 12

static const char *find(const char *h, size_t n, const char *needle, size_t k)
{
    if (k > n) return NULL;
    for (size_t i = 0; i + k <= n; i++)
        if (h[i] == needle[0] && !memcmp(h + i, needle, k)) return h + i;
    return NULL;
}

/* Longest k < plen with s[n-k..n) == pat[0..k): a tail that may grow into pat. */
static size_t partial_tail(const char *s, size_t n, const char *pat, size_t plen)
{
    for (size_t k = plen - 1 < n ? plen - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, pat, k)) return k;
    return 0;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

static int all_ws(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!is_ws(s[i])) return 0;
    return 1;
}


/* Skip one JSON value at s[i..n) already known valid (jansson parsed it):
 * strings with their escapes, brackets by depth. Returns the end offset. */
static size_t skip_value(const char *s, size_t n, size_t i)
{
    int depth = 0;
    do {
        char c = s[i];
        if (c == '"') {
            for (i++; i < n && s[i] != '"'; i++)
                if (s[i] == '\\') i++;
            i++;
        } else if (c == '{' || c == '[') {
            depth++, i++;
        } else if (c == '}' || c == ']') {
            depth--, i++;
        } else {
            while (i < n && !is_ws(s[i]) && s[i] != ',' && s[i] != '}' && s[i] != ']') i++;
        }
        while (depth > 0 && i < n && (is_ws(s[i]) || s[i] == ',' || s[i] == ':')) i++;
    } while (depth > 0 && i < n);
    return i;
}

/* The byte span of the top-level member "arguments" of the valid JSON object
 * s[n], as written; 0 on success, -1 when the key is spelled with escapes
 * (the caller then re-dumps the parsed value). */
static int arguments_span(const char *s, size_t n, size_t *off, size_t *len)
{
    size_t i = 0;
    while (i < n && is_ws(s[i])) i++;
    for (i++; i < n;) { /* after '{' or ',' */
        while (i < n && is_ws(s[i])) i++;
        if (i >= n || s[i] != '"') return -1;
        size_t k0 = i + 1, k1 = skip_value(s, n, i) - 1; /* key bytes k0..k1 */
        i = k1 + 1;
        while (i < n && (is_ws(s[i]) || s[i] == ':')) i++;
        size_t v0 = i, v1 = skip_value(s, n, i);
        if (k1 - k0 == 9 && !memcmp(s + k0, "arguments", 9)) {
            *off = v0, *len = v1 - v0;
            return 0;
        }
        i = v1;
        while (i < n && is_ws(s[i])) i++;
        if (i >= n || s[i] != ',') return -1;
        i++;
    }
    return -1;
}

/* The call in block inner text s[n], or 0 when it is not one. -1: out of memory. */
static int block_call(const serve_tool *tools, size_t n_tools, const char *s, size_t n, serve_call *call)
{
    json_error_t je;
    json_t *o = json_loadb(s, n, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    const json_t *name = json_object_get(o, "name"), *args = json_object_get(o, "arguments");
    int ok = json_is_object(o) && json_object_size(o) == 2 && json_is_string(name) && json_is_object(args);
    size_t t = 0;
    while (ok && t < n_tools && strcmp(tools[t].name, json_string_value(name))) t++;
    ok = ok && t < n_tools && strlen(tools[t].name) == json_string_length(name);
    int rc = 0;
    if (ok) {
        size_t off, len;
        call->name = serve_dupn(tools[t].name, strlen(tools[t].name));
        call->arguments = arguments_span(s, n, &off, &len) ? json_dumps(args, JSON_COMPACT | JSON_REAL_PRECISION(17))
                                                          : serve_dupn(s + off, len);
        rc = call->name && call->arguments ? 1 : -1;
        if (rc < 0) free(call->name), free(call->arguments);
    }
    json_decref(o);
    return rc;
}

/* ---- the call in progress (streaming) ---- */

/* After ws at s[*i]: 1 and *i past lit when s[*i..n) starts with it. */
static int eat(const char *s, size_t n, size_t *i, const char *lit)
{
    while (*i < n && is_ws(s[*i])) (*i)++;
    size_t k = strlen(lit);
    if (n - *i < k || memcmp(s + *i, lit, k)) return 0;
    *i += k;
    return 1;
}

/* The head of block inner text s[n]: {"name": "<tools[t]>", "arguments": and
 * the '{' that opens the arguments (its offset returned, t set), or 0 when not
 * (yet) read or not a tool's. Spelled literally, as Qwen3's template writes it. */
static size_t call_head(const serve_tool *tools, size_t n_tools, const char *s, size_t n, size_t *t)
{
    size_t i = 0;
    if (!eat(s, n, &i, "{") || !eat(s, n, &i, "\"name\"") || !eat(s, n, &i, ":") || !eat(s, n, &i, "\"")) return 0;
    const char *q = memchr(s + i, '"', n - i);
    if (!q) return 0;
    size_t len = (size_t)(q - s) - i;
    for (*t = 0; *t < n_tools && (strlen(tools[*t].name) != len || memcmp(tools[*t].name, s + i, len)); (*t)++) {}
    i += len + 1;
    if (*t == n_tools || !eat(s, n, &i, ",") || !eat(s, n, &i, "\"arguments\"") || !eat(s, n, &i, ":")) return 0;
    return eat(s, n, &i, "{") ? i - 1 : 0;
}

/* JSON lexer states of json_prefix. */
enum { J_VALUE, J_VALUE_OR_END, J_KEY, J_KEY_OR_END, J_COLON, J_AFTER, J_STR, J_ESC, J_HEX, J_NUM, J_LIT };

#define J_MAX_DEPTH 256 /* deeper arguments are held back until the block closes */

/* Number bytes: 1 when c may follow the number text so far in s[a..i) (RFC 8259). */
static int num_next(const char *s, size_t a, size_t i, char c)
{
    char p = i > a ? s[i - 1] : 0;
    int digit = c >= '0' && c <= '9', has_e = 0, has_dot = 0;
    for (size_t k = a; k < i; k++) has_e |= s[k] == 'e' || s[k] == 'E', has_dot |= s[k] == '.';
    if (digit) return !(i - a == 1 && p == '0') && !(i - a == 2 && s[a] == '-' && p == '0');
    if (c == '.') return !has_dot && !has_e && p >= '0' && p <= '9';
    if (c == 'e' || c == 'E') return !has_e && p >= '0' && p <= '9';
    return (c == '+' || c == '-') && (p == 'e' || p == 'E');
}

/* 1 when the number s[a..i) may end here. */
static int num_done(const char *s, size_t a, size_t i) { return i > a && s[i - 1] >= '0' && s[i - 1] <= '9'; }

/* The longest prefix of s[n] (which starts with '{') that is a prefix of a
 * valid JSON object, ending at that object's closing brace at the latest. */
static size_t json_prefix(const char *s, size_t n)
{
    unsigned char obj[J_MAX_DEPTH]; /* per depth: 1 object, 0 array */
    int depth = 0, st = J_VALUE, key = 0, hex = 0;
    size_t a = 0; /* where the number or literal began */
    const char *lit = NULL;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (st == J_STR) {
            if (c == '"') st = key ? J_COLON : J_AFTER;
            else if (c == '\\') st = J_ESC;
            else if ((unsigned char)c < 0x20) return i;
            continue;
        }
        if (st == J_ESC) {
            if (c == 'u') st = J_HEX, hex = 0;
            else if (strchr("\"\\/bfnrt", c) && c) st = J_STR;
            else return i;
            continue;
        }
        if (st == J_HEX) {
            if (!strchr("0123456789abcdefABCDEF", c) || !c) return i;
            if (++hex == 4) st = J_STR;
            continue;
        }
        if (st == J_NUM) {
            if (num_next(s, a, i, c)) continue;
            if (!num_done(s, a, i)) return i;
            st = J_AFTER; /* and c is read below */
        }
        if (st == J_LIT) {
            if (lit[i - a]) {
                if (c != lit[i - a]) return i;
                continue;
            }
            st = J_AFTER;
        }
        if (is_ws(c)) continue;
        switch (st) {
        case J_VALUE:
        case J_VALUE_OR_END:
            if (st == J_VALUE_OR_END && c == ']') goto close;
            if (c == '{' || c == '[') {
                if (depth == J_MAX_DEPTH) return i;
                obj[depth++] = c == '{', st = c == '{' ? J_KEY_OR_END : J_VALUE_OR_END;
            } else if (c == '"') {
                st = J_STR, key = 0;
            } else if (c == '-' || (c >= '0' && c <= '9')) {
                st = J_NUM, a = i;
            } else if (c == 't' || c == 'f' || c == 'n') {
                st = J_LIT, a = i, lit = c == 't' ? "true" : c == 'f' ? "false" : "null";
            } else {
                return i;
            }
            break;
        case J_KEY:
        case J_KEY_OR_END:
            if (st == J_KEY_OR_END && c == '}') goto close;
            if (c != '"') return i;
            st = J_STR, key = 1;
            break;
        case J_COLON:
            if (c != ':') return i;
            st = J_VALUE;
            break;
        default: /* J_AFTER */
            if (c == ',') st = obj[depth - 1] ? J_KEY : J_VALUE;
            else if (c == (obj[depth - 1] ? '}' : ']')) goto close;
            else return i;
        }
        continue;
    close:
        if (c != (obj[depth - 1] ? '}' : ']')) return i;
        if (--depth == 0) return i + 1;
        st = J_AFTER;
    }
    return n;
}

/* The open block at text[s..n) (no "</tool_call>" yet): its call so far, if its head is read. */
static void call_part(const serve_tool *tools, size_t n_tools, const char *text, size_t s, size_t n, serve_call_part *p)
{
    const char *in = text + s + OPEN_LEN;
    size_t t, a = call_head(tools, n_tools, in, n - s - OPEN_LEN, &t);
    if (!a) return;
    *p = (serve_call_part){.name = tools[t].name, .args = in + a, .args_len = json_prefix(in + a, n - s - OPEN_LEN - a), .at = s};
}

static int add_call(serve_tool_out *out, const serve_call *c)
{
    if (out->n_calls == out->cap_calls) {
        size_t cap = out->cap_calls ? out->cap_calls * 2 : 4;
        serve_call *p = realloc(out->calls, cap * sizeof *p);
        if (!p) return -1;
        out->calls = p, out->cap_calls = cap;
    }
    out->calls[out->n_calls++] = *c;
    return 0;
}

/* Content piece text[a..b) that ends at a block (at_block) or at the text's
 * end: whitespace-only pieces next to a block are dropped; not final, one that
 * may still be followed by a block is held back. */
static int put_piece(serve_tool_out *out, const char *text, size_t a, size_t b, int after_block, int at_block)
{
    int ws = all_ws(text + a, b - a);
    if (ws && (after_block || at_block)) return 0;
    return serve_buf_put(&out->content, text + a, b - a);
}

int serve_tool_parse(const serve_tool *tools, size_t n_tools, const char *text, size_t n, int final,
                     serve_tool_out *out)
{
    memset(out, 0, sizeof *out);
    size_t piece = 0, scan = 0;
    int after_block = 0;
    for (;;) {
        const char *o = find(text + scan, n - scan, OPEN, OPEN_LEN);
        if (!o) break;
        size_t s = (size_t)(o - text);
        const char *c = find(text + s + OPEN_LEN, n - s - OPEN_LEN, CLOSE, CLOSE_LEN);
        if (!c) {
            if (final) break; /* unterminated at the end: plain content */
            /* still open: hold it back, and the piece before it when it may be dropped */
            call_part(tools, n_tools, text, s, n, &out->part);
            int ws = all_ws(text + piece, s - piece);
            return ws ? 0 : serve_buf_put(&out->content, text + piece, s - piece);
        }
        size_t e = (size_t)(c - text);
        serve_call call = {0};
        int got = block_call(tools, n_tools, text + s + OPEN_LEN, e - s - OPEN_LEN, &call);
        if (got < 0) return -1;
        call.at = s;
        if (!got) { /* not a call: it stays text; a later "<tool_call>" inside it may still open one */
            scan = s + 1;
            continue;
        }
        if (put_piece(out, text, piece, s, after_block, 1) || add_call(out, &call)) {
            free(call.name), free(call.arguments);
            return -1;
        }
        piece = scan = e + CLOSE_LEN, after_block = 1;
    }
    size_t end = n;
    if (!final) {
        end -= partial_tail(text + piece, n - piece, OPEN, OPEN_LEN);
        if (all_ws(text + piece, end - piece)) return 0; /* may yet sit next to a block */
    }
    return put_piece(out, text, piece, end, after_block, 0);
}

void serve_tool_out_free(serve_tool_out *out)
{
    for (size_t i = 0; i < out->n_calls; i++) free(out->calls[i].name), free(out->calls[i].arguments);
    free(out->calls);
    serve_buf_free(&out->content);
    memset(out, 0, sizeof *out);
}
