/*
 * layouts.c - segments of other layout versions: who still uses one.
 *
 * An upgrade changes the layout (CHANGELOG: releases of different layouts
 * cannot share a lock).  With every process of the old release stopped, the
 * old segment is only in the way: shl_open replaces it.  With one still
 * running, the opener is refused, naming it.  Deciding that needs a look
 * inside a segment whose layout this release does not know, through what
 * every layout (1, 2, 3) shares and later ones must keep: the header starts
 * with magic, layout_version, header_size, slot_size and max_processes
 * (32-bit each), slots start at header_size, slot_size bytes apart, and a
 * slot starts with its robust owner mutex followed by the owner's pid.  A
 * process is alive while its mutex's futex word holds a TID without
 * FUTEX_OWNER_DIED (as observers judge it, info.c).
 *
 * The segment is read with pread, never mapped and never written; every
 * size read from it is bounded before use.
 */
#include "internal.h"

#include <sys/types.h>

struct layout_prefix {
    uint32_t magic, layout_version, header_size, slot_size, max_processes;
};

#define PREFIX_HEADER_MAX (1u << 20)
#define PREFIX_SLOT_MAX   (1u << 16)

static int read_at(int fd, void *buf, size_t len, off_t off)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = pread(fd, (char *)buf + done, len - done, off + (off_t)done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        done += (size_t)n;
    }
    return 0;
}

/* Is the owner of the slot whose first bytes are `m` alive? */
static int owner_alive(const pthread_mutex_t *m)
{
#ifdef __GLIBC__
    if (!slot_mutex_sane(m))
        return 1;          /* not a mutex we know: never called dead */
    /* relaxed: a copy's bytes */
    uint32_t w = __atomic_load_n(mutex_word((pthread_mutex_t *)m), __ATOMIC_RELAXED);
    return (w & FUTEX_TID_MASK) != 0 && !(w & FUTEX_OWNER_DIED);
#else
    (void)m;
    return 1;              /* no death watch without glibc: keep it */
#endif
}

/*
 * The processes attached to the segment open on fd (size bytes, of another
 * layout): their number, one of their pids in *pid, its layout in *layout.
 * A segment whose prefix is out of bounds counts as used (it is not
 * replaced): UINT32_MAX.
 */
int other_layout_users(int fd, size_t size, uint32_t *layout, uint32_t *pid)
{
    struct layout_prefix p;
    *pid = 0;
    *layout = 0;
    if (read_at(fd, &p, sizeof p, 0) != 0 || p.magic != SHL_MAGIC)
        return (int)UINT32_MAX;
    *layout = p.layout_version;
    if (p.header_size < sizeof p || p.header_size > PREFIX_HEADER_MAX ||
        p.slot_size < sizeof(pthread_mutex_t) + sizeof(uint32_t) ||
        p.slot_size > PREFIX_SLOT_MAX || p.max_processes < 1 ||
        p.max_processes > SHL_MAX_PROCESSES_LIMIT ||
        (uint64_t)p.header_size + (uint64_t)p.max_processes * p.slot_size > size)
        return (int)UINT32_MAX;
    uint32_t live = 0;
    for (uint32_t i = 0; i < p.max_processes; i++) {
        struct {
            pthread_mutex_t m;
            uint32_t pid;
        } head;
        off_t off = (off_t)p.header_size + (off_t)i * p.slot_size;
        if (read_at(fd, &head.m, sizeof head.m, off) != 0 ||
            read_at(fd, &head.pid, sizeof head.pid, off + (off_t)sizeof head.m) != 0)
            return (int)UINT32_MAX;
        if (head.pid != 0 && owner_alive(&head.m)) {
            live++;
            if (*pid == 0)
                *pid = head.pid;
        }
    }
    return (int)live;
}
