/*
 * alock.c - _fast.AsyncLock, the base type of pyshmlock.AsyncRWLock:
 * acquire_read/write/update(timeout=None) as METH_FASTCALL methods that
 * return an attempt (attempt.c), an awaitable that tries when first awaited
 * and parks only when it must wait; and _attempt(kind, deadline, flags,
 * now), the same for the waits Python composes; and the releases.  It works on the RWLock it
 * is bound to (_bind), whose handle it reads at every call.
 */
#include "fastpath.h"

#include <stddef.h>
#include <structmember.h>

PyTypeObject *AsyncLockType;

typedef struct {
    PyObject_HEAD
    PyObject *lock;             /* the RWLock (a _fast.Lock), or NULL before _bind */
} AsyncLockObject;

static PyObject *bound_lock(PyObject *self)
{
    PyObject *lock = ((AsyncLockObject *)self)->lock;
    if (lock == NULL)
        PyErr_SetString(PyExc_TypeError, "AsyncRWLock not initialised");
    return lock;
}

static PyObject *alock_acquire(PyObject *self, int kind, PyObject *const *args,
                               Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *lock = bound_lock(self);
    if (lock == NULL)
        return NULL;
    const char *what = KIND[kind].call;
    int64_t deadline;
    PyObject *timeout = call_timeout(what, args, nargs, kwnames);
    if (timeout == NULL || to_deadline(timeout, &deadline) < 0)
        return NULL;
    return attempt_new(lock, NULL, kind, 0, deadline, 0, what);
}

static PyObject *alock_acquire_read(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                    PyObject *kwnames)
{
    return alock_acquire(self, SHL_KIND_READ, args, nargs, kwnames);
}

static PyObject *alock_acquire_write(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                     PyObject *kwnames)
{
    return alock_acquire(self, SHL_KIND_WRITE, args, nargs, kwnames);
}

static PyObject *alock_acquire_update(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                      PyObject *kwnames)
{
    return alock_acquire(self, SHL_KIND_UPDATE, args, nargs, kwnames);
}

/* Releases never wait: RWLock's own release. */
static PyObject *alock_release(PyObject *self, int kind)
{
    PyObject *lock = bound_lock(self);
    return lock == NULL ? NULL : lock_release(lock, kind);
}

static PyObject *alock_release_read(PyObject *self, PyObject *unused)
{
    (void)unused;
    return alock_release(self, SHL_KIND_READ);
}

static PyObject *alock_release_write(PyObject *self, PyObject *unused)
{
    (void)unused;
    return alock_release(self, SHL_KIND_WRITE);
}

static PyObject *alock_release_update(PyObject *self, PyObject *unused)
{
    (void)unused;
    return alock_release(self, SHL_KIND_UPDATE);
}

/* _attempt(kind, deadline, flags=0, now=False): an attempt of any kind
 * until an absolute deadline (from deadline_ns).  now: try during this call
 * (granted: an awaitable completed with True). */
static PyObject *alock_attempt(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *lock = bound_lock(self);
    if (lock == NULL)
        return NULL;
    if (nargs < 2 || nargs > 4) {
        PyErr_SetString(PyExc_TypeError, "_attempt(kind, deadline, flags=0, now=False)");
        return NULL;
    }
    long kind = PyLong_AsLong(args[0]);
    long long deadline = PyLong_AsLongLong(args[1]);
    unsigned long flags = nargs > 2 ? PyLong_AsUnsignedLong(args[2]) : 0;
    int now = nargs > 3 ? PyObject_IsTrue(args[3]) : 0;
    if (PyErr_Occurred())
        return NULL;
    if (kind < KIND_MIN || kind > KIND_LAST) {
        PyErr_Format(PyExc_ValueError, "unknown kind %ld", kind);
        return NULL;
    }
    return attempt_new(lock, NULL, (int)kind, (uint32_t)flags, (int64_t)deadline, now,
                       KIND[kind].call);
}

/* _begin_session_attempt(deadline, ttl_ns): begin_session whole as one
 * awaitable (attempt_new_session): its result is the token, or False if not
 * begun by the deadline. */
static PyObject *alock_begin_session_attempt(PyObject *self, PyObject *const *args,
                                             Py_ssize_t nargs)
{
    PyObject *lock = bound_lock(self);
    if (lock == NULL)
        return NULL;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_begin_session_attempt(deadline, ttl_ns)");
        return NULL;
    }
    long long deadline = PyLong_AsLongLong(args[0]);
    long long ttl_ns = PyLong_AsLongLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    return attempt_new_session(lock, (int64_t)deadline, (int64_t)ttl_ns);
}

/* _bind(lock): the RWLock this object works on. */
static PyObject *alock_bind(PyObject *self, PyObject *lock)
{
    if (!PyObject_TypeCheck(lock, LockType)) {
        PyErr_SetString(PyExc_TypeError, "an AsyncRWLock needs a pyshmlock.RWLock");
        return NULL;
    }
    AsyncLockObject *al = (AsyncLockObject *)self;
    PyObject *old = al->lock;
    Py_INCREF(lock);
    al->lock = lock;
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

static int alock_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(((AsyncLockObject *)self)->lock);
    return 0;
}

static int alock_clear(PyObject *self)
{
    Py_CLEAR(((AsyncLockObject *)self)->lock);
    return 0;
}

static void alock_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    alock_clear(self);
    freefunc free_fn = (freefunc)(uintptr_t)PyType_GetSlot(tp, Py_tp_free);
    free_fn(self);
    Py_DECREF(tp);
}

static PyMethodDef alock_methods[] = {
    {"acquire_read", FASTCALL_KW(alock_acquire_read), METH_FASTCALL | METH_KEYWORDS,
     "acquire_read($self, /, timeout=None)\n--\n\nAn awaitable of bool.  Take a shared hold without "
     "blocking the event loop; False on timeout\n(see RWLock.acquire_read)."},
    {"acquire_write", FASTCALL_KW(alock_acquire_write), METH_FASTCALL | METH_KEYWORDS,
     "acquire_write($self, /, timeout=None)\n--\n\nAn awaitable of bool.  Take the exclusive hold; False "
     "on timeout (see RWLock.acquire_write)."},
    {"acquire_update", FASTCALL_KW(alock_acquire_update), METH_FASTCALL | METH_KEYWORDS,
     "acquire_update($self, /, timeout=None)\n--\n\nAn awaitable of bool.  Take the pause-aware exclusive "
     "hold (see RWLock.acquire_update)."},
    {"release_read", alock_release_read, METH_NOARGS,
     "release_read($self, /)\n--\n\nGive back one read hold of this process (RuntimeError if none)."},
    {"release_write", alock_release_write, METH_NOARGS,
     "release_write($self, /)\n--\n\nGive back this process's write hold (RuntimeError if none)."},
    {"release_update", alock_release_update, METH_NOARGS,
     "release_update($self, /)\n--\n\nGive back this process's update hold (RuntimeError if none)."},
    {"_attempt", FASTCALL(alock_attempt), METH_FASTCALL,
     "_attempt($self, kind, deadline, flags=0, now=False, /)\n--\n\nAn awaitable of bool."},
    {"_begin_session_attempt", FASTCALL(alock_begin_session_attempt), METH_FASTCALL,
     "_begin_session_attempt($self, deadline, ttl_ns, /)\n--\n\nbegin_session whole: an awaitable of a token, or False on timeout."},
    {"_bind", alock_bind, METH_O, "_bind($self, lock, /)\n--\n\nThe RWLock this object works on."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef alock_members[] = {
    {"_lock", T_OBJECT, offsetof(AsyncLockObject, lock), READONLY, "the RWLock"},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot alock_slots[] = {
    {Py_tp_doc, (void *)"Base type of pyshmlock.AsyncRWLock: the hold calls in C."},
    {Py_tp_methods, alock_methods},
    {Py_tp_members, alock_members},
    {Py_tp_traverse, FN_SLOT(alock_traverse)},
    {Py_tp_clear, FN_SLOT(alock_clear)},
    {Py_tp_dealloc, FN_SLOT(alock_dealloc)},
    {Py_tp_new, FN_SLOT(PyType_GenericNew)},
    {0, NULL},
};

PyType_Spec alock_spec = {
    "pyshmlock._fast.AsyncLock", sizeof(AsyncLockObject), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, alock_slots,
};
