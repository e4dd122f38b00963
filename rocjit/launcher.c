/* rocjit native launcher: the common launch in one C call.
 *
 * A Launcher stands for kernel[grid, block]. Called with framework tensors (read through the DLPack C exchange
 * API the framework publishes on its tensor type), Python int / float / bool scalars and the framework's current
 * stream or an int stream handle, it checks every argument the way the Python launcher does, packs the parameter
 * block on the C stack and calls the driver's launch function (cuLaunchKernel / hipModuleLaunchKernel, which take
 * the same arguments). Anything else -- another argument type, a keyword it does not know, a dtype, device,
 * layout or alignment it would refuse, a scalar out of range, a context that is not current, a failed launch --
 * is handed, untouched, to the Python launcher it wraps, which launches or raises the error that names the
 * parameter. So this file only ever makes the accepted case faster; it never decides an error.
 *
 * Built at first use by rocjit.native with the platform's C compiler and cached; no build step at install.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* The DLPack structures read here, as the DLPack specification (v1.x) lays them out. */
typedef struct { int32_t device_type; int32_t device_id; } rj_device;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } rj_dtype;
typedef struct {
    void *data;
    rj_device device;
    int32_t ndim;
    rj_dtype dtype;
    int64_t *shape;
    int64_t *strides;      /* NULL: compact row-major */
    uint64_t byte_offset;
} rj_tensor;
typedef struct {
    uint32_t major, minor;
    void *prev_api;
    void *managed_tensor_allocator;
    void *managed_tensor_from_py_object_no_sync;
    void *managed_tensor_to_py_object_no_sync;
    int (*dltensor_from_py_object_no_sync)(void *py_object, rj_tensor *out);
    int (*current_work_stream)(int32_t device_type, int32_t device_id, void **out_stream);
} rj_exchange_api;

#define RJ_DL_COMPLEX 5
#define RJ_MAX_PARAMS 256
#define RJ_MAX_BLOCK 4096
#define RJ_MAX_DEVICES 64
#define RJ_MAX_DTYPES 8
#define RJ_MAX_TYPES 4

typedef int (*rj_launch_fn)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                            unsigned shared_mem, void *stream, void **params, void **extra);
typedef int (*rj_ctx_fn)(void **ctx);

typedef struct {
    char code;              /* 'P' pointer, else a struct module code: b B h H i I q Q f d ? */
    int offset;
    uintptr_t align_mask;   /* pointer params: required alignment - 1 */
    int ndtypes;            /* 0: any dtype but complex (whose conjugate bit DLPack cannot carry) */
    uint32_t dtypes[RJ_MAX_DTYPES];
} rj_param;

/* ------------------------------------------------------------------------------------------------- Spec */
typedef struct {
    PyObject_HEAD
    int nparams;
    int block_size;
    int32_t device_type;
    int ntypes;
    PyTypeObject *types[RJ_MAX_TYPES];  /* tensor types taken as they are (strong references) */
    const rj_exchange_api *api;
    PyObject *limits;                    /* dict: device -> dynamic shared memory the function allows */
    rj_launch_fn launch;
    rj_ctx_fn get_ctx;                   /* NULL: no context check */
    void *fns[RJ_MAX_DEVICES];
    void *ctxs[RJ_MAX_DEVICES];
    rj_param *params;
} Spec;

static void spec_dealloc(Spec *self) {
    for (int i = 0; i < self->ntypes; i++) Py_XDECREF((PyObject *)self->types[i]);
    Py_XDECREF(self->limits);
    PyMem_Free(self->params);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static void *address_of(PyObject *o, const char *what) {
    if (PyCapsule_CheckExact(o)) return PyCapsule_GetPointer(o, PyCapsule_GetName(o));
    void *p = PyLong_AsVoidPtr(o);
    if (p == NULL && !PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "%s: a null address", what);
    return p;
}

/* Spec(params, block_size, device_type, exchange_api, tensor_types, limits, launch_address, ctx_address)
 * params: [(code, offset, alignment, (dtype, ...)), ...] with dtypes packed as code | bits << 8 | lanes << 16. */
static int spec_init(Spec *self, PyObject *args, PyObject *kw) {
    PyObject *params, *api, *types, *limits, *launch, *ctx;
    int block_size, device_type;
    if (!PyArg_ParseTuple(args, "O!iiOO!O!OO", &PyList_Type, &params, &block_size, &device_type, &api,
                          &PyTuple_Type, &types, &PyDict_Type, &limits, &launch, &ctx))
        return -1;
    Py_ssize_t n = PyList_GET_SIZE(params);
    if (n > RJ_MAX_PARAMS || block_size < 0 || block_size > RJ_MAX_BLOCK) {
        PyErr_SetString(PyExc_ValueError, "too many parameters or too large a parameter block for the native launcher");
        return -1;
    }
    if (PyTuple_GET_SIZE(types) < 1 || PyTuple_GET_SIZE(types) > RJ_MAX_TYPES) {
        PyErr_SetString(PyExc_ValueError, "tensor_types: 1 to 4 types");
        return -1;
    }
    PyMem_Free(self->params);
    self->params = PyMem_Calloc(n ? n : 1, sizeof(rj_param));
    if (!self->params) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *code;
        int offset, align;
        PyObject *dts;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(params, i), "siiO!", &code, &offset, &align, &PyTuple_Type, &dts))
            return -1;
        rj_param *p = &self->params[i];
        p->code = code[0];
        if (!strchr("PbBhHiIqQfd?", p->code) || code[1] || offset < 0 || align < 1 || (align & (align - 1)) ||
            PyTuple_GET_SIZE(dts) > RJ_MAX_DTYPES) {
            PyErr_Format(PyExc_ValueError, "parameter %zd: bad description", i);
            return -1;
        }
        p->offset = offset;
        p->align_mask = (uintptr_t)(align - 1);
        p->ndtypes = (int)PyTuple_GET_SIZE(dts);
        for (int j = 0; j < p->ndtypes; j++) {
            unsigned long v = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(dts, j));
            if (v == (unsigned long)-1 && PyErr_Occurred()) return -1;
            p->dtypes[j] = (uint32_t)v;
        }
    }
    self->nparams = (int)n;
    self->block_size = block_size;
    self->device_type = device_type;
    self->api = address_of(api, "exchange_api");
    if (!self->api) return -1;
    if (self->api->major != 1 || !self->api->dltensor_from_py_object_no_sync || !self->api->current_work_stream) {
        PyErr_SetString(PyExc_ValueError, "the framework's DLPack exchange API is not a v1 API with "
                                          "dltensor_from_py_object_no_sync and current_work_stream");
        return -1;
    }
    self->ntypes = (int)PyTuple_GET_SIZE(types);
    for (int i = 0; i < self->ntypes; i++) {
        PyObject *t = PyTuple_GET_ITEM(types, i);
        if (!PyType_Check(t)) { PyErr_SetString(PyExc_TypeError, "tensor_types: types"); return -1; }
        Py_INCREF(t);
        self->types[i] = (PyTypeObject *)t;
    }
    Py_INCREF(limits);
    self->limits = limits;
    self->launch = (rj_launch_fn)address_of(launch, "launch_address");
    if (!self->launch) return -1;
    self->get_ctx = (ctx == Py_None) ? NULL : (rj_ctx_fn)address_of(ctx, "ctx_address");
    if (ctx != Py_None && !self->get_ctx) return -1;
    return 0;
}

/* spec.set_function(device, function, context): where the kernel is loaded (context None: not checked) */
static PyObject *spec_set_function(Spec *self, PyObject *args) {
    int dev;
    PyObject *fn, *ctx;
    if (!PyArg_ParseTuple(args, "iOO", &dev, &fn, &ctx)) return NULL;
    if (dev < 0 || dev >= RJ_MAX_DEVICES) Py_RETURN_FALSE;   /* that device stays on the Python launcher */
    void *f = address_of(fn, "function");
    if (!f) return NULL;
    void *c = NULL;
    if (ctx != Py_None && !(c = address_of(ctx, "context"))) return NULL;
    self->fns[dev] = f;
    self->ctxs[dev] = c;
    Py_RETURN_TRUE;
}

static PyMethodDef spec_methods[] = {
    {"set_function", (PyCFunction)spec_set_function, METH_VARARGS, "set_function(device, function, context)"},
    {NULL}
};

static PyTypeObject SpecType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rocjit._launch.Spec",
    .tp_basicsize = sizeof(Spec),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A kernel's parameter layout and launch function for native launchers",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)spec_init,
    .tp_dealloc = (destructor)spec_dealloc,
    .tp_methods = spec_methods,
};

/* --------------------------------------------------------------------------------------------- Launcher */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Spec *spec;
    PyObject *fallback;
    unsigned grid[3], block[3];
    unsigned long long native_calls;
} Launcher;

static PyObject *str_shared_mem, *str_stream;

static int scalar_into(char code, PyObject *o, char *dst) {
    /* 0 on success; -1: not this launcher's case (no Python error left set) */
    if (code == '?') {
        if (o == Py_True) { *dst = 1; return 0; }
        if (o == Py_False) { *dst = 0; return 0; }
        return -1;
    }
    if (code == 'f' || code == 'd') {
        double d;
        if (PyFloat_CheckExact(o)) d = PyFloat_AS_DOUBLE(o);
        else if (PyLong_CheckExact(o)) {
            d = PyLong_AsDouble(o);
            if (d == -1.0 && PyErr_Occurred()) { PyErr_Clear(); return -1; }
        } else return -1;
        if (code == 'd') { memcpy(dst, &d, 8); return 0; }
        float f = (float)d;
        if (isinf(f) && !isinf(d)) return -1;     /* out of float's range */
        memcpy(dst, &f, 4);
        return 0;
    }
    if (!PyLong_CheckExact(o)) return -1;
    if (code == 'b' || code == 'h' || code == 'i' || code == 'q') {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred())) { PyErr_Clear(); return -1; }
        switch (code) {
        case 'b': { if (v < INT8_MIN || v > INT8_MAX) return -1; int8_t x = (int8_t)v; memcpy(dst, &x, 1); return 0; }
        case 'h': { if (v < INT16_MIN || v > INT16_MAX) return -1; int16_t x = (int16_t)v; memcpy(dst, &x, 2); return 0; }
        case 'i': { if (v < INT32_MIN || v > INT32_MAX) return -1; int32_t x = (int32_t)v; memcpy(dst, &x, 4); return 0; }
        default: { int64_t x = (int64_t)v; memcpy(dst, &x, 8); return 0; }
        }
    }
    unsigned long long u = PyLong_AsUnsignedLongLong(o);
    if (u == (unsigned long long)-1 && PyErr_Occurred()) { PyErr_Clear(); return -1; }
    switch (code) {
    case 'B': { if (u > UINT8_MAX) return -1; uint8_t x = (uint8_t)u; memcpy(dst, &x, 1); return 0; }
    case 'H': { if (u > UINT16_MAX) return -1; uint16_t x = (uint16_t)u; memcpy(dst, &x, 2); return 0; }
    case 'I': { if (u > UINT32_MAX) return -1; uint32_t x = (uint32_t)u; memcpy(dst, &x, 4); return 0; }
    case 'Q': { uint64_t x = (uint64_t)u; memcpy(dst, &x, 8); return 0; }
    default: return -1;
    }
}

static int contiguous(const rj_tensor *t) {
    if (!t->strides) return 1;
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] == 0) return 1;           /* an empty tensor is contiguous, whatever its strides */
    int64_t expect = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->strides[d] != expect) return 0;
        expect *= t->shape[d];
    }
    return 1;
}

static PyObject *launcher_vectorcall(Launcher *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Spec *s = self->spec;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *shared_obj = NULL, *stream_obj = NULL;
    union { char bytes[RJ_MAX_BLOCK]; double d; int64_t q; void *p; } block;
    void *ptrs[RJ_MAX_PARAMS];
    int dev = -1;
    unsigned long long shared = 0;
    void *stream = NULL, *fn;

    if (nargs != s->nparams) goto fallback;
    if (kwnames) {
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t i = 0; i < nk; i++) {
            PyObject *k = PyTuple_GET_ITEM(kwnames, i);
            if (k == str_shared_mem || PyUnicode_Compare(k, str_shared_mem) == 0) shared_obj = args[nargs + i];
            else if (k == str_stream || PyUnicode_Compare(k, str_stream) == 0) stream_obj = args[nargs + i];
            else goto fallback;
        }
    }
    for (int i = 0; i < s->nparams; i++) {
        const rj_param *p = &s->params[i];
        PyObject *o = args[i];
        char *dst = block.bytes + p->offset;
        ptrs[i] = dst;
        if (p->code != 'P') {
            if (scalar_into(p->code, o, dst) != 0) goto fallback;
            continue;
        }
        PyTypeObject *t = Py_TYPE(o);
        int known = 0;
        for (int j = 0; j < s->ntypes; j++) known |= (t == s->types[j]);
        if (!known) goto fallback;
        rj_tensor dl;
        if (s->api->dltensor_from_py_object_no_sync(o, &dl) != 0) { PyErr_Clear(); goto fallback; }
        if (dl.device.device_type != s->device_type) goto fallback;
        if (dev < 0) dev = dl.device.device_id;
        else if (dl.device.device_id != dev) goto fallback;
        uint32_t dt = (uint32_t)dl.dtype.code | (uint32_t)dl.dtype.bits << 8 | (uint32_t)dl.dtype.lanes << 16;
        if (p->ndtypes) {
            int ok = 0;
            for (int j = 0; j < p->ndtypes; j++) ok |= (p->dtypes[j] == dt);
            if (!ok) goto fallback;
        } else if (dl.dtype.code == RJ_DL_COMPLEX) goto fallback;
        if (!contiguous(&dl)) goto fallback;
        void *ptr = (char *)dl.data + dl.byte_offset;
        if ((uintptr_t)ptr & p->align_mask) goto fallback;
        memcpy(dst, &ptr, sizeof ptr);
    }
    if (dev < 0 || dev >= RJ_MAX_DEVICES || !(fn = s->fns[dev])) goto fallback;
    if (shared_obj) {
        if (!PyLong_CheckExact(shared_obj)) goto fallback;
        shared = PyLong_AsUnsignedLongLong(shared_obj);
        if (shared == (unsigned long long)-1 && PyErr_Occurred()) { PyErr_Clear(); goto fallback; }
        if (shared) {
            PyObject *key = PyLong_FromLong(dev);
            if (!key) { PyErr_Clear(); goto fallback; }
            PyObject *lim = PyDict_GetItemWithError(s->limits, key);    /* borrowed */
            Py_DECREF(key);
            if (!lim) { PyErr_Clear(); goto fallback; }
            unsigned long long l = PyLong_AsUnsignedLongLong(lim);
            if (l == (unsigned long long)-1 && PyErr_Occurred()) { PyErr_Clear(); goto fallback; }
            if (shared > l) goto fallback;
        }
    }
    if (s->get_ctx) {
        void *cur = NULL;
        if (s->get_ctx(&cur) != 0 || cur != s->ctxs[dev]) goto fallback;
    }
    if (!stream_obj || stream_obj == Py_None) {
        if (s->api->current_work_stream(s->device_type, dev, &stream) != 0) { PyErr_Clear(); goto fallback; }
    } else if (PyLong_CheckExact(stream_obj)) {
        unsigned long long h = PyLong_AsUnsignedLongLong(stream_obj);
        if (h == (unsigned long long)-1 && PyErr_Occurred()) { PyErr_Clear(); goto fallback; }
        stream = (void *)(uintptr_t)h;
    } else goto fallback;
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = s->launch(fn, self->grid[0], self->grid[1], self->grid[2], self->block[0], self->block[1], self->block[2],
                    (unsigned)shared, stream, ptrs, NULL);
    Py_END_ALLOW_THREADS
    if (err) goto fallback;      /* nothing was launched: the Python launcher retries and reports */
    self->native_calls++;
    Py_RETURN_NONE;
fallback:
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

static int launcher_init(Launcher *self, PyObject *args, PyObject *kw) {
    PyObject *spec, *fallback;
    unsigned g[3], b[3];
    if (!PyArg_ParseTuple(args, "O!(III)(III)O", &SpecType, &spec, &g[0], &g[1], &g[2], &b[0], &b[1], &b[2],
                          &fallback))
        return -1;
    if (!PyCallable_Check(fallback)) { PyErr_SetString(PyExc_TypeError, "fallback: a callable"); return -1; }
    Py_INCREF(spec);
    Py_XSETREF(self->spec, (Spec *)spec);
    Py_INCREF(fallback);
    Py_XSETREF(self->fallback, fallback);
    memcpy(self->grid, g, sizeof g);
    memcpy(self->block, b, sizeof b);
    self->vectorcall = (vectorcallfunc)launcher_vectorcall;
    return 0;
}

static int launcher_traverse(Launcher *self, visitproc visit, void *arg) {
    Py_VISIT(self->fallback);
    return 0;
}

static int launcher_clear(Launcher *self) {
    Py_CLEAR(self->fallback);
    return 0;
}

static void launcher_dealloc(Launcher *self) {
    PyObject_GC_UnTrack(self);
    launcher_clear(self);
    Py_XDECREF(self->spec);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *launcher_fallback(Launcher *self, void *closure) {
    Py_INCREF(self->fallback);
    return self->fallback;
}

static PyMemberDef launcher_members[] = {
    {"native_calls", T_ULONGLONG, offsetof(Launcher, native_calls), READONLY,
     "launches this launcher made itself (the rest went to its fallback)"},
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(Launcher, vectorcall), READONLY},
    {NULL}
};

static PyGetSetDef launcher_getset[] = {
    {"fallback", (getter)launcher_fallback, NULL, "the Python launcher this one hands every other case to"},
    {NULL}
};

static PyTypeObject LauncherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rocjit._launch.Launcher",
    .tp_basicsize = sizeof(Launcher),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "kernel[grid, block]: launches the common case natively, hands the rest to its Python fallback",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)launcher_init,
    .tp_dealloc = (destructor)launcher_dealloc,
    .tp_traverse = (traverseproc)launcher_traverse,
    .tp_clear = (inquiry)launcher_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Launcher, vectorcall),
    .tp_members = launcher_members,
    .tp_getset = launcher_getset,
};

/* dtype_code(exchange_api, tensor) -> the tensor's DLPack dtype, packed as Spec's dtypes are */
static PyObject *dtype_code(PyObject *m, PyObject *args) {
    PyObject *api_obj, *t;
    if (!PyArg_ParseTuple(args, "OO", &api_obj, &t)) return NULL;
    const rj_exchange_api *api = address_of(api_obj, "exchange_api");
    if (!api) return NULL;
    rj_tensor dl;
    if (api->dltensor_from_py_object_no_sync(t, &dl) != 0) return NULL;
    return PyLong_FromUnsignedLong((unsigned long)dl.dtype.code | (unsigned long)dl.dtype.bits << 8 |
                                   (unsigned long)dl.dtype.lanes << 16);
}

static PyMethodDef module_methods[] = {
    {"dtype_code", dtype_code, METH_VARARGS, "dtype_code(exchange_api, tensor) -> packed DLPack dtype"},
    {NULL}
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rocjit_launch", "rocjit's native launcher (built at first use)", -1, module_methods
};

PyMODINIT_FUNC PyInit__rocjit_launch(void) {
    if (PyType_Ready(&SpecType) < 0 || PyType_Ready(&LauncherType) < 0) return NULL;
    str_shared_mem = PyUnicode_InternFromString("shared_mem");
    str_stream = PyUnicode_InternFromString("stream");
    if (!str_shared_mem || !str_stream) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&SpecType);
    Py_INCREF(&LauncherType);
    if (PyModule_AddObject(m, "Spec", (PyObject *)&SpecType) < 0 ||
        PyModule_AddObject(m, "Launcher", (PyObject *)&LauncherType) < 0 ||
        PyModule_AddIntConstant(m, "MAX_PARAMS", RJ_MAX_PARAMS) < 0 ||
        PyModule_AddIntConstant(m, "MAX_BLOCK", RJ_MAX_BLOCK) < 0 ||
        PyModule_AddIntConstant(m, "MAX_DEVICES", RJ_MAX_DEVICES) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
