/* cli.h - commands of the `kipp` CLI; each returns a process exit status. */
#ifndef KIPP_CLI_H
#define KIPP_CLI_H

/* Weak until every command file lands; main() reports a missing one. */
#define KIPP_CMD(name) int name(int argc, char **argv) __attribute__((weak))
KIPP_CMD(cmd_inspect);
KIPP_CMD(cmd_registry);
KIPP_CMD(cmd_tokenize);
KIPP_CMD(cmd_detokenize);
KIPP_CMD(cmd_generate);
KIPP_CMD(cmd_chat);
KIPP_CMD(cmd_logits);
KIPP_CMD(cmd_render);
KIPP_CMD(cmd_plan);
KIPP_CMD(cmd_embed);

/**
 * Print "kipp CMD: <message>" and a newline to stderr, the formatted message
 * escaped with kipp_text_escape: messages quote file-derived text (tensor
 * names, metadata) that must not reach the terminal as raw control bytes.
 */
void cli_errorf(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/** A model file that could not be opened: "kipp CMD: 'PATH': ERR", or "kipp CMD: ERR" when ERR already names
 *  PATH (the loader names it for files it cannot map; a header it rejects is named here). */
void cli_model_error(const char *cmd, const char *path, const char *err);

/** "kipp CMD: missing required option FLAG (expected WHAT)" on stderr; returns 2. */
int cli_missing(const char *cmd, const char *flag, const char *what);

#endif
