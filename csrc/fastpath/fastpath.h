/*
 * fastpath.h - pyshmlock._fast: the uncontended hold calls, straight from
 * Python into C.  What its files share.
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
 * Its files: calls.c (calling the core: deadlines, errors, the wait loop),
 * lock.c (the Lock type), hold.c (the Hold type), module.c (setup() and
 * the module).
 *
 * One copy of the core.  This module does not contain or link the core: the
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

typedef PyObject *(*fastcall_kw)(PyObject *, PyObject *const *, Py_ssize_t, PyObject *);
typedef PyObject *(*fastcall)(PyObject *, PyObject *const *, Py_ssize_t);

/* Function pointers travel through void * in PyType_Slot; going through
 * uintptr_t keeps -Wpedantic quiet (POSIX guarantees the round trip). */
#define FN_SLOT(f) ((void *)(uintptr_t)(f))
#define FASTCALL_KW(f) (PyCFunction)(void (*)(void))(fastcall_kw)(f)
#define FASTCALL(f) (PyCFunction)(void (*)(void))(fastcall)(f)

#define KIND_MIN SHL_KIND_READ
#define KIND_MAX SHL_KIND_UPDATE

typedef struct {
    PyObject_HEAD
    shl_lock *h;                /* NULL: not bound yet, or closed */
} LockObject;

#pragma GCC visibility push(hidden)

/* calls.c: the core's entry points (set by setup()) and the calls on them. */
struct core_table {
    int (*try_)(shl_lock *, shl_waiter *);
    int (*wait)(shl_lock *, shl_waiter *, int64_t);
    void (*cancel)(shl_lock *, shl_waiter *);
    int (*release_read)(shl_lock *);
    int (*release_write)(shl_lock *);
    int (*release_update)(shl_lock *);
    int (*is_paused)(shl_lock *);
};
extern struct core_table core;
extern int g_ready;                   /* setup() done */
extern PyObject *g_deadline_ns;       /* lock.deadline_ns: the rule for edge cases */
extern PyObject *g_error;             /* error(rc, what, name, errno) -> exception */
extern const char *const ACQUIRE_NAME[];
extern const char *const RELEASE_NAME[];
extern const char *const HOLD_NAME[];
int to_deadline(PyObject *timeout, int64_t *out);
PyObject *raise_rc(int rc, const char *what, PyObject *name, int err);
int not_ready(void);
PyObject *lock_name(PyObject *self);
int acquire(LockObject *lk, int kind, int64_t deadline, const char *what);
int release(shl_lock *h, int kind);

/* lock.c, hold.c: the types, made by module.c. */
extern PyType_Spec lock_spec;
extern PyType_Spec hold_spec;
extern PyTypeObject *LockType;
extern PyTypeObject *HoldType;
int hold_install_kept(void);          /* after HoldType exists */

#pragma GCC visibility pop

#endif /* PYSHMLOCK_FASTPATH_H */
