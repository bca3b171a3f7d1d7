/*
 * cmd_inspect.c - `kipp inspect FILE.gguf [--kernels]`.
 *
 * Loads the artifact through the strict loader without a backend and prints
 * the matched checkpoint, its dimensions, the tensor table and the byte
 * totals. On rejection it prints "kipp inspect: <loader message>" to stderr
 * and exits 1. --kernels also opens the model on the "cpu" backend and prints
 * the kernel paths it chose (kipp_model_describe). --help / -h prints the usage
 * to stdout and exits 0.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/safe_io.h"
#include "cli/cli.h"
#include "engine/kipp.h"

/* prefix, s escaped for the terminal (base/safe_io.h), suffix */
static void print_str(const char *prefix, const char *s, const char *suffix)
{
    fputs(prefix, stdout);
    if (s) kipp_fput_escaped(stdout, s, strlen(s));
    fputs(suffix, stdout);
}

static void print_header(const kipp_model *m)
{
    kipp_model_info in;
    kipp_model_get_info(m, &in);
    /* Strings are escaped too: the loader matched them to the registry, but this
     * command's output must stay safe for any file it can print. */
    print_str("checkpoint      ", in.checkpoint_id, "\n");
    print_str("source          ", in.repository, "@");
    print_str("", in.revision, "\n");
    print_str("quant scheme    ", in.quant, "\n");
    if (strcmp(in.quant_head, "bf16")) print_str("quant head      ", in.quant_head, " (kipp.quant.head)\n");
    printf("variant         %s, %s chat template\n", in.variant, in.has_chat ? "with" : "without");
    printf("d_model         %u\n", in.d_model);
    printf("n_layer         %u\n", in.n_layer);
    printf("n_q_head        %u (attention width %u)\n", in.n_q_head, in.n_q_head * in.head_dim);
    printf("n_kv_head       %u x head_dim %u\n", in.n_kv_head, in.head_dim);
    printf("d_ff            %u\n", in.d_ff);
    printf("vocab           %u\n", in.vocab_size);
    printf("context         %u tokens\n", in.context_length);
    printf("rope_theta      %g\n", (double)in.rope_theta);
    if (in.rope.yarn)
        printf("rope scaling    yarn: factor %g over %u original tokens (beta_fast %g, beta_slow %g); the file's "
               "context_length is %u\n", in.rope.factor, in.rope.original_context, in.rope.beta_fast,
               in.rope.beta_slow, in.file_context_length);
    else
        printf("rope scaling    none\n");
    printf("embeddings      %s\n", !in.tied_embeddings ? "untied"
                                   : strcmp(in.quant_head, "bf16") ? "tied (output.weight: the embedding, quantized)"
                                                                   : "tied (output = token_embd)");
    printf("stop ids        ");
    for (uint32_t i = 0; i < in.n_stop; i++) printf("%s%u", i ? ", " : "", in.stop_ids[i]);
    printf("\nKV bytes/token  %llu\n", (unsigned long long)in.kv_bytes_per_token);
    char tok[256];
    if (!kipp_tokenizer_describe(m, tok, sizeof tok)) printf("tokenizer       %s\n", tok);
}

static void print_tensors(const kipp_model *m)
{
    kipp_model_info in;
    kipp_model_get_info(m, &in);
    printf("\n%-28s %-5s %-16s %12s %12s\n", "tensor", "dtype", "shape", "bytes", "offset");
    for (uint64_t i = 0; i < in.n_tensors; i++) {
        kipp_tensor_info t;
        if (kipp_model_tensor(m, i, &t)) break;
        char shape[48];
        if (t.n_dims == 2)
            snprintf(shape, sizeof shape, "[%llu][%llu]", (unsigned long long)t.rows, (unsigned long long)t.cols);
        else
            snprintf(shape, sizeof shape, "[%llu]", (unsigned long long)t.cols);
        char name[1024]; /* file-derived: escaped (base/safe_io.h), cut to the buffer */
        kipp_text_escape(t.name, t.name_len, name, sizeof name);
        printf("%-28s %-5s %-16s %12llu %12llu\n", name, t.type_name, shape,
               (unsigned long long)t.nbytes, (unsigned long long)t.file_offset);
    }
    printf("\n%llu tensors, %llu weight bytes (%.2f MiB), file %llu bytes, data at %llu\n",
           (unsigned long long)in.n_tensors, (unsigned long long)in.weight_bytes,
           (double)in.weight_bytes / (1024.0 * 1024.0), (unsigned long long)in.file_bytes,
           (unsigned long long)in.data_offset);
}

static int print_kernels(const char *path)
{
    char err[512];
    kipp_model *m;
    int rc = kipp_model_open(path, "cpu", NULL, &m, err, sizeof err);
    if (rc) {
        cli_errorf("inspect", "--kernels: %s", err);
        return 1;
    }
    char report[4096];
    rc = kipp_model_describe(m, report, sizeof report);
    if (!rc) printf("\nkernels:\n%s", report);
    kipp_model_close(m);
    return rc ? 1 : 0;
}

int cmd_inspect(int argc, char **argv)
{
    const char *path = NULL;
    int kernels = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: kipp inspect FILE.gguf [--kernels]\n"
                   "  --kernels    also open the model on the cpu backend and print the chosen kernels\n"
                   "  --help, -h   print this help\n"
                   "prints the matched checkpoint, its dimensions, the tensor table and byte totals\n");
            return 0;
        }
        if (!strcmp(argv[i], "--kernels")) kernels = 1;
        else if (argv[i][0] == '-' || path) {
            cli_errorf("inspect", "unexpected argument '%s' (usage: kipp inspect FILE.gguf [--kernels])", argv[i]);
            return 2;
        } else path = argv[i];
    }
    if (!path) {
        fprintf(stderr, "kipp inspect: missing FILE.gguf (usage: kipp inspect FILE.gguf [--kernels])\n");
        return 2;
    }
    char err[512];
    kipp_model *m;
    kipp_mapped_file_guard(path);
    if (kipp_model_open(path, "none", NULL, &m, err, sizeof err)) {
        cli_errorf("inspect", "%s", err);
        return 1;
    }
    print_header(m);
    print_tensors(m);
    kipp_model_close(m);
    return kernels ? print_kernels(path) : 0;
}
