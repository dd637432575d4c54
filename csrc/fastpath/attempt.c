/*
 * attempt.c - the attempt: the one loop of try, wait and cancel that every
 * hold and every wait of pyshmlock goes through, blocking or asyncio.
 *
 * An attempt (attempt_t) is one shl_waiter with its deadline.  It owns:
 *   - try: shl_try, which never sleeps (the GIL stays held);
 *   - the shared-thread rule: a try that finds its own thread holding the
 *     exclusive hold it asks for (SHL_EDEADLK) is refused only when it
 *     would wait without end; a try once says "not had", a timed attempt
 *     goes on as any thread of the process (another thread may release);
 *     an asyncio attempt is made as any thread from the start (another task
 *     of its loop may release);
 *   - the deadline: checked after every try that must wait;
 *   - the withdrawal: shl_cancel whenever the attempt ends without the
 *     hold, so nothing (owed-reader count, exclusive claim) is left behind.
 *
 * Two drivers, one attempt:
 *   attempt_block  a blocking call: try with the GIL held; if it must wait,
 *                  release the GIL and loop shl_wait / try, with a Ctrl-C
 *                  check after every wake-up that grants nothing.
 *   Attempt        the same attempt as an awaitable, for asyncio
 *                  (awaitable.c): each send tries on the loop thread; when
 *                  it must wait it hands itself to the parking code
 *                  (pyshmlock/_park.py park(), its registrations kept) and
 *                  yields the future that code returns; woken, it tries
 *                  again.  throw (cancellation), close and the garbage
 *                  collector withdraw it.
 */
#include "fastpath.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

/* ============================================================ the attempt */

/*
 * fork().  An awaitable attempt outlives a fork in the child's copy of its
 * object, its waiter still naming registrations (an owed reader, the
 * exclusive claim) that were made in the parent's slot.  The core refuses
 * to withdraw them only until the child takes a slot of its own; after
 * that, shl_cancel would count the parent's owed reader off the child's
 * slot (wrapping it: every writer then waits for a reader that never comes)
 * and shl_try would take the parent's claim for the child's (a corrupt
 * segment).  So each attempt notes the fork generation its waiter was begun
 * in, and in a later one forgets the waiter instead: the registrations stay
 * the parent's, to withdraw or use.  The counter is bumped in the child's
 * fork handler, when it has one thread; relaxed suffices (every later read
 * is by a thread the child starts after it).
 */
static _Atomic uint64_t g_attempt_fork_gen;

static void attempt_after_fork_in_child(void)
{
    atomic_fetch_add_explicit(&g_attempt_fork_gen, 1, memory_order_relaxed);
}

int attempt_fork_ready(void)
{
    return pthread_atfork(NULL, NULL, attempt_after_fork_in_child) == 0 ? 0 : -1;
}

/* Was the attempt's waiter begun before a fork() this process came out of? */
static int begun_before_fork(const attempt_t *a)
{
    return a->fork_gen != atomic_load_explicit(&g_attempt_fork_gen, memory_order_relaxed);
}

/* A fresh waiter on the same lock: nothing registered, nothing pending. */
static void attempt_reset(attempt_t *a, int kind, uint32_t flags, int64_t deadline, int shared)
{
    shl_lock *h = a->h;
    const LockObject *lock = a->lock;
    memset(a, 0, sizeof *a);
    a->h = h;
    a->lock = lock;
    a->deadline = deadline;
    a->w.kind = kind;
    a->w.flags = flags;
    a->w.shared_thread = shared;
    a->fork_gen = atomic_load_explicit(&g_attempt_fork_gen, memory_order_relaxed);
}

void attempt_init(attempt_t *a, const LockObject *lock, int kind, uint32_t flags,
                  int64_t deadline, int shared)
{
    a->h = lock->h;
    a->lock = lock;
    attempt_reset(a, kind, flags, deadline, shared);
}

/* The attempt, granted (nothing pending), goes on as an attempt of another
 * kind with the same deadline: begin_session's steps (awaitable.c). */
void attempt_rekind(attempt_t *a, int kind)
{
    attempt_reset(a, kind, 0, a->deadline, a->w.shared_thread);
}

/* Withdraw the attempt's registrations, if it may hold any (those made
 * before a fork are the parent's: forgotten, see above). */
void attempt_cancel(attempt_t *a)
{
    if (a->pending) {
        a->pending = 0;
        if (!begun_before_fork(a))
            core.cancel(a->h, &a->w);
    }
}

/* One try.  SHL_OK had; SHL_AGAIN must wait (registrations kept, pending);
 * SHL_TIMEDOUT a try once of the caller's own exclusive hold; <0 an error.
 * Anything but SHL_OK and SHL_AGAIN leaves nothing behind.  held: the
 * caller holds the GIL (the core's call without the in-flight count,
 * shl_fast_try, serves: every close also holds it); else GIL-free. */
static int attempt_try_as(attempt_t *a, int held)
{
    /* Registrations of the parent's (see above): start afresh as the child's. */
    if (a->pending && begun_before_fork(a))
        attempt_reset(a, a->w.kind, a->w.flags, a->deadline, a->w.shared_thread);
    for (;;) {
        shl_lock *fh = held ? attempt_fast_handle(a) : NULL;
        int r = fh != NULL ? core.fast_try(fh, &a->w) : core.try_(a->h, &a->w);
        if (r == SHL_AGAIN) {
            a->pending = 1;
            return r;
        }
        if (r == SHL_OK) {
            a->pending = 0;      /* granted: the waiter holds no registration */
            return r;
        }
        a->err = errno;
        a->pending = 1;
        attempt_cancel(a);
        /* The shared-thread rule (see the head of this file); a timed
         * attempt's deadline is not forever (-1). */
        if (r == SHL_EDEADLK && a->deadline != -1 && !a->w.shared_thread) {
            if (a->deadline == 0)
                return SHL_TIMEDOUT;
            attempt_reset(a, a->w.kind, a->w.flags, a->deadline, 1);
            continue;
        }
        return r;
    }
}

int attempt_try(attempt_t *a)
{
    return attempt_try_as(a, 0);
}

int attempt_try_held(attempt_t *a)
{
    return attempt_try_as(a, 1);
}

/* Is the deadline behind us (a try once always is)?  A try failed: the
 * deadline is made absolute now if it was not yet (calls.c). */
int attempt_past(attempt_t *a)
{
    if (a->deadline == 0)
        return 1;
    a->deadline = deadline_now(a->deadline);
    return a->deadline > 0 && monotonic_ns() >= a->deadline;
}

/*
 * The blocking loop of one attempt, the GIL held on entry and on return:
 * SHL_OK, SHL_TIMEDOUT, SHL_EINTR or <0, the last three with nothing left
 * behind.  The GIL is released only when the attempt must wait.
 *
 * Ctrl-C between two sleeps: a SIGINT that lands while the thread is not in
 * the futex system call (or is taken by another thread of the process) makes
 * no EINTR, and the wait would go on to its deadline.  So a wake-up that
 * does not grant the hold (a change, or the core's 100 ms safety-net probe)
 * takes the GIL back for a moment and asks whether SIGINT was tripped.  If
 * so it re-arms it (PyErr_SetInterrupt) and ends the attempt as SHL_EINTR
 * does: withdrawn, then the Python handlers run (the default one raises
 * KeyboardInterrupt).  No Python code runs while the attempt holds a
 * registration: a handler may use the same lock.
 */
static int attempt_wait(attempt_t *a, int tried)
{
    int r = tried ? SHL_AGAIN : attempt_try_held(a);
    if (r != SHL_AGAIN)
        return r;
    if (a->deadline == 0) {       /* try once: nothing to wait for */
        attempt_cancel(a);
        return SHL_TIMEDOUT;
    }
    a->deadline = deadline_now(a->deadline);   /* the first try failed: the clock now */
    PyThreadState *ts = PyEval_SaveThread();
    for (;;) {
        r = core.wait(a->h, &a->w, a->deadline);
        if (r != SHL_OK) {
            a->err = errno;
            break;
        }
        r = attempt_try(a);
        if (r != SHL_AGAIN)
            break;
        PyEval_RestoreThread(ts);
        int interrupted = PyOS_InterruptOccurred();   /* clears the flag... */
        if (interrupted)
            PyErr_SetInterrupt();                       /* ...so trip it again */
        ts = PyEval_SaveThread();
        if (interrupted) {
            r = SHL_EINTR;
            break;
        }
    }
    if (r != SHL_OK)
        attempt_cancel(a);
    PyEval_RestoreThread(ts);
    return r;
}

/* A blocking attempt of `kind` on lock (a _fast.Lock) until deadline: 1 had,
 * 0 timed out, -1 with an exception set (what names the call).  A hold's
 * first try is made through the core's fast calls (fastpath.h first_try). */
int attempt_block(PyObject *lock, int kind, uint32_t flags, int64_t deadline,
                  const char *what)
{
    return attempt_block_on(lock, kind, flags, deadline, what, NULL);
}

static int block_from(PyObject *lock, int kind, uint32_t flags, int64_t deadline,
                      const char *what, const shl_waiter *first, shl_lock **on);

/* attempt_block that, had (1), also says in *on (unless NULL) the handle the
 * hold was granted on.  That is the object's handle when the wait began,
 * not necessarily now: another thread may close the object while this one
 * sleeps (another object of the segment keeping the handle open), and the
 * hold is then the handle's, to be released there (begin_session's pin). */
int attempt_block_on(PyObject *lock, int kind, uint32_t flags, int64_t deadline,
                     const char *what, shl_lock **on)
{
    shl_waiter w;
    int r = flags == 0 ? first_try((const LockObject *)lock, kind, &w) : -1;
    if (r == 1) {               /* the GIL held since: still the object's handle */
        if (on != NULL)
            *on = ((const LockObject *)lock)->h;
        return 1;
    }
    return block_from(lock, kind, flags, deadline, what, r == 0 ? &w : NULL, on);
}

/* attempt_block after a first try (first_try's answer `first`, not 1) of a
 * hold whose timeout (NULL: converted already into `deadline`, see
 * timeout_prepare) is not converted yet: the deadline is computed now (an
 * exact int or float, or None: no Python code runs), and a timeout the rule
 * refuses withdraws what the first try left. */
int attempt_block_timeout(PyObject *lock, int kind, PyObject *timeout, int64_t deadline,
                          const char *what, int first, shl_waiter *w)
{
    if (timeout != NULL && to_deadline(timeout, &deadline) < 0) {
        if (first == 0)
            core.cancel(((const LockObject *)lock)->h, w);
        return -1;
    }
    return attempt_block_from(lock, kind, 0, deadline, what, first == 0 ? w : NULL);
}

/* attempt_block, after a first try (first_try) that must wait and left
 * *first (NULL: no try made, or nothing left behind). */
int attempt_block_from(PyObject *lock, int kind, uint32_t flags, int64_t deadline,
                       const char *what, const shl_waiter *first)
{
    return block_from(lock, kind, flags, deadline, what, first, NULL);
}

static int block_from(PyObject *lock, int kind, uint32_t flags, int64_t deadline,
                      const char *what, const shl_waiter *first, shl_lock **on)
{
    if (!g_ready)
        return not_ready();
    attempt_t a;
    for (;;) {
        /* (Re-)read the handle: a signal handler may have closed the lock. */
        attempt_init(&a, (LockObject *)lock, kind, flags, deadline, 0);
        if (first != NULL) {    /* go on from the first try */
            a.w = *first;
            a.pending = 1;
        }
        int r = attempt_wait(&a, first != NULL);
        first = NULL;
        if (r == SHL_OK) {
            if (on != NULL)
                *on = a.h;
            return 1;
        }
        if (r == SHL_TIMEDOUT)
            return 0;
        if (r != SHL_EINTR) {
            PyObject *name = lock_name(lock);
            raise_rc(r, what, name, a.err);
            Py_XDECREF(name);
            return -1;
        }
        if (PyErr_CheckSignals() < 0)
            return -1;          /* e.g. KeyboardInterrupt; nothing is left behind */
    }
}

/*
 * The last step of begin_session, for a caller the update hold was just
 * granted to: pin the pause for a new session, then release the hold.  It
 * runs in C straight after the grant (attempt_block's, or an asyncio
 * attempt's), so no Python code - a signal handler that raises, such as
 * Ctrl-C's - can run while the hold is held and nobody has seen it.  The
 * session's token (an int), None if another session pinned first (wait
 * until unpinned, then try again), or NULL with the exception set.
 *
 * h is the handle the update was granted on: the pin and the release are
 * made there, not on the object's handle of now.  Another thread may have
 * closed the object (lock) while the attempt waited: while another object
 * of the segment stays open that close only unbinds this one (its h NULL),
 * and the hold, the handle's, would be left held with nobody to release it.
 * The handle itself is still open: its last close refuses while the
 * process holds the lock (and the GIL, held since the grant, keeps every
 * close out until the release).
 */
PyObject *session_pin_held(PyObject *lock, shl_lock *h, int64_t ttl_ns)
{
    const LockObject *lo = (const LockObject *)lock;
    uint64_t token = 0;
    int r = core.session_pin(h, ttl_ns, &token);
    int err = errno;
    int rel = release(lo->h == h ? lo->fh : NULL, h, SHL_KIND_UPDATE);
    int rel_err = errno;
    const char *what = "begin_session";
    if (rel != 0 && (r == SHL_OK || r == SHL_AGAIN)) {
        r = rel;                /* as the release after the pin would raise */
        err = rel_err;
        what = KIND[SHL_KIND_UPDATE].release;
    }
    if (r == SHL_OK)
        return PyLong_FromUnsignedLongLong((unsigned long long)token);
    if (r == SHL_AGAIN)
        Py_RETURN_NONE;
    PyObject *name = lock_name(lock);
    raise_rc(r, what, name, err);
    Py_XDECREF(name);
    return NULL;
}
