/*
 * awaitable.c - the attempt (attempt.c) as an awaitable for asyncio:
 * _fast.Attempt, which tries on the loop thread, parks through
 * pyshmlock/_park.py when it must wait and withdraws when cancelled, closed
 * or collected; and _fast.Done, an awaitable completed already (what a
 * granted `async with` returns).
 *
 * Longer than the size guide because one object owns one attempt's whole
 * asyncio life (its coroutine protocol, its park and wake-up, a second
 * awaiter refused, withdrawal on throw/close/collection, a grant given back
 * when its result cannot be made, begin_session's steps with its pin
 * straight after its grant); split, each piece would reach into the others' state.
 */
#include "fastpath.h"

#include <string.h>
#include <structmember.h>

/* ========================================================= the awaitables */

PyTypeObject *AttemptType, *DoneType;
PyObject *g_done_none, *g_done_true;
PyObject *g_park, *g_unpark;

/* StopIteration(value) raised, or none for None (which a yield from, an
 * await and next() all read as a return of None); consumes value. */
static PyObject *stop_with(PyObject *value, int always)
{
    if (value == Py_None && !always) {
        Py_DECREF(value);
        return NULL;
    }
    PyObject *exc = PyObject_CallFunctionObjArgs(PyExc_StopIteration, value, NULL);
    Py_DECREF(value);
    if (exc != NULL) {
        PyErr_SetObject(PyExc_StopIteration, exc);
        Py_DECREF(exc);
    }
    return NULL;
}

/* Raise what throw(typ[, val[, tb]]) was given. */
static PyObject *raise_thrown(PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 3) {
        PyErr_Format(PyExc_TypeError, "throw expected 1 to 3 arguments, got %zd", nargs);
        return NULL;
    }
    PyObject *typ = args[0], *val = nargs > 1 ? args[1] : Py_None;
    PyObject *tb = nargs > 2 ? args[2] : Py_None;
    if (PyExceptionInstance_Check(typ)) {
        if (val != Py_None) {
            PyErr_SetString(PyExc_TypeError,
                            "instance exception may not have a separate value");
            return NULL;
        }
        PyErr_SetObject((PyObject *)Py_TYPE(typ), typ);
    } else if (PyExceptionClass_Check(typ)) {
        PyErr_SetObject(typ, val);
    } else {
        PyErr_SetString(PyExc_TypeError,
                        "exceptions must be classes or instances deriving from BaseException");
        return NULL;
    }
    if (tb != Py_None) {
        PyObject *t, *v, *old;
        PyErr_Fetch(&t, &v, &old);
        PyErr_NormalizeException(&t, &v, &old);
        Py_XDECREF(old);
        Py_INCREF(tb);
        if (v != NULL)
            PyException_SetTraceback(v, tb);
        PyErr_Restore(t, v, tb);
    }
    return NULL;
}

/* --------------------------------------------------------------- Done */

/* An awaitable completed already: awaiting it gives `result` at once.  It
 * has no state, so one object serves every await (a lock's holds keep one
 * whose result is the hold; g_done_none serves every __aexit__). */
typedef struct {
    PyObject_HEAD
    PyObject *result;
} DoneObject;

PyObject *done_new(PyObject *result)
{
    DoneObject *d = (DoneObject *)PyType_GenericAlloc(DoneType, 0);
    if (d == NULL)
        return NULL;
    Py_INCREF(result);
    d->result = result;
    return (PyObject *)d;
}

static PyObject *self_iter(PyObject *self)
{
    Py_INCREF(self);
    return self;
}

static int done_am_send(PyObject *self, PyObject *arg, PyObject **out)
{
    (void)arg;
    *out = ((DoneObject *)self)->result;
    Py_INCREF(*out);
    return FP_SEND_RETURN;
}

static PyObject *done_next(PyObject *self)
{
    PyObject *r = ((DoneObject *)self)->result;
    Py_INCREF(r);
    return stop_with(r, 0);
}

static PyObject *done_send(PyObject *self, PyObject *arg)
{
    (void)arg;
    PyObject *r = ((DoneObject *)self)->result;
    Py_INCREF(r);
    return stop_with(r, 1);
}

static PyObject *done_throw(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    return raise_thrown(args, nargs);
}

static PyObject *done_close(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    Py_RETURN_NONE;
}

static int done_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(((DoneObject *)self)->result);
    return 0;
}

static int done_clear(PyObject *self)
{
    Py_CLEAR(((DoneObject *)self)->result);
    return 0;
}

static void done_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    done_clear(self);
    freefunc free_fn = (freefunc)(uintptr_t)PyType_GetSlot(tp, Py_tp_free);
    free_fn(self);
    Py_DECREF(tp);
}

/* Only pyshmlock makes these (Py_TPFLAGS_DISALLOW_INSTANTIATION needs 3.10). */
static PyObject *no_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    (void)type;
    (void)args;
    (void)kwds;
    PyErr_SetString(PyExc_TypeError, "pyshmlock makes its awaitables: they cannot be created");
    return NULL;
}

static PyMethodDef done_methods[] = {
    {"send", done_send, METH_O, "send($self, value, /)\n--\n\nCompleted: StopIteration(result)."},
    {"throw", FASTCALL(done_throw), METH_FASTCALL, "throw($self, typ, val=None, tb=None, /)\n--\n\nRaise it."},
    {"close", done_close, METH_NOARGS, "close($self, /)\n--\n\nNothing to do."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot done_slots[] = {
    {Py_tp_doc, (void *)"An awaitable completed already (a hold granted at once)."},
    {Py_tp_new, FN_SLOT(no_new)},
    {Py_tp_methods, done_methods},
    {Py_tp_iter, FN_SLOT(self_iter)},
    {Py_tp_iternext, FN_SLOT(done_next)},
    {Py_am_await, FN_SLOT(self_iter)},
    {Py_tp_traverse, FN_SLOT(done_traverse)},
    {Py_tp_clear, FN_SLOT(done_clear)},
    {Py_tp_dealloc, FN_SLOT(done_dealloc)},
    {FP_AM_SEND, FN_SLOT(done_am_send)},      /* last: cleared before 3.10 */
    {0, NULL},
};

PyType_Spec done_spec = {
    "pyshmlock._fast.Done", sizeof(DoneObject), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    done_slots,
};

/* ------------------------------------------------------------- Attempt */

enum {
    A_FRESH,        /* not tried yet (acquire_*: the first send tries) */
    A_TRIED,        /* tried when made (__aenter__, resume): must wait */
    A_PARKED,       /* yielded the parking code's future */
    A_DONE,         /* finished, withdrawn or closed */
};

typedef struct {
    PyObject_HEAD
    attempt_t a;
    PyObject *lock;             /* the RWLock: its name, and what park() needs */
    PyObject *hold;             /* a hold's __aenter__: the result, the TimeoutError */
    PyObject *parked;           /* the parking code's record while it may be parked */
    PyObject *weakreflist;      /* the record refers to us weakly: a driver that drops a
                                   parked attempt drops it, and dealloc withdraws it */
    const char *what;           /* the call, for messages */
    int state;
    int sent;                   /* awaited (sent) at least once */
    int session;                /* begin_session whole (session_step) */
    int64_t session_ttl;        /* ... the session's ttl_ns */
} AttemptObject;

/* A hold granted whose result cannot be handed over (no memory for it):
 * give it back, so that the MemoryError leaves nothing held.  The waits
 * (resume, wait_resumed, ...) hold nothing. */
static void give_back_grant(const attempt_t *a, int kind)
{
    if (kind >= SHL_KIND_READ && kind <= SHL_KIND_UPDATE)
        (void)release(attempt_fast_handle(a), a->h, kind);
}

PyObject *attempt_new(PyObject *lock, PyObject *hold, int kind, uint32_t flags,
                      int64_t deadline, int now, const char *what)
{
    if (!g_ready)
        return not_ready(), NULL;
    attempt_t a;
    attempt_init(&a, (LockObject *)lock, kind, flags, deadline, 1);
    int state = A_FRESH;
    if (now) {
        int r = attempt_try_held(&a);
        if (r == SHL_OK) {
            if (hold == NULL) {
                Py_INCREF(g_done_true);
                return g_done_true;
            }
            PyObject *done = hold_done(hold);
            if (done == NULL)
                give_back_grant(&a, kind);
            return done;
        }
        if (r != SHL_AGAIN) {
            PyObject *name = lock_name(lock);
            raise_rc(r, what, name, a.err);
            Py_XDECREF(name);
            return NULL;
        }
        state = A_TRIED;
    }
    AttemptObject *o = (AttemptObject *)PyType_GenericAlloc(AttemptType, 0);
    if (o == NULL) {
        attempt_cancel(&a);
        return NULL;
    }
    o->a = a;
    Py_INCREF(lock);
    o->lock = lock;
    Py_XINCREF(hold);
    o->hold = hold;
    o->what = what;
    o->state = state;
    return (PyObject *)o;
}

/* begin_session whole as one attempt (session_step): its result is the
 * token, or False (not begun by the deadline). */
PyObject *attempt_new_session(PyObject *lock, int64_t deadline, int64_t ttl_ns)
{
    PyObject *o = attempt_new(lock, NULL, SHL_KIND_UNPINNED, 0, deadline, 0, "begin_session");
    if (o != NULL) {
        ((AttemptObject *)o)->session = 1;
        ((AttemptObject *)o)->session_ttl = ttl_ns;
    }
    return o;
}

/*
 * begin_session's next step, the current one granted.  The wait until no
 * session pins the pause becomes the update attempt (same deadline, same
 * parking record: the next park registers the new waiter).  The update
 * granted, the pin and the release follow at once (session_pin_held): no
 * Python code runs while the hold is held and nobody has seen it.  Another
 * session pinned between the wait and the pin (None): back to the wait.
 * 1 with *out the token, 0 go on (try the new step), -1 exception set
 * (the hold released).
 */
static int session_step(AttemptObject *o, PyObject **out)
{
    if (o->a.w.kind == SHL_KIND_UNPINNED) {
        attempt_rekind(&o->a, SHL_KIND_UPDATE);
        return 0;
    }
    /* On the attempt's handle: the object may be closed since (session_pin_held). */
    PyObject *token = session_pin_held(o->lock, o->a.h, o->session_ttl);
    if (token == NULL)
        return -1;
    if (token != Py_None) {
        *out = token;
        return 1;
    }
    Py_DECREF(token);
    attempt_rekind(&o->a, SHL_KIND_UNPINNED);
    return 0;
}

/* Forget the parking record (its timer, its watcher registration), with any
 * exception in flight kept; a failure of the hook itself is unraisable. */
static void forget_parked(AttemptObject *o)
{
    if (o->parked == NULL)
        return;
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyObject *r = g_unpark ? PyObject_CallFunctionObjArgs(g_unpark, (PyObject *)o, NULL) : NULL;
    if (r == NULL && g_unpark)
        PyErr_WriteUnraisable(g_unpark);
    Py_XDECREF(r);
    Py_CLEAR(o->parked);
    PyErr_Restore(t, v, tb);
}

/* End the attempt without the hold: withdrawn, parking forgotten. */
static void attempt_abandon(AttemptObject *o)
{
    if (o->state == A_DONE)
        return;
    o->state = A_DONE;
    attempt_cancel(&o->a);
    forget_parked(o);
}

#define PY_ERROR_SET (-1000)    /* attempt_finish: the exception is set already */

/* Finish with outcome r (nothing is pending any more): 0 with *out the
 * result, or -1 with an exception set. */
static int attempt_finish(AttemptObject *o, int r, PyObject **out)
{
    o->state = A_DONE;
    forget_parked(o);
    if (r == SHL_OK) {
        *out = o->hold ? o->hold : Py_True;
        Py_INCREF(*out);
        return 0;
    }
    if (r == SHL_TIMEDOUT) {
        if (o->hold != NULL) {
            hold_timeout_error(o->hold);
            return -1;
        }
        Py_INCREF(Py_False);
        *out = Py_False;
        return 0;
    }
    if (r != PY_ERROR_SET) {
        PyObject *name = lock_name(o->lock);
        raise_rc(r, o->what, name, o->a.err);
        Py_XDECREF(name);
    }
    return -1;
}

/* Is the future a parked attempt yielded still pending (nobody woke it)?
 * 1 yes, 0 no (woken, cancelled, or none), -1 exception set. */
static int parked_future_pending(AttemptObject *o)
{
    if (o->parked == NULL)
        return 0;
    PyObject *fut = PyObject_GetAttrString(o->parked, "future");
    if (fut == NULL)
        return -1;
    if (fut == Py_None) {
        Py_DECREF(fut);
        return 0;
    }
    PyObject *done = PyObject_CallMethod(fut, "done", NULL);
    Py_DECREF(fut);
    if (done == NULL)
        return -1;
    int pending = !PyObject_IsTrue(done);
    Py_DECREF(done);
    return pending;
}

/* One send: 1 yielded (*out: the future to wait on), 0 finished (*out: the
 * result), -1 exception set. */
static int attempt_step(AttemptObject *o, PyObject **out)
{
    int r;
    o->sent = 1;
    switch (o->state) {
    case A_DONE:
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse an already awaited attempt");
        return -1;
    case A_PARKED: {
        /* A send before the future it yielded completed is a second awaiter
         * (another task, another loop): refuse it, as a coroutine awaited
         * twice is, and leave the attempt to its first awaiter.  Trying (and
         * parking again) here would replace the future the first awaiter
         * waits on, and nobody would ever wake it.  Only the woken path pays
         * for the check. */
        int pending = parked_future_pending(o);
        if (pending < 0)
            return -1;
        if (pending) {
            PyErr_SetString(PyExc_RuntimeError, "attempt is being awaited already");
            return -1;
        }
        r = attempt_try_held(&o->a);
        break;
    }
    case A_TRIED:
        r = SHL_AGAIN;
        break;
    default:                     /* A_FRESH: try */
        r = attempt_try_held(&o->a);
        break;
    }
    for (;;) {
        while (r == SHL_OK && o->session) {     /* begin_session: its next step */
            int step = session_step(o, out);
            if (step != 0) {
                o->state = A_DONE;
                forget_parked(o);
                return step > 0 ? 0 : -1;
            }
            r = attempt_try_held(&o->a);
        }
        if (r == SHL_AGAIN && attempt_past(&o->a)) {
            attempt_cancel(&o->a);
            r = SHL_TIMEDOUT;
        }
        if (r != SHL_AGAIN)
            return attempt_finish(o, r, out);
        if (g_park == NULL) {
            attempt_cancel(&o->a);
            PyErr_SetString(PyExc_RuntimeError, "pyshmlock's asyncio parking is not set up");
            return attempt_finish(o, PY_ERROR_SET, out);
        }
        /* park(attempt): the future to yield, or None (the word changed
         * already: try again now).  It may raise (LockClosingError, no
         * running loop): the attempt is withdrawn. */
        PyObject *fut = PyObject_CallFunctionObjArgs(g_park, (PyObject *)o, NULL);
        if (fut == NULL) {
            attempt_cancel(&o->a);
            return attempt_finish(o, PY_ERROR_SET, out);
        }
        if (fut != Py_None) {
            o->state = A_PARKED;
            *out = fut;
            return 1;
        }
        Py_DECREF(fut);
        r = attempt_try_held(&o->a);
    }
}

static int attempt_am_send(PyObject *self, PyObject *arg, PyObject **out)
{
    (void)arg;
    int r = attempt_step((AttemptObject *)self, out);
    if (r < 0) {
        *out = NULL;
        return FP_SEND_ERROR;
    }
    return r ? FP_SEND_NEXT : FP_SEND_RETURN;
}

/* The result out as StopIteration(out); a hold granted whose StopIteration
 * cannot be made (MemoryError) is given back. */
static PyObject *attempt_return(AttemptObject *o, PyObject *out, int always)
{
    /* A hold's result: the hold or True (a session's hold is released already). */
    int granted = out != Py_False && !o->session;
    stop_with(out, always);
    if (granted && PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_StopIteration))
        give_back_grant(&o->a, o->a.w.kind);
    return NULL;
}

static PyObject *attempt_next(PyObject *self)
{
    PyObject *out;
    int r = attempt_step((AttemptObject *)self, &out);
    if (r < 0)
        return NULL;
    return r ? out : attempt_return((AttemptObject *)self, out, 0);
}

static PyObject *attempt_send(PyObject *self, PyObject *arg)
{
    (void)arg;
    PyObject *out;
    int r = attempt_step((AttemptObject *)self, &out);
    if (r < 0)
        return NULL;
    return r ? out : attempt_return((AttemptObject *)self, out, 1);
}

/* Cancellation (Task.cancel, a timeout around it) arrives here: withdraw,
 * then raise what was thrown. */
static PyObject *attempt_throw(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    AttemptObject *o = (AttemptObject *)self;
    o->sent = 1;
    attempt_abandon(o);
    return raise_thrown(args, nargs);
}

static PyObject *attempt_close(PyObject *self, PyObject *unused)
{
    (void)unused;
    AttemptObject *o = (AttemptObject *)self;
    o->sent = 1;
    attempt_abandon(o);
    Py_RETURN_NONE;
}

/* _cancel(): withdraw now, without the parking code (the close hook of a
 * lock whose tasks sit on a closed loop calls it, holding the helper's
 * lock; the record goes with the attempt). */
static PyObject *attempt_cancel_method(PyObject *self, PyObject *unused)
{
    (void)unused;
    AttemptObject *o = (AttemptObject *)self;
    if (o->state != A_DONE) {
        o->state = A_DONE;
        o->sent = 1;
        attempt_cancel(&o->a);
    }
    Py_RETURN_NONE;
}

/* Never awaited: say so, as an un-awaited coroutine does. */
static void warn_unawaited(AttemptObject *o)
{
    if (o->sent || o->state == A_DONE)
        return;
    o->sent = 1;
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyObject *name = lock_name(o->lock);
    /* (Not o in the unraisable report: dealloc calls this at refcount 0.) */
    if (PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "%s of lock %R was never awaited", o->what,
                         name ? name : Py_None) < 0)
        PyErr_WriteUnraisable(o->lock);
    Py_XDECREF(name);
    PyErr_Restore(t, v, tb);
}

/* The garbage collector's way in: a parked attempt is in a cycle with its
 * task when the loop went away (task -> coroutine -> attempt, and the
 * record's future -> the task's wake-up). */
static void attempt_finalize(PyObject *self)
{
    AttemptObject *o = (AttemptObject *)self;
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    warn_unawaited(o);
    attempt_abandon(o);
    PyErr_Restore(t, v, tb);
}

static int attempt_traverse(PyObject *self, visitproc visit, void *arg)
{
    AttemptObject *o = (AttemptObject *)self;
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(o->lock);
    Py_VISIT(o->hold);
    Py_VISIT(o->parked);
    return 0;
}

static int attempt_clear(PyObject *self)
{
    AttemptObject *o = (AttemptObject *)self;
    Py_CLEAR(o->parked);
    Py_CLEAR(o->hold);
    Py_CLEAR(o->lock);
    return 0;
}

static void attempt_dealloc(PyObject *self)
{
    AttemptObject *o = (AttemptObject *)self;
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (o->weakreflist != NULL)
        PyObject_ClearWeakRefs(self);
    if (o->state != A_DONE) {
        /* Dropped by its driver, parked or not: the parking record refers
         * to us only weakly (its watcher registration is forgotten at the
         * watcher's next wake-up, a spurious one at worst).  Withdrawing
         * needs no Python, and none may see us now. */
        if (o->lock != NULL)
            warn_unawaited(o);
        o->state = A_DONE;
        attempt_cancel(&o->a);
    }
    attempt_clear(self);
    freefunc free_fn = (freefunc)(uintptr_t)PyType_GetSlot(tp, Py_tp_free);
    free_fn(self);
    Py_DECREF(tp);
}

static PyObject *attempt_get_lock(PyObject *self, void *closure)
{
    (void)closure;
    PyObject *l = ((AttemptObject *)self)->lock;
    Py_INCREF(l);
    return l;
}

static PyObject *attempt_get_kind(PyObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromLong(((AttemptObject *)self)->a.w.kind);
}

static PyObject *attempt_get_remaining(PyObject *self, void *closure)
{
    (void)closure;
    AttemptObject *o = (AttemptObject *)self;
    if (o->a.deadline == -1)
        Py_RETURN_NONE;
    int64_t d = o->a.deadline = deadline_now(o->a.deadline);
    int64_t left = d - monotonic_ns();
    return PyFloat_FromDouble(left > 0 ? (double)left / 1e9 : 0.0);
}

static PyObject *attempt_get_waiter(PyObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromVoidPtr(&((AttemptObject *)self)->a.w);
}

static PyObject *attempt_get_parked(PyObject *self, void *closure)
{
    (void)closure;
    PyObject *p = ((AttemptObject *)self)->parked;
    p = p ? p : Py_None;
    Py_INCREF(p);
    return p;
}

static int attempt_set_parked(PyObject *self, PyObject *value, void *closure)
{
    (void)closure;
    AttemptObject *o = (AttemptObject *)self;
    PyObject *old = o->parked;
    if (value == Py_None)
        value = NULL;
    Py_XINCREF(value);
    o->parked = value;
    Py_XDECREF(old);
    return 0;
}

static PyMemberDef attempt_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(AttemptObject, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef attempt_methods[] = {
    {"send", attempt_send, METH_O, "send($self, value, /)\n--\n\nTry (again); yields a future to wait on."},
    {"throw", FASTCALL(attempt_throw), METH_FASTCALL,
     "throw($self, typ, val=None, tb=None, /)\n--\n\nWithdraw the attempt, then raise."},
    {"close", attempt_close, METH_NOARGS, "close($self, /)\n--\n\nWithdraw the attempt."},
    {"_cancel", attempt_cancel_method, METH_NOARGS,
     "_cancel($self, /)\n--\n\nWithdraw now, without calling the parking code."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef attempt_getset[] = {
    {"lock", attempt_get_lock, NULL, "the RWLock the attempt is made on", NULL},
    {"kind", attempt_get_kind, NULL, "SHL_KIND_* of the attempt", NULL},
    {"remaining", attempt_get_remaining, NULL,
     "seconds left until the deadline (None: no deadline)", NULL},
    {"_waiter", attempt_get_waiter, NULL, "address of its shl_waiter (for the watcher)", NULL},
    {"_parked", attempt_get_parked, attempt_set_parked,
     "the parking code's record of this attempt (pyshmlock/_park.py), or None", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot attempt_slots[] = {
    {Py_tp_doc, (void *)"An attempt for a hold (or a wait) of pyshmlock, as an awaitable:\n"
                        "it tries on the loop thread, parks only when it must wait, and\n"
                        "withdraws when cancelled, closed or collected."},
    {Py_tp_new, FN_SLOT(no_new)},
    {Py_tp_methods, attempt_methods},
    {Py_tp_members, attempt_members},
    {Py_tp_getset, attempt_getset},
    {Py_tp_iter, FN_SLOT(self_iter)},
    {Py_tp_iternext, FN_SLOT(attempt_next)},
    {Py_am_await, FN_SLOT(self_iter)},
    {Py_tp_traverse, FN_SLOT(attempt_traverse)},
    {Py_tp_clear, FN_SLOT(attempt_clear)},
    {Py_tp_finalize, FN_SLOT(attempt_finalize)},
    {Py_tp_dealloc, FN_SLOT(attempt_dealloc)},
    {FP_AM_SEND, FN_SLOT(attempt_am_send)},   /* last: cleared before 3.10 */
    {0, NULL},
};

PyType_Spec attempt_spec = {
    "pyshmlock._fast.Attempt", sizeof(AttemptObject), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, attempt_slots,
};

/* Before 3.10 the am_send slot is unknown: drop it (the last slot of each
 * awaitable's spec) so that PyType_FromSpec accepts the spec. */
int awaitables_ready(int have_am_send)
{
    if (!have_am_send) {
        PyType_Slot *specs[] = {attempt_slots, done_slots};
        for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++) {
            PyType_Slot *s = specs[k];
            while (s->slot != FP_AM_SEND)
                s++;
            s->slot = 0;
            s->pfunc = NULL;
        }
    }
    AttemptType = (PyTypeObject *)PyType_FromSpec(&attempt_spec);
    if (AttemptType == NULL)
        return -1;
    DoneType = (PyTypeObject *)PyType_FromSpec(&done_spec);
    if (DoneType == NULL)
        return -1;
    g_done_none = done_new(Py_None);
    g_done_true = done_new(Py_True);
    return g_done_none && g_done_true ? 0 : -1;
}
