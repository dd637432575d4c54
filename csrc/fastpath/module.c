/*
 * module.c - the module pyshmlock._fast: setup(), which receives the core's
 * entry points from pyshmlock/_fastpath.py, and the module's creation with
 * its two types.
 */
#include "fastpath.h"

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
    HoldType = (PyTypeObject *)PyType_FromSpec(&hold_spec);
    if (HoldType == NULL)
        goto fail;
    if (hold_install_kept() < 0)
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
