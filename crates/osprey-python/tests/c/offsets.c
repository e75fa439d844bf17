/* Prints CPython struct offsets osprey-python relies on, computed by the C
 * compiler from the interpreter's own headers. Used only by tests, to check
 * the tables in src/layout.rs; the runtime never needs a compiler. */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#if PY_VERSION_HEX >= 0x03090000
#include "internal/pycore_runtime.h"
#endif
#include "internal/pycore_pystate.h"
#if PY_VERSION_HEX >= 0x03090000
#include "internal/pycore_interp.h"
#endif
#if PY_VERSION_HEX >= 0x030B0000
#include "internal/pycore_frame.h"
#include "internal/pycore_code.h"
#endif
#if PY_VERSION_HEX < 0x030B0000
#include "frameobject.h"
#endif
#if PY_VERSION_HEX >= 0x030B0000
#include "internal/pycore_dict.h"
#endif
#if PY_VERSION_HEX >= 0x030C0000
#include "internal/pycore_moduleobject.h"
#include "internal/pycore_object.h"
#endif

#include "internal/pycore_context.h"
#include "internal/pycore_hamt.h"

#define P(name, val) printf("%s %ld\n", name, (long)(val))

int main(void) {
    P("runtime.interpreters_head", offsetof(_PyRuntimeState, interpreters.head));
#if PY_VERSION_HEX >= 0x030F0000
    /* 3.15: the gilstate is a thread-local, no pthread key */
    P("interp.gil_ptr", offsetof(PyInterpreterState, ceval.gil));
#elif PY_VERSION_HEX >= 0x030C0000
    P("runtime.autotsskey", offsetof(_PyRuntimeState, autoTSSkey));
    P("interp.gil_ptr", offsetof(PyInterpreterState, ceval.gil));
#else
    P("runtime.autotsskey", offsetof(_PyRuntimeState, gilstate.autoTSSkey));
    P("runtime.gil", offsetof(_PyRuntimeState, ceval.gil));
#endif
    P("gil.last_holder", offsetof(struct _gil_runtime_state, last_holder));
    P("gil.locked", offsetof(struct _gil_runtime_state, locked));
    P("gil.size", sizeof(struct _gil_runtime_state));
    P("interp.next", offsetof(PyInterpreterState, next));
#if PY_VERSION_HEX >= 0x030B0000
    P("interp.tstate_head", offsetof(PyInterpreterState, threads.head));
#else
    P("interp.tstate_head", offsetof(PyInterpreterState, tstate_head));
#endif
    P("tstate.next", offsetof(PyThreadState, next));
    P("tstate.interp", offsetof(PyThreadState, interp));
    P("tstate.thread_id", offsetof(PyThreadState, thread_id));
#if PY_VERSION_HEX >= 0x030B0000
    P("tstate.native_thread_id", offsetof(PyThreadState, native_thread_id));
#endif
#if PY_VERSION_HEX >= 0x030D0000
    P("tstate.frame", offsetof(PyThreadState, current_frame));
#elif PY_VERSION_HEX >= 0x030B0000
    P("tstate.frame", offsetof(PyThreadState, cframe));
    P("cframe.current_frame", offsetof(_PyCFrame, current_frame));
#else
    P("tstate.frame", offsetof(PyThreadState, frame));
#endif
#if PY_VERSION_HEX >= 0x030D0000
    P("frame.code", offsetof(_PyInterpreterFrame, f_executable));
    P("frame.previous", offsetof(_PyInterpreterFrame, previous));
    P("frame.instr", offsetof(_PyInterpreterFrame, instr_ptr));
    P("frame.owner", offsetof(_PyInterpreterFrame, owner));
#elif PY_VERSION_HEX >= 0x030B0000
    P("frame.code", offsetof(_PyInterpreterFrame, f_code));
    P("frame.previous", offsetof(_PyInterpreterFrame, previous));
    P("frame.instr", offsetof(_PyInterpreterFrame, prev_instr));
    P("frame.owner", offsetof(_PyInterpreterFrame, owner));
#else
    P("frame.code", offsetof(PyFrameObject, f_code));
    P("frame.previous", offsetof(PyFrameObject, f_back));
    P("frame.instr", offsetof(PyFrameObject, f_lasti));
#endif
    P("code.filename", offsetof(PyCodeObject, co_filename));
    P("code.name", offsetof(PyCodeObject, co_name));
#if PY_VERSION_HEX >= 0x030B0000
    P("code.qualname", offsetof(PyCodeObject, co_qualname));
    P("code.code_adaptive", offsetof(PyCodeObject, co_code_adaptive));
#endif
    P("code.firstlineno", offsetof(PyCodeObject, co_firstlineno));
#if PY_VERSION_HEX >= 0x030A0000
    P("code.linetable", offsetof(PyCodeObject, co_linetable));
#else
    P("code.linetable", offsetof(PyCodeObject, co_lnotab));
#endif
    P("bytes.sval", offsetof(PyBytesObject, ob_sval));
    P("unicode.ascii_size", sizeof(PyASCIIObject));
    P("unicode.compact_size", sizeof(PyCompactUnicodeObject));
    P("unicode.length", offsetof(PyASCIIObject, length));
    {
        /* The first bit of `state.kind`, found by setting it alone. */
        PyASCIIObject o;
        unsigned int w;
        memset(&o, 0, sizeof o);
        o.state.kind = 1;
        memcpy(&w, &o.state, sizeof w);
        P("unicode.kind_bit", __builtin_ctz(w));
    }
#if defined(Py_GIL_DISABLED) && PY_VERSION_HEX >= 0x030E0000
    P("frame.tlbc_index", offsetof(_PyInterpreterFrame, tlbc_index));
    P("code.tlbc", offsetof(PyCodeObject, co_tlbc));
#endif
    P("bytes.size", offsetof(PyBytesObject, ob_base.ob_size));
    P("object.type", offsetof(PyObject, ob_type));
#if PY_VERSION_HEX >= 0x03090000
    P("interp.gc_collecting", offsetof(PyInterpreterState, gc.collecting));
#else
    P("runtime.gc_collecting", offsetof(_PyRuntimeState, gc.collecting));
#endif
#if PY_VERSION_HEX >= 0x030F0000
    P("tstate.holds_gil", offsetof(PyThreadState, holds_gil));
#endif
#if PY_VERSION_HEX >= 0x030C0000
    P("objects.interp_modules", offsetof(PyInterpreterState, imports.modules));
    P("objects.long_size", offsetof(PyLongObject, long_value.lv_tag));
    P("objects.long_digits", offsetof(PyLongObject, long_value.ob_digit));
#else
    P("objects.interp_modules", offsetof(PyInterpreterState, modules));
    P("objects.long_size", offsetof(PyVarObject, ob_size));
    P("objects.long_digits", offsetof(PyLongObject, ob_digit));
#endif
    P("objects.interp_sysdict", offsetof(PyInterpreterState, sysdict));
    P("objects.dict_keys", offsetof(PyDictObject, ma_keys));
    P("objects.dict_values", offsetof(PyDictObject, ma_values));
    P("objects.type_flags", offsetof(PyTypeObject, tp_flags));
    P("objects.type_basicsize", offsetof(PyTypeObject, tp_basicsize));
    P("objects.type_dictoffset", offsetof(PyTypeObject, tp_dictoffset));
    P("objects.heap_type_cached_keys", offsetof(PyHeapTypeObject, ht_cached_keys));
#if PY_VERSION_HEX >= 0x030B0000
    P("objects.values_array", offsetof(PyDictValues, values));
#endif
#if PY_VERSION_HEX >= 0x030C0000
    /* Free-threaded builds move these with their bigger object header. */
    P("objects.module_dict", offsetof(PyModuleObject, md_dict));
#endif
#if PY_VERSION_HEX >= 0x030D0000
    P("objects.managed_dict", -MANAGED_DICT_OFFSET);
#endif
    P("objects.dict_used", offsetof(PyDictObject, ma_used));
    P("objects.tstate_context", offsetof(PyThreadState, context));
    P("objects.context_vars", offsetof(PyContext, ctx_vars));
    P("objects.hamt_root", offsetof(PyHamtObject, h_root));
    P("objects.hamt_count", offsetof(PyHamtObject, h_count));
    P("objects.contextvar_name", offsetof(PyContextVar, var_name));
    P("objects.contextvar_hash", offsetof(PyContextVar, var_hash));
    P("objects.tuple_size", offsetof(PyVarObject, ob_size));
    P("objects.tuple_items", offsetof(PyTupleObject, ob_item));
    P("objects.type_name", offsetof(PyTypeObject, tp_name));
    return 0;
}
