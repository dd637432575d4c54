/*
 * fuzz_open.c - libFuzzer target: arbitrary bytes under a lock's name.
 *
 * Each input becomes the whole content of /dev/shm/pyshmlock.<name>; the core
 * must open it (and then survive info, slot scans, try-acquires, a stale
 * reset and close) or refuse it with an error code.  The read-only observer
 * (shl_observe_*) gets the same bytes first, before an opener changes them,
 * and again after the file shrinks under it; both must give one verdict on
 * the bytes (validate.c): what one finds corrupt, the other finds corrupt,
 * in the same check, slot and value.  Built with AddressSanitizer and UBSan
 * (`make fuzz`), so any read or write outside the mapping, or any undefined
 * behaviour, is a crash the fuzzer reports.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shmlock.h"

/* Every read an observer can make. */
static void observe_all(shl_observer *o)
{
    shl_snapshot osnap;
    if (shl_observe_info(o, &osnap) == SHL_OK) {
        shl_slot_snapshot slot;
        for (uint32_t i = 0; i < osnap.max_processes; i++)
            shl_observe_slot(o, i, &slot);
    }
    shl_recovery_record orec;
    for (uint32_t i = 0; i < SHL_RECOVERY_LOG; i++)
        shl_observe_recovery(o, i, &orec);
}

/* One try of an attempt, withdrawn if it would have to wait: what a call
 * with timeout 0 does (the binding's attempt, csrc/fastpath/attempt.c). */
static int try_once(shl_lock *h, int kind, uint32_t flags)
{
    shl_waiter w;
    memset(&w, 0, sizeof w);
    w.kind = kind;
    w.flags = flags;
    int r = shl_try(h, &w);
    if (r != SHL_OK)
        shl_cancel(h, &w);
    return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char name[64], path[SHL_PATH_MAX];
    if (!name[0]) {
        snprintf(name, sizeof name, "fuzz-%d", (int)getpid());
        shl_segment_path(name, 1, path, sizeof path);
    }
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        abort();
    if (size && write(fd, data, size) != (ssize_t)size)
        abort();
    close(fd);

    shl_observer *o = NULL;
    shl_corruption seen;
    memset(&seen, 0, sizeof seen);
    int ro = shl_observe_open(name, &o, &seen);
    if ((ro == SHL_ECORRUPT) != (seen.what != 0))
        abort();   /* a corrupt verdict always says what was found */
    if (ro == SHL_OK) {
        observe_all(o);
        /* The owner shrinks the file under the observer: what is gone must
         * read as SHL_ESIZE, never fault (an observer never maps it). */
        if (truncate(path, (off_t)(size / 2)) != 0)
            abort();
        observe_all(o);
        if (truncate(path, 0) != 0)
            abort();
        observe_all(o);
        shl_observe_close(o);
        fd = open(path, O_WRONLY | O_TRUNC);     /* the opener below gets the input */
        if (fd < 0 || (size && write(fd, data, size) != (ssize_t)size))
            abort();
        close(fd);
    } else if (ro >= 0) {
        abort();
    }

    shl_lock *h = NULL;
    shl_open_info info;
    memset(&info, 0, sizeof info);
    int r = shl_open(name, 0, 0600, -1, 0, &h, &info);
    /* One verdict, whoever looks: what the observer's validation found is
     * what the opener's finds (and the opener then refuses the segment). */
    if (seen.what != 0 && (r != SHL_ECORRUPT || info.corrupt.what != seen.what ||
                           info.corrupt.slot != seen.slot || info.corrupt.value != seen.value))
        abort();
    if (info.corrupt.what != 0 && (ro != SHL_ECORRUPT || r != SHL_ECORRUPT))
        abort();
    if (r == SHL_OK) {
        /* Opened: the file is exactly the size its header describes (a
         * shorter one faults past its end; grown ones used to be opened). */
        uint32_t hsize, ssize, nmax;
        memcpy(&hsize, data + 8, 4);
        memcpy(&ssize, data + 12, 4);
        memcpy(&nmax, data + 16, 4);
        if (size != (uint64_t)hsize + (uint64_t)nmax * ssize || info.size != size)
            abort();
        shl_snapshot snap;
        if (shl_info(h, &snap) == SHL_OK) {
            shl_slot_snapshot slot;
            for (uint32_t i = 0; i < snap.max_processes; i++)
                shl_slot_info(h, i, &slot);
        }
        shl_recovery_record rec;
        for (uint32_t i = 0; i < SHL_RECOVERY_LOG; i++)
            shl_recovery_info(h, i, &rec);
        shl_is_locked(h);
        shl_is_paused(h);
        if (shl_info(h, &snap) == SHL_OK)
            shl_reset_stale(h, snap.paused_by_pid);
        if (try_once(h, SHL_KIND_READ, 0) == SHL_OK)
            shl_release_read(h);
        if (try_once(h, SHL_KIND_WRITE, 0) == SHL_OK)
            shl_release_write(h);
        if (try_once(h, SHL_KIND_UPDATE, 0) == SHL_OK)
            shl_release_update(h);
        /* Sessions, resume and fences read and write header fields of
         * their own (token, deadline, flags, fence): any value must be an
         * answer, never a fault or an overflow. */
        uint64_t tok = 0, f = 0, a = 0;
        if (shl_info(h, &snap) == SHL_OK && snap.session_token)
            shl_session_end(h, snap.session_token);
        try_once(h, SHL_KIND_RESUME, 0);
        try_once(h, SHL_KIND_RESUMED, 0);
        try_once(h, SHL_KIND_DRAINED, 0);
        /* begin_session, tried once: unpinned, the update hold, the pin */
        if (try_once(h, SHL_KIND_UNPINNED, 0) == SHL_OK &&
            try_once(h, SHL_KIND_UPDATE, 0) == SHL_OK) {
            int pinned = shl_session_pin(h, 1000000000LL, &tok);
            shl_release_update(h);
            if (pinned == SHL_OK)
                shl_session_end(h, tok);
        }
        try_once(h, SHL_KIND_RESUME, SHL_RESUME_FORCE);
        shl_fence_raise(h, 7, &f);
        shl_fence_get(h, &f, &a);
        shl_close(h);
    } else if (r >= 0) {
        abort();   /* an error must be negative */
    }
    unlink(path);
    return 0;
}
