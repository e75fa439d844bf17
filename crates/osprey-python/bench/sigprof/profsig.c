// A CPU-time sampler inside a CPython 3.12 process, the reference the
// outside readers are compared with (stop_placement.py): SIGPROF
// (ITIMER_PROF, the process's CPU time) records the main thread's two
// innermost frames (code object, instruction pointer, owner), read with
// process_vm_readv on itself so that a frame popped meanwhile cannot fault;
// dump() names each sample by its innermost complete frame among `known`.
#define _GNU_SOURCE
#define Py_BUILD_CORE 1
#include <Python.h>
#include <internal/pycore_frame.h>
#include <internal/pycore_pystate.h>
#include <errno.h>
#include <signal.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>
#define N 400000
static volatile long n;
static PyThreadState *main_ts;
static pid_t main_tid;
static void *instr[N][2];
static void *code2[N][2];
static char owner[N][2];
static int rd(void *dst, const void *src, size_t len) {
    struct iovec l = {dst, len}, r = {(void *)src, len};
    return process_vm_readv(getpid(), &l, 1, &r, 1, 0) == (ssize_t)len;
}
static void handler(int sig) {
    (void)sig;
    int e = errno;
    PyThreadState *ts = main_ts;
    if (gettid() != main_tid || !ts || n >= N) { errno = e; return; }
    _PyCFrame *cf = NULL;
    _PyInterpreterFrame *f = NULL;
    if (!rd(&cf, &ts->cframe, sizeof cf) || !cf || !rd(&f, &cf->current_frame, sizeof f)) f = NULL;
    for (int k = 0; k < 2; k++) {
        _PyInterpreterFrame fr;
        if (!f || !rd(&fr, f, sizeof fr)) { code2[n][k] = NULL; f = NULL; continue; }
        code2[n][k] = fr.f_code; instr[n][k] = fr.prev_instr; owner[n][k] = fr.owner;
        f = fr.previous;
    }
    n++;
    errno = e;
}
static PyObject *start(PyObject *self, PyObject *args) {
    int us;
    if (!PyArg_ParseTuple(args, "i", &us)) return NULL;
    struct sigaction sa = {0};
    sa.sa_handler = handler; sa.sa_flags = SA_RESTART;
    sigaction(SIGPROF, &sa, NULL);
    struct itimerval it = {{0, us}, {0, us}};
    setitimer(ITIMER_PROF, &it, NULL);
    Py_RETURN_NONE;
}
static PyObject *init(PyObject *self, PyObject *noargs) { main_ts = PyThreadState_Get(); main_tid = gettid(); Py_RETURN_NONE; }
static PyObject *dump(PyObject *self, PyObject *known) {
    struct itimerval it = {{0, 0}, {0, 0}};
    setitimer(ITIMER_PROF, &it, NULL);
    PyObject *d = PyDict_New();
    for (long i = 0; i < n; i++) {
        PyObject *name = NULL;
        for (int lvl = 0; lvl < 2 && !name; lvl++) {
            for (Py_ssize_t j = 0; j < PyList_GET_SIZE(known); j++) {
                PyCodeObject *co = (PyCodeObject *)PyList_GET_ITEM(known, j);
                if ((void *)co != code2[i][lvl]) continue;
                int incomplete = owner[i][lvl] != FRAME_OWNED_BY_GENERATOR &&
                    (_Py_CODEUNIT *)instr[i][lvl] < _PyCode_CODE(co) + co->_co_firsttraceable;
                if (!incomplete) name = co->co_name;
                break;
            }
            if (lvl == 0 && !name && code2[i][0]) {
                /* innermost not one of ours and complete: not counted as calls.py */
                int ours = 0;
                for (Py_ssize_t j = 0; j < PyList_GET_SIZE(known); j++) ours |= PyList_GET_ITEM(known, j) == code2[i][0];
                if (!ours) break;
            }
        }
        PyObject *k = name ? name : Py_None;
        PyObject *v = PyDict_GetItem(d, k);
        long c = v ? PyLong_AsLong(v) : 0;
        PyObject *nv = PyLong_FromLong(c + 1);
        PyDict_SetItem(d, k, nv); Py_DECREF(nv);
    }
    return d;
}
static PyMethodDef m[] = {{"start", start, METH_VARARGS, ""}, {"dump", dump, METH_O, ""}, {"init", init, METH_NOARGS, ""}, {0}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "profsig", 0, -1, m};
PyMODINIT_FUNC PyInit_profsig(void) { return PyModule_Create(&mod); }
