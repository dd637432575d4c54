/*
 * floor_capi.c - the bare C-API call floor for the benchmarks: a module
 * whose noop() is a METH_NOARGS function that returns None.  Calling it
 * costs what any call from Python into a C method costs, and nothing else;
 * pyshmlock's fast path (fastpath.c) is measured against it.
 *
 * Built only for benchmarking, at run time (pyshmlock/_floors.py), never
 * into the installed package.  Same stable-ABI settings as fastpath.c.
 */
#define Py_LIMITED_API 0x03090000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *noop(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"noop", noop, METH_NOARGS, "Do nothing: the cost of a bare C-API call."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef floor_module = {
    PyModuleDef_HEAD_INIT, "_pyshmlock_capi_floor", "Benchmark floor (bench only).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__pyshmlock_capi_floor(void)
{
    return PyModule_Create(&floor_module);
}
