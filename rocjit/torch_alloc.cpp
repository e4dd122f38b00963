/* rocjit's torch allocator: `Empty(prototype)` objects, called as empty(*sizes) or empty(sizes), that return a new
 * torch tensor of the prototype's dtype and device from at::empty -- what prototype.new_empty(sizes) returns (a
 * tensor of torch's own allocator: its caching allocator knows the block, Tensor.record_stream works on it), less
 * torch's Python argument parsing. The eager op plans (launcher.c) allocate their outputs through them.
 *
 * Built at first use against the torch that is installed (rocjit/native.py) and kept in the rocjit cache like the
 * native launcher; where it cannot be built, the plans use new_empty. Errors are torch's own (negative sizes,
 * out of memory...), raised as torch raises them. */
#include <Python.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#define RJ_EMPTY_MAX_DIMS 16

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

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_rocjit_torch_alloc",
                                        "torch tensors from at::empty for rocjit's op plans", -1, NULL};

PyMODINIT_FUNC PyInit__rocjit_torch_alloc(void) {
    EmptyType.tp_basicsize = sizeof(Empty);
    EmptyType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
    EmptyType.tp_doc = "Empty(prototype): empty(*sizes) -> a new tensor of the prototype's dtype and device";
    EmptyType.tp_vectorcall_offset = offsetof(Empty, vectorcall);
    EmptyType.tp_call = PyVectorcall_Call;
    EmptyType.tp_new = empty_new;
    EmptyType.tp_repr = (reprfunc)empty_repr;
    if (PyType_Ready(&EmptyType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m) return NULL;
    Py_INCREF(&EmptyType);
    if (PyModule_AddObject(m, "Empty", (PyObject *)&EmptyType) < 0) {
        Py_DECREF(&EmptyType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
