/*
 * floor_capi.c - the bare C-API call floor for the benchmarks: a module
 * whose noop() is a METH_NOARGS function that returns None.  Calling it
 * costs what any call from Python into a C method costs, and nothing else;
 * pyshmlock's fast path (csrc/fastpath/) is measured against it.
 *
 * noop_varargs(*args) and noop_fastcall(*args) take arguments the two ways a
 * 3.9 stable-ABI method can (a tuple, or METH_FASTCALL's C array): timing
 * them with one float argument gives the price of the calling convention
 * the fast path chose (see the METH_FASTCALL comment in fastpath/fastpath.h).
 *
 * callgrind_mark() does nothing under a name of its own: the instruction
 * counts (pyshmlock_lab/bench/instructions.py) run the cases in one process
 * under valgrind --tool=callgrind --dump-before=floor_callgrind_mark, so
 * that each call ends one counted part.
 *
 * Built only for benchmarking, at run time (pyshmlock_lab/bench/floors.py), never
 * into the installed package.  Same stable-ABI settings as the fast path.
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

#ifndef METH_FASTCALL
#define METH_FASTCALL 0x0080   /* stable since 3.7; see fastpath/fastpath.h */
#endif

static PyObject *noop_varargs(PyObject *mod, PyObject *args)
{
    (void)mod;
    (void)args;
    Py_RETURN_NONE;
}

static PyObject *noop_fastcall(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    (void)mod;
    (void)args;
    (void)nargs;
    Py_RETURN_NONE;
}

/* Not inlined, so that callgrind sees every call (see the head). */
__attribute__((noinline)) PyObject *floor_callgrind_mark(PyObject *mod, PyObject *unused);
__attribute__((noinline)) PyObject *floor_callgrind_mark(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    __asm__ volatile("" ::: "memory");
    Py_RETURN_NONE;
}

typedef PyObject *(*fastcall)(PyObject *, PyObject *const *, Py_ssize_t);

static PyMethodDef methods[] = {
    {"noop", noop, METH_NOARGS, "Do nothing: the cost of a bare C-API call."},
    {"callgrind_mark", floor_callgrind_mark, METH_NOARGS,
     "Do nothing, under a name callgrind can dump before."},
    {"noop_varargs", noop_varargs, METH_VARARGS, "Do nothing, arguments as a tuple."},
    {"noop_fastcall", (PyCFunction)(void (*)(void))(fastcall)noop_fastcall, METH_FASTCALL,
     "Do nothing, arguments as a C array."},
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
