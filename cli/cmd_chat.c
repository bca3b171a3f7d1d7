/*
 * cmd_chat.c - `kipp chat --model FILE`: interactive multi-turn chat for
 * instruct checkpoints (issue 4, item 7).
 *
 * Reads one user message per stdin line, trimmed of surrounding whitespace;
 * blank lines are skipped. `/reset` clears the conversation, `/exit` or end of
 * input quits; any other line starting with '/' is rejected with the list of
 * commands (a leading `//` sends the rest, starting with '/', as a message).
 * The exit status is 1 when any turn failed or any line was rejected. Each turn re-renders the whole conversation
 * with the native renderer (kipp_chat_render) and tokenizes it, then reuses the
 * session's KV for the longest common prefix of token ids with what the
 * session already holds: kipp_session_truncate drops the rest (for example,
 * the Qwen3 hybrid template removes earlier turns' <think> blocks, so the old
 * reply re-renders differently) and only the new suffix is evaluated.
 * Comparing token ids rather than text also covers a tokenization that
 * changes at the boundary between old and new text.
 *
 * --no-cache-reuse re-evaluates the whole conversation every turn; the tests
 * use it as the oracle that KV reuse must reproduce exactly.
 *
 * stdout carries only the replies (one line per turn end); prompts and the
 * per-turn statistics go to stderr, so the command can be driven by a pipe.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/generate.h"

#define DEFAULT_CHAT_CTX 8192u

/** The conversation: messages plus the token ids the session currently holds. */
typedef struct {
    kipp_chat_message *msgs; /* [n_msgs], content strings malloc'd */
    size_t n_msgs;
    uint32_t *held;          /* [n_held] ids in the session's KV, in order */
    size_t n_held;
} chat_state;

static void chat_clear(chat_state *c)
{
    for (size_t i = 0; i < c->n_msgs; i++) free((char *)c->msgs[i].content);
    c->n_msgs = 0;
    c->n_held = 0;
}

static int chat_push(chat_state *c, kipp_role role, const char *content)
{
    kipp_chat_message *m = realloc(c->msgs, (c->n_msgs + 1) * sizeof *m);
    char *dup = strdup(content);
    if (!m || !dup) {
        if (m) c->msgs = m;
        free(dup);
        return KIPP_ENOMEM;
    }
    c->msgs = m;
    c->msgs[c->n_msgs++] = (kipp_chat_message){.role = role, .content = dup};
    return 0;
}

static void chat_pop(chat_state *c)
{
    if (c->n_msgs) free((char *)c->msgs[--c->n_msgs].content);
}

static size_t common_prefix(const uint32_t *a, size_t na, const uint32_t *b, size_t nb)
{
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

/* Render + tokenize the conversation, reuse the held prefix, evaluate the rest.
 * On success *ids holds the full rendered ids (the caller owns them). */
static int eval_conversation(kipp_model *m, kipp_session *s, chat_state *c, const cli_gen_opts *o,
                             float *logits, uint32_t **ids, size_t *n, size_t *reused, char *err,
                             size_t errlen)
{
    char *text = NULL;
    kipp_chat_options co = {1, o->think, NULL};
    int rc = kipp_chat_render(m, c->msgs, c->n_msgs, &co, &text, err, errlen);
    if (!rc) rc = cli_gen_tokenize(m, text, ids, n, err, errlen);
    free(text);
    if (!rc && *n == 0) rc = KIPP_EINVAL;
    if (rc) return rc;
    /* Keep at least one token to evaluate: its logits start the reply. */
    size_t keep = o->no_reuse ? 0 : common_prefix(c->held, c->n_held, *ids, *n);
    if (keep == *n) keep--;
    *reused = keep;
    rc = kipp_session_truncate(s, (uint32_t)keep, err, errlen);
    if (!rc) rc = kipp_session_eval(s, *ids + keep, (uint32_t)(*n - keep), logits, err, errlen);
    c->n_held = kipp_session_length(s) < keep ? kipp_session_length(s) : keep; /* on error: what is still valid */
    return rc;
}

/* Remember what the session now holds: the rendered ids and the evaluated reply ids. */
static int hold(chat_state *c, const uint32_t *ids, size_t n, const uint32_t *gen, size_t n_gen, size_t len)
{
    uint32_t *h = realloc(c->held, (n + n_gen + 1) * sizeof *h);
    if (!h) return KIPP_ENOMEM;
    memcpy(h, ids, n * sizeof *h);
    memcpy(h + n, gen, n_gen * sizeof *h);
    c->held = h;
    c->n_held = len < n + n_gen ? len : n + n_gen;
    return 0;
}

static int chat_turn(kipp_model *m, kipp_session *s, chat_state *c, const cli_gen_opts *o, float *logits,
                     kipp_rng *rng, const char *line)
{
    char err[512] = "", *reply = NULL;
    uint32_t *ids = NULL, *gen = NULL;
    size_t n = 0, n_gen = 0, reused = 0;
    cli_reply_stats st = {0};
    int rc = chat_push(c, KIPP_ROLE_USER, line);
    st.t_start = cli_now();
    if (!rc) rc = eval_conversation(m, s, c, o, logits, &ids, &n, &reused, err, sizeof err);
    double t_prefill = cli_now() - st.t_start;
    if (!rc) rc = cli_gen_stream(m, s, o, logits, rng, stdout, &gen, &n_gen, &reply, &st, err, sizeof err);
    if (!rc) rc = hold(c, ids, n, gen, n_gen, kipp_session_length(s));
    if (!rc) rc = chat_push(c, KIPP_ROLE_ASSISTANT, reply);
    fputc('\n', stdout);
    fflush(stdout);
    if (rc) {
        fprintf(stderr, "kipp chat: %s%s (turn dropped; /reset starts over)\n", err[0] ? err : kipp_strerror(rc),
                cli_gen_hint(rc));
        if (c->n_msgs && c->msgs[c->n_msgs - 1].role == KIPP_ROLE_USER) chat_pop(c);
    } else {
        fprintf(stderr, "kipp chat: reused %zu of %zu prompt tokens from the cache, evaluated %zu\n", reused, n,
                n - reused);
        cli_gen_print_timings("chat", m, s, o, n - reused, t_prefill, &st);
    }
    free(ids), free(gen), free(reply);
    return rc;
}

/* Read one line trimmed of surrounding whitespace (line end included); NULL at end of input. */
static char *read_line(char **buf, size_t *cap)
{
    fputs("> ", stderr);
    fflush(stderr);
    ssize_t len = getline(buf, cap, stdin);
    if (len < 0) return NULL;
    char *p = *buf;
    while (len > 0 && isspace((unsigned char)p[len - 1])) p[--len] = 0;
    while (isspace((unsigned char)*p)) p++;
    return p;
}

typedef enum { LINE_SKIP, LINE_MESSAGE, LINE_RESET, LINE_EXIT, LINE_BAD } line_kind;

/* What a trimmed line asks for; *msg is the text to send for LINE_MESSAGE. */
static line_kind classify(const char *line, const char **msg)
{
    *msg = line;
    if (!line[0]) return LINE_SKIP;
    if (line[0] != '/') return LINE_MESSAGE;
    if (line[1] == '/') {
        *msg = line + 1; /* "//x" sends "/x" */
        return LINE_MESSAGE;
    }
    if (!strcmp(line, "/exit")) return LINE_EXIT;
    if (!strcmp(line, "/reset")) return LINE_RESET;
    return LINE_BAD;
}

static int chat_loop(kipp_model *m, kipp_session *s, const cli_gen_opts *o, float *logits)
{
    chat_state c = {0};
    kipp_rng rng;
    kipp_rng_seed(&rng, o->seed);
    char *buf = NULL;
    size_t cap = 0;
    const char *line, *msg;
    int failed = 0;
    while ((line = read_line(&buf, &cap)) != NULL) {
        line_kind k = classify(line, &msg);
        if (k == LINE_EXIT) break;
        if (k == LINE_RESET) {
            chat_clear(&c);
            kipp_session_reset(s);
            fprintf(stderr, "kipp chat: conversation reset\n");
        } else if (k == LINE_BAD) {
            fprintf(stderr, "kipp chat: unknown command '%s', expected /reset or /exit "
                            "(start a message with // to send a leading '/')\n", line);
            failed = 1;
        } else if (k == LINE_MESSAGE && chat_turn(m, s, &c, o, logits, &rng, msg)) {
            failed = 1; /* reported; the chat goes on, the exit status remembers */
        }
    }
    chat_clear(&c);
    free(c.msgs);
    free(c.held);
    free(buf);
    return failed;
}

int cmd_chat(int argc, char **argv)
{
    cli_gen_opts o;
    int rc = cli_gen_parse("chat", argc, argv, &o);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    kipp_model *m = NULL;
    if ((rc = cli_gen_open("chat", &o, &m))) return rc;
    kipp_model_info info;
    kipp_model_get_info(m, &info);
    if (!info.has_chat) {
        fprintf(stderr, "kipp chat: %s is a base checkpoint without a chat template; expected an instruct model\n",
                info.checkpoint_id);
        kipp_model_close(m);
        return 2;
    }
    /* cli_gen_open rejected a --ctx above the context length; only the default is capped. */
    uint32_t cap = o.ctx ? (uint32_t)o.ctx : DEFAULT_CHAT_CTX;
    if (cap > info.context_length) cap = info.context_length;
    kipp_session *s = NULL;
    char err[512];
    float *logits = malloc((size_t)info.vocab_size * sizeof *logits);
    if (kipp_session_create(m, cap, &s, err, sizeof err)) {
        fprintf(stderr, "kipp chat: %s\n", err);
        rc = 1;
    } else if (!logits) {
        fprintf(stderr, "kipp chat: out of memory\n");
        rc = 1;
    } else {
        fprintf(stderr, "kipp chat: %s on %s, %u-token context; /reset clears, /exit quits\n", info.checkpoint_id,
                info.backend, cap);
        rc = chat_loop(m, s, &o, logits);
    }
    free(logits);
    kipp_session_destroy(s);
    kipp_model_close(m);
    return rc;
}
