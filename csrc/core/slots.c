/*
 * slots.c - the per-process slots of a segment: probing a slot's owner for
 * death and reclaiming everything a dead process held.  It calls
 * internal.h's tools, liveness.c (is a process gone) and, for a session end
 * the dead process left half done, session.c.
 *
 * A slot's process keeps the slot's robust mutex locked from its keeper
 * (process.c), so probe_slot's trylock is the first test: EBUSY, the
 * keeper lives, and so does its process.  EOWNERDEAD (the keeper died) or a
 * free mutex with leftovers makes the prober the slot's only reclaimer
 * (nobody can take the mutex meanwhile), and then liveness.c decides: the
 * whole process gone, reclaim and free the slot; still running (its keeper
 * exited alone, or the rest of a dying process has not finished exiting),
 * the slot is "exiting": its holds stand, the mutex is given back (free,
 * consistent), and every later prober asks again.
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
#ifdef __GLIBC__
static int g_mutex_kind;
static pthread_once_t g_mutex_kind_once = PTHREAD_ONCE_INIT;

static void read_mutex_kind(void)
{
    pthread_mutex_t ref;
    init_slot_mutex(&ref);
    g_mutex_kind = ref.__data.__kind;
    pthread_mutex_destroy(&ref);
}
#endif

int slot_mutex_sane(const pthread_mutex_t *m)
{
#ifdef __GLIBC__
    /* The reference kind, computed once (pthread_once orders its write
     * before every caller's read: threads may probe at the same time). */
    pthread_once(&g_mutex_kind_once, read_mutex_kind);
    /* relaxed: a field fixed at the mutex's initialisation */
    return __atomic_load_n(&m->__data.__kind, __ATOMIC_RELAXED) == g_mutex_kind;
#else
    (void)m;
    return 1;
#endif
}

int slot_mutex_kind(const pthread_mutex_t *m)
{
#ifdef __GLIBC__
    /* relaxed: as in slot_mutex_sane */
    return __atomic_load_n(&m->__data.__kind, __ATOMIC_RELAXED);
#else
    (void)m;
    return 0;
#endif
}

/* ------------------------------------------------------- slots and recovery */

/* The first step of a mark (internal.h, "The data-suspect mark"): count
 * it.  The caller then sets SUSPECT with the CAS that ends what was lost.
 * seq_cst, before that CAS: a section that ends later and compares the
 * count (suspect_after) after loading the state word either sees this
 * count, or loaded the word before the CAS changed it, and then its own
 * CAS fails and it looks again. */
void mark_counted(shl_lock *h)
{
    atomic_fetch_add_explicit(&h->hdr->marks, 1, memory_order_seq_cst);
}

/* The state word s, as the CAS that ends a section begun when the mark
 * count was `marks` should leave SUSPECT: cleared if no mark was made since
 * (the section rewrote the data), else kept.  The count is loaded after s
 * (seq_cst both, the caller's CAS from s next): see mark_counted. */
uint32_t suspect_after(shl_lock *h, uint32_t s, uint32_t marks)
{
    return atomic_load_explicit(&h->hdr->marks, memory_order_seq_cst) == marks ? s & ~ST_SUSPECT
                                                                               : s;
}

void record_recovery(shl_lock *h, uint32_t pid, uint32_t what,
                     uint32_t reads, uint32_t owed)
{
    struct shl_header *hd = h->hdr;
    /* The index comes from a shared counter: reduce it modulo the log size
     * before use, whatever value the segment holds. */
    uint32_t n = atomic_fetch_add_explicit(&hd->recovery_count, 1, memory_order_relaxed);
    struct shl_recovery_entry *e = &hd->recoveries[n % SHL_RECOVERY_LOG];
    /* relaxed: a log entry for display (a reader may see a torn entry
     * while another is written over it: only what info() shows) */
    __atomic_store_n(&e->pid, pid, __ATOMIC_RELAXED);
    __atomic_store_n(&e->what, what, __ATOMIC_RELAXED);
    __atomic_store_n(&e->reads, reads, __ATOMIC_RELAXED);
    __atomic_store_n(&e->owed, owed, __ATOMIC_RELAXED);
    __atomic_store_n(&e->when_ns, real_ns(), __ATOMIC_RELAXED);
}

/*
 * Reclaim everything slot i holds.  The caller owns slot i's mutex (it got
 * EOWNERDEAD, or found the mutex free) and liveness.c said the process is
 * gone, so nothing of it runs any more and no process can take the slot
 * until the caller unlocks it.  Idempotent: a recoverer that itself dies
 * leaves the mutex OWNER_DIED again, and the next prober repeats the work.
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
    int counted = 0;
    while (owner_of(s) == i + 1) {   /* [model:RECOVER_CLAIM] */
        uint32_t ns = s & ~(ST_CLAIM_BITS | ST_SLEEPERS);
        if ((s & ST_GRANTED) && held) {
            /* A lost hold's data is suspect: counted first, then marked by
             * the very CAS that clears the claim, so whoever is granted
             * next, and a resume that sees the update gone, sees it. */
            if (!counted)
                mark_counted(h);   /* [model:RECOVER_MARK] */
            counted = 1;
            ns |= ST_SUSPECT;
        }
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
    atomic_store_explicit(&sl->start_ticks, 0, memory_order_relaxed);
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

/* Is slot i's process still there?  Reclaims it if it is gone (or if the
 * slot is free but holds leftovers).  PROBE_ALIVE (its keeper holds the
 * mutex, or it is this process's slot or a corrupt one), PROBE_EXITING (its
 * keeper is gone, the process still runs: nothing reclaimed), PROBE_DEAD
 * (free, or reclaimed now). */
int probe_slot(shl_lock *h, uint32_t i)
{
    if ((int32_t)i == self_slot(h))
        return PROBE_ALIVE;
    struct shl_slot *sl = &h->slots[i];
    if (!slot_mutex_sane(&sl->owner))
        return PROBE_ALIVE;   /* corrupt: never reclaimed, never handed to glibc */
    int r = pthread_mutex_trylock(&sl->owner);   /* [model:PROBE] */
    if (r == EBUSY)
        return PROBE_ALIVE;
    if (r != 0 && r != EOWNERDEAD && r != ENOTRECOVERABLE)
        return PROBE_ALIVE;
    /* We are the slot's only prober now (or, ENOTRECOVERABLE: only
     * reachable if someone unlocked an OWNER_DIED mutex without making it
     * consistent; the mutex is useless and is made anew below).  Something
     * to reclaim: a keeper that died, a claim or counts left, or a pid left
     * in a free slot (an exiting process whose slot a prober gave back:
     * cleared once it is gone, so that nobody watches the slot for ever).
     * The state word relaxed: a claim of slot i was made by its owner
     * before the mutex we hold now passed to us (which orders it). */
    int leftovers = r != 0 ||
                    owner_of(atomic_load_explicit(&h->hdr->state, memory_order_relaxed)) == i + 1 ||
                    !slot_is_clean(sl) || atomic_load_explicit(&sl->pid, memory_order_relaxed) != 0;
    int gone = !leftovers || liveness_gone(h->lockfd, sl, i);   /* [model:PROBE_GONE] */
    if (gone && leftovers)
        recover_slot(h, i);
    if (r == ENOTRECOVERABLE) {
        if (gone)
            init_slot_mutex(&sl->owner);
        return gone ? PROBE_DEAD : PROBE_EXITING;
    }
    if (r == EOWNERDEAD)
        pthread_mutex_consistent(&sl->owner);
    pthread_mutex_unlock(&sl->owner);
    return gone ? PROBE_DEAD : PROBE_EXITING;
}
