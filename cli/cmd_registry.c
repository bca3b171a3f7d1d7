/* cmd_registry.c - `kipp registry [--json]`: print the compiled-in registry, for
 * humans or for tests/test_tooling.py, which compares it with tools/checkpoints.py. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "engine/kipp_checkpoints.h"

static const char *chat_name(kipp_chat_kind c)
{
    static const char *n[] = {"none", "hybrid", "instruct-2507", "thinking-2507"};
    return n[c];
}

/* The revision's verification status, as tools/checkpoints.py names it: synthetic
 * entries are generated; a 40-hex commit is a public pin that nothing here has
 * checked against the Hub (tools/download_model.sh verifies every file it
 * fetches); anything else is unpinned and the downloader refuses it. */
static const char *revision_status(const kipp_checkpoint *c)
{
    if (c->synthetic) return "synthetic";
    size_t n = c->revision ? strlen(c->revision) : 0;
    int hex = n == 40;
    for (size_t i = 0; hex && i < n; i++) hex = strchr("0123456789abcdef", c->revision[i]) != NULL;
    return hex ? "pinned-unverified" : "unpinned";
}

static json_t *entry_json(const kipp_checkpoint *c)
{
    json_t *stops = json_array();
    for (uint32_t i = 0; i < c->n_stop; i++) json_array_append_new(stops, json_integer(c->stop_ids[i]));
    return json_pack("{s:s,s:s,s:s,s:b,s:s,s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:f,s:b,s:i,s:o,s:I,s:s}",
                     "id", c->id, "repository", c->repository, "revision", c->revision,
                     "synthetic", c->synthetic, "variant", kipp_variant_name(c->variant),
                     "chat_template", chat_name(c->chat), "d_model", c->d_model,
                     "n_layer", c->n_layer, "n_q_head", c->n_q_head, "n_kv_head", c->n_kv_head,
                     "head_dim", c->head_dim, "d_ff", c->d_ff, "vocab_size", c->vocab_size,
                     "context_length", c->context_length, "rope_theta", c->rope_theta,
                     "tied_embeddings", c->tied_embeddings, "eos_token_id", c->eos_token_id,
                     "stop_token_ids", stops, "kv_bytes_per_token",
                     (json_int_t)kipp_kv_bytes_per_token(c), "revision_status", revision_status(c));
}

static void usage(FILE *f)
{
    fprintf(f, "usage: kipp registry [--json]\n"
               "  --json       one JSON object per entry (for tools and tests)\n"
               "  --help, -h   print this help\n"
               "lists the compiled-in checkpoint registry: id, repository, pinned revision and its\n"
               "status (synthetic; pinned-unverified: a public pin that tools/download_model.sh\n"
               "verifies file by file when it downloads; unpinned), and the model shape\n");
}

int cmd_registry(int argc, char **argv)
{
    int as_json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return usage(stdout), 0;
        if (!strcmp(argv[i], "--json")) as_json = 1;
        else {
            fprintf(stderr, "kipp registry: unknown argument '%s' (expected --json, --help or nothing)\n", argv[i]);
            return 2;
        }
    }
    if (as_json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < kipp_checkpoints_count; i++)
            json_array_append_new(arr, entry_json(&kipp_checkpoints[i]));
        json_dumpf(arr, stdout, JSON_INDENT(1));
        fputc('\n', stdout);
        json_decref(arr);
        return 0;
    }
    printf("%-24s %-32s %-40s %-17s %6s %4s %4s %6s %7s %s\n", "id", "repository", "revision", "status", "d", "L",
           "nq", "ff", "ctx", "tied");
    for (size_t i = 0; i < kipp_checkpoints_count; i++) {
        const kipp_checkpoint *c = &kipp_checkpoints[i];
        printf("%-24s %-32s %-40s %-17s %6u %4u %4u %6u %7u %s\n", c->id, c->repository,
               c->revision ? c->revision : "-", revision_status(c), c->d_model, c->n_layer, c->n_q_head, c->d_ff,
               c->context_length, c->tied_embeddings ? "yes" : "no");
    }
    return 0;
}
