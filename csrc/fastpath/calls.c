/*
 * calls.c - what every call of pyshmlock._fast needs: the table of the
 * core's entry points, the timeout rule (seconds to a deadline: the one
 * definition, pyshmlock's deadline_ns), the names of the kinds of attempt,
 * timeout arguments, and errors raised through pyshmlock.errors.
 */
#include "fastpath.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
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
 * The timeout rule: seconds -> a deadline in ns.  None, inf and any finite
 * timeout of 146 years or more wait forever (-1); 0 tries once; otherwise
 * the timeout, truncated like int(), as a deadline not made absolute yet
 * (DEADLINE_IN: below -1).  deadline_now() makes it absolute (now + the
 * timeout on CLOCK_MONOTONIC, the clock of time.monotonic_ns()) when a try
 * has failed: an attempt granted at once never reads the clock.  Negative
 * or NaN is a ValueError; anything but None, an int or a float (or a
 * subclass of either: an IntEnum, a numpy float64) is a TypeError: a bool,
 * a str, and also a Fraction or a Decimal, which the documents never
 * promised (an int or a float, they say).  Exact floats and ints, the
 * common case, take no Python call.  0, or -1 with an exception set.
 */
int64_t deadline_now(int64_t deadline)
{
    return deadline < -1 ? monotonic_ns() + (-2 - deadline) : deadline;
}

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
        *out = DEADLINE_IN((int64_t)(t * 1e9));
    }
    return 0;
}

/* "timeout", interned: a keyword name written in a call is the interned
 * string, so call_timeout (fastpath.h) knows it by its address. */
PyObject *g_str_timeout;

/*
 * The small ints 0..256, which CPython keeps as one array of objects: a
 * timeout that is one of them is a valid number of seconds, known by its
 * address alone.  Found and checked at import (small_ints_ready); on an
 * interpreter that keeps them otherwise, the range stays empty and every
 * int takes the general check.
 */
uintptr_t g_small_lo = UINTPTR_MAX, g_small_span;

void small_ints_ready(void)
{
    /* Every one of 0..256 must be the object at lo + i * step, and stay
     * the same object when made again (kept, not made per call). */
    PyObject *lo = PyLong_FromLong(0), *hi = PyLong_FromLong(256);
    int ok = lo != NULL && hi != NULL && hi > lo;
    ptrdiff_t step = ok ? ((const char *)hi - (const char *)lo) / 256 : 0;
    for (long i = 0; ok && i <= 256; i++) {
        PyObject *v = PyLong_FromLong(i);
        ok = v != NULL && (const char *)v == (const char *)lo + i * step &&
             PyLong_AsLong(v) == i;
        Py_XDECREF(v);
    }
    if (ok && step >= (ptrdiff_t)sizeof(PyObject)) {
        g_small_lo = (uintptr_t)lo;
        g_small_span = (uintptr_t)hi - (uintptr_t)lo;
    }
    Py_XDECREF(lo);
    Py_XDECREF(hi);
    PyErr_Clear();
}

/*
 * Is `timeout` valid under the timeout rule?  0, or -1 with the rule's
 * exception set.  None, a small non-negative int and a non-negative float
 * are known without a conversion that matters; another int or float takes
 * the rule itself (which runs no Python code on them).  Any other object
 * (a subclass, a Fraction) is left to the caller's conversion, made before
 * its first try (timeout_prepare): converting it may run Python code.  The
 * deadline is computed only when a try has failed (to_deadline): a hold
 * granted at once costs these checks only.
 */
int timeout_valid(PyObject *timeout)
{
    if (timeout == Py_None)
        return 0;
    if ((uintptr_t)timeout - g_small_lo <= g_small_span)
        return 0;
    if (PyFloat_CheckExact(timeout) && PyFloat_AsDouble(timeout) >= 0)
        return 0;               /* (NaN is not >= 0: the rule raises) */
    if (!PyFloat_CheckExact(timeout) && !PyLong_CheckExact(timeout))
        return 0;               /* converted by the caller, before its first try */
    int64_t unused;
    return to_deadline(timeout, &unused);
}

/* call_timeout (fastpath.h) with arguments: the timeout (borrowed) once
 * valid, NULL with an exception set.  The two common forms, f(t) and
 * f(timeout=t), take no parsing. */
PyObject *call_timeout_arg(const char *what, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames)
{
    PyObject *timeout;
    if (kwnames == NULL)
        timeout = nargs == 1 ? args[0] : NULL;
    else
        timeout = nargs == 0 && PyTuple_Size(kwnames) == 1 &&
                          PyTuple_GetItem(kwnames, 0) == g_str_timeout ? args[0] : NULL;
    if (timeout == NULL) {
        timeout = timeout_arg(what, args, nargs, kwnames);
        if (timeout == NULL)
            return NULL;
    }
    return timeout_valid(timeout) < 0 ? NULL : timeout;
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
