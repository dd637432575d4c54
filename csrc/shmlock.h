/*
 * shmlock.h - public interface of the pyshmlock C core.
 *
 * A cross-process reader/writer lock with a pause gate, kept in one POSIX
 * shared-memory segment.  The protocol is described in docs/DESIGN.md and in
 * the long comment at the top of core/protocol.c; read that first.
 *
 * Everything here is plain C with fixed-width integers so that the cffi build
 * script (csrc/build_extensions.py) can declare the same functions verbatim.
 */
#ifndef PYSHMLOCK_SHMLOCK_H
#define PYSHMLOCK_SHMLOCK_H

#include <stdint.h>

/* Return codes.  Non-negative: outcome of a wait.  Negative: an error. */
#define SHL_OK          0
#define SHL_TIMEDOUT    1   /* deadline passed; nothing is held, nothing left behind */
#define SHL_AGAIN       2   /* try_* only: not granted yet, call shl_wait then retry */
#define SHL_EINTR       3   /* a signal arrived; nothing left behind, caller retries */
#define SHL_ENOHOLD    -1   /* release without a matching hold in this process */
#define SHL_ECORRUPT   -2   /* the segment holds values no pyshmlock process writes */
#define SHL_EFULL      -3   /* every process slot is owned by a live process */
#define SHL_EFOREIGN   -4   /* the segment under our name is not a pyshmlock lock */
#define SHL_EVERSION   -5   /* a pyshmlock lock of another layout version */
#define SHL_EINIT      -6   /* the creator never finished initialising the segment */
#define SHL_EBUSY      -7   /* close with holds / unlink while others are attached */
#define SHL_EDEADLK    -8   /* this thread would wait for a hold it owns itself */
#define SHL_ESYS       -9   /* a system call failed; errno says which way */
#define SHL_EINVAL    -10   /* bad argument (name, max_processes) */
#define SHL_ECLOSED   -11   /* the handle is NULL or closed */
#define SHL_EOVERFLOW -12   /* this process already has SHL_READ_HOLDS_MAX read holds */
#define SHL_EINFLIGHT -13   /* close while another thread of this process is inside a
                               call on this handle, or an attempt of it still waits
                               (asyncio) with a registration or claim in the segment */
#define SHL_ESUSPECT  -14   /* resume of a paused lock whose data is suspect (an
                               exclusive holder died, or an update session expired) */
#define SHL_EMANAGED  -15   /* resume of a lock whose host lease is armed: its cluster
                               agent decides when it opens */
#define SHL_ENOSESSION -16  /* end of an update session that is not the current one */
#define SHL_ENOROBUST -17   /* this platform has no robust futexes (set_robust_list
                               fails, as under qemu-user): a process that died holding
                               the lock would never be reclaimed.  Open with
                               SHL_OPEN_NO_ROBUST to run without crash recovery. */

#define SHL_EPERM     -20   /* the existing segment is not trusted: owned by another
                               user, or it grants group/other write beyond `mode`
                               (docs/DESIGN.md, "Trust model") */
#define SHL_ESIZE     -21   /* the existing segment's size is not its layout's size */

/* Read holds one process may have on one lock at a time (slot.readers is a
 * 32-bit count that also holds attempts in flight: this cap keeps it from
 * ever wrapping). */
#define SHL_READ_HOLDS_MAX 0x7FFFFFFF

/* What a waiter waits for (shl_waiter.kind). */
#define SHL_KIND_READ     1
#define SHL_KIND_WRITE    2
#define SHL_KIND_UPDATE   3
#define SHL_KIND_RESUME   4   /* resume(): clear the pause once no update holds it */
#define SHL_KIND_RESUMED  5   /* wait_resumed(): wait until not paused */
#define SHL_KIND_DRAINED  6   /* wait_drained(): wait until no read hold exists */
#define SHL_KIND_UNPINNED 7   /* wait until no update session pins the pause */

/* shl_waiter.flags of a SHL_KIND_RESUME attempt. */
#define SHL_RESUME_FORCE   1u /* resume although the data is suspect (clears the mark)
                                 or a host lease is armed */
#define SHL_RESUME_MANAGER 2u /* the caller is the host's cluster agent (the lease's
                                 holder): an armed lease does not refuse it */

/* Bits of the shared state word (shl_load_state) that the binding reads to
 * tell whether a new hold would wait (a hold's locked()); core/internal.h's ST_
 * bits are asserted equal, so Python never copies them by hand. */
#define SHL_STATE_OWNER_MASK 0x00000FFFu   /* exclusive claim: owner slot + 1 */
#define SHL_STATE_PAUSED     0x00004000u   /* the pause gate is closed */
#define SHL_STATE_PINNED     0x00020000u   /* an update session pins the pause */
#define SHL_STATE_SUSPECT    0x00040000u   /* the protected data is suspect */

#define SHL_MAX_PROCESSES_LIMIT 4095
#define SHL_LAYOUT_VERSION 4       /* the segment layout this core makes (CHANGELOG.md) */
#define SHL_NAME_MAX 200
#define SHL_PATH_MAX 256           /* room for shl_segment_path's longest answer */

/* One process's attachment.  A shl_lock * is a token, never dereferenced:
 * it names one generation of one handle of this process; once closed,
 * calls through it return SHL_ECLOSED while the handle is reused (see
 * shl_close). */
typedef struct shl_lock shl_lock;

/*
 * Per-attempt bookkeeping for one thread or task that waits.  The caller owns
 * the memory (stack, or ffi.new for asyncio tasks), zeroes it and sets kind.
 * Between try_* returning SHL_AGAIN and the attempt ending, the waiter may
 * carry shared registrations (an owed-reader count, an exclusive claim);
 * shl_cancel removes them.  Fields are the core's business.
 */
typedef struct shl_waiter {
    int32_t kind;
    int32_t registered;    /* READ: bit p set = counted in slot->rwait[p] */
    int32_t claimed;       /* WRITE/UPDATE: our slot is the exclusive owner in the state word */
    int32_t on_drain;      /* what shl_wait sleeps on: 0 state word, 1 drain_seq */
    uint32_t my_epoch;     /* READ: epoch of the latest exclusive phase we queued behind */
    uint32_t claim_epoch;  /* WRITE/UPDATE: epoch our claim created */
    uint32_t expect;       /* futex value shl_wait compares against */
    int32_t shared_thread; /* set by the caller for asyncio: other tasks of this
                              thread may release, so waiting on our own
                              exclusive hold is not a self-deadlock */
    uint32_t flags;        /* set by the caller: SHL_RESUME_* for a resume */
} shl_waiter;

/* A snapshot of one process slot (shl_slot_info). */
typedef struct shl_slot_snapshot {
    uint32_t pid;
    uint32_t readers;      /* read holds (plus transient admission attempts) */
    uint32_t owed;         /* readers of this process queued behind an exclusive phase */
    uint32_t waiting;      /* threads of this process blocked in a wait */
    int32_t alive;         /* 1 owned by a process that can still run (exiting ones
                              too), 0 free (or just recovered) */
    int32_t exiting;       /* 1 its keeper thread is gone but the process still
                              runs: its holds stay until the process is gone */
    int32_t is_self;       /* the slot of this attachment (not: the same pid) */
    uint64_t pidns;        /* inode of the owner's PID namespace (0 unknown); the pid
                              is only meaningful inside that namespace */
} shl_slot_snapshot;

/* A snapshot of the shared header (shl_info). */
typedef struct shl_snapshot {
    uint32_t state;
    int32_t paused;
    int32_t exclusive_slot;      /* -1 none */
    int32_t exclusive_kind;      /* SHL_KIND_WRITE / SHL_KIND_UPDATE / 0 */
    int32_t exclusive_granted;   /* 1: held; 0: claimed, still waiting for readers */
    uint32_t exclusive_pid;
    uint32_t epoch;
    uint32_t pause_count;
    uint32_t paused_by_pid;
    uint64_t paused_at_ns;       /* CLOCK_REALTIME */
    int32_t data_suspect;
    uint32_t max_processes;
    uint32_t recovery_count;
    uint32_t creator_pid;
    int32_t self_slot;
    uint64_t session_token;      /* 0: no update session (PINNED clear) */
    uint32_t session_pid;        /* who began it (it may have exited since) */
    uint64_t session_began_ns;   /* CLOCK_REALTIME */
    int64_t session_remaining_ns; /* until it expires (<= 0: due) */
    uint32_t session_expiries;   /* sessions that expired */
    uint64_t fence;              /* highest fleet update token seen (cluster) */
    uint64_t applied;            /* token of the last completed fenced update */
    int64_t lease_remaining_ns;  /* host lease: until it passes; 0 with no lease */
    int32_t lease_armed;
    uint32_t lease_pid;
    int32_t crash_recovery;      /* 0: this process runs without robust futexes
                                    (SHL_OPEN_NO_ROBUST): its death is never noticed */
} shl_snapshot;

typedef struct shl_recovery_record {
    uint32_t pid;
    uint32_t what;               /* SHL_LOST_* bits */
    uint32_t reads;
    uint32_t owed;
    uint64_t when_ns;            /* CLOCK_REALTIME */
} shl_recovery_record;

#define SHL_LOST_WRITE    1u     /* a granted write hold */
#define SHL_LOST_UPDATE   2u     /* a granted update hold */
#define SHL_LOST_CLAIM    4u     /* an exclusive claim still waiting for readers */
#define SHL_LOST_READS    8u
#define SHL_LOST_WAITERS 16u     /* owed-reader registrations */
#define SHL_LOST_PAUSE   32u     /* a stale pause, cleared by an opener (stale policy "reset") */
#define SHL_LOST_SESSION 64u     /* an update session that expired before its end */
#define SHL_RECOVERY_LOG 16

/* What a validation of a segment found wrong, with SHL_ECORRUPT (opening
 * and observing run the same validation: core/segment.c): which check,
 * where, and the value found. */
typedef struct shl_corruption {
    uint32_t what;               /* SHL_CORRUPT_* */
    int32_t slot;                /* the slot it is in; -1: the header */
    uint64_t value;              /* the value found */
} shl_corruption;

#define SHL_CORRUPT_SIZES    1   /* header_size/slot_size are not this layout's (value: both) */
#define SHL_CORRUPT_MAX      2   /* max_processes is not 1..SHL_MAX_PROCESSES_LIMIT */
#define SHL_CORRUPT_TOTAL    3   /* total_size is not the layout's size */
#define SHL_CORRUPT_OWNER    4   /* the state word names no slot of the segment (value: 1 + slot) */
#define SHL_CORRUPT_MUTEX    5   /* a slot's mutex is not a pyshmlock mutex (value: its kind) */
#define SHL_CORRUPT_PID      6   /* a slot's pid is above the kernel's limit */
#define SHL_CORRUPT_READERS  7   /* a slot counts more read holds than a process can have */
#define SHL_CORRUPT_WAITING  8   /* a slot counts more sleeping threads than a process can have */
#define SHL_CORRUPT_OWED     9   /* a slot counts more owed readers than any process makes */
#define SHL_PID_LIMIT        4194304   /* the kernel's PID_MAX_LIMIT on 64-bit */

/* What shl_open found: filled on success, and on SHL_EPERM / SHL_ESIZE /
 * SHL_EVERSION / SHL_EFULL / SHL_ECORRUPT so that the caller can say why the
 * segment was refused. */
typedef struct shl_open_info {
    int32_t created;             /* 1 this call created the segment */
    uint32_t uid, gid, mode;     /* the segment's owner, group, permission bits */
    uint64_t dev, ino;           /* identify the segment */
    uint64_t size;               /* its size in bytes */
    uint64_t expected_size;      /* SHL_ESIZE: the size its header describes */
    uint32_t max_processes;      /* the segment's (fixed by its creator) */
    uint32_t layout;             /* SHL_EVERSION: the segment's layout version */
    uint32_t live;               /* SHL_EVERSION: processes attached to it */
    uint32_t live_pid;           /* ... and one of them */
    int32_t replaced;            /* 1: an unused segment of another layout was
                                    replaced by this open (an upgrade) */
    shl_corruption corrupt;      /* SHL_ECORRUPT: what the validation found */
} shl_open_info;

/* shl_open's flags. */
#define SHL_OPEN_CREATE      1u  /* create the segment if nobody has */
#define SHL_OPEN_FAIL_CLOSED 2u  /* a segment this call creates starts paused with its
                                    host lease already passed (a cluster host: nothing
                                    is admitted before its agent mirrors the cluster) */
#define SHL_OPEN_NO_SLOT     4u  /* an operator's handle: takes no process slot, so
                                    it opens a lock whose slots are all taken; it
                                    may pause, resume (and wait), look, never hold
                                    (SHL_EINVAL) */
#define SHL_OPEN_NO_ROBUST   8u  /* run even where robust futexes are missing
                                    (SHL_ENOROBUST otherwise): without crash
                                    recovery, a process that dies holding the lock
                                    leaves it held for ever */
#define SHL_OPEN_SIZED      16u  /* max_processes is asked for, not a default: an
                                    existing segment of another size that no
                                    handle has open and nothing marks (no pause,
                                    claim, session, suspect mark, lease, fence) is
                                    re-created at it; one that stays and has fewer
                                    slots is SHL_EFULL (info->max_processes) */

/* What this platform offers the core (shl_platform): robust futexes
 * (set_robust_list: crash recovery) and futex_waitv (Linux 5.16+: a waiter
 * also sleeps on the watched processes' mutex words, so a death wakes it at
 * once; without it a waiter re-probes every 5 ms).  PYSHMLOCK_NO_FUTEX_WAITV=1
 * in the environment, read once at start, turns futex_waitv off (the path of
 * kernels before 5.16, for tests and comparisons). */
#define SHL_PLATFORM_ROBUST 1u
#define SHL_PLATFORM_WAITV  2u
uint32_t shl_platform(void);

/* Open (and with SHL_OPEN_CREATE create) the lock "/pyshmlock.<name>".
 * A segment of another layout version that no live process uses (every
 * process of an older release stopped: an upgrade) is removed and created
 * anew when SHL_OPEN_CREATE is given (info->replaced); while a process uses
 * it, SHL_EVERSION names one of them (info->live_pid).
 * A new segment gets permission bits `mode` (exactly; umask does not apply;
 * a mode without owner read and write, 0600, is SHL_EINVAL: the creator
 * could not open it again) and, if group >= 0, that group; its space is reserved before it is
 * written (a full /dev/shm is SHL_ESYS with ENOSPC, and the name is gone
 * again).  An existing one is refused (SHL_EPERM) unless it is owned by
 * this effective uid, or group >= 0 and its group is `group`; and unless
 * it grants no other write bit beyond `mode`, and no group write bit beyond
 * `mode` either, except to its own group on a segment this uid owns and
 * opens without group (the owner's own grant: a lock made with a group). */
int shl_open(const char *name, uint32_t flags, uint32_t mode, int64_t group,
             uint32_t max_processes, shl_lock **out, shl_open_info *info);
/* Where the lock `name` lives (the one name-to-path rule): the POSIX
 * shared-memory object "/pyshmlock.<name>", the file
 * "/dev/shm/pyshmlock.<name>" on Linux.  Writes the file's path (file != 0)
 * or the object's name (file == 0) into buf; returns its length, or
 * SHL_EINVAL for an invalid name or a buffer smaller than SHL_PATH_MAX. */
int shl_segment_path(const char *name, int file, char *buf, uint32_t size);
/* Bytes of a segment with room for max_processes processes (0 if out of
 * range): what a lock costs in /dev/shm. */
uint64_t shl_segment_size(uint32_t max_processes);
/* Make sure this process owns a slot (a forked child takes its own). */
int shl_attach(shl_lock *h);
/* Detach.  Refuses with SHL_EBUSY while this process holds anything, and
 * with SHL_EINFLIGHT while another thread is inside a call on h or an
 * attempt (asyncio) still has a registration or claim.  After SHL_OK a call
 * through h returns SHL_ECLOSED (or an argument error checked first, or 0
 * from the calls that return a value): h names a closed generation of its
 * handle, which is reused under a new one (an old token would meet its own
 * generation again only after 2^32 reuses of that handle). */
int shl_close(shl_lock *h);
/* shl_close in two steps: begin decides (the refusals above; SHL_OK: h is
 * closed, no call can enter it, and the caller must finish), never blocks;
 * finish gives the slot back and unmaps, and may wait a moment for the
 * lease watchdog or the keeper thread.  (The binding begins with the GIL
 * held, which its fast calls hold throughout, and finishes without it.) */
int shl_close_begin(shl_lock *h);
void shl_close_finish(shl_lock *h);
/* Remove the name.  SHL_EBUSY (and *attached set) if other live processes
 * are attached and force == 0.  Without force it looks inside the segment
 * only if this effective uid owns it (SHL_EPERM otherwise), and it removes
 * exactly the segment it looked at (see shl_unlink in core/segment.c).  A
 * segment of another layout version is judged by the prefix every layout
 * shares (core/layouts.c); UINT32_MAX attached: it cannot be read. */
int shl_unlink(const char *name, int force, uint32_t *attached);

int shl_release_read(shl_lock *h);
int shl_release_write(shl_lock *h);
int shl_release_update(shl_lock *h);
/* Never blocks.  Returns 1 if this call paused the lock, 0 if already paused. */
int shl_pause(shl_lock *h);
int shl_is_paused(shl_lock *h);
/* 1 if a granted exclusive hold or any read hold exists, 0 if not, <0 error. */
int shl_is_locked(shl_lock *h);

/* Update sessions: an update pin owned by a token, not by a process.
 * Beginning one is: wait until no session pins the pause (SHL_KIND_UNPINNED),
 * take an update hold (drains readers unless paused), then
 *   shl_session_pin    pause, pin the pause for ttl_ns and return the
 *                      session's token (never 0) in *token, for a caller
 *                      that holds the update hold (it releases it after):
 *                      SHL_OK, SHL_AGAIN (another session pins it: wait
 *                      unpinned, retry; csrc/fastpath/ does), SHL_ENOHOLD.
 *   shl_session_end    end the session `token` from any process; the gate
 *                      stays paused (resume opens it).  SHL_ENOSESSION if
 *                      it is not the current session (ended, expired).
 * A session not ended within ttl_ns expires: the pause stays, the data is
 * marked suspect (resume refuses with SHL_ESUSPECT until a completed update
 * or a forced resume), and the recovery log records SHL_LOST_SESSION. */
int shl_session_pin(shl_lock *h, int64_t ttl_ns, uint64_t *token);
int shl_session_end(shl_lock *h, uint64_t token);
/* shl_session_abort    end the session `token` now as lost, whoever began
 *                      it (an operator ending the session of a process that
 *                      died): the pause stays, the data is marked suspect,
 *                      as at an expiry.  SHL_ENOSESSION if it is not the
 *                      current session.
 * Any handle may end a session, an operator's (SHL_OPEN_NO_SLOT) too: it
 * holds a liveness byte of its own while it does (SHL_EBUSY if none is
 * free).  A ttl_ns of more than SHL_SESSION_TTL_MAX_S seconds (400 days) is
 * SHL_EINVAL: a session is a bounded pin, never a pause for ever. */
int shl_session_abort(shl_lock *h, uint64_t token);
#define SHL_SESSION_TTL_MAX_S 34560000   /* 400 days */

/* Fencing at the host (cluster): the highest fleet update token this lock
 * has seen, which only rises, and the token of the last update applied
 * through a fenced update.  shl_fence_raise sets fence = max(fence, token)
 * and stores the result in *now; shl_fence_applied records an applied
 * update (the caller holds the update hold); shl_fence_get reads both. */
int shl_fence_raise(shl_lock *h, uint64_t token, uint64_t *now);
int shl_fence_applied(shl_lock *h, uint64_t token);
int shl_fence_get(shl_lock *h, uint64_t *fence, uint64_t *applied);

/* An attempt, step by step (the binding's loop, csrc/fastpath/attempt.c,
 * is the only one): shl_try, and on SHL_AGAIN shl_wait (deadline_ns is
 * CLOCK_MONOTONIC, -1 forever; SHL_OK: try again, SHL_TIMEDOUT, SHL_EINTR) or
 * park with the watcher, then shl_try again; shl_cancel undoes an attempt
 * that is given up.  A waiter with kind SHL_KIND_* waits for a hold or for
 * the gate (resume, resumed, drained, unpinned). */
int shl_try(shl_lock *h, shl_waiter *w);
int shl_wait(shl_lock *h, shl_waiter *w, int64_t deadline_ns);
void shl_cancel(shl_lock *h, shl_waiter *w);
/*
 * The binding's fast calls: shl_try, an uncontended read, and the releases
 * (kind SHL_KIND_READ/WRITE/UPDATE), on a handle rather than a token and
 * without the in-flight count every other entry point keeps (two atomic
 * read-modify-writes and the token's resolution).  shl_fast_handle(token)
 * gives the handle of an open token (NULL: closed).  The caller keeps it
 * only while the token is open, and serialises these calls with one
 * another, with every shl_close_begin of the token and with every release
 * of a hold on it: the binding (csrc/fastpath) makes them all with the GIL
 * held, and these never release it; it forgets the handle as the close of
 * the token is decided.  (So the fast calls count their read holds, and
 * release an exclusive hold, with loads and stores, not locked
 * instructions.)
 *   shl_fast_read       SHL_OK: a read hold, as shl_try gives it; SHL_AGAIN:
 *                       not granted at once, nothing left behind (make an
 *                       attempt).
 *   shl_fast_exclusive  the first shl_try of a fresh waiter of `kind`
 *                       (SHL_KIND_WRITE or SHL_KIND_UPDATE, flags 0), made
 *                       in w only if needed: after SHL_AGAIN, w is the
 *                       attempt's waiter (to wait on or cancel); after an
 *                       error nothing is left behind.
 */
shl_lock *shl_fast_handle(shl_lock *token);
int shl_fast_try(shl_lock *h, shl_waiter *w);
int shl_fast_read(shl_lock *h);
int shl_fast_exclusive(shl_lock *h, int kind, shl_waiter *w);
int shl_fast_release_read(shl_lock *h);
int shl_fast_release_exclusive(shl_lock *h, int kind);


/* The asyncio watcher: one C thread per (process, lock), started on the
 * first park, that sleeps for every parked attempt of the process and wakes
 * the event loops through one eventfd each (see core/watcher.c).  No Python and
 * no GIL on the wake path.
 *   shl_watcher_new      NULL if h is NULL or out of memory.
 *   shl_watcher_park     register a parked attempt (after shl_try gave
 *                        SHL_AGAIN): SHL_OK and *gen set, SHL_AGAIN if its
 *                        word already changed (retry now), SHL_ECLOSED,
 *                        SHL_ESYS (no thread).
 *   shl_watcher_unpark   forget it (cancelled, timed out, or retried).
 *   shl_watcher_gen      the current generation: registrations made in an
 *                        older one were forgotten when the thread woke
 *                        everybody, and need no unpark.
 *   shl_watcher_add_loop a new eventfd (or <0) that the thread writes to
 *                        when the parked attempts should retry; the caller
 *                        owns it and closes it after dropping it.
 *   shl_watcher_drop_loop the thread writes to fd no more once it returns.
 *   shl_watcher_free     stop and join the thread, free (the thread writes
 *                        to no fd any more).  Call it before the lock's
 *                        handle is closed. */
typedef struct shl_watcher shl_watcher;
shl_watcher *shl_watcher_new(shl_lock *h);
int shl_watcher_park(shl_watcher *wt, const shl_waiter *w, uint64_t *gen);
void shl_watcher_unpark(shl_watcher *wt, const shl_waiter *w, uint64_t gen);
uint64_t shl_watcher_gen(shl_watcher *wt);
int shl_watcher_add_loop(shl_watcher *wt);
void shl_watcher_drop_loop(shl_watcher *wt, int fd);
void shl_watcher_free(shl_watcher *wt);

/* This process's handles: open now, and allocated (open + reusable). */
void shl_handle_stats(uint32_t *open, uint32_t *allocated);

/* Observability. */
int shl_info(shl_lock *h, shl_snapshot *out);
int shl_slot_info(shl_lock *h, uint32_t index, shl_slot_snapshot *out);
int shl_recovery_info(shl_lock *h, uint32_t index, shl_recovery_record *out);
uint32_t shl_load_state(shl_lock *h);

/* Stale segment.  A segment is stale when it is paused, no process other
 * than the caller is attached (dead slots are reclaimed on the way), and the
 * process that paused it is gone.  The caller (who has just opened h) says
 * which pid paused it and that this pid no longer runs (Python checks that
 * through /proc); the pause is then cleared with one CAS from the exact state
 * word observed before the scan, so any change meanwhile (a claim, a sleeper,
 * a resume) cancels the reset.  Returns 1 reset (recorded in the recovery
 * log as SHL_LOST_PAUSE), 0 not stale (or not paused by dead_pauser), <0.
 * docs/DESIGN.md, "Stale segments", argues the race with other openers. */
int shl_reset_stale(shl_lock *h, uint32_t dead_pauser);

/* Observation without attaching: copies read with pread (O_RDONLY, never mapped)
 * that needs only read permission, takes no slot, and never writes.  Slot
 * liveness is read from the robust mutex's futex word (owner TID, and the
 * kernel's FUTEX_OWNER_DIED bit) and, where the keeper is gone, from the
 * process's liveness lock and /proc (core/liveness.c); dead processes are
 * reported, never reclaimed.  An empty (not yet initialised) segment is
 * SHL_EINIT at once. */
typedef struct shl_observer shl_observer;
/* Validates the segment as an opener does, slots included (SHL_ECORRUPT,
 * with what it found in *why if why is not NULL). */
int shl_observe_open(const char *name, shl_observer **out, shl_corruption *why);
void shl_observe_close(shl_observer *o);
int shl_observe_info(shl_observer *o, shl_snapshot *out);
/* out->alive: 1 live or exiting (or a mutex we cannot read: never called
 * dead), 0 free or dead; a dead slot keeps its pid and counts until
 * reclaimed. */
int shl_observe_slot(shl_observer *o, uint32_t index, shl_slot_snapshot *out);
int shl_observe_recovery(shl_observer *o, uint32_t index, shl_recovery_record *out);

/* Host lease (cluster agent).  shl_lease_set arms (a CLOCK_MONOTONIC
 * deadline in ns) or disarms (0) the segment's lease.  Once the deadline has
 * passed, the lease watchdog thread of every attached process pauses the
 * gate (with the ordinary pause), an opener pauses before shl_open returns,
 * and shl_reset_stale never clears a pause while a lease is armed. */
typedef struct shl_lease_info {
    int64_t deadline_ns;         /* 0: no lease */
    int64_t now_ns;              /* CLOCK_MONOTONIC when read */
    uint32_t pid;                /* who armed it */
    uint32_t expiries;           /* pauses made because it had passed */
} shl_lease_info;
int shl_lease_set(shl_lock *h, int64_t deadline_ns);
int shl_lease_get(shl_lock *h, shl_lease_info *out);

#endif
