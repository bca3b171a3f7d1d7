/* park.c - kipp_park_wait / kipp_park_wake_all (base/park.h): a Linux futex,
 * or a mutex and condition variable where there is none (and in the portable
 * build, KIPP_PORTABLE, so that the fallback is the one its test runs). */
#include "base/park.h"

#if defined(__linux__) && !defined(KIPP_PORTABLE)
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

void kipp_park_wait(atomic_uint *addr, unsigned old)
{
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAIT_PRIVATE, old, NULL, NULL, 0);
}

void kipp_park_wake_all(atomic_uint *addr)
{
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}
#else
#include <pthread.h>

/* One lock for every word: parking is the slow path (the spin came first). */
static pthread_mutex_t park_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t park_cv = PTHREAD_COND_INITIALIZER;

void kipp_park_wait(atomic_uint *addr, unsigned old)
{
    pthread_mutex_lock(&park_mu);
    if (atomic_load(addr) == old) pthread_cond_wait(&park_cv, &park_mu);
    pthread_mutex_unlock(&park_mu);
}

void kipp_park_wake_all(atomic_uint *addr)
{
    (void)addr;
    pthread_mutex_lock(&park_mu);
    pthread_cond_broadcast(&park_cv);
    pthread_mutex_unlock(&park_mu);
}
#endif
