/*
 * gen_args.c - the argument parser shared by `kipp generate`, `kipp chat` and
 * `kipp logits` (cli_gen_parse in generate.h).
 *
 * One table lists every option, the commands that use it and its help text,
 * so the usage each command prints and the options it accepts cannot drift
 * apart: an option another command uses is rejected by name ("does not
 * apply"), never accepted and ignored. The sampling options come from the
 * engine's one table of sampling fields (kipp_sample_fields: flag, range,
 * default), which kipp-serve and the sampler use too. Values are range-checked
 * here, with the flag and the text as the user wrote it in the message, and
 * the sampler's own check runs afterwards as a backstop.
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/generate.h"

enum { C_GEN = 1, C_CHAT = 2, C_LOGITS = 4, C_ALL = 7, C_SAMPLE = C_GEN | C_CHAT };

/** One command-line option: the commands using it and its usage line. */
typedef struct {
    const char *flag;
    const char *arg;  /* value placeholder, NULL for a switch */
    unsigned cmds;    /* C_* mask */
    const char *help; /* range and default */
} opt_def;

static const opt_def OPTS[] = {
    {"--model", "FILE.gguf", C_ALL, "the model file (required)"},
    {"--prompt", "TEXT", C_GEN | C_LOGITS, "the prompt text (required)"},
    {"--out", "FILE.f32", C_LOGITS, "where the final row's logits go, little-endian float32 (required)"},
    {"--backend", "NAME", C_ALL, /* usage() prints this build's backends instead */ "compute backend; default cpu (ref: scalar FP32 oracle, single-threaded; "
                                          "cuda: NVIDIA GPU, in the build/cuda binaries of `make cuda`)"},
    {"--threads", "N", C_ALL, "cpu worker threads, 0..1024; default 0 = one per physical core;\n"
                              "      ref is single-threaded and accepts only 1"},
    {"--chat", NULL, C_GEN | C_LOGITS, "render the prompt as one user turn of the chat template"},
    {"--no-think", NULL, C_ALL, "hybrid templates: disable thinking (generate/logits: needs --chat)"},
    {"--max-tokens", "N", C_SAMPLE, "tokens generated per reply, 1..1073741824 (2^30); default 128"},
    {"--ctx", "N", C_SAMPLE, "session capacity in tokens, 1..the model's context length, or 0: the context\n"
                             "      `kipp plan` picks (KV in a quarter of the usable RAM); default\n"
                             "      generate: prompt + max-tokens, chat: 8192 (both capped at the context\n"
                             "      length); generation stops with a note when the context is full"},
    {"--show-ids", NULL, C_GEN, "print the generated token ids to stderr"},
    {"--spec", NULL, C_GEN, "prompt-lookup speculative decoding: the exact greedy output in fewer forwards;\n"
                            "      needs deterministic sampling (temperature 0, the default, or top-k 1)"},
    {"--spec-k", "N", C_GEN, "with --spec: longest draft, 1..16 tokens; default 8"},
    {"--spec-fixed", NULL, C_GEN, "with --spec: always draft up to --spec-k (no adaptive gate)"},
    {"--no-spec", NULL, C_SAMPLE, "plain decoding, one token per forward (the default here; kipp-serve's flag,\n"
                                  "      whose default is prompt lookup); refused with --spec or a draft model"},
    {"--draft-model", "FILE.gguf", C_SAMPLE, "draft-model speculative decoding: FILE (same tokenizer, e.g. a\n"
                                            "      smaller or quantized model) drafts, --model verifies; greedy output is\n"
                                            "      the plain output bitwise, sampled output keeps its distribution\n"
                                            "      (speculative sampling); the gate turns drafting off where it does not pay"},
    {"--draft-self", "q8_0|affine4", C_SAMPLE, "as --draft-model with the converter's quantized twin of --model\n"
                                               "      next to it (X.gguf: X-q8_0-head_q8_0.gguf, else X-q8_0.gguf;\n"
                                               "      likewise X-affine4_gs32[-head_affine4_gs32].gguf)"},
    {"--draft-max", "N", C_SAMPLE, "with a draft model: longest draft, 1..16 tokens; default 8"},
    {"--draft-min", "N", C_SAMPLE, "with a draft model: a draft the gate allows is at least N tokens, 1..--draft-max"},
    {"--system", "TEXT", C_CHAT, "a system message opening the conversation; it is always kept when the\n"
                                 "      oldest turns are dropped to fit --ctx"},
    {"--no-cache-reuse", NULL, C_CHAT, "re-evaluate the whole conversation every turn (a test oracle)"},
    {"--kv-cache-dir", "DIR", C_CHAT, "a disk tier under the KV pool: published blocks are written to DIR\n"
                                       "      (created 0700) and a later conversation or `kipp chat` process adopts them\n"
                                       "      (kipp-serve's option, docs/SERVING.md); default off"},
    {"--kv-cache-disk-mib", "N", C_CHAT, "with --kv-cache-dir: its size in MiB, 1..2^30; default 4096"},
    {"--seed", "S", C_SAMPLE, "0..2^64-1; default 0, so unseeded runs repeat; printed in the timings line"},
    {"--logit-bias", "ID=BIAS", C_SAMPLE, "add BIAS in [-100, 100] to token ID's logit; repeatable, at most 64"},
    {"--lora", "PATH[:SCALE]", C_ALL, "merge a LoRA adapter GGUF into the weights at load, scaled (default 1);\n"
                                     "      repeatable, at most 8 (their deltas add up)"},
    {"--stream", "auto|on|off", C_ALL, "read the weights through the file mapping per token instead of a packed\n"
                                      "      copy (models larger than RAM); default auto: when they exceed 0.75 x\n"
                                      "      available RAM (`kipp plan` says which), else KIPP_STREAM"},
    {"--no-prefetch", NULL, C_ALL, "streamed: no one-layer-ahead madvise(MADV_WILLNEED) prefetch thread"},
    {"--rope-scaling", "none|yarn:F[:ORIG]", C_ALL, "RoPE scaling instead of the file's: YaRN with factor F over ORIG original\n"
                                                   "      context tokens (default ORIG: the model card's, e.g. 32768, else the file's\n"
                                                   "      context length), so --ctx may reach ORIG x F; none turns it off"},
    {"--kv-type", "bf16|q8_0", C_ALL, "the KV cache's type: q8_0 keeps int8 values and an fp16 scale per 32\n"
                                     "      (34/64 of bf16's bytes per token, so about twice the context per GiB);\n"
                                     "      default bf16"},
    {"--help", NULL, C_ALL, "print this help and exit"},
};
#define N_OPTS (sizeof OPTS / sizeof OPTS[0])

/* OpenAI's logit_bias range; with it no finite logit can overflow when biased. */
#define MAX_ABS_BIAS 100.0

static unsigned cmd_bit(const char *cmd)
{
    return !strcmp(cmd, "generate") ? C_GEN : !strcmp(cmd, "chat") ? C_CHAT : C_LOGITS;
}

static void usage(const char *cmd, FILE *f)
{
    unsigned bit = cmd_bit(cmd);
    fprintf(f, "usage: kipp %s [OPTIONS]%s\n\noptions:\n", cmd,
            bit == C_CHAT ? " < MESSAGES\n  reads one user message per line; /reset clears the conversation,\n"
                            "  /exit (or end of input) quits, a leading // sends a literal '/';\n"
                            "  Ctrl-C stops a reply, a second Ctrl-C at the empty prompt quits;\n"
                            "  exit status 1 when any turn failed or a line was rejected"
                          : "");
    char backends[128];
    kipp_backend_names(backends, sizeof backends, "|");
    for (size_t i = 0; i < N_OPTS; i++) {
        const char *arg = strcmp(OPTS[i].flag, "--backend") ? OPTS[i].arg : backends;
        if (OPTS[i].cmds & bit)
            fprintf(f, "  %s%s%s\n      %s\n", OPTS[i].flag, arg ? " " : "", arg ? arg : "", OPTS[i].help);
    }
    size_t n_sf;
    const kipp_sample_field *sf = kipp_sample_fields(&n_sf);
    for (size_t i = 0; i < n_sf && (bit & C_SAMPLE); i++)
        fprintf(f, "  %s %s\n      %s; default %s (kipp-serve: \"%s\")\n", sf[i].flag, sf[i].metavar, sf[i].expect,
                sf[i].dflt, sf[i].name);
    if (bit != C_LOGITS)
        fprintf(f, "\nQwen3 model cards suggest --temperature 0.6 --top-p 0.95 --top-k 20 for thinking mode\n"
                   "and 0.7 / 0.8 / 20 without it.\n");
}

static int bad_arg(const char *cmd, const char *flag, const char *val, const char *expect)
{
    cli_errorf(cmd, "%s '%s' is invalid, expected %s", flag, val, expect);
    return 2;
}

/* A decimal float whose magnitude fits a float, so "1e39" is named, not "inf". */
static int parse_float(const char *s, double lo, double hi, int lo_open, float *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || fabs(v) > FLT_MAX) return -1;
    if (v < lo || v > hi || (lo_open && v == lo)) return -1;
    *out = (float)v;
    return 0;
}

static int parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    errno = 0;
    if (*s < '0' || *s > '9') return -1; /* strtoull would accept "-1", " 1", "+1" */
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > max) return -1;
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
    if (parse_u64(id, UINT32_MAX, &tok) || parse_float(eq + 1, -MAX_ABS_BIAS, MAX_ABS_BIAS, 0, &b))
        return bad_arg(cmd, "--logit-bias", v, "TOKEN_ID=BIAS with an integer id and a finite BIAS in [-100, 100]");
    if (o->sp.n_logit_bias >= CLI_MAX_BIAS) return bad_arg(cmd, "--logit-bias", v, "at most 64 entries");
    o->bias_arg[o->sp.n_logit_bias] = v;
    o->bias[o->sp.n_logit_bias++] = (kipp_logit_bias){(uint32_t)tok, b};
    o->sp.logit_bias = o->bias;
    return 0;
}

/* "--lora PATH[:SCALE]": one adapter merged at open (kipp_lora_parse_arg). */
static int parse_lora(const char *cmd, const char *v, cli_gen_opts *o)
{
    char err[256];
    if (o->n_lora >= CLI_MAX_LORA) return bad_arg(cmd, "--lora", v, "at most 8 adapters");
    if (kipp_lora_parse_arg(v, &o->lora[o->n_lora], o->lora_path[o->n_lora], CLI_LORA_PATH, err, sizeof err)) {
        cli_errorf(cmd, "%s", err);
        return 2;
    }
    o->n_lora++;
    return 0;
}

static int parse_int_opt(const char *cmd, const char *f, const char *v, cli_gen_opts *o)
{
    uint64_t u = 0;
    if (!strcmp(f, "--seed")) {
        if (parse_u64(v, UINT64_MAX, &o->seed)) return bad_arg(cmd, f, v, "an integer in 0..18446744073709551615");
    } else if (!strcmp(f, "--max-tokens")) {
        if (parse_u64(v, 1u << 30, &u) || u == 0) return bad_arg(cmd, f, v, "an integer in 1..1073741824 (2^30)");
        o->max_tokens = (uint32_t)u;
    } else if (!strcmp(f, "--kv-cache-disk-mib")) {
        if (parse_u64(v, 1u << 30, &o->kv_cache_disk_mib) || o->kv_cache_disk_mib == 0)
            return bad_arg(cmd, f, v, "an integer in 1..1073741824 (MiB)");
    } else if (!strcmp(f, "--draft-max") || !strcmp(f, "--draft-min")) {
        if (parse_u64(v, KIPP_SPEC_K_MAX, &u) || u == 0) return bad_arg(cmd, f, v, "an integer in 1..16 (draft tokens)");
        if (f[9] == 'a') o->spec_k = (uint32_t)u;
        else o->draft_min = (uint32_t)u;
    } else if (!strcmp(f, "--spec-k")) {
        if (parse_u64(v, KIPP_SPEC_K_MAX, &u) || u == 0) return bad_arg(cmd, f, v, "an integer in 1..16 (draft tokens)");
        o->spec_k = (uint32_t)u;
    } else if (!strcmp(f, "--threads")) {
        if (parse_u64(v, CLI_MAX_THREADS, &u))
            return bad_arg(cmd, f, v, "an integer in 0..1024 (0 = one per physical core)");
        o->threads = (int)u;
        o->threads_arg = v;
    } else if (!strcmp(f, "--ctx")) {
        /* The upper bound is the model's context length, checked once it is open. */
        if (parse_u64(v, UINT32_MAX, &o->ctx))
            return bad_arg(cmd, f, v, "an integer: 0 (the planner's context) or 1..the model's context length (tokens)");
        o->ctx_plan = o->ctx == 0;
        o->ctx_arg = v;
    } else {
        fprintf(stderr, "kipp %s: internal error: option %s has no parser\n", cmd, f);
        return 2;
    }
    return 0;
}

/* A sampling option: an integer or a float within its row's range. */
static int parse_sample_field(const char *cmd, const kipp_sample_field *sf, const char *v, cli_gen_opts *o)
{
    uint64_t u = 0;
    float x = 0.0f;
    if (sf->is_int ? parse_u64(v, (uint64_t)sf->hi, &u) || (double)u < sf->lo : parse_float(v, sf->lo, sf->hi, 0, &x))
        return bad_arg(cmd, sf->flag, v, sf->expect);
    kipp_sample_field_set(&o->sp, sf, sf->is_int ? (double)u : (double)x);
    return 0;
}

/* One "--flag VALUE" option known to apply to cmd; returns 0 or 2. */
static int parse_value_opt(const char *cmd, const char *f, const char *v, cli_gen_opts *o)
{
    const kipp_sample_field *sf = kipp_sample_field_find(f);
    if (sf) return parse_sample_field(cmd, sf, v, o);
    if (!strcmp(f, "--model")) o->model = v;
    else if (!strcmp(f, "--prompt")) o->prompt = v;
    else if (!strcmp(f, "--backend")) o->backend = v;
    else if (!strcmp(f, "--out")) o->out = v;
    else if (!strcmp(f, "--system")) o->system = v;
    else if (!strcmp(f, "--kv-cache-dir")) o->kv_cache_dir = v;
    else if (!strcmp(f, "--draft-model")) o->draft_model = v, o->spec = 1;
    else if (!strcmp(f, "--draft-self")) {
        if (strcmp(v, "q8_0") && strcmp(v, "affine4")) return bad_arg(cmd, f, v, "q8_0 or affine4");
        o->draft_self = v, o->spec = 1;
    }
    else if (!strcmp(f, "--logit-bias")) return parse_bias(cmd, v, o);
    else if (!strcmp(f, "--lora")) return parse_lora(cmd, v, o);
    else if (!strcmp(f, "--kv-type")) {
        char err[256];
        if (kipp_kv_type_parse(v, &o->kv_type, err, sizeof err)) return cli_errorf(cmd, "%s", err), 2;
    } else if (!strcmp(f, "--rope-scaling")) {
        char err[384];
        if (kipp_rope_scaling_parse(v, &o->rope, err, sizeof err)) return cli_errorf(cmd, "%s", err), 2;
        o->rope_override = 1;
    } else if (!strcmp(f, "--stream")) {
        if (!strcmp(v, "auto")) o->stream = KIPP_STREAM_AUTO;
        else if (!strcmp(v, "on")) o->stream = KIPP_STREAM_ON;
        else if (!strcmp(v, "off")) o->stream = KIPP_STREAM_OFF;
        else return bad_arg(cmd, f, v, "auto, on or off");
    } else return parse_int_opt(cmd, f, v, o);
    return 0;
}

static void set_switch(const char *f, cli_gen_opts *o)
{
    if (!strcmp(f, "--chat")) o->chat = 1;
    else if (!strcmp(f, "--no-prefetch")) o->no_prefetch = 1;
    else if (!strcmp(f, "--no-think")) o->think = 0;
    else if (!strcmp(f, "--show-ids")) o->show_ids = 1;
    else if (!strcmp(f, "--no-cache-reuse")) o->no_reuse = 1;
    else if (!strcmp(f, "--spec")) o->spec = 1;
    else if (!strcmp(f, "--no-spec")) o->no_spec = 1;
    else if (!strcmp(f, "--spec-fixed")) o->spec_fixed = 1;
}

/* Backstop: the sampler's own validation must accept what the ranges above let through. */
static int check_sampling(const char *cmd, const cli_gen_opts *o)
{
    float dummy = 0.0f;
    uint32_t tok;
    kipp_rng rng;
    kipp_rng_seed(&rng, 0);
    char err[256];
    kipp_sample_params sp = o->sp;
    sp.n_logit_bias = 0; /* bias ids are checked against the vocabulary once the model is open */
    if (kipp_sample_ex(&dummy, 1, &sp, &rng, &tok, err, sizeof err) == 0) return 0;
    cli_errorf(cmd, "sampling options rejected: %s", err);
    return 2;
}

/* Requirements and combinations, once every option is read. */
static int check_combination(const char *cmd, const cli_gen_opts *o)
{
    unsigned bit = cmd_bit(cmd);
    if (!o->model) return cli_missing(cmd, "--model", "a .gguf path");
    if (o->kv_cache_disk_mib && !o->kv_cache_dir) {
        fprintf(stderr, "kipp %s: --kv-cache-disk-mib sizes the disk tier, which is off; add --kv-cache-dir DIR\n", cmd);
        return 2;
    }
    if (o->kv_cache_dir && o->no_reuse) {
        fprintf(stderr, "kipp %s: --kv-cache-dir sits under the KV pool, which --no-cache-reuse turns off; drop one\n", cmd);
        return 2;
    }
    if (bit != C_CHAT && !o->prompt) return cli_missing(cmd, "--prompt", "the prompt text");
    if (bit == C_LOGITS && !o->out) return cli_missing(cmd, "--out", "an output file");
    if (bit != C_CHAT && !o->think && !o->chat) {
        fprintf(stderr, "kipp %s: --no-think applies to the chat template, expected it together with --chat\n", cmd);
        return 2;
    }
    int draft = o->draft_model || o->draft_self;
    if (o->no_spec && o->spec) {
        fprintf(stderr, "kipp %s: --no-spec turns speculative decoding off and %s turns it on, expected one of them\n",
                cmd, o->draft_model ? "--draft-model" : o->draft_self ? "--draft-self" : "--spec");
        return 2;
    }
    if (o->draft_model && o->draft_self) {
        fprintf(stderr, "kipp %s: --draft-model and --draft-self both name a draft, expected one of them\n", cmd);
        return 2;
    }
    if (!draft && o->draft_min) {
        fprintf(stderr, "kipp %s: --draft-min applies to a draft model, expected it with --draft-model or --draft-self\n", cmd);
        return 2;
    }
    if (o->draft_min > (o->spec_k ? o->spec_k : 8u)) {
        fprintf(stderr, "kipp %s: --draft-min %u is above the longest draft %u, expected at most --draft-max\n", cmd,
                o->draft_min, o->spec_k ? o->spec_k : 8u);
        return 2;
    }
    if (!o->spec && (o->spec_k || o->spec_fixed)) {
        fprintf(stderr, "kipp %s: --spec-k and --spec-fixed apply to speculative decoding, expected them with --spec\n", cmd);
        return 2;
    }
    if (o->spec && !draft && !kipp_spec_params_ok(&o->sp)) {
        fprintf(stderr, "kipp %s: --spec needs deterministic sampling, expected --temperature 0 (the default) "
                        "or --top-k 1, got temperature %g\n", cmd, (double)o->sp.temperature);
        return 2;
    }
    if (o->threads_arg && !strcmp(o->backend, "ref") && o->threads != 1) {
        fprintf(stderr, "kipp %s: --threads '%s' does not apply to --backend ref, which is single-threaded; "
                        "expected --threads 1 or no --threads\n", cmd, o->threads_arg);
        return 2;
    }
    return 0;
}

static const opt_def *find_opt(const char *f)
{
    for (size_t i = 0; i < N_OPTS; i++)
        if (!strcmp(f, OPTS[i].flag)) return &OPTS[i];
    /* the sampling table's rows, as options of generate and chat */
    static opt_def sample_opt;
    const kipp_sample_field *sf = kipp_sample_field_find(f);
    if (!sf) return NULL;
    sample_opt = (opt_def){.flag = sf->flag, .arg = sf->metavar, .cmds = C_SAMPLE, .help = sf->expect};
    return &sample_opt;
}

int cli_gen_parse(const char *cmd, int argc, char **argv, cli_gen_opts *o)
{
    memset(o, 0, sizeof *o);
    o->backend = "cpu";
    o->think = 1;
    o->max_tokens = CLI_DEFAULT_MAX_TOKENS;
    o->sp = kipp_sample_params_default();
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        const opt_def *d = find_opt(!strcmp(f, "-h") ? "--help" : f);
        if (!d) {
            fprintf(stderr, "kipp %s: %s '%s'; `kipp %s --help` lists the options\n", cmd,
                    f[0] == '-' ? "unknown option" : "unexpected argument", f, cmd);
            return 2;
        }
        if (!(d->cmds & cmd_bit(cmd))) {
            fprintf(stderr, "kipp %s: option %s does not apply to `kipp %s`\n", cmd, f, cmd);
            return 2;
        }
        if (!strcmp(d->flag, "--help")) return usage(cmd, stdout), CLI_HELP_SHOWN;
        if (!d->arg) {
            set_switch(f, o);
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "kipp %s: option %s needs a value (%s) after it\n", cmd, f, d->arg);
            return 2;
        }
        int rc = parse_value_opt(cmd, f, argv[++i], o);
        if (rc) return rc;
    }
    int rc = check_combination(cmd, o);
    return rc ? rc : check_sampling(cmd, o);
}
