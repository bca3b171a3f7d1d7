/*
 * stream_mode.c - whether a model's layers are streamed from the file (seed
 * 002 "Layer streaming"): the engine decides once at open,
 * by the planner's rule (KIPP_RESIDENT_SHARE), and tells the backend
 * through kipp_model_view.stream / .prefetch.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "engine/internal.h"

static int parse_mode(const char *s)
{
    if (!strcmp(s, "auto")) return KIPP_STREAM_AUTO;
    if (!strcmp(s, "on")) return KIPP_STREAM_ON;
    if (!strcmp(s, "off")) return KIPP_STREAM_OFF;
    return -1;
}

int kipp_stream_resolve(kipp_model *m, const kipp_model_options *opts, char *err, size_t errlen)
{
    int mode = opts ? opts->stream : KIPP_STREAM_AUTO;
    const char *env = getenv("KIPP_STREAM"), *pf = getenv("KIPP_PREFETCH");
    if (mode < KIPP_STREAM_AUTO || mode > KIPP_STREAM_OFF)
        return kipp_err(err, errlen, KIPP_EINVAL, "stream mode %d is not one of KIPP_STREAM_AUTO (0), _ON (1), _OFF (2)", mode);
    if (mode == KIPP_STREAM_AUTO && env && *env && (mode = parse_mode(env)) < 0)
        return kipp_err(err, errlen, KIPP_EINVAL, "KIPP_STREAM=%s is not a stream mode; expected auto, on or off", env);
    m->view.prefetch = !(opts && opts->no_prefetch) && !(pf && !strcmp(pf, "0"));
    m->view.stream = mode == KIPP_STREAM_ON;
    uint64_t total, avail;
    int known = kipp_plan_ram(&total, &avail, NULL, 0) == 0;
    m->view.stream_budget = known ? (uint64_t)(KIPP_RESIDENT_SHARE * (double)avail) : UINT64_MAX;
    if (mode != KIPP_STREAM_AUTO || !known) return 0; /* no /proc/meminfo: stay resident, as before */
    if ((double)m->weight_bytes <= KIPP_RESIDENT_SHARE * (double)avail) return 0;
    m->view.stream = 1;
    kipp_log("the weights (%.2f GB) exceed 0.75 x available RAM (%.2f GB): layers are streamed from the file%s",
            (double)m->weight_bytes * 1e-9, (double)avail * 1e-9, m->view.prefetch ? " with one-layer prefetch" : " (no prefetch)");
    return 0;
}
