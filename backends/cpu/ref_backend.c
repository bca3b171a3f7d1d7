/* ref_backend.c - placeholder until the ref backend lands: every op reports ENOTSUP. */
#include <stdio.h>

#include "backend.h"
#include "kipp.h"

static int stub_model_create(const kipp_model_view *m, void **bm, char *err, size_t errlen)
{
    (void)m;
    *bm = NULL;
    if (err) snprintf(err, errlen, "backend 'ref' is not implemented yet");
    return KIPP_ENOTSUP;
}
static void stub_model_destroy(void *bm) { (void)bm; }
static int stub_session_create(void *bm, uint32_t n, void **bs, char *err, size_t errlen)
{
    (void)bm; (void)n; *bs = NULL;
    if (err) snprintf(err, errlen, "backend 'ref' is not implemented yet");
    return KIPP_ENOTSUP;
}
static void stub_session_destroy(void *bs) { (void)bs; }
static int stub_eval(void *bm, kipp_eval_item *it, size_t n, char *err, size_t errlen)
{
    (void)bm; (void)it; (void)n;
    if (err) snprintf(err, errlen, "backend 'ref' is not implemented yet");
    return KIPP_ENOTSUP;
}

const kipp_backend_ops ref_backend_ops = {
    "ref", stub_model_create, stub_model_destroy, stub_session_create, stub_session_destroy, stub_eval, NULL,
};
