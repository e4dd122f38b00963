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
    void *manager_ctx;
    void (*deleter)(void *self);
    uint64_t flags;
    rj_tensor dl_tensor;
} rj_managed_tensor;
typedef void (*rj_set_error)(void *ctx, const char *kind, const char *message);
typedef struct {
    uint32_t major, minor;
    void *prev_api;
    int (*managed_tensor_allocator)(rj_tensor *prototype, rj_managed_tensor **out, void *error_ctx, rj_set_error);
    void *managed_tensor_from_py_object_no_sync;
    int (*managed_tensor_to_py_object_no_sync)(rj_managed_tensor *tensor, void **out_py_object);
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
    char code;              /* 'P' pointer, 's' a by-value struct (bytes of `size`), else a struct module code:
                               b B h H i I q Q f d ? */
    int offset;
    int size;               /* 's': the struct's bytes */
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
 * params: [(code, offset, alignment, (dtype, ...)), ...] with dtypes packed as code | bits << 8 | lanes << 16;
 * a by-value struct is ("s", offset, size, ()), passed as a bytes object of exactly that size. */
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
        int is_struct = p->code == 's';
        const char *sizes = "P8b1B1h2H2i4I4q8Q8f4d8?1", *at = strchr(sizes, p->code);
        int width = is_struct ? align : at ? at[1] - '0' : 0;
        if (!strchr("PsbBhHiIqQfd?", p->code) || code[1] || offset < 0 || align < 1 ||
            (!is_struct && (align & (align - 1))) || offset + width > block_size ||
            PyTuple_GET_SIZE(dts) > RJ_MAX_DTYPES) {
            PyErr_Format(PyExc_ValueError, "parameter %zd: bad description", i);
            return -1;
        }
        p->offset = offset;
        p->size = is_struct ? align : 0;
        p->align_mask = is_struct ? 0 : (uintptr_t)(align - 1);
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

/* A non-pointer parameter into the block: a scalar, or a by-value struct given as bytes of its exact size.
 * 0 on success; -1: not this launcher's case (no Python error left set) */
static int value_into(const rj_param *p, PyObject *o, char *dst) {
    if (p->code != 's') return scalar_into(p->code, o, dst);
    if (!PyBytes_CheckExact(o) || PyBytes_GET_SIZE(o) != p->size) return -1;
    memcpy(dst, PyBytes_AS_STRING(o), (size_t)p->size);
    return 0;
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

/* 1 when `shared` bytes of dynamic shared memory are within what the function allows on `dev`; 0 otherwise
 * (and when that cannot be told), with no Python error left set: the caller's Python path decides. */
static int shared_allowed(const Spec *s, int dev, unsigned long long shared) {
    if (!shared) return 1;
    PyObject *key = PyLong_FromLong(dev);
    if (!key) { PyErr_Clear(); return 0; }
    PyObject *lim = PyDict_GetItemWithError(s->limits, key);    /* borrowed */
    Py_DECREF(key);
    if (!lim) { PyErr_Clear(); return 0; }
    unsigned long long l = PyLong_AsUnsignedLongLong(lim);
    if (l == (unsigned long long)-1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
    return shared <= l;
}

/* 1 when the function's context for `dev` is current (or the platform does not ask), 0 otherwise */
static int context_current(const Spec *s, int dev) {
    void *cur = NULL;
    return !s->get_ctx || (s->get_ctx(&cur) == 0 && cur == s->ctxs[dev]);
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
            if (value_into(p, o, dst) != 0) goto fallback;
            continue;
        }
        if (o == Py_None) {                 /* a null pointer, as the general path passes it */
            memset(dst, 0, sizeof(void *));
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
        if (!shared_allowed(s, dev, shared)) goto fallback;
    }
    if (!context_current(s, dev)) goto fallback;
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

/* ------------------------------------------------------------------------------------------------ Plans */
/* An op's eager plans (rocjit.ops._op). A plan is what one successful call of an op did -- the outputs it
 * allocated and the launches it made, each argument of each launch named as an op argument, an output or a
 * constant -- keyed by everything the op's checks looked at: each tensor argument's dtype, shape, device,
 * contiguity (a tensor that is not contiguous: its strides) and 16-byte alignment, the exact type of each forwarded
 * scalar and the value of each option. A call
 * whose arguments match a plan's key allocates that plan's outputs with the framework's own allocation (each
 * output's `make`, e.g. a prototype tensor's new_empty, called with the output's sizes: real framework tensors, so
 * the caching allocator knows them and Tensor.record_stream works on them, which it silently did not on tensors
 * wrapped from DLPack) and calls the same launchers (the native Launcher objects, which check their own arguments
 * again); any other call, and any call that cannot be completed here, goes untouched to the op's Python path,
 * which decides errors. */
#define RJ_MAX_OP_ARGS 16
#define RJ_MAX_DIMS 8
#define RJ_MAX_OUTS 8
#define RJ_MAX_PLANS 64
#define RJ_MAX_DERIVED 4
#define RJ_MAX_VIEWS 4

typedef struct {
    char kind;                 /* 'N' None, 'T' tensor, 'S' forwarded scalar, 'O' option */
    uint32_t dtype;
    int32_t device_type, device_id;
    int ndim, aligned, strided;
    int64_t shape[RJ_MAX_DIMS];
    int64_t strides[RJ_MAX_DIMS];   /* 'T' and strided (not contiguous): its strides in elements */
    void *data;                /* 'T': this call's data pointer (not part of the key) */
    PyTypeObject *type;        /* 'S' and 'O': the exact type */
    PyObject *value;           /* 'O': the value (strong reference), compared by == */
} rj_argkey;

typedef struct { char kind; int index; } rj_ref;   /* 'a' op argument, 'o' output, 'c' constant, 'd' derived,
                                                       'v' the data pointer of an op argument (a launch's pointer
                                                       parameter given a view of it), 'w' a view of an output
                                                       (results only), 'n' None */

typedef struct {
    PyObject *launcher, *kwnames, *shared;
    int nargs;
    rj_ref *args;
} rj_launch;

typedef struct {
    PyObject *make;                     /* make(*sizes) -> a new tensor */
    int nargv;
    PyObject *argv[RJ_MAX_DIMS];        /* the sizes, or one () for a 0-d output */
} rj_out;

typedef struct {
    PyObject_HEAD
    uint64_t hash;
    int nargs, nouts, nconsts, nlaunches, nresult, result_tuple;
    int32_t device_type, device_id;
    int stream_bound;
    void *stream;
    rj_argkey args[RJ_MAX_OP_ARGS];
    rj_out outs[RJ_MAX_OUTS];
    PyObject *group;                    /* the torch allocator's Outputs of this plan, or NULL: outs[j].make each */
    PyObject **consts;
    void **const_ptrs;         /* a constant tensor's data pointer; NULL for scalars */
    int *const_is_tensor;
    rj_launch *launches;
    rj_ref *result;
    int nderived;                       /* values made per call from an op argument's data pointer: */
    PyObject *derive[RJ_MAX_DERIVED];   /*   derive[i](pointer as int), e.g. a TMA tensor map of that tensor */
    int derive_arg[RJ_MAX_DERIVED];     /*   ... of op argument derive_arg[i] (a tensor) */
    int nviews;                         /* results that are views of outputs: */
    PyObject *view_fn[RJ_MAX_VIEWS];    /*   view_fn[i](output), e.g. its transpose */
    int view_out[RJ_MAX_VIEWS];         /*   ... of output view_out[i] */
} Plan;

static void plan_dealloc(Plan *self) {
    for (int i = 0; i < self->nargs; i++) Py_XDECREF(self->args[i].value);
    Py_XDECREF(self->group);
    for (int j = 0; j < self->nouts; j++) {
        Py_XDECREF(self->outs[j].make);
        for (int a = 0; a < self->outs[j].nargv; a++) Py_XDECREF(self->outs[j].argv[a]);
    }
    for (int i = 0; i < self->nconsts; i++) Py_XDECREF(self->consts[i]);
    for (int i = 0; i < self->nderived; i++) Py_XDECREF(self->derive[i]);
    for (int i = 0; i < self->nviews; i++) Py_XDECREF(self->view_fn[i]);
    for (int i = 0; i < self->nlaunches; i++) {
        Py_XDECREF(self->launches[i].launcher);
        Py_XDECREF(self->launches[i].kwnames);
        Py_XDECREF(self->launches[i].shared);
        PyMem_Free(self->launches[i].args);
    }
    PyMem_Free(self->consts);
    PyMem_Free(self->const_ptrs);
    PyMem_Free(self->const_is_tensor);
    PyMem_Free(self->launches);
    PyMem_Free(self->result);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rocjit._launch.Plan",
    .tp_basicsize = sizeof(Plan),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One recorded eager call of an op (made by Plans.add)",
    .tp_dealloc = (destructor)plan_dealloc,
};

/* The torch allocator's C API (rocjit/torch_alloc.cpp lays it out the same): its Outputs objects make all of a
 * plan's outputs in one call and hand back their data pointers. Registered by set_allocator(capsule). */
typedef struct {
    int version;
    PyTypeObject *type;
    int (*count)(PyObject *);
    int (*make)(PyObject *, PyObject **, void **);
} rj_alloc_api;
static const rj_alloc_api *alloc_api;
static PyObject *alloc_capsule;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int nargs;
    char roles[RJ_MAX_OP_ARGS];          /* 'T' tensor or None, 'S' forwarded scalar, 'O' option */
    int ntypes;
    PyTypeObject *types[RJ_MAX_TYPES];
    const rj_exchange_api *api;
    PyObject *fallback;
    int nplans;
    Plan *plans[RJ_MAX_PLANS];           /* most recently added first */
    unsigned long long hits, misses, direct;
} Plans;

static inline uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h;
}

/* The key of one argument; 0 on success, -1: no plan can match (no Python error left set). */
static int arg_key(const Plans *s, int i, PyObject *o, rj_argkey *k, uint64_t *h) {
    memset(k, 0, sizeof *k);
    if (s->roles[i] == 'T') {
        if (o == Py_None) { k->kind = 'N'; *h = mix(*h, 'N'); return 0; }
        PyTypeObject *t = Py_TYPE(o);
        int known = 0;
        for (int j = 0; j < s->ntypes; j++) known |= (t == s->types[j]);
        if (!known) return -1;
        rj_tensor dl;
        if (s->api->dltensor_from_py_object_no_sync(o, &dl) != 0) { PyErr_Clear(); return -1; }
        if (dl.ndim > RJ_MAX_DIMS || dl.dtype.code == RJ_DL_COMPLEX) return -1;
        k->kind = 'T';
        k->strided = !contiguous(&dl);
        k->dtype = (uint32_t)dl.dtype.code | (uint32_t)dl.dtype.bits << 8 | (uint32_t)dl.dtype.lanes << 16;
        k->device_type = dl.device.device_type;
        k->device_id = dl.device.device_id;
        k->ndim = dl.ndim;
        k->data = (char *)dl.data + dl.byte_offset;
        k->aligned = ((uintptr_t)k->data & 15) == 0;
        *h = mix(mix(mix(mix(*h, 'T'), k->dtype), (uint64_t)k->device_type << 32 | (uint32_t)k->device_id),
                 (uint64_t)k->ndim << 2 | (uint64_t)k->strided << 1 | (uint64_t)k->aligned);
        for (int d = 0; d < dl.ndim; d++) { k->shape[d] = dl.shape[d]; *h = mix(*h, (uint64_t)dl.shape[d]); }
        if (k->strided)
            for (int d = 0; d < dl.ndim; d++) { k->strides[d] = dl.strides[d]; *h = mix(*h, (uint64_t)dl.strides[d]); }
        return 0;
    }
    k->type = Py_TYPE(o);
    *h = mix(*h, (uint64_t)(uintptr_t)k->type);
    if (s->roles[i] == 'S') {
        if (k->type != &PyFloat_Type && k->type != &PyLong_Type && k->type != &PyBool_Type) return -1;
        k->kind = 'S';
        return 0;
    }
    k->kind = 'O';
    k->value = o;                        /* borrowed until a plan keeps it */
    Py_hash_t v = PyObject_Hash(o);
    if (v == -1) { PyErr_Clear(); return -1; }
    *h = mix(*h, (uint64_t)v);
    return 0;
}

/* 1: equal, 0: not, -1: cannot tell (no Python error left set) */
static int key_equal(const rj_argkey *a, const rj_argkey *b) {
    if (a->kind != b->kind) return 0;
    switch (a->kind) {
    case 'N': return 1;
    case 'S': return a->type == b->type;
    case 'O': {
        if (a->type != b->type) return 0;
        if (a->value == b->value) return 1;
        int r = PyObject_RichCompareBool(a->value, b->value, Py_EQ);
        if (r < 0) { PyErr_Clear(); return -1; }
        return r;
    }
    default:
        if (a->dtype != b->dtype || a->device_type != b->device_type || a->device_id != b->device_id ||
            a->ndim != b->ndim || a->aligned != b->aligned || a->strided != b->strided)
            return 0;
        if (a->strided && memcmp(a->strides, b->strides, sizeof(int64_t) * (size_t)a->ndim) != 0) return 0;
        return memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) == 0;
    }
}

/* The object a reference names in one replay (borrowed). 'v': the argument's data pointer as an int (made by the
 * caller in ptrs: the launchers' Python path takes a pointer so); 'w': a result view (made by the caller). */
static PyObject *ref_object(const rj_ref *r, PyObject *const *args, PyObject **outs, PyObject **consts,
                            PyObject **derived, PyObject **ptrs, PyObject **views) {
    switch (r->kind) {
    case 'a': return args[r->index];
    case 'o': return outs[r->index];
    case 'c': return consts[r->index];
    case 'd': return derived[r->index];
    case 'v': return ptrs[r->index];
    case 'w': return views[r->index];
    default: return Py_None;
    }
}

/* Launch one of a plan's launches through its native Launcher's Spec without reading the tensors again: the
 * plan's key already matched everything the launcher checks (dtype, device, contiguity) against a call it
 * accepted; pointee alignment, the loaded function, the context are checked here. 0: launched; -1: not launched,
 * nothing set (the caller calls the launcher the ordinary way, which decides). */
static int launch_direct(Launcher *lz, const rj_launch *L, const Plan *plan, const rj_argkey *keys,
                         PyObject *const *args, void *const *out_ptrs, PyObject *const *derived, void *stream) {
    Spec *s = lz->spec;
    int dev = plan->device_id;
    union { char bytes[RJ_MAX_BLOCK]; double d; int64_t q; void *p; } block;
    void *ptrs[RJ_MAX_PARAMS];
    void *fn;
    unsigned long long shared = 0;
    if (s->nparams != L->nargs || dev < 0 || dev >= RJ_MAX_DEVICES || !(fn = s->fns[dev]) ||
        s->device_type != plan->device_type)
        return -1;
    if (L->shared) {                      /* a positive int, checked when the plan was added */
        shared = PyLong_AsUnsignedLongLong(L->shared);
        if (shared == (unsigned long long)-1 && PyErr_Occurred()) { PyErr_Clear(); return -1; }
        if (!shared_allowed(s, dev, shared)) return -1;
    }
    for (int i = 0; i < s->nparams; i++) {
        const rj_param *p = &s->params[i];
        const rj_ref *r = &L->args[i];
        char *dst = block.bytes + p->offset;
        ptrs[i] = dst;
        if (p->code == 'P') {
            void *ptr;
            switch (r->kind) {
            case 'a':
                /* a strided argument given as it is: the launcher's own path decides (it takes none) */
                if (keys[r->index].kind != 'T' || keys[r->index].strided) return -1;
                ptr = keys[r->index].data;
                break;
            case 'v': if (keys[r->index].kind != 'T') return -1; ptr = keys[r->index].data; break;
            case 'o': ptr = out_ptrs[r->index]; break;
            case 'c': if (!plan->const_is_tensor[r->index]) return -1; ptr = plan->const_ptrs[r->index]; break;
            case 'd': return -1;
            default: ptr = NULL;
            }
            if ((uintptr_t)ptr & p->align_mask) return -1;
            memcpy(dst, &ptr, sizeof ptr);
        } else {
            PyObject *o = r->kind == 'a' ? args[r->index] : r->kind == 'c' ? plan->consts[r->index] :
                          r->kind == 'd' ? derived[r->index] : NULL;
            if (!o || value_into(p, o, dst) != 0) return -1;
        }
    }
    if (!context_current(s, dev)) return -1;
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = s->launch(fn, lz->grid[0], lz->grid[1], lz->grid[2], lz->block[0], lz->block[1], lz->block[2],
                    (unsigned)shared, stream, ptrs, NULL);
    Py_END_ALLOW_THREADS
    if (err) return -1;
    lz->native_calls++;
    return 0;
}

static PyObject *plans_vectorcall(Plans *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    rj_argkey keys[RJ_MAX_OP_ARGS];
    uint64_t h = 0;
    Plan *plan = NULL;
    PyObject *outs[RJ_MAX_OUTS] = {0};
    void *out_ptrs[RJ_MAX_OUTS] = {0};
    void *stream = NULL;
    PyObject *stack[RJ_MAX_PARAMS + 1];
    PyObject *result = NULL;
    PyObject *derived[RJ_MAX_DERIVED] = {0};
    PyObject *ptrs[RJ_MAX_OP_ARGS] = {0};
    PyObject *views[RJ_MAX_VIEWS] = {0};
    int nouts = 0, nderived = 0, nviews = 0;

    if (kwnames || nargs != self->nargs || self->nplans == 0) goto fallback;
    for (int i = 0; i < self->nargs; i++)
        if (arg_key(self, i, args[i], &keys[i], &h) != 0) goto fallback;
    for (int p = 0; p < self->nplans && !plan; p++) {
        Plan *c = self->plans[p];
        if (c->hash != h) continue;
        int same = 1;
        for (int i = 0; i < self->nargs && same; i++) {
            int e = key_equal(&keys[i], &c->args[i]);
            if (e < 0) goto fallback;
            same = e;
        }
        if (same) plan = c;
    }
    if (!plan) goto fallback;
    Py_INCREF(plan);                      /* a launch releases the GIL: another thread may evict the plan */
    if (self->api->current_work_stream(plan->device_type, plan->device_id, &stream) != 0) {
        PyErr_Clear();
        goto miss;
    }
    if (plan->stream_bound && stream != plan->stream) goto miss;
    for (; nderived < plan->nderived; nderived++) {
        const rj_argkey *k = &keys[plan->derive_arg[nderived]];
        PyObject *ptr = k->kind == 'T' ? PyLong_FromVoidPtr(k->data) : NULL;
        PyObject *v = ptr ? PyObject_CallOneArg(plan->derive[nderived], ptr) : NULL;
        Py_XDECREF(ptr);
        if (!v) {                        /* the Python path makes the same call and reports what went wrong */
            PyErr_Clear();
            goto miss;
        }
        derived[nderived] = v;
    }
    if (plan->group && alloc_api && Py_TYPE(plan->group) == alloc_api->type) {
        if (alloc_api->make(plan->group, outs, out_ptrs) != 0) {
            PyErr_Clear();               /* out of memory...: the Python path repeats the allocation and reports */
            goto miss;
        }
        nouts = plan->nouts;
    } else {
        for (; nouts < plan->nouts; nouts++) {
            rj_out *o = &plan->outs[nouts];
            rj_tensor dl;
            PyObject *obj = PyObject_Vectorcall(o->make, o->argv, (size_t)o->nargv, NULL);
            if (!obj) {
                PyErr_Clear();
                goto miss;
            }
            outs[nouts] = obj;
            if (self->api->dltensor_from_py_object_no_sync(obj, &dl) != 0) {
                PyErr_Clear();
                nouts++;
                goto miss;
            }
            out_ptrs[nouts] = (char *)dl.data + dl.byte_offset;
        }
    }
    for (int l = 0; l < plan->nlaunches; l++) {
        rj_launch *L = &plan->launches[l];
        if (Py_TYPE(L->launcher) == &LauncherType &&
            launch_direct((Launcher *)L->launcher, L, plan, keys, args, out_ptrs, derived, stream) == 0) {
            self->direct++;
            continue;
        }
        for (int a = 0; a < L->nargs; a++) {
            const rj_ref *r = &L->args[a];
            if (r->kind == 'v' && !ptrs[r->index] && !(ptrs[r->index] = PyLong_FromVoidPtr(keys[r->index].data)))
                goto done;
            stack[a] = ref_object(r, args, outs, plan->consts, derived, ptrs, views);
        }
        if (L->kwnames) stack[L->nargs] = L->shared;
        PyObject *r = PyObject_Vectorcall(L->launcher, stack, (size_t)L->nargs, L->kwnames);
        if (!r) goto done;               /* the launcher's own Python path raised: a real error, passed on */
        Py_DECREF(r);
    }
    for (; nviews < plan->nviews; nviews++)    /* launched: a view that fails is a real error, passed on */
        if (!(views[nviews] = PyObject_CallOneArg(plan->view_fn[nviews], outs[plan->view_out[nviews]]))) goto done;
    if (plan->result_tuple) {
        result = PyTuple_New(plan->nresult);
        if (!result) goto done;
        for (int r = 0; r < plan->nresult; r++) {
            PyObject *o = ref_object(&plan->result[r], args, outs, plan->consts, derived, ptrs, views);
            Py_INCREF(o);
            PyTuple_SET_ITEM(result, r, o);
        }
    } else {
        result = ref_object(&plan->result[0], args, outs, plan->consts, derived, ptrs, views);
        Py_INCREF(result);
    }
    self->hits++;
done:
    for (int j = 0; j < nouts; j++) Py_XDECREF(outs[j]);
    for (int j = 0; j < nderived; j++) Py_XDECREF(derived[j]);
    for (int j = 0; j < nviews; j++) Py_XDECREF(views[j]);
    for (int j = 0; j < self->nargs; j++) Py_XDECREF(ptrs[j]);
    Py_DECREF(plan);
    return result;
miss:
    for (int j = 0; j < nouts; j++) Py_XDECREF(outs[j]);
    for (int j = 0; j < nderived; j++) Py_XDECREF(derived[j]);
    Py_DECREF(plan);
fallback:
    self->misses++;
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

/* Plans(roles, fallback, exchange_api, tensor_types): roles is one letter per positional op argument. */
static int plans_init(Plans *self, PyObject *args, PyObject *kw) {
    const char *roles;
    PyObject *fallback, *api, *types;
    if (!PyArg_ParseTuple(args, "sOOO!", &roles, &fallback, &api, &PyTuple_Type, &types)) return -1;
    size_t n = strlen(roles);
    if (n > RJ_MAX_OP_ARGS || strspn(roles, "TSO") != n) {
        PyErr_Format(PyExc_ValueError, "roles: at most %d of 'T', 'S', 'O'", RJ_MAX_OP_ARGS);
        return -1;
    }
    if (!PyCallable_Check(fallback)) { PyErr_SetString(PyExc_TypeError, "fallback: a callable"); return -1; }
    if (PyTuple_GET_SIZE(types) < 1 || PyTuple_GET_SIZE(types) > RJ_MAX_TYPES) {
        PyErr_SetString(PyExc_ValueError, "tensor_types: 1 to 4 types");
        return -1;
    }
    self->api = address_of(api, "exchange_api");
    if (!self->api) return -1;
    if (self->api->major != 1 || !self->api->dltensor_from_py_object_no_sync || !self->api->current_work_stream) {
        PyErr_SetString(PyExc_ValueError, "the framework's DLPack exchange API lacks what op plans need");
        return -1;
    }
    self->nargs = (int)n;
    memcpy(self->roles, roles, n);
    for (int i = 0; i < (int)PyTuple_GET_SIZE(types); i++) {
        PyObject *t = PyTuple_GET_ITEM(types, i);
        if (!PyType_Check(t)) { PyErr_SetString(PyExc_TypeError, "tensor_types: types"); return -1; }
        Py_INCREF(t);
        self->types[self->ntypes++] = (PyTypeObject *)t;
    }
    Py_INCREF(fallback);
    Py_XSETREF(self->fallback, fallback);
    self->vectorcall = (vectorcallfunc)plans_vectorcall;
    return 0;
}

/* One reference: of a launch (nviews 0, so 'w' is refused) or of the result (nargs_v 0 and nderived 0: 'v' and
 * 'd' are refused) */
static int parse_ref(PyObject *o, rj_ref *r, int nargs, int nargs_v, int nouts, int nconsts, int nderived,
                     int nviews) {
    const char *kind;
    int index;
    if (o == Py_None) { r->kind = 'n'; r->index = 0; return 0; }
    if (!PyArg_ParseTuple(o, "si", &kind, &index)) return -1;
    int limit = kind[0] == 'a' ? nargs : kind[0] == 'v' ? nargs_v : kind[0] == 'o' ? nouts :
                kind[0] == 'c' ? nconsts : kind[0] == 'd' ? nderived : kind[0] == 'w' ? nviews : -1;
    if (kind[1] || index < 0 || index >= limit) {
        PyErr_Format(PyExc_ValueError, "bad reference (%s, %d)", kind, index);
        return -1;
    }
    r->kind = kind[0];
    r->index = index;
    return 0;
}

/* derived / views of plans.add: a list (or NULL) of at most `max` (callable, index) pairs, index < limit and, with
 * `s` given, naming a tensor argument; into fns (new references) and idx, *n counting those taken. -1: an error set. */
static int fn_index_pairs(PyObject *list, int max, int limit, const char *what, const Plans *s, const Plan *p,
                          PyObject **fns, int *idx, int *n) {
    Py_ssize_t count = list ? PyList_GET_SIZE(list) : 0;
    if (count > max) { PyErr_Format(PyExc_ValueError, "%s: at most %d", what, max); return -1; }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *fn;
        int at;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(list, i), "Oi", &fn, &at)) return -1;
        if (!PyCallable_Check(fn) || at < 0 || at >= limit ||
            (s && (s->roles[at] != 'T' || p->args[at].kind != 'T'))) {
            PyErr_SetString(PyExc_ValueError, what);
            return -1;
        }
        Py_INCREF(fn);
        fns[i] = fn;
        idx[i] = at;
        *n = (int)i + 1;
    }
    return 0;
}

/* plans.add(args, outputs, consts, launches, result, as_tuple, stream, group=None, derived=(), views=())
 *   args: the op arguments of the call being recorded (its key is read from them, as a later call's would be)
 *   outputs: [(shape, make), ...]: make(*shape) makes each (make(()) for a 0-d output)
 *   group: None, or the torch allocator's Outputs making the same outputs in one call (set_allocator first)
 *   launches: [(launcher, [ref, ...], shared_mem), ...] with ref ("a", i) | ("o", j) | ("c", k) | ("d", l) |
 *     ("v", i) (a pointer parameter given a view of tensor argument i: that argument's data pointer) | None
 *   derived: [(fn, i), ...]: value l of a call is fn(data pointer of its op argument i, an int), made before its
 *     launches (a tensor map of that tensor...): the one kind of launch argument that follows a pointer
 *   views: [(fn, j), ...]: view m of a call is fn(its output j), made after its launches (e.g. a transpose)
 *   result: [ref, ...] (("w", m) a view, or "a" / "o" / "c" / None), returned as a tuple when as_tuple, else its
 *     one element
 *   stream: None, or the stream handle the plan is bound to (its constants belong to that stream)
 * Returns True when the plan was added, False when this call cannot be a plan (e.g. no tensor argument). */
static PyObject *plans_add(Plans *self, PyObject *args) {
    PyObject *call, *outputs, *consts, *launches, *result, *stream, *group = Py_None, *derived = NULL, *views = NULL;
    int as_tuple;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!pO|OO!O!", &PyTuple_Type, &call, &PyList_Type, &outputs, &PyList_Type,
                          &consts, &PyList_Type, &launches, &PyList_Type, &result, &as_tuple, &stream, &group,
                          &PyList_Type, &derived, &PyList_Type, &views))
        return NULL;
    if (group != Py_None && (!alloc_api || Py_TYPE(group) != alloc_api->type ||
                             alloc_api->count(group) != (int)PyList_GET_SIZE(outputs))) {
        PyErr_SetString(PyExc_ValueError, "group: the registered allocator's Outputs, one per output");
        return NULL;
    }
    if (PyTuple_GET_SIZE(call) != self->nargs) {
        PyErr_Format(PyExc_ValueError, "args: %d op arguments expected", self->nargs);
        return NULL;
    }
    Plan *p = PyObject_New(Plan, &PlanType);
    if (!p) return NULL;
    memset((char *)p + sizeof(PyObject), 0, sizeof(Plan) - sizeof(PyObject));
    uint64_t h = 0;
    int device_known = 0;
    for (int i = 0; i < self->nargs; i++) {
        if (arg_key(self, i, PyTuple_GET_ITEM(call, i), &p->args[i], &h) != 0) {
            p->nargs = i;
            Py_DECREF(p);
            Py_RETURN_FALSE;
        }
        p->nargs = i + 1;
        Py_XINCREF(p->args[i].value);
        if (p->args[i].kind == 'T') {
            if (!device_known) {
                p->device_type = p->args[i].device_type;
                p->device_id = p->args[i].device_id;
                device_known = 1;
            } else if (p->args[i].device_type != p->device_type || p->args[i].device_id != p->device_id) {
                Py_DECREF(p);
                Py_RETURN_FALSE;
            }
        }
    }
    if (!device_known) { Py_DECREF(p); Py_RETURN_FALSE; }
    p->hash = h;
    if (PyList_GET_SIZE(outputs) > RJ_MAX_OUTS) { PyErr_SetString(PyExc_ValueError, "outputs: too many"); goto fail; }
    p->nouts = (int)PyList_GET_SIZE(outputs);
    for (int j = 0; j < p->nouts; j++) {
        PyObject *shape, *make;
        rj_out *o = &p->outs[j];
        if (!PyArg_ParseTuple(PyList_GET_ITEM(outputs, j), "O!O", &PyTuple_Type, &shape, &make)) goto fail;
        if (!PyCallable_Check(make)) { PyErr_SetString(PyExc_TypeError, "output: make must be callable"); goto fail; }
        Py_ssize_t nd = PyTuple_GET_SIZE(shape);
        if (nd > RJ_MAX_DIMS) { PyErr_SetString(PyExc_ValueError, "output: too many dims"); goto fail; }
        for (Py_ssize_t d = 0; d < nd; d++) {
            PyObject *s = PyTuple_GET_ITEM(shape, d);
            if (!PyLong_CheckExact(s) || PyLong_AsLongLong(s) < 0) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "output: sizes are ints >= 0");
                goto fail;
            }
        }
        o->nargv = nd ? (int)nd : 1;
        for (int d = 0; d < o->nargv; d++) {
            o->argv[d] = nd ? PyTuple_GET_ITEM(shape, d) : shape;
            Py_INCREF(o->argv[d]);
        }
        Py_INCREF(make);
        o->make = make;
    }
    if (group != Py_None) {
        Py_INCREF(group);
        p->group = group;
    }
    p->nconsts = (int)PyList_GET_SIZE(consts);
    p->consts = PyMem_Calloc(p->nconsts ? p->nconsts : 1, sizeof(PyObject *));
    p->const_ptrs = PyMem_Calloc(p->nconsts ? p->nconsts : 1, sizeof(void *));
    p->const_is_tensor = PyMem_Calloc(p->nconsts ? p->nconsts : 1, sizeof(int));
    if (!p->consts || !p->const_ptrs || !p->const_is_tensor) { PyErr_NoMemory(); goto fail; }
    for (int k = 0; k < p->nconsts; k++) {
        PyObject *c = PyList_GET_ITEM(consts, k);
        p->consts[k] = c;
        Py_INCREF(c);
        PyTypeObject *t = Py_TYPE(c);
        int known = 0;
        for (int j = 0; j < self->ntypes; j++) known |= (t == self->types[j]);
        if (known) {            /* kept alive by the plan: its pointer stays valid */
            rj_tensor dl;
            if (self->api->dltensor_from_py_object_no_sync(c, &dl) != 0) goto fail;
            if (dl.device.device_type != p->device_type || dl.device.device_id != p->device_id) {
                PyErr_SetString(PyExc_ValueError, "a constant tensor on another device than the plan's");
                goto fail;
            }
            p->const_ptrs[k] = (char *)dl.data + dl.byte_offset;
            p->const_is_tensor[k] = 1;
        }
    }
    if (fn_index_pairs(derived, RJ_MAX_DERIVED, self->nargs, "derived: (callable, index of a tensor argument)",
                       self, p, p->derive, p->derive_arg, &p->nderived) ||
        fn_index_pairs(views, RJ_MAX_VIEWS, p->nouts, "views: (callable, index of an output)", NULL, p, p->view_fn,
                       p->view_out, &p->nviews))
        goto fail;
    Py_ssize_t nl = PyList_GET_SIZE(launches);
    p->launches = PyMem_Calloc(nl ? nl : 1, sizeof(rj_launch));
    if (!p->launches) { PyErr_NoMemory(); goto fail; }
    for (Py_ssize_t l = 0; l < nl; l++) {
        PyObject *launcher, *refs, *shared;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(launches, l), "OO!O", &launcher, &PyList_Type, &refs, &shared)) goto fail;
        rj_launch *L = &p->launches[l];
        p->nlaunches = (int)l + 1;
        if (!PyCallable_Check(launcher) || PyList_GET_SIZE(refs) > RJ_MAX_PARAMS) {
            PyErr_SetString(PyExc_ValueError, "launch: a callable and at most MAX_PARAMS arguments");
            goto fail;
        }
        Py_INCREF(launcher);
        L->launcher = launcher;
        L->nargs = (int)PyList_GET_SIZE(refs);
        L->args = PyMem_Calloc(L->nargs ? L->nargs : 1, sizeof(rj_ref));
        if (!L->args) { PyErr_NoMemory(); goto fail; }
        for (int a = 0; a < L->nargs; a++) {
            if (parse_ref(PyList_GET_ITEM(refs, a), &L->args[a], self->nargs, self->nargs, p->nouts, p->nconsts,
                          p->nderived, 0))
                goto fail;
            if (L->args[a].kind == 'v' && p->args[L->args[a].index].kind != 'T') {
                PyErr_SetString(PyExc_ValueError, "a ('v', i) reference names a tensor argument");
                goto fail;
            }
        }
        if (!PyLong_CheckExact(shared)) { PyErr_SetString(PyExc_TypeError, "shared_mem: an int"); goto fail; }
        if (PyObject_IsTrue(shared)) {
            L->kwnames = Py_BuildValue("(O)", str_shared_mem);
            if (!L->kwnames) goto fail;
            Py_INCREF(shared);
            L->shared = shared;
        }
    }
    p->nresult = (int)PyList_GET_SIZE(result);
    p->result_tuple = as_tuple;
    if (p->nresult < 1 || (!as_tuple && p->nresult != 1)) {
        PyErr_SetString(PyExc_ValueError, "result: one reference, or a tuple of them");
        goto fail;
    }
    p->result = PyMem_Calloc(p->nresult, sizeof(rj_ref));
    if (!p->result) { PyErr_NoMemory(); goto fail; }
    for (int r = 0; r < p->nresult; r++)
        if (parse_ref(PyList_GET_ITEM(result, r), &p->result[r], self->nargs, 0, p->nouts, p->nconsts, 0, p->nviews))
            goto fail;
    if (stream != Py_None) {
        p->stream = PyLong_AsVoidPtr(stream);
        if (!p->stream && PyErr_Occurred()) goto fail;
        p->stream_bound = 1;
    }
    if (self->nplans == RJ_MAX_PLANS) Py_DECREF(self->plans[--self->nplans]);     /* the oldest goes */
    memmove(&self->plans[1], &self->plans[0], sizeof(Plan *) * (size_t)self->nplans);
    self->plans[0] = p;
    self->nplans++;
    Py_RETURN_TRUE;
fail:
    Py_DECREF(p);
    return NULL;
}

static PyObject *plans_clear_all(Plans *self, PyObject *unused) {
    while (self->nplans) Py_DECREF(self->plans[--self->nplans]);
    Py_RETURN_NONE;
}

static int plans_traverse(Plans *self, visitproc visit, void *arg) {
    Py_VISIT(self->fallback);
    return 0;
}

static int plans_gc_clear(Plans *self) {
    Py_CLEAR(self->fallback);
    plans_clear_all(self, NULL);
    return 0;
}

static void plans_dealloc(Plans *self) {
    PyObject_GC_UnTrack(self);
    plans_gc_clear(self);
    for (int i = 0; i < self->ntypes; i++) Py_XDECREF((PyObject *)self->types[i]);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *plans_len(Plans *self, void *closure) { return PyLong_FromLong(self->nplans); }

static PyMethodDef plans_methods[] = {
    {"add", (PyCFunction)plans_add, METH_VARARGS,
     "add(args, outputs, consts, launches, result, as_tuple, stream, group=None, derived=(), views=())"},
    {"clear", (PyCFunction)plans_clear_all, METH_NOARGS, "forget every plan"},
    {NULL}
};

static PyMemberDef plans_members[] = {
    {"hits", T_ULONGLONG, offsetof(Plans, hits), READONLY, "calls completed by a plan"},
    {"misses", T_ULONGLONG, offsetof(Plans, misses), READONLY, "calls handed to the Python path"},
    {"direct", T_ULONGLONG, offsetof(Plans, direct), READONLY, "launches made through a native launcher's Spec"},
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(Plans, vectorcall), READONLY},
    {NULL}
};

static PyGetSetDef plans_getset[] = {
    {"size", (getter)plans_len, NULL, "plans held (at most MAX_PLANS, the oldest evicted first)"},
    {NULL}
};

static PyTypeObject PlansType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rocjit._launch.Plans",
    .tp_basicsize = sizeof(Plans),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "An op's eager plans: a call matching one runs it here, every other call goes to the fallback",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)plans_init,
    .tp_dealloc = (destructor)plans_dealloc,
    .tp_traverse = (traverseproc)plans_traverse,
    .tp_clear = (inquiry)plans_gc_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Plans, vectorcall),
    .tp_methods = plans_methods,
    .tp_members = plans_members,
    .tp_getset = plans_getset,
};

/* Programmatic dependent launch (CUDA, sm_90+): rj_launch_pdl has cuLaunchKernel's signature (a Spec takes it as
 * its launch function) and launches through cuLaunchKernelEx with the programmatic stream serialization attribute,
 * so the kernel may start while the kernel ahead of it in the stream finishes; the kernel itself waits
 * (griddepcontrol.wait) before it touches memory that kernel writes or reads. The structures as cuda.h (12.x)
 * lays them out. */
typedef struct { int32_t id; char pad[4]; union { char bytes[64]; int32_t value; } value; } rj_launch_attr;
typedef struct {
    unsigned grid[3], block[3], shared_mem;
    void *stream;
    rj_launch_attr *attrs;
    unsigned nattrs;
} rj_launch_config;
typedef int (*rj_launch_ex_fn)(const rj_launch_config *config, void *f, void **params, void **extra);
#define RJ_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION 6
static rj_launch_ex_fn launch_ex;

static int rj_launch_pdl(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                         unsigned shared_mem, void *stream, void **params, void **extra) {
    rj_launch_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.id = RJ_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.value = 1;
    rj_launch_config cfg = {{gx, gy, gz}, {bx, by, bz}, shared_mem, stream, &attr, 1};
    return launch_ex(&cfg, f, params, extra);
}

/* pdl_launch(cuLaunchKernelEx address) -> the address of rj_launch_pdl, a launch function for Spec */
static PyObject *pdl_launch(PyObject *m, PyObject *arg) {
    void *ex = address_of(arg, "cuLaunchKernelEx");
    if (!ex) return NULL;
    launch_ex = (rj_launch_ex_fn)ex;
    return PyLong_FromVoidPtr((void *)rj_launch_pdl);
}

/* set_allocator(capsule): the torch allocator's C API (its module's _C_API), used by every plan given a group */
static PyObject *set_allocator(PyObject *m, PyObject *capsule) {
    const rj_alloc_api *api = PyCapsule_GetPointer(capsule, "rocjit.torch_alloc.api");
    if (!api) return NULL;
    if (api->version != 1) {
        PyErr_Format(PyExc_ValueError, "set_allocator: API version %d, expected 1", api->version);
        return NULL;
    }
    Py_INCREF(capsule);
    Py_XSETREF(alloc_capsule, capsule);
    alloc_api = api;
    Py_RETURN_NONE;
}

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
    {"set_allocator", set_allocator, METH_O, "set_allocator(capsule): the torch allocator's C API for plans' groups"},
    {"pdl_launch", pdl_launch, METH_O, "pdl_launch(cuLaunchKernelEx address) -> a launch function address that "
                                         "sets the programmatic stream serialization attribute"},
    {NULL}
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rocjit_launch", "rocjit's native launcher (built at first use)", -1, module_methods
};

PyMODINIT_FUNC PyInit__rocjit_launch(void) {
    if (PyType_Ready(&SpecType) < 0 || PyType_Ready(&LauncherType) < 0 || PyType_Ready(&PlanType) < 0 ||
        PyType_Ready(&PlansType) < 0)
        return NULL;
    str_shared_mem = PyUnicode_InternFromString("shared_mem");
    str_stream = PyUnicode_InternFromString("stream");
    if (!str_shared_mem || !str_stream) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&SpecType);
    Py_INCREF(&LauncherType);
    if (PyModule_AddObject(m, "Spec", (PyObject *)&SpecType) < 0 ||
        PyModule_AddObject(m, "Launcher", (PyObject *)&LauncherType) < 0 ||
        PyModule_AddObjectRef(m, "Plans", (PyObject *)&PlansType) < 0 ||
        PyModule_AddIntConstant(m, "MAX_PLANS", RJ_MAX_PLANS) < 0 ||
        PyModule_AddIntConstant(m, "MAX_DERIVED", RJ_MAX_DERIVED) < 0 ||
        PyModule_AddIntConstant(m, "MAX_VIEWS", RJ_MAX_VIEWS) < 0 ||
        PyModule_AddIntConstant(m, "MAX_PARAMS", RJ_MAX_PARAMS) < 0 ||
        PyModule_AddIntConstant(m, "MAX_BLOCK", RJ_MAX_BLOCK) < 0 ||
        PyModule_AddIntConstant(m, "MAX_DEVICES", RJ_MAX_DEVICES) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
