/*
 * calls.c - what every call of pyshmlock._fast needs: the table of the
 * core's entry points, the timeout rule (seconds to a deadline: the one
 * definition, pyshmlock's deadline_ns), the names of the kinds of attempt,
 * timeout arguments, and errors raised through pyshmlock.errors.
 */
#include "fastpath.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------- the core's table */

struct core_table core;
int g_ready;
PyObject *g_error;

/* The one table of kind names, indexed by SHL_KIND_* (pyshmlock reads it as
 * _fast.KINDS).  A message names the call that made the attempt. */
const struct kind_names KIND[KIND_LAST + 1] = {
    [SHL_KIND_READ] = {"read", "acquire_read", "release_read", "read hold"},
    [SHL_KIND_WRITE] = {"write", "acquire_write", "release_write", "write hold"},
    [SHL_KIND_UPDATE] = {"update", "acquire_update", "release_update", "update hold"},
    [SHL_KIND_RESUME] = {NULL, "resume", NULL, NULL},
    [SHL_KIND_RESUMED] = {NULL, "wait_resumed", NULL, NULL},
    [SHL_KIND_DRAINED] = {NULL, "wait_drained", NULL, NULL},
    [SHL_KIND_UNPINNED] = {NULL, "begin_session", NULL, NULL},
};

/* {kind: (word or None, call, hold name or None)}: the table for Python. */
PyObject *kind_table(void)
{
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
    for (int k = KIND_MIN; k <= KIND_LAST; k++) {
        PyObject *key = PyLong_FromLong(k);
        PyObject *v = Py_BuildValue("(zsz)", KIND[k].word, KIND[k].call, KIND[k].hold);
        int r = key && v ? PyDict_SetItem(d, key, v) : -1;
        Py_XDECREF(key);
        Py_XDECREF(v);
        if (r < 0) {
            Py_DECREF(d);
            return NULL;
        }
    }
    return d;
}

/* ------------------------------------------------------------- deadlines */

/* Any wait this long or longer is "forever": 2**62 ns is 146 years, and a
 * deadline of now + 2**62 ns cannot overflow int64 (CLOCK_MONOTONIC starts
 * near boot). */
#define FOREVER_S ((double)(1LL << 62) / 1e9)

int64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The value of an int too large for a double: +-inf. */
static int overflowed(PyObject *timeout, double *t)
{
    if (!PyErr_ExceptionMatches(PyExc_OverflowError))
        return -1;
    PyErr_Clear();
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL)
        return -1;
    int pos = PyObject_RichCompareBool(timeout, zero, Py_GT);
    Py_DECREF(zero);
    if (pos < 0)
        return -1;
    *t = pos ? INFINITY : -INFINITY;
    return 0;
}

/*
 * The timeout rule: seconds -> an absolute CLOCK_MONOTONIC deadline in ns
 * (the clock of time.monotonic_ns()).  None, inf and any finite timeout of
 * 146 years or more wait forever (-1); 0 tries once; otherwise now + the
 * timeout, truncated like int().  Negative or NaN is a ValueError; anything
 * but None, an int or a float (or a subclass of either: an IntEnum, a numpy
 * float64) is a TypeError: a bool, a str, and also a Fraction or a Decimal,
 * which the documents never promised (an int or a float, they say).  Exact
 * floats and ints, the common case, take no Python call.  0, or -1 with an
 * exception set.
 */
int to_deadline(PyObject *timeout, int64_t *out)
{
    double t;
    if (timeout == Py_None) {
        *out = -1;
        return 0;
    }
    if (PyFloat_Check(timeout)) {
        t = PyFloat_AsDouble(timeout);
    } else if (PyLong_Check(timeout) && !PyBool_Check(timeout)) {
        t = PyLong_AsDouble(timeout);
        if (t == -1.0 && PyErr_Occurred() && overflowed(timeout, &t) < 0)
            return -1;
    } else {
        PyObject *tn = PyObject_GetAttrString((PyObject *)Py_TYPE(timeout), "__name__");
        if (tn != NULL) {
            PyErr_Format(PyExc_TypeError,
                         "timeout must be None or a number of seconds (an int or a float), "
                         "not %U %R", tn, timeout);
            Py_DECREF(tn);
        }
        return -1;
    }
    if (isnan(t) || t < 0) {
        PyErr_Format(PyExc_ValueError, "timeout must be None or >= 0, not %R", timeout);
        return -1;
    }
    if (t >= FOREVER_S) {
        *out = -1;
    } else if (t == 0.0) {      /* also -0.0 */
        *out = 0;
    } else {
        *out = monotonic_ns() + (int64_t)(t * 1e9);
    }
    return 0;
}

/* Parse (timeout=None) from a vectorcall; NULL on error (borrowed). */
PyObject *timeout_arg(const char *fname, PyObject *const *args, Py_ssize_t nargs,
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
    return timeout;
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

PyObject *lock_name(PyObject *self)
{
    PyObject *n = PyObject_GetAttrString(self, "name");
    if (n == NULL)
        PyErr_Clear();
    return n;   /* new reference or NULL (error_for then leaves the name out) */
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
