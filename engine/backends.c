/* backends.c - the engine's list of backends; chosen by name at model open (ARCHITECTURE.md). */
#include <string.h>

#include "engine/backend.h"

static const kipp_backend_ops *const backends[] = {&ref_backend_ops, &cpu_backend_ops};

const kipp_backend_ops *kipp_backend_find(const char *name)
{
    if (!name) return NULL;
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++)
        if (!strcmp(backends[i]->name, name)) return backends[i];
    return NULL;
}
