/*
 * cmd_generate.c - `kipp generate` and `kipp logits`, plus the argument parser
 * and streaming loop they share with `kipp chat` (issue 4, item 7).
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
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "generate.h"

#define DEFAULT_MAX_TOKENS 128u

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- argument parsing ---- */

static void usage(const char *cmd)
{
    fprintf(stderr,
            "usage: kipp %s --model FILE.gguf%s [--backend ref|cpu] [--threads N]%s\n"
            "  sampling: [--temperature T] [--top-p P] [--top-k K] [--min-p M] [--seed S]\n"
            "            [--repeat-penalty R] [--frequency-penalty F] [--presence-penalty F]\n"
            "            [--logit-bias TOKEN_ID=BIAS ...]\n"
            "  defaults: backend cpu, greedy (temperature 0), max-tokens %u; Qwen3 model cards\n"
            "            suggest --temperature 0.6 --top-p 0.95 --top-k 20 for thinking mode\n",
            cmd,
            !strcmp(cmd, "chat") ? "" : " --prompt TEXT",
            !strcmp(cmd, "logits") ? " --out FILE.f32 [--chat] [--no-think]"
            : !strcmp(cmd, "chat") ? " [--max-tokens N] [--ctx N] [--no-think] [--no-cache-reuse]"
                                   : " [--chat] [--no-think] [--max-tokens N] [--show-ids]",
            DEFAULT_MAX_TOKENS);
}

static int bad_arg(const char *cmd, const char *flag, const char *val, const char *expect)
{
    fprintf(stderr, "kipp %s: %s '%s' is invalid, expected %s\n", cmd, flag, val ? val : "(missing)", expect);
    return 2;
}

static int parse_float(const char *s, float *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end) return -1;
    *out = (float)v;
    return 0;
}

static int parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    errno = 0;
    if (*s == '-' || *s == '+') return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || v > max) return -1;
    *out = v;
    return 0;
}

/* "--logit-bias ID=BIAS": an additive bias on one token (OpenAI logit_bias). */
static int parse_bias(const char *cmd, const char *v, cli_gen_opts *o)
{
    const char *eq = strchr(v, '=');
    char id[32];
    uint64_t tok;
    float b;
    if (!eq || eq == v || (size_t)(eq - v) >= sizeof id) return bad_arg(cmd, "--logit-bias", v, "TOKEN_ID=BIAS");
    memcpy(id, v, (size_t)(eq - v));
    id[eq - v] = 0;
    if (parse_u64(id, UINT32_MAX, &tok) || parse_float(eq + 1, &b))
        return bad_arg(cmd, "--logit-bias", v, "TOKEN_ID=BIAS with an integer id and a number");
    if (o->sp.n_logit_bias >= CLI_MAX_BIAS) return bad_arg(cmd, "--logit-bias", v, "at most 64 entries");
    o->bias[o->sp.n_logit_bias++] = (kipp_logit_bias){(uint32_t)tok, b};
    o->sp.logit_bias = o->bias;
    return 0;
}

/* One "--flag VALUE" option; returns 0, 2 on a bad value, 1 when flag is not a value option. */
static int parse_value_opt(const char *cmd, const char *f, const char *v, cli_gen_opts *o)
{
    uint64_t u = 0;
    float *fp = !strcmp(f, "--temperature") ? &o->sp.temperature : !strcmp(f, "--top-p") ? &o->sp.top_p
              : !strcmp(f, "--min-p") ? &o->sp.min_p : !strcmp(f, "--repeat-penalty") ? &o->sp.repetition_penalty
              : !strcmp(f, "--frequency-penalty") ? &o->sp.frequency_penalty
              : !strcmp(f, "--presence-penalty") ? &o->sp.presence_penalty : NULL;
    if (fp) return parse_float(v, fp) ? bad_arg(cmd, f, v, "a number") : 0;
    if (!strcmp(f, "--model")) o->model = v;
    else if (!strcmp(f, "--prompt")) o->prompt = v;
    else if (!strcmp(f, "--backend")) o->backend = v;
    else if (!strcmp(f, "--out")) o->out = v;
    else if (!strcmp(f, "--logit-bias")) return parse_bias(cmd, v, o);
    else if (!strcmp(f, "--seed")) return parse_u64(v, UINT64_MAX, &o->seed) ? bad_arg(cmd, f, v, "an unsigned integer") : 0;
    else if (!strcmp(f, "--top-k")) {
        if (parse_u64(v, 1u << 30, &u)) return bad_arg(cmd, f, v, "an integer >= 0 (0 = off)");
        o->sp.top_k = (int)u;
    } else if (!strcmp(f, "--max-tokens")) {
        if (parse_u64(v, 1u << 30, &u) || u == 0) return bad_arg(cmd, f, v, "an integer >= 1");
        o->max_tokens = (uint32_t)u;
    } else if (!strcmp(f, "--threads")) {
        if (parse_u64(v, 4096, &u)) return bad_arg(cmd, f, v, "an integer 0..4096 (0 = one per core)");
        o->threads = (int)u;
    } else if (!strcmp(f, "--ctx")) {
        if (parse_u64(v, UINT32_MAX, &u) || u == 0) return bad_arg(cmd, f, v, "an integer >= 1 (tokens)");
        o->ctx = (uint32_t)u;
    } else
        return 1;
    return 0;
}

/* Range checks reuse the sampler's own validation, so CLI and engine agree. */
static int check_sampling(const char *cmd, const cli_gen_opts *o)
{
    float dummy = 0.0f;
    uint32_t tok;
    kipp_rng rng;
    kipp_rng_seed(&rng, 0);
    char err[256];
    kipp_sample_params sp = o->sp;
    sp.n_logit_bias = 0; /* bias ids are checked against the vocabulary once the model is open */
    for (size_t i = 0; i < o->sp.n_logit_bias; i++)
        if (!isfinite(o->bias[i].bias)) {
            fprintf(stderr, "kipp %s: --logit-bias for token %u is %g, expected a finite number\n", cmd,
                    o->bias[i].token, (double)o->bias[i].bias);
            return 2;
        }
    if (kipp_sample_ex(&dummy, 1, &sp, &rng, &tok, err, sizeof err) == 0) return 0;
    fprintf(stderr, "kipp %s: %s\n", cmd, err);
    return 2;
}

int cli_gen_parse(const char *cmd, int argc, char **argv, cli_gen_opts *o)
{
    memset(o, 0, sizeof *o);
    o->backend = "cpu";
    o->think = 1;
    o->max_tokens = DEFAULT_MAX_TOKENS;
    o->sp = kipp_sample_params_default();
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) return usage(cmd), 2;
        if (!strcmp(f, "--chat")) { o->chat = 1; continue; }
        if (!strcmp(f, "--no-think")) { o->think = 0; continue; }
        if (!strcmp(f, "--show-ids")) { o->show_ids = 1; continue; }
        if (!strcmp(f, "--no-cache-reuse")) { o->no_reuse = 1; continue; }
        if (i + 1 >= argc) {
            if (f[0] == '-' && f[1] == '-') return bad_arg(cmd, f, NULL, "a value after it");
            usage(cmd);
            return bad_arg(cmd, "argument", f, "one of the options above");
        }
        int rc = parse_value_opt(cmd, f, argv[i + 1], o);
        if (rc == 1) {
            usage(cmd);
            return bad_arg(cmd, "argument", f, "one of the options above");
        }
        if (rc) return rc;
        i++;
    }
    if (!o->model) return usage(cmd), bad_arg(cmd, "--model", NULL, "a .gguf path");
    if (strcmp(cmd, "chat") && !o->prompt) return usage(cmd), bad_arg(cmd, "--prompt", NULL, "the prompt text");
    if (!strcmp(cmd, "logits") && !o->out) return usage(cmd), bad_arg(cmd, "--out", NULL, "an output file");
    return check_sampling(cmd, o);
}

int cli_gen_open(const char *cmd, const cli_gen_opts *o, kipp_model **out)
{
    kipp_model_options mo = {o->threads};
    char err[512];
    int rc = kipp_model_open(o->model, o->backend, &mo, out, err, sizeof err);
    if (rc) {
        fprintf(stderr, "kipp %s: %s\n", cmd, err);
        return rc == KIPP_EBACKEND ? 2 : 1;
    }
    kipp_model_info info;
    kipp_model_get_info(*out, &info);
    for (size_t i = 0; i < o->sp.n_logit_bias; i++)
        if (o->bias[i].token >= info.vocab_size) {
            fprintf(stderr, "kipp %s: --logit-bias token %u is out of range, expected an id below %u\n", cmd,
                    o->bias[i].token, info.vocab_size);
            kipp_model_close(*out);
            *out = NULL;
            return 2;
        }
    return 0;
}

int cli_gen_tokenize(kipp_model *m, const char *text, uint32_t **ids, size_t *n, char *err, size_t errlen)
{
    size_t len = strlen(text), cap = len + 16; /* byte-level BPE: at most a token per byte */
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

int cli_gen_stream(kipp_model *m, kipp_session *s, const cli_gen_opts *o, float *logits, kipp_rng *rng,
                   FILE *out, uint32_t **ids, size_t *n_ids, char **text, cli_reply_stats *st, char *err,
                   size_t errlen)
{
    kipp_model_info info;
    kipp_model_get_info(m, &info);
    kipp_detok_stream *ds = kipp_detok_stream_create(m);
    uint32_t *hist = NULL;
    size_t n_hist = 0, text_len = 0;
    int rc = ds ? 0 : KIPP_ENOMEM;
    if (text) rc = rc ? rc : append_text(text, &text_len, "", 0);
    while (!rc) {
        uint32_t tok;
        rc = sample_next(o, logits, info.vocab_size, hist, n_hist, rng, &tok, err, errlen);
        if (rc) break;
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
        if (kipp_session_length(s) >= kipp_session_capacity(s)) {
            st->full = 1;
            break;
        }
        double t = cli_now();
        rc = kipp_session_eval(s, &tok, 1, logits, err, errlen);
        st->t_decode += cli_now() - t;
        st->n_decode_evals += rc == 0;
    }
    if (ds) {
        char buf[256];
        size_t n = 0;
        if (kipp_detok_stream_flush(ds, buf, sizeof buf, &n) == 0 && !rc) rc = emit(out, text, &text_len, buf, n);
    }
    kipp_detok_stream_destroy(ds);
    free(hist);
    if (rc == KIPP_ENOMEM && err && !*err) snprintf(err, errlen, "out of memory while generating");
    return rc;
}

void cli_gen_print_timings(const char *cmd, const kipp_model *m, size_t n_prompt, double t_prefill,
                           const cli_reply_stats *st)
{
    kipp_model_info info;
    kipp_model_get_info(m, &info);
    double dec = st->t_decode > 0 ? st->n_decode_evals / st->t_decode : 0.0;
    fprintf(stderr,
            "kipp %s: prompt %zu tokens, generated %u (%s), prefill %.1f tok/s, decode %.1f tok/s, "
            "TTFT %.1f ms, KV %llu bytes/token, backend %s\n",
            cmd, n_prompt, st->n_generated, st->stopped ? "stop token" : st->full ? "context full" : "max tokens",
            t_prefill > 0 ? (double)n_prompt / t_prefill : 0.0, dec, st->t_first * 1e3,
            (unsigned long long)info.kv_bytes_per_token, info.backend);
}

/* ---- kipp generate / kipp logits ---- */

/* The text to tokenize: the prompt itself, or one rendered user turn with --chat. */
static int prompt_text(const char *cmd, kipp_model *m, const cli_gen_opts *o, char **out)
{
    char err[512];
    if (!o->chat) {
        *out = strdup(o->prompt);
        return *out ? 0 : 1;
    }
    kipp_chat_message msg = {KIPP_ROLE_USER, o->prompt, NULL, NULL, 0};
    kipp_chat_options co = {1, o->think, NULL};
    int rc = kipp_chat_render(m, &msg, 1, &co, out, err, sizeof err);
    if (!rc) return 0;
    fprintf(stderr, "kipp %s: --chat: %s\n", cmd, err);
    return rc == KIPP_ENOTSUP ? 2 : 1;
}

/* Open, render, tokenize: what generate and logits share. Returns an exit status. */
static int prepare(const char *cmd, const cli_gen_opts *o, kipp_model **m, uint32_t **ids, size_t *n)
{
    char *text = NULL, err[512] = "";
    int rc = cli_gen_open(cmd, o, m);
    if (!rc) rc = prompt_text(cmd, *m, o, &text);
    if (!rc && cli_gen_tokenize(*m, text, ids, n, err, sizeof err)) {
        fprintf(stderr, "kipp %s: tokenizing the prompt: %s\n", cmd, err);
        rc = 1;
    }
    if (!rc && *n == 0) {
        fprintf(stderr, "kipp %s: --prompt '%s' gives 0 tokens, expected at least 1\n", cmd, o->prompt);
        rc = 2;
    }
    free(text);
    return rc;
}

/* A prompt that does not fit is reported by the eval itself, before any compute. */
static int session_for(const char *cmd, kipp_model *m, uint64_t want, kipp_session **s)
{
    kipp_model_info info;
    kipp_model_get_info(m, &info);
    char err[512];
    uint32_t cap = want < info.context_length ? (uint32_t)want : info.context_length;
    if (kipp_session_create(m, cap, s, err, sizeof err) == 0) return 0;
    fprintf(stderr, "kipp %s: %s\n", cmd, err);
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
    if (session_for("generate", m, (uint64_t)n + o->max_tokens, &s)) return 1;
    float *logits = malloc((size_t)info.vocab_size * sizeof *logits);
    uint32_t *gen = NULL;
    size_t n_gen = 0;
    char err[512] = "";
    cli_reply_stats st = {0};
    kipp_rng rng;
    kipp_rng_seed(&rng, o->seed);
    st.t_start = cli_now();
    int rc = logits ? kipp_session_eval(s, ids, (uint32_t)n, logits, err, sizeof err) : KIPP_ENOMEM;
    double t_prefill = cli_now() - st.t_start;
    if (!rc) rc = cli_gen_stream(m, s, o, logits, &rng, stdout, &gen, &n_gen, NULL, &st, err, sizeof err);
    fputc('\n', stdout);
    fflush(stdout);
    if (rc) fprintf(stderr, "kipp generate: %s\n", err[0] ? err : kipp_strerror(rc));
    else cli_gen_print_timings("generate", m, n, t_prefill, &st);
    if (!rc && o->show_ids) print_ids(gen, n_gen);
    free(gen);
    free(logits);
    kipp_session_destroy(s);
    return rc ? 1 : 0;
}

int cmd_generate(int argc, char **argv)
{
    cli_gen_opts o;
    int rc = cli_gen_parse("generate", argc, argv, &o);
    if (rc) return rc;
    kipp_model *m = NULL;
    uint32_t *ids = NULL;
    size_t n = 0;
    rc = prepare("generate", &o, &m, &ids, &n);
    if (!rc) rc = run_generate(&o, m, ids, n);
    free(ids);
    kipp_model_close(m);
    return rc;
}

/* Raw little-endian float32, byte by byte so the file is the same on any host. */
static int write_f32le(const char *path, const float *x, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        unsigned char b[4] = {(unsigned char)u, (unsigned char)(u >> 8), (unsigned char)(u >> 16),
                              (unsigned char)(u >> 24)};
        ok = fwrite(b, 1, 4, f) == 4;
    }
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

int cmd_logits(int argc, char **argv)
{
    cli_gen_opts o;
    int rc = cli_gen_parse("logits", argc, argv, &o);
    if (rc) return rc;
    kipp_model *m = NULL;
    uint32_t *ids = NULL;
    size_t n = 0;
    kipp_session *s = NULL;
    rc = prepare("logits", &o, &m, &ids, &n);
    if (!rc) rc = session_for("logits", m, n, &s);
    if (!rc) {
        kipp_model_info info;
        kipp_model_get_info(m, &info);
        float *logits = malloc((size_t)info.vocab_size * sizeof *logits);
        char err[512] = "";
        int erc = logits ? kipp_session_eval(s, ids, (uint32_t)n, logits, err, sizeof err) : KIPP_ENOMEM;
        if (erc) fprintf(stderr, "kipp logits: %s\n", err[0] ? err : kipp_strerror(erc));
        else if (write_f32le(o.out, logits, info.vocab_size))
            fprintf(stderr, "kipp logits: cannot write --out '%s': %s\n", o.out, strerror(errno)), erc = 1;
        else
            fprintf(stderr, "kipp logits: %zu prompt tokens, wrote %u float32 to %s\n", n, info.vocab_size, o.out);
        rc = erc ? 1 : 0;
        free(logits);
    }
    kipp_session_destroy(s);
    free(ids);
    kipp_model_close(m);
    return rc;
}
