/* backends.c - the engine's list of backends; chosen by name at model open (docs/ARCHITECTURE.md). */
#include <string.h>

#include "engine/backend.h"
#include "engine/kipp.h"
#include "kernels/names.h"

#ifdef KIPP_WITH_CUDA
extern const kipp_backend_ops cuda_backend_ops; /* backends/cuda/cuda_backend.c, `make cuda` builds only */
#endif

static const kipp_backend_ops *const backends[] = {
    &ref_backend_ops, &cpu_backend_ops,
#ifdef KIPP_WITH_CUDA
    &cuda_backend_ops,
#endif
};

const kipp_backend_ops *kipp_backend_find(const char *name)
{
    if (!name) return NULL;
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++)
        if (!strcmp(backends[i]->name, name)) return backends[i];
    return NULL;
}

const char *kipp_backend_names(char *buf, size_t len, const char *sep)
{
    enum { N = sizeof backends / sizeof backends[0] };
    const char *names[N];
    for (size_t i = 0; i < N; i++) names[i] = backends[i]->name;
    return kipp_join_names(buf, len, names, N, sep);
}

const char *kipp_backend_missing(const char *name)
{
#ifndef KIPP_WITH_CUDA
    if (name && !strcmp(name, "cuda"))
        return "this build has no CUDA backend: `make cuda` (needs nvcc) builds build/cuda/kipp, "
               "build/cuda/kipp-serve and build/cuda/kipp-bench with it";
#else
    (void)name;
#endif
    return NULL;
}
