/* floor.c - measurement floors for the benchmarks (see floor.h). */
#define _GNU_SOURCE
#include "floor.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

uint32_t floor_fetch_add(uint32_t *word, uint32_t delta)
{
    return atomic_fetch_add_explicit((_Atomic uint32_t *)word, delta, memory_order_seq_cst);
}

int floor_futex_wait(uint32_t *word, uint32_t val, int64_t deadline_ns)
{
    struct timespec ts, *tp = NULL;
    if (deadline_ns >= 0) {
        ts.tv_sec = deadline_ns / 1000000000LL;
        ts.tv_nsec = deadline_ns % 1000000000LL;
        tp = &ts;
    }
    long r = syscall(SYS_futex, word, FUTEX_WAIT_BITSET, val, tp, NULL, FUTEX_BITSET_MATCH_ANY);
    if (r == 0 || errno == EAGAIN)
        return 0;
    return errno == ETIMEDOUT ? 1 : 3;
}

void floor_futex_store_wake_all(uint32_t *word, uint32_t val)
{
    /* release: a woken process that reads the word sees the new value. */
    atomic_store_explicit((_Atomic uint32_t *)word, val, memory_order_release);
    syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}
