#include <Python.h>
/* A C extension whose function burns CPU in a frameless loop: the native
   frames under a Python caller in tests/native.rs. */
static __attribute__((noinline)) unsigned long spin_inner(unsigned long n) {
    unsigned long x = 1;
    for (unsigned long i = 0; i < n; i++) { x = x * 6364136223846793005UL + 1442695040888963407UL; __asm__ volatile("" : "+r"(x)); }
    return x;
}
static PyObject *spin(PyObject *self, PyObject *arg) {
    unsigned long n = PyLong_AsUnsignedLong(arg);
    return PyLong_FromUnsignedLong(spin_inner(n));
}
static PyMethodDef methods[] = {{"spin", spin, METH_O, "burn"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "ospreyspin", NULL, -1, methods};
PyMODINIT_FUNC PyInit_ospreyspin(void) {
    PyObject *m = PyModule_Create(&mod);
#ifdef Py_GIL_DISABLED
    /* Free-threaded builds: keep the GIL off (a module that does not say
       so turns it on at import). */
    if (m) PyUnstable_Module_SetGIL(m, Py_MOD_GIL_NOT_USED);
#endif
    return m;
}
