/*
 * cmd_generate.c - `kipp generate` and `kipp logits`, plus the model opening
 * and streaming loop they share with `kipp chat`; the
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/safe_io.h"
#include "cli/cli.h"
#include "cli/generate.h"

volatile sig_atomic_t cli_interrupted = 0;

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Open the draft model into o->draft and check it shares target's tokenizer; an exit status. */
static int open_draft(const char *cmd, cli_gen_opts *o, const kipp_model_options *mo, kipp_model *target)
{
    char err[512];
    if (o->draft_self && kipp_draft_self_path(o->model, o->draft_self, o->draft_path, sizeof o->draft_path, err,
                                              sizeof err)) {
        cli_errorf(cmd, "%s", err);
        return 2;
    }
    const char *path = o->draft_self ? o->draft_path : o->draft_model;
    kipp_mapped_file_guard(path);
    kipp_model_options dmo = *mo;
    dmo.lora = NULL, dmo.n_lora = 0; /* adapters are the target's */
    int rc = kipp_model_open(path, o->backend, &dmo, &o->draft, err, sizeof err);
    if (rc) {
        cli_errorf(cmd, "--draft-model '%s' (drafting for --model '%s'): %s", path, o->model, err);
        return 1;
    }
    if (kipp_draft_check(target, o->draft, err, sizeof err)) {
        cli_errorf(cmd, "--draft-model '%s' cannot draft for --model '%s': %s", path, o->model, err);
        kipp_model_close(o->draft);
        o->draft = NULL;
        return 2;
    }
    return 0;
}

int cli_gen_open(const char *cmd, cli_gen_opts *o, kipp_model **out)
{
    kipp_model_options mo = {.n_threads = o->threads, .lora = o->lora, .n_lora = o->n_lora, .stream = o->stream,
                             .no_prefetch = o->no_prefetch, .rope_override = o->rope_override, .rope = o->rope,
                             .kv_type = o->kv_type};
    char err[512];
    kipp_mapped_file_guard(o->model); /* a model truncated while mapped: a clear message, not SIGBUS */
    int rc = kipp_model_open(o->model, o->backend, &mo, out, err, sizeof err);
    if (rc) {
        cli_model_error(cmd, rc == KIPP_EBACKEND ? NULL : o->model, err);
        return rc == KIPP_EBACKEND ? 2 : 1;
    }
    kipp_model_info info;
    kipp_model_get_info(*out, &info);
    if (info.n_lora)
        fprintf(stderr, "kipp %s: merged %u LoRA adapter(s) into %u tensors (%.1f MiB private RAM) in %.0f ms\n", cmd,
                info.n_lora, info.lora_tensors, info.lora_bytes / 1048576.0, info.lora_merge_ms);
    rc = 0;
    for (size_t i = 0; i < o->sp.n_logit_bias && !rc; i++)
        if (o->bias[i].token >= info.vocab_size) {
            fprintf(stderr, "kipp %s: --logit-bias '%s': token %u is out of range, expected an id below %u\n", cmd,
                    o->bias_arg[i], o->bias[i].token, info.vocab_size);
            rc = 2;
        }
    if (!rc && strcmp(cmd, "logits") && kipp_model_task(*out) != KIPP_TASK_GENERATE) { /* logits stays: it inspects any model */
        fprintf(stderr, "kipp %s: %s is %s model (kipp.variant %s) and does not generate text; use %s\n", cmd,
                info.checkpoint_id, kipp_model_task(*out) == KIPP_TASK_EMBED ? "an embedding" : "a reranker", info.variant,
                kipp_model_task(*out) == KIPP_TASK_EMBED ? "kipp embed" : "kipp-serve's /v1/rerank");
        rc = 2;
    }
    if (!rc && o->ctx > info.context_length) {
        char why[256];
        fprintf(stderr, "kipp %s: --ctx '%s' is above %u tokens, %s; expected 1..%u\n", cmd, o->ctx_arg,
                info.context_length, kipp_context_limit_note(&info, why, sizeof why), info.context_length);
        rc = 2;
    }
    if (!rc && (o->draft_model || o->draft_self)) rc = open_draft(cmd, o, &mo, *out);
    if (rc) {
        kipp_model_close(*out);
        *out = NULL;
    }
    return rc;
}

int cli_gen_ctx(const char *cmd, kipp_model *m, const cli_gen_opts *o, uint64_t *ctx)
{
    *ctx = o->ctx;
    if (!o->ctx_plan) return 0;
    uint32_t c = 0;
    char err[512] = "";
    if (kipp_plan_context(m, &c, err, sizeof err)) {
        cli_errorf(cmd, "--ctx 0: %s", err);
        return 1;
    }
    fprintf(stderr, "kipp %s: --ctx 0: the plan picks a %u-token context (its KV fits a quarter of the usable RAM)\n",
            cmd, c);
    *ctx = c;
    return 0;
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

static int append_ids(uint32_t **ids, size_t *n, const uint32_t *add, size_t k)
{
    if (!k) return 0;
    uint32_t *b = realloc(*ids, (*n + k) * sizeof *b);
    if (!b) return KIPP_ENOMEM;
    memcpy(b + *n, add, k * sizeof *b);
    *n += k;
    *ids = b;
    return 0;
}

/* Write the gen's newly final text to out and to *text (grown, NUL-terminated). */
static int emit_text(const kipp_gen *g, FILE *out, char **text, size_t *text_len, size_t *shown)
{
    const char *p;
    size_t len, fin;
    kipp_gen_text(g, &p, &len, &fin);
    if (fin <= *shown) return 0;
    size_t n = fin - *shown;
    if (out) {
        fwrite(p + *shown, 1, n, out);
        fflush(out);
    }
    if (text) {
        char *b = realloc(*text, *text_len + n + 1);
        if (!b) return KIPP_ENOMEM;
        memcpy(b + *text_len, p + *shown, n);
        *text_len += n;
        b[*text_len] = 0;
        *text = b;
    }
    *shown = fin;
    return 0;
}

/* One step of the batch-of-one loop: the gen's item, evaluated and advanced, timed into st. */
static int step_once(kipp_model *m, kipp_gen *g, kipp_gen_event *ev, cli_reply_stats *st, char *err, size_t errlen)
{
    kipp_batch_item it;
    int prefill = kipp_gen_prompt_left(g) > 0;
    int rc = kipp_gen_next(g, UINT32_MAX, &it, err, errlen); /* a lone prompt prefills in one item */
    double t = cli_now();
    if (!rc && it.token_count) rc = kipp_eval_batch(m, &it, 1, err, errlen);
    double dt = cli_now() - t;
    if (!rc && it.token_count) rc = kipp_gen_advance(g, dt, ev, err, errlen);
    if (rc || !it.token_count) return rc;
    if (prefill) st->t_prefill += dt;
    else st->t_decode += dt, st->n_decode_evals++, st->n_decode_tokens += ev->n_tokens;
    if (!kipp_gen_prompt_left(g)) st->prefilled = 1;
    return 0;
}

static kipp_gen_options gen_options(const cli_gen_opts *o, const kipp_rng *rng)
{
    return (kipp_gen_options){
        .sp = o->sp,
        .rng = rng,
        .max_tokens = o->max_tokens,
        .spec = o->spec,
        .spec_opts = {.k_max = o->spec_k, .fixed_k = o->spec_fixed, .draft_model = o->draft, .draft_min = o->draft_min},
    };
}

/* Map the gen's end onto the reply's stats. */
static void note_finish(int why, cli_reply_stats *st)
{
    st->stopped = why == KIPP_FIN_STOP;
    st->full = why == KIPP_FIN_FULL;
    st->interrupted = why == KIPP_FIN_CANCELLED;
}

int cli_gen_stream(kipp_model *m, kipp_session *s, const cli_gen_opts *o, const uint32_t *prompt, size_t n_prompt,
                   kipp_rng *rng, FILE *out, uint32_t **ids, size_t *n_ids, char **text, size_t *text_len_out,
                   cli_reply_stats *st, char *err, size_t errlen)
{
    kipp_gen *g = NULL;
    kipp_gen_options go = gen_options(o, rng);
    size_t text_len = 0, shown = 0;
    int rc = kipp_gen_create(m, s, prompt, n_prompt, &go, &g, err, errlen);
    if (!rc && text) {
        free(*text);
        rc = (*text = calloc(1, 1)) ? 0 : KIPP_ENOMEM;
    }
    while (!rc && !kipp_gen_finished(g)) {
        if (cli_interrupted && st->prefilled) {
            kipp_gen_cancel(g);
            break;
        }
        kipp_gen_event ev;
        rc = step_once(m, g, &ev, st, err, errlen);
        if (!rc && st->prefilled && st->t_first == 0) st->t_first = cli_now() - st->t_start; /* first sample */
        if (!rc) st->n_generated += ev.n_tokens;
        if (!rc && ids) rc = append_ids(ids, n_ids, ev.tokens, ev.n_tokens);
        if (!rc) rc = emit_text(g, out, text, &text_len, &shown);
    }
    if (!rc) rc = emit_text(g, out, text, &text_len, &shown);
    if (g) {
        note_finish(kipp_gen_finished(g), st);
        if (kipp_gen_spec(g)) st->spec_on = 1, kipp_spec_get_stats(kipp_gen_spec(g), &st->spec_stats);
        kipp_gen_rng(g, rng);
    }
    kipp_gen_destroy(g);
    if (text_len_out) *text_len_out = text_len;
    if (rc == KIPP_ENOMEM && err && !*err) snprintf(err, errlen, "out of memory while generating");
    return rc;
}

void cli_gen_print_timings(const char *cmd, const kipp_model *m, kipp_session *s, const cli_gen_opts *o,
                           size_t n_prompt, const cli_reply_stats *st)
{
    kipp_model_info info;
    kipp_model_get_info(m, &info);
    double dec = st->t_decode > 0 ? st->n_decode_tokens / st->t_decode : 0.0;
    double pre = st->t_prefill > 0 ? (double)n_prompt / st->t_prefill : 0.0;
#define RATE_PREC(r) ((r) < 10 ? 3 : 1) /* streamed models run below 1 tok/s: keep three decimals there */
    char spec[256] = "";
    if (st->spec_on) {
        const kipp_spec_stats ss = st->spec_stats;
        snprintf(spec, sizeof spec, ", %s k %u: acceptance %.1f%% (drafted %llu, accepted %llu, emitted %llu in %llu forwards)",
                 o->draft ? "draft model" : "spec", o->spec_k ? o->spec_k : 8u, ss.drafted ? 100.0 * (double)ss.accepted / (double)ss.drafted : 0.0,
                 (unsigned long long)ss.drafted, (unsigned long long)ss.accepted, (unsigned long long)ss.emitted,
                 (unsigned long long)ss.steps);
    }
    fprintf(stderr,
            "kipp %s: prompt %zu tokens, generated %u (%s), prefill %.*f tok/s, decode %.*f tok/s, "
            "TTFT %.1f ms, KV %llu bytes/token, backend %s, seed %llu, KV type %s%s\n",
            cmd, n_prompt, st->n_generated,
            st->interrupted ? "interrupted" : st->stopped ? "stop token" : st->full ? "context full" : "max tokens",
            RATE_PREC(pre), pre, RATE_PREC(dec), dec, st->t_first * 1e3,
            (unsigned long long)info.kv_bytes_per_token, info.backend, (unsigned long long)o->seed, info.kv_type, spec);
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
static int prepare(const char *cmd, cli_gen_opts *o, kipp_model **m, uint32_t **ids, size_t *n)
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
    kipp_session *s = NULL;
    uint64_t ctx = 0;
    if (cli_gen_ctx("generate", m, o, &ctx) || session_for("generate", m, ctx, (uint64_t)n + o->max_tokens, &s))
        return 1;
    uint32_t *gen = NULL;
    size_t n_gen = 0;
    char err[512] = "";
    cli_reply_stats st = {0};
    kipp_rng rng;
    kipp_rng_seed(&rng, o->seed);
    st.t_start = cli_now();
    int rc = cli_gen_stream(m, s, o, ids, n, &rng, stdout, &gen, &n_gen, NULL, NULL, &st, err, sizeof err);
    fputc('\n', stdout);
    fflush(stdout);
    if (rc) cli_gen_report("generate", rc, err);
    else cli_gen_print_timings("generate", m, s, o, n, &st);
    if (!rc && o->show_ids) print_ids(gen, n_gen);
    free(gen);
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
    kipp_model_close(o.draft);
    kipp_model_close(m);
    return rc;
}

/* Raw little-endian float32, byte by byte so the file is the same on any host;
 * written through a temporary file and refused over the model (base/safe_io.h). */
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
