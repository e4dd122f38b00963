/* rocjit's torch allocator, for the eager op plans (launcher.c):
 *
 * - `Empty(prototype)` objects, called as empty(*sizes) or empty(sizes), return a new torch tensor of the
 *   prototype's dtype and device from at::empty -- what prototype.new_empty(sizes) returns (a tensor of torch's own
 *   allocator: its caching allocator knows the block, Tensor.record_stream works on it), less torch's Python
 *   argument parsing.
 * - `Outputs(specs, share_limit)` objects make all the outputs of one op call at once: specs is a sequence of
 *   (prototype, sizes). Called, they return a tuple of new tensors; the plans call them through the C API below
 *   (`_C_API`, a capsule), which also hands back each output's data pointer, so a replay neither calls Python nor
 *   asks DLPack per output. When there are several outputs on one device and together they need at most
 *   share_limit bytes, they are carved out of one at::empty block at 256-byte offsets (one caching-allocator
 *   round trip in place of one per output); the tensors then share that storage, as torch.split's pieces do, and
 *   the block returns to torch's allocator when the last of them is gone. Blocks come straight from the allocator
 *   at::empty uses for the device (the one named by the storage of a tensor at::empty made), and become tensors as
 *   at::empty makes them, without the dispatcher and the device guard; a block from another device (another one
 *   is current) or another allocator, and torch's deterministic mode (which fills new memory), take at::empty.
 *
 * Built at first use against the torch that is installed (rocjit/native.py) and kept in the rocjit cache like the
 * native launcher; where it cannot be built, the plans use new_empty. Errors are torch's own (negative sizes,
 * out of memory...), raised as torch raises them. */
#include <Python.h>
#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#define RJ_EMPTY_MAX_DIMS 16
#define RJ_OUTPUTS_MAX 8
#define RJ_OUTPUTS_ALIGN 256

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    c10::ScalarType dtype;
    c10::DeviceType device_type;
    c10::DeviceIndex device_index;
} Empty;

static PyObject *empty_vectorcall(Empty *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    PyObject *const *items = args;
    if (kwnames && PyTuple_GET_SIZE(kwnames)) {
        PyErr_SetString(PyExc_TypeError, "empty(*sizes) takes no keyword arguments");
        return NULL;
    }
    if (n == 1 && PyTuple_Check(args[0])) {      /* empty((2, 3)) and empty(()) for a 0-d tensor */
        n = PyTuple_GET_SIZE(args[0]);
        items = &PyTuple_GET_ITEM(args[0], 0);
    }
    if (n > RJ_EMPTY_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "empty(*sizes): at most %d dimensions, got %zd", RJ_EMPTY_MAX_DIMS, n);
        return NULL;
    }
    int64_t sizes[RJ_EMPTY_MAX_DIMS];
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyLong_Check(items[i])) {
            PyErr_Format(PyExc_TypeError, "empty(*sizes): size %zd must be an int, not %.100s", i,
                         Py_TYPE(items[i])->tp_name);
            return NULL;
        }
        sizes[i] = PyLong_AsLongLong(items[i]);
        if (sizes[i] == -1 && PyErr_Occurred()) return NULL;
    }
    HANDLE_TH_ERRORS
    at::Tensor t = at::empty(c10::IntArrayRef(sizes, (size_t)n),
                             at::TensorOptions().dtype(self->dtype).device(self->device_type, self->device_index));
    return THPVariable_Wrap(std::move(t));
    END_HANDLE_TH_ERRORS
}

static PyObject *empty_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *proto;
    static const char *kw[] = {"prototype", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:Empty", (char **)kw, &proto)) return NULL;
    if (!THPVariable_Check(proto)) {
        PyErr_Format(PyExc_TypeError, "Empty(prototype): prototype must be a torch.Tensor, not %.100s",
                     Py_TYPE(proto)->tp_name);
        return NULL;
    }
    const at::Tensor &t = THPVariable_Unpack(proto);
    if (t.layout() != c10::kStrided) {
        PyErr_SetString(PyExc_ValueError, "Empty(prototype): prototype must be a strided (dense) tensor");
        return NULL;
    }
    Empty *self = (Empty *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->vectorcall = (vectorcallfunc)empty_vectorcall;
    self->dtype = t.scalar_type();
    self->device_type = t.device().type();
    self->device_index = t.device().index();
    return (PyObject *)self;
}

static PyObject *empty_repr(Empty *self) {
    std::string s = "rocjit Empty(" + std::string(c10::toString(self->dtype)) + ", " +
                    c10::Device(self->device_type, self->device_index).str() + ")";
    return PyUnicode_FromString(s.c_str());
}

static PyTypeObject EmptyType = {PyVarObject_HEAD_INIT(NULL, 0) "rocjit._torch_alloc.Empty"};

/* ----------------------------------------------------------------------------- Outputs */
typedef struct {
    c10::ScalarType dtype;
    int ndim;
    int64_t sizes[RJ_EMPTY_MAX_DIMS];
    int64_t nbytes;            /* -1: too large to count (made by at::empty, which reports it) */
    int64_t offset;            /* bytes into the shared block */
} OutSpec;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int n, shared;
    c10::DeviceType device_type;
    c10::DeviceIndex device_index;
    int64_t total;             /* bytes of the shared block */
    OutSpec specs[RJ_OUTPUTS_MAX];
    /* The allocator at::empty took for this device (read from the storage of a tensor it made), the deleter of its
     * blocks and the backend's dispatch keys: storages are made straight from it, as at::empty makes them, less
     * the dispatcher and the device guard (about 1.3 us per tensor on an H100 host). NULL: at::empty each time. */
    c10::Allocator *allocator;
    c10::DeleterFnPtr deleter;
    c10::DispatchKeySet keys;
} Outputs;

static PyTypeObject OutputsType = {PyVarObject_HEAD_INIT(NULL, 0) "rocjit._torch_alloc.Outputs"};

/* A new contiguous tensor of `nbytes` bytes from the allocator at::empty uses, made as at::empty makes it (a
 * resizable storage of that allocator, the backend's dispatch keys). An undefined tensor when the block is not
 * what at::empty would have given (another device is current, another allocator now): the caller takes at::empty. */
static at::Tensor direct_empty(const Outputs *self, int64_t nbytes, c10::ScalarType dtype) {
    c10::DataPtr block = self->allocator->allocate((size_t)nbytes);
    if (block.device() != c10::Device(self->device_type, self->device_index) ||
        (block.get() && block.get_deleter() != self->deleter))
        return at::Tensor();
    auto storage = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes, std::move(block),
                                                         self->allocator, /*resizable=*/true);
    return at::detail::make_tensor<c10::TensorImpl>(c10::Storage(std::move(storage)), self->keys,
                                                    caffe2::TypeMeta::fromScalarType(dtype));
}

/* torch.use_deterministic_algorithms fills new memory (NaN) in at::empty: then at::empty makes everything */
static bool direct_allowed(const Outputs *self) {
    if (!self->allocator) return false;
    const auto &ctx = at::globalContext();
    return !(ctx.deterministicAlgorithms() && ctx.deterministicFillUninitializedMemory());
}

/* The outputs as tensors, with their data pointers. 0, or -1 with a Python error set. */
static int make_tensors(const Outputs *self, at::Tensor *ts, void **ptrs) {
    HANDLE_TH_ERRORS
    const auto device = c10::Device(self->device_type, self->device_index);
    const bool direct = direct_allowed(self);
    if (self->shared) {
        at::Tensor block = direct ? direct_empty(self, self->total, at::kByte) : at::Tensor();
        if (!block.defined()) block = at::empty({self->total}, at::TensorOptions().dtype(at::kByte).device(device));
        for (int i = 0; i < self->n; i++) {
            const OutSpec *o = &self->specs[i];
            ts[i] = at::detail::make_tensor<c10::TensorImpl>(
                c10::Storage(block.storage()), block.key_set(), caffe2::TypeMeta::fromScalarType(o->dtype));
            ts[i].unsafeGetTensorImpl()->set_storage_offset(o->offset / (int64_t)c10::elementSize(o->dtype));
            ts[i].unsafeGetTensorImpl()->set_sizes_contiguous(c10::IntArrayRef(o->sizes, (size_t)o->ndim));
            ptrs[i] = ts[i].mutable_data_ptr();
        }
        return 0;
    }
    for (int i = 0; i < self->n; i++) {
        const OutSpec *o = &self->specs[i];
        const c10::IntArrayRef sizes(o->sizes, (size_t)o->ndim);
        ts[i] = direct && o->nbytes >= 0 ? direct_empty(self, o->nbytes, o->dtype) : at::Tensor();
        if (ts[i].defined()) ts[i].unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
        else ts[i] = at::empty(sizes, at::TensorOptions().dtype(o->dtype).device(device));
        ptrs[i] = ts[i].mutable_data_ptr();
    }
    return 0;
    END_HANDLE_TH_ERRORS_RET(-1)
}

/* The outputs made: new references in outs[i], data pointers in ptrs[i]. 0, or -1 with a Python error set (and
 * nothing left in outs). */
static int outputs_make(PyObject *obj, PyObject **outs, void **ptrs) {
    const Outputs *self = (const Outputs *)obj;
    at::Tensor ts[RJ_OUTPUTS_MAX];
    if (make_tensors(self, ts, ptrs) != 0) return -1;
    int made = 0;
    try {
        for (; made < self->n; made++)
            if (!(outs[made] = THPVariable_Wrap(std::move(ts[made])))) break;
    } catch (...) {
        torch::translate_exception_to_python(std::current_exception());
    }
    if (made == self->n) return 0;
    while (made--) Py_CLEAR(outs[made]);
    return -1;
}

static int outputs_count(PyObject *obj) { return ((Outputs *)obj)->n; }

static PyObject *outputs_vectorcall(Outputs *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) || (kwnames && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "outputs() takes no arguments");
        return NULL;
    }
    PyObject *outs[RJ_OUTPUTS_MAX];
    void *ptrs[RJ_OUTPUTS_MAX];
    if (outputs_make((PyObject *)self, outs, ptrs) != 0) return NULL;
    PyObject *t = PyTuple_New(self->n);
    if (!t) {
        for (int i = 0; i < self->n; i++) Py_DECREF(outs[i]);
        return NULL;
    }
    for (int i = 0; i < self->n; i++) PyTuple_SET_ITEM(t, i, outs[i]);
    return t;
}

/* Which allocator at::empty takes for a device: the one named by the storage of a tensor it made, asked once per
 * device (under the GIL) and kept with its blocks' deleter; no allocator where that storage is not a plain
 * resizable block of that device. 0, or -1 with a Python error set. */
typedef struct {
    c10::DeviceType type;
    c10::DeviceIndex index;
    c10::Allocator *allocator;
    c10::DeleterFnPtr deleter;
} Probe;
#define RJ_MAX_PROBES 64
static Probe probes[RJ_MAX_PROBES];
static int nprobes;

static int allocator_probe(Outputs *self) {
    const Probe *found = NULL;
    for (int i = 0; i < nprobes && !found; i++)
        if (probes[i].type == self->device_type && probes[i].index == self->device_index) found = &probes[i];
    if (!found) {
        HANDLE_TH_ERRORS
        const auto device = c10::Device(self->device_type, self->device_index);
        at::Tensor probe = at::empty({1}, at::TensorOptions().dtype(at::kByte).device(device));
        const c10::Storage &st = probe.storage();
        const bool plain = st.allocator() && st.data_ptr().device() == device && st.resizable();
        Probe p = {self->device_type, self->device_index, plain ? st.allocator() : nullptr,
                   plain ? st.data_ptr().get_deleter() : nullptr};
        if (nprobes == RJ_MAX_PROBES) {
            self->allocator = p.allocator;       /* more devices than slots: this one is asked every time */
            self->deleter = p.deleter;
        } else {
            probes[nprobes] = p;
            found = &probes[nprobes++];
        }
        END_HANDLE_TH_ERRORS_RET(-1)
    }
    if (found) {
        self->allocator = found->allocator;
        self->deleter = found->deleter;
    }
    if (self->allocator)
        self->keys = c10::DispatchKeySet(
            c10::computeDispatchKey(at::kByte, c10::kStrided, c10::Device(self->device_type, self->device_index)));
    return 0;
}

/* Outputs(specs, share_limit=0): specs a sequence of (prototype tensor, sizes tuple) */
static PyObject *outputs_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *specs;
    long long share_limit = 0;
    static const char *kw[] = {"specs", "share_limit", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|L:Outputs", (char **)kw, &specs, &share_limit)) return NULL;
    PyObject *seq = PySequence_Fast(specs, "Outputs(specs): specs must be a sequence of (prototype, sizes)");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > RJ_OUTPUTS_MAX) {
        PyErr_Format(PyExc_ValueError, "Outputs(specs): 1 to %d outputs, got %zd", RJ_OUTPUTS_MAX, n);
        Py_DECREF(seq);
        return NULL;
    }
    Outputs *self = (Outputs *)type->tp_alloc(type, 0);
    if (!self) { Py_DECREF(seq); return NULL; }
    self->vectorcall = (vectorcallfunc)outputs_vectorcall;
    self->n = (int)n;
    int same_device = 1;
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *proto, *sizes;
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "OO!", &proto, &PyTuple_Type, &sizes)) {
            if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError, "Outputs(specs): spec %zd must be (prototype tensor, sizes tuple)", i);
            }
            goto fail;
        }
        if (!THPVariable_Check(proto)) {
            PyErr_Format(PyExc_TypeError, "Outputs(specs): spec %zd's prototype must be a torch.Tensor, not %.100s",
                         i, Py_TYPE(proto)->tp_name);
            goto fail;
        }
        const at::Tensor &t = THPVariable_Unpack(proto);
        if (t.layout() != c10::kStrided) {
            PyErr_Format(PyExc_ValueError, "Outputs(specs): spec %zd's prototype must be a strided (dense) tensor", i);
            goto fail;
        }
        OutSpec *o = &self->specs[i];
        o->dtype = t.scalar_type();
        if (i == 0) {
            self->device_type = t.device().type();
            self->device_index = t.device().index();
        } else if (t.device().type() != self->device_type || t.device().index() != self->device_index) {
            same_device = 0;
        }
        Py_ssize_t nd = PyTuple_GET_SIZE(sizes);
        if (nd > RJ_EMPTY_MAX_DIMS) {
            PyErr_Format(PyExc_ValueError, "Outputs(specs): spec %zd has more than %d dimensions", i, RJ_EMPTY_MAX_DIMS);
            goto fail;
        }
        o->ndim = (int)nd;
        int64_t numel = 1, nbytes = 0;
        bool big = false;
        for (Py_ssize_t d = 0; d < nd; d++) {
            PyObject *s = PyTuple_GET_ITEM(sizes, d);
            long long v = PyLong_Check(s) ? PyLong_AsLongLong(s) : -1;
            if (v < 0) {
                if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_OverflowError)) {
                    PyErr_Clear();
                    PyErr_Format(PyExc_ValueError, "Outputs(specs): spec %zd's sizes must be ints >= 0", i);
                }
                goto fail;
            }
            o->sizes[d] = v;
            big |= __builtin_mul_overflow(numel, (int64_t)v, &numel);
        }
        big |= __builtin_mul_overflow(numel, (int64_t)c10::elementSize(o->dtype), &nbytes);
        big |= nbytes > ((int64_t)1 << 50);
        o->nbytes = big ? -1 : nbytes;
        o->offset = total;
        if (big || total < 0) total = -1;                                   /* too big to share: made one by one */
        else total += (nbytes + RJ_OUTPUTS_ALIGN - 1) / RJ_OUTPUTS_ALIGN * RJ_OUTPUTS_ALIGN;
    }
    Py_DECREF(seq);
    self->shared = n > 1 && same_device && total > 0 && total <= share_limit;
    self->total = self->shared ? total : 0;
    if (!same_device) {
        PyErr_SetString(PyExc_ValueError, "Outputs(specs): every prototype must be on one device");
        Py_DECREF(self);
        return NULL;
    }
    if (allocator_probe(self) != 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
fail:
    Py_DECREF(seq);
    Py_DECREF(self);
    return NULL;
}

static PyObject *outputs_repr(Outputs *self) {
    std::string s = "rocjit Outputs(" + std::to_string(self->n) + " on " +
                    c10::Device(self->device_type, self->device_index).str() +
                    (self->shared ? ", one block of " + std::to_string(self->total) + " bytes)" : ")");
    return PyUnicode_FromString(s.c_str());
}

static PyObject *outputs_shared(Outputs *self, void *closure) { return PyBool_FromLong(self->shared); }

static PyObject *outputs_direct(Outputs *self, void *closure) { return PyBool_FromLong(direct_allowed(self)); }

static PyGetSetDef outputs_getset[] = {
    {"shared", (getter)outputs_shared, NULL, "whether the outputs are carved out of one block", NULL},
    {"direct", (getter)outputs_direct, NULL, "whether blocks come straight from at::empty's allocator now", NULL},
    {NULL}
};

/* The C API the plans use (launcher.c keeps a copy of this layout). */
typedef struct {
    int version;
    PyTypeObject *type;
    int (*count)(PyObject *);
    int (*make)(PyObject *, PyObject **, void **);
} rj_alloc_api;

static rj_alloc_api alloc_api = {1, &OutputsType, outputs_count, outputs_make};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_rocjit_torch_alloc",
                                        "torch tensors from at::empty for rocjit's op plans", -1, NULL};

/* A vectorcall type of this module, readied */
static int ready_type(PyTypeObject *t, Py_ssize_t size, Py_ssize_t vectorcall_offset, const char *doc, newfunc make,
                      reprfunc repr) {
    t->tp_basicsize = size;
    t->tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
    t->tp_doc = doc;
    t->tp_vectorcall_offset = vectorcall_offset;
    t->tp_call = PyVectorcall_Call;
    t->tp_new = make;
    t->tp_repr = repr;
    return PyType_Ready(t);
}

PyMODINIT_FUNC PyInit__rocjit_torch_alloc(void) {
    OutputsType.tp_getset = outputs_getset;
    if (ready_type(&EmptyType, sizeof(Empty), offsetof(Empty, vectorcall),
                   "Empty(prototype): empty(*sizes) -> a new tensor of the prototype's dtype and device", empty_new,
                   (reprfunc)empty_repr) < 0 ||
        ready_type(&OutputsType, sizeof(Outputs), offsetof(Outputs, vectorcall),
                   "Outputs(specs, share_limit=0): outputs() -> a tuple of new tensors, one per (prototype, sizes)",
                   outputs_new, (reprfunc)outputs_repr) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m) return NULL;
    PyObject *api = PyCapsule_New(&alloc_api, "rocjit.torch_alloc.api", NULL);
    if (!api || PyModule_AddObject(m, "_C_API", api) < 0) {
        Py_XDECREF(api);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&EmptyType);
    Py_INCREF(&OutputsType);
    if (PyModule_AddObject(m, "Empty", (PyObject *)&EmptyType) < 0 ||
        PyModule_AddObject(m, "Outputs", (PyObject *)&OutputsType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
