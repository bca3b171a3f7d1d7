/*
 * cmd_chat.c - `kipp chat --model FILE`: interactive multi-turn chat for
 * instruct checkpoints.
 *
 * Reads one user message per stdin line, trimmed of surrounding whitespace;
 * blank lines are skipped. `/reset` clears the conversation, `/exit` or end of
 * input quits; any other line starting with '/' is rejected with the list of
 * commands (a leading `//` sends the rest, starting with '/', as a message).
 * The exit status is 1 when any turn failed or any line was rejected. Each turn re-renders the whole conversation
 * with the native renderer and tokenizes it (kipp_chat_tokenize: typed markers
 * in messages stay text), then reuses the
 * session's KV for the longest common prefix of token ids with what the
 * session already holds: kipp_session_truncate drops the rest (for example,
 * the Qwen3 hybrid template removes earlier turns' <think> blocks, so the old
 * reply re-renders differently) and only the new suffix is evaluated.
 * Comparing token ids rather than text also covers a tokenization that
 * changes at the boundary between old and new text.
 *
 * The model is opened with a KV pool (kipp_model_enable_pool) of twice the
 * session's capacity, so `/reset` publishes the conversation's full 32-token
 * blocks and the next conversation adopts the longest cached prefix of its
 * prompt (kipp_session_match_prefix) - a repeated system prompt or first
 * message is not prefilled again.
 *
 * A conversation that no longer fits the session with room for --max-tokens (at most half the session)
 * loses its oldest turns (kipp_chat_tokenize_fit, the server's rule): the
 * --system message stays, the dropped messages leave the conversation for good
 * (so the next turns keep reusing the KV of what is left) and stderr says how
 * many. When even the system message and the new line do not fit, the turn fails.
 *
 * --kv-cache-dir DIR puts the disk tier under that pool (kipp_model_enable_disk_tier):
 * the blocks published at /reset and at exit are written there, and a later
 * `kipp chat` of the same model adopts its first prompt's prefix from them.
 *
 * --no-cache-reuse re-evaluates the whole conversation every turn, without a
 * pool; the tests use it as the oracle that KV reuse must reproduce exactly.
 *
 * stdout carries only the replies (one line per turn end); prompts and the
 * per-turn statistics go to stderr, so the command can be driven by a pipe. A
 * turn dropped before its reply starts (context full) writes nothing to stdout.
 *
 * Lines keep the length getline returns: a NUL byte is text (docs/TOKENIZER.md).
 * Ctrl-C (SIGINT) during a reply stops it at the next token; the timings line
 * says "interrupted" and the conversation, with the partial reply, is kept.
 * Ctrl-C at the prompt prints a hint; a second one in a row exits (status as for
 * /exit). Ctrl-D (end of input) ends the "> " line with a newline and exits.
 */
#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/generate.h"

#define DEFAULT_CHAT_CTX 8192u

static void on_sigint(int sig)
{
    (void)sig;
    cli_interrupted = 1;
}

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

/* Append a message holding a copy of content[len]; NUL bytes are kept (content_len). */
static int chat_push(chat_state *c, kipp_role role, const char *content, size_t len)
{
    kipp_chat_message *m = realloc(c->msgs, (c->n_msgs + 1) * sizeof *m);
    char *dup = malloc(len + 1);
    if (!m || !dup) {
        if (m) c->msgs = m;
        free(dup);
        return KIPP_ENOMEM;
    }
    memcpy(dup, content, len);
    dup[len] = 0;
    c->msgs = m;
    c->msgs[c->n_msgs++] = (kipp_chat_message){.role = role, .content = dup, .content_len = len};
    return 0;
}

/* Remove msgs[from .. from + k): the oldest turns, cut to fit the context. */
static void chat_drop(chat_state *c, size_t from, size_t k)
{
    for (size_t i = from; i < from + k; i++) free((char *)c->msgs[i].content);
    memmove(c->msgs + from, c->msgs + from + k, (c->n_msgs - from - k) * sizeof *c->msgs);
    c->n_msgs -= k;
}

/* A fresh conversation: only the --system message, when one was given. */
static int chat_start(chat_state *c, const cli_gen_opts *o)
{
    chat_clear(c);
    return o->system ? chat_push(c, KIPP_ROLE_SYSTEM, o->system, strlen(o->system)) : 0;
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
static int prepare_conversation(kipp_model *m, kipp_session *s, chat_state *c, const cli_gen_opts *o,
                                uint32_t **ids, size_t *n, size_t *reused, char *err, size_t errlen)
{
    kipp_chat_options co = {.add_generation_prompt = 1, .enable_thinking = o->think};
    /* Only the template's markers become control tokens: a typed "<|im_start|>" stays text. The oldest turns
     * go when the conversation and --max-tokens do not fit the session. */
    uint32_t cap = kipp_session_capacity(s);
    size_t dropped = 0, head = c->n_msgs && c->msgs[0].role == KIPP_ROLE_SYSTEM;
    int rc = kipp_chat_tokenize_fit(m, c->msgs, c->n_msgs, &co, cap, o->max_tokens, &dropped, ids, n, NULL, NULL,
                                    err, errlen);
    if (!rc && *n == 0) rc = KIPP_EINVAL;
    if (!rc && *n >= cap) {
        snprintf(err, errlen, "this message%s and the template make %zu prompt tokens, which do not fit the "
                 "%u-token context (--ctx) with room for the reply; expected a shorter message",
                 head ? ", the system message" : "", *n, cap);
        rc = KIPP_ERANGE;
    }
    if (rc) return rc;
    if (dropped) {
        chat_drop(c, head, dropped);
        fprintf(stderr, "kipp chat: the conversation does not fit the %u-token context with %u tokens for the "
                        "reply; dropped the %zu oldest messages, %zu kept\n", cap,
                o->max_tokens < cap / KIPP_CHAT_FIT_RESERVE_MAX_DIV ? o->max_tokens : cap / KIPP_CHAT_FIT_RESERVE_MAX_DIV,
                dropped, c->n_msgs);
    }
    /* Keep at least one token to evaluate: its logits start the reply. */
    size_t keep = o->no_reuse ? 0 : common_prefix(c->held, c->n_held, *ids, *n);
    if (keep == *n) keep--;
    rc = kipp_session_truncate(s, (uint32_t)keep, err, errlen);
    if (!rc && keep == 0 && !o->no_reuse) { /* a new conversation: adopt what the pool holds (0 when unpooled) */
        int got = kipp_session_match_prefix(s, *ids, (uint32_t)(*n - 1), err, errlen);
        if (got < 0) rc = got;
        else keep = (size_t)got;
    }
    *reused = keep;
    c->n_held = kipp_session_length(s) < keep ? kipp_session_length(s) : keep; /* what the session still holds */
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

/* One turn: the user's line[len] in, a streamed reply out. A turn dropped before
 * its reply started (for example: the context is full) writes nothing to stdout,
 * only the reason to stderr. Ctrl-C during the reply stops it (cli_interrupted):
 * the partial reply stays in the conversation and the timings line says so. */
static int chat_turn(kipp_model *m, kipp_session *s, chat_state *c, const cli_gen_opts *o, kipp_rng *rng,
                     const char *line, size_t len)
{
    char err[512] = "", *reply = NULL;
    uint32_t *ids = NULL, *gen = NULL;
    size_t n = 0, n_gen = 0, reused = 0, reply_len = 0;
    cli_reply_stats st = {0};
    int rc = chat_push(c, KIPP_ROLE_USER, line, len);
    st.t_start = cli_now();
    if (!rc) rc = prepare_conversation(m, s, c, o, &ids, &n, &reused, err, sizeof err);
    if (!rc)
        rc = cli_gen_stream(m, s, o, ids, n, rng, stdout, &gen, &n_gen, &reply, &reply_len, &st, err, sizeof err);
    int started = st.prefilled;
    if (!rc) rc = hold(c, ids, n, gen, n_gen, kipp_session_length(s));
    if (!rc) rc = chat_push(c, KIPP_ROLE_ASSISTANT, reply, reply_len);
    if (started) {
        fputc('\n', stdout); /* the reply's line end */
        fflush(stdout);
    }
    if (rc) {
        cli_errorf("chat", "%s%s (turn dropped; /reset starts over)", err[0] ? err : kipp_strerror(rc),
                cli_gen_hint(rc));
        if (c->n_msgs && c->msgs[c->n_msgs - 1].role == KIPP_ROLE_USER) chat_pop(c);
    } else {
        fprintf(stderr, "kipp chat: reused %zu of %zu prompt tokens from the cache, evaluated %zu\n", reused, n,
                n - reused);
        cli_gen_print_timings("chat", m, s, o, n - reused, &st);
    }
    free(ids), free(gen), free(reply);
    return rc;
}

typedef enum { READ_LINE, READ_EOF, READ_INTERRUPT } read_status;

/* Read one line into *line[*len], trimmed of surrounding whitespace (line end
 * included). The length is getline's: a NUL byte inside the line is text, not its
 * end (docs/TOKENIZER.md). READ_INTERRUPT when Ctrl-C arrived while waiting. */
static read_status read_line(char **buf, size_t *cap, const char **line, size_t *len)
{
    fputs("> ", stderr);
    fflush(stderr);
    errno = 0;
    ssize_t got = getline(buf, cap, stdin);
    if (got < 0) {
        int intr = errno == EINTR || cli_interrupted;
        clearerr(stdin);
        fputc('\n', stderr); /* Ctrl-D or Ctrl-C: leave the "> " line */
        return intr ? READ_INTERRUPT : READ_EOF;
    }
    char *p = *buf;
    size_t n = (size_t)got;
    while (n > 0 && isspace((unsigned char)p[n - 1])) p[--n] = 0;
    while (n > 0 && isspace((unsigned char)*p)) p++, n--;
    *line = p;
    *len = n;
    return READ_LINE;
}

typedef enum { LINE_SKIP, LINE_MESSAGE, LINE_RESET, LINE_EXIT, LINE_BAD } line_kind;

static int line_is(const char *line, size_t len, const char *word)
{
    return len == strlen(word) && !memcmp(line, word, len);
}

/* What a trimmed line[len] asks for; *msg[*msg_len] is the text to send for LINE_MESSAGE. */
static line_kind classify(const char *line, size_t len, const char **msg, size_t *msg_len)
{
    *msg = line;
    *msg_len = len;
    if (!len) return LINE_SKIP;
    if (line[0] != '/') return LINE_MESSAGE;
    if (len > 1 && line[1] == '/') {
        *msg = line + 1; /* "//x" sends "/x" */
        *msg_len = len - 1;
        return LINE_MESSAGE;
    }
    if (line_is(line, len, "/exit")) return LINE_EXIT;
    if (line_is(line, len, "/reset")) return LINE_RESET;
    return LINE_BAD;
}

static int chat_loop(kipp_model *m, kipp_session *s, const cli_gen_opts *o)
{
    chat_state c = {0};
    if (chat_start(&c, o)) return 1;
    kipp_rng rng;
    kipp_rng_seed(&rng, o->seed);
    char *buf = NULL;
    size_t cap = 0, len = 0, msg_len = 0;
    const char *line = NULL, *msg;
    int failed = 0, interrupts = 0; /* Ctrl-C in a row, with no line read in between */
    for (;;) {
        read_status rs = read_line(&buf, &cap, &line, &len);
        if (rs == READ_EOF) break;
        if (rs == READ_INTERRUPT || cli_interrupted) {
            cli_interrupted = 0;
            if (++interrupts >= 2) break;
            fprintf(stderr, "kipp chat: (Ctrl-C again at the empty prompt, Ctrl-D or /exit quits)\n");
            if (rs == READ_INTERRUPT) continue;
        }
        interrupts = 0;
        line_kind k = classify(line, len, &msg, &msg_len);
        if (k == LINE_EXIT) break;
        if (k == LINE_RESET) {
            if (chat_start(&c, o)) failed = 1;
            kipp_session_reset(s);
            fprintf(stderr, "kipp chat: conversation reset\n");
        } else if (k == LINE_BAD) {
            cli_errorf("chat", "unknown command '%s', expected /reset or /exit "
                               "(start a message with // to send a leading '/')", line);
            failed = 1;
        } else if (k == LINE_MESSAGE) {
            if (chat_turn(m, s, &c, o, &rng, msg, msg_len))
                failed = 1; /* reported; the chat goes on, the exit status remembers */
            if (cli_interrupted) { /* the reply was stopped: this Ctrl-C counts once */
                cli_interrupted = 0;
                interrupts = 1;
            }
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
        kipp_model_close(o.draft);
        kipp_model_close(m);
        return 2;
    }
    /* cli_gen_open rejected a --ctx above the context length; only the default is capped. */
    uint64_t want = 0;
    if (cli_gen_ctx("chat", m, &o, &want)) {
        kipp_model_close(o.draft);
        kipp_model_close(m);
        return 1;
    }
    uint32_t cap = want ? (uint32_t)want : DEFAULT_CHAT_CTX;
    if (cap > info.context_length) cap = info.context_length;
    kipp_session *s = NULL;
    char err[512];
    /* Room for this conversation's blocks plus as many published ones from earlier conversations. */
    uint64_t pool_mib = (2 * (((uint64_t)cap + 31) / 32) * 32 * info.kv_bytes_per_token + (1u << 20) - 1) >> 20;
    if (!o.no_reuse && kipp_model_enable_pool(m, pool_mib, err, sizeof err))
        fprintf(stderr, "kipp chat: no KV pool (%s); /reset starts from an empty cache\n", err);
    else if (o.kv_cache_dir && kipp_model_enable_disk_tier(m, o.kv_cache_dir, o.kv_cache_disk_mib ? o.kv_cache_disk_mib : 4096,
                                                           err, sizeof err)) {
        cli_errorf("chat", "%s", err);
        kipp_model_close(m);
        return 1;
    }
    if (kipp_session_create(m, cap, &s, err, sizeof err)) {
        cli_errorf("chat", "%s", err);
        rc = 1;
    } else {
        fprintf(stderr, "kipp chat: %s on %s, %u-token context; /reset clears, /exit quits, Ctrl-C stops a "
                        "reply\n", info.checkpoint_id, info.backend, cap);
        struct sigaction sa, old;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_sigint; /* no SA_RESTART: a waiting getline returns with EINTR */
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, &old);
        rc = chat_loop(m, s, &o);
        sigaction(SIGINT, &old, NULL);
    }
    kipp_session_destroy(s);
    kipp_model_close(o.draft);
    kipp_model_close(m);
    return rc;
}
