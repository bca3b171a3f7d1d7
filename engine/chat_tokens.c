/*
 * chat_tokens.c - kipp_chat_tokenize: chat render + tokenize where only the
 * template's own markers become control tokens, so text a user types cannot
 * act as one.
 *
 * Rendering and then tokenizing with KIPP_TOK_SPECIAL would turn a user's typed
 * "<|im_start|>system" into real control tokens. Here the messages are
 * rendered twice: once as given (R) and once "neutralised" (N), where every
 * '<' of message text becomes '\x01'. The neutral copy has the same length and
 * the same template decisions, so the markers that the special tokenizer finds
 * in N are exactly the template's, at the same byte offsets in R. R is then
 * tokenized piecewise: each run between template markers as plain text, each
 * marker as its id. Without marker text in the messages the ids equal
 * kipp_tokenize(R, KIPP_TOK_SPECIAL), because the special tokenizer splits at
 * markers and encodes the runs in between the same way.
 *
 * Kept intact so the template's own decisions do not change: "<think>" and
 * "</think>" in assistant content (the template splits reasoning there) and a
 * user content's leading "<tool_response>" / trailing "</tool_response>" (the
 * template's tool-response test). Uses only the public API (kipp.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kipp.h"

/* Marker ids found in N: a token whose text is <...> and does not encode as
 * itself in plain mode. At most MAX_MARK distinct ones per conversation. */
#define MAX_MARK 32

typedef struct {
    uint32_t id;
    char text[64];
    size_t len;
} marker;

static int tokenize_alloc(const kipp_model *m, const char *t, size_t len, int flags, uint32_t **ids, size_t *n,
                          char *err, size_t errlen)
{
    size_t cap = len + 16; /* byte-level BPE: at most one token per byte (plus markers) */
    *ids = malloc(cap * sizeof **ids);
    if (!*ids) return KIPP_ENOMEM;
    int rc = kipp_tokenize(m, t, len, flags, *ids, cap, n, err, errlen);
    if (rc == KIPP_ERANGE && *n > cap) {
        uint32_t *b = realloc(*ids, *n * sizeof *b);
        if (!b) return KIPP_ENOMEM;
        *ids = b;
        rc = kipp_tokenize(m, t, len, flags, *ids, *n, n, err, errlen);
    }
    return rc;
}

static int is_marker(const kipp_model *m, uint32_t id, marker *out)
{
    size_t n = 0;
    if (kipp_detokenize(m, &id, 1, out->text, sizeof out->text - 1, &n, NULL, 0) || n < 3) return 0;
    out->text[n] = 0, out->len = n, out->id = id;
    if (out->text[0] != '<' || out->text[n - 1] != '>') return 0;
    uint32_t plain[64];
    size_t np = 0;
    int rc = kipp_tokenize(m, out->text, n, 0, plain, 64, &np, NULL, 0);
    return rc != 0 || np != 1 || plain[0] != id;
}

/* Does s[i..n) start with the literal lit? (s may hold NUL bytes.) */
static int at(const char *s, size_t n, size_t i, const char *lit)
{
    size_t k = strlen(lit);
    return i + k <= n && !memcmp(s + i, lit, k);
}

/* Copy s[0..n) (NUL-terminated copy; s may hold NUL bytes) with every '<'
 * turned into '\x01', except the kept prefixes above. */
static char *neutral(const char *s, size_t n, kipp_role role)
{
    if (!s) return NULL;
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    for (size_t i = 0; i < n; i++) {
        if (d[i] != '<') continue;
        if (role == KIPP_ROLE_ASSISTANT && (at(s, n, i, "<think>") || at(s, n, i, "</think>"))) continue;
        if (role == KIPP_ROLE_USER && i == 0 && at(s, n, i, "<tool_response>")) continue;
        if (role == KIPP_ROLE_USER && n >= 16 && i == n - 16 && at(s, n, i, "</tool_response>")) continue;
        d[i] = '\x01';
    }
    return d;
}

/* A message's content as one byte string: content[0..content_len) (strlen
 * when 0), or its text parts joined with "\n", which is how the renderer
 * treats parts (kipp.h); *len its length. NULL content stays NULL. */
static char *joined_content(const kipp_chat_message *msg, size_t *len)
{
    *len = 0;
    if (!msg->content_parts) {
        if (!msg->content) return NULL;
        *len = msg->content_len ? msg->content_len : strlen(msg->content);
        return neutral(msg->content, *len, msg->role);
    }
    size_t n = 0;
    for (size_t k = 0; k < msg->n_content_parts; k++) n += strlen(msg->content_parts[k]) + (k > 0);
    char *j = malloc(n + 1), *o = j;
    if (!j) return NULL;
    for (size_t k = 0; k < msg->n_content_parts; k++) {
        if (k) *o++ = '\n';
        size_t m = strlen(msg->content_parts[k]);
        memcpy(o, msg->content_parts[k], m);
        o += m;
    }
    *o = 0;
    *len = n;
    char *d = neutral(j, n, msg->role);
    free(j);
    return d;
}

static void free_neutral(kipp_chat_message *c, size_t n)
{
    for (size_t i = 0; c && i < n; i++) {
        free((char *)c[i].content);
        free((char *)c[i].reasoning_content);
    }
    free(c);
}

/* The render of msgs with message text neutralised; *out_len its length.
 * Called after kipp_chat_render accepted msgs (so content and parts never
 * both appear). */
static int render_neutral(const kipp_model *m, const kipp_chat_message *msgs, size_t n, const kipp_chat_options *o,
                          char **out, size_t *out_len, char *err, size_t errlen)
{
    kipp_chat_message *c = calloc(n ? n : 1, sizeof *c);
    int oom = !c;
    for (size_t i = 0; !oom && i < n; i++) {
        const kipp_chat_message *s = &msgs[i];
        c[i] = *s;
        c[i].content_parts = NULL, c[i].n_content_parts = 0; /* joined into content, as the renderer joins them */
        c[i].content = joined_content(s, &c[i].content_len);
        c[i].reasoning_len = s->reasoning_content ? (s->reasoning_len ? s->reasoning_len : strlen(s->reasoning_content)) : 0;
        c[i].reasoning_content = neutral(s->reasoning_content, c[i].reasoning_len, s->role);
        oom = ((s->content || s->content_parts) && !c[i].content) || (s->reasoning_content && !c[i].reasoning_content);
    }
    int rc = oom ? KIPP_ENOMEM : kipp_chat_render_n(m, c, n, o, out, out_len, err, errlen);
    free_neutral(c, n);
    return rc;
}

/* The distinct template markers of the neutral render, in marks[*n_marks]. */
static int find_markers(const kipp_model *m, const char *nt, size_t nt_len, marker *marks, size_t *n_marks, char *err,
                        size_t errlen)
{
    uint32_t *ids = NULL;
    size_t n = 0;
    int rc = tokenize_alloc(m, nt, nt_len, KIPP_TOK_SPECIAL, &ids, &n, err, errlen);
    *n_marks = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        int seen = 0;
        for (size_t k = 0; k < *n_marks; k++) seen |= marks[k].id == ids[i];
        if (!seen && *n_marks < MAX_MARK && is_marker(m, ids[i], &marks[*n_marks])) (*n_marks)++;
    }
    free(ids);
    return rc;
}

/* Append ids[n] to the growing *out[*n_out] (capacity *cap). */
static int push_ids(uint32_t **out, size_t *n_out, size_t *cap, const uint32_t *ids, size_t n)
{
    if (*n_out + n > *cap) {
        size_t c = (*n_out + n) * 2 + 16;
        uint32_t *b = realloc(*out, c * sizeof *b);
        if (!b) return KIPP_ENOMEM;
        *out = b, *cap = c;
    }
    memcpy(*out + *n_out, ids, n * sizeof *ids);
    *n_out += n;
    return 0;
}

static int push_plain(const kipp_model *m, const char *t, size_t len, uint32_t **out, size_t *n_out, size_t *cap,
                      char *err, size_t errlen)
{
    if (!len) return 0;
    uint32_t *ids = NULL;
    size_t n = 0;
    int rc = tokenize_alloc(m, t, len, 0, &ids, &n, err, errlen);
    if (!rc) rc = push_ids(out, n_out, cap, ids, n);
    free(ids);
    return rc;
}

/* Tokenize R[0..len) piecewise at the markers' offsets in N (same length). */
static int split_tokenize(const kipp_model *m, const char *r, size_t len, const char *nt, const marker *marks,
                          size_t n_marks, uint32_t **out, size_t *n_out, char *err, size_t errlen)
{
    size_t cap = 0, run = 0;
    int rc = 0;
    *out = NULL, *n_out = 0;
    for (size_t i = 0; i < len && !rc;) {
        const marker *hit = NULL;
        for (size_t k = 0; k < n_marks && !hit; k++)
            if (nt[i] == '<' && i + marks[k].len <= len && !memcmp(nt + i, marks[k].text, marks[k].len)) hit = &marks[k];
        if (!hit) {
            i++;
            continue;
        }
        rc = push_plain(m, r + run, i - run, out, n_out, &cap, err, errlen);
        if (!rc) rc = push_ids(out, n_out, &cap, &hit->id, 1);
        i += hit->len, run = i;
    }
    if (!rc) rc = push_plain(m, r + run, len - run, out, n_out, &cap, err, errlen);
    return rc;
}

int kipp_chat_tokenize(const kipp_model *model, const kipp_chat_message *msgs, size_t n,
                       const kipp_chat_options *opts, uint32_t **ids, size_t *n_ids, char **text, size_t *text_len,
                       char *err, size_t errlen)
{
    if (!ids || !n_ids) {
        if (err && errlen) snprintf(err, errlen, "kipp_chat_tokenize: ids or n_ids is NULL, expected pointers");
        return KIPP_EINVAL;
    }
    *ids = NULL, *n_ids = 0;
    if (text) *text = NULL;
    if (text_len) *text_len = 0;
    char *r = NULL, *nt = NULL;
    marker marks[MAX_MARK];
    size_t n_marks = 0;
    size_t r_len = 0, nt_len = 0; /* message text may hold NUL bytes: lengths, never strlen */
    int rc = kipp_chat_render_n(model, msgs, n, opts, &r, &r_len, err, errlen);
    if (!rc) rc = render_neutral(model, msgs, n, opts, &nt, &nt_len, err, errlen);
    if (!rc && nt_len != r_len) { /* cannot happen: the neutral copy keeps every template decision */
        if (err && errlen) snprintf(err, errlen, "kipp_chat_tokenize: neutral render differs in length; refusing");
        rc = KIPP_EINVAL;
    }
    if (!rc) rc = find_markers(model, nt, nt_len, marks, &n_marks, err, errlen);
    if (!rc) rc = split_tokenize(model, r, r_len, nt, marks, n_marks, ids, n_ids, err, errlen);
    if (rc == KIPP_ENOMEM && err && errlen && !*err) snprintf(err, errlen, "out of memory tokenizing the chat");
    if (rc) free(*ids), *ids = NULL, *n_ids = 0;
    if (!rc && text) *text = r, r = NULL;
    if (!rc && text_len) *text_len = r_len;
    free(r);
    free(nt);
    return rc;
}
