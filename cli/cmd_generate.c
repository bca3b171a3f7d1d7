/*
 * cmd_generate.c - `kipp generate` and `kipp logits`, plus the model opening
 * and streaming loop they share with `kipp chat` (issue 4, item 7); the
 * argument parser is cli/gen_args.c.
 *
 * generate: tokenize (or chat-render) the prompt, prefill it in one session,
 * then sample / evaluate one token at a time, streaming text through the
 * detokenizer, until a registry stop token or --max-tokens. One timings line
 * goes to stderr at the end (monotonic clock).
 *
 * Sampling defaults are greedy (temperature 0): output is reproducible and
 * comparable with the golden vectors. The Qwen3 model cards recommend
 * --temperature 0.6 --top-p 0.95 --top-k 20 for thinking mode and
 * 0.7 / 0.8 / 20 without it; pass them explicitly.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "cli/generate.h"
#include "engine/safe_io.h"

volatile sig_atomic_t cli_interrupted = 0;

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int cli_gen_open(const char *cmd, const cli_gen_opts *o, kipp_model **out)
{
    kipp_model_options mo = {o->threads};
    char err[512];
    kipp_mapped_file_guard(o->model); /* a model truncated while mapped: a clear message, not SIGBUS */
    int rc = kipp_model_open(o->model, o->backend, &mo, out, err, sizeof err);
    if (rc) {
        cli_errorf(cmd, "%s", err);
        return rc == KIPP_EBACKEND ? 2 : 1;
    }
    kipp_model_info info;
    kipp_model_get_info(*out, &info);
    rc = 0;
    for (size_t i = 0; i < o->sp.n_logit_bias && !rc; i++)
        if (o->bias[i].token >= info.vocab_size) {
            fprintf(stderr, "kipp %s: --logit-bias '%s': token %u is out of range, expected an id below %u\n", cmd,
                    o->bias_arg[i], o->bias[i].token, info.vocab_size);
            rc = 2;
        }
    if (!rc && o->ctx > info.context_length) {
        fprintf(stderr, "kipp %s: --ctx '%s' is above the %u-token context length of %s, expected 1..%u\n", cmd,
                o->ctx_arg, info.context_length, info.checkpoint_id, info.context_length);
        rc = 2;
    }
    if (rc) {
        kipp_model_close(*out);
        *out = NULL;
    }
    return rc;
}

const char *cli_gen_hint(int rc)
{
    return rc == KIPP_ENUMERIC ? " (non-finite values: the model file's weights may be corrupt or out of range)" : "";
}

void cli_gen_report(const char *cmd, int rc, const char *err)
{
    cli_errorf(cmd, "%s%s", err && err[0] ? err : kipp_strerror(rc), cli_gen_hint(rc));
}

int cli_gen_tokenize(kipp_model *m, const char *text, size_t len, uint32_t **ids, size_t *n, char *err,
                     size_t errlen)
{
    size_t cap = len + 16; /* byte-level BPE: at most a token per byte */
    *ids = malloc(cap * sizeof **ids);
    if (!*ids) return KIPP_ENOMEM;
    int rc = kipp_tokenize(m, text, len, KIPP_TOK_SPECIAL, *ids, cap, n, err, errlen);
    if (rc == KIPP_ERANGE && *n > cap) { /* defensive: the tokenizer says how many it needs */
        uint32_t *bigger = realloc(*ids, *n * sizeof **ids);
        if (!bigger) return KIPP_ENOMEM;
        *ids = bigger;
        rc = kipp_tokenize(m, text, len, KIPP_TOK_SPECIAL, *ids, *n, n, err, errlen);
    }
    return rc;
}

/* ---- streaming ---- */

static int is_stop(const kipp_model_info *info, uint32_t id)
{
    for (uint32_t i = 0; i < info->n_stop; i++)
        if (info->stop_ids[i] == id) return 1;
    return 0;
}

/* Append bytes to a growing NUL-terminated buffer (*buf may be NULL). */
static int append_text(char **buf, size_t *len, const char *p, size_t n)
{
    char *b = realloc(*buf, *len + n + 1);
    if (!b) return KIPP_ENOMEM;
    memcpy(b + *len, p, n);
    *len += n;
    b[*len] = 0;
    *buf = b;
    return 0;
}

static int append_id(uint32_t **ids, size_t *n, uint32_t id)
{
    uint32_t *b = realloc(*ids, (*n + 1) * sizeof *b);
    if (!b) return KIPP_ENOMEM;
    b[(*n)++] = id;
    *ids = b;
    return 0;
}

static int emit(FILE *out, char **text, size_t *text_len, const char *p, size_t n)
{
    if (n && out) {
        fwrite(p, 1, n, out);
        fflush(out);
    }
    return text ? append_text(text, text_len, p, n) : 0;
}

static int push_token(kipp_detok_stream *ds, uint32_t tok, FILE *out, char **text, size_t *text_len,
                      char *err, size_t errlen)
{
    char buf[256];
    size_t n = 0;
    int rc = kipp_detok_stream_push(ds, tok, buf, sizeof buf, &n, err, errlen);
    return rc ? rc : emit(out, text, text_len, buf, n);
}

/* One generation step: sample from logits with the reply so far as penalty history. */
static int sample_next(const cli_gen_opts *o, const float *logits, uint32_t vocab, const uint32_t *hist,
                       size_t n_hist, kipp_rng *rng, uint32_t *tok, char *err, size_t errlen)
{
    kipp_sample_params sp = o->sp;
    sp.history = hist;
    sp.history_len = n_hist;
    return kipp_sample_ex(logits, vocab, &sp, rng, tok, err, errlen);
}

/* Queue of tokens produced but not yet emitted: one per plain step, up to 17 per speculative step. */
typedef struct {
    uint32_t tok[KIPP_SPEC_K_MAX + 1];
    uint32_t n, next;
} tok_queue;

/* Produce the next tokens after tok (the last emitted, not yet evaluated): one plain
 * decode step, or one speculative step whose context is the prompt + the reply. */
static int next_tokens(kipp_session *s, const cli_gen_opts *o, float *logits, uint32_t vocab, const uint32_t *hist,
                       size_t n_hist, kipp_rng *rng, uint32_t tok, tok_queue *q, cli_reply_stats *st, char *err,
                       size_t errlen)
{
    double t = cli_now();
    int rc;
    q->n = q->next = 0;
    if (!st->spec) {
        rc = kipp_session_eval(s, &tok, 1, logits, err, errlen);
        if (!rc) rc = sample_next(o, logits, vocab, hist, n_hist, rng, &q->tok[0], err, errlen);
        q->n = rc ? 0 : 1;
    } else {
        size_t n_ctx = st->n_prompt_ids + n_hist;
        uint32_t *ctx = malloc(n_ctx * sizeof *ctx);
        if (!ctx) return KIPP_ENOMEM;
        memcpy(ctx, st->prompt_ids, st->n_prompt_ids * sizeof *ctx);
        memcpy(ctx + st->n_prompt_ids, hist, n_hist * sizeof *ctx);
        kipp_sample_params sp = o->sp;
        sp.history = hist, sp.history_len = n_hist;
        rc = kipp_spec_step(st->spec, s, ctx, n_ctx, &sp, rng, o->max_tokens - st->n_generated, q->tok, &q->n, err,
                            errlen);
        free(ctx);
    }
    st->t_decode += cli_now() - t;
    st->n_decode_evals += rc == 0;
    st->n_decode_tokens += q->n;
    return rc;
}

int cli_gen_stream(kipp_model *m, kipp_session *s, const cli_gen_opts *o, float *logits, kipp_rng *rng,
                   FILE *out, uint32_t **ids, size_t *n_ids, char **text, size_t *text_len_out, cli_reply_stats *st,
                   char *err, size_t errlen)
{
    kipp_model_info info;
    kipp_model_get_info(m, &info);
    kipp_detok_stream *ds = kipp_detok_stream_create(m);
    uint32_t *hist = NULL;
    size_t n_hist = 0, text_len = 0;
    tok_queue q = {.n = 0};
    int rc = ds ? 0 : KIPP_ENOMEM;
    if (text) rc = rc ? rc : append_text(text, &text_len, "", 0);
    if (!rc) rc = sample_next(o, logits, info.vocab_size, hist, n_hist, rng, &q.tok[0], err, errlen);
    q.n = rc ? 0 : 1;
    while (!rc) {
        if (cli_interrupted) {
            st->interrupted = 1;
            break;
        }
        uint32_t tok = q.tok[q.next++];
        if (st->n_generated == 0) st->t_first = cli_now() - st->t_start;
        if (is_stop(&info, tok)) {
            st->stopped = 1;
            break;
        }
        rc = append_id(&hist, &n_hist, tok);
        if (!rc && ids) rc = append_id(ids, n_ids, tok);
        if (!rc) rc = push_token(ds, tok, out, text, &text_len, err, errlen);
        if (rc) break;
        if (++st->n_generated >= o->max_tokens) break;
        if (q.next < q.n) continue; /* the session already holds tok: a speculative step evaluated it */
        if (kipp_session_length(s) >= kipp_session_capacity(s)) {
            st->full = 1;
            break;
        }
        rc = next_tokens(s, o, logits, info.vocab_size, hist, n_hist, rng, tok, &q, st, err, errlen);
    }
    if (ds) {
        char buf[256];
        size_t n = 0;
        if (kipp_detok_stream_flush(ds, buf, sizeof buf, &n) == 0 && !rc) rc = emit(out, text, &text_len, buf, n);
    }
    kipp_detok_stream_destroy(ds);
    free(hist);
    if (text_len_out) *text_len_out = text_len;
    if (rc == KIPP_ENOMEM && err && !*err) snprintf(err, errlen, "out of memory while generating");
    return rc;
}

void cli_gen_print_timings(const char *cmd, const kipp_model *m, kipp_session *s, const cli_gen_opts *o,
                           size_t n_prompt, double t_prefill, const cli_reply_stats *st)
{
    kipp_model_info info;
    kipp_model_get_info(m, &info);
    double dec = st->t_decode > 0 ? st->n_decode_tokens / st->t_decode : 0.0;
    char spec[256] = "";
    if (st->spec) {
        kipp_spec_stats ss;
        kipp_spec_get_stats(st->spec, &ss);
        snprintf(spec, sizeof spec, ", spec k %u: acceptance %.1f%% (drafted %llu, accepted %llu, emitted %llu in %llu forwards)",
                 o->spec_k ? o->spec_k : 8u, ss.drafted ? 100.0 * (double)ss.accepted / (double)ss.drafted : 0.0,
                 (unsigned long long)ss.drafted, (unsigned long long)ss.accepted, (unsigned long long)ss.emitted,
                 (unsigned long long)ss.steps);
    }
    fprintf(stderr,
            "kipp %s: prompt %zu tokens, generated %u (%s), prefill %.1f tok/s, decode %.1f tok/s, "
            "TTFT %.1f ms, KV %llu bytes/token, backend %s, seed %llu%s\n",
            cmd, n_prompt, st->n_generated,
            st->interrupted ? "interrupted" : st->stopped ? "stop token" : st->full ? "context full" : "max tokens",
            t_prefill > 0 ? (double)n_prompt / t_prefill : 0.0, dec, st->t_first * 1e3,
            (unsigned long long)info.kv_bytes_per_token, info.backend, (unsigned long long)o->seed, spec);
    if (st->full)
        fprintf(stderr, "kipp %s: stopped early: the session's context of %u tokens is full (--ctx, at most %u)\n",
                cmd, kipp_session_capacity(s), info.context_length);
}

/* ---- kipp generate / kipp logits ---- */

/* The text to tokenize: the prompt itself, or one rendered user turn with --chat. */
static int prompt_text(const char *cmd, kipp_model *m, const cli_gen_opts *o, char **out, size_t *len)
{
    char err[512];
    if (!o->chat) {
        *out = strdup(o->prompt); /* argv: NUL-terminated by construction */
        *len = *out ? strlen(*out) : 0;
        return *out ? 0 : 1;
    }
    kipp_chat_message msg = {.role = KIPP_ROLE_USER, .content = o->prompt};
    kipp_chat_options co = {1, o->think, NULL};
    int rc = kipp_chat_render_n(m, &msg, 1, &co, out, len, err, sizeof err);
    if (!rc) return 0;
    cli_errorf(cmd, "--chat: %s", err);
    return rc == KIPP_ENOTSUP ? 2 : 1;
}

/* Open, render, tokenize: what generate and logits share. Returns an exit status. */
static int prepare(const char *cmd, const cli_gen_opts *o, kipp_model **m, uint32_t **ids, size_t *n)
{
    char *text = NULL, err[512] = "";
    size_t len = 0;
    int rc = cli_gen_open(cmd, o, m);
    if (!rc && o->chat) { /* typed markers in the prompt stay text: only the template's become control ids */
        kipp_chat_message msg = {.role = KIPP_ROLE_USER, .content = o->prompt};
        kipp_chat_options co = {1, o->think, NULL};
        int crc = kipp_chat_tokenize(*m, &msg, 1, &co, ids, n, NULL, NULL, err, sizeof err);
        if (crc) cli_errorf(cmd, "--chat: %s", err), rc = crc == KIPP_ENOTSUP ? 2 : 1;
    } else if (!rc) {
        rc = prompt_text(cmd, *m, o, &text, &len);
    }
    if (!rc && !o->chat && cli_gen_tokenize(*m, text, len, ids, n, err, sizeof err)) {
        cli_errorf(cmd, "tokenizing the prompt: %s", err);
        rc = 1;
    }
    if (!rc && *n == 0) {
        cli_errorf(cmd, "--prompt '%s' gives 0 tokens, expected at least 1", o->prompt);
        rc = 2;
    }
    free(text);
    return rc;
}

/* Capacity --ctx, else want capped at the context length (cli_gen_open bounded --ctx).
 * A prompt that does not fit is reported by the eval itself, before any compute. */
static int session_for(const char *cmd, kipp_model *m, uint64_t ctx, uint64_t want, kipp_session **s)
{
    kipp_model_info info;
    kipp_model_get_info(m, &info);
    char err[512];
    if (ctx) want = ctx;
    uint32_t cap = want < info.context_length ? (uint32_t)want : info.context_length;
    if (kipp_session_create(m, cap, s, err, sizeof err) == 0) return 0;
    cli_errorf(cmd, "%s", err);
    return 1;
}

static void print_ids(const uint32_t *ids, size_t n)
{
    fprintf(stderr, "ids:");
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %u", ids[i]);
    fputc('\n', stderr);
}

static int run_generate(const cli_gen_opts *o, kipp_model *m, const uint32_t *ids, size_t n)
{
    kipp_model_info info;
    kipp_model_get_info(m, &info);
    kipp_session *s = NULL;
    if (session_for("generate", m, o->ctx, (uint64_t)n + o->max_tokens, &s)) return 1;
    float *logits = malloc((size_t)info.vocab_size * sizeof *logits);
    uint32_t *gen = NULL;
    size_t n_gen = 0;
    char err[512] = "";
    cli_reply_stats st = {0};
    kipp_rng rng;
    kipp_rng_seed(&rng, o->seed);
    int rc = logits ? 0 : KIPP_ENOMEM;
    if (!rc && o->spec) {
        kipp_spec_options so = {.k_max = o->spec_k, .fixed_k = o->spec_fixed, .stop_ids = info.stop_ids,
                                .n_stop = info.n_stop};
        rc = kipp_spec_create(m, &so, &st.spec, err, sizeof err);
        st.prompt_ids = ids, st.n_prompt_ids = n;
    }
    st.t_start = cli_now();
    if (!rc) rc = kipp_session_eval(s, ids, (uint32_t)n, logits, err, sizeof err);
    double t_prefill = cli_now() - st.t_start;
    if (!rc) rc = cli_gen_stream(m, s, o, logits, &rng, stdout, &gen, &n_gen, NULL, NULL, &st, err, sizeof err);
    fputc('\n', stdout);
    fflush(stdout);
    if (rc) cli_gen_report("generate", rc, err);
    else cli_gen_print_timings("generate", m, s, o, n, t_prefill, &st);
    if (!rc && o->show_ids) print_ids(gen, n_gen);
    free(gen);
    free(logits);
    kipp_spec_destroy(st.spec);
    kipp_session_destroy(s);
    return rc ? 1 : 0;
}

int cmd_generate(int argc, char **argv)
{
    cli_gen_opts o;
    int rc = cli_gen_parse("generate", argc, argv, &o);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    kipp_model *m = NULL;
    uint32_t *ids = NULL;
    size_t n = 0;
    rc = prepare("generate", &o, &m, &ids, &n);
    if (!rc) rc = run_generate(&o, m, ids, n);
    free(ids);
    kipp_model_close(m);
    return rc;
}

/* Raw little-endian float32, byte by byte so the file is the same on any host;
 * written through a temporary file and refused over the model (engine/safe_io.h). */
static int write_f32le(const char *path, const char *model, const float *x, size_t n, char *err, size_t errlen)
{
    kipp_outfile of;
    int rc = kipp_outfile_open(&of, path, &model, 1, err, errlen);
    if (rc) return rc;
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        unsigned char b[4] = {(unsigned char)u, (unsigned char)(u >> 8), (unsigned char)(u >> 16),
                              (unsigned char)(u >> 24)};
        ok = fwrite(b, 1, 4, of.f) == 4;
    }
    if (!ok) {
        kipp_outfile_abort(&of);
        snprintf(err, errlen, "cannot write output '%s': %s", path, strerror(errno));
        return KIPP_EIO;
    }
    return kipp_outfile_commit(&of, err, errlen);
}

int cmd_logits(int argc, char **argv)
{
    cli_gen_opts o;
    int rc = cli_gen_parse("logits", argc, argv, &o);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    kipp_model *m = NULL;
    uint32_t *ids = NULL;
    size_t n = 0;
    kipp_session *s = NULL;
    char oerr[512];
    if (kipp_out_check(o.out, (const char *const *)&o.model, 1, oerr, sizeof oerr)) {
        cli_errorf("logits", "--out: %s", oerr); /* before any work */
        return 2;
    }
    rc = prepare("logits", &o, &m, &ids, &n);
    if (!rc) rc = session_for("logits", m, 0, n, &s);
    if (!rc) {
        kipp_model_info info;
        kipp_model_get_info(m, &info);
        float *logits = malloc((size_t)info.vocab_size * sizeof *logits);
        char err[512] = "";
        int erc = logits ? kipp_session_eval(s, ids, (uint32_t)n, logits, err, sizeof err) : KIPP_ENOMEM;
        if (erc) cli_gen_report("logits", erc, err);
        else if (write_f32le(o.out, o.model, logits, info.vocab_size, err, sizeof err))
            cli_errorf("logits", "--out: %s", err), erc = 1;
        else
            cli_errorf("logits", "%zu prompt tokens, wrote %u float32 to %s", n, info.vocab_size, o.out);
        rc = erc ? 1 : 0;
        free(logits);
    }
    kipp_session_destroy(s);
    free(ids);
    kipp_model_close(m);
    return rc;
}
