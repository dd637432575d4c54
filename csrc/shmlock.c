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
 *            creator), the SLOTS' HIGH-WATER MARK, the 32-bit STATE WORD,
 *            the DRAIN COUNTER, and observability fields (who paused,
 *            recovery log).
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
 *             (A slot that already counts SHL_READ_HOLDS_MAX fails with
 *             SHL_EOVERFLOW instead: the 32-bit count never wraps.)
 *   writer:   CAS(state: OWNER = me) ; n = load(slots_hwm) ;
 *             then scan slot.readers of slots [0, n).
 *
 * In the single total order of seq_cst operations either the reader's load
 * follows the claim (it sees OWNER and backs out) or the writer's scan
 * follows the increment (it sees the reader and waits).  Both cannot miss.
 * The same handshake makes pause() atomic against admission.
 *
 * Scans are bounded by the slots' high-water mark (1 + the highest slot
 * index ever attached), so their cost follows the processes ever attached,
 * not max_processes.  A process raises the mark (seq_cst fetch-max) when it
 * takes its slot, before the slot holds any registration; every scanner
 * loads it (seq_cst) after its own operation on the state word, and clamps
 * it to the validated max.  A reader the scan must count looked at the
 * state before that operation, so its raise came before the scanner's load
 * in the total order, and the mark never falls (proof at scan_limit).
 *
 * Phase fairness.  A reader that finds an exclusive claim with epoch E
 * registers in slot.rwait[E & 1] ("owed").  The claimant of a later claim
 * E' waits for every owed reader of parity (E'-1) & 1 before it sets
 * GRANTED, and an owed reader enters E' while it is still draining (not
 * GRANTED, not PAUSED) whenever it is registered under that parity (or
 * E' != its epoch).  Entry never depends on epoch equality alone: the
 * 15-bit epoch wraps (2^15 claims under a pause can pass one waiting
 * reader), and a claim that waits for a reader always lets it in.  So a
 * reader waits through at most one exclusive phase (two if it registered
 * too late for a claim's count; pauses excepted); a writer waits through at most the
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
 * A waiter also always watches the slot the state word names as owner, even
 * a free one, and reclaims a free slot that is named or holds leftovers.
 *
 * Handles.  A handle (shl_lock) is process-private.  Every entry point
 * counts itself in h->inflight (enter/leave); shl_close refuses with
 * SHL_EINFLIGHT while a call is in flight or an attempt of this process is
 * still registered or claims, and a closed handle is never freed, so a
 * late call through a stale pointer gets SHL_ECLOSED.  A forked child
 * re-initialises every process-private mutex and in-flight count.
 *
 * Host lease (cluster agent; docs/DESIGN.md section 11).  A nonzero
 * lease_deadline_ns at the end of the header is a CLOCK_MONOTONIC deadline
 * the agent renews.  One lease watchdog thread per attached process walks
 * g_handles (inside H_SWEEP, its own in-flight mark) and pauses, with the
 * ordinary pause step, every segment whose deadline has passed; shl_open
 * does the same check; the stale reset keeps a pause while a lease is armed.
 * Admission and the read fast path never look at the lease.
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
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if !defined(__linux__)
#error "pyshmlock needs Linux futexes"
#endif

/* ---------------------------------------------------------------- layout */

#define SHL_MAGIC   0x4C485350u          /* "PSHL" read as little-endian */
#define SHL_LAYOUT  2u                   /* 2: slot.pidns */
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
_Static_assert(SHL_STATE_OWNER_MASK == ST_OWNER && SHL_STATE_PAUSED == ST_PAUSED,
               "shmlock.h's SHL_STATE_ bits must be the state word's ST_ bits");

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
    /* 1 + the highest slot index ever attached: only rises (attach_slot),
     * and bounds every scan of the slots (scan_limit).  Read-mostly, so it
     * shares the line of the fields fixed at creation.  Untrusted: clamped
     * to the validated max before use. */
    _Atomic uint32_t slots_hwm;
    _Alignas(64) _Atomic uint32_t state;       /* the gate; own cache line */
    _Alignas(64) _Atomic uint32_t drain_seq;   /* bumped when readers leave */
    _Alignas(64) _Atomic uint32_t flags;
    _Atomic uint32_t paused_by_pid;
    _Atomic uint32_t pause_count;
    _Atomic uint32_t exclusive_pid;
    _Atomic uint64_t paused_at_ns;
    _Atomic uint32_t recovery_count;
    struct shl_recovery_entry recoveries[SHL_RECOVERY_LOG];
    /* Host lease (used by the cluster agent; kept at the end of the header).
     * While nonzero, a CLOCK_MONOTONIC deadline that the agent renews.  Once
     * it has passed, the lease watchdog of every attached process pauses the
     * gate (fail closed) with the existing pause step.  0: no lease. */
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
    _Atomic uint64_t pidns;         /* owner's PID namespace (display only, like pid) */
} __attribute__((aligned(64)));

struct shl_lock {
    struct shl_header *hdr;
    struct shl_slot *slots;
    size_t map_size;
    uint32_t max;                   /* validated private copy of max_processes */
    int32_t self;                   /* our slot, -1 when not attached */
    /* g_fork_gen when self was taken.  Stored with release after self, loaded
     * with acquire before self is read: a thread of a forked child that sees
     * the new generation also sees the slot another thread just took. */
    _Atomic uint64_t fork_gen;
    uint32_t pid;                   /* getpid() when self was taken: getpid() is a
                                       system call, too dear for every write */
    _Atomic uint32_t held_reads;    /* process-local truth about our holds */
    _Atomic int32_t held_excl;      /* 0, SHL_KIND_WRITE or SHL_KIND_UPDATE */
    _Atomic unsigned long excl_thread;  /* pthread_t of the thread that got it */
    uint64_t dev, ino;              /* the segment: with self, names our attachment */
    /* Calls inside the core on this handle (low 29 bits), H_SWEEP, H_CLOSING and
     * H_CLOSED.  See enter(): close() starts only by moving this word from
     * 0 to H_CLOSING. */
    _Atomic uint32_t inflight;
    struct shl_lock *next_handle;   /* g_handles: every handle ever opened */
};

#define H_CLOSED  0x80000000u
#define H_CLOSING 0x40000000u     /* close() is deciding; callers wait it out */
#define H_SWEEP   0x20000000u     /* the lease watchdog is looking (see lease_sweep) */

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

/*
 * Every public entry point that reads the handle's mapping brackets its work
 * with enter()/leave(), and close() starts only by moving h->inflight from
 * 0 to H_CLOSING.  Both are read-modify-writes of one word, so in its
 * modification order each enter() either comes first (close() sees a count
 * and refuses with SHL_EINFLIGHT) or later: the call backs out without
 * touching the segment, and either returns SHL_ECLOSED (H_CLOSED) or waits
 * the few loads that close() needs to decide (H_CLOSING) and tries again.
 * close() leaves H_CLOSING by read-modify-writes only, so the transient
 * increments of callers that back out are never overwritten.
 *
 * Orders: enter() is acquire, so nothing the call does to the mapping is
 * performed before its increment; leave() is release, and close()'s CAS is
 * acquire and reads the value the last leave() wrote (every RMW on the word
 * continues the release sequence), so every access of a finished call
 * happens before the munmap.  The word is process-private: the cost is one
 * uncontended RMW pair per call (the fast read path already does a seq_cst
 * RMW on the shared slot).
 */
static int enter(shl_lock *h)
{
    if (h == NULL)
        return SHL_ECLOSED;   /* Python passes NULL once the object is closed */
    for (;;) {
        uint32_t n = atomic_fetch_add_explicit(&h->inflight, 1, memory_order_acquire);
        if (__builtin_expect((n & (H_CLOSED | H_CLOSING)) == 0, 1))
            return SHL_OK;
        atomic_fetch_sub_explicit(&h->inflight, 1, memory_order_relaxed);
        if (n & H_CLOSED)
            return SHL_ECLOSED;
        /* close() is deciding: a handful of loads, never a wait. */
        while (atomic_load_explicit(&h->inflight, memory_order_relaxed) & H_CLOSING)
            sched_yield();
    }
}

static void leave(shl_lock *h)
{
    atomic_fetch_sub_explicit(&h->inflight, 1, memory_order_release);
}

/* ------------------------------------------------- keeper thread and fork */

/*
 * Keeper threads own this process's slot mutexes.  Requests reach them
 * through k_mu/k_cv; k_call_mu serialises callers so that one request is in
 * flight at a time.  All of it is process-private.
 *
 * Why more than one keeper: a robust mutex is found at its owner's death
 * through the owning thread's robust list, and the kernel walks at most
 * ROBUST_LIST_LIMIT (2048) entries of it (glibc adds at the head, so the
 * OLDEST slots would be lost: they would look alive forever).  So each
 * keeper holds at most KEEPER_CAPACITY mutexes, well below that limit, and
 * another keeper is started when every keeper is full.
 *
 * k_held records, for every mutex a keeper holds, which segment (dev/ino)
 * and slot it is.  That record, not a pid, is what "this process's
 * attachment" means: pids are not unique across PID namespaces.
 */
enum { KEEP_TRYLOCK = 1, KEEP_UNLOCK = 2 };
#define KEEPER_CAPACITY 1024     /* mutexes per keeper; the kernel walks 2048 */
#define KEEPER_MAX      256      /* keepers per process (262,144 attachments) */

struct kept {
    pthread_mutex_t *m;          /* the slot mutex, in our mapping */
    uint64_t dev, ino;           /* the segment */
    uint32_t slot, keeper;
};

static pthread_mutex_t k_call_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t k_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t k_cv = PTHREAD_COND_INITIALIZER;
static int k_started, k_op, k_result;   /* k_started 0: no keeper (yet, or after fork) */
static uint64_t k_req, k_done;
static pthread_mutex_t *k_target;
static uint32_t k_who;                  /* the keeper the request is for */
static uint32_t k_nkeepers;             /* under k_call_mu, like all below */
static uint32_t k_count[KEEPER_MAX];    /* mutexes each keeper holds */
static struct kept *k_held;
static size_t k_nheld, k_capheld;

/* Serialises taking a slot (ensure_attached).  Process-private too, so it
 * is reset in a forked child like the keeper's mutexes: a thread that held
 * it at fork() does not exist in the child. */
static pthread_mutex_t g_reattach_mu = PTHREAD_MUTEX_INITIALIZER;

/* Every handle this process ever opened, newest first.  Handles are never
 * freed (see shl_close), so the list only grows, by a CAS on the head: a
 * fork() at any moment leaves the child a well-formed list. */
static _Atomic(shl_lock *) g_handles;

static _Atomic uint64_t g_fork_gen;
static _Atomic int g_have_waitv = 1;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void *keeper_main(void *arg)
{
    uint32_t me = (uint32_t)(uintptr_t)arg;
    pthread_mutex_lock(&k_mu);
    for (;;) {
        while (k_done == k_req || k_who != me)
            pthread_cond_wait(&k_cv, &k_mu);
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

/* Start keeper number k_nkeepers.  Caller holds k_call_mu and k_mu. */
static int start_keeper(void)
{
    if (k_nkeepers >= KEEPER_MAX)
        return EMFILE;
    pthread_t t;
    pthread_attr_t attr;
    sigset_t all, old;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    /* A keeper must never take a signal meant for the application. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int r = pthread_create(&t, &attr, keeper_main, (void *)(uintptr_t)k_nkeepers);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (r == 0)
        k_count[k_nkeepers++] = 0;
    return r;
}

/* Run one request on keeper `who`.  Caller holds k_call_mu and k_mu. */
static int keeper_run(uint32_t who, int op, pthread_mutex_t *m)
{
    k_op = op;
    k_target = m;
    k_who = who;
    uint64_t mine = ++k_req;
    pthread_cond_broadcast(&k_cv);
    while (k_done != mine)
        pthread_cond_wait(&k_cv, &k_mu);
    return k_result;
}

/* KEEP_TRYLOCK: lock m from a keeper with room and record it as slot `slot`
 * of segment id (dev/ino).  KEEP_UNLOCK: unlock m from the keeper that holds
 * it.  Returns the pthread result, or -1 with errno set. */
static int keeper_request(int op, pthread_mutex_t *m, uint64_t dev, uint64_t ino,
                          uint32_t slot)
{
    int r;
    pthread_mutex_lock(&k_call_mu);
    pthread_mutex_lock(&k_mu);
    if (!k_started) {
        /* First use, or first use after fork(): the child has no keeper
         * and holds none of the parent's mutexes.  The table is dropped,
         * not reused: a fork in the middle of a realloc in another thread
         * may have left k_held pointing at freed memory (a leak of at most
         * one table per fork instead). */
        k_nkeepers = 0;
        k_nheld = 0;
        k_held = NULL;
        k_capheld = 0;
        k_started = 1;
    }
    if (op == KEEP_TRYLOCK) {
        uint32_t who = 0;
        while (who < k_nkeepers && k_count[who] >= KEEPER_CAPACITY)
            who++;
        r = 0;
        if (who == k_nkeepers)
            r = start_keeper();
        if (r == 0 && k_nheld == k_capheld) {
            size_t cap = k_capheld ? 2 * k_capheld : 64;
            struct kept *p = realloc(k_held, cap * sizeof *p);
            if (p) {
                k_held = p;
                k_capheld = cap;
            } else {
                r = ENOMEM;
            }
        }
        if (r != 0) {
            errno = r;
            r = -1;
        } else {
            r = keeper_run(who, KEEP_TRYLOCK, m);
            if (r == 0 || r == EOWNERDEAD) {
                k_held[k_nheld++] = (struct kept){m, dev, ino, slot, who};
                k_count[who]++;
            }
        }
    } else {
        size_t i = 0;
        while (i < k_nheld && k_held[i].m != m)
            i++;
        if (i == k_nheld) {
            r = EPERM;    /* no keeper of ours holds it */
        } else {
            r = keeper_run(k_held[i].keeper, KEEP_UNLOCK, m);
            k_count[k_held[i].keeper]--;
            k_held[i] = k_held[--k_nheld];
        }
    }
    pthread_mutex_unlock(&k_mu);
    pthread_mutex_unlock(&k_call_mu);
    return r;
}

static int keeper_call(int op, pthread_mutex_t *m)
{
    return keeper_request(op, m, 0, 0, 0);
}

/* Is slot `slot` of segment dev/ino held by a keeper of this process, i.e.
 * one of this process's own attachments? */
static int own_attachment(uint64_t dev, uint64_t ino, uint32_t slot)
{
    int found = 0;
    pthread_mutex_lock(&k_call_mu);
    for (size_t i = 0; k_started && i < k_nheld && !found; i++)
        found = k_held[i].dev == dev && k_held[i].ino == ino && k_held[i].slot == slot;
    pthread_mutex_unlock(&k_call_mu);
    return found;
}

/* Host lease watchdog (docs/DESIGN.md, "Beyond one host"): one thread per
 * process, started by the first attachment (open, or a forked child's
 * re-attachment), signals blocked like the keepers.  It walks g_handles
 * (skipping closed handles through the in-flight word, see lease_sweep) and
 * pauses any segment whose host lease has passed.  Wake-ups: every
 * LEASE_POLL_NS while some open segment has a lease armed, every
 * LEASE_IDLE_NS while handles are open but none is armed (to notice one
 * being armed), none while this process has no open handle.  g_wd_mu and
 * g_wd_cv are process-private and reset in a forked child. */
#define LEASE_POLL_NS  (20LL * 1000 * 1000)
#define LEASE_IDLE_NS  (250LL * 1000 * 1000)
static pthread_mutex_t g_wd_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_wd_cv;          /* CLOCK_MONOTONIC; set up by wd_start */
static int g_wd_started;                /* under g_wd_mu; 0 again in a forked child */
static uint64_t g_wd_gen;               /* under g_wd_mu; bumped by wd_kick */
static int wd_start(void);
static void wd_kick(void);

/* The inode of this process's PID namespace, recorded in its slots so that
 * info() can tell two processes with the same pid apart.  0 if unknown. */
static uint64_t self_pidns(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* In a forked child only the forking thread exists: no keeper, and every
 * process-private mutex of the core (k_call_mu, k_mu, k_cv, g_reattach_mu)
 * may be held by a thread that is gone.  Start afresh; handles notice the
 * new fork generation and take a slot of their own. */
static void after_fork_in_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t fresh_cv = PTHREAD_COND_INITIALIZER;
    k_call_mu = fresh;
    k_mu = fresh;
    k_cv = fresh_cv;
    g_reattach_mu = fresh;
    g_wd_mu = fresh;        /* the parent's watchdog may have held it */
    g_wd_started = 0;       /* ... and is not here: the next attachment starts one */
    k_started = 0;
    k_req = k_done = 0;
    /* The parent's threads that were inside a call (or sweeping: H_SWEEP)
     * do not exist here: their in-flight counts would make close() refuse
     * forever.  Closed stays closed. */
    for (shl_lock *x = atomic_load_explicit(&g_handles, memory_order_relaxed); x;
         x = x->next_handle)   /* (a close that was deciding: its thread is gone too) */
        atomic_store_explicit(&x->inflight,
                              atomic_load_explicit(&x->inflight, memory_order_relaxed) & H_CLOSED,
                              memory_order_relaxed);
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

/*
 * Raise the slots' high-water mark to cover slot i (a fetch-max by CAS).
 * attach_slot calls it once it owns slot i and before the slot can hold
 * anything of ours: before its pid is published and before any read or
 * owed registration in it (those need h->self, set after this).  See
 * scan_limit for why that order makes the bounded scans exact.
 *
 * When the mark already covers i no store is needed: the seq_cst load read
 * a value that an earlier raise (earlier in the single total order) wrote,
 * and the mark never falls, so every later seq_cst load of it sees at least
 * i + 1 just as if we had raised it ourselves.
 */
static void raise_slots_hwm(shl_lock *h, uint32_t i)
{
    uint32_t want = i + 1;
    uint32_t cur = atomic_load_explicit(&h->hdr->slots_hwm, memory_order_seq_cst);
    while (cur < want &&   /* [model:ATTACH_HWM] */
           !atomic_compare_exchange_weak_explicit(&h->hdr->slots_hwm, &cur, want,
                                                  memory_order_seq_cst, memory_order_seq_cst))
        ;
}

/* Take a free slot (or a dead process's, after reclaiming it). */
static int attach_slot(shl_lock *h)
{
    for (uint32_t i = 0; i < h->max; i++) {
        struct shl_slot *sl = &h->slots[i];
        if (!slot_mutex_sane(&sl->owner))
            return SHL_ECORRUPT;
        int r = keeper_request(KEEP_TRYLOCK, &sl->owner, h->dev, h->ino, i);
        if (r < 0)
            return SHL_ESYS;
        if (r == EOWNERDEAD || (r == 0 && !slot_is_clean(sl)))
            recover_slot(h, i);
        else if (r != 0)
            continue;    /* EBUSY: a live process owns it */
        raise_slots_hwm(h, i);
        /* A dead owner may also have held the exclusive claim. */
        if (owner_of(atomic_load_explicit(&h->hdr->state, memory_order_relaxed)) == i + 1)
            recover_slot(h, i);
        h->pid = (uint32_t)getpid();   /* a forked child re-attaches: fresh pid */
        atomic_store_explicit(&sl->pid, h->pid, memory_order_relaxed);
        atomic_store_explicit(&sl->attached_at_ns, real_ns(), memory_order_relaxed);
        atomic_store_explicit(&sl->pidns, self_pidns(), memory_order_relaxed);
        h->self = (int32_t)i;
        atomic_store_explicit(&h->fork_gen, atomic_load_explicit(&g_fork_gen, memory_order_relaxed),
                              memory_order_release);
        return SHL_OK;
    }
    return SHL_EFULL;
}

/* Every entry point starts here.  After fork() the child holds nothing and
 * owns no slot; it takes one of its own on first use. */
static int ensure_attached(shl_lock *h)
{
    if (__builtin_expect(h != NULL &&
                         atomic_load_explicit(&h->fork_gen, memory_order_acquire) ==
                             atomic_load_explicit(&g_fork_gen, memory_order_relaxed)
                         && h->self >= 0, 1))
        return SHL_OK;
    if (h == NULL)
        return SHL_ECLOSED;   /* Python passes NULL once the object is closed */
    int r = SHL_OK;
    pthread_mutex_lock(&g_reattach_mu);
    if (atomic_load_explicit(&h->fork_gen, memory_order_acquire) !=
            atomic_load_explicit(&g_fork_gen, memory_order_relaxed) || h->self < 0) {
        atomic_store_explicit(&h->held_reads, 0, memory_order_relaxed);
        atomic_store_explicit(&h->held_excl, 0, memory_order_relaxed);
        h->self = -1;
        /* An attached process always has a lease watchdog (a forked child
         * gets its own here): no watchdog, no attachment. */
        r = wd_start();
        if (r == SHL_OK)
            r = attach_slot(h);
        if (r == SHL_OK)
            wd_kick();   /* a child's inherited handles are already listed */
    }
    pthread_mutex_unlock(&g_reattach_mu);
    return r;
}

int shl_attach(shl_lock *h)
{
    int r = enter(h);
    if (r != SHL_OK)
        return r;
    r = ensure_attached(h);
    leave(h);
    return r;
}

/* ------------------------------------------------------------- scanning */

/*
 * How many slots a scan must look at: the slots' high-water mark, so that
 * an exclusive acquire costs what the processes ever attached cost, not
 * max_processes.  The mark is shared memory, so it is clamped to the
 * validated private max (a corrupt large value costs a full scan, never an
 * out-of-bounds index).
 *
 * Why no announced reader is missed (the Dekker pair of the top comment,
 * extended by one operation on each side).  A reader in slot i raised the
 * mark to at least i + 1 (seq_cst, raise_slots_hwm) before its seq_cst
 * increment of slot.readers or slot.rwait, in program order, so before it
 * in the single total order S.  A scanner loads the mark (seq_cst) after
 * its own seq_cst operation on the state word (the claim CAS, the GRANTED
 * CAS, or arming DRAINERS).  Take a reader that the scan must count: its
 * seq_cst load of the state word did not see the scanner's operation (else
 * it backs out or registers for a later phase, and need not be counted), so
 * it precedes that operation in S.  Then
 *   raise(i) <S increment <S reader's state load <S scanner's state op
 *            <S scanner's mark load,
 * and the mark never falls, so the scanner's load returns at least i + 1:
 * slot i is scanned, and its load of slot.readers follows the increment in
 * S, so it sees it.  A slot reused after a death or by a forked child is
 * below the mark already (attach_slot raises it again, harmlessly).
 * (Strictly, the raise need only precede the reader's look at the state;
 * attach_slot puts it before anything the slot can hold.  The model has
 * both steps, ATTACH_HWM and SCAN_HWM, and catches a raise after the look
 * and a bound loaded before the claim.)
 */
static uint32_t scan_limit(shl_lock *h)
{
    uint32_t n = atomic_load_explicit(&h->hdr->slots_hwm, memory_order_seq_cst); /* [model:SCAN_HWM] */
    return n < h->max ? n : h->max;
}

static uint64_t sum_readers(shl_lock *h)
{
    uint64_t n = 0;
    uint32_t lim = scan_limit(h);
    for (uint32_t i = 0; i < lim; i++)
        n += atomic_load_explicit(&h->slots[i].readers, memory_order_seq_cst);
    return n;
}

static uint64_t sum_owed(shl_lock *h, uint32_t parity)
{
    uint64_t n = 0;
    uint32_t lim = scan_limit(h);
    for (uint32_t i = 0; i < lim; i++)
        n += atomic_load_explicit(&h->slots[i].rwait[parity], memory_order_seq_cst);
    return n;
}

/* ---------------------------------------------------------- the attempts */

/* Would this attempt wait for an exclusive hold that its own thread owns?
 * Not for asyncio attempts, where another task of the thread may release. */
/* held_excl is loaded with acquire before excl_thread: a non-zero value
 * comes from grant_exclusive's release store (or release_exclusive's
 * restore), which follows its store of excl_thread, so we see that thread
 * or a later grantee, never the thread of an older hold.  With both loads
 * relaxed, arm64 could pair a new grant's held_excl with the previous
 * holder's excl_thread: a false SHL_EDEADLK for the previous holder. */
static int excl_is_this_thread(shl_lock *h, const shl_waiter *w)
{
    return !w->shared_thread &&
           atomic_load_explicit(&h->held_excl, memory_order_acquire) != 0 &&
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
    uint32_t prev = atomic_fetch_add_explicit(&me->readers, 1, memory_order_seq_cst); /* [model:READ_ANNOUNCE] */
    uint32_t s = atomic_load_explicit(&h->hdr->state, memory_order_seq_cst); /* [model:READ_LOOK] */
    if (__builtin_expect(prev >= SHL_READ_HOLDS_MAX, 0)) {
        /* Never let the count wrap (a writer would see 0 beside our holds).
         * Attempts in flight add at most one each, far below 2^31. */
        if (atomic_fetch_sub_explicit(&me->readers, 1, memory_order_seq_cst) == 1)
            wake_drainers(h);
        return SHL_EOVERFLOW;
    }
    if (__builtin_expect((s & (ST_PAUSED | ST_OWNER)) == 0, 1))
        goto granted;
    /* Owed reader: the current claim is still waiting for readers, and
     * either it waits for us (we are registered under the parity it counts,
     * (epoch - 1) & 1; see drain_for_exclusive) or it came later than the
     * phase we queued behind.  The first test alone decides liveness: a
     * claim that waits for us always lets us in, so no epoch value, however
     * often the 15-bit epoch wrapped during our wait, can make it wait for a
     * reader that refuses to enter.  The epoch comparison alone could (a
     * wrap makes a later claim look like ours).  The second test only lets
     * us in sooner. */
    if (!(s & (ST_PAUSED | ST_GRANTED)) && w->registered &&
        ((w->registered & (1u << ((ST_EPOCH(s) - 1u) & 1u))) || ST_EPOCH(s) != w->my_epoch))
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
    /* excl_thread first, then held_excl with release: see excl_is_this_thread. */
    atomic_store_explicit(&h->excl_thread, (unsigned long)pthread_self(), memory_order_relaxed);
    atomic_store_explicit(&h->held_excl, w->kind, memory_order_release);
    atomic_store_explicit(&h->hdr->exclusive_pid, h->pid, memory_order_relaxed);
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

static int do_try(shl_lock *h, shl_waiter *w)
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

int shl_try(shl_lock *h, shl_waiter *w)
{
    int r = enter(h);
    if (r != SHL_OK)
        return r;
    r = do_try(h, w);
    leave(h);
    return r;
}

static void do_cancel(shl_lock *h, shl_waiter *w)
{
    if (h->self < 0 || atomic_load_explicit(&h->fork_gen, memory_order_acquire) !=
                            atomic_load_explicit(&g_fork_gen, memory_order_relaxed))
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

void shl_cancel(shl_lock *h, shl_waiter *w)
{
    /* A closed handle carries no registration: close refuses while any
     * attempt of ours is registered or claims. */
    if (enter(h) != SHL_OK)
        return;
    do_cancel(h, w);
    leave(h);
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
    /* [model:WATCH_OWNER] The slot the state word names as exclusive owner
     * comes first, free or not, so the cap never drops it.  A claim or hold
     * naming a free slot (its owner detached, or a corrupt word) is then
     * probed at once (its mutex word has no owner) and reclaimed by
     * probe_slot: no claim can name a slot that nobody watches. */
    int32_t o = owner_index(h, atomic_load_explicit(&h->hdr->state, memory_order_relaxed));
    if (o >= 0 && o != h->self && n < cap)
        watch[n++] = o;
    /* Slots at or above the high-water mark were never attached, so they
     * have no owner to watch and no leftovers (a process that attaches
     * after this scan is missed either way, as without the bound: the
     * safety net covers it).  The owner slot above is watched whatever the
     * mark says. */
    uint32_t lim = scan_limit(h);
    for (uint32_t i = 0; i < lim && n < cap; i++)
        if ((int32_t)i != h->self && (int32_t)i != o &&
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

static int do_wait(shl_lock *h, shl_waiter *w, int64_t deadline_ns)
{
    int r = ensure_attached(h);
    if (r != SHL_OK)
        return r;
    struct shl_header *hd = h->hdr;
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

int shl_wait(shl_lock *h, shl_waiter *w, int64_t deadline_ns)
{
    int r = enter(h);
    if (r != SHL_OK)
        return r;
    r = do_wait(h, w, deadline_ns);
    leave(h);
    return r;
}

/* --------------------------------------------------------- blocking calls */

static int run_blocking(shl_lock *h, int kind, int64_t deadline_ns)
{
    int r = enter(h);
    if (r != SHL_OK)
        return r;
    shl_waiter w;
    memset(&w, 0, sizeof w);
    w.kind = kind;
    for (;;) {
        r = do_try(h, &w);
        if (r == SHL_OK)
            break;
        if (r == SHL_AGAIN)
            r = do_wait(h, &w, deadline_ns);
        if (r != SHL_OK) {
            do_cancel(h, &w);
            break;
        }
    }
    leave(h);
    return r;
}

int shl_acquire_read(shl_lock *h, int64_t d)   { return run_blocking(h, SHL_KIND_READ, d); }
int shl_acquire_write(shl_lock *h, int64_t d)  { return run_blocking(h, SHL_KIND_WRITE, d); }
int shl_acquire_update(shl_lock *h, int64_t d) { return run_blocking(h, SHL_KIND_UPDATE, d); }
int shl_resume(shl_lock *h, int64_t d)         { return run_blocking(h, SHL_KIND_RESUME, d); }
int shl_wait_resumed(shl_lock *h, int64_t d)   { return run_blocking(h, SHL_KIND_RESUMED, d); }
int shl_wait_drained(shl_lock *h, int64_t d)   { return run_blocking(h, SHL_KIND_DRAINED, d); }

/* --------------------------------------------------------------- releases */

static int do_release_read(shl_lock *h)
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

int shl_release_read(shl_lock *h)
{
    int r = enter(h);
    if (r != SHL_OK)
        return r;
    r = do_release_read(h);
    leave(h);
    return r;
}

static int do_release_exclusive(shl_lock *h, int kind)
{
    int r = ensure_attached(h);
    if (r != SHL_OK)
        return r;
    struct shl_header *hd = h->hdr;
    int32_t k = kind;
    if (!atomic_compare_exchange_strong_explicit(&h->held_excl, &k, 0, memory_order_relaxed,
                                                 memory_order_relaxed))
        return SHL_ENOHOLD;
    uint32_t s = atomic_load_explicit(&hd->state, memory_order_relaxed);
    uint32_t kind_bit = kind == SHL_KIND_UPDATE ? ST_UPDATE : 0;
    if (owner_of(s) != (uint32_t)h->self + 1 || !(s & ST_GRANTED) ||
        (s & ST_UPDATE) != kind_bit) {
        atomic_store_explicit(&h->held_excl, kind, memory_order_release);
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

static int release_exclusive(shl_lock *h, int kind)
{
    int r = enter(h);
    if (r != SHL_OK)
        return r;
    r = do_release_exclusive(h, kind);
    leave(h);
    return r;
}

int shl_release_write(shl_lock *h)  { return release_exclusive(h, SHL_KIND_WRITE); }
int shl_release_update(shl_lock *h) { return release_exclusive(h, SHL_KIND_UPDATE); }

static int do_pause(shl_lock *h)
{
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

int shl_pause(shl_lock *h)
{
    int r = enter(h);
    if (r != SHL_OK)
        return r;
    r = do_pause(h);
    leave(h);
    return r;
}

int shl_is_paused(shl_lock *h)
{
    int r = enter(h);
    if (r != SHL_OK)
        return r;
    r = (atomic_load_explicit(&h->hdr->state, memory_order_acquire) & ST_PAUSED) != 0;
    leave(h);
    return r;
}

static int do_is_locked(shl_lock *h)
{
    uint32_t s = atomic_load_explicit(&h->hdr->state, memory_order_seq_cst);
    if (owner_index(h, s) == -2)
        return SHL_ECORRUPT;
    if (s & ST_GRANTED)
        return 1;
    return sum_readers(h) != 0;
}

int shl_is_locked(shl_lock *h)
{
    int r = enter(h);
    if (r != SHL_OK)
        return r;
    r = do_is_locked(h);
    leave(h);
    return r;
}

/* ---------------------------------------------------------- host lease */

/* Pause h's gate if its host lease has passed.  Returns 1 when a lease is
 * armed.  The caller keeps the mapping alive (an in-flight count, H_SWEEP,
 * or a handle not yet published by shl_open).  This is only a use of the
 * existing pause step (do_pause, [model:PAUSE_SET]): a pause may be taken by
 * any process at any moment, so admission, the model and the read fast path
 * are unchanged. */
static int lease_check(shl_lock *h)
{
    struct shl_header *hd = h->hdr;
    /* relaxed: the deadline is a timer, not a synchronisation point; the
     * pause itself is do_pause's seq_cst CAS.  Any value is harmless: the
     * worst a corrupt deadline does is pause (or not pause) the gate, which
     * every process that can write the segment may do anyway. */
    int64_t d = atomic_load_explicit(&hd->lease_deadline_ns, memory_order_relaxed);
    if (d == 0)
        return 0;
    if (mono_ns() >= d && !(atomic_load_explicit(&hd->state, memory_order_relaxed) & ST_PAUSED)) {
        if (do_pause(h) == 1)
            atomic_fetch_add_explicit(&hd->lease_expiries, 1, memory_order_relaxed);
    }
    return 1;
}

/*
 * One sweep over every handle this process ever opened (g_handles: handles
 * are never freed, so the walk is safe without a lock).  A handle is looked
 * at only inside H_SWEEP, the watchdog's own in-flight mark, taken by the
 * same kind of RMW as enter(): if the add finds H_CLOSED or H_CLOSING the
 * handle is skipped (its segment is, or may soon be, unmapped); otherwise
 * close()'s CAS from 0 fails until the mark is dropped, and close() waits
 * for it (a few loads and at most one pause) instead of refusing, so a user
 * close never fails because the watchdog happened to look.  acquire/release
 * as for enter()/leave().  Sets *open to the number of open handles seen;
 * returns 1 if some open segment has a lease armed.
 */
static int lease_sweep(int *open)
{
    int armed = 0;
    *open = 0;
    for (shl_lock *h = atomic_load_explicit(&g_handles, memory_order_acquire); h;
         h = h->next_handle) {
        uint32_t n = atomic_fetch_add_explicit(&h->inflight, H_SWEEP, memory_order_acquire);
        if (!(n & (H_CLOSED | H_CLOSING))) {
            (*open)++;
            armed |= lease_check(h);
        }
        atomic_fetch_sub_explicit(&h->inflight, H_SWEEP, memory_order_release);
    }
    return armed;
}

static void *watchdog_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&g_wd_mu);
    for (;;) {
        uint64_t gen = g_wd_gen;
        pthread_mutex_unlock(&g_wd_mu);
        int open;
        int armed = lease_sweep(&open);
        int64_t next = mono_ns() + (armed ? LEASE_POLL_NS : LEASE_IDLE_NS);
        struct timespec ts;
        ns_to_timespec(next, &ts);
        pthread_mutex_lock(&g_wd_mu);
        /* Nothing open: sleep until an attachment kicks us (wd_kick bumps
         * g_wd_gen after the handle is on g_handles, so a handle published
         * after this sweep began is never missed). */
        while (open == 0 && g_wd_gen == gen)
            pthread_cond_wait(&g_wd_cv, &g_wd_mu);
        if (open != 0)
            while (g_wd_gen == gen && pthread_cond_timedwait(&g_wd_cv, &g_wd_mu, &ts) != ETIMEDOUT)
                ;
    }
    return NULL;
}

/* Start this process's watchdog if it is not running.  SHL_OK or SHL_ESYS. */
static int wd_start(void)
{
    int r = 0;
    pthread_mutex_lock(&g_wd_mu);
    if (!g_wd_started) {
        pthread_condattr_t ca;
        pthread_attr_t attr;
        pthread_t t;
        sigset_t all, old;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&g_wd_cv, &ca);
        pthread_condattr_destroy(&ca);
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 64 * 1024);
        /* Like a keeper, the watchdog never takes the application's signals. */
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        r = pthread_create(&t, &attr, watchdog_main, NULL);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&attr);
        if (r == 0)
            g_wd_started = 1;
    }
    pthread_mutex_unlock(&g_wd_mu);
    if (r != 0) {
        errno = r;
        return SHL_ESYS;
    }
    return SHL_OK;
}

/* A handle was published or re-attached: sweep now (and leave an untimed
 * sleep).  Cheap: called only on open and on a forked child's re-attach. */
static void wd_kick(void)
{
    pthread_mutex_lock(&g_wd_mu);
    g_wd_gen++;
    if (g_wd_started)
        pthread_cond_broadcast(&g_wd_cv);
    pthread_mutex_unlock(&g_wd_mu);
}

int shl_lease_set(shl_lock *h, int64_t deadline_ns)
{
    int r = enter(h);
    if (r != SHL_OK)
        return r;
    atomic_store_explicit(&h->hdr->lease_pid, deadline_ns ? (uint32_t)getpid() : 0,
                          memory_order_relaxed);
    /* seq_cst: a renewal is ordered before the agent's following resume, so
     * a watchdog that sees the resumed gate also sees the renewed deadline. */
    atomic_store_explicit(&h->hdr->lease_deadline_ns, deadline_ns, memory_order_seq_cst);
    leave(h);
    return SHL_OK;
}

int shl_lease_get(shl_lock *h, shl_lease_info *out)
{
    int r = enter(h);
    if (r != SHL_OK)
        return r;
    out->deadline_ns = atomic_load_explicit(&h->hdr->lease_deadline_ns, memory_order_relaxed);
    out->now_ns = mono_ns();
    out->pid = atomic_load_explicit(&h->hdr->lease_pid, memory_order_relaxed);
    out->expiries = atomic_load_explicit(&h->hdr->lease_expiries, memory_order_relaxed);
    leave(h);
    return SHL_OK;
}

/* ------------------------------------------------------------ open/close */

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
 * and count is checked against the file size before anything is indexed.
 * The file must be exactly the layout's size: shorter would fault (SIGBUS)
 * past its end, longer is not something any pyshmlock process makes. */
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
    if (hd->total_size != layout_size(m))
        return SHL_ECORRUPT;
    if (st_size != layout_size(m))
        return SHL_ESIZE;
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
static int map_existing(int fd, struct shl_header **out, size_t *size, uint32_t *max,
                        uint64_t *expected)
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
                    if (r == SHL_ESIZE)
                        *expected = hd->total_size;
                    *size = len;
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

/*
 * May this process use the existing segment behind st?  (docs/DESIGN.md,
 * "Trust model".)  Everyone who can write the segment can make this process
 * hang or crash, and through the robust-list pointers glibc keeps in a held
 * slot mutex, write to this process's memory.  So the segment must be owned
 * by our effective uid, or, by explicit opt-in, belong to `group`; and it
 * may grant group/other write only where `mode` does.  Checked on the open
 * file (fstat), so a later rename cannot swap what was checked; only the
 * owner (trusted by these rules) or root can chmod/chown it afterwards.
 */
static int segment_trusted(const struct stat *st, uint32_t mode, int64_t group)
{
    int ours = st->st_uid == geteuid();
    int by_group = group >= 0 && (int64_t)st->st_gid == group;
    if (!ours && !by_group)
        return 0;
    /* With the opt-in, a group that may write must be that group. */
    if (group >= 0 && !by_group && (st->st_mode & 0020))
        return 0;
    return ((uint32_t)st->st_mode & 0022u & ~mode) == 0;
}

static void fill_info(shl_open_info *info, const struct stat *st)
{
    info->uid = (uint32_t)st->st_uid;
    info->gid = (uint32_t)st->st_gid;
    info->mode = (uint32_t)st->st_mode & 07777u;
    info->dev = (uint64_t)st->st_dev;
    info->ino = (uint64_t)st->st_ino;
    info->size = (uint64_t)st->st_size;
}

int shl_open(const char *name, int create, uint32_t mode, int64_t group,
             uint32_t max_processes, shl_lock **out, shl_open_info *info)
{
    char path[SHL_NAME_MAX + 32];
    *out = NULL;
    memset(info, 0, sizeof *info);
    if (!valid_name(name) || mode > 0777 || group > (int64_t)UINT32_MAX - 1)
        return SHL_EINVAL;
    if (create && (max_processes < 1 || max_processes > SHL_MAX_PROCESSES_LIMIT))
        return SHL_EINVAL;
    pthread_once(&g_once, init_once);
    snprintf(path, sizeof path, "/pyshmlock.%s", name);

    int fd = -1, created = 0;
    for (int attempt = 0; attempt < 8 && fd < 0; attempt++) {
        if (create) {
            fd = shm_open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, mode & 0777);
            if (fd >= 0) {
                created = 1;
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
    uint64_t expected = 0;
    struct stat st;
    int r = SHL_OK;
    if (created) {
        size = layout_size(max_processes);
        /* The group first (fchown may clear mode bits), then the exact mode:
         * shm_open applied the umask, and `mode` is what the caller asked. */
        if ((group >= 0 && fchown(fd, (uid_t)-1, (gid_t)group) != 0) ||
            fchmod(fd, mode & 0777) != 0 || ftruncate(fd, (off_t)size) != 0) {
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
    } else if (fstat(fd, &st) != 0) {
        r = SHL_ESYS;
    } else if (fill_info(info, &st), !segment_trusted(&st, mode, group)) {
        r = SHL_EPERM;   /* never mapped: nothing of it reaches glibc */
    } else {
        r = map_existing(fd, &hd, &size, &max, &expected);
        if (r == SHL_ESIZE) {
            info->size = size;
            info->expected_size = expected;
        }
    }
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
    fill_info(info, &st);
    info->created = created;

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
    h->dev = (uint64_t)st.st_dev;
    h->ino = (uint64_t)st.st_ino;
    r = ensure_attached(h);
    if (r != SHL_OK) {
        munmap(hd, size);
        free(h);
        return r;
    }
    /* A segment whose host lease has already passed (its host's agent died
     * with every process) is paused before this open returns, so the caller
     * can admit nothing.  The handle is not published yet: no enter(). */
    lease_check(h);
    /* Publish for after_fork_in_child and the watchdog; release: a forked
     * child and the watchdog walk a fully written entry. */
    h->next_handle = atomic_load_explicit(&g_handles, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&g_handles, &h->next_handle, h,
                                                  memory_order_release, memory_order_relaxed)) {
    }
    wd_kick();
    *out = h;
    return SHL_OK;
}

int shl_close(shl_lock *h)
{
    if (h == NULL)
        return SHL_ECLOSED;
    /* Take the handle from 0 calls in flight to H_CLOSING, or refuse (see
     * enter()).  acquire: every finished call's accesses to the mapping
     * happen before the checks and the munmap below. */
    uint32_t n = 0;
    while (!atomic_compare_exchange_strong_explicit(&h->inflight, &n, H_CLOSING,
                                                    memory_order_acquire, memory_order_relaxed)) {
        if (n != H_SWEEP)
            return (n & H_CLOSED) ? SHL_ECLOSED : SHL_EINFLIGHT;
        /* Only the lease watchdog is looking (lease_sweep): it never waits
         * for anything, so wait it out rather than refuse. */
        sched_yield();
        n = 0;
    }
    int ours = h->self >= 0 &&
               atomic_load_explicit(&h->fork_gen, memory_order_acquire) ==
                   atomic_load_explicit(&g_fork_gen, memory_order_relaxed);
    int r = SHL_OK;
    if (ours && (atomic_load_explicit(&h->held_reads, memory_order_relaxed) != 0 ||
                 atomic_load_explicit(&h->held_excl, memory_order_relaxed) != 0)) {
        r = SHL_EBUSY;
    } else if (ours) {
        /* An attempt parked outside the core (asyncio) may still be queued
         * as an owed reader or claim the lock: freeing the slot would leave
         * a claim or registration that names a slot nobody owns. */
        struct shl_slot *me = &h->slots[h->self];
        if (owner_of(atomic_load_explicit(&h->hdr->state, memory_order_seq_cst)) ==
                (uint32_t)h->self + 1 ||
            atomic_load_explicit(&me->rwait[0], memory_order_seq_cst) != 0 ||
            atomic_load_explicit(&me->rwait[1], memory_order_seq_cst) != 0)
            r = SHL_EINFLIGHT;
    }
    if (r != SHL_OK) {
        /* open again (release: our loads above stay before any new call) */
        atomic_fetch_and_explicit(&h->inflight, ~H_CLOSING, memory_order_release);
        return r;
    }
    /* H_CLOSING -> H_CLOSED in one RMW (bit 30 + bit 30 carries into bit 31),
     * keeping the transient counts of callers that are backing out. */
    atomic_fetch_add_explicit(&h->inflight, H_CLOSED - H_CLOSING, memory_order_relaxed);
    if (ours) {
        struct shl_slot *me = &h->slots[h->self];
        atomic_store_explicit(&me->pid, 0, memory_order_relaxed);
        keeper_call(KEEP_UNLOCK, &me->owner);
    }
    munmap(h->hdr, h->map_size);
    /* The handle itself is never freed nor reused: another thread may have
     * loaded the pointer before close() and call in later (cffi drops the
     * GIL before the C function runs); it then finds H_CLOSED.  Recycling
     * the memory would let such a call act on another lock (ABA).  The
     * cost is sizeof(shl_lock) bytes per close for the life of the
     * process. */
    h->hdr = NULL;
    h->slots = NULL;
    h->self = -1;
    return SHL_OK;
}

/* Count the live processes attached to the mapped segment (dev/ino),
 * other than this process's own attachments; reclaims dead ones. */
static uint32_t count_others(struct shl_header *hd, uint32_t max, uint64_t dev, uint64_t ino)
{
    shl_lock probe;
    memset(&probe, 0, sizeof probe);
    probe.hdr = hd;
    probe.slots = (struct shl_slot *)(hd + 1);
    probe.max = max;
    probe.self = -1;
    uint32_t n = 0;
    for (uint32_t i = 0; i < max; i++) {
        /* Ours by attachment (a slot our keepers hold), never by pid: two
         * PID namespaces can both have a process with our pid. */
        if (own_attachment(dev, ino, i))
            continue;
        if (probe_slot(&probe, i))
            n++;
    }
    return n;
}

/*
 * Remove the name "/pyshmlock.<name>" only if it still names the segment
 * `probed` (dev/ino).  The name is renamed atomically to a private name,
 * which makes what it named ours to check: the same segment is unlinked;
 * another one (the lock was removed and created anew meanwhile) is renamed
 * back.  Returns 0 removed, 1 the name named another segment (look again),
 * or SHL_ESYS.
 *
 * Left: a process that creates the lock anew during the microseconds the
 * name is away ends up alone on a removed segment, as any creator racing an
 * unlink does.  A crash between the renames leaves a file
 * "/dev/shm/.pyshmlock-unlink.*" behind (and the lock's name missing).
 */
static int unlink_exactly(const char *name, const struct stat *probed)
{
    static _Atomic uint32_t seq;
    char path[SHL_NAME_MAX + 64], tmp[96];
    snprintf(path, sizeof path, "/dev/shm/pyshmlock.%s", name);
    int moved = -1;
    for (int k = 0; k < 8 && moved != 0; k++) {
        snprintf(tmp, sizeof tmp, "/dev/shm/.pyshmlock-unlink.%d.%u.%llu", (int)getpid(),
                 atomic_fetch_add_explicit(&seq, 1, memory_order_relaxed),
                 (unsigned long long)real_ns());
        moved = renameat2(AT_FDCWD, path, AT_FDCWD, tmp, RENAME_NOREPLACE);
        if (moved != 0 && (errno == EINVAL || errno == ENOSYS)) {
            /* No RENAME_NOREPLACE here: check the name, then remove it (a
             * window of a few instructions between the two is left). */
            struct stat cur;
            if (stat(path, &cur) != 0)
                return SHL_ESYS;
            if (cur.st_dev != probed->st_dev || cur.st_ino != probed->st_ino)
                return 1;
            return unlink(path) == 0 ? 0 : SHL_ESYS;
        }
        if (moved != 0 && errno != EEXIST)
            return SHL_ESYS;   /* ENOENT: removed meanwhile (FileNotFoundError) */
    }
    if (moved != 0)
        return SHL_ESYS;
    struct stat now;
    if (stat(tmp, &now) != 0)
        return SHL_ESYS;
    if (now.st_dev == probed->st_dev && now.st_ino == probed->st_ino)
        return unlink(tmp) == 0 ? 0 : SHL_ESYS;
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE) == 0)
        return 1;
    if (errno != EEXIST)
        return SHL_ESYS;
    /* A creator found the name free while it was renamed away and made a
     * new lock: swap the segment we moved back in, then remove the new one.
     * Its creator is left alone on it, as any creator racing an unlink is. */
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_EXCHANGE) != 0 || unlink(tmp) != 0)
        return SHL_ESYS;
    return 1;
}

int shl_unlink(const char *name, int force, uint32_t *attached)
{
    char path[SHL_NAME_MAX + 32];
    *attached = 0;
    if (!valid_name(name))
        return SHL_EINVAL;
    pthread_once(&g_once, init_once);
    snprintf(path, sizeof path, "/pyshmlock.%s", name);
    if (force)   /* remove whatever the name names, without looking inside */
        return shm_unlink(path) == 0 ? SHL_OK : SHL_ESYS;
    for (int attempt = 0; attempt < 8; attempt++) {
        int fd = shm_open(path, O_RDWR | O_CLOEXEC, 0);
        if (fd < 0)
            return SHL_ESYS;
        struct stat st;
        struct shl_header *hd = NULL;
        size_t size = 0;
        uint32_t max = 0;
        uint64_t expected = 0;
        int r = SHL_OK;
        if (fstat(fd, &st) != 0)
            r = SHL_ESYS;
        else if (st.st_uid != geteuid())
            r = SHL_EPERM;   /* probing locks its mutexes: only our own segments */
        else
            r = map_existing(fd, &hd, &size, &max, &expected);
        int e = errno;
        close(fd);
        errno = e;
        if (r != SHL_OK)
            return r;
        *attached = count_others(hd, max, (uint64_t)st.st_dev, (uint64_t)st.st_ino);
        munmap(hd, size);
        if (*attached)
            return SHL_EBUSY;
        r = unlink_exactly(name, &st);
        if (r <= 0)
            return r;
        /* The name was given to another segment meanwhile: look at that one. */
    }
    errno = EAGAIN;
    return SHL_ESYS;
}

/* --------------------------------------------------------- observability */

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

static int do_info(shl_lock *h, shl_snapshot *out)
{
    int r = ensure_attached(h);
    if (r != SHL_OK)
        return r;
    struct shl_header *hd = h->hdr;
    uint32_t s = atomic_load_explicit(&hd->state, memory_order_seq_cst);
    int32_t o = owner_index(h, s);
    if (o == -2)
        return SHL_ECORRUPT;
    memset(out, 0, sizeof *out);
    out->state = s;
    out->paused = (s & ST_PAUSED) != 0;
    out->exclusive_slot = o;
    out->exclusive_kind = o < 0 ? 0 : (s & ST_UPDATE) ? SHL_KIND_UPDATE : SHL_KIND_WRITE;
    out->exclusive_pid = o < 0 ? 0 : atomic_load_explicit(&h->slots[o].pid, memory_order_relaxed);
    out->exclusive_granted = exclusive_held(hd, s, out->exclusive_pid);
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

int shl_info(shl_lock *h, shl_snapshot *out)
{
    int r = enter(h);
    if (r != SHL_OK)
        return r;
    r = do_info(h, out);
    leave(h);
    return r;
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
    out->alive = probe_slot(h, index);   /* reclaims a dead owner's holds */
    out->pid = atomic_load_explicit(&sl->pid, memory_order_relaxed);
    out->readers = atomic_load_explicit(&sl->readers, memory_order_relaxed);
    out->owed = atomic_load_explicit(&sl->rwait[0], memory_order_relaxed) +
                atomic_load_explicit(&sl->rwait[1], memory_order_relaxed);
    out->waiting = atomic_load_explicit(&sl->waiting, memory_order_relaxed);
    out->is_self = (int32_t)index == h->self;
    out->pidns = atomic_load_explicit(&sl->pidns, memory_order_relaxed);
    return SHL_OK;
}

int shl_slot_info(shl_lock *h, uint32_t index, shl_slot_snapshot *out)
{
    int r = enter(h);
    if (r != SHL_OK)
        return r;
    r = do_slot_info(h, index, out);
    leave(h);
    return r;
}

int shl_recovery_info(shl_lock *h, uint32_t index, shl_recovery_record *out)
{
    if (index >= SHL_RECOVERY_LOG)
        return h == NULL ? SHL_ECLOSED : SHL_EINVAL;
    int r = enter(h);
    if (r != SHL_OK)
        return r;
    struct shl_recovery_entry *e = &h->hdr->recoveries[index];
    out->pid = __atomic_load_n(&e->pid, __ATOMIC_RELAXED);
    out->what = __atomic_load_n(&e->what, __ATOMIC_RELAXED);
    out->reads = __atomic_load_n(&e->reads, __ATOMIC_RELAXED);
    out->owed = __atomic_load_n(&e->owed, __ATOMIC_RELAXED);
    out->when_ns = __atomic_load_n(&e->when_ns, __ATOMIC_RELAXED);
    leave(h);
    return SHL_OK;
}

uint32_t shl_load_state(shl_lock *h)
{
    if (enter(h) != SHL_OK)
        return 0;
    uint32_t v = atomic_load_explicit(&h->hdr->state, memory_order_acquire);
    leave(h);
    return v;
}

/* ---------------------------------------------------------- stale segments */

/* How often the reset re-scans after the state word changed under it before
 * it gives up (and keeps the pause): a word that keeps changing means live
 * processes are using the lock, so it is not stale. */
#define STALE_RETRIES 16

static int do_reset_stale(shl_lock *h, uint32_t dead_pauser)
{
    int r = ensure_attached(h);
    if (r != SHL_OK)
        return r;
    struct shl_header *hd = h->hdr;
    for (int attempt = 0; attempt < STALE_RETRIES; attempt++) {
        /* seq_cst: the word is read before the scan below; the CAS at the end
         * compares against exactly this value. */
        uint32_t s = atomic_load_explicit(&hd->state, memory_order_seq_cst);
        if (!(s & ST_PAUSED))
            return 0;
        int32_t o = owner_index(h, s);
        if (o == -2)
            return SHL_ECORRUPT;
        /* An update claim pins the pause (invariant 4).  The scan below
         * skips our own slot, so our own update claim is checked here. */
        if (o == h->self && (s & ST_UPDATE))
            return 0;
        /* Only the pause the caller judged stale is cleared: a pause recorded
         * under another pid (or none yet: a pause() between its CAS and its
         * pid store) is a fresh one. */
        if (atomic_load_explicit(&hd->paused_by_pid, memory_order_relaxed) != dead_pauser ||
            dead_pauser == 0)
            return 0;
        /* A segment with a host lease armed is under its cluster agent's
         * control: a restarted host stays paused (fail closed) until its
         * agent has mirrored the cluster, whoever paused it and whoever
         * died.  relaxed: an agent that arms the lease later is attached
         * and alive (the scan below sees it), and if a reset still wins a
         * race with it, an expired lease is paused again by the watchdog. */
        if (atomic_load_explicit(&hd->lease_deadline_ns, memory_order_relaxed) != 0)
            return 0;
        /* Any other live process: not stale.  Probing reclaims dead slots
         * (their reads, owed registrations and claims), which changes the
         * word and so makes the CAS below fail once and the loop rescan. */
        for (uint32_t i = 0; i < h->max; i++)
            if ((int32_t)i != h->self && probe_slot(h, i))
                return 0;
        /* An update claim pins the pause; a live claimant was seen above, a
         * dead one was reclaimed (and changed the word). */
        uint32_t ns = s & ~(ST_PAUSED | ST_SLEEPERS);
        if (atomic_compare_exchange_strong_explicit(&hd->state, &s, ns, memory_order_seq_cst,
                                                    memory_order_seq_cst)) {
            atomic_store_explicit(&hd->paused_by_pid, 0, memory_order_relaxed);
            record_recovery(h, dead_pauser, SHL_LOST_PAUSE, 0, 0);
            /* A process that attached after our scan may already sleep for
             * the resume: it set SLEEPERS, which would have failed our CAS,
             * so only a sleeper bit we saw can be pending; wake it anyway. */
            if (s & ST_SLEEPERS)
                futex_wake_all(&hd->state);
            return 1;
        }
    }
    return 0;
}

int shl_reset_stale(shl_lock *h, uint32_t dead_pauser)
{
    int r = enter(h);
    if (r != SHL_OK)
        return r;
    r = do_reset_stale(h, dead_pauser);
    leave(h);
    return r;
}

/* ------------------------------------------------------------- observers */

struct shl_observer {
    const struct shl_header *hdr;   /* mapped PROT_READ: never written */
    const struct shl_slot *slots;
    size_t map_size;
    uint32_t max;                   /* validated private copy */
};

int shl_observe_open(const char *name, shl_observer **out)
{
    char path[SHL_NAME_MAX + 32];
    *out = NULL;
    if (!valid_name(name))
        return SHL_EINVAL;
    snprintf(path, sizeof path, "/pyshmlock.%s", name);
    int fd = shm_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return SHL_ESYS;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return SHL_ESYS;
    }
    /* An observer does not wait for a creator: an empty segment is reported
     * at once (a creator sets the size before it writes a byte). */
    if (st.st_size == 0) {
        close(fd);
        return SHL_EINIT;
    }
    if ((size_t)st.st_size < sizeof(struct shl_header)) {
        close(fd);
        return SHL_EFOREIGN;
    }
    size_t len = (size_t)st.st_size;
    void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) {
        errno = e;
        return SHL_ESYS;
    }
    const struct shl_header *hd = p;
    uint32_t max = 0;
    int r;
    /* acquire: pairs with init_segment's release store of READY. */
    if (atomic_load_explicit(&hd->ready, memory_order_acquire) != SHL_READY)
        r = (hd->magic != 0 && hd->magic != SHL_MAGIC) ? SHL_EFOREIGN : SHL_EINIT;
    else
        r = validate_header(hd, len, &max);
    shl_observer *o = r == SHL_OK ? calloc(1, sizeof *o) : NULL;
    if (r == SHL_OK && !o) {
        errno = ENOMEM;
        r = SHL_ESYS;
    }
    if (r != SHL_OK) {
        munmap(p, len);
        return r;
    }
    o->hdr = hd;
    o->slots = (const struct shl_slot *)(hd + 1);
    o->map_size = len;
    o->max = max;
    *out = o;
    return SHL_OK;
}

void shl_observe_close(shl_observer *o)
{
    if (o == NULL)
        return;
    munmap((void *)o->hdr, o->map_size);
    free(o);
}

int shl_observe_info(shl_observer *o, shl_snapshot *out)
{
    if (o == NULL)
        return SHL_ECLOSED;
    const struct shl_header *hd = o->hdr;
    uint32_t s = atomic_load_explicit(&hd->state, memory_order_seq_cst);
    uint32_t own = owner_of(s);
    /* The same bounds check as owner_index, against our private max. */
    if (own > o->max || (own == 0 && (s & (ST_UPDATE | ST_GRANTED))))
        return SHL_ECORRUPT;
    int32_t ix = (int32_t)own - 1;
    memset(out, 0, sizeof *out);
    out->state = s;
    out->paused = (s & ST_PAUSED) != 0;
    out->exclusive_slot = ix;
    out->exclusive_kind = ix < 0 ? 0 : (s & ST_UPDATE) ? SHL_KIND_UPDATE : SHL_KIND_WRITE;
    out->exclusive_pid = ix < 0 ? 0 : atomic_load_explicit(&o->slots[ix].pid, memory_order_relaxed);
    out->exclusive_granted = exclusive_held(hd, s, out->exclusive_pid);
    out->epoch = ST_EPOCH(s);
    out->pause_count = atomic_load_explicit(&hd->pause_count, memory_order_relaxed);
    out->paused_by_pid = atomic_load_explicit(&hd->paused_by_pid, memory_order_relaxed);
    out->paused_at_ns = atomic_load_explicit(&hd->paused_at_ns, memory_order_relaxed);
    out->data_suspect = (atomic_load_explicit(&hd->flags, memory_order_relaxed) &
                         FLAG_DATA_SUSPECT) != 0;
    out->max_processes = o->max;
    out->recovery_count = atomic_load_explicit(&hd->recovery_count, memory_order_relaxed);
    out->creator_pid = hd->creator_pid;
    out->self_slot = -1;
    return SHL_OK;
}

/* Is the owner of this slot alive, judged from the mutex bytes alone?  The
 * kernel's robust-futex ABI keeps the owner's TID in the futex word while it
 * lives and, when it dies, replaces it with FUTEX_OWNER_DIED (before the
 * process becomes a zombie).  A process probing the slot holds it for a few
 * instructions, which reads as alive: an observer may call a dead owner
 * alive for that instant, never a live one dead. */
static int observed_alive(const struct shl_slot *sl)
{
#ifdef __GLIBC__
    pthread_mutex_t *m = (pthread_mutex_t *)&sl->owner;   /* only read below */
    if (!slot_mutex_sane(m))
        return 1;   /* not one of our mutexes: never called dead */
    uint32_t w = __atomic_load_n(mutex_word(m), __ATOMIC_ACQUIRE);
    return (w & FUTEX_TID_MASK) != 0 && !(w & FUTEX_OWNER_DIED);
#else
    (void)sl;
    return 1;
#endif
}

int shl_observe_slot(shl_observer *o, uint32_t index, shl_slot_snapshot *out)
{
    if (o == NULL)
        return SHL_ECLOSED;
    if (index >= o->max)
        return SHL_EINVAL;
    const struct shl_slot *sl = &o->slots[index];
    memset(out, 0, sizeof *out);
    out->pid = atomic_load_explicit(&sl->pid, memory_order_relaxed);
    out->readers = atomic_load_explicit(&sl->readers, memory_order_relaxed);
    out->owed = atomic_load_explicit(&sl->rwait[0], memory_order_relaxed) +
                atomic_load_explicit(&sl->rwait[1], memory_order_relaxed);
    out->waiting = atomic_load_explicit(&sl->waiting, memory_order_relaxed);
    if (out->pid == 0 && out->readers == 0 && out->owed == 0)
        return SHL_OK;   /* free */
    out->pidns = atomic_load_explicit(&sl->pidns, memory_order_relaxed);
    out->alive = observed_alive(sl);
    return SHL_OK;
}

int shl_observe_recovery(shl_observer *o, uint32_t index, shl_recovery_record *out)
{
    if (o == NULL)
        return SHL_ECLOSED;
    if (index >= SHL_RECOVERY_LOG)
        return SHL_EINVAL;
    const struct shl_recovery_entry *e = &o->hdr->recoveries[index];
    out->pid = __atomic_load_n(&e->pid, __ATOMIC_RELAXED);
    out->what = __atomic_load_n(&e->what, __ATOMIC_RELAXED);
    out->reads = __atomic_load_n(&e->reads, __ATOMIC_RELAXED);
    out->owed = __atomic_load_n(&e->owed, __ATOMIC_RELAXED);
    out->when_ns = __atomic_load_n(&e->when_ns, __ATOMIC_RELAXED);
    return SHL_OK;
}

/* ------------------------------------------------- the asyncio watcher */

/*
 * One watcher per (process, lock) sleeps for every parked asyncio attempt of
 * that process, in a thread of its own that runs only C (it never takes the
 * GIL).  When a word a parked attempt waits on changes, it writes to one
 * eventfd per event loop; each loop watches its eventfd (add_reader) and
 * retries its parked attempts.  So a wake-up costs one futex wake of this
 * thread and one eventfd wake of the loop, and no Python runs in between.
 *
 * What is watched.  A parked attempt registers the value its try decided on
 * (shl_waiter.expect, on the state word or on drain_seq).  shl_watcher_park
 * refuses (SHL_AGAIN: retry now) if the word no longer holds that value.
 * Otherwise the attempt joins the current generation: the thread sleeps while
 * every word holds the value its parked attempts expect.  Two attempts of one
 * generation that expect different values of one word mean it changed in
 * between, so the thread wakes everybody at once.  Waking everybody (a
 * broadcast) starts a new generation; every woken attempt retries and parks
 * again with a fresh value.  A spurious broadcast is always safe.
 *
 * A new registration the sleeping thread does not cover yet bumps the
 * process-private kick word, which the thread sleeps on too, so a newly
 * parked attempt is watched at once whatever it waits on.
 *
 * Everything here is process-private: the mutex, the kick word, the fds.  A
 * forked child starts with no thread and never touches the parent's watcher.
 */
#define WATCHER_IDLE_NS (5000LL * 1000 * 1000)   /* thread exits after idling this long */

/* Which words the sleeping watcher thread covers (shl_watcher.cover). */
#define WATCH_STATE 1
#define WATCH_DRAIN 2

struct shl_watcher {
    shl_lock *h;
    pthread_mutex_t mu;            /* guards everything below except kick */
    _Atomic uint32_t kick;         /* bumped (and futex-woken) to re-read the spec */
    uint64_t gen;                  /* generation of the current registrations */
    uint32_t n_state, n_drain;     /* parked attempts of this generation per word */
    uint32_t sexp, qexp;           /* the value they expect (state: sleeper bits ignored) */
    int sdirty, qdirty;            /* two different expectations: wake all */
    int32_t cover;                 /* WATCH_* the sleeping thread covers ... */
    uint32_t cover_s, cover_q;     /* ... and with which values */
    int running, have_tid, closing;
    pthread_t tid;
    int *fds;                      /* one eventfd per event loop */
    int nfds, capfds;
};

static void watcher_kick(shl_watcher *wt)
{
    /* Release: the thread re-reads the spec under mu anyway; the bump only
     * has to make its futex wait fail or end. */
    atomic_fetch_add_explicit(&wt->kick, 1, memory_order_release);
    futex_wake_all(&wt->kick);
}

/* Wake every event loop and start a new generation.  Caller holds mu. */
static void watcher_broadcast(shl_watcher *wt)
{
    uint64_t one = 1;
    wt->gen++;
    wt->n_state = wt->n_drain = 0;
    wt->sdirty = wt->qdirty = 0;
    for (int i = 0; i < wt->nfds; i++) {
        /* Only EAGAIN (the counter is saturated: already readable) can fail. */
        ssize_t r = write(wt->fds[i], &one, sizeof one);
        (void)r;
    }
}

static int state_differs(uint32_t a, uint32_t b)
{
    return ((a ^ b) & ~(ST_SLEEPERS | ST_DRAINERS)) != 0;
}

static void *watcher_main(void *arg)
{
    shl_watcher *wt = arg;
    shl_lock *h = wt->h;
    /* The thread is a call in flight on h for as long as it runs, so that
     * shl_close refuses (SHL_EINFLIGHT) instead of unmapping under it; the
     * binding stops the watcher (shl_watcher_free) before it closes. */
    int entered = enter(h) == SHL_OK;
    struct shl_header *hd = h->hdr;
    int64_t idle_since = mono_ns();
    pthread_mutex_lock(&wt->mu);
    if (!entered)
        watcher_broadcast(wt);   /* closed: every parked task retries and sees it */
    while (entered && !wt->closing) {
        uint32_t k = atomic_load_explicit(&wt->kick, memory_order_acquire);
        if (wt->n_state == 0 && wt->n_drain == 0) {
            wt->cover = 0;
            int64_t now = mono_ns();
            if (now - idle_since >= WATCHER_IDLE_NS)
                break;
            pthread_mutex_unlock(&wt->mu);
            futex_wait_until(&wt->kick, k, idle_since + WATCHER_IDLE_NS);
            pthread_mutex_lock(&wt->mu);
            continue;
        }
        if (wt->sdirty || wt->qdirty || ensure_attached(h) != SHL_OK) {
            /* An attachment error reaches every task through its retry. */
            watcher_broadcast(wt);
            continue;
        }
        _Atomic uint32_t *words[3];
        uint32_t vals[3];
        int nwords = 0, changed = 0;
        if (wt->n_state) {
            uint32_t v = arm_sleepers(h, wt->sexp, &changed);
            words[nwords] = &hd->state;
            vals[nwords++] = v;
        }
        if (!changed && wt->n_drain) {
            /* The parked attempts armed DRAINERS themselves after reading
             * qexp; whoever clears the bit bumps the counter. */
            changed = atomic_load_explicit(&hd->drain_seq, memory_order_seq_cst) != wt->qexp;
            words[nwords] = &hd->drain_seq;
            vals[nwords++] = wt->qexp;
        }
        if (changed) {
            watcher_broadcast(wt);
            continue;
        }
        wt->cover = (wt->n_state ? WATCH_STATE : 0) | (wt->n_drain ? WATCH_DRAIN : 0);
        wt->cover_s = wt->sexp;
        wt->cover_q = wt->qexp;
        words[nwords] = &wt->kick;
        vals[nwords++] = k;
        pthread_mutex_unlock(&wt->mu);
        int32_t watch[FUTEX_WAITV_MAX];
        int nwatch = collect_watch_set(h, watch, FUTEX_WAITV_MAX - nwords);
        int r = sleep_and_probe(h, words, vals, nwords, watch, nwatch, -1);
        pthread_mutex_lock(&wt->mu);
        wt->cover = 0;
        idle_since = mono_ns();
        if (atomic_load_explicit(&wt->kick, memory_order_acquire) != k || r == ETIMEDOUT) {
            /* Kicked or the safety net: wake all only if a word moved away
             * from what this generation expects (a futex wait compares the
             * same way); otherwise re-read the spec and sleep again. */
            int moved = 0;
            if (wt->n_state)
                moved |= state_differs(atomic_load_explicit(&hd->state, memory_order_seq_cst),
                                       wt->sexp);
            if (wt->n_drain)
                moved |= atomic_load_explicit(&hd->drain_seq, memory_order_seq_cst) != wt->qexp;
            if (moved)
                watcher_broadcast(wt);
            continue;
        }
        /* Woken by a word or by a death (already probed and reclaimed):
         * every parked attempt retries, as a blocked thread would. */
        watcher_broadcast(wt);
    }
    wt->running = 0;
    wt->cover = 0;
    pthread_mutex_unlock(&wt->mu);
    if (entered)
        leave(h);
    return NULL;
}

shl_watcher *shl_watcher_new(shl_lock *h)
{
    if (h == NULL)
        return NULL;
    shl_watcher *wt = calloc(1, sizeof *wt);
    if (wt == NULL)
        return NULL;
    wt->h = h;
    pthread_mutex_init(&wt->mu, NULL);
    return wt;
}

/* Start the thread if it is not running.  Caller holds mu. */
static int watcher_start(shl_watcher *wt)
{
    if (wt->running)
        return SHL_OK;
    if (wt->have_tid) {
        /* It has left its loop (running == 0 was set under mu, and it takes
         * mu no more), so this join returns at once. */
        pthread_join(wt->tid, NULL);
        wt->have_tid = 0;
    }
    pthread_attr_t attr;
    sigset_t all, old;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    /* The thread must never take a signal meant for the application. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int r = pthread_create(&wt->tid, &attr, watcher_main, wt);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (r != 0) {
        errno = r;
        return SHL_ESYS;
    }
    wt->have_tid = 1;
    wt->running = 1;
    return SHL_OK;
}

int shl_watcher_park(shl_watcher *wt, const shl_waiter *w, uint64_t *gen)
{
    if (wt == NULL || wt->h == NULL)
        return SHL_ECLOSED;
    int r = enter(wt->h);   /* the reads of the segment below are a call */
    if (r != SHL_OK)
        return r;
    struct shl_header *hd = wt->h->hdr;
    int kick = 0;
    pthread_mutex_lock(&wt->mu);
    if (wt->closing) {
        r = SHL_ECLOSED;
    } else if (w->on_drain) {
        /* seq_cst: ordered after the attempt's own arming of DRAINERS. */
        if (atomic_load_explicit(&hd->drain_seq, memory_order_seq_cst) != w->expect) {
            r = SHL_AGAIN;
        } else {
            if (wt->n_drain++ == 0)
                wt->qexp = w->expect;
            else if (wt->qexp != w->expect)
                wt->qdirty = 1;
            kick = !(wt->cover & WATCH_DRAIN) || wt->cover_q != wt->qexp || wt->qdirty;
        }
    } else {
        if (state_differs(atomic_load_explicit(&hd->state, memory_order_seq_cst), w->expect)) {
            r = SHL_AGAIN;
        } else {
            if (wt->n_state++ == 0)
                wt->sexp = w->expect;
            else if (state_differs(wt->sexp, w->expect))
                wt->sdirty = 1;
            kick = !(wt->cover & WATCH_STATE) || state_differs(wt->cover_s, wt->sexp) ||
                   wt->sdirty;
        }
    }
    if (r == SHL_OK) {
        *gen = wt->gen;
        r = watcher_start(wt);
        if (r != SHL_OK) {
            /* Undo the registration: the caller raises. */
            if (w->on_drain) wt->n_drain--; else wt->n_state--;
        }
    }
    pthread_mutex_unlock(&wt->mu);
    leave(wt->h);
    if (r == SHL_OK && kick)
        watcher_kick(wt);
    return r;
}

void shl_watcher_unpark(shl_watcher *wt, const shl_waiter *w, uint64_t gen)
{
    if (wt == NULL)
        return;
    pthread_mutex_lock(&wt->mu);
    /* A broadcast since the park already forgot this registration. */
    if (gen == wt->gen) {
        if (w->on_drain) {
            if (wt->n_drain && --wt->n_drain == 0)
                wt->qdirty = 0;     /* nobody left who expected another value */
        } else {
            if (wt->n_state && --wt->n_state == 0)
                wt->sdirty = 0;
        }
    }
    pthread_mutex_unlock(&wt->mu);
}

uint64_t shl_watcher_gen(shl_watcher *wt)
{
    if (wt == NULL)
        return 0;
    pthread_mutex_lock(&wt->mu);
    uint64_t g = wt->gen;
    pthread_mutex_unlock(&wt->mu);
    return g;
}

int shl_watcher_add_loop(shl_watcher *wt)
{
    if (wt == NULL)
        return SHL_ECLOSED;
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0)
        return SHL_ESYS;
    pthread_mutex_lock(&wt->mu);
    if (wt->nfds == wt->capfds) {
        int cap = wt->capfds ? 2 * wt->capfds : 4;
        int *p = realloc(wt->fds, (size_t)cap * sizeof *p);
        if (p == NULL) {
            pthread_mutex_unlock(&wt->mu);
            close(fd);
            errno = ENOMEM;
            return SHL_ESYS;
        }
        wt->fds = p;
        wt->capfds = cap;
    }
    wt->fds[wt->nfds++] = fd;
    pthread_mutex_unlock(&wt->mu);
    return fd;
}

void shl_watcher_drop_loop(shl_watcher *wt, int fd)
{
    if (wt == NULL)
        return;
    pthread_mutex_lock(&wt->mu);
    for (int i = 0; i < wt->nfds; i++) {
        if (wt->fds[i] == fd) {
            /* Under mu, where the thread writes: once this returns it never
             * writes to fd again, and the caller may close it. */
            wt->fds[i] = wt->fds[--wt->nfds];
            break;
        }
    }
    pthread_mutex_unlock(&wt->mu);
}

void shl_watcher_free(shl_watcher *wt)
{
    if (wt == NULL)
        return;
    pthread_mutex_lock(&wt->mu);
    wt->closing = 1;
    int join = wt->have_tid;
    pthread_mutex_unlock(&wt->mu);
    watcher_kick(wt);
    if (join)
        pthread_join(wt->tid, NULL);
    free(wt->fds);      /* the fds themselves are the caller's to close */
    pthread_mutex_destroy(&wt->mu);
    free(wt);
}
