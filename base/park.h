/*
 * park.h - waiting on a 32-bit word, the OS half of a spin-then-park wait
 * (base/threadpool.c's barrier and job hand-off).
 *
 * kipp_park_wait(addr, old) sleeps while *addr still holds old and returns on
 * a wake-up, a change or spuriously: callers loop on their own condition.
 * kipp_park_wake_all(addr) wakes every thread parked on addr; call it after the
 * store that changed *addr. Linux uses the private futex; elsewhere one
 * process-wide mutex and condition variable stand in (the check of *addr and
 * the sleep happen under the mutex, the wake takes it, so no wake-up is lost).
 * kipp_cpu_pause() is the spin loop's hint: PAUSE on x86, YIELD on arm64,
 * a compiler barrier elsewhere.
 */
#ifndef KIPP_BASE_PARK_H
#define KIPP_BASE_PARK_H

#include <stdatomic.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
/** One spin-wait hint (PAUSE: yields the core's pipeline to an SMT sibling). */
static inline void kipp_cpu_pause(void) { _mm_pause(); }
#elif defined(__aarch64__)
static inline void kipp_cpu_pause(void) { __asm__ __volatile__("yield" ::: "memory"); }
#else
static inline void kipp_cpu_pause(void) { __asm__ __volatile__("" ::: "memory"); }
#endif

/** Sleep while *addr == old (may return early: recheck). */
void kipp_park_wait(atomic_uint *addr, unsigned old);

/** Wake every thread in kipp_park_wait on addr. */
void kipp_park_wake_all(atomic_uint *addr);

#endif
