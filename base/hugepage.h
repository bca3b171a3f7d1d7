/*
 * hugepage.h - the one allocator for large, long-lived buffers read at memory
 * bandwidth: packed weights (backends/cpu/cpu_backend.c), the paged KV store
 * (backends/cpu/kv_store.c), the planner's and the profile's read probes
 * (engine/plan_probe.c, bench/profile.c) and kcheck's big cases.
 *
 * The buffer is 2 MiB aligned, its size rounded up to whole 2 MiB pages, and
 * advised for transparent huge pages where the OS has them (MADV_HUGEPAGE,
 * Linux): decode streams gigabytes per token, and with 4 KiB pages the TLB
 * misses (nested page walks on a VM) cap the stream well below what it
 * reaches otherwise. The advice is only that: a refusal, or an OS without
 * it, costs speed, never correctness.
 */
#ifndef KIPP_BASE_HUGEPAGE_H
#define KIPP_BASE_HUGEPAGE_H

#include <stddef.h>

/** The huge page size the allocator aligns and rounds to, bytes. */
#define KIPP_HUGE_PAGE ((size_t)2 << 20)

/** bytes rounded up to whole huge pages (one page for 0; 0 when that overflows size_t). */
size_t kipp_huge_round(size_t bytes);

/** kipp_huge_round(bytes) bytes, KIPP_HUGE_PAGE aligned, advised for huge
 * pages; contents undefined. NULL on failure; release with free(). */
void *kipp_huge_alloc(size_t bytes);

#endif
