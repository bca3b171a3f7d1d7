/* hugepage.c - the 2 MiB-aligned, huge-page-advised allocator (base/hugepage.h). */
#include "base/hugepage.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

size_t kipp_huge_round(size_t bytes)
{
    if (bytes > SIZE_MAX - KIPP_HUGE_PAGE) return 0; /* no such buffer: kipp_huge_alloc fails */
    size_t n = (bytes + KIPP_HUGE_PAGE - 1) / KIPP_HUGE_PAGE * KIPP_HUGE_PAGE;
    return n ? n : KIPP_HUGE_PAGE;
}

void *kipp_huge_alloc(size_t bytes)
{
    void *p = NULL;
    size_t n = kipp_huge_round(bytes);
    if (!n || posix_memalign(&p, KIPP_HUGE_PAGE, n) != 0) return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, n, MADV_HUGEPAGE); /* advisory: a refusal only costs TLB misses */
#endif
    return p;
}
