/* checkpoints.c - lookup in the compiled-in registry (engine/kipp_checkpoints.h). */
#include <string.h>

#include "engine/kipp_checkpoints.h"

const kipp_checkpoint kipp_checkpoints[] = {KIPP_CHECKPOINT_TABLE};
const size_t kipp_checkpoints_count = sizeof kipp_checkpoints / sizeof kipp_checkpoints[0];

static int eq(const char *s, const char *p, size_t n) { return strlen(s) == n && !memcmp(s, p, n); }

const kipp_checkpoint *kipp_checkpoint_find(const char *repo, size_t repo_len, const char *rev,
                                            size_t rev_len)
{
    for (size_t i = 0; i < kipp_checkpoints_count; i++)
        if (eq(kipp_checkpoints[i].repository, repo, repo_len) &&
            eq(kipp_checkpoints[i].revision, rev, rev_len))
            return &kipp_checkpoints[i];
    return NULL;
}

const kipp_checkpoint *kipp_checkpoint_by_id(const char *id)
{
    for (size_t i = 0; id && i < kipp_checkpoints_count; i++)
        if (!strcmp(kipp_checkpoints[i].id, id)) return &kipp_checkpoints[i];
    return NULL;
}

const char *kipp_variant_name(kipp_variant v)
{
    static const char *const n[] = {"base", "instruct", "thinking", "embedding", "reranker"};
    return (unsigned)v < sizeof n / sizeof n[0] ? n[v] : "?";
}
