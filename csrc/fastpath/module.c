/*
 * module.c - the module pyshmlock._fast: setup(), which receives the core's
 * entry points from pyshmlock/_fastpath.py, set_park() (pyshmlock/_park.py),
 * deadline_ns() (the timeout rule, calls.c), and the module's creation with
 * its types.
 */
#include "fastpath.h"

#include <stdio.h>
#include <string.h>

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

/* setup(table, error): table maps "shl_try", ... to addresses taken from
 * the cffi module; error(rc, what, name, errno) builds the exception for a
 * negative return code. */
/* The interpreter that set the module up.  Its state (the core's table,
 * the error mapping, the parking code) is the process's, and holds that
 * interpreter's objects: a sub-interpreter importing pyshmlock would
 * replace them with its own, which die with it (the next error raised in
 * the main interpreter would call a function whose module was cleared). */
static PyInterpreterState *g_interp;

static int same_interpreter(void)
{
    PyInterpreterState *is = PyInterpreterState_Get();
    if (g_interp != NULL && g_interp != is) {
        PyErr_SetString(PyExc_ImportError,
                        "pyshmlock runs in one interpreter per process, and this process "
                        "imported it in another one first: sub-interpreters are not "
                        "supported (use it from the main interpreter)");
        return -1;
    }
    g_interp = is;
    return 0;
}

static PyObject *mod_setup(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *table, *error;
    if (!PyArg_ParseTuple(args, "O!O", &PyDict_Type, &table, &error))
        return NULL;
    if (same_interpreter() < 0)
        return NULL;
#define ENTRY(field, name)                                           \
    do {                                                             \
        void *p_ = entry(table, name);                               \
        if (p_ == NULL)                                              \
            return NULL;                                             \
        memcpy(&core.field, &p_, sizeof p_);                         \
    } while (0);
    ENTRY(try_, "shl_try")
    ENTRY(fast_handle, "shl_fast_handle")
    ENTRY(fast_try, "shl_fast_try")
    ENTRY(fast_read, "shl_fast_read")
    ENTRY(fast_exclusive, "shl_fast_exclusive")
    ENTRY(fast_release_read, "shl_fast_release_read")
    ENTRY(fast_release_exclusive, "shl_fast_release_exclusive")
    ENTRY(release_read, "shl_release_read")
    ENTRY(release_write, "shl_release_write")
    ENTRY(release_update, "shl_release_update")
    ENTRY(close_begin, "shl_close_begin")
    ENTRY(close_finish, "shl_close_finish")
    ENTRY(wait, "shl_wait")
    ENTRY(cancel, "shl_cancel")
    ENTRY(is_paused, "shl_is_paused")
    ENTRY(session_pin, "shl_session_pin")
#undef ENTRY
    /* Again (a reloaded module): the new callable replaces the old. */
    Py_INCREF(error);
    Py_XSETREF_COMPAT(g_error, error);
    g_ready = 1;
    Py_RETURN_NONE;
}

/* set_park(park, unpark): the parking code of pyshmlock/_park.py.
 * park(attempt) -> a future to wait on, or None (try again now);
 * unpark(attempt): forget its parking record (the attempt ended). */
static PyObject *mod_set_park(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *park, *unpark;
    if (!PyArg_ParseTuple(args, "OO", &park, &unpark))
        return NULL;
    if (same_interpreter() < 0)
        return NULL;
    Py_INCREF(park);
    Py_XSETREF_COMPAT(g_park, park);
    Py_INCREF(unpark);
    Py_XSETREF_COMPAT(g_unpark, unpark);
    Py_RETURN_NONE;
}

/* deadline_ns(timeout) -> int: the timeout rule (calls.c to_deadline). */
static PyObject *mod_deadline_ns(PyObject *mod, PyObject *timeout)
{
    (void)mod;
    int64_t d;
    if (to_deadline(timeout, &d) < 0)
        return NULL;
    return PyLong_FromLongLong(deadline_now(d));
}

/* close(address, owner=None) -> int: shl_close of a token.  Every close
 * goes through here: it begins (decides, and marks the handle closed) with
 * the GIL held, so never during one of the fast calls, which hold the GIL
 * from start to end and so skip the core's in-flight count; a refused close
 * changes nothing.  Once it is decided, and before the GIL is let go, the
 * owner (the _fast.Lock whose close this is, if bound to this token) forgets
 * the token and its handle: the other objects that used it forgot it when
 * they closed.  It finishes without the GIL (giving the slot back may wait a
 * moment for the lease watchdog or the keeper). */
static PyObject *mod_close(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    (void)mod;
    if (!g_ready)
        return not_ready(), NULL;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "close(address, owner=None)");
        return NULL;
    }
    void *p = PyLong_AsVoidPtr(args[0]);
    if (p == NULL && PyErr_Occurred())
        return NULL;
    PyObject *owner = nargs == 2 ? args[1] : Py_None;
    if (owner != Py_None && !PyObject_TypeCheck(owner, LockType)) {
        PyErr_SetString(PyExc_TypeError, "close(): owner must be a _fast.Lock or None");
        return NULL;
    }
    int r = core.close_begin((shl_lock *)p);
    if (r == SHL_OK) {
        LockObject *lo = (LockObject *)owner;
        if (owner != Py_None && lo->h == (shl_lock *)p) {
            lo->fh = NULL;
            lo->h = NULL;
        }
        Py_BEGIN_ALLOW_THREADS
        core.close_finish((shl_lock *)p);
        Py_END_ALLOW_THREADS
    }
    return PyLong_FromLong(r);
}

/* release(address, kind) -> int: give a hold back through the token
 * `address`, as the hold calls do (fastpath.h release: the fast call, with
 * the GIL held, so that the fast calls' read count, gil_reads, is taken
 * from too).  For a `with` block whose object was closed inside it
 * (pyshmlock/_attachment.py release_after_close, which holds the registry
 * lock: no close of the token runs meanwhile).  The core's result. */
static PyObject *mod_release(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    (void)mod;
    if (!g_ready)
        return not_ready(), NULL;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "release(address, kind)");
        return NULL;
    }
    void *p = PyLong_AsVoidPtr(args[0]);
    long kind = PyLong_AsLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    if (p == NULL || kind < SHL_KIND_READ || kind > SHL_KIND_UPDATE) {
        PyErr_SetString(PyExc_ValueError, "release(): a token and a hold's kind");
        return NULL;
    }
    shl_lock *h = (shl_lock *)p;
    return PyLong_FromLong(release(core.fast_handle(h), h, (int)kind));
}

static PyMethodDef mod_methods[] = {
    {"setup", mod_setup, METH_VARARGS,
     "setup(table, error, /)\n--\n\nHand over the core's entry points (once)."},
    {"set_park", mod_set_park, METH_VARARGS,
     "set_park(park, unpark, /)\n--\n\nThe asyncio parking code (pyshmlock/_park.py)."},
    {"close", (PyCFunction)(void (*)(void))mod_close, METH_FASTCALL,
     "close(address, owner=None, /)\n--\n\nThe core's shl_close of a handle (an int result), begun with the\n"
     "GIL held; once decided, owner (a _fast.Lock) forgets the handle."},
    {"release", (PyCFunction)(void (*)(void))mod_release, METH_FASTCALL,
     "release(address, kind, /)\n--\n\nGive a hold of `kind` back through the token `address`, as\n"
     "the hold calls do (an int result: the core's)."},
    {"deadline_ns", mod_deadline_ns, METH_O,
     "deadline_ns(timeout, /)\n--\n\nThe timeout rule: seconds to an absolute CLOCK_MONOTONIC\n"
     "deadline in ns.  None, inf and any timeout of 146 years or more wait\n"
     "forever (-1); 0 tries once (0).  Negative or NaN is a ValueError;\n"
     "anything but None or a real number (a str, a bool) is a TypeError."},
    {NULL, NULL, 0, NULL},
};

/* The running interpreter is 3.10 or later (am_send may be installed). */
static int have_am_send(void)
{
    int major = 0, minor = 0;
    if (sscanf(Py_GetVersion(), "%d.%d", &major, &minor) != 2)
        return 0;
    return major > 3 || (major == 3 && minor >= 10);
}

static int add_type(PyObject *m, const char *name, PyTypeObject *tp)
{
    Py_INCREF(tp);
    if (PyModule_AddObject(m, name, (PyObject *)tp) < 0) {
        Py_DECREF(tp);
        return -1;
    }
    return 0;
}

static struct PyModuleDef fast_module = {
    PyModuleDef_HEAD_INIT, "pyshmlock._fast",
    "The uncontended hold calls of pyshmlock in C (see csrc/fastpath/).", -1, mod_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fast(void);   /* the one exported symbol */

PyMODINIT_FUNC PyInit__fast(void)
{
    PyObject *m = PyModule_Create(&fast_module);
    if (m == NULL)
        return NULL;
    LockType = (PyTypeObject *)PyType_FromSpec(&lock_spec);
    if (LockType == NULL)
        goto fail;
    AsyncLockType = (PyTypeObject *)PyType_FromSpec(&alock_spec);
    if (AsyncLockType == NULL)
        goto fail;
    HoldType = (PyTypeObject *)PyType_FromSpec(&hold_spec);
    if (HoldType == NULL)
        goto fail;
    if (hold_install_kept() < 0 || awaitables_ready(have_am_send()) < 0)
        goto fail;
    small_ints_ready();
    g_str_timeout = PyUnicode_InternFromString("timeout");
    if (g_str_timeout == NULL)
        goto fail;
    if (attempt_fork_ready() < 0) {
        PyErr_SetString(PyExc_RuntimeError, "pyshmlock._fast: pthread_atfork failed");
        goto fail;
    }
    PyObject *kinds = kind_table();
    if (kinds == NULL || PyModule_AddObject(m, "KINDS", kinds) < 0) {
        Py_XDECREF(kinds);
        goto fail;
    }
    if (add_type(m, "Lock", LockType) < 0 || add_type(m, "AsyncLock", AsyncLockType) < 0 ||
        add_type(m, "Hold", HoldType) < 0 || add_type(m, "Attempt", AttemptType) < 0 ||
        add_type(m, "Done", DoneType) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
