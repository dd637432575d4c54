/*
 * slots.c - the per-process slots of a segment: probing a slot's owner for
 * death and reclaiming everything a dead process held.  The bottom layer of
 * the core: it calls nothing but internal.h's tools.
 *
 * A slot is owned by a process exactly while that process's keeper
 * (process.c) holds the slot's robust mutex, so probe_slot's trylock is the
 * death test: EBUSY alive, EOWNERDEAD dead (reclaim, then free the slot).
 * Reclaiming (recover_slot) is idempotent and always wakes everyone: the
 * dead process may have died between changing a word and the wake-up it
 * owed.  A waiter also always watches the slot the state word names as
 * owner, even a free one, and reclaims a free slot that is named or holds
 * leftovers (wait.c).
 *
 * Untrusted input: a slot's mutex is shared memory that glibc would act on,
 * so no pthread call touches one before slot_mutex_sane approves it; slot
 * indices come from the validated private max, never from the segment.
 */
#include "internal.h"

#include <sys/stat.h>

/* ------------------------------------------------ glibc-private mutex fields */

/*
 * The core reads two fields of glibc's pthread_mutex_t that are not part of
 * any API: __data.__kind (slot_mutex_sane: is this a mutex of our kind?)
 * and __data.__lock (mutex_word: the robust-futex word, which the kernel's
 * robust-futex ABI defines: the owner's TID, FUTEX_WAITERS and
 * FUTEX_OWNER_DIED).  This is the only place that names them, and the
 * assertions below stop the build if glibc's layout ever moves them, as
 * glibc guards its own offsets.  On another libc (musl) neither is
 * compiled: every mutex counts as sane, a waiter has no death watch and
 * probes every NO_WAITV_PROBE_NS instead, and an observer calls every
 * owner alive (docs/DESIGN.md, "Map").
 */
#ifdef __GLIBC__
_Static_assert(offsetof(pthread_mutex_t, __data.__lock) == 0,
               "the robust-futex word is the first word of a glibc mutex");
_Static_assert(sizeof(((pthread_mutex_t *)0)->__data.__lock) == sizeof(uint32_t),
               "the robust-futex word is 32 bits");
_Static_assert(sizeof(((pthread_mutex_t *)0)->__data.__kind) == sizeof(int),
               "glibc's mutex kind is an int");
_Static_assert(offsetof(pthread_mutex_t, __data.__kind) + sizeof(int) <= sizeof(pthread_mutex_t),
               "glibc's mutex kind lies inside the mutex");

uint32_t *mutex_word(pthread_mutex_t *m) { return (uint32_t *)&m->__data.__lock; }
#endif

/*
 * The slot mutexes live in shared memory, so glibc would act on whatever
 * bytes are there.  Before any pthread call touches one, check that it is a
 * mutex of the kind we create (robust, process-shared), by comparing glibc's
 * kind field with that of a reference mutex initialised here.  A foreign or
 * corrupted mutex makes the slot count as corrupt instead of reaching glibc.
 * (A malicious peer with write access can still corrupt a mutex while it is
 * held; see docs/DESIGN.md, "Shared memory is untrusted".)
 */
int slot_mutex_sane(const pthread_mutex_t *m)
{
#ifdef __GLIBC__
    static int want = -1;
    if (want == -1) {
        pthread_mutex_t ref;
        init_slot_mutex(&ref);
        want = ref.__data.__kind;
        pthread_mutex_destroy(&ref);
    }
    return __atomic_load_n(&m->__data.__kind, __ATOMIC_RELAXED) == want;
#else
    (void)m;
    return 1;
#endif
}

/* ------------------------------------------------------- slots and recovery */

/* Mark the protected data suspect, counting the mark (see FLAG_MARK_ONE).
 * seq_cst: the mark precedes the CAS that lets the next holder or a resume
 * in (the claim cleared by recovery, the unpin of an expired session), so
 * whoever that CAS lets in sees it. */
void mark_suspect(shl_lock *h)
{
    uint32_t f = atomic_load_explicit(&h->hdr->flags, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&h->hdr->flags, &f,
                                                  (f + FLAG_MARK_ONE) | FLAG_DATA_SUSPECT,
                                                  memory_order_seq_cst, memory_order_relaxed)) {
    }
}

/* The data was rewritten by what began when the mark count was `marks`:
 * clear the mark, unless a mark was made since (it is not ours to clear).
 * relaxed: the release CAS or unpin that follows publishes it. */
void unmark_suspect(shl_lock *h, uint32_t marks)
{
    uint32_t f = atomic_load_explicit(&h->hdr->flags, memory_order_relaxed);
    while ((f & FLAG_DATA_SUSPECT) && FLAG_MARKS(f) == marks &&
           !atomic_compare_exchange_weak_explicit(&h->hdr->flags, &f, f & ~FLAG_DATA_SUSPECT,
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
}

void record_recovery(shl_lock *h, uint32_t pid, uint32_t what,
                     uint32_t reads, uint32_t owed)
{
    struct shl_header *hd = h->hdr;
    /* The index comes from a shared counter: reduce it modulo the log size
     * before use, whatever value the segment holds. */
    uint32_t n = atomic_fetch_add_explicit(&hd->recovery_count, 1, memory_order_relaxed);
    struct shl_recovery_entry *e = &hd->recoveries[n % SHL_RECOVERY_LOG];
    __atomic_store_n(&e->pid, pid, __ATOMIC_RELAXED);
    __atomic_store_n(&e->what, what, __ATOMIC_RELAXED);
    __atomic_store_n(&e->reads, reads, __ATOMIC_RELAXED);
    __atomic_store_n(&e->owed, owed, __ATOMIC_RELAXED);
    __atomic_store_n(&e->when_ns, real_ns(), __ATOMIC_RELAXED);
}

/*
 * Reclaim everything slot i holds.  The caller owns slot i's mutex (it got
 * EOWNERDEAD, or found the mutex free), so the slot's owner is gone and no
 * process can take the slot until the caller unlocks it.  Idempotent: a
 * recoverer that itself dies leaves the mutex OWNER_DIED again, and the next
 * prober repeats the work.
 */
void recover_slot(shl_lock *h, uint32_t i)
{
    struct shl_header *hd = h->hdr;
    struct shl_slot *sl = &h->slots[i];
    uint32_t pid = atomic_load_explicit(&sl->pid, memory_order_relaxed);
    uint32_t reads = atomic_exchange_explicit(&sl->readers, 0, memory_order_seq_cst); /* [model:RECOVER_READS] */
    uint32_t owed = atomic_exchange_explicit(&sl->rwait[0], 0, memory_order_seq_cst); /* [model:RECOVER_OWED] */
    owed += atomic_exchange_explicit(&sl->rwait[1], 0, memory_order_seq_cst);
    atomic_store_explicit(&sl->waiting, 0, memory_order_relaxed);
    uint32_t what = 0;

    uint32_t s = atomic_load_explicit(&hd->state, memory_order_seq_cst);
    /* Held, not only claimed: grant_exclusive names the holder's pid in the
     * header before the hold is used (a claim still draining for readers
     * has GRANTED set but wrote nothing). */
    int held = atomic_load_explicit(&hd->exclusive_pid, memory_order_relaxed) == pid && pid != 0;
    while (owner_of(s) == i + 1) {   /* [model:RECOVER_CLAIM] */
        uint32_t ns = s & ~(ST_CLAIM_BITS | ST_SLEEPERS);
        if ((s & ST_GRANTED) && held)
            /* Mark suspect before the hold is released, so that whoever is
             * granted next already sees the mark, and a resume that sees the
             * update gone sees it too (seq_cst like the CAS it precedes). */
            mark_suspect(h);   /* [model:RECOVER_MARK] */
        if (atomic_compare_exchange_weak_explicit(&hd->state, &s, ns, memory_order_seq_cst,
                                                  memory_order_seq_cst)) {
            if (!(s & ST_GRANTED) || !held)
                what |= SHL_LOST_CLAIM;
            else
                what |= (s & ST_UPDATE) ? SHL_LOST_UPDATE : SHL_LOST_WRITE;
            atomic_store_explicit(&hd->exclusive_pid, 0, memory_order_relaxed);
            break;
        }
    }
    /* A session end the dead process had taken on and not finished. */
    session_recover(h, i);
    if (reads) what |= SHL_LOST_READS;
    if (owed) what |= SHL_LOST_WAITERS;
    if (what)
        record_recovery(h, pid, what, reads, owed);
    /* [model:RECOVER_WAKE] Wake everyone on both words, whatever the bits
     * say: the dead process may have died between a CAS that cleared a
     * sleeper bit and the FUTEX_WAKE it owed. */
    atomic_fetch_and_explicit(&hd->state, ~(ST_SLEEPERS | ST_DRAINERS), memory_order_seq_cst);
    atomic_fetch_add_explicit(&hd->drain_seq, 1, memory_order_seq_cst);
    futex_wake_all(&hd->state);
    futex_wake_all(&hd->drain_seq);
    atomic_store_explicit(&sl->pid, 0, memory_order_relaxed);
}

int slot_is_clean(const struct shl_slot *sl)
{
    return atomic_load_explicit(&sl->readers, memory_order_relaxed) == 0 &&
           atomic_load_explicit(&sl->rwait[0], memory_order_relaxed) == 0 &&
           atomic_load_explicit(&sl->rwait[1], memory_order_relaxed) == 0;
}

void init_slot_mutex(pthread_mutex_t *m)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(m, &a);
    pthread_mutexattr_destroy(&a);
}

/* Is slot i owned by a live process?  Reclaims it if its owner is dead (or
 * if it is free but holds leftovers).  Returns 1 alive, 0 not. */
int probe_slot(shl_lock *h, uint32_t i)
{
    if ((int32_t)i == h->self)
        return 1;
    struct shl_slot *sl = &h->slots[i];
    if (!slot_mutex_sane(&sl->owner))
        return 1;   /* corrupt: never reclaimed, never handed to glibc */
    int r = pthread_mutex_trylock(&sl->owner);   /* [model:PROBE] */
    if (r == EBUSY)
        return 1;
    if (r == EOWNERDEAD) {
        recover_slot(h, i);
        pthread_mutex_consistent(&sl->owner);
        pthread_mutex_unlock(&sl->owner);
        return 0;
    }
    if (r == 0) {
        if (owner_of(atomic_load_explicit(&h->hdr->state, memory_order_relaxed)) == i + 1 ||
            !slot_is_clean(sl))
            recover_slot(h, i);
        pthread_mutex_unlock(&sl->owner);
        return 0;
    }
    if (r == ENOTRECOVERABLE) {
        /* Only reachable if someone unlocked an OWNER_DIED mutex without
         * reclaiming it; the mutex is useless, so re-create it. */
        recover_slot(h, i);
        init_slot_mutex(&sl->owner);
        return 0;
    }
    return 1;
}
