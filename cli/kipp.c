/*
 * kipp.c - the `kipp` command-line entry point: dispatches to cli/cmd_*.c.
 * Each command is `int cmd_<name>(int argc, char **argv)` returning the exit status.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "kernels/common.h"

/* Set by the Makefile for this file only (KIPP_VERSION, git describe, CFLAGS). */
#ifndef KIPP_VERSION
#define KIPP_VERSION "0.0.0"
#endif
#ifndef KIPP_GIT_SHA
#define KIPP_GIT_SHA "unknown"
#endif
#ifndef KIPP_BUILD_FLAGS
#define KIPP_BUILD_FLAGS "unknown"
#endif

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"inspect", cmd_inspect, "inspect FILE.gguf [--kernels]   checkpoint, dims, tensor table"},
    {"registry", cmd_registry, "registry [--json]               the compiled-in checkpoint registry"},
    {"tokenize", cmd_tokenize, "tokenize --model F (--text T | --file F) [--special]"},
    {"detokenize", cmd_detokenize, "detokenize --model F --ids 1,2,3"},
    {"generate", cmd_generate, "generate --model F --prompt T [--chat] [--max-tokens N] ..."},
    {"chat", cmd_chat, "chat --model F                   interactive multi-turn chat"},
    {"embed", cmd_embed, "embed --model F [--dimensions D] [--instruct T] [TEXT ...]  embeddings (stdin: lines or JSON)"},
    {"logits", cmd_logits, "logits --model F --prompt T --out F.f32"},
    {"plan", cmd_plan, "plan --model F [--json] [--results DIR]  measure this machine, predict tok/s, pick a context"},
    {"render", cmd_render, "render --model F --messages F.json  the rendered chat prompt and its tokens"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: kipp COMMAND [ARGS]    (kipp --version; kipp COMMAND --help)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %s\n", commands[i].help);
}

/* `kipp --version`: version, git sha, build flags, ISA levels compiled in and chosen here. */
static int print_version(void)
{
    printf("kipp %s\ngit %s\nbuild flags: %s\nISA levels compiled in:", KIPP_VERSION, KIPP_GIT_SHA,
           KIPP_BUILD_FLAGS);
    for (int i = 0; i < KIPP_ISA_COUNT; i++) printf(" %s", kipp_isa_name((kipp_isa)i));
    const char *note = NULL;
    printf("\nISA level selected on this CPU: %s\n", kipp_isa_name(kipp_isa_select(&note)));
    if (note) printf("note: %s\n", note);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V") || !strcmp(argv[1], "version")))
        return print_version();
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(argv[1], commands[i].name)) continue;
        if (!commands[i].fn) {
            fprintf(stderr, "kipp: command '%s' is not built into this binary\n", argv[1]);
            return 2;
        }
        return commands[i].fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "kipp: unknown command '%s' (expected one of:", argv[1]);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(stderr, "%s %s", i ? "," : "", commands[i].name);
    fprintf(stderr, ", or --version)\n");
    return 2;
}
