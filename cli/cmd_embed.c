/*
 * cmd_embed.c - `kipp embed`: text embeddings from an embedding model.
 *
 *   kipp embed --model F [--dimensions D] [--instruct TEXT] [--backend B] [--threads N] [TEXT ...]
 *
 * Inputs are the TEXT arguments, else stdin: a JSON array of strings, or one
 * input per line, where a line starting with '"' is a JSON string (so an input
 * may hold newlines). Every input gets the model card's recipe (engine/embed.c):
 * --instruct wraps it as "Instruct: TEXT\nQuery:{input}", <|endoftext|> is
 * appended, the last token's final-norm state is L2-normalized, truncated to D
 * and normalized again. All inputs are evaluated together in one batch.
 * Prints one JSON object in the OpenAI embeddings shape (docs/CLI.md).
 * Exit status: 0 ok, 1 model or evaluation failure, 2 bad arguments or input.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "engine/kipp.h"

typedef struct {
    const char *model, *instruct, *backend;
    long dims, threads;
    char **texts; /* positional inputs (argv pointers), n_texts of them */
    int n_texts;
} embed_args;

typedef struct {
    char **s;
    size_t *len;
    size_t n, cap;
} text_list;

static void usage(FILE *f)
{
    fprintf(f, "usage: kipp embed --model F [--dimensions D] [--instruct TEXT] [--backend B] [--threads N] [TEXT ...]\n"
               "  --model F         an embedding model (.gguf with kipp.variant embedding)\n"
               "  --dimensions D    keep the first D values (1..d_model, Matryoshka), renormalized; default d_model\n"
               "  --instruct TEXT   query instruction: each input becomes \"Instruct: TEXT\\nQuery:{input}\"\n"
               "  --backend B       cpu (default) or ref\n"
               "  --threads N       worker threads (0 = one per physical core)\n"
               "inputs: the TEXT arguments, else stdin (a JSON array of strings, or one input per line;\n"
               "a line starting with '\"' is a JSON string). Prints {\"object\":\"list\",\"data\":[...],...}.\n");
}

static int bad(const char *fmt, const char *v)
{
    fprintf(stderr, "kipp embed: ");
    fprintf(stderr, fmt, v);
    fputc('\n', stderr);
    return 2;
}

static int parse_long(const char *flag, const char *v, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "kipp embed: %s '%s' is not an integer in %ld..%ld\n", flag, v, lo, hi);
        return 2;
    }
    *out = x;
    return 0;
}

/* 0, 2 after naming the problem, or -1 after --help. */
static int parse_args(int argc, char **argv, embed_args *a)
{
    *a = (embed_args){.backend = "cpu", .dims = 0, .threads = 0};
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) return usage(stdout), -1;
        int takes = !strcmp(o, "--model") || !strcmp(o, "--dimensions") || !strcmp(o, "--instruct") ||
                    !strcmp(o, "--backend") || !strcmp(o, "--threads");
        if (takes && i + 1 >= argc) return bad("option %s needs a value after it", o);
        if (!strcmp(o, "--model")) a->model = argv[++i];
        else if (!strcmp(o, "--instruct")) {
            a->instruct = argv[++i];
            if (!*a->instruct) return bad("%s is empty; expected a task description (omit it for documents)", o);
        }
        else if (!strcmp(o, "--backend")) a->backend = argv[++i];
        else if (!strcmp(o, "--dimensions")) { if (parse_long(o, argv[++i], 1, 1 << 20, &a->dims)) return 2; }
        else if (!strcmp(o, "--threads")) { if (parse_long(o, argv[++i], 0, 1024, &a->threads)) return 2; }
        else if (!strncmp(o, "--", 2) && o[2]) return bad("unknown option %s (kipp embed --help lists them)", o);
        else if (!strcmp(o, "--")) { /* the rest are texts, even ones that start with -- */
            a->texts = argv + i + 1, a->n_texts = argc - i - 1;
            break;
        } else {
            /* an option after the first text would otherwise be embedded as text */
            for (int k = i + 1; k < argc; k++)
                if (!strncmp(argv[k], "--", 2) && argv[k][2])
                    return bad("option %s after the first text: options go before the texts (put -- before a "
                               "text that starts with --)", argv[k]);
            a->texts = argv + i, a->n_texts = argc - i;
            break;
        }
    }
    if (!a->model) return cli_missing("embed", "--model", "an embedding model .gguf");
    return 0;
}

static int push(text_list *t, const char *s, size_t len)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 16;
        char **ns = realloc(t->s, cap * sizeof *ns);
        if (ns) t->s = ns;
        size_t *nl = realloc(t->len, cap * sizeof *nl);
        if (nl) t->len = nl;
        if (!ns || !nl) return -1;
        t->cap = cap;
    }
    if (!(t->s[t->n] = malloc(len + 1))) return -1;
    memcpy(t->s[t->n], s, len), t->s[t->n][len] = 0;
    t->len[t->n++] = len;
    return 0;
}

/* A JSON string value into t; 2 (named) when v is not a non-empty string. */
static int push_json(text_list *t, const json_t *v, const char *where, size_t idx)
{
    if (!json_is_string(v) || json_string_length(v) == 0) {
        fprintf(stderr, "kipp embed: %s %zu is %s; expected a non-empty string\n", where, idx,
                json_is_string(v) ? "an empty string" : "not a string");
        return 2;
    }
    return push(t, json_string_value(v), json_string_length(v)) ? 1 : 0;
}

/* stdin: a JSON array of strings, or lines (a line starting with '"' is a JSON string). */
static int read_stdin(text_list *t)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n - 1, stdin)) > 0;)
        if ((n += got) + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
    if (!buf) return (fprintf(stderr, "kipp embed: out of memory reading stdin\n"), 1);
    buf[n] = 0;
    size_t lead = strspn(buf, " \t\r\n");
    int rc = 0;
    if (buf[lead] == '[') {
        json_error_t je;
        json_t *arr = json_loadb(buf, n, 0, &je);
        if (!json_is_array(arr))
            rc = (fprintf(stderr, "kipp embed: stdin starts with '[' but is not a JSON array: %s (line %d)\n", je.text, je.line), 2);
        for (size_t i = 0; !rc && i < json_array_size(arr); i++) rc = push_json(t, json_array_get(arr, i), "array item", i);
        json_decref(arr);
    } else {
        size_t line = 0;
        for (char *p = buf; !rc && *p; line++) {
            char *e = strchr(p, '\n');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            if (len && p[len - 1] == '\r') len--;
            if (len == 0 && (!e || !e[1])) break; /* the final newline ends the last line */
            if (len == 0) rc = (fprintf(stderr, "kipp embed: line %zu of stdin is empty; expected text\n", line + 1), 2);
            else if (*p == '"') {
                json_error_t je;
                json_t *v = json_loadb(p, len, JSON_DECODE_ANY, &je);
                rc = v ? push_json(t, v, "line", line + 1)
                       : (fprintf(stderr, "kipp embed: line %zu starts with '\"' but is not a JSON string: %s\n", line + 1, je.text), 2);
                json_decref(v);
            } else if (push(t, p, len)) rc = 1;
            p = e ? e + 1 : p + len;
        }
    }
    free(buf);
    if (!rc && t->n == 0) rc = (fprintf(stderr, "kipp embed: no input: give TEXT arguments or lines on stdin\n"), 2);
    return rc;
}

static void print_result(const kipp_model_info *info, const float *v, size_t n, uint32_t dims, uint64_t tokens)
{
    printf("{\"object\":\"list\",\"model\":\"%s\",\"data\":[", info->checkpoint_id);
    for (size_t i = 0; i < n; i++) {
        printf("%s{\"object\":\"embedding\",\"index\":%zu,\"embedding\":[", i ? "," : "", i);
        for (uint32_t j = 0; j < dims; j++) printf(j ? ",%.9g" : "%.9g", (double)v[i * dims + j]);
        printf("]}");
    }
    printf("],\"usage\":{\"prompt_tokens\":%llu,\"total_tokens\":%llu}}\n", (unsigned long long)tokens,
           (unsigned long long)tokens);
}

/* Tokenize every input, embed them in one batch, print. */
static int run(kipp_model *m, const embed_args *a, const text_list *t)
{
    kipp_model_info info;
    kipp_model_get_info(m, &info);
    if (kipp_model_task(m) != KIPP_TASK_EMBED) {
        cli_errorf("embed", "%s is a %s model (kipp.variant %s); kipp embed needs an embedding model (kipp.variant embedding)",
                   info.checkpoint_id, kipp_model_task(m) == KIPP_TASK_RERANK ? "reranker" : "generation", info.variant);
        return 1;
    }
    uint32_t dims = a->dims ? (uint32_t)a->dims : info.d_model;
    if (dims > info.d_model) {
        cli_errorf("embed", "--dimensions %u is more than %s's d_model %u; expected 1..%u", dims, info.checkpoint_id,
                   info.d_model, info.d_model);
        return 2;
    }
    uint32_t **ids = calloc(t->n, sizeof *ids), *lens = calloc(t->n, sizeof *lens);
    float *out = malloc(t->n * (size_t)dims * sizeof *out);
    char err[512] = "";
    uint64_t tokens = 0;
    int rc = ids && lens && out ? 0 : KIPP_ENOMEM;
    for (size_t i = 0; i < t->n && !rc; i++) {
        rc = kipp_embed_tokenize(m, a->instruct, t->s[i], t->len[i], &ids[i], &lens[i], err, sizeof err);
        tokens += lens[i];
    }
    if (!rc) rc = kipp_embed(m, (const uint32_t *const *)ids, lens, t->n, dims, out, err, sizeof err);
    if (rc) cli_errorf("embed", "%s", err[0] ? err : "out of memory");
    else print_result(&info, out, t->n, dims, tokens);
    for (size_t i = 0; ids && i < t->n; i++) free(ids[i]);
    free(ids), free(lens), free(out);
    return rc == KIPP_ERANGE ? 2 : rc ? 1 : 0;
}

int cmd_embed(int argc, char **argv)
{
    embed_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    text_list t = {0};
    for (int i = 0; i < a.n_texts && !rc; i++) {
        if (!a.texts[i][0]) rc = bad("input %s is empty; expected text", a.n_texts > 1 ? "argument" : "TEXT");
        else if (push(&t, a.texts[i], strlen(a.texts[i]))) rc = 1;
    }
    if (!rc && a.n_texts == 0) rc = read_stdin(&t);
    kipp_model *m = NULL;
    char err[512] = "";
    kipp_model_options opts = {.n_threads = (int)a.threads};
    if (!rc && kipp_model_open(a.model, a.backend, &opts, &m, err, sizeof err)) {
        cli_model_error("embed", a.model, err);
        rc = 1;
    }
    if (!rc) rc = run(m, &a, &t);
    kipp_model_close(m);
    for (size_t i = 0; i < t.n; i++) free(t.s[i]);
    free(t.s), free(t.len);
    return rc;
}
