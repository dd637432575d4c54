/*
 * fastpath.c - pyshmlock._fast: the uncontended hold calls, straight from
 * Python into C.
 *
 * cffi stays the binding of the C core (pyshmlock._shmlock).  A cffi call
 * costs two GIL hand-offs and argument conversion, and the Python method
 * around it a frame; for a lock whose uncontended acquire is one atomic RMW
 * that is most of the price.  This module provides two base types whose
 * methods are plain C functions of the CPython C API:
 *
 *   _fast.Lock  acquire_read/write/update(timeout=None), release_read/
 *               write/update(), the `paused` property.  pyshmlock.RWLock
 *               subclasses it.
 *   _fast.Hold  __enter__/__exit__ of the sync hold objects (reader_lock,
 *               read(timeout=...), ...).  The hold classes subclass it.
 *
 * One copy of the core.  This file does not contain or link the core: the
 * core's code and its process-private state (fork handler, keeper thread,
 * mutexes) exist once per process, in the cffi module.  setup() receives
 * the addresses of the few shl_* entry points used here, taken from the
 * cffi module by pyshmlock/_fastpath.py, and every call goes through that
 * table (so it also gets whatever the entry points do, e.g. refusing a
 * closed handle).  The extension never touches the segment itself.
 *
 * The path of an acquire (modelled on CPython's
 * Modules/_multiprocessing/semaphore.c, which tries sem_trywait() before
 * releasing the GIL for sem_wait()):
 *   1. shl_try() with the GIL held.  shl_try never sleeps: it is a few
 *      atomic operations on the segment.  Granted: return True.  No Python
 *      frame, no GIL release.
 *   2. Not granted (SHL_AGAIN): the attempt keeps its registrations (an
 *      owed-reader count or an exclusive claim) and, unless the timeout is
 *      0, the GIL is released for the same loop the core's blocking calls
 *      run (shl_wait, shl_try again, shl_cancel on giving up): step for step
 *      what shl_acquire_*() does, so the protocol sees no difference.  A
 *      timeout of 0 calls shl_wait(deadline 0), which returns SHL_TIMEDOUT
 *      without sleeping, then shl_cancel: also exactly what the core does.
 *   3. SHL_EINTR (a signal during the wait, or a Ctrl-C seen between two
 *      sleeps, see wait_loop; the attempt was cancelled):
 *      with the GIL back, PyErr_CheckSignals() runs the Python signal
 *      handlers (Ctrl-C raises KeyboardInterrupt here), then the attempt
 *      starts again with the same deadline, as lock.py's _finish() did.
 *   4. Errors build their exception in Python (pyshmlock.errors.error_for)
 *      through a callback: the slow path may run Python code.
 *
 * Timeouts: None, 0 and ordinary positive floats/ints are converted here
 * with the same rule as lock.py's deadline_ns() (CLOCK_MONOTONIC, the same
 * clock as time.monotonic_ns(); truncation like int()).  Everything else
 * (negative, NaN, inf, huge, objects with __float__, bool) is handed to
 * deadline_ns() itself, so there is one rule for the edge cases: errors,
 * "forever", saturation.
 *
 * Built for the stable ABI of CPython 3.9 (Py_LIMITED_API 0x03090000): one
 * abi3 binary for every CPython >= 3.9.  See METH_FASTCALL below.
 */
#define Py_LIMITED_API 0x03090000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "shmlock.h"

/*
 * METH_FASTCALL (arguments as a C array, no tuple) is part of the stable
 * ABI from 3.10 on, so the 3.9 limited-API headers do not declare it.  Its
 * value and calling convention have not changed since CPython 3.7, where
 * the interpreter learnt it, and the 3.10 stable ABI froze exactly these;
 * a 3.9 interpreter calls such a method correctly.  Defining it here keeps
 * one cp39-abi3 binary and the cheaper convention: with METH_VARARGS every
 * call with an argument would build a tuple (and kwargs a dict).
 */
#ifndef METH_FASTCALL
#define METH_FASTCALL 0x0080
#endif

typedef PyObject *(*fastcall_kw)(PyObject *, PyObject *const *, Py_ssize_t, PyObject *);
typedef PyObject *(*fastcall)(PyObject *, PyObject *const *, Py_ssize_t);

/* ------------------------------------------------------- the core's table */

static struct {
    int (*try_)(shl_lock *, shl_waiter *);
    int (*wait)(shl_lock *, shl_waiter *, int64_t);
    void (*cancel)(shl_lock *, shl_waiter *);
    int (*release_read)(shl_lock *);
    int (*release_write)(shl_lock *);
    int (*release_update)(shl_lock *);
    int (*is_paused)(shl_lock *);
} core;

static int g_ready;                   /* setup() done */
static PyObject *g_deadline_ns;       /* lock.deadline_ns: the rule for edge cases */
static PyObject *g_error;             /* error(rc, what, name, errno) -> exception */

#define KIND_MIN SHL_KIND_READ
#define KIND_MAX SHL_KIND_UPDATE

/* Names used in messages, indexed by kind (same words as lock.py used). */
static const char *const ACQUIRE_NAME[] = {NULL, "acquire_read", "acquire_write", "acquire_update"};
static const char *const RELEASE_NAME[] = {NULL, "release_read", "release_write", "release_update"};
static const char *const HOLD_NAME[] = {NULL, "read hold", "write hold", "update hold"};

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
static int to_deadline(PyObject *timeout, int64_t *out)
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
static PyObject *raise_rc(int rc, const char *what, PyObject *name, int err)
{
    PyObject *exc = PyObject_CallFunction(g_error, "isOi", rc, what, name ? name : Py_None, err);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

static int not_ready(void)
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

/* ------------------------------------------------------------ Lock type */

typedef struct {
    PyObject_HEAD
    shl_lock *h;                /* NULL: not bound yet, or closed */
} LockObject;

static PyTypeObject *LockType;
static PyTypeObject *HoldType;

static PyObject *lock_name(PyObject *self)
{
    PyObject *n = PyObject_GetAttrString(self, "name");
    if (n == NULL)
        PyErr_Clear();
    return n;   /* new reference or NULL (error_for then leaves the name out) */
}

/* Acquire `kind` on lock `lk`; 1 had, 0 timed out, -1 exception set. */
static int acquire(LockObject *lk, int kind, int64_t deadline, const char *what)
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

/* Parse (timeout=None) from a vectorcall; NULL on error. */
static PyObject *timeout_arg(const char *fname, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames)
{
    PyObject *timeout = Py_None;
    Py_ssize_t nkw = kwnames ? PyTuple_Size(kwnames) : 0;
    if (nargs > 1) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most 1 argument (%zd given)",
                     fname, nargs + nkw);
        return NULL;
    }
    if (nargs == 1)
        timeout = args[0];
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *k = PyTuple_GetItem(kwnames, i);
        if (k == NULL)
            return NULL;
        if (PyUnicode_CompareWithASCIIString(k, "timeout") != 0) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'",
                         fname, k);
            return NULL;
        }
        if (nargs == 1) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument 'timeout'",
                         fname);
            return NULL;
        }
        timeout = args[nargs + i];
    }
    return timeout;   /* borrowed */
}

static PyObject *lock_acquire(PyObject *self, int kind, PyObject *const *args,
                              Py_ssize_t nargs, PyObject *kwnames)
{
    LockObject *lk = (LockObject *)self;
    const char *what = ACQUIRE_NAME[kind];
    int64_t deadline = -1;
    if (nargs != 0 || kwnames != NULL) {
        PyObject *timeout = timeout_arg(what, args, nargs, kwnames);
        if (timeout == NULL || to_deadline(timeout, &deadline) < 0)
            return NULL;
    }
    int r = acquire(lk, kind, deadline, what);
    if (r < 0)
        return NULL;
    return PyBool_FromLong(r);
}

static PyObject *lock_acquire_read(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                   PyObject *kwnames)
{
    return lock_acquire(self, SHL_KIND_READ, args, nargs, kwnames);
}

static PyObject *lock_acquire_write(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                    PyObject *kwnames)
{
    return lock_acquire(self, SHL_KIND_WRITE, args, nargs, kwnames);
}

static PyObject *lock_acquire_update(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                     PyObject *kwnames)
{
    return lock_acquire(self, SHL_KIND_UPDATE, args, nargs, kwnames);
}

/* Releases never block: the GIL stays held. */
static int release(shl_lock *h, int kind)
{
    switch (kind) {
    case SHL_KIND_READ:  return core.release_read(h);
    case SHL_KIND_WRITE: return core.release_write(h);
    default:             return core.release_update(h);
    }
}

static PyObject *lock_release(PyObject *self, int kind)
{
    if (!g_ready)
        return not_ready(), NULL;
    int r = release(((LockObject *)self)->h, kind);
    if (r == 0)
        Py_RETURN_NONE;
    int err = errno;
    PyObject *name = lock_name(self);
    raise_rc(r, RELEASE_NAME[kind], name, err);
    Py_XDECREF(name);
    return NULL;
}

static PyObject *lock_release_read(PyObject *self, PyObject *unused)
{
    (void)unused;
    return lock_release(self, SHL_KIND_READ);
}

static PyObject *lock_release_write(PyObject *self, PyObject *unused)
{
    (void)unused;
    return lock_release(self, SHL_KIND_WRITE);
}

static PyObject *lock_release_update(PyObject *self, PyObject *unused)
{
    (void)unused;
    return lock_release(self, SHL_KIND_UPDATE);
}

static PyObject *lock_paused(PyObject *self, void *closure)
{
    (void)closure;
    if (!g_ready)
        return not_ready(), NULL;
    int r = core.is_paused(((LockObject *)self)->h);
    if (r < 0) {                /* closed (SHL_ECLOSED) or another error */
        PyObject *name = lock_name(self);
        raise_rc(r, "paused", name, errno);
        Py_XDECREF(name);
        return NULL;
    }
    return PyBool_FromLong(r == 1);
}

/* _fast_bind(address): the shl_lock * this object uses; 0 when closed. */
static PyObject *lock_bind(PyObject *self, PyObject *addr)
{
    void *p = PyLong_AsVoidPtr(addr);
    if (p == NULL && PyErr_Occurred())
        return NULL;
    ((LockObject *)self)->h = (shl_lock *)p;
    Py_RETURN_NONE;
}

static void lock_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    freefunc free_fn = (freefunc)(uintptr_t)PyType_GetSlot(tp, Py_tp_free);
    free_fn(self);
    Py_DECREF(tp);   /* heap-type instances own a reference to their type */
}

/* Function pointers travel through void * in PyType_Slot; going through
 * uintptr_t keeps -Wpedantic quiet (POSIX guarantees the round trip). */
#define FN_SLOT(f) ((void *)(uintptr_t)(f))
#define FASTCALL_KW(f) (PyCFunction)(void (*)(void))(fastcall_kw)(f)
#define FASTCALL(f) (PyCFunction)(void (*)(void))(fastcall)(f)

static PyMethodDef lock_methods[] = {
    {"acquire_read", FASTCALL_KW(lock_acquire_read), METH_FASTCALL | METH_KEYWORDS,
     "acquire_read(timeout=None) -> bool\n\nTake a shared hold.  Waits while the lock "
     "is paused, or while a writer\nholds it or queued before this reader."},
    {"release_read", lock_release_read, METH_NOARGS,
     "Give back one read hold of this process (RuntimeError if none)."},
    {"acquire_write", FASTCALL_KW(lock_acquire_write), METH_FASTCALL | METH_KEYWORDS,
     "acquire_write(timeout=None) -> bool\n\nTake the exclusive hold: blocks new readers "
     "at once, then waits for\nevery read hold in every process, paused or not."},
    {"release_write", lock_release_write, METH_NOARGS,
     "Give back this process's write hold (RuntimeError if none)."},
    {"acquire_update", FASTCALL_KW(lock_acquire_update), METH_FASTCALL | METH_KEYWORDS,
     "acquire_update(timeout=None) -> bool\n\nTake the pause-aware exclusive hold.\n\n"
     "Exclusive against every write or update hold.  If the lock is paused\nit does not "
     "wait for readers (the pause froze them) and it pins the\npause: resume() waits until "
     "the update is released.  If not paused\nit waits for readers like a writer, and "
     "proceeds at once if a pause\narrives while it waits."},
    {"release_update", lock_release_update, METH_NOARGS,
     "Give back this process's update hold (RuntimeError if none)."},
    {"_fast_bind", lock_bind, METH_O,
     "_fast_bind(address): the shl_lock * the fast methods use (0: closed)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef lock_getset[] = {
    {"paused", lock_paused, NULL, "Whether the gate is closed (one shared-memory load).",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot lock_slots[] = {
    {Py_tp_doc, (void *)"Base type of pyshmlock.RWLock: the hold calls in C."},
    {Py_tp_methods, lock_methods},
    {Py_tp_getset, lock_getset},
    {Py_tp_dealloc, FN_SLOT(lock_dealloc)},
    {Py_tp_new, FN_SLOT(PyType_GenericNew)},
    {0, NULL},
};

static PyType_Spec lock_spec = {
    "pyshmlock._fast.Lock", sizeof(LockObject), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE, lock_slots,
};

/* ------------------------------------------------------------ Hold type */

/* The two methods whose bound objects a hold may keep (see "Bound
 * methods kept" below), as indexes into HoldObject.bound. */
#define BOUND_ENTER 0
#define BOUND_EXIT 1

typedef struct {
    PyObject_HEAD
    PyObject *lock;             /* a _fast.Lock (an RWLock) */
    PyObject *timeout;          /* None or the timeout given */
    int kind;                   /* SHL_KIND_READ / WRITE / UPDATE */
    PyObject *bound[2];         /* kept hold.__enter__ / hold.__exit__, or NULL */
} HoldObject;

static int hold_init(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"lock", "kind", "timeout", NULL};
    HoldObject *ho = (HoldObject *)self;
    PyObject *lock, *timeout = Py_None;
    int kind;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Oi|O", kwlist, &lock, &kind, &timeout))
        return -1;
    if (!PyObject_TypeCheck(lock, LockType)) {
        PyErr_SetString(PyExc_TypeError, "a hold needs a pyshmlock.RWLock");
        return -1;
    }
    if (kind < KIND_MIN || kind > KIND_MAX) {
        PyErr_Format(PyExc_ValueError, "unknown hold kind %d", kind);
        return -1;
    }
    PyObject *old_lock = ho->lock, *old_timeout = ho->timeout;
    Py_INCREF(lock);
    ho->lock = lock;
    Py_INCREF(timeout);
    ho->timeout = timeout;
    Py_XDECREF(old_lock);
    Py_XDECREF(old_timeout);
    ho->kind = kind;
    return 0;
}

static PyObject *hold_enter(PyObject *self, PyObject *unused)
{
    (void)unused;
    HoldObject *ho = (HoldObject *)self;
    if (ho->lock == NULL) {
        PyErr_SetString(PyExc_TypeError, "hold not initialised");
        return NULL;
    }
    /* Own references for the whole call: the GIL is released while we wait
     * and Python code may run (deadline_ns, signal handlers), so another
     * thread may re-initialise this hold and drop the last reference to
     * the lock or timeout it had. */
    PyObject *lock = ho->lock, *timeout = ho->timeout;
    int kind = ho->kind;
    Py_INCREF(lock);
    Py_INCREF(timeout);
    PyObject *result = NULL;
    int64_t deadline;
    if (to_deadline(timeout, &deadline) < 0)
        goto done;
    int r = acquire((LockObject *)lock, kind, deadline, HOLD_NAME[kind]);
    if (r < 0)
        goto done;
    if (r == 0) {
        PyObject *name = lock_name(lock);
        if (name == NULL)
            goto done;
        PyErr_Format(PyExc_TimeoutError, "%s of lock %R not had within %S s",
                     HOLD_NAME[kind], name, timeout);
        Py_DECREF(name);
        goto done;
    }
    Py_INCREF(self);
    result = self;
done:
    Py_DECREF(lock);
    Py_DECREF(timeout);
    return result;
}

static PyObject *hold_exit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)args;
    (void)nargs;
    HoldObject *ho = (HoldObject *)self;
    if (!g_ready)
        return not_ready(), NULL;
    if (ho->lock == NULL) {
        PyErr_SetString(PyExc_TypeError, "hold not initialised");
        return NULL;
    }
    int kind = ho->kind;
    int r = release(((LockObject *)ho->lock)->h, kind);
    if (r == 0)
        Py_RETURN_NONE;
    int err = errno;
    PyObject *what = PyUnicode_FromFormat("release of %s", HOLD_NAME[kind]);
    if (what == NULL)
        return NULL;
    /* lock_name may run Python code: keep our own reference (hold_enter). */
    PyObject *lock = ho->lock;
    Py_INCREF(lock);
    PyObject *name = lock_name(lock);
    Py_DECREF(lock);
    PyObject *exc = PyObject_CallFunction(g_error, "iOOi", r, what, name ? name : Py_None, err);
    Py_DECREF(what);
    Py_XDECREF(name);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

static int hold_traverse(PyObject *self, visitproc visit, void *arg)
{
    HoldObject *ho = (HoldObject *)self;
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(ho->lock);
    Py_VISIT(ho->timeout);
    Py_VISIT(ho->bound[BOUND_ENTER]);
    Py_VISIT(ho->bound[BOUND_EXIT]);
    return 0;
}

static int hold_clear(PyObject *self)
{
    HoldObject *ho = (HoldObject *)self;
    Py_CLEAR(ho->lock);
    Py_CLEAR(ho->timeout);
    Py_CLEAR(ho->bound[BOUND_ENTER]);
    Py_CLEAR(ho->bound[BOUND_EXIT]);
    return 0;
}

static void hold_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    hold_clear(self);
    freefunc free_fn = (freefunc)(uintptr_t)PyType_GetSlot(tp, Py_tp_free);
    free_fn(self);
    Py_DECREF(tp);
}

static PyObject *hold_keep_bound(PyObject *self, PyObject *unused);

static PyMethodDef hold_methods[] = {
    /* BOUND_ENTER and BOUND_EXIT index these two entries. */
    {"__enter__", hold_enter, METH_NOARGS, "Take the hold (TimeoutError if not had in time)."},
    {"__exit__", FASTCALL(hold_exit), METH_FASTCALL, "Give the hold back."},
    {"_keep_bound", hold_keep_bound, METH_NOARGS,
     "Keep this hold's bound __enter__/__exit__ for every `with` (for the\n"
     "long-lived holds of a lock: they form a reference cycle)."},
    {NULL, NULL, 0, NULL},
};

/* ---------------------------------------------------- Bound methods kept
 *
 * `with hold:` looks up hold.__enter__ and hold.__exit__ through their
 * descriptors, and on CPython before 3.14 each lookup allocates a bound
 * builtin method (a GC-tracked object, tracked and freed again at the end
 * of the block): two allocations that cost about as much as the hold
 * itself.  The long-lived holds (lock.reader_lock, writer_lock,
 * update_lock: RWLock.__init__ calls _keep_bound()) make those two bound
 * objects once and keep them; a small descriptor, installed in place of
 * the two method descriptors, hands out the kept object.
 *
 * Nothing visible changes: the kept object is what the method descriptor
 * would have made (PyCFunction_NewEx of the same PyMethodDef with the hold
 * as self, as CPython's method_get does for a method without METH_METHOD),
 * holds without kept objects (lock.read(timeout=...)) get a fresh one as
 * before, and class access (Hold.__enter__) still returns the method
 * descriptor.  The kept objects refer back to the hold: a cycle, collected
 * by the GC (hold_traverse/hold_clear see them); these holds are in a cycle
 * with their lock already (lock.reader_lock._lock is lock). */

typedef struct {
    PyObject_HEAD
    PyObject *descr;            /* the method descriptor it replaces (owned) */
    int which;                  /* BOUND_ENTER or BOUND_EXIT */
} KeptDescrObject;

static PyTypeObject *KeptDescrType;

static PyObject *hold_keep_bound(PyObject *self, PyObject *unused)
{
    (void)unused;
    HoldObject *ho = (HoldObject *)self;
    for (int i = BOUND_ENTER; i <= BOUND_EXIT; i++) {
        if (ho->bound[i] != NULL)
            continue;
        PyObject *b = PyCFunction_NewEx(&hold_methods[i], self, NULL);
        if (b == NULL)
            return NULL;
        ho->bound[i] = b;
    }
    Py_RETURN_NONE;
}

static PyObject *kept_get(PyObject *self, PyObject *obj, PyObject *type)
{
    KeptDescrObject *d = (KeptDescrObject *)self;
    if (obj != NULL && PyObject_TypeCheck(obj, HoldType)) {
        PyObject *b = ((HoldObject *)obj)->bound[d->which];
        if (b != NULL) {
            Py_INCREF(b);
            return b;
        }
        return PyCFunction_NewEx(&hold_methods[d->which], obj, NULL);
    }
    /* Class access or a foreign object: the method descriptor's own
     * answer (itself, or its TypeError). */
    return PyObject_CallMethod(d->descr, "__get__", "OO", obj ? obj : Py_None,
                               type ? type : Py_None);
}

/* Lives as long as the process (the Hold type's dict holds it): not GC
 * tracked, so the cycle descr -> Hold type -> dict -> this is never freed,
 * like the module's other types. */
static void kept_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    Py_CLEAR(((KeptDescrObject *)self)->descr);
    freefunc free_fn = (freefunc)(uintptr_t)PyType_GetSlot(tp, Py_tp_free);
    free_fn(self);
    Py_DECREF(tp);
}

static PyType_Slot kept_slots[] = {
    {Py_tp_doc, (void *)"A method of pyshmlock._fast.Hold whose bound object a hold may keep."},
    {Py_tp_descr_get, FN_SLOT(kept_get)},
    {Py_tp_dealloc, FN_SLOT(kept_dealloc)},
    {0, NULL},
};

static PyType_Spec kept_spec = {
    "pyshmlock._fast._KeptMethod", sizeof(KeptDescrObject), 0, Py_TPFLAGS_DEFAULT, kept_slots,
};

/* Replace Hold.<hold_methods[which].ml_name> by a kept-method descriptor. */
static int install_kept(int which)
{
    const char *name = hold_methods[which].ml_name;
    PyObject *descr = PyObject_GetAttrString((PyObject *)HoldType, name);
    if (descr == NULL)
        return -1;
    KeptDescrObject *d = PyObject_New(KeptDescrObject, KeptDescrType);
    if (d == NULL) {
        Py_DECREF(descr);
        return -1;
    }
    d->descr = descr;
    d->which = which;
    int r = PyObject_SetAttrString((PyObject *)HoldType, name, (PyObject *)d);
    Py_DECREF(d);
    return r;
}

static PyMemberDef hold_members[] = {
    {"_lock", T_OBJECT, offsetof(HoldObject, lock), READONLY, "the RWLock"},
    {"_timeout", T_OBJECT, offsetof(HoldObject, timeout), READONLY, "the timeout"},
    {"_kind", T_INT, offsetof(HoldObject, kind), READONLY, "SHL_KIND_*"},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot hold_slots[] = {
    {Py_tp_doc, (void *)"Base type of the sync hold objects: __enter__/__exit__ in C."},
    {Py_tp_methods, hold_methods},
    {Py_tp_members, hold_members},
    {Py_tp_init, FN_SLOT(hold_init)},
    {Py_tp_new, FN_SLOT(PyType_GenericNew)},
    {Py_tp_traverse, FN_SLOT(hold_traverse)},
    {Py_tp_clear, FN_SLOT(hold_clear)},
    {Py_tp_dealloc, FN_SLOT(hold_dealloc)},
    {0, NULL},
};

static PyType_Spec hold_spec = {
    "pyshmlock._fast.Hold", sizeof(HoldObject), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, hold_slots,
};

/* --------------------------------------------------------------- module */

#define Py_XSETREF_COMPAT(dst, src)  \
    do {                             \
        PyObject *old_ = (dst);      \
        (dst) = (src);               \
        Py_XDECREF(old_);            \
    } while (0)

/* Address of an entry point from the table dict; 0 with an exception. */
static void *entry(PyObject *table, const char *name)
{
    PyObject *v = PyDict_GetItemString(table, name);   /* borrowed */
    if (v == NULL) {
        PyErr_Format(PyExc_KeyError, "the core's table lacks %s", name);
        return NULL;
    }
    void *p = PyLong_AsVoidPtr(v);
    if (p == NULL && !PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "NULL address for %s", name);
    return p;
}

/* setup(table, deadline_ns, error): table maps "shl_try", ... to addresses
 * taken from the cffi module; error(rc, what, name, errno) builds the
 * exception for a negative return code. */
static PyObject *mod_setup(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *table, *deadline_ns, *error;
    if (!PyArg_ParseTuple(args, "O!OO", &PyDict_Type, &table, &deadline_ns, &error))
        return NULL;
#define ENTRY(field, name)                                           \
    do {                                                             \
        void *p_ = entry(table, name);                               \
        if (p_ == NULL)                                              \
            return NULL;                                             \
        memcpy(&core.field, &p_, sizeof p_);                         \
    } while (0);
    ENTRY(try_, "shl_try")
    ENTRY(wait, "shl_wait")
    ENTRY(cancel, "shl_cancel")
    ENTRY(release_read, "shl_release_read")
    ENTRY(release_write, "shl_release_write")
    ENTRY(release_update, "shl_release_update")
    ENTRY(is_paused, "shl_is_paused")
#undef ENTRY
    /* Again (a reloaded lock.py): the new callables replace the old. */
    Py_INCREF(deadline_ns);
    Py_XSETREF_COMPAT(g_deadline_ns, deadline_ns);
    Py_INCREF(error);
    Py_XSETREF_COMPAT(g_error, error);
    g_ready = 1;
    Py_RETURN_NONE;
}

static PyMethodDef mod_methods[] = {
    {"setup", mod_setup, METH_VARARGS,
     "setup(table, deadline_ns, error): hand over the core's entry points (once)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fast_module = {
    PyModuleDef_HEAD_INIT, "pyshmlock._fast",
    "The uncontended hold calls of pyshmlock in C (see csrc/fastpath.c).", -1, mod_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fast(void)
{
    PyObject *m = PyModule_Create(&fast_module);
    if (m == NULL)
        return NULL;
    LockType = (PyTypeObject *)PyType_FromSpec(&lock_spec);
    if (LockType == NULL)
        goto fail;
    HoldType = (PyTypeObject *)PyType_FromSpec(&hold_spec);
    if (HoldType == NULL)
        goto fail;
    KeptDescrType = (PyTypeObject *)PyType_FromSpec(&kept_spec);
    if (KeptDescrType == NULL || install_kept(BOUND_ENTER) < 0 || install_kept(BOUND_EXIT) < 0)
        goto fail;
    Py_INCREF(LockType);
    if (PyModule_AddObject(m, "Lock", (PyObject *)LockType) < 0) {
        Py_DECREF(LockType);
        goto fail;
    }
    Py_INCREF(HoldType);
    if (PyModule_AddObject(m, "Hold", (PyObject *)HoldType) < 0) {
        Py_DECREF(HoldType);
        goto fail;
    }
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
