/*
 * calls.c - calling the core from pyshmlock._fast: the table of the core's
 * entry points, timeouts turned into deadlines, errors raised through
 * pyshmlock.errors, and the acquire path (try with the GIL held; release
 * the GIL only for the wait loop).  See fastpath.h for the whole path.
 */
#include "fastpath.h"

#include <errno.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------- the core's table */

struct core_table core;
int g_ready;
PyObject *g_deadline_ns;
PyObject *g_error;

/* Names used in messages, indexed by kind (same words as lock.py used). */
const char *const ACQUIRE_NAME[] = {NULL, "acquire_read", "acquire_write", "acquire_update"};
const char *const RELEASE_NAME[] = {NULL, "release_read", "release_write", "release_update"};
const char *const HOLD_NAME[] = {NULL, "read hold", "write hold", "update hold"};

/* ------------------------------------------------------------- deadlines */

/* Above this many seconds the conversion is left to deadline_ns(): far
 * below any int64 overflow, far above any realistic finite timeout. */
#define FAST_TIMEOUT_MAX 1e8

static int64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* timeout -> absolute deadline (-1 forever, 0 try once).  -1 with an
 * exception set on error. */
int to_deadline(PyObject *timeout, int64_t *out)
{
    double t;
    if (timeout == Py_None) {
        *out = -1;
        return 0;
    }
    if (PyFloat_CheckExact(timeout)) {
        t = PyFloat_AsDouble(timeout);
    } else if (PyLong_CheckExact(timeout)) {
        t = PyLong_AsDouble(timeout);
        if (t == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();     /* too large for a double: let the rule decide */
            goto by_rule;
        }
    } else {
        goto by_rule;
    }
    if (t == 0.0) {            /* also -0.0, as in deadline_ns() */
        *out = 0;
        return 0;
    }
    if (t > 0.0 && t <= FAST_TIMEOUT_MAX) {   /* false for NaN */
        *out = monotonic_ns() + (int64_t)(t * 1e9);
        return 0;
    }
by_rule:;
    PyObject *r = PyObject_CallFunctionObjArgs(g_deadline_ns, timeout, NULL);
    if (r == NULL)
        return -1;
    long long v = PyLong_AsLongLong(r);
    Py_DECREF(r);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = (int64_t)v;
    return 0;
}

/* --------------------------------------------------------------- errors */

/* Raise the exception error(rc, what, name, errno) builds; returns NULL. */
PyObject *raise_rc(int rc, const char *what, PyObject *name, int err)
{
    PyObject *exc = PyObject_CallFunction(g_error, "isOi", rc, what, name ? name : Py_None, err);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

int not_ready(void)
{
    PyErr_SetString(PyExc_RuntimeError, "pyshmlock._fast is not set up (import pyshmlock)");
    return -1;
}

/* -------------------------------------------------------------- waiting */

/* The core's blocking loop from SHL_AGAIN on (csrc/core/wait.c run_blocking),
 * entered without the GIL when *ts != NULL.
 *
 * Ctrl-C between two sleeps: a SIGINT that lands while the thread is not in
 * the futex system call (or is taken by another thread of the process) makes
 * no EINTR, and the wait would go on to its deadline.  So a wake-up that
 * does not grant the hold (a change, or the core's 100 ms safety-net probe)
 * takes the GIL back for a moment and asks whether SIGINT was tripped.  If
 * so it re-arms it (PyErr_SetInterrupt) and ends the attempt as SHL_EINTR
 * does: cancelled, nothing left behind, then the Python handlers run (the
 * default one raises KeyboardInterrupt).  No Python code runs while the
 * attempt holds a registration: a handler may use the same lock. */
static int wait_loop(shl_lock *h, shl_waiter *w, int64_t deadline, int *err,
                     PyThreadState **ts)
{
    int r;
    for (;;) {
        r = core.wait(h, w, deadline);
        if (r != SHL_OK)
            break;
        r = core.try_(h, w);
        if (r != SHL_AGAIN)
            break;
        if (*ts != NULL) {
            PyEval_RestoreThread(*ts);
            int interrupted = PyOS_InterruptOccurred();   /* clears the flag... */
            if (interrupted)
                PyErr_SetInterrupt();                       /* ...so trip it again */
            *ts = PyEval_SaveThread();
            if (interrupted) {
                r = SHL_EINTR;
                break;
            }
        }
    }
    *err = errno;
    if (r != SHL_OK)
        core.cancel(h, w);
    return r;
}

/* One attempt, as shl_acquire_*(h, deadline) would make it; the GIL is
 * released only around a wait that may sleep. */
static int attempt(shl_lock *h, int kind, int64_t deadline, int shared, int *err)
{
    shl_waiter w;
    memset(&w, 0, sizeof w);
    w.kind = kind;
    w.shared_thread = shared;
    int r = core.try_(h, &w);   /* never sleeps: keep the GIL */
    *err = errno;
    if (r == SHL_OK)
        return r;
    if (r != SHL_AGAIN) {
        core.cancel(h, &w);
        return r;
    }
    PyThreadState *ts = NULL;
    if (deadline == 0)          /* try once: shl_wait returns at once */
        return wait_loop(h, &w, 0, err, &ts);
    ts = PyEval_SaveThread();
    r = wait_loop(h, &w, deadline, err, &ts);
    PyEval_RestoreThread(ts);
    return r;
}

/* ------------------------------------------------------- acquire, release */

PyObject *lock_name(PyObject *self)
{
    PyObject *n = PyObject_GetAttrString(self, "name");
    if (n == NULL)
        PyErr_Clear();
    return n;   /* new reference or NULL (error_for then leaves the name out) */
}

/* Acquire `kind` on lock `lk`; 1 had, 0 timed out, -1 exception set. */
int acquire(LockObject *lk, int kind, int64_t deadline, const char *what)
{
    if (!g_ready)
        return not_ready();
    int err = 0, shared = 0;
    int r = attempt(lk->h, kind, deadline, shared, &err);
    for (;;) {
        if (r == SHL_EINTR) {
            if (PyErr_CheckSignals() < 0)
                return -1;      /* e.g. KeyboardInterrupt; nothing is left behind */
        } else if (r == SHL_EDEADLK && deadline >= 0 && !shared) {
            /* This thread has the exclusive hold it asks for.  Only a wait
             * without end is refused (WouldDeadlockError); a try says False
             * and a timed wait waits as any thread of the process would
             * (another thread may release the hold), as threading.Lock's. */
            if (deadline == 0)
                return 0;
            shared = 1;
        } else {
            break;
        }
        r = attempt(lk->h, kind, deadline, shared, &err);   /* re-read: a handler may close */
    }
    if (r == SHL_OK)
        return 1;
    if (r == SHL_TIMEDOUT)
        return 0;
    PyObject *name = lock_name((PyObject *)lk);
    raise_rc(r, what, name, err);
    Py_XDECREF(name);
    return -1;
}

/* Releases never block: the GIL stays held. */
int release(shl_lock *h, int kind)
{
    switch (kind) {
    case SHL_KIND_READ:  return core.release_read(h);
    case SHL_KIND_WRITE: return core.release_write(h);
    default:             return core.release_update(h);
    }
}
