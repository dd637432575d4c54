/*
 * lock.c - _fast.Lock, the base type of pyshmlock.RWLock: acquire_read/
 * write/update(timeout=None), wait_resumed/wait_drained(timeout=None) and
 * _attempt_block(kind, deadline, flags) as METH_FASTCALL methods (blocking
 * attempts, attempt.c), the releases, and the `paused` property.
 */
#include "fastpath.h"

#include <errno.h>

PyTypeObject *LockType;

/* A blocking attempt of `kind` with (timeout=None): True, or False on timeout. */
static PyObject *lock_wait_kind(PyObject *self, int kind, PyObject *const *args,
                                Py_ssize_t nargs, PyObject *kwnames)
{
    const char *what = KIND[kind].call;
    int64_t deadline;
    PyObject *timeout = call_timeout(what, args, nargs, kwnames);
    if (timeout == NULL || to_deadline(timeout, &deadline) < 0)
        return NULL;
    int r = attempt_block(self, kind, 0, deadline, what);
    if (r < 0)
        return NULL;
    return PyBool_FromLong(r);
}

static PyObject *lock_wait_resumed(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                   PyObject *kwnames)
{
    return lock_wait_kind(self, SHL_KIND_RESUMED, args, nargs, kwnames);
}

static PyObject *lock_wait_drained(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                   PyObject *kwnames)
{
    return lock_wait_kind(self, SHL_KIND_DRAINED, args, nargs, kwnames);
}

/* _begin_session_block(deadline, ttl_ns): begin_session whole, as one
 * blocking attempt until the deadline: wait until no session pins the
 * pause, take the update hold, then at once (in C: no Python code in
 * between) pin the pause and release the hold (session_pin_held).  Another
 * session that pins between the wait and the pin sends it back to the wait.
 * The token, or False if not begun by the deadline. */
static PyObject *lock_begin_session_block(PyObject *self, PyObject *const *args,
                                          Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_begin_session_block(deadline, ttl_ns)");
        return NULL;
    }
    long long deadline = PyLong_AsLongLong(args[0]);
    long long ttl_ns = PyLong_AsLongLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    for (;;) {
        shl_lock *on = NULL;    /* the handle the update is granted on (session_pin_held) */
        int r = attempt_block(self, SHL_KIND_UNPINNED, 0, (int64_t)deadline, "begin_session");
        if (r == 1)
            r = attempt_block_on(self, SHL_KIND_UPDATE, 0, (int64_t)deadline, "begin_session",
                                 &on);
        if (r < 0)
            return NULL;
        if (r == 0)
            Py_RETURN_FALSE;
        PyObject *token = session_pin_held(self, on, (int64_t)ttl_ns);
        if (token != Py_None)
            return token;       /* the token, or NULL with the exception set */
        Py_DECREF(token);
    }
}

/* _attempt_block(kind, deadline, flags=0) -> bool: the blocking attempt of
 * any kind, until an absolute deadline (from deadline_ns), for the calls
 * Python composes (resume). */
static PyObject *lock_attempt_block(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 2 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "_attempt_block(kind, deadline, flags=0)");
        return NULL;
    }
    long kind = PyLong_AsLong(args[0]);
    long long deadline = PyLong_AsLongLong(args[1]);
    unsigned long flags = nargs > 2 ? PyLong_AsUnsignedLong(args[2]) : 0;
    if (PyErr_Occurred())
        return NULL;
    if (kind < KIND_MIN || kind > KIND_LAST) {
        PyErr_Format(PyExc_ValueError, "unknown kind %ld", kind);
        return NULL;
    }
    int r = attempt_block(self, (int)kind, (uint32_t)flags, (int64_t)deadline,
                          KIND[kind].call);
    if (r < 0)
        return NULL;
    return PyBool_FromLong(r);
}

/* acquire_read/write/update(timeout=None): the first try through the
 * core's fast calls, in line here (a hold granted at once sets up no
 * attempt and reads no clock); the attempt only if that must wait. */
static inline __attribute__((always_inline)) PyObject *lock_acquire(PyObject *self, int kind, PyObject *const *args,
                                     Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *timeout = call_timeout(KIND[kind].call, args, nargs, kwnames);
    if (timeout == NULL)
        return NULL;
    int64_t deadline = 0;
    int deferred = timeout_prepare(timeout, &deadline);
    if (deferred < 0)
        return NULL;
    shl_waiter w;
    int r = first_try((const LockObject *)self, kind, &w);
    if (r == 1)
        Py_RETURN_TRUE;
    r = attempt_block_timeout(self, kind, deferred ? timeout : NULL, deadline, KIND[kind].call,
                              r, &w);
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

/* Release `kind` (fastpath.h release: one call of the core's), the error
 * raised on the slow path. */
static PyObject *release_failed(PyObject *self, int kind, int r)
{
    int err = errno;
    PyObject *name = lock_name(self);
    raise_rc(r, KIND[kind].release, name, err);
    Py_XDECREF(name);
    return NULL;
}

static inline PyObject *lock_release_kind(PyObject *self, int kind)
{
    const LockObject *lo = (const LockObject *)self;
    int r = release(lo->fh, lo->h, kind);
    if (r == 0)
        Py_RETURN_NONE;
    return release_failed(self, kind, r);
}

PyObject *lock_release(PyObject *self, int kind)
{
    return lock_release_kind(self, kind);
}

static PyObject *lock_release_read(PyObject *self, PyObject *unused)
{
    (void)unused;
    return lock_release_kind(self, SHL_KIND_READ);
}

static PyObject *lock_release_write(PyObject *self, PyObject *unused)
{
    (void)unused;
    return lock_release_kind(self, SHL_KIND_WRITE);
}

static PyObject *lock_release_update(PyObject *self, PyObject *unused)
{
    (void)unused;
    return lock_release_kind(self, SHL_KIND_UPDATE);
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

/* _fast_bind(address): the shl_lock * (token) this object uses, and its
 * handle for the fast calls; 0 before the token is closed. */
static PyObject *lock_bind(PyObject *self, PyObject *addr)
{
    void *p = PyLong_AsVoidPtr(addr);
    if (p == NULL && PyErr_Occurred())
        return NULL;
    if (p != NULL && !g_ready)
        return not_ready(), NULL;
    LockObject *lo = (LockObject *)self;
    lo->h = (shl_lock *)p;
    lo->fh = p != NULL ? core.fast_handle(lo->h) : NULL;
    Py_RETURN_NONE;
}

static void lock_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    freefunc free_fn = (freefunc)(uintptr_t)PyType_GetSlot(tp, Py_tp_free);
    free_fn(self);
    Py_DECREF(tp);   /* heap-type instances own a reference to their type */
}

static PyMethodDef lock_methods[] = {
    {"acquire_read", FASTCALL_KW(lock_acquire_read), METH_FASTCALL | METH_KEYWORDS,
     "acquire_read($self, /, timeout=None)\n--\n\nTake a shared hold.  Waits while the lock "
     "is paused, or while a writer\nholds it or queued before this reader."},
    {"release_read", lock_release_read, METH_NOARGS,
     "release_read($self, /)\n--\n\nGive back one read hold of this process (RuntimeError if none)."},
    {"acquire_write", FASTCALL_KW(lock_acquire_write), METH_FASTCALL | METH_KEYWORDS,
     "acquire_write($self, /, timeout=None)\n--\n\nTake the exclusive hold: blocks new readers "
     "at once, then waits for\nevery read hold in every process, paused or not."},
    {"release_write", lock_release_write, METH_NOARGS,
     "release_write($self, /)\n--\n\nGive back this process's write hold (RuntimeError if none)."},
    {"acquire_update", FASTCALL_KW(lock_acquire_update), METH_FASTCALL | METH_KEYWORDS,
     "acquire_update($self, /, timeout=None)\n--\n\nTake the pause-aware exclusive hold.\n\n"
     "Exclusive against every write or update hold.  If the lock is paused\nit does not "
     "wait for readers (the pause froze them) and it pins the\npause: resume() waits until "
     "the update is released.  If not paused\nit waits for readers like a writer, and "
     "proceeds at once if a pause\narrives while it waits."},
    {"release_update", lock_release_update, METH_NOARGS,
     "release_update($self, /)\n--\n\nGive back this process's update hold (RuntimeError if none)."},
    {"wait_resumed", FASTCALL_KW(lock_wait_resumed), METH_FASTCALL | METH_KEYWORDS,
     "wait_resumed($self, /, timeout=None)\n--\n\nWait until the lock is not paused; False on "
     "timeout."},
    {"wait_drained", FASTCALL_KW(lock_wait_drained), METH_FASTCALL | METH_KEYWORDS,
     "wait_drained($self, /, timeout=None)\n--\n\nWait until no read hold exists in any process; "
     "False on timeout."},
    {"_begin_session_block", FASTCALL(lock_begin_session_block), METH_FASTCALL,
     "_begin_session_block($self, deadline, ttl_ns, /)\n--\n\nbegin_session whole: a token, or False on timeout."},
    {"_attempt_block", FASTCALL(lock_attempt_block), METH_FASTCALL,
     "_attempt_block($self, kind, deadline, flags=0, /)\n--\n\nA blocking attempt of any kind: a bool."},
    {"_fast_bind", lock_bind, METH_O,
     "_fast_bind($self, address, /)\n--\n\nThe shl_lock * the fast methods use (0: closed)."},

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

PyType_Spec lock_spec = {
    "pyshmlock._fast.Lock", sizeof(LockObject), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE, lock_slots,
};
