/*
 * hold.c - _fast.Hold, the base type of the hold objects (SyncHold and
 * AsyncHold: reader_lock, read(timeout=...), ...): __enter__/__exit__ and
 * __aenter__/__aexit__ in C, release(), and the bound methods (and the
 * completed awaitable) a lock's long-lived holds keep, so that `with
 * lock.reader_lock:` and a granted `async with alock.reader_lock:` allocate
 * nothing.
 */
#include "fastpath.h"

#include <errno.h>
#include <stddef.h>
#include <structmember.h>

PyTypeObject *HoldType;

/* The methods whose bound objects a hold may keep (see "Bound methods
 * kept" below), as indexes into HoldObject.bound and hold_methods. */
#define BOUND_ENTER 0
#define BOUND_EXIT 1
#define BOUND_AENTER 2
#define BOUND_AEXIT 3
#define NBOUND 4

typedef struct {
    PyObject_HEAD
    PyObject *lock;             /* a _fast.Lock (an RWLock) */
    PyObject *timeout;          /* None or the timeout given */
    int kind;                   /* SHL_KIND_READ / WRITE / UPDATE */
    PyObject *bound[NBOUND];    /* kept bound methods, or NULL */
    PyObject *done;             /* kept: an awaitable completed with this hold, or NULL */
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

/* TimeoutError "read hold of lock 'x' not had within 5 s". */
void hold_timeout_error(PyObject *hold)
{
    HoldObject *ho = (HoldObject *)hold;
    PyObject *name = lock_name(ho->lock);
    if (name == NULL)
        return;
    PyErr_Format(PyExc_TimeoutError, "%s of lock %R not had within %S s", KIND[ho->kind].hold,
                 name, ho->timeout);
    Py_DECREF(name);
}

/* The awaitable a granted `async with` returns: kept, or made now. */
PyObject *hold_done(PyObject *hold)
{
    PyObject *d = ((HoldObject *)hold)->done;
    if (d != NULL) {
        Py_INCREF(d);
        return d;
    }
    return done_new(hold);
}

static int hold_ready(HoldObject *ho)
{
    if (ho->lock == NULL) {
        PyErr_SetString(PyExc_TypeError, "hold not initialised");
        return -1;
    }
    return 0;
}

static PyObject *hold_enter(PyObject *self, PyObject *unused)
{
    (void)unused;
    HoldObject *ho = (HoldObject *)self;
    if (hold_ready(ho) < 0)
        return NULL;
    /* Own references for the whole call: the GIL is released while we wait
     * and Python code may run (signal handlers), so another thread may
     * re-initialise this hold and drop the last reference to the lock or
     * timeout it had. */
    PyObject *lock = ho->lock, *timeout = ho->timeout;
    int kind = ho->kind;
    Py_INCREF(lock);
    Py_INCREF(timeout);
    PyObject *result = NULL;
    int64_t deadline = 0;
    int deferred = timeout == Py_None ? 1 : timeout_valid(timeout) < 0
                                              ? -1 : timeout_prepare(timeout, &deadline);
    if (deferred < 0)
        goto done;
    shl_waiter w;
    int r = first_try((const LockObject *)lock, kind, &w);
    if (r != 1)
        r = attempt_block_timeout(lock, kind, deferred ? timeout : NULL, deadline,
                                  KIND[kind].hold, r, &w);
    if (r < 0)
        goto done;
    if (r == 0) {
        hold_timeout_error(self);
        goto done;
    }
    Py_INCREF(self);
    result = self;
done:
    Py_DECREF(lock);
    Py_DECREF(timeout);
    return result;
}

/* `async with hold:` tries at once (on the loop thread); granted, it returns
 * the completed awaitable (the hold's own, kept), otherwise the attempt, its
 * registrations kept, which parks when awaited. */
static PyObject *hold_aenter(PyObject *self, PyObject *unused)
{
    (void)unused;
    HoldObject *ho = (HoldObject *)self;
    if (hold_ready(ho) < 0)
        return NULL;
    int64_t deadline;
    if (to_deadline(ho->timeout, &deadline) < 0)
        return NULL;
    return attempt_new(ho->lock, self, ho->kind, 0, deadline, 1, KIND[ho->kind].hold);
}

/* hold._acquire_async(timeout=None): asyncio.Lock's acquire(), an awaitable
 * of True (had) or False (timed out) that tries when first awaited. */
static PyObject *hold_acquire_async(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                    PyObject *kwnames)
{
    HoldObject *ho = (HoldObject *)self;
    if (hold_ready(ho) < 0)
        return NULL;
    int64_t deadline;
    PyObject *timeout = call_timeout("acquire", args, nargs, kwnames);
    if (timeout == NULL || to_deadline(timeout, &deadline) < 0)
        return NULL;
    return attempt_new(ho->lock, NULL, ho->kind, 0, deadline, 0, KIND[ho->kind].call);
}

/* Give the hold back; 0, or -1 with the error raised. */
static int hold_give_back(HoldObject *ho)
{
    if (!g_ready)
        return not_ready();
    if (hold_ready(ho) < 0)
        return -1;
    int kind = ho->kind;
    const LockObject *lo = (const LockObject *)ho->lock;
    int r = release(lo->fh, lo->h, kind);
    if (r == 0)
        return 0;
    int err = errno;
    if (r == SHL_ECLOSED) {
        /* Another thread closed the lock object inside the block.  The hold
         * is the process's: RWLock._release_closed gives it back through
         * the attachment the process's other objects keep open (the slow
         * path, in Python: the registry lock keeps a last close away). */
        PyObject *lock = ho->lock;
        Py_INCREF(lock);
        PyObject *done = PyObject_CallMethod(lock, "_release_closed", "i", kind);
        Py_DECREF(lock);
        if (done == NULL)
            return -1;
        int given_back = PyObject_IsTrue(done);
        Py_DECREF(done);
        if (given_back != 0)
            return given_back > 0 ? 0 : -1;
    }
    PyObject *what = PyUnicode_FromFormat("release of %s", KIND[kind].hold);
    if (what == NULL)
        return -1;
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
    return -1;
}

static PyObject *hold_exit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)args;
    (void)nargs;
    if (hold_give_back((HoldObject *)self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *hold_release(PyObject *self, PyObject *unused)
{
    (void)unused;
    if (hold_give_back((HoldObject *)self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* Releases never wait: __aexit__ gives the hold back at once and returns an
 * awaitable completed with None (one for every hold). */
static PyObject *hold_aexit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)args;
    (void)nargs;
    if (hold_give_back((HoldObject *)self) < 0)
        return NULL;
    Py_INCREF(g_done_none);
    return g_done_none;
}

static PyObject *hold_get_lock(PyObject *self, void *closure)
{
    (void)closure;
    PyObject *l = ((HoldObject *)self)->lock;
    l = l ? l : Py_None;
    Py_INCREF(l);
    return l;
}

static PyObject *hold_get_kind(PyObject *self, void *closure)
{
    (void)closure;
    HoldObject *ho = (HoldObject *)self;
    if (hold_ready(ho) < 0)
        return NULL;
    return PyUnicode_FromString(KIND[ho->kind].word);
}

static PyObject *hold_get_what(PyObject *self, void *closure)
{
    (void)closure;
    HoldObject *ho = (HoldObject *)self;
    if (hold_ready(ho) < 0)
        return NULL;
    return PyUnicode_FromString(KIND[ho->kind].hold);
}

static PyObject *hold_get_timeout(PyObject *self, void *closure)
{
    (void)closure;
    PyObject *t = ((HoldObject *)self)->timeout;
    t = t ? t : Py_None;
    Py_INCREF(t);
    return t;
}

static int hold_traverse(PyObject *self, visitproc visit, void *arg)
{
    HoldObject *ho = (HoldObject *)self;
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(ho->lock);
    Py_VISIT(ho->timeout);
    for (int i = 0; i < NBOUND; i++)
        Py_VISIT(ho->bound[i]);
    Py_VISIT(ho->done);
    return 0;
}

static int hold_clear(PyObject *self)
{
    HoldObject *ho = (HoldObject *)self;
    Py_CLEAR(ho->lock);
    Py_CLEAR(ho->timeout);
    for (int i = 0; i < NBOUND; i++)
        Py_CLEAR(ho->bound[i]);
    Py_CLEAR(ho->done);
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
    /* BOUND_ENTER .. BOUND_AEXIT index these four entries. */
    {"__enter__", hold_enter, METH_NOARGS, "__enter__($self, /)\n--\n\nTake the hold (TimeoutError if not had in time)."},
    {"__exit__", FASTCALL(hold_exit), METH_FASTCALL,
     "__exit__($self, /, *exc_info)\n--\n\nGive the hold back."},
    {"__aenter__", hold_aenter, METH_NOARGS,
     "__aenter__($self, /)\n--\n\nTake the hold without blocking the event loop: an awaitable of the hold\n"
     "(TimeoutError if not had in time).  Tried at once; it parks only if it\n"
     "must wait."},
    {"__aexit__", FASTCALL(hold_aexit), METH_FASTCALL,
     "__aexit__($self, /, *exc_info)\n--\n\nGive the hold back (at once); an awaitable of None."},
    {"release", hold_release, METH_NOARGS,
     "release($self, /)\n--\n\nGive the hold back (NotHeldError, a RuntimeError, if this process\n"
     "has none)."},
    {"_acquire_async", FASTCALL_KW(hold_acquire_async), METH_FASTCALL | METH_KEYWORDS,
     "_acquire_async($self, /, timeout=None)\n--\n\nAn awaitable of True once had, False on timeout."},
    {"acquire", FASTCALL_KW(hold_acquire_async), METH_FASTCALL | METH_KEYWORDS,
     "acquire($self, /, timeout=None)\n--\n\nTake the hold without blocking the event loop: an awaitable of True\n"
     "once had, False on timeout (None waits forever).  SyncHold has its own,\n"
     "shaped like threading.Lock's."},
    {"_keep_bound", hold_keep_bound, METH_NOARGS,
     "_keep_bound($self, /)\n--\n\nKeep this hold's bound __enter__/__exit__/__aenter__/__aexit__ and its\n"
     "completed awaitable for every `with` (for the long-lived holds of a lock:\n"
     "they form a reference cycle)."},
    {NULL, NULL, 0, NULL},
};

/* ---------------------------------------------------- Bound methods kept
 *
 * `with hold:` looks up hold.__enter__ and hold.__exit__ through their
 * descriptors (`async with`: __aenter__ and __aexit__), and on CPython
 * before 3.14 each lookup allocates a bound builtin method (a GC-tracked
 * object, tracked and freed again at the end of the block): two
 * allocations that cost about as much as the hold itself.  The long-lived
 * holds (lock.reader_lock, writer_lock, update_lock: RWLock.__init__ and
 * AsyncRWLock.__init__ call _keep_bound()) make those four bound objects
 * once and keep them; a small descriptor, installed in place of the four
 * method descriptors, hands out the kept object.  They keep one more
 * object: the completed awaitable a granted `async with` returns (its
 * result is the hold).
 *
 * Nothing visible changes: the kept object is what the method descriptor
 * would have made (PyCFunction_NewEx of the same PyMethodDef with the hold
 * as self, as CPython's method_get does for a method without METH_METHOD),
 * holds without kept objects (lock.read(timeout=...)) get a fresh one as
 * before, and class access (Hold.__enter__) still returns the method
 * descriptor.  The kept objects refer back to the hold: a cycle, collected
 * by the GC (hold_traverse/hold_clear see them); these holds are in a cycle
 * with their lock already (lock.reader_lock.lock is lock). */

typedef struct {
    PyObject_HEAD
    PyObject *descr;            /* the method descriptor it replaces (owned) */
    int which;                  /* BOUND_ENTER .. BOUND_AEXIT */
} KeptDescrObject;

static PyTypeObject *KeptDescrType;

static PyObject *hold_keep_bound(PyObject *self, PyObject *unused)
{
    (void)unused;
    HoldObject *ho = (HoldObject *)self;
    if (ho->done == NULL) {
        PyObject *d = done_new(self);
        if (d == NULL)
            return NULL;
        if (ho->done == NULL)   /* (the allocation may run another thread) */
            ho->done = d;
        else
            Py_DECREF(d);
    }
    for (int i = 0; i < NBOUND; i++) {
        if (ho->bound[i] != NULL)
            continue;
        PyObject *b = PyCFunction_NewEx(&hold_methods[i], self, NULL);
        if (b == NULL)
            return NULL;
        /* The allocation may run the GC and with it another thread, which
         * may have kept one meanwhile: keep the first, drop ours. */
        if (ho->bound[i] == NULL)
            ho->bound[i] = b;
        else
            Py_DECREF(b);
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

/* Only install_kept makes these (Py_TPFLAGS_DISALLOW_INSTANTIATION needs
 * 3.10; the build targets the 3.9 stable ABI). */
static PyObject *kept_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    (void)type;
    (void)args;
    (void)kwds;
    PyErr_SetString(PyExc_TypeError, "cannot create 'pyshmlock._fast._KeptMethod' instances");
    return NULL;
}

static PyType_Slot kept_slots[] = {
    {Py_tp_doc, (void *)"A method of pyshmlock._fast.Hold whose bound object a hold may keep."},
    {Py_tp_new, FN_SLOT(kept_new)},
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
    {"_kind", T_INT, offsetof(HoldObject, kind), READONLY, "SHL_KIND_*"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef hold_getset[] = {
    {"lock", hold_get_lock, NULL, "The lock this is a hold of.", NULL},
    {"kind", hold_get_kind, NULL, "\"read\", \"write\" or \"update\".", NULL},
    {"timeout", hold_get_timeout, NULL, "The timeout of `with hold:` (None: wait forever).",
     NULL},
    {"_what", hold_get_what, NULL, "\"read hold\", ...: what a message calls it.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot hold_slots[] = {
    {Py_tp_doc, (void *)"Hold(lock, kind, timeout=None)\n--\n\nBase type of the hold objects: __enter__/__exit__ and\n"
                        "__aenter__/__aexit__ in C."},
    {Py_tp_methods, hold_methods},
    {Py_tp_members, hold_members},
    {Py_tp_getset, hold_getset},
    {Py_tp_init, FN_SLOT(hold_init)},
    {Py_tp_new, FN_SLOT(PyType_GenericNew)},
    {Py_tp_traverse, FN_SLOT(hold_traverse)},
    {Py_tp_clear, FN_SLOT(hold_clear)},
    {Py_tp_dealloc, FN_SLOT(hold_dealloc)},
    {0, NULL},
};

PyType_Spec hold_spec = {
    "pyshmlock._fast.Hold", sizeof(HoldObject), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, hold_slots,
};


/* Make the kept-method type and put its descriptors on Hold (module.c
 * calls this once HoldType exists).  0, or -1 with an exception set. */
int hold_install_kept(void)
{
    KeptDescrType = (PyTypeObject *)PyType_FromSpec(&kept_spec);
    if (KeptDescrType == NULL)
        return -1;
    for (int i = 0; i < NBOUND; i++)
        if (install_kept(i) < 0)
            return -1;
    return 0;
}
