/*
 * internal.h - what every file of the pyshmlock C core shares: the segment's
 * layout, the state word's bits, the process-private handle, small tools
 * (clocks, futexes, the in-flight bracket) and the functions one file of the
 * core calls in another.  Nothing here is part of the API (that is
 * ../shmlock.h); the cross-file functions have hidden visibility.
 *
 * The core, one concern per file (docs/DESIGN.md, "Map", says which file
 * owns which invariant):
 *
 *   protocol.c  the state word: read admission (the Dekker handshake),
 *               exclusive claims and their drain, phase fairness, releases.
 *               Its head comment is the protocol; read it first.
 *   gate.c      the pause gate: pause, resume, what pins and what refuses.
 *   session.c   update sessions (a pin owned by a token) and fences.
 *   handles.c   this process's handles: tokens, recycling, the open list.
 *   layouts.c   segments of other layout versions (upgrades).
 *   wait.c      sleeping: futexes on the state word and the drain counter,
 *               and the death watch on the processes waited for.
 *   slots.c     the per-process slots: probing a slot's owner for death,
 *               reclaiming a dead process's holds; the glibc-private mutex
 *               fields, in one place.
 *   liveness.c  whether a slot's whole process is gone (its liveness lock,
 *               /proc): the keeper's death is only the doorbell.
 *   process.c   this process's side: the keeper threads that hold its slot
 *               mutexes, its liveness locks, attaching, and fork().
 *   stale.c     resetting a pause left by processes that are all gone.
 *   segment.c   opening, validating, closing and removing a segment: the
 *               boundary where shared memory is untrusted input.
 *   validate.c  the checks of an existing segment's header and slots, for
 *               openers and observers alike.
 *   recreate.c  an unused segment re-created at the size an opener asks.
 *   lease.c     the host lease and its watchdog thread (cluster agent).
 *   info.c      introspection: snapshots of an attached lock, and
 *               observers that read copies of a segment.
 *   watcher.c   the asyncio watcher: one GIL-free thread per lock and
 *               process that wakes event loops through eventfds.
 */
#ifndef PYSHMLOCK_CORE_INTERNAL_H
#define PYSHMLOCK_CORE_INTERNAL_H

#define _GNU_SOURCE
#include "shmlock.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if !defined(__linux__)
#error "pyshmlock needs Linux futexes"
#endif

/* ================================================================ layout
 * One segment "/pyshmlock.<name>": the header, then max_processes slots.
 * Every field is shared memory, written by every attached process: treat
 * each value read from it as untrusted (bounds-check indices and counts). */

#define SHL_MAGIC   0x4C485350u          /* "PSHL" read as little-endian */
#define SHL_LAYOUT  4u                   /* 2: slot.pidns; 3: sessions, PINNED, fences;
                                            4: SUSPECT in the state word, slot.start_ticks
                                            and timens, liveness locks */
_Static_assert(SHL_LAYOUT == SHL_LAYOUT_VERSION, "shmlock.h names the layout");
#define SHL_READY   0x59444552u          /* "REDY": creator finished init */

#define ST_OWNER     0x00000FFFu
#define ST_UPDATE    0x00001000u
#define ST_GRANTED   0x00002000u
#define ST_PAUSED    0x00004000u
#define ST_SLEEPERS  0x00008000u
#define ST_DRAINERS  0x00010000u
#define ST_PINNED    0x00020000u
#define ST_SUSPECT   0x00040000u
#define ST_EPOCH_SHIFT 19
#define ST_EPOCH_ONE (1u << ST_EPOCH_SHIFT)
#define ST_EPOCH(s)  ((s) >> ST_EPOCH_SHIFT)
#define ST_CLAIM_BITS (ST_OWNER | ST_UPDATE | ST_GRANTED)
_Static_assert(SHL_STATE_OWNER_MASK == ST_OWNER && SHL_STATE_PAUSED == ST_PAUSED &&
               SHL_STATE_PINNED == ST_PINNED && SHL_STATE_SUSPECT == ST_SUSPECT,
               "shmlock.h's SHL_STATE_ bits must be the state word's ST_ bits");

/* The data-suspect mark is the state word's SUSPECT bit, so that a resume,
 * which opens the gate with a CAS from the word it decided on, can never
 * open it on a mark made after its look (the word differs).  The header's
 * `marks` counts the marks made (wrapping); what rewrote the data clears
 * the bit in the same CAS that ends it, if no mark was made since it began:
 * a completed exclusive section outside any session, if the count is the
 * one read before its claim, or a session ended normally, if the count is
 * the one at its beginning.  An update call inside a session clears
 * nothing: the session, not the call, is the unit of an update (its expiry
 * may be marked while the call runs).  A mark is two steps, the count
 * first (mark_counted), then the bit, set by the CAS that ends what was
 * lost (a reclaimed hold's claim, an expired session's pin). */
#define EXCL_IN_SESSION   0xFFFFFFFFu    /* excl_marks of a claim made under a pin */
/* The bits a CAS that ends a section sets or clears: SUSPECT if a mark was
 * made since `marks` was the count (slots.c). */
#pragma GCC visibility push(hidden)
uint32_t suspect_after(shl_lock *h, uint32_t s, uint32_t marks);
#pragma GCC visibility pop

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
    _Alignas(64) _Atomic uint32_t marks;       /* data-suspect marks made (wraps) */
    /* Who paused, when, how often; the granted exclusive holder's pid; the
     * recovery log's count.  For info(), the stale policy and the recovery
     * log: relaxed, each read after the seq_cst load of the state word
     * that the snapshot or the decision is made on (no decision of the
     * protocol depends on them alone). */
    _Atomic uint32_t paused_by_pid;
    _Atomic uint32_t pause_count;       /* relaxed: see above */
    _Atomic uint32_t exclusive_pid;     /* relaxed: see above */
    _Atomic uint64_t paused_at_ns;      /* relaxed: see above */
    _Atomic uint32_t recovery_count;    /* relaxed: see above */
    struct shl_recovery_entry recoveries[SHL_RECOVERY_LOG];
    /* Host lease (used by the cluster agent; kept at the end of the header).
     * While nonzero, a CLOCK_MONOTONIC deadline that the agent renews.  Once
     * it has passed, the lease watchdog of every attached process pauses the
     * gate (fail closed) with the existing pause step.  0: no lease. */
    _Alignas(64) _Atomic int64_t lease_deadline_ns;
    _Atomic uint32_t lease_pid;         /* who armed it (observability: relaxed) */
    _Atomic uint32_t lease_expiries;    /* pauses made because it had passed (relaxed) */
    /* Update session (layout 3; protocol.c "Update sessions").  The state
     * word's PINNED bit says whether a session exists; these say which one
     * (the token) and until when.  Written by the pinner, under its update
     * hold, before it sets PINNED. */
    _Alignas(64) _Atomic uint64_t session_token;
    /* The session's fields, written before its token (a release store) and
     * read after the token (acquire): relaxed. */
    _Atomic int64_t session_deadline_ns;   /* CLOCK_MONOTONIC; relaxed: see above */
    _Atomic uint64_t session_began_ns;     /* CLOCK_REALTIME; relaxed: see above */
    _Atomic uint32_t session_pid;          /* who began it (observability); relaxed */
    _Atomic uint32_t session_count;        /* sessions begun, part of each token; relaxed:
                                              only its uniqueness matters (an RMW) */
    _Atomic uint32_t session_expiries;     /* observability; relaxed */
    _Atomic uint32_t session_marks;        /* the mark count when it began; relaxed: see above */
    /* Fencing at the host (cluster): the highest fleet update token seen
     * (only rises) and the token of the last completed fenced update. */
    _Atomic uint64_t fence;     /* relaxed: compared by fenced updates under the update hold */
    _Atomic uint64_t applied;   /* relaxed: written under the update hold, read for display */
};

struct shl_slot {
    pthread_mutex_t owner;          /* robust + pshared, held by the owner's keeper */
    /* The owner's pid (display, and with start_ticks its /proc identity):
     * relaxed, written by the owner while its keeper holds the slot's
     * mutex, read by whoever holds it next (the mutex orders them) or for
     * display. */
    _Atomic uint32_t pid;
    _Atomic uint32_t readers;       /* read holds + transient admission attempts */
    _Atomic uint32_t rwait[2];      /* owed readers, by parity of the epoch queued behind */
    _Atomic uint32_t waiting;       /* threads asleep in shl_wait (observability: relaxed) */
    _Atomic uint64_t attached_at_ns;  /* observability: relaxed */
    /* Who the owner is, for liveness.c's /proc look (and for display): the
     * inodes of its PID and time namespaces and its start time (clock ticks
     * after boot, /proc/<pid>/stat field 22; 0 unknown).  Written by the
     * owner while it holds the slot's mutex, before anyone may probe it:
     * relaxed, like pid. */
    _Atomic uint64_t pidns;         /* relaxed: see above */
    _Atomic uint64_t timens;        /* relaxed: see above */
    _Atomic uint64_t start_ticks;   /* relaxed: see above */
} __attribute__((aligned(64)));

struct shl_lock {
    struct shl_header *hdr;
    struct shl_slot *slots;
    size_t map_size;
    uint32_t max;                   /* validated private copy of max_processes */
    /* Our slot, -1 when not attached.  Atomic because the lease watchdog
     * reads it while a re-attaching thread writes it (attached_slot); every
     * access is relaxed: a thread that uses the slot took it itself or was
     * handed the handle by the caller's own synchronisation (DESIGN.md §9,
     * "Threads of one process"). */
    _Atomic int32_t self;
    /* A descriptor of the segment, never mapped: it carries this process's
     * liveness lock on the byte of its slot (liveness.c), and asks about
     * the others'.  -1 before open. */
    int lockfd;
    /* The segment's shm_open name, to open a liveness descriptor again in a
     * forked child that could not reopen the inherited one (reattach). */
    char path[SHL_PATH_MAX];
    /* g_fork_gen when self was taken.  Stored with release after self, loaded
     * with acquire before self is read: a thread of a forked child that sees
     * the new generation also sees the slot another thread just took. */
    _Atomic uint64_t fork_gen;
    uint32_t pid;                   /* getpid() when self was taken: getpid() is a
                                       system call, too dear for every write */
    _Atomic uint32_t held_reads;    /* process-local truth about our holds ... */
    /* ... and those the fast calls granted (shl_fast_read): written only by
     * the fast calls, which their caller serialises (the binding: the GIL),
     * so a load and a store, never a read-modify-write (a locked
     * instruction, most of an uncontended pair's cycles).  A release takes
     * from this count first. */
    _Atomic uint32_t gil_reads;
    _Atomic int32_t held_excl;      /* 0, SHL_KIND_WRITE or SHL_KIND_UPDATE */
    _Atomic uint32_t excl_marks;    /* the flags word's mark count before our claim,
                                       or EXCL_IN_SESSION (claimed while PINNED) */
    int32_t no_slot;                /* SHL_OPEN_NO_SLOT: an operator's handle */
    /* An operator's handle: the liveness bytes its threads hold while they
     * end a session (liveness.c); relaxed, process-private. */
    _Atomic uint64_t op_bytes;
    _Atomic unsigned long excl_thread;  /* this_thread() of the thread that got it */
    uint64_t dev, ino;              /* the segment: with self, names our attachment */
    /* The handle's generation (high 32 bits: a token names exactly one),
     * H_CLOSED, H_CLOSING and the calls inside the core on it (low 30
     * bits).  See enter(): close() starts only by moving this word from
     * (generation, 0) to (generation, H_CLOSING).  Orders (enter()): its
     * acquire CAS and leave()'s release order every call's accesses before
     * close()'s acquire CAS; plain reads of it are relaxed (a CAS checks). */
    _Atomic uint64_t inflight;
    /* handles.c: where it sits in the table, and the open or free list it
     * is on (under g_handles_mu). */
    uint32_t index;
    struct shl_lock *prev, *next;
};

#define H_CLOSED  0x80000000u
#define H_CLOSING 0x40000000u     /* close() is deciding; callers wait it out */
#define H_COUNT   0x3FFFFFFFu
#define H_GEN(v)  ((uint32_t)((uint64_t)(v) >> 32))

/* ========================================================== small tools */

static inline int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline uint64_t real_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* a - b without overflow (the operands may come from an untrusted segment). */
static inline int64_t sat_sub(int64_t a, int64_t b)
{
    int64_t r;
    if (__builtin_sub_overflow(a, b, &r))
        return b < 0 ? INT64_MAX : INT64_MIN;
    return r;
}

static inline void ns_to_timespec(int64_t ns, struct timespec *ts)
{
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
}

static inline void futex_wake_all(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Sleep while *word == val, until the absolute CLOCK_MONOTONIC deadline.
 * Returns 0 (woken or value changed), ETIMEDOUT or EINTR. */
static inline int futex_wait_until(_Atomic uint32_t *word, uint32_t val, int64_t deadline)
{
    struct timespec ts;
    ns_to_timespec(deadline, &ts);
    long r = syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_BITSET, val, &ts,
                     NULL, FUTEX_BITSET_MATCH_ANY);
    if (r == 0) return 0;
    if (errno == ETIMEDOUT || errno == EINTR) return errno;
    return 0;   /* EAGAIN: the value changed before we slept */
}

static inline uint32_t owner_of(uint32_t s) { return s & ST_OWNER; }

/* The state word is shared memory and so untrusted: an owner index is used
 * only after this bounds check against a validated private max.  Returns
 * the slot index, -1 if none, or -2 if the word is corrupt. */
static inline int32_t owner_slot(uint32_t s, uint32_t max)
{
    uint32_t o = owner_of(s);
    if (o == 0) return (s & (ST_UPDATE | ST_GRANTED)) ? -2 : -1;
    if (o > max) return -2;
    return (int32_t)(o - 1);
}

static inline int32_t owner_index(const shl_lock *h, uint32_t s)
{
    return owner_slot(s, h->max);
}

/* ============================================================ handles */

/*
 * What a caller holds is not the handle's address but a token: the
 * handle's table index + 1 in the low 32 bits and its generation in the
 * high 32 (handles.c).  Closed handles are recycled, each time with a new
 * generation, so a call through a token of a closed handle (a thread that
 * loaded it before another thread closed the object) finds a generation
 * that is not its own and gets SHL_ECLOSED: it can never act on the lock a
 * recycled handle now serves.  The table's chunks are never freed, so
 * resolving a token is safe whatever it holds.
 */
#define HANDLE_CHUNK_SHIFT 8
#define HANDLE_CHUNK       (1u << HANDLE_CHUNK_SHIFT)
#define HANDLE_CHUNKS      4096      /* 1,048,576 handles open at once */
_Static_assert(sizeof(void *) == 8, "tokens are 64-bit: index and generation");

#pragma GCC visibility push(hidden)
extern _Atomic(shl_lock *) g_handle_chunks[HANDLE_CHUNKS];   /* release when a chunk is
                                           published, acquire in handle_of (relaxed in a forked
                                           child, which has one thread) */
#pragma GCC visibility pop

static inline uint32_t token_gen(const shl_lock *token)
{
    return (uint32_t)((uintptr_t)token >> 32);
}

/* The handle a token names (of whatever generation), or NULL. */
static inline shl_lock *handle_of(const shl_lock *token)
{
    uint32_t i = (uint32_t)(uintptr_t)token;
    if (i == 0 || ((i - 1) >> HANDLE_CHUNK_SHIFT) >= HANDLE_CHUNKS)
        return NULL;
    i -= 1;
    /* acquire: pairs with the release that published the chunk. */
    shl_lock *c = atomic_load_explicit(&g_handle_chunks[i >> HANDLE_CHUNK_SHIFT],
                                       memory_order_acquire);
    return c ? &c[i & (HANDLE_CHUNK - 1)] : NULL;
}

/* ==================================================== in-flight bracket */

/*
 * Every public entry point that reads the handle's mapping brackets its work
 * with enter()/leave(), and close() starts only by moving h->inflight from
 * (generation, 0) to (generation, H_CLOSING).  enter() resolves the
 * caller's token and counts the call by a CAS that compares the whole word,
 * the generation included, so in the word's modification order each
 * enter() either comes first (close() sees a count and refuses with
 * SHL_EINFLIGHT) or later: it finds H_CLOSED or another generation and
 * returns SHL_ECLOSED without touching the segment, or it waits the few
 * loads that close() needs to decide (H_CLOSING) and tries again.  A call
 * that fails never changes the word.
 *
 * Orders: enter()'s CAS is acquire, so nothing the call does to the mapping
 * is performed before its increment; leave() is release, and close()'s CAS
 * is acquire and reads the value the last leave() wrote (every RMW on the
 * word continues the release sequence), so every access of a finished call
 * happens before the munmap.  The word is process-private: the cost is one
 * uncontended RMW pair per call (the fast read path already does a seq_cst
 * RMW on the shared slot).
 *
 * enter(&h) replaces the token in h by the handle it names.
 */
static inline int enter(shl_lock **hp)
{
    uint32_t gen = token_gen(*hp);
    shl_lock *h = handle_of(*hp);
    if (h == NULL)
        return SHL_ECLOSED;   /* Python passes NULL once the object is closed */
    uint64_t v = atomic_load_explicit(&h->inflight, memory_order_relaxed);
    for (;;) {
        if (__builtin_expect(H_GEN(v) != gen || (v & H_CLOSED), 0))
            return SHL_ECLOSED;
        if (__builtin_expect(v & H_CLOSING, 0)) {
            /* close() is deciding: a handful of loads, never a wait. */
            sched_yield();
            v = atomic_load_explicit(&h->inflight, memory_order_relaxed);
            continue;
        }
        if (__builtin_expect(atomic_compare_exchange_weak_explicit(
                &h->inflight, &v, v + 1, memory_order_acquire, memory_order_relaxed), 1)) {
            *hp = h;
            return SHL_OK;
        }
    }
}

static inline void leave(shl_lock *h)
{
    atomic_fetch_sub_explicit(&h->inflight, 1, memory_order_release);
}

/* The body of a public entry point whose handle parameter is h: `call`
 * runs as one call in flight, with h the handle the caller's token names
 * (enter/leave above), and its result is returned; a closed handle returns
 * SHL_ECLOSED without running it. */
#define RUN_IN_FLIGHT(h, call)               \
    do {                                     \
        int in_flight_r_ = enter(&(h));      \
        if (in_flight_r_ == SHL_OK) {        \
            in_flight_r_ = (call);           \
            leave(h);                        \
        }                                    \
        return in_flight_r_;                 \
    } while (0)

/* ============================================ calls between core files */

#pragma GCC visibility push(hidden)

/* handles.c: the table of this process's handles, the open list. */
shl_lock *handle_new(void);              /* a zeroed handle, not yet open (or NULL) */
shl_lock *handle_publish(shl_lock *h);   /* open it: on the open list; its token */
void handle_unlist(shl_lock *h);         /* closed: off the open list (after any sweep) */
void handle_recycle(shl_lock *h);        /* unlisted: unmapped, reusable */
void handle_discard(shl_lock *h);        /* never published: recycled */
typedef int (*handle_visit)(shl_lock *h, void *arg);
int handles_sweep(handle_visit fn, void *arg, int *open);   /* open handles, under the lock */
void handles_after_fork(void);
void lfd_lock(void);                     /* the liveness descriptors' mutex (handles.c) */
void lfd_unlock(void);
int liveness_reopen(shl_lock *h);        /* a liveness descriptor by name (a forked child) */

/* process.c: this process's attachments and fork generation. */
extern _Atomic uint64_t g_fork_gen;      /* bumped in a forked child; relaxed: compared
                                            with a handle's fork_gen, which carries the
                                            order (release after self, acquire before) */
void core_init(void);                    /* once per process: the fork handler, the platform */
uint32_t core_platform(void);            /* SHL_PLATFORM_* (after core_init) */
int reattach(shl_lock *h);               /* ensure_attached's slow path */
enum { KEEP_TRYLOCK = 1, KEEP_UNLOCK = 2 };
int keeper_call(int op, pthread_mutex_t *m);
int own_attachment(uint64_t dev, uint64_t ino, uint32_t slot);

/* slots.c: liveness and recovery; the data-suspect mark. */
void mark_counted(shl_lock *h);
void record_recovery(shl_lock *h, uint32_t pid, uint32_t what, uint32_t reads, uint32_t owed);
int slot_is_clean(const struct shl_slot *sl);
void init_slot_mutex(pthread_mutex_t *m);
int slot_mutex_sane(const pthread_mutex_t *m);
int slot_mutex_kind(const pthread_mutex_t *m);   /* glibc's kind field (0 elsewhere) */
enum { PROBE_DEAD = 0, PROBE_ALIVE = 1, PROBE_EXITING = 2 };
int probe_slot(shl_lock *h, uint32_t i);  /* PROBE_*: nonzero counts as alive */
void recover_slot(shl_lock *h, uint32_t i);

/* liveness.c: is a slot's whole process gone; this process's liveness lock. */
int liveness_gone(int fd, const struct shl_slot *sl, uint32_t i);
int liveness_take(int fd, uint32_t slot);
void liveness_drop(int fd, uint32_t slot);
int liveness_take_operator(shl_lock *h);
void liveness_drop_operator(shl_lock *h, int k);
int liveness_operator_held(int fd, uint32_t k);
int liveness_share(int fd);          /* the handles' byte: segment.c, re-creating */
int liveness_share_now(int fd);
int liveness_share_alone(int fd);
void liveness_share_again(int fd);
uint64_t liveness_pidns(void);
uint64_t liveness_timens(void);
uint64_t liveness_start_ticks(void);
#ifdef __GLIBC__
/* The robust-futex word of a slot mutex (a glibc-private field; slots.c). */
uint32_t *mutex_word(pthread_mutex_t *m);
#endif

/* protocol.c: the steps of an attempt, for shl_try/shl_cancel and the watcher. */
uint32_t scan_limit(shl_lock *h);
/* session.c: expiry and the recovery of a dead process's unfinished end. */
int session_expire(shl_lock *h);         /* 1 if it ended an expired session */
void session_recover(shl_lock *h, uint32_t i);
int do_try(shl_lock *h, shl_waiter *w);
void do_cancel(shl_lock *h, shl_waiter *w);
void wake_drainers(shl_lock *h);
int excl_is_this_thread(shl_lock *h, const shl_waiter *w);
void wait_on_state(shl_waiter *w, uint32_t s);

/* gate.c: the pause gate. */
int do_pause(shl_lock *h);
int try_resume(shl_lock *h, shl_waiter *w);
int try_wait_unpinned(shl_lock *h, shl_waiter *w);
int try_wait_resumed(shl_lock *h, shl_waiter *w);

/* wait.c: sleeping with a death watch. */
int collect_watch_set(shl_lock *h, int32_t *watch, int cap);
int sleep_and_probe(shl_lock *h, _Atomic uint32_t *const *words, const uint32_t *vals,
                    int nwords, const int32_t *watch, int nwatch, int64_t deadline_ns);
uint32_t arm_sleepers(shl_lock *h, uint32_t val, int *changed);

/* layouts.c: segments of other layout versions. */
int other_layout_users(int fd, size_t size, uint32_t *layout, uint32_t *pid);

/* segment.c: the layout's size and the name rule; validate.c: the checks of
 * a segment, shared with the observers (info.c), which validate pread()
 * copies: they never map the segment. */
size_t layout_size(uint32_t max);
int valid_name(const char *name);
int validate_header(const struct shl_header *hd, size_t st_size, uint32_t *max,
                    shl_corruption *why);
int validate_slots(const struct shl_slot *slots, uint32_t first, uint32_t n,
                   shl_corruption *why);

/* recreate.c: an unused segment re-created at the size asked for; what of
 * segment.c it uses.  OPEN_AGAIN: the name names another segment now, open
 * again (never returned by shl_open). */
enum { OPEN_AGAIN = 1 };
struct stat;
int names_segment(const char *name, const struct stat *st);
int recreate_unused(struct shl_header *hd, uint32_t max, int lfd, const struct stat *st,
                    const char *name);
uint32_t count_others(struct shl_header *hd, uint32_t max, int fd, uint64_t dev, uint64_t ino);
int unlink_exactly(const char *name, const struct stat *probed);

/* lease.c: the lease watchdog thread. */
int lease_check(shl_lock *h);
int wd_start(void);
void wd_kick(void);
void wd_after_fork(void);

#pragma GCC visibility pop

/* h->self, relaxed (see its declaration). */
/* This thread's identity for excl_thread: unique among the live threads
 * of the process, as pthread_self() is.  On x86-64 and aarch64 the thread
 * pointer (one register read, no call: the exclusive fast path has no call
 * left in it); elsewhere pthread_self(). */
static inline unsigned long this_thread(void)
{
#if defined(__x86_64__) || defined(__aarch64__)
    return (unsigned long)__builtin_thread_pointer();
#else
    return (unsigned long)pthread_self();
#endif
}

static inline int32_t self_slot(const shl_lock *h)
{
    return atomic_load_explicit(&h->self, memory_order_relaxed);
}

/* This process's current slot in h, or -1 (not attached, or the parent's
 * slot in a forked child that has not re-attached yet).  For code that
 * does not attach (the lease watchdog): fork generation first, then the
 * slot, as ensure_attached reads them. */
static inline int32_t attached_slot(shl_lock *h)
{
    if (atomic_load_explicit(&h->fork_gen, memory_order_acquire) !=
        atomic_load_explicit(&g_fork_gen, memory_order_relaxed))
        return -1;
    return self_slot(h);
}

/* Every entry point starts here.  After fork() the child holds nothing and
 * owns no slot; it takes one of its own on first use (reattach).  Inline:
 * the read fast path passes through it on every call. */
/* The slot check of ensure_attached, for a handle that takes slots: this
 * process (not a forked parent) holds a slot in h. */
static inline int attached_here(shl_lock *h)
{
    return __builtin_expect(atomic_load_explicit(&h->fork_gen, memory_order_acquire) ==
                                atomic_load_explicit(&g_fork_gen, memory_order_relaxed)
                            && self_slot(h) >= 0, 1);
}

static inline int ensure_attached(shl_lock *h)
{
    if (h->no_slot)
        return SHL_OK;          /* an operator's handle never takes a slot */
    if (h != NULL && attached_here(h))
        return SHL_OK;
    return reattach(h);
}

#endif /* PYSHMLOCK_CORE_INTERNAL_H */
