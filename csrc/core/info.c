/*
 * info.c - introspection: snapshots of the state word, the slots and the
 * recovery log, for an attached handle (shl_info, shl_slot_info, ...) and
 * for an observer that reads a segment without mapping it and attaches
 * nothing (shl_observe_*: `pyshmlock status` for another user, a full
 * lock).
 *
 * A snapshot is a set of relaxed loads taken at one moment, not an atomic
 * picture, except the state word (seq_cst).  Everything read is untrusted:
 * the owner index is bounds-checked against the validated private max, the
 * recovery index is checked against the log's size.  An observer never
 * writes the segment, never maps it (so a shrink cannot SIGBUS it), and
 * never calls glibc on its mutexes (it reads the robust-futex word of its
 * copy instead, see observed_alive).
 */
#include "internal.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>     /* shm_open */
#include <sys/stat.h>

/* ------------------------------------------------------------- snapshots */

/* Is the exclusive claim in state word s a hold (granted), not merely a
 * claim?  GRANTED is set before the claimant's last scan of the reader
 * counts, so it may still wait for readers then.  The header's exclusive_pid
 * is written only once the hold is granted (grant_exclusive) and cleared
 * before the claim bits on release; owner_pid is the claimant slot's pid.
 * Relaxed is enough for a snapshot: the seq_cst load of s already follows the
 * release CAS that ended any earlier hold, so that holder's clear is visible
 * and its pid cannot pass for the claimant's. */
static int exclusive_held(const struct shl_header *hd, uint32_t s, uint32_t owner_pid)
{
    return (s & ST_GRANTED) && owner_of(s) != 0 && owner_pid != 0 &&
           atomic_load_explicit(&hd->exclusive_pid, memory_order_relaxed) == owner_pid;
}

/* The snapshot of the header hd (a mapping, or an observer's copy) with the
 * validated max, for an attached handle and an observer alike; the owner's
 * pid is filled in by snapshot_owner.  SHL_ECORRUPT if the state word names
 * no slot of the segment. */
static int take_snapshot(const struct shl_header *hd, uint32_t max, shl_snapshot *out)
{
    uint32_t s = atomic_load_explicit(&hd->state, memory_order_seq_cst);
    int32_t o = owner_slot(s, max);
    if (o == -2)
        return SHL_ECORRUPT;
    memset(out, 0, sizeof *out);
    out->state = s;
    out->paused = (s & ST_PAUSED) != 0;
    out->exclusive_slot = o;
    out->exclusive_kind = o < 0 ? 0 : (s & ST_UPDATE) ? SHL_KIND_UPDATE : SHL_KIND_WRITE;
    out->epoch = ST_EPOCH(s);
    out->pause_count = atomic_load_explicit(&hd->pause_count, memory_order_relaxed);
    out->paused_by_pid = atomic_load_explicit(&hd->paused_by_pid, memory_order_relaxed);
    out->paused_at_ns = atomic_load_explicit(&hd->paused_at_ns, memory_order_relaxed);
    out->data_suspect = (s & ST_SUSPECT) != 0;
    out->max_processes = max;
    out->recovery_count = atomic_load_explicit(&hd->recovery_count, memory_order_relaxed);
    out->creator_pid = hd->creator_pid;
    out->self_slot = -1;
    int64_t now = mono_ns();
    if (s & ST_PINNED) {
        uint64_t t = atomic_load_explicit(&hd->session_token, memory_order_acquire);
        /* a token word being ended (its top bit: session.c) names no session */
        out->session_token = (t >> 63) ? 0 : t;
        out->session_pid = atomic_load_explicit(&hd->session_pid, memory_order_relaxed);
        out->session_began_ns = atomic_load_explicit(&hd->session_began_ns, memory_order_relaxed);
        out->session_remaining_ns =
            sat_sub(atomic_load_explicit(&hd->session_deadline_ns, memory_order_relaxed), now);
    }
    out->session_expiries = atomic_load_explicit(&hd->session_expiries, memory_order_relaxed);
    out->fence = atomic_load_explicit(&hd->fence, memory_order_relaxed);
    out->applied = atomic_load_explicit(&hd->applied, memory_order_relaxed);
    int64_t lease = atomic_load_explicit(&hd->lease_deadline_ns, memory_order_relaxed);
    out->lease_armed = lease != 0;
    out->lease_remaining_ns = lease ? sat_sub(lease, now) : 0;
    out->lease_pid = atomic_load_explicit(&hd->lease_pid, memory_order_relaxed);
    out->crash_recovery = (core_platform() & SHL_PLATFORM_ROBUST) != 0;
    return SHL_OK;
}

/* The exclusive owner's pid (read from slot exclusive_slot by the caller),
 * and whether its claim is a granted hold. */
static void snapshot_owner(const struct shl_header *hd, uint32_t owner_pid, shl_snapshot *out)
{
    out->exclusive_pid = owner_pid;
    out->exclusive_granted = exclusive_held(hd, out->state, owner_pid);
}

/* The counters of one slot (no liveness verdict: that is the caller's). */
static void read_slot(const struct shl_slot *sl, shl_slot_snapshot *out)
{
    memset(out, 0, sizeof *out);
    out->pid = atomic_load_explicit(&sl->pid, memory_order_relaxed);
    out->readers = atomic_load_explicit(&sl->readers, memory_order_relaxed);
    out->owed = atomic_load_explicit(&sl->rwait[0], memory_order_relaxed) +
                atomic_load_explicit(&sl->rwait[1], memory_order_relaxed);
    out->waiting = atomic_load_explicit(&sl->waiting, memory_order_relaxed);
    out->pidns = atomic_load_explicit(&sl->pidns, memory_order_relaxed);
}

/* One entry of the recovery log. */
static void read_recovery(const struct shl_recovery_entry *e, shl_recovery_record *out)
{
    /* relaxed: a log entry for display (record_recovery) */
    out->pid = __atomic_load_n(&e->pid, __ATOMIC_RELAXED);
    out->what = __atomic_load_n(&e->what, __ATOMIC_RELAXED);
    out->reads = __atomic_load_n(&e->reads, __ATOMIC_RELAXED);
    out->owed = __atomic_load_n(&e->owed, __ATOMIC_RELAXED);
    out->when_ns = __atomic_load_n(&e->when_ns, __ATOMIC_RELAXED);
}

/* ------------------------------------------------------ an attached handle */

static int do_info(shl_lock *h, shl_snapshot *out)
{
    int r = ensure_attached(h);
    if (r == SHL_OK)
        r = take_snapshot(h->hdr, h->max, out);
    if (r != SHL_OK)
        return r;
    int32_t o = out->exclusive_slot;
    snapshot_owner(h->hdr, o < 0 ? 0 : atomic_load_explicit(&h->slots[o].pid,
                                                            memory_order_relaxed), out);
    out->self_slot = self_slot(h);
    return SHL_OK;
}

int shl_info(shl_lock *h, shl_snapshot *out)
{
    RUN_IN_FLIGHT(h, do_info(h, out));
}

static int do_slot_info(shl_lock *h, uint32_t index, shl_slot_snapshot *out)
{
    if (index >= h->max)
        return SHL_EINVAL;
    int r = ensure_attached(h);
    if (r != SHL_OK)
        return r;
    struct shl_slot *sl = &h->slots[index];
    memset(out, 0, sizeof *out);
    if (atomic_load_explicit(&sl->pid, memory_order_relaxed) == 0 && slot_is_clean(sl))
        return SHL_OK;   /* free */
    int alive = probe_slot(h, index);   /* reclaims a dead owner's holds */
    read_slot(sl, out);
    out->alive = alive != PROBE_DEAD;
    out->exiting = alive == PROBE_EXITING;
    out->is_self = (int32_t)index == self_slot(h);
    return SHL_OK;
}

int shl_slot_info(shl_lock *h, uint32_t index, shl_slot_snapshot *out)
{
    RUN_IN_FLIGHT(h, do_slot_info(h, index, out));
}

static int do_recovery_info(shl_lock *h, uint32_t index, shl_recovery_record *out)
{
    read_recovery(&h->hdr->recoveries[index], out);
    return SHL_OK;
}

int shl_recovery_info(shl_lock *h, uint32_t index, shl_recovery_record *out)
{
    if (index >= SHL_RECOVERY_LOG)
        return h == NULL ? SHL_ECLOSED : SHL_EINVAL;
    RUN_IN_FLIGHT(h, do_recovery_info(h, index, out));
}

static int do_is_paused(shl_lock *h)
{
    /* acquire: a caller that sees the gate open sees what its resumer wrote */
    return (atomic_load_explicit(&h->hdr->state, memory_order_acquire) & ST_PAUSED) != 0;
}

int shl_is_paused(shl_lock *h)
{
    RUN_IN_FLIGHT(h, do_is_paused(h));
}

uint32_t shl_load_state(shl_lock *h)
{
    if (enter(&h) != SHL_OK)
        return 0;
    /* acquire, as do_is_paused */
    uint32_t v = atomic_load_explicit(&h->hdr->state, memory_order_acquire);
    leave(h);
    return v;
}

/* --------------------------------------------------------------- observers */

/*
 * An observer never maps the segment: it reads copies with pread().  The
 * segment belongs to an owner the observer need not trust (another user's
 * 0644 lock), and a mapping would let that owner kill the observer with
 * SIGBUS by shrinking the file; a read past the new end is just short,
 * which the observer reports as SHL_ESIZE.  Each call reads only what it
 * reports: the header, or one slot, or one log entry.  A copy is not one
 * atomic picture, exactly like the relaxed loads of an attached snapshot.
 */
struct shl_observer {
    int fd;                         /* O_RDONLY; never mapped, never written */
    uint32_t max;                   /* validated private copy */
};

/* Copy len bytes at offset off of the segment into buf.  SHL_ESIZE if the
 * segment no longer holds them (shrunk since the observer opened it). */
static int observe_read(const shl_observer *o, void *buf, size_t len, size_t off)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = pread(o->fd, (char *)buf + done, len - done, (off_t)(off + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return SHL_ESYS;
        if (n == 0)
            return SHL_ESIZE;
        done += (size_t)n;
    }
    return SHL_OK;
}

/* Validate the observed segment's slots, as an opener does (validate_slots),
 * from copies read a chunk at a time. */
static int observe_validate_slots(const shl_observer *o, shl_corruption *why)
{
    enum { CHUNK = 64 };
    struct shl_slot *buf = malloc(CHUNK * sizeof *buf);
    if (buf == NULL) {
        errno = ENOMEM;
        return SHL_ESYS;
    }
    int r = SHL_OK;
    for (uint32_t i = 0; r == SHL_OK && i < o->max; i += CHUNK) {
        uint32_t n = o->max - i < CHUNK ? o->max - i : CHUNK;
        r = observe_read(o, buf, n * sizeof *buf,
                         sizeof(struct shl_header) + (size_t)i * sizeof *buf);
        if (r == SHL_OK)
            r = validate_slots(buf, i, n, why);
    }
    free(buf);
    return r;
}

int shl_observe_open(const char *name, shl_observer **out, shl_corruption *why)
{
    char path[SHL_PATH_MAX];
    *out = NULL;
    if (shl_segment_path(name, 0, path, sizeof path) < 0)
        return SHL_EINVAL;
    core_init();   /* the platform check */
    /* O_NONBLOCK: anyone can mkfifo a name in /dev/shm, and opening a FIFO
     * for reading would block until a writer comes.  (No effect on a
     * regular file; pread never blocks on one.) */
    shl_observer probe = {shm_open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC, 0), 0};
    if (probe.fd < 0)
        return SHL_ESYS;
    struct stat st;
    struct shl_header hd;
    int r = SHL_OK;
    if (fstat(probe.fd, &st) != 0)
        r = SHL_ESYS;
    else if (!S_ISREG(st.st_mode))
        r = SHL_EFOREIGN;   /* a FIFO, a socket, ...: never a lock */
    else if (st.st_size == 0)
        r = SHL_EINIT;   /* no wait for a creator: it sets the size before any byte */
    else if ((size_t)st.st_size < sizeof hd)
        r = SHL_EFOREIGN;
    else
        r = observe_read(&probe, &hd, sizeof hd, 0);
    /* relaxed: a copy's field (the fence below orders our later loads) */
    if (r == SHL_OK && atomic_load_explicit(&hd.ready, memory_order_relaxed) != SHL_READY) {
        r = (hd.magic != 0 && hd.magic != SHL_MAGIC) ? SHL_EFOREIGN : SHL_EINIT;
    } else if (r == SHL_OK) {
        /* READY was seen in the first copy; the creator stores it last, with
         * release (init_segment).  A kernel copy gives no formal ordering,
         * so the second copy is what counts, and it is fully validated:
         * a stale or torn header is a clear error, never an unsafe access.
         * The acquire fence keeps our own loads of it after the check
         * above. */
        atomic_thread_fence(memory_order_acquire);
        r = observe_read(&probe, &hd, sizeof hd, 0);
        if (r == SHL_OK)
            r = validate_header(&hd, (size_t)st.st_size, &probe.max, why);
        if (r == SHL_OK)
            r = observe_validate_slots(&probe, why);
    }
    shl_observer *o = r == SHL_OK ? malloc(sizeof *o) : NULL;
    if (r == SHL_OK && !o) {
        errno = ENOMEM;
        r = SHL_ESYS;
    }
    if (r != SHL_OK) {
        int e = errno;
        close(probe.fd);
        errno = e;
        return r;
    }
    *o = probe;
    *out = o;
    return SHL_OK;
}

void shl_observe_close(shl_observer *o)
{
    if (o == NULL)
        return;
    close(o->fd);
    free(o);
}

/* Is the owner of slot `index` alive (PROBE_ALIVE), exiting (its keeper is
 * gone, the process still runs: PROBE_EXITING) or dead (PROBE_DEAD), judged
 * without locking anything?  The kernel's robust-futex ABI keeps the
 * keeper's TID in the mutex word while it lives, and replaces it with
 * FUTEX_OWNER_DIED when the keeper thread exits; a prober that found the
 * process still running leaves the mutex free.  Then the process's liveness
 * lock and /proc tell (liveness.c: the same test attached probers make).  A
 * process probing the slot holds its mutex for a few instructions, which
 * reads as alive: an observer may call a dead owner alive for that instant,
 * never a live one dead. */
static int observed_alive(const shl_observer *o, const struct shl_slot *sl, uint32_t index)
{
#ifdef __GLIBC__
    pthread_mutex_t *m = (pthread_mutex_t *)&sl->owner;   /* only read below */
    if (!slot_mutex_sane(m))
        return PROBE_ALIVE;   /* not one of our mutexes: never called dead */
    /* acquire: of a copy, a formality (the copy's bytes are ours) */
    uint32_t w = __atomic_load_n(mutex_word(m), __ATOMIC_ACQUIRE);
    if ((w & FUTEX_TID_MASK) != 0 && !(w & FUTEX_OWNER_DIED))
        return PROBE_ALIVE;
    return liveness_gone(o->fd, sl, index) ? PROBE_DEAD : PROBE_EXITING;
#else
    (void)o; (void)sl; (void)index;
    return PROBE_ALIVE;
#endif
}

int shl_observe_info(shl_observer *o, shl_snapshot *out)
{
    if (o == NULL)
        return SHL_ECLOSED;
    struct shl_header hd;
    int r = observe_read(o, &hd, sizeof hd, 0);
    if (r == SHL_OK)
        r = take_snapshot(&hd, o->max, out);
    if (r != SHL_OK)
        return r;
    uint32_t owner_pid = 0;
    if (out->exclusive_slot >= 0) {
        struct shl_slot sl;
        r = observe_read(o, &sl, sizeof sl,
                         sizeof hd + (size_t)out->exclusive_slot * sizeof sl);
        if (r != SHL_OK)
            return r;
        owner_pid = atomic_load_explicit(&sl.pid, memory_order_relaxed);
    }
    snapshot_owner(&hd, owner_pid, out);
    return SHL_OK;
}

int shl_observe_slot(shl_observer *o, uint32_t index, shl_slot_snapshot *out)
{
    if (o == NULL)
        return SHL_ECLOSED;
    if (index >= o->max)
        return SHL_EINVAL;
    struct shl_slot sl;
    int r = observe_read(o, &sl, sizeof sl,
                         sizeof(struct shl_header) + (size_t)index * sizeof sl);
    if (r == SHL_OK)
        r = validate_slots(&sl, index, 1, NULL);   /* corrupted since the open */
    if (r != SHL_OK)
        return r;
    read_slot(&sl, out);
    if (out->pid == 0 && out->readers == 0 && out->owed == 0) {
        out->pidns = 0;
        return SHL_OK;   /* free */
    }
    int alive = observed_alive(o, &sl, index);
    out->alive = alive != PROBE_DEAD;
    out->exiting = alive == PROBE_EXITING;
    return SHL_OK;
}

int shl_observe_recovery(shl_observer *o, uint32_t index, shl_recovery_record *out)
{
    if (o == NULL)
        return SHL_ECLOSED;
    if (index >= SHL_RECOVERY_LOG)
        return SHL_EINVAL;
    struct shl_recovery_entry e;
    int r = observe_read(o, &e, sizeof e,
                         offsetof(struct shl_header, recoveries) + index * sizeof e);
    if (r == SHL_OK)
        read_recovery(&e, out);
    return r;
}
