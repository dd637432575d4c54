/*
 * fastpath.h - pyshmlock._fast: the path of a hold, from Python into C, and
 * what its files share.
 *
 * cffi stays the binding of the C core (pyshmlock._shmlock).  A cffi call
 * costs two GIL hand-offs and argument conversion, and the Python method
 * around it a frame; for a lock whose uncontended acquire is one atomic RMW
 * that is most of the price.  This module's types have plain C methods of
 * the CPython C API:
 *
 *   _fast.Lock       acquire_read/write/update(timeout=None), release_*(),
 *                    wait_resumed/wait_drained(timeout=None), `paused`, and
 *                    _attempt_block(kind, deadline, flags): the base type of
 *                    pyshmlock.RWLock.
 *   _fast.AsyncLock  acquire_read/write/update(timeout=None) returning an
 *                    awaitable, and _attempt(...): the base of AsyncRWLock.
 *   _fast.Hold       __enter__/__exit__, __aenter__/__aexit__, release(),
 *                    _acquire_async(): the base of SyncHold and AsyncHold.
 *   _fast.Attempt    one attempt (try, wait, cancel, the deadline, the
 *                    shared-thread rule) as an awaitable; Done, an awaitable
 *                    completed already.
 *
 * Its files: calls.c (the core's table, the timeout rule, kind names,
 * errors), attempt.c (THE attempt: the one loop of try, wait and cancel, for
 * blocking calls and for asyncio), awaitable.c (the attempt as an
 * awaitable, and Done), lock.c, alock.c, hold.c (the types), module.c
 * (setup() and the module).
 *
 * One copy of the core.  This module does not contain or link the core: the
 * core's code and its process-private state (fork handler, keeper thread,
 * mutexes) exist once per process, in the cffi module.  setup() receives
 * the addresses of the few shl_* entry points used here, taken from the
 * cffi module by pyshmlock/_fastpath.py, and every call goes through that
 * table.  A shl_lock * is a token (csrc/core/handles.c): never dereferenced
 * here, and a closed one answers SHL_ECLOSED.
 *
 * The path of a hold is docs/DESIGN.md §3, "The path of a hold"; in short:
 *   1. shl_try() with the GIL held.  Granted: return (True, the hold, or a
 *      completed awaitable).  No Python frame, no GIL release.
 *   2. Not granted (SHL_AGAIN): the attempt keeps its registrations (an
 *      owed-reader count or an exclusive claim).  A blocking call releases
 *      the GIL for the loop shl_wait / shl_try / shl_cancel (attempt.c); an
 *      asyncio attempt hands itself to the parking code (pyshmlock/_park.py)
 *      and retries when woken.  Both are the same attempt.
 *   3. SHL_EINTR (a signal, or a Ctrl-C seen between two sleeps; the attempt
 *      was withdrawn): PyErr_CheckSignals() runs the handlers, then the
 *      attempt starts again with the same deadline.
 *   4. Errors build their exception in Python (pyshmlock.errors.error_for)
 *      through a callback: the slow path may run Python code.
 *
 * Built for the stable ABI of CPython 3.9 (Py_LIMITED_API 0x03090000): one
 * abi3 binary for every CPython >= 3.9.  See METH_FASTCALL and am_send below.
 */
#ifndef PYSHMLOCK_FASTPATH_H
#define PYSHMLOCK_FASTPATH_H

#define Py_LIMITED_API 0x03090000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

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

/*
 * am_send (PyAsyncMethods.am_send, slot id Py_am_send = 81) is frozen in
 * the 3.10 stable ABI, with PySendResult.  An awaitable that has it is sent
 * a value without a StopIteration being made for its result.  The 3.9
 * headers lack both, so they are spelt here; module.c installs the slot
 * only when the running interpreter is 3.10 or later (3.9 would refuse an
 * unknown slot id), so one binary still serves 3.9 through tp_iternext.
 */
#define FP_AM_SEND 81
typedef enum { FP_SEND_RETURN = 0, FP_SEND_ERROR = -1, FP_SEND_NEXT = 1 } fp_send_result;

typedef PyObject *(*fastcall_kw)(PyObject *, PyObject *const *, Py_ssize_t, PyObject *);
typedef PyObject *(*fastcall)(PyObject *, PyObject *const *, Py_ssize_t);

/* Function pointers travel through void * in PyType_Slot; going through
 * uintptr_t keeps -Wpedantic quiet (POSIX guarantees the round trip). */
#define FN_SLOT(f) ((void *)(uintptr_t)(f))
#define FASTCALL_KW(f) (PyCFunction)(void (*)(void))(fastcall_kw)(f)
#define FASTCALL(f) (PyCFunction)(void (*)(void))(fastcall)(f)

#define KIND_MIN SHL_KIND_READ          /* the hold kinds */
#define KIND_MAX SHL_KIND_UPDATE
#define KIND_LAST SHL_KIND_UNPINNED     /* every kind of attempt */

typedef struct {
    PyObject_HEAD
    shl_lock *h;                /* the token; NULL: not bound yet, or closed */
    shl_lock *fh;               /* its handle, for the core's fast calls (shl_fast_handle):
                                   forgotten with the token when the close of the token
                                   is decided, before the GIL is let go (_fast.close) */
} LockObject;

/* One attempt of one kind on one lock: its waiter (the core's bookkeeping
 * of registrations), the deadline, and whether registrations may be held
 * (a try said SHL_AGAIN and nothing withdrew it since). */
typedef struct {
    shl_waiter w;
    shl_lock *h;                /* the token the attempt was begun on */
    const LockObject *lock;     /* the object it was begun by (kept alive by the caller):
                                   its handle for the fast calls, while still bound to h */
    int64_t deadline;           /* -1 forever, 0 try once, > 0 CLOCK_MONOTONIC ns, or < -1
                                   relative, made absolute when a try fails (calls.c) */
    int pending;                /* registrations may be held: shl_cancel owed */
    int err;                    /* errno of the failure, for SHL_ESYS */
    uint64_t fork_gen;          /* g_attempt_fork_gen when the waiter was begun */
} attempt_t;

#pragma GCC visibility push(hidden)

/* calls.c: the core's entry points (set by setup()) and the calls on them. */
struct core_table {
    int (*try_)(shl_lock *, shl_waiter *);
    /* The fast calls (shmlock.h: shl_fast_handle), made with the GIL held. */
    shl_lock *(*fast_handle)(shl_lock *);
    int (*fast_try)(shl_lock *, shl_waiter *);
    int (*fast_read)(shl_lock *);
    int (*fast_exclusive)(shl_lock *, int, shl_waiter *);
    int (*fast_release_read)(shl_lock *);
    int (*fast_release_exclusive)(shl_lock *, int);
    /* The same releases through the token (its in-flight count). */
    int (*release_read)(shl_lock *);
    int (*release_write)(shl_lock *);
    int (*release_update)(shl_lock *);
    int (*close_begin)(shl_lock *);
    void (*close_finish)(shl_lock *);
    int (*wait)(shl_lock *, shl_waiter *, int64_t);
    void (*cancel)(shl_lock *, shl_waiter *);
    int (*is_paused)(shl_lock *);
    int (*session_pin)(shl_lock *, int64_t, uint64_t *);
};
extern struct core_table core;
extern int g_ready;                   /* setup() done */
extern PyObject *g_error;             /* error(rc, what, name, errno) -> exception */

/* The one table of kind names (index: SHL_KIND_*). */
struct kind_names {
    const char *word;         /* "read": a hold's kind (NULL: not a hold) */
    const char *call;         /* "acquire_read", "resume": what a message calls it */
    const char *release;      /* "release_read" */
    const char *hold;         /* "read hold" */
};
extern const struct kind_names KIND[KIND_LAST + 1];

int64_t monotonic_ns(void);
int to_deadline(PyObject *timeout, int64_t *out);
int64_t deadline_now(int64_t deadline);
PyObject *timeout_arg(const char *fname, PyObject *const *args, Py_ssize_t nargs,
                      PyObject *kwnames);
extern PyObject *g_str_timeout;       /* "timeout", interned */

/* Any wait this long or longer is "forever": 2**62 ns is 146 years, and a
 * deadline of now + 2**62 ns cannot overflow int64 (CLOCK_MONOTONIC starts
 * near boot). */
#define FOREVER_S ((double)(1LL << 62) / 1e9)
/* A deadline `ns` from now, not made absolute yet (calls.c to_deadline). */
#define DEADLINE_IN(ns) (-2 - (ns))

void small_ints_ready(void);
int timeout_valid(PyObject *timeout);
/* The small ints 0..256 (calls.c, small_ints_ready): the address of the
 * first, and the span to the last (an empty range if not found). */
extern uintptr_t g_small_lo, g_small_span;
PyObject *call_timeout_arg(const char *what, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames);

/* The (timeout=None) of a METH_FASTCALL | METH_KEYWORDS method, checked
 * against the timeout rule but not converted (a bad one raises whether or
 * not the lock is free; to_deadline computes the deadline once a try has
 * failed): borrowed, or NULL with an exception set.  In line: the call
 * without one. */
static inline PyObject *call_timeout(const char *what, PyObject *const *args,
                                     Py_ssize_t nargs, PyObject *kwnames)
{
    if (kwnames == NULL) {
        if (nargs == 0)
            return Py_None;
        /* f(t), t a small int (valid by its address alone) or a float
         * >= 0 (NaN is not: the rule raises). */
        if (nargs == 1) {
            PyObject *t = args[0];
            if ((uintptr_t)t - g_small_lo <= g_small_span ||
                (PyFloat_CheckExact(t) && PyFloat_AsDouble(t) >= 0))
                return t;
        }
    }
    return call_timeout_arg(what, args, nargs, kwnames);
}
/* The timeout of a hold call (call_timeout's), before its first try: 1
 * deferred (None, an exact int or float: converted only once a try has
 * failed, which runs no Python code), 0 converted now into *deadline, or -1
 * with the rule's exception.  Any other object is converted now, while
 * nothing is registered: its conversion may run Python code (a __float__,
 * a Fraction's, a signal handler, the GC's finalisers), and no Python code
 * may run while an attempt holds a registration (attempt.c: a handler may
 * use the same lock, or close it). */
static inline int timeout_prepare(PyObject *t, int64_t *deadline)
{
    if (t == Py_None || PyFloat_CheckExact(t) || PyLong_CheckExact(t))
        return 1;
    return to_deadline(t, deadline) < 0 ? -1 : 0;
}
PyObject *raise_rc(int rc, const char *what, PyObject *name, int err);
int not_ready(void);
PyObject *lock_name(PyObject *self);
/* Releases never block: the GIL stays held from start to end, so the core's
 * calls without the in-flight count serve (shl_fast_release_*) while the
 * object has its handle (fh); without it (a close() deciding, or done) the
 * release goes through the token h, which a closed one refuses
 * (SHL_ECLOSED). */
static inline int release(shl_lock *fh, shl_lock *h, int kind)
{
    if (fh != NULL)
        return kind == SHL_KIND_READ ? core.fast_release_read(fh)
                                     : core.fast_release_exclusive(fh, kind);
    return kind == SHL_KIND_READ    ? core.release_read(h)
           : kind == SHL_KIND_WRITE ? core.release_write(h)
                                    : core.release_update(h);
}
/* The handle for an attempt's fast calls: its object's, while that object
 * is still bound to the attempt's token (else NULL: through the token). */
static inline shl_lock *attempt_fast_handle(const attempt_t *a)
{
    return a->lock != NULL && a->lock->h == a->h ? a->lock->fh : NULL;
}
/* lock.c: release `kind` of a _fast.Lock, raising the error it gives (None) */
PyObject *lock_release(PyObject *lock, int kind);
PyObject *kind_table(void);

/* attempt.c: the attempt; awaitable.c: the attempt as an awaitable. */
void attempt_init(attempt_t *a, const LockObject *lock, int kind, uint32_t flags,
                  int64_t deadline, int shared);
int attempt_try(attempt_t *a);
int attempt_try_held(attempt_t *a);
int attempt_fork_ready(void);
PyObject *session_pin_held(PyObject *lock, shl_lock *h, int64_t ttl_ns);
PyObject *attempt_new_session(PyObject *lock, int64_t deadline, int64_t ttl_ns);
int attempt_past(attempt_t *a);
void attempt_cancel(attempt_t *a);
void attempt_rekind(attempt_t *a, int kind);
int attempt_block(PyObject *lock, int kind, uint32_t flags, int64_t deadline,
                  const char *what);
int attempt_block_on(PyObject *lock, int kind, uint32_t flags, int64_t deadline,
                     const char *what, shl_lock **on);
int attempt_block_from(PyObject *lock, int kind, uint32_t flags, int64_t deadline,
                       const char *what, const shl_waiter *first);
int attempt_block_timeout(PyObject *lock, int kind, PyObject *timeout, int64_t deadline,
                          const char *what, int first, shl_waiter *w);

/*
 * The first try of a blocking attempt, with the GIL held, through the
 * core's fast calls, so that a hold granted at once sets no attempt up
 * (the uncontended path).  1 had; 0 must wait, *w holding what the try
 * left (an exclusive claim: the attempt goes on from it, attempt_block_from);
 * -1 nothing left behind (not a hold; a read that must wait backs out; an
 * error is withdrawn): the attempt starts afresh and meets the same answer.
 */
static inline int first_try(const LockObject *lo, int kind, shl_waiter *w)
{
    if (lo->fh == NULL)
        return -1;              /* (the attempt goes through the token) */
    if (kind == SHL_KIND_READ)
        return core.fast_read(lo->fh) == SHL_OK ? 1 : -1;
    if (kind != SHL_KIND_WRITE && kind != SHL_KIND_UPDATE)
        return -1;
    int r = core.fast_exclusive(lo->fh, kind, w);
    return r == SHL_OK ? 1 : r == SHL_AGAIN ? 0 : -1;
}
PyObject *attempt_new(PyObject *lock, PyObject *hold, int kind, uint32_t flags,
                      int64_t deadline, int now, const char *what);
PyObject *done_new(PyObject *result);
extern PyObject *g_done_none, *g_done_true;   /* awaitables completed with None, True */
extern PyObject *g_park, *g_unpark;   /* pyshmlock/_park.py's park(a) and unpark(a) */
extern PyType_Spec attempt_spec, done_spec;
extern PyTypeObject *AttemptType, *DoneType;
int awaitables_ready(int have_am_send);

/* lock.c, alock.c, hold.c: the types, made by module.c. */
extern PyType_Spec lock_spec;
extern PyType_Spec alock_spec;
extern PyType_Spec hold_spec;
extern PyTypeObject *LockType;
extern PyTypeObject *AsyncLockType;
extern PyTypeObject *HoldType;
int hold_install_kept(void);          /* after HoldType exists */
PyObject *hold_done(PyObject *hold);  /* the hold's completed __aenter__ awaitable */
void hold_timeout_error(PyObject *hold);

#pragma GCC visibility pop

#endif /* PYSHMLOCK_FASTPATH_H */
