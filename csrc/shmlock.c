/*
 * shmlock.c - the pyshmlock C core.
 *
 * ======================================================================
 *  Protocol overview (docs/DESIGN.md has the long form and the proofs)
 * ======================================================================
 *
 * One POSIX shared-memory segment "/pyshmlock.<name>" holds:
 *
 *   header   magic, layout version, sizes, max_processes (fixed by the
 *            creator), the 32-bit STATE WORD, the DRAIN COUNTER, and
 *            observability fields (who paused, recovery log).
 *   slots    max_processes per-process records.  A process owns exactly one
 *            slot per lock it has open.  All per-process state lives in the
 *            slot: its read-hold count, its queued ("owed") readers, and a
 *            robust process-shared mutex that says whether the owner lives.
 *
 * The state word (all gate decisions are made on it, atomically):
 *
 *   bits  0-11  OWNER     slot index + 1 of the exclusive claimant (0: none)
 *   bit     12  UPDATE    the claim is an update (pins the pause)
 *   bit     13  GRANTED   the claim has finished waiting for readers
 *   bit     14  PAUSED    no new read hold is granted anywhere
 *   bit     15  SLEEPERS  someone sleeps on the state word (futex)
 *   bit     16  DRAINERS  someone sleeps on the drain counter (futex)
 *   bits 17-31  EPOCH     counts exclusive claims (wraps)
 *
 * Read admission is a Dekker handshake between a reader and the exclusive
 * claimant, with sequentially consistent operations on both sides:
 *
 *   reader:   slot.readers += 1 ; s = load(state) ;
 *             admitted if !PAUSED && OWNER == 0 (or the owed-reader rule)
 *             otherwise slot.readers -= 1 and wait.
 *   writer:   CAS(state: OWNER = me) ; then scan every slot.readers.
 *
 * In the single total order of seq_cst operations either the reader's load
 * follows the claim (it sees OWNER and backs out) or the writer's scan
 * follows the increment (it sees the reader and waits).  Both cannot miss.
 * The same handshake makes pause() atomic against admission.
 *
 * Phase fairness.  A reader that finds an exclusive claim with epoch E
 * registers in slot.rwait[E & 1] ("owed").  When the claim of epoch E ends
 * and a later claim E' != E is made, the owed reader may enter while E' is
 * still draining (not GRANTED), and the claimant of E' waits for every owed
 * reader of parity (E'-1) & 1 before it sets GRANTED.  So a reader waits
 * through at most one exclusive phase; a writer waits through at most the
 * readers present or owed when it claimed.  After setting GRANTED the writer
 * scans the reader counts once more (second Dekker pair), so a late owed
 * reader that slipped in is waited for, never overlapped.
 *
 * Waiting uses Linux futexes on shared (not private) words.  A waiter sets
 * SLEEPERS or DRAINERS before it sleeps; whoever changes a condition that a
 * sleeper may wait for clears the bit and wakes all.  No FUTEX_WAKE is
 * issued when no bit is set, so the uncontended paths make no system call.
 *
 * Crash safety.  Every process keeps its slot's robust mutex locked from a
 * small "keeper" thread that lives as long as the process (holding it from
 * an application thread would make the slot look dead when that thread
 * exits).  The kernel marks a robust mutex OWNER_DIED when its owner dies,
 * before the process becomes a zombie, so pthread_mutex_trylock() returning
 * EOWNERDEAD is an exact death test that survives PID reuse.  A waiter
 * blocked on a process also sleeps on that process's mutex word through
 * futex_waitv, so a death wakes it at once; it then reclaims the dead slot.
 * ====================================================================== */
#define _GNU_SOURCE
#include "shmlock.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if !defined(__linux__)
#error "pyshmlock needs Linux futexes"
#endif

/* ---------------------------------------------------------------- layout */

#define SHL_MAGIC   0x4C485350u          /* "PSHL" read as little-endian */
#define SHL_LAYOUT  2u
#define SHL_READY   0x59444552u          /* "REDY": creator finished init */

#define ST_OWNER     0x00000FFFu
#define ST_UPDATE    0x00001000u
#define ST_GRANTED   0x00002000u
#define ST_PAUSED    0x00004000u
#define ST_SLEEPERS  0x00008000u
#define ST_DRAINERS  0x00010000u
#define ST_EPOCH_SHIFT 17
#define ST_EPOCH_ONE (1u << ST_EPOCH_SHIFT)
#define ST_EPOCH(s)  ((s) >> ST_EPOCH_SHIFT)
#define ST_CLAIM_BITS (ST_OWNER | ST_UPDATE | ST_GRANTED)

#define FLAG_DATA_SUSPECT 1u

/* How long a waiter sleeps before it re-probes the processes it waits on,
 * as a safety net only: deaths normally wake it through futex_waitv. */
#define SAFETY_NET_NS      (100LL * 1000 * 1000)
#define NO_WAITV_PROBE_NS  (5LL * 1000 * 1000)
#ifndef OPEN_WAIT_NS   /* how long an opener waits for a creator still initialising */
#define OPEN_WAIT_NS       (2000LL * 1000 * 1000)
#endif

struct shl_recovery_entry {
    uint32_t pid, what, reads, owed;
    uint64_t when_ns;
};

struct shl_header {
    uint32_t magic;
    uint32_t layout_version;
    uint32_t header_size;
    uint32_t slot_size;
    uint32_t max_processes;
    uint32_t creator_pid;
    uint64_t total_size;
    _Atomic uint32_t ready;
    _Alignas(64) _Atomic uint32_t state;       /* the gate; own cache line */
    _Alignas(64) _Atomic uint32_t drain_seq;   /* bumped when readers leave */
    _Alignas(64) _Atomic uint32_t flags;
    _Atomic uint32_t paused_by_pid;
    _Atomic uint32_t pause_count;
    _Atomic uint32_t exclusive_pid;
    _Atomic uint64_t paused_at_ns;
    _Atomic uint32_t recovery_count;
    struct shl_recovery_entry recoveries[SHL_RECOVERY_LOG];
    /* Host lease (layout 2, used by the cluster agent): while nonzero, a
     * CLOCK_MONOTONIC deadline that the agent renews.  Once it has passed,
     * every attached process's keeper pauses the gate (fail closed), with
     * the existing pause step.  0: no lease, the lock behaves as in layout 1. */
    _Alignas(64) _Atomic int64_t lease_deadline_ns;
    _Atomic uint32_t lease_pid;         /* who armed it (observability) */
    _Atomic uint32_t lease_expiries;    /* pauses made because it had passed */
};

struct shl_slot {
    pthread_mutex_t owner;          /* robust + pshared, held by the owner's keeper */
    _Atomic uint32_t pid;
    _Atomic uint32_t readers;       /* read holds + transient admission attempts */
    _Atomic uint32_t rwait[2];      /* owed readers, by parity of the epoch queued behind */
    _Atomic uint32_t waiting;       /* threads asleep in shl_wait (observability) */
    _Atomic uint64_t attached_at_ns;
} __attribute__((aligned(64)));

struct shl_lock {
    struct shl_header *hdr;
    struct shl_slot *slots;
    size_t map_size;
    uint32_t max;                   /* validated private copy of max_processes */
    int32_t self;                   /* our slot, -1 when not attached */
    uint64_t fork_gen;              /* g_fork_gen when self was taken */
    _Atomic uint32_t held_reads;    /* process-local truth about our holds */
    _Atomic int32_t held_excl;      /* 0, SHL_KIND_WRITE or SHL_KIND_UPDATE */
    _Atomic unsigned long excl_thread;  /* pthread_t of the thread that got it */
    struct shl_lock *lease_next;    /* the keeper's list of open handles (g_lease_mu) */
};

/* ------------------------------------------------------------ small tools */

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static uint64_t real_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void ns_to_timespec(int64_t ns, struct timespec *ts)
{
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
}

static void futex_wake_all(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Sleep while *word == val, until the absolute CLOCK_MONOTONIC deadline.
 * Returns 0 (woken or value changed), ETIMEDOUT or EINTR. */
static int futex_wait_until(_Atomic uint32_t *word, uint32_t val, int64_t deadline)
{
    struct timespec ts;
    ns_to_timespec(deadline, &ts);
    long r = syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_BITSET, val, &ts,
                     NULL, FUTEX_BITSET_MATCH_ANY);
    if (r == 0) return 0;
    if (errno == ETIMEDOUT || errno == EINTR) return errno;
    return 0;   /* EAGAIN: the value changed before we slept */
}

static uint32_t owner_of(uint32_t s) { return s & ST_OWNER; }

/* The state word is shared memory and so untrusted: an owner index is used
 * only after this bounds check.  Returns the slot index, -1 if none, or -2
 * if the word is corrupt. */
static int32_t owner_index(const shl_lock *h, uint32_t s)
{
    uint32_t o = owner_of(s);
    if (o == 0) return (s & (ST_UPDATE | ST_GRANTED)) ? -2 : -1;
    if (o > h->max) return -2;
    return (int32_t)(o - 1);
}

/* ------------------------------------------------- keeper thread and fork */

/*
 * The keeper thread owns this process's slot mutexes.  Requests reach it
 * through k_mu/k_cv; k_call_mu serialises callers so that one request is in
 * flight at a time.  All of it is process-private.
 */
enum { KEEP_TRYLOCK = 1, KEEP_UNLOCK = 2 };
static pthread_mutex_t k_call_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t k_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t k_cv = PTHREAD_COND_INITIALIZER;
static int k_started, k_op, k_result;
static uint64_t k_req, k_done;
static pthread_mutex_t *k_target;

static _Atomic uint64_t g_fork_gen;

/* Host lease watchdog (docs/DESIGN.md "Beyond one host").  Every open handle
 * is on g_lease_list; the keeper wakes every LEASE_POLL_NS while some listed
 * segment has a lease armed (LEASE_IDLE_NS otherwise, to notice one being
 * armed) and pauses any segment whose lease deadline has passed.  Lock
 * order: k_mu, then g_lease_mu; nobody takes k_mu while holding g_lease_mu. */
#define LEASE_POLL_NS  (20LL * 1000 * 1000)
#define LEASE_IDLE_NS  (250LL * 1000 * 1000)
static pthread_mutex_t g_lease_mu = PTHREAD_MUTEX_INITIALIZER;
static struct shl_lock *g_lease_list;
static int lease_sweep(void);
static _Atomic int g_have_waitv = 1;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void *keeper_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&k_mu);
    int armed = lease_sweep();
    int64_t next = mono_ns() + (armed ? LEASE_POLL_NS : LEASE_IDLE_NS);
    for (;;) {
        while (k_done == k_req) {
            struct timespec ts;
            ns_to_timespec(next, &ts);
            if (pthread_cond_timedwait(&k_cv, &k_mu, &ts) == ETIMEDOUT || mono_ns() >= next) {
                armed = lease_sweep();
                next = mono_ns() + (armed ? LEASE_POLL_NS : LEASE_IDLE_NS);
            }
        }
        int r;
        if (k_op == KEEP_TRYLOCK) {
            r = pthread_mutex_trylock(k_target);
            /* The keeper is the owner now, so it must be the one that marks
             * the mutex consistent; the caller then reclaims the slot. */
            if (r == EOWNERDEAD)
                pthread_mutex_consistent(k_target);
        } else {
            r = pthread_mutex_unlock(k_target);
        }
        k_result = r;
        k_done = k_req;
        pthread_cond_broadcast(&k_cv);
    }
    return NULL;
}

static int keeper_call(int op, pthread_mutex_t *m)
{
    int r;
    pthread_mutex_lock(&k_call_mu);
    pthread_mutex_lock(&k_mu);
    if (!k_started) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_condattr_t ca;
        sigset_t all, old;
        /* The keeper's timed waits (lease polling) run on CLOCK_MONOTONIC. */
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&k_cv, &ca);
        pthread_condattr_destroy(&ca);
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 64 * 1024);
        /* The keeper must never take a signal meant for the application. */
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        r = pthread_create(&t, &attr, keeper_main, NULL);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&attr);
        if (r != 0) {
            pthread_mutex_unlock(&k_mu);
            pthread_mutex_unlock(&k_call_mu);
            errno = r;
            return -1;
        }
        k_started = 1;
    }
    k_op = op;
    k_target = m;
    uint64_t mine = ++k_req;
    pthread_cond_broadcast(&k_cv);
    while (k_done != mine)
        pthread_cond_wait(&k_cv, &k_mu);
    r = k_result;
    pthread_mutex_unlock(&k_mu);
    pthread_mutex_unlock(&k_call_mu);
    return r;
}

/* In a forked child only the forking thread exists: no keeper, and the
 * keeper's private mutexes may be in any state.  Start afresh; handles
 * notice the new fork generation and take a slot of their own. */
static void after_fork_in_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t fresh_cv = PTHREAD_COND_INITIALIZER;
    k_call_mu = fresh;
    k_mu = fresh;
    k_cv = fresh_cv;
    k_started = 0;
    k_req = k_done = 0;
    g_lease_mu = fresh;     /* the parent's keeper may have held it */
    atomic_fetch_add_explicit(&g_fork_gen, 1, memory_order_relaxed);
}

static void init_once(void)
{
    pthread_atfork(NULL, NULL, after_fork_in_child);
}

/* ------------------------------------------------------ slots and recovery */

static void record_recovery(shl_lock *h, uint32_t pid, uint32_t what,
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

/* Clear DRAINERS and wake the drain sleepers, if there are any. */
static void wake_drainers(shl_lock *h)
{
    struct shl_header *hd = h->hdr;
    /* seq_cst load: in a release this load follows the seq_cst decrement of
     * slot.readers; with the drainer's "set DRAINERS, then scan" it forms
     * the Dekker pair that makes a lost drain wake-up impossible. */
    uint32_t s = atomic_load_explicit(&hd->state, memory_order_seq_cst);
    while (s & ST_DRAINERS) {   /* [model:WAKE_DRAINERS] */
        if (atomic_compare_exchange_weak_explicit(&hd->state, &s, s & ~ST_DRAINERS,
                                                  memory_order_seq_cst,
                                                  memory_order_seq_cst)) {
            /* Bump after clearing: a drainer that re-arms in between read the
             * old counter value first, so its futex wait sees the change. */
            atomic_fetch_add_explicit(&hd->drain_seq, 1, memory_order_seq_cst);
            futex_wake_all(&hd->drain_seq);
            return;
        }
    }
}

/*
 * Reclaim everything slot i holds.  The caller owns slot i's mutex (it got
 * EOWNERDEAD, or found the mutex free), so the slot's owner is gone and no
 * process can take the slot until the caller unlocks it.  Idempotent: a
 * recoverer that itself dies leaves the mutex OWNER_DIED again, and the next
 * prober repeats the work.
 */
static void recover_slot(shl_lock *h, uint32_t i)
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
    while (owner_of(s) == i + 1) {   /* [model:RECOVER_CLAIM] */
        uint32_t ns = s & ~(ST_CLAIM_BITS | ST_SLEEPERS);
        if (s & ST_GRANTED)
            /* Mark suspect before the hold is released, so that whoever is
             * granted next already sees the mark. */
            atomic_fetch_or_explicit(&hd->flags, FLAG_DATA_SUSPECT, memory_order_relaxed);
        if (atomic_compare_exchange_weak_explicit(&hd->state, &s, ns, memory_order_seq_cst,
                                                  memory_order_seq_cst)) {
            if (!(s & ST_GRANTED))
                what |= SHL_LOST_CLAIM;
            else
                what |= (s & ST_UPDATE) ? SHL_LOST_UPDATE : SHL_LOST_WRITE;
            atomic_store_explicit(&hd->exclusive_pid, 0, memory_order_relaxed);
            break;
        }
    }
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

static int slot_is_clean(struct shl_slot *sl)
{
    return atomic_load_explicit(&sl->readers, memory_order_relaxed) == 0 &&
           atomic_load_explicit(&sl->rwait[0], memory_order_relaxed) == 0 &&
           atomic_load_explicit(&sl->rwait[1], memory_order_relaxed) == 0;
}

static void init_slot_mutex(pthread_mutex_t *m)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(m, &a);
    pthread_mutexattr_destroy(&a);
}

/*
 * The slot mutexes live in shared memory, so glibc would act on whatever
 * bytes are there.  Before any pthread call touches one, check that it is a
 * mutex of the kind we create (robust, process-shared), by comparing glibc's
 * kind field with that of a reference mutex initialised here.  A foreign or
 * corrupted mutex makes the slot count as corrupt instead of reaching glibc.
 * (A malicious peer with write access can still corrupt a mutex while it is
 * held; see docs/DESIGN.md, "Shared memory is untrusted".)
 */
static int slot_mutex_sane(pthread_mutex_t *m)
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

/* Is slot i owned by a live process?  Reclaims it if its owner is dead (or
 * if it is free but holds leftovers).  Returns 1 alive, 0 not. */
static int probe_slot(shl_lock *h, uint32_t i)
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

/* Take a free slot (or a dead process's, after reclaiming it). */
static int attach_slot(shl_lock *h)
{
    for (uint32_t i = 0; i < h->max; i++) {
        struct shl_slot *sl = &h->slots[i];
        if (!slot_mutex_sane(&sl->owner))
            return SHL_ECORRUPT;
        int r = keeper_call(KEEP_TRYLOCK, &sl->owner);
        if (r < 0)
            return SHL_ESYS;
        if (r == EOWNERDEAD || (r == 0 && !slot_is_clean(sl)))
            recover_slot(h, i);
        else if (r != 0)
            continue;    /* EBUSY: a live process owns it */
        /* A dead owner may also have held the exclusive claim. */
        if (owner_of(atomic_load_explicit(&h->hdr->state, memory_order_relaxed)) == i + 1)
            recover_slot(h, i);
        atomic_store_explicit(&sl->pid, (uint32_t)getpid(), memory_order_relaxed);
        atomic_store_explicit(&sl->attached_at_ns, real_ns(), memory_order_relaxed);
        h->self = (int32_t)i;
        h->fork_gen = atomic_load_explicit(&g_fork_gen, memory_order_relaxed);
        return SHL_OK;
    }
    return SHL_EFULL;
}

/* Every entry point starts here.  After fork() the child holds nothing and
 * owns no slot; it takes one of its own on first use. */
static int ensure_attached(shl_lock *h)
{
    if (__builtin_expect(h != NULL &&
                         h->fork_gen == atomic_load_explicit(&g_fork_gen, memory_order_relaxed)
                         && h->self >= 0, 1))
        return SHL_OK;
    if (h == NULL)
        return SHL_ECLOSED;   /* Python passes NULL once the object is closed */
    static pthread_mutex_t reattach_mu = PTHREAD_MUTEX_INITIALIZER;
    int r = SHL_OK;
    pthread_mutex_lock(&reattach_mu);
    if (h->fork_gen != atomic_load_explicit(&g_fork_gen, memory_order_relaxed) || h->self < 0) {
        atomic_store_explicit(&h->held_reads, 0, memory_order_relaxed);
        atomic_store_explicit(&h->held_excl, 0, memory_order_relaxed);
        h->self = -1;
        r = attach_slot(h);
    }
    pthread_mutex_unlock(&reattach_mu);
    return r;
}

int shl_attach(shl_lock *h) { return ensure_attached(h); }

/* ------------------------------------------------------------- scanning */

static uint64_t sum_readers(shl_lock *h)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < h->max; i++)
        n += atomic_load_explicit(&h->slots[i].readers, memory_order_seq_cst);
    return n;
}

static uint64_t sum_owed(shl_lock *h, uint32_t parity)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < h->max; i++)
        n += atomic_load_explicit(&h->slots[i].rwait[parity], memory_order_seq_cst);
    return n;
}

/* ---------------------------------------------------------- the attempts */

/* Would this attempt wait for an exclusive hold that its own thread owns?
 * Not for asyncio attempts, where another task of the thread may release. */
static int excl_is_this_thread(shl_lock *h, const shl_waiter *w)
{
    return !w->shared_thread &&
           atomic_load_explicit(&h->held_excl, memory_order_relaxed) != 0 &&
           atomic_load_explicit(&h->excl_thread, memory_order_relaxed) ==
               (unsigned long)pthread_self();
}

/* Take back this waiter's owed-reader registrations (one per parity it
 * registered under), then wake the drainers that may wait for them. */
static void withdraw_owed(shl_lock *h, shl_waiter *w)
{
    struct shl_slot *me = &h->slots[h->self];
    for (uint32_t p = 0; p < 2; p++)
        if (w->registered & (1u << p))
            atomic_fetch_sub_explicit(&me->rwait[p], 1, memory_order_seq_cst); /* [model:WITHDRAW_OWED] */
    w->registered = 0;
    wake_drainers(h);
}

static void wait_on_state(shl_waiter *w, uint32_t s)
{
    w->on_drain = 0;
    w->expect = s;
}

static int try_read(shl_lock *h, shl_waiter *w)
{
    struct shl_slot *me = &h->slots[h->self];
    /* Announce, then look (reader half of the Dekker pair; see the top). */
    atomic_fetch_add_explicit(&me->readers, 1, memory_order_seq_cst);   /* [model:READ_ANNOUNCE] */
    uint32_t s = atomic_load_explicit(&h->hdr->state, memory_order_seq_cst); /* [model:READ_LOOK] */
    if (__builtin_expect((s & (ST_PAUSED | ST_OWNER)) == 0, 1))
        goto granted;
    /* Owed reader: queued behind an earlier phase, and the current claim
     * came later and is still waiting for readers. */
    if (!(s & (ST_PAUSED | ST_GRANTED)) && w->registered && ST_EPOCH(s) != w->my_epoch)
        goto granted;

    if (atomic_fetch_sub_explicit(&me->readers, 1, memory_order_seq_cst) == 1) /* [model:READ_BACKOUT] */
        wake_drainers(h);
    int32_t o = owner_index(h, s);
    if (o == -2)
        return SHL_ECORRUPT;
    if (o == h->self && excl_is_this_thread(h, w))
        return SHL_EDEADLK;
    if (o >= 0 && !w->registered) {
        /* [model:READ_REGISTER] queue as owed behind the phase of epoch s */
        w->my_epoch = ST_EPOCH(s);
        atomic_fetch_add_explicit(&me->rwait[w->my_epoch & 1], 1, memory_order_seq_cst);
        w->registered = 1u << (w->my_epoch & 1);
    } else if (o >= 0 && (s & ST_GRANTED) && !(w->registered & (1u << (ST_EPOCH(s) & 1)))) {
        /* [model:READ_REQUEUE] A later claim was granted before we got in
         * (we registered after its claimant counted the owed readers).  Also
         * register under that claim's epoch, so that the claim after it
         * waits for us: then we wait through that one phase only.
         * Add, never move: s may be stale, and the next claim may already
         * have counted the parity we registered first.  Taking that
         * registration away would let the claim after it pass us too, a
         * third phase (the model check found exactly that).  Registrations
         * only ever added keep the bound at two phases. */
        w->my_epoch = ST_EPOCH(s);
        atomic_fetch_add_explicit(&me->rwait[w->my_epoch & 1], 1, memory_order_seq_cst);
        w->registered |= 1u << (w->my_epoch & 1);
    }
    wait_on_state(w, s);
    return SHL_AGAIN;

granted:
    if (w->registered)   /* [model:READ_ADMIT_OWED] */
        withdraw_owed(h, w);
    atomic_fetch_add_explicit(&h->held_reads, 1, memory_order_relaxed);
    return SHL_OK;
}

/* Set DRAINERS (if needed) and return the state seen after it is set. */
static uint32_t arm_drainers(shl_lock *h)
{
    uint32_t s = atomic_load_explicit(&h->hdr->state, memory_order_seq_cst);
    while (!(s & ST_DRAINERS)) {   /* [model:DRAIN_ARM] */
        if (atomic_compare_exchange_weak_explicit(&h->hdr->state, &s, s | ST_DRAINERS,
                                                  memory_order_seq_cst, memory_order_seq_cst))
            return s | ST_DRAINERS;
    }
    return s;
}

static void grant_exclusive(shl_lock *h, shl_waiter *w)
{
    w->claimed = 0;   /* from here on it is a hold, not an attempt */
    atomic_store_explicit(&h->excl_thread, (unsigned long)pthread_self(), memory_order_relaxed);
    atomic_store_explicit(&h->held_excl, w->kind, memory_order_relaxed);
    atomic_store_explicit(&h->hdr->exclusive_pid, (uint32_t)getpid(), memory_order_relaxed);
}

/* The claimant waits for owed readers, sets GRANTED, then waits for the
 * readers counted in the slots (see "Phase fairness" at the top). */
static int drain_for_exclusive(shl_lock *h, shl_waiter *w)
{
    struct shl_header *hd = h->hdr;
    int update = w->kind == SHL_KIND_UPDATE;
    /* Read the counter before arming and scanning: a reader that leaves
     * after our scan bumps it, so the futex wait cannot miss that. */
    uint32_t seq = atomic_load_explicit(&hd->drain_seq, memory_order_seq_cst); /* [model:DRAIN_SEQ] */
    uint32_t s = arm_drainers(h);
    for (;;) {
        if (owner_of(s) != (uint32_t)h->self + 1)
            return SHL_ECORRUPT;   /* nobody else may clear a live claim */
        if (s & ST_GRANTED)
            break;
        if (!(s & ST_PAUSED) && sum_owed(h, (w->claim_epoch + 1) & 1) > 0) { /* [model:DRAIN_OWED_SCAN] */
            w->on_drain = 1;
            w->expect = seq;
            return SHL_AGAIN;
        }
        if (atomic_compare_exchange_weak_explicit(&hd->state, &s, s | ST_GRANTED, /* [model:EXCL_GRANT] */
                                                  memory_order_seq_cst, memory_order_seq_cst)) {
            s |= ST_GRANTED;
            break;
        }
    }
    /* GRANTED is set (seq_cst); now count readers once more.  A paused lock
     * freezes readers in the application, so an update stops waiting. */
    if ((update && (s & ST_PAUSED)) || sum_readers(h) == 0) {   /* [model:DRAIN_READER_SCAN] */
        grant_exclusive(h, w);
        return SHL_OK;
    }
    w->on_drain = 1;
    w->expect = seq;
    return SHL_AGAIN;
}

static int try_exclusive(shl_lock *h, shl_waiter *w)
{
    struct shl_header *hd = h->hdr;
    if (!w->claimed) {
        uint32_t s = atomic_load_explicit(&hd->state, memory_order_relaxed);
        uint32_t ns;
        for (;;) {
            int32_t o = owner_index(h, s);
            if (o == -2)
                return SHL_ECORRUPT;
            if (o >= 0) {
                if (o == h->self && excl_is_this_thread(h, w))
                    return SHL_EDEADLK;
                wait_on_state(w, s);
                return SHL_AGAIN;
            }
            ns = ((s & ~ST_SLEEPERS) + ST_EPOCH_ONE) | ((uint32_t)h->self + 1);
            if (w->kind == SHL_KIND_UPDATE) {
                ns |= ST_UPDATE;
                if (s & ST_PAUSED)
                    ns |= ST_GRANTED;   /* readers are frozen: no drain at all */
            }
            /* seq_cst: writer half of the Dekker pair with try_read. */
            if (atomic_compare_exchange_weak_explicit(&hd->state, &s, ns, memory_order_seq_cst,
                                                      memory_order_relaxed)) /* [model:EXCL_CLAIM] */
                break;
        }
        /* Owed readers may enter while we drain: wake the sleepers. */
        if (s & ST_SLEEPERS)
            futex_wake_all(&hd->state);
        w->claimed = 1;
        w->claim_epoch = ST_EPOCH(ns);
        if (ns & ST_GRANTED) {
            grant_exclusive(h, w);
            return SHL_OK;
        }
    }
    return drain_for_exclusive(h, w);
}

static int try_resume(shl_lock *h, shl_waiter *w)
{
    struct shl_header *hd = h->hdr;
    uint32_t s = atomic_load_explicit(&hd->state, memory_order_seq_cst);
    for (;;) {
        if (!(s & ST_PAUSED))
            return SHL_OK;
        if (s & ST_UPDATE) {
            int32_t o = owner_index(h, s);
            if (o == -2)
                return SHL_ECORRUPT;
            if (o == h->self && excl_is_this_thread(h, w))
                return SHL_EDEADLK;
            wait_on_state(w, s);
            return SHL_AGAIN;
        }
        uint32_t ns = s & ~(ST_PAUSED | ST_SLEEPERS);
        if (atomic_compare_exchange_weak_explicit(&hd->state, &s, ns, memory_order_seq_cst,
                                                  memory_order_seq_cst)) /* [model:RESUME_CLEAR] */
            break;
    }
    atomic_store_explicit(&hd->paused_by_pid, 0, memory_order_relaxed);
    if (s & ST_SLEEPERS)
        futex_wake_all(&hd->state);
    return SHL_OK;
}

static int try_wait_resumed(shl_lock *h, shl_waiter *w)
{
    uint32_t s = atomic_load_explicit(&h->hdr->state, memory_order_seq_cst);
    if (!(s & ST_PAUSED))
        return SHL_OK;
    wait_on_state(w, s);
    return SHL_AGAIN;
}

static int try_wait_drained(shl_lock *h, shl_waiter *w)
{
    uint32_t seq = atomic_load_explicit(&h->hdr->drain_seq, memory_order_seq_cst);
    arm_drainers(h);
    if (sum_readers(h) == 0)
        return SHL_OK;
    w->on_drain = 1;
    w->expect = seq;
    return SHL_AGAIN;
}

int shl_try(shl_lock *h, shl_waiter *w)
{
    int r = ensure_attached(h);
    if (r != SHL_OK)
        return r;
    switch (w->kind) {
    case SHL_KIND_READ:     return try_read(h, w);
    case SHL_KIND_WRITE:
    case SHL_KIND_UPDATE:   return try_exclusive(h, w);
    case SHL_KIND_RESUME:   return try_resume(h, w);
    case SHL_KIND_RESUMED:  return try_wait_resumed(h, w);
    case SHL_KIND_DRAINED:  return try_wait_drained(h, w);
    default:                return SHL_EINVAL;
    }
}

void shl_cancel(shl_lock *h, shl_waiter *w)
{
    if (h == NULL || h->self < 0 || h->fork_gen != atomic_load_explicit(&g_fork_gen, memory_order_relaxed))
        return;   /* the registrations belong to a slot this process no longer has */
    struct shl_header *hd = h->hdr;
    if (w->registered)   /* [model:CANCEL_REGISTERED] */
        withdraw_owed(h, w);
    if (w->claimed) {
        uint32_t s = atomic_load_explicit(&hd->state, memory_order_seq_cst);
        while (owner_of(s) == (uint32_t)h->self + 1) {   /* [model:CANCEL_CLAIM] */
            if (atomic_compare_exchange_weak_explicit(&hd->state, &s,
                                                      s & ~(ST_CLAIM_BITS | ST_SLEEPERS),
                                                      memory_order_seq_cst,
                                                      memory_order_seq_cst)) {
                if (s & ST_SLEEPERS)
                    futex_wake_all(&hd->state);
                break;
            }
        }
        w->claimed = 0;
    }
}

/* ---------------------------------------------------------------- waiting */

#ifdef __GLIBC__
/* The futex word of a glibc mutex: the kernel's robust-futex ABI puts the
 * owner TID in it and sets FUTEX_OWNER_DIED when the owner dies, waking one
 * waiter if FUTEX_WAITERS is set.  We set that bit so a death wakes us. */
static uint32_t *mutex_word(pthread_mutex_t *m) { return (uint32_t *)&m->__data.__lock; }

/* Fill v with a watch on slot i's death.  Returns 0 if armed, 1 if the
 * owner is already gone (probe instead of sleeping), 2 if the slot's mutex
 * is not one of ours (skip it). */
static int arm_death_watch(shl_lock *h, uint32_t i, struct futex_waitv *v)
{
    if (!slot_mutex_sane(&h->slots[i].owner))
        return 2;   /* corrupt: watch nothing there (probing skips it too) */
    uint32_t *word = mutex_word(&h->slots[i].owner);
    uint32_t cur = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    if ((cur & FUTEX_TID_MASK) == 0 || (cur & FUTEX_OWNER_DIED))   /* [model:DEATH_WATCH] */
        return 1;
    if (!(cur & FUTEX_WAITERS)) {
        uint32_t want = cur | FUTEX_WAITERS;
        if (!__atomic_compare_exchange_n(word, &cur, want, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return 1;   /* changed under us: just probe */
        cur = want;
    }
    v->val = cur;
    v->uaddr = (uintptr_t)word;
    v->flags = FUTEX_32;
    v->__reserved = 0;
    return 0;
}
#endif

/*
 * A sleeper watches every other attached process, not only the one it waits
 * for: any process may die between changing a word and its FUTEX_WAKE (a
 * releaser after its CAS, a reader after its last decrement), and then the
 * kernel's OWNER_DIED wake-up on that process's mutex is the only wake-up
 * left.  The woken watcher reclaims the slot, and reclaiming always wakes
 * everyone (recover_slot).  Up to FUTEX_WAITV_MAX - 2 processes are watched;
 * beyond that the safety net covers the rest.
 */
static int collect_watch_set(shl_lock *h, int32_t *watch, int cap)
{
    int n = 0;
    for (uint32_t i = 0; i < h->max && n < cap; i++)
        if ((int32_t)i != h->self &&
            (atomic_load_explicit(&h->slots[i].pid, memory_order_relaxed) != 0 ||
             !slot_is_clean(&h->slots[i])))
            watch[n++] = (int32_t)i;
    return n;
}

/*
 * Sleep while each words[k] still holds vals[k] and every watched process
 * lives, until deadline (-1: forever; capped by the safety net).  Probes the
 * watched processes when one of them changed or the safety net expired, so a
 * dead one is reclaimed (which changes the words and wakes everyone else).
 * Returns 0 (something may have changed), ETIMEDOUT (safety net or
 * deadline, nothing seen) or EINTR.
 */
static int sleep_and_probe(shl_lock *h, _Atomic uint32_t *const *words, const uint32_t *vals,
                           int nwords, const int32_t *watch, int nwatch, int64_t deadline_ns)
{
    int64_t until = mono_ns() + (atomic_load_explicit(&g_have_waitv, memory_order_relaxed)
                                     ? SAFETY_NET_NS : NO_WAITV_PROBE_NS);
    if (deadline_ns >= 0 && deadline_ns < until)
        until = deadline_ns;
    struct shl_slot *me = &h->slots[h->self];
    atomic_fetch_add_explicit(&me->waiting, 1, memory_order_relaxed);
    int outcome = ETIMEDOUT;
    int probe = 0;
#ifdef __GLIBC__
    if (atomic_load_explicit(&g_have_waitv, memory_order_relaxed)) {
        struct futex_waitv v[FUTEX_WAITV_MAX];
        int n = 0, gone = 0;
        for (int k = 0; k < nwords; k++) {
            v[n].val = vals[k];
            v[n].uaddr = (uintptr_t)words[k];
            v[n].flags = FUTEX_32;
            v[n].__reserved = 0;
            n++;
        }
        for (int k = 0; k < nwatch && !gone && n < FUTEX_WAITV_MAX; k++) {
            int a = arm_death_watch(h, (uint32_t)watch[k], &v[n]);
            if (a == 0)
                n++;
            gone = a == 1;
        }
        if (gone) {
            outcome = 0;
            probe = 1;
        } else {
            struct timespec ts;
            ns_to_timespec(until, &ts);
            long rc = syscall(SYS_futex_waitv, v, (unsigned)n, 0, &ts, CLOCK_MONOTONIC); /* [model:FUTEX_WAIT] */
            if (rc >= 0) {
                outcome = 0;
                probe = rc >= nwords;   /* a death word, not one of ours */
            } else if (errno == ENOSYS) {
                atomic_store_explicit(&g_have_waitv, 0, memory_order_relaxed);
            } else if (errno == EAGAIN) {
                outcome = 0;            /* a value had already changed */
            } else if (errno == EINTR) {
                outcome = EINTR;
            } else {
                probe = 1;              /* ETIMEDOUT: the safety net */
            }
        }
    }
    if (!atomic_load_explicit(&g_have_waitv, memory_order_relaxed))
#endif
    {
        /* Without futex_waitv: sleep on the first word only, probing often. */
        int64_t cap = mono_ns() + NO_WAITV_PROBE_NS;
        outcome = futex_wait_until(words[0], vals[0], until < cap ? until : cap);
        probe = outcome == ETIMEDOUT;
    }
    atomic_fetch_sub_explicit(&me->waiting, 1, memory_order_relaxed);
    if (probe)
        for (int k = 0; k < nwatch; k++)
            probe_slot(h, (uint32_t)watch[k]);
    return outcome;
}

/* Set SLEEPERS on the state word if it still holds the value `val` the
 * waiter decided on, ignoring the two sleeper bits (no condition depends on
 * them: a writer arming DRAINERS must not send every sleeping reader round
 * its loop).  Returns the armed value to sleep on, or sets *changed. */
static uint32_t arm_sleepers(shl_lock *h, uint32_t val, int *changed)
{
    const uint32_t bits = ST_SLEEPERS | ST_DRAINERS;
    uint32_t cur = atomic_load_explicit(&h->hdr->state, memory_order_seq_cst);
    *changed = 0;
    for (;;) {
        if ((cur ^ val) & ~bits) {
            *changed = 1;
            return cur;
        }
        if (cur & ST_SLEEPERS)
            return cur;
        if (atomic_compare_exchange_weak_explicit(&h->hdr->state, &cur, cur | ST_SLEEPERS,
                                                  memory_order_seq_cst,
                                                  memory_order_seq_cst)) /* [model:WAIT_ARM_SLEEPERS] */
            return cur | ST_SLEEPERS;
    }
}

int shl_wait(shl_lock *h, shl_waiter *w, int64_t deadline_ns)
{
    struct shl_header *hd = h->hdr;
    int r = ensure_attached(h);
    if (r != SHL_OK)
        return r;
    if (deadline_ns >= 0 && mono_ns() >= deadline_ns)
        return SHL_TIMEDOUT;

    _Atomic uint32_t *word;
    uint32_t val = w->expect;
    int32_t watch[FUTEX_WAITV_MAX];
    int nwatch = 0;
    if (!w->on_drain) {
        int changed;
        word = &hd->state;
        val = arm_sleepers(h, val, &changed);
        if (changed)
            return SHL_OK;
    } else {
        word = &hd->drain_seq;
    }
    nwatch = collect_watch_set(h, watch, FUTEX_WAITV_MAX - 1);
    if (sleep_and_probe(h, &word, &val, 1, watch, nwatch, deadline_ns) == EINTR)
        return SHL_EINTR;
    if (deadline_ns >= 0 && mono_ns() >= deadline_ns)
        return SHL_TIMEDOUT;
    return SHL_OK;
}

int shl_watch(shl_lock *h, uint32_t state_expect, uint32_t seq_expect, int32_t what,
              int64_t deadline_ns)
{
    struct shl_header *hd = h->hdr;
    int r = ensure_attached(h);
    if (r != SHL_OK)
        return r;
    _Atomic uint32_t *words[2];
    uint32_t vals[2];
    int32_t watch[FUTEX_WAITV_MAX];
    int nwords = 0, nwatch = 0;
    if (what & SHL_WATCH_STATE) {
        int changed;
        uint32_t v = arm_sleepers(h, state_expect, &changed);
        if (changed)
            return SHL_OK;
        words[nwords] = &hd->state;
        vals[nwords++] = v;
    }
    if (what & SHL_WATCH_DRAIN) {
        /* The parked attempts armed DRAINERS themselves after reading
         * seq_expect; whoever clears the bit bumps the counter. */
        if (atomic_load_explicit(&hd->drain_seq, memory_order_seq_cst) != seq_expect)
            return SHL_OK;
        words[nwords] = &hd->drain_seq;
        vals[nwords++] = seq_expect;
    }
    if (nwords == 0)
        return SHL_EINVAL;
    nwatch = collect_watch_set(h, watch, FUTEX_WAITV_MAX - 2);
    r = sleep_and_probe(h, words, vals, nwords, watch, nwatch, deadline_ns);
    return r == EINTR ? SHL_EINTR : r == ETIMEDOUT ? SHL_TIMEDOUT : SHL_OK;
}

uint32_t shl_load_drain_seq(shl_lock *h)
{
    if (h == NULL)
        return 0;
    return atomic_load_explicit(&h->hdr->drain_seq, memory_order_seq_cst);
}

/* --------------------------------------------------------- blocking calls */

static int run_blocking(shl_lock *h, int kind, int64_t deadline_ns)
{
    shl_waiter w;
    memset(&w, 0, sizeof w);
    w.kind = kind;
    for (;;) {
        int r = shl_try(h, &w);
        if (r == SHL_OK)
            return r;
        if (r == SHL_AGAIN)
            r = shl_wait(h, &w, deadline_ns);
        if (r != SHL_OK) {
            shl_cancel(h, &w);
            return r;
        }
    }
}

int shl_acquire_read(shl_lock *h, int64_t d)   { return run_blocking(h, SHL_KIND_READ, d); }
int shl_acquire_write(shl_lock *h, int64_t d)  { return run_blocking(h, SHL_KIND_WRITE, d); }
int shl_acquire_update(shl_lock *h, int64_t d) { return run_blocking(h, SHL_KIND_UPDATE, d); }
int shl_resume(shl_lock *h, int64_t d)         { return run_blocking(h, SHL_KIND_RESUME, d); }
int shl_wait_resumed(shl_lock *h, int64_t d)   { return run_blocking(h, SHL_KIND_RESUMED, d); }
int shl_wait_drained(shl_lock *h, int64_t d)   { return run_blocking(h, SHL_KIND_DRAINED, d); }

/* --------------------------------------------------------------- releases */

int shl_release_read(shl_lock *h)
{
    int r = ensure_attached(h);
    if (r != SHL_OK)
        return r;
    uint32_t n = atomic_load_explicit(&h->held_reads, memory_order_relaxed);
    do {
        if (n == 0)
            return SHL_ENOHOLD;
    } while (!atomic_compare_exchange_weak_explicit(&h->held_reads, &n, n - 1,
                                                    memory_order_relaxed, memory_order_relaxed));
    struct shl_slot *me = &h->slots[h->self];
    uint32_t c = atomic_load_explicit(&me->readers, memory_order_relaxed);
    do {
        if (c == 0) {   /* our slot was wiped: only a corrupt segment does that */
            atomic_fetch_add_explicit(&h->held_reads, 1, memory_order_relaxed);
            return SHL_ECORRUPT;
        }
        /* seq_cst: release half of the drain handshake (see wake_drainers). */
    } while (!atomic_compare_exchange_weak_explicit(&me->readers, &c, c - 1,
                                                    memory_order_seq_cst, memory_order_relaxed)); /* [model:RELEASE_READ] */
    if (c == 1)
        wake_drainers(h);
    return SHL_OK;
}

static int release_exclusive(shl_lock *h, int kind)
{
    struct shl_header *hd = h->hdr;
    int r = ensure_attached(h);
    if (r != SHL_OK)
        return r;
    int32_t k = kind;
    if (!atomic_compare_exchange_strong_explicit(&h->held_excl, &k, 0, memory_order_relaxed,
                                                 memory_order_relaxed))
        return SHL_ENOHOLD;
    uint32_t s = atomic_load_explicit(&hd->state, memory_order_relaxed);
    uint32_t kind_bit = kind == SHL_KIND_UPDATE ? ST_UPDATE : 0;
    if (owner_of(s) != (uint32_t)h->self + 1 || !(s & ST_GRANTED) ||
        (s & ST_UPDATE) != kind_bit) {
        atomic_store_explicit(&h->held_excl, kind, memory_order_relaxed);
        return SHL_ECORRUPT;
    }
    /* A completed exclusive section makes the data trustworthy again. */
    atomic_fetch_and_explicit(&hd->flags, ~FLAG_DATA_SUSPECT, memory_order_relaxed);
    atomic_store_explicit(&hd->exclusive_pid, 0, memory_order_relaxed);
    /* seq_cst (release at least): everything written under the hold is
     * visible to whoever is admitted next. */
    while (!atomic_compare_exchange_weak_explicit(&hd->state, &s, s & ~(ST_CLAIM_BITS | ST_SLEEPERS),
                                                  memory_order_seq_cst, memory_order_relaxed)) {
    }   /* [model:EXCL_RELEASE] */
    if (s & ST_SLEEPERS)
        futex_wake_all(&hd->state);
    return SHL_OK;
}

int shl_release_write(shl_lock *h)  { return release_exclusive(h, SHL_KIND_WRITE); }
int shl_release_update(shl_lock *h) { return release_exclusive(h, SHL_KIND_UPDATE); }

int shl_pause(shl_lock *h)
{
    if (h == NULL)
        return SHL_ECLOSED;
    struct shl_header *hd = h->hdr;
    uint32_t s = atomic_load_explicit(&hd->state, memory_order_relaxed);
    for (;;) {
        if (s & ST_PAUSED)
            return 0;
        /* seq_cst: pairs with try_read's increment-then-load; a reader whose
         * load comes later in the total order sees PAUSED. */
        if (atomic_compare_exchange_weak_explicit(&hd->state, &s, s | ST_PAUSED,
                                                  memory_order_seq_cst, memory_order_relaxed)) /* [model:PAUSE_SET] */
            break;
    }
    atomic_store_explicit(&hd->paused_by_pid, (uint32_t)getpid(), memory_order_relaxed);
    atomic_store_explicit(&hd->paused_at_ns, real_ns(), memory_order_relaxed);
    atomic_fetch_add_explicit(&hd->pause_count, 1, memory_order_relaxed);
    /* An update that waits for readers proceeds under the pause. */
    wake_drainers(h);
    return 1;
}

int shl_is_paused(shl_lock *h)
{
    if (h == NULL)
        return SHL_ECLOSED;
    return (atomic_load_explicit(&h->hdr->state, memory_order_acquire) & ST_PAUSED) != 0;
}

int shl_is_locked(shl_lock *h)
{
    if (h == NULL)
        return SHL_ECLOSED;
    uint32_t s = atomic_load_explicit(&h->hdr->state, memory_order_seq_cst);
    if (owner_index(h, s) == -2)
        return SHL_ECORRUPT;
    if (s & ST_GRANTED)
        return 1;
    return sum_readers(h) != 0;
}

/* ------------------------------------------------------------ open/close */

/* ---------------------------------------------------------- host lease */

/* Pause h's gate if its lease has passed.  Returns 1 when a lease is armed.
 * This is only a use of the existing pause step (shl_pause, PAUSE_SET): a
 * pause may be taken by any process at any moment, so admission, the model
 * and the read fast path are unchanged. */
static int lease_check(shl_lock *h)
{
    struct shl_header *hd = h->hdr;
    /* relaxed: the deadline is a timer, not a synchronisation point; the
     * pause itself is the seq_cst CAS in shl_pause. */
    int64_t d = atomic_load_explicit(&hd->lease_deadline_ns, memory_order_relaxed);
    if (d == 0)
        return 0;
    if (mono_ns() >= d && !(atomic_load_explicit(&hd->state, memory_order_relaxed) & ST_PAUSED)) {
        if (shl_pause(h) == 1)
            atomic_fetch_add_explicit(&hd->lease_expiries, 1, memory_order_relaxed);
    }
    return 1;
}

static int lease_sweep(void)
{
    int armed = 0;
    pthread_mutex_lock(&g_lease_mu);
    for (shl_lock *h = g_lease_list; h != NULL; h = h->lease_next)
        armed |= lease_check(h);
    pthread_mutex_unlock(&g_lease_mu);
    return armed;
}

/* A process that opens a segment whose lease has already passed (its host's
 * agent died with every process) pauses before it can admit anything. */
static void lease_register(shl_lock *h)
{
    pthread_mutex_lock(&g_lease_mu);
    lease_check(h);
    h->lease_next = g_lease_list;
    g_lease_list = h;
    pthread_mutex_unlock(&g_lease_mu);
}

static void lease_unregister(shl_lock *h)
{
    pthread_mutex_lock(&g_lease_mu);
    for (shl_lock **p = &g_lease_list; *p != NULL; p = &(*p)->lease_next) {
        if (*p == h) {
            *p = h->lease_next;
            break;
        }
    }
    pthread_mutex_unlock(&g_lease_mu);
}

int shl_lease_set(shl_lock *h, int64_t deadline_ns)
{
    if (h == NULL)
        return SHL_ECLOSED;
    atomic_store_explicit(&h->hdr->lease_pid, deadline_ns ? (uint32_t)getpid() : 0,
                          memory_order_relaxed);
    /* seq_cst: a renewal is ordered before the agent's following resume. */
    atomic_store_explicit(&h->hdr->lease_deadline_ns, deadline_ns, memory_order_seq_cst);
    return SHL_OK;
}

int shl_lease_get(shl_lock *h, shl_lease_info *out)
{
    if (h == NULL)
        return SHL_ECLOSED;
    out->deadline_ns = atomic_load_explicit(&h->hdr->lease_deadline_ns, memory_order_relaxed);
    out->now_ns = mono_ns();
    out->pid = atomic_load_explicit(&h->hdr->lease_pid, memory_order_relaxed);
    out->expiries = atomic_load_explicit(&h->hdr->lease_expiries, memory_order_relaxed);
    return SHL_OK;
}

static int valid_name(const char *name)
{
    size_t n = strnlen(name, SHL_NAME_MAX + 1);
    if (n == 0 || n > SHL_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

static size_t layout_size(uint32_t max)
{
    return sizeof(struct shl_header) + (size_t)max * sizeof(struct shl_slot);
}

/* Check a mapped segment of st_size bytes that is marked ready.  Every size
 * and count is checked against the file size before anything is indexed. */
static int validate_header(const struct shl_header *hd, size_t st_size, uint32_t *max)
{
    if (hd->magic != SHL_MAGIC)
        return SHL_EFOREIGN;
    if (hd->layout_version != SHL_LAYOUT)
        return SHL_EVERSION;
    if (hd->header_size != sizeof(struct shl_header) || hd->slot_size != sizeof(struct shl_slot))
        return SHL_ECORRUPT;
    uint32_t m = hd->max_processes;
    if (m < 1 || m > SHL_MAX_PROCESSES_LIMIT)
        return SHL_ECORRUPT;
    if (hd->total_size != layout_size(m) || st_size < layout_size(m))
        return SHL_ECORRUPT;
    if (owner_of(atomic_load_explicit(&hd->state, memory_order_relaxed)) > m)
        return SHL_ECORRUPT;
    *max = m;
    return SHL_OK;
}

static void init_segment(struct shl_header *hd, uint32_t max)
{
    struct shl_slot *slots = (struct shl_slot *)(hd + 1);
    hd->magic = SHL_MAGIC;
    hd->layout_version = SHL_LAYOUT;
    hd->header_size = sizeof(struct shl_header);
    hd->slot_size = sizeof(struct shl_slot);
    hd->max_processes = max;
    hd->creator_pid = (uint32_t)getpid();
    hd->total_size = layout_size(max);
    for (uint32_t i = 0; i < max; i++)
        init_slot_mutex(&slots[i].owner);
    /* release: an opener that sees READY (acquire) sees all of the above. */
    atomic_store_explicit(&hd->ready, SHL_READY, memory_order_release);
}

/* Map an existing segment and validate it, waiting (bounded) for a creator
 * that is still initialising it. */
static int map_existing(int fd, struct shl_header **out, size_t *size, uint32_t *max)
{
    int64_t give_up = mono_ns() + OPEN_WAIT_NS;
    for (;;) {
        struct stat st;
        if (fstat(fd, &st) != 0)
            return SHL_ESYS;
        /* A creator sets the full size (ftruncate) before it writes a byte:
         * a non-empty segment shorter than our header is not one of ours. */
        if (st.st_size > 0 && (size_t)st.st_size < sizeof(struct shl_header))
            return SHL_EFOREIGN;
        if ((size_t)st.st_size >= sizeof(struct shl_header)) {
            size_t len = (size_t)st.st_size;
            void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (p == MAP_FAILED)
                return SHL_ESYS;
            struct shl_header *hd = p;
            if (atomic_load_explicit(&hd->ready, memory_order_acquire) == SHL_READY) {
                int r = validate_header(hd, len, max);
                if (r != SHL_OK) {
                    munmap(p, len);
                    return r;
                }
                *out = hd;
                *size = len;
                return SHL_OK;
            }
            int foreign = hd->magic != 0 && hd->magic != SHL_MAGIC;
            munmap(p, len);
            if (foreign)
                return SHL_EFOREIGN;
        }
        if (mono_ns() > give_up)
            return SHL_EINIT;
        struct timespec pause_ts = {0, 1000000};
        nanosleep(&pause_ts, NULL);
    }
}

int shl_open(const char *name, int create, uint32_t mode, uint32_t max_processes,
             shl_lock **out, int *created, uint64_t *dev, uint64_t *ino)
{
    char path[SHL_NAME_MAX + 32];
    *out = NULL;
    *created = 0;
    if (!valid_name(name))
        return SHL_EINVAL;
    if (create && (max_processes < 1 || max_processes > SHL_MAX_PROCESSES_LIMIT))
        return SHL_EINVAL;
    pthread_once(&g_once, init_once);
    snprintf(path, sizeof path, "/pyshmlock.%s", name);

    int fd = -1;
    for (int attempt = 0; attempt < 8 && fd < 0; attempt++) {
        if (create) {
            fd = shm_open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, mode & 0777);
            if (fd >= 0) {
                *created = 1;
                break;
            }
            if (errno != EEXIST)
                return SHL_ESYS;
        }
        fd = shm_open(path, O_RDWR | O_CLOEXEC, 0);
        if (fd < 0 && (errno != ENOENT || !create))
            return SHL_ESYS;   /* ENOENT without create: FileNotFoundError */
        /* ENOENT with create: it was unlinked between our two opens; retry. */
    }
    if (fd < 0)
        return SHL_ESYS;

    struct shl_header *hd = NULL;
    size_t size = 0;
    uint32_t max = 0;
    int r = SHL_OK;
    if (*created) {
        size = layout_size(max_processes);
        if (fchmod(fd, mode & 0777) != 0 || ftruncate(fd, (off_t)size) != 0) {
            r = SHL_ESYS;
        } else {
            void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (p == MAP_FAILED) {
                r = SHL_ESYS;
            } else {
                hd = p;
                init_segment(hd, max_processes);
                max = max_processes;
            }
        }
        if (r != SHL_OK) {
            int e = errno;
            shm_unlink(path);
            errno = e;
        }
    } else {
        r = map_existing(fd, &hd, &size, &max);
    }
    struct stat st;
    if (r == SHL_OK && fstat(fd, &st) != 0)
        r = SHL_ESYS;
    int e = errno;
    close(fd);
    errno = e;
    if (r != SHL_OK) {
        if (hd)
            munmap(hd, size);
        return r;
    }

    shl_lock *h = calloc(1, sizeof *h);
    if (!h) {
        munmap(hd, size);
        errno = ENOMEM;
        return SHL_ESYS;
    }
    h->hdr = hd;
    h->slots = (struct shl_slot *)(hd + 1);
    h->map_size = size;
    h->max = max;
    h->self = -1;
    r = ensure_attached(h);
    if (r != SHL_OK) {
        munmap(hd, size);
        free(h);
        return r;
    }
    *dev = (uint64_t)st.st_dev;
    *ino = (uint64_t)st.st_ino;
    *out = h;
    lease_register(h);
    return SHL_OK;
}

int shl_close(shl_lock *h)
{
    if (h == NULL)
        return SHL_ECLOSED;
    int ours = h->self >= 0 &&
               h->fork_gen == atomic_load_explicit(&g_fork_gen, memory_order_relaxed);
    if (ours && (atomic_load_explicit(&h->held_reads, memory_order_relaxed) != 0 ||
                 atomic_load_explicit(&h->held_excl, memory_order_relaxed) != 0))
        return SHL_EBUSY;
    if (ours) {
        struct shl_slot *me = &h->slots[h->self];
        atomic_store_explicit(&me->pid, 0, memory_order_relaxed);
        keeper_call(KEEP_UNLOCK, &me->owner);
    }
    lease_unregister(h);
    munmap(h->hdr, h->map_size);
    free(h);
    return SHL_OK;
}

int shl_unlink(const char *name, int force, uint32_t *attached)
{
    char path[SHL_NAME_MAX + 32];
    *attached = 0;
    if (!valid_name(name))
        return SHL_EINVAL;
    pthread_once(&g_once, init_once);
    snprintf(path, sizeof path, "/pyshmlock.%s", name);
    int fd = shm_open(path, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        return SHL_ESYS;
    struct shl_header *hd = NULL;
    size_t size = 0;
    uint32_t max = 0;
    int r = force ? SHL_OK : map_existing(fd, &hd, &size, &max);
    close(fd);
    if (r != SHL_OK)
        return r;
    if (hd) {
        /* Count live processes other than this one; reclaim dead ones. */
        shl_lock probe;
        memset(&probe, 0, sizeof probe);
        probe.hdr = hd;
        probe.slots = (struct shl_slot *)(hd + 1);
        probe.max = max;
        probe.self = -1;
        uint32_t mypid = (uint32_t)getpid();
        for (uint32_t i = 0; i < max; i++) {
            struct shl_slot *sl = &probe.slots[i];
            if (atomic_load_explicit(&sl->pid, memory_order_relaxed) == mypid)
                continue;
            if (probe_slot(&probe, i))
                (*attached)++;
        }
        munmap(hd, size);
        if (*attached)
            return SHL_EBUSY;
    }
    if (shm_unlink(path) != 0)
        return SHL_ESYS;
    return SHL_OK;
}

/* --------------------------------------------------------- observability */

int shl_info(shl_lock *h, shl_snapshot *out)
{
    struct shl_header *hd = h->hdr;
    int r = ensure_attached(h);
    if (r != SHL_OK)
        return r;
    uint32_t s = atomic_load_explicit(&hd->state, memory_order_seq_cst);
    int32_t o = owner_index(h, s);
    if (o == -2)
        return SHL_ECORRUPT;
    memset(out, 0, sizeof *out);
    out->state = s;
    out->paused = (s & ST_PAUSED) != 0;
    out->exclusive_slot = o;
    out->exclusive_kind = o < 0 ? 0 : (s & ST_UPDATE) ? SHL_KIND_UPDATE : SHL_KIND_WRITE;
    out->exclusive_granted = (s & ST_GRANTED) != 0;
    out->exclusive_pid = o < 0 ? 0 : atomic_load_explicit(&h->slots[o].pid, memory_order_relaxed);
    out->epoch = ST_EPOCH(s);
    out->pause_count = atomic_load_explicit(&hd->pause_count, memory_order_relaxed);
    out->paused_by_pid = atomic_load_explicit(&hd->paused_by_pid, memory_order_relaxed);
    out->paused_at_ns = atomic_load_explicit(&hd->paused_at_ns, memory_order_relaxed);
    out->data_suspect = (atomic_load_explicit(&hd->flags, memory_order_relaxed) &
                         FLAG_DATA_SUSPECT) != 0;
    out->max_processes = h->max;
    out->recovery_count = atomic_load_explicit(&hd->recovery_count, memory_order_relaxed);
    out->creator_pid = hd->creator_pid;
    out->self_slot = h->self;
    return SHL_OK;
}

int shl_slot_info(shl_lock *h, uint32_t index, shl_slot_snapshot *out)
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
    out->alive = probe_slot(h, index);   /* reclaims a dead owner's holds */
    out->pid = atomic_load_explicit(&sl->pid, memory_order_relaxed);
    out->readers = atomic_load_explicit(&sl->readers, memory_order_relaxed);
    out->owed = atomic_load_explicit(&sl->rwait[0], memory_order_relaxed) +
                atomic_load_explicit(&sl->rwait[1], memory_order_relaxed);
    out->waiting = atomic_load_explicit(&sl->waiting, memory_order_relaxed);
    out->is_self = (int32_t)index == h->self;
    return SHL_OK;
}

int shl_recovery_info(shl_lock *h, uint32_t index, shl_recovery_record *out)
{
    if (h == NULL)
        return SHL_ECLOSED;
    if (index >= SHL_RECOVERY_LOG)
        return SHL_EINVAL;
    struct shl_recovery_entry *e = &h->hdr->recoveries[index];
    out->pid = __atomic_load_n(&e->pid, __ATOMIC_RELAXED);
    out->what = __atomic_load_n(&e->what, __ATOMIC_RELAXED);
    out->reads = __atomic_load_n(&e->reads, __ATOMIC_RELAXED);
    out->owed = __atomic_load_n(&e->owed, __ATOMIC_RELAXED);
    out->when_ns = __atomic_load_n(&e->when_ns, __ATOMIC_RELAXED);
    return SHL_OK;
}

uint32_t shl_load_state(shl_lock *h)
{
    if (h == NULL)
        return 0;
    return atomic_load_explicit(&h->hdr->state, memory_order_acquire);
}
