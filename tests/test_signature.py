import pytest

from rocjit import signature

SRC = r"""
#include <hip/hip_runtime.h>
// a comment mentioning __global__ void fake(int x)
template <typename T, int VEC = 8>
__global__ __launch_bounds__(256) void scale(const T* __restrict__ x, T* y, float s, int n) {}

extern "C" __global__ void raw(const float4* in, uint8_t* out, const __half2* h, long long n, void* p,
                               unsigned int flags) {}
__global__ void __attribute__((amdgpu_flat_work_group_size(1, 256))) noargs() {}
/* __global__ void commented(int a) {} */
"""


def test_template_params_substituted():
    p = signature.parse(SRC, "scale<__half, 4>")
    assert [(q.name, q.ctype, q.pointer, q.const) for q in p] == [
        ("x", "__half", True, True), ("y", "__half", True, False), ("s", "float", False, False),
        ("n", "int", False, False)]
    assert p[0].dtypes == ("float16",)


def test_vector_byte_and_void_pointers():
    p = signature.parse(SRC, "raw")
    assert [q.ctype for q in p] == ["float4", "uint8_t", "__half2", "long long", "void", "unsigned int"]
    assert p[0].dtypes == ("float32",) and signature.POINTEE_ALIGN["float4"] == 16
    assert "float8_e4m3fn" in p[1].dtypes and p[4].dtypes is None
    assert not p[3].pointer and signature.SCALAR_CTYPES[p[3].ctype].__name__ == "c_long"


def test_kernels_found_and_comments_ignored():
    names = [k for k, _, _ in signature.find_kernel(SRC, None)]
    assert names == ["scale", "raw", "noargs"]
    assert signature.parse(SRC, "noargs") == []
    assert signature.parse(SRC, "commented") is None


def test_unresolved_template_type_accepts_any_dtype():
    p = signature.parse(SRC, "scale")
    assert p[0].ctype == "T" and p[0].dtypes is None


def test_attributes_between_template_header_and_global():
    src = ("template <typename T, int N>\n__launch_bounds__(256) __global__ void a(const T* x, int n) {}\n"
           "template <typename T>\n__global__ void __launch_bounds__(128, 2) b(T* y) {}\n")
    assert signature.parse(src, "a<__half, 4>")[0].ctype == "__half"
    assert signature.parse(src, "b<float>")[0].dtypes == ("float32",)


# ----------------------------------------------------------------------------- every spelling of a parameter
SPELLINGS = r"""
#define INDEX_T long
#define VEC float4
namespace first { __global__ void same(float* x) {} }
namespace second { namespace inner { __global__ void same(int* x, INDEX_T n) {} } }
__global__ void spelled(long int a, unsigned long long int b, short int c, signed d, ptrdiff_t e, intptr_t f,
                        uintptr_t g, [[maybe_unused]] int h, float** pp, float arr[4], const VEC* v,
                        unsigned int, long long int, signed char sc, unsigned short int us, int n = 4,
                        __attribute__((unused)) double dd, WIDTH_T w) {}
"""


def test_integer_spellings_and_typedefs():
    p = {q.name: q for q in signature.parse(SPELLINGS, "spelled", defines={"WIDTH_T": "short"})}
    assert [(q.name, q.ctype) for q in p.values() if not q.pointer] == [
        ("a", "long"), ("b", "unsigned long long"), ("c", "short"), ("d", "int"), ("e", "ptrdiff_t"),
        ("f", "intptr_t"), ("g", "uintptr_t"), ("h", "int"), ("arg11", "unsigned int"), ("arg12", "long long"),
        ("sc", "signed char"), ("us", "unsigned short"), ("n", "int"), ("dd", "double"), ("w", "short")]
    for q in p.values():
        assert q.pointer or q.ctype in signature.SCALAR_CTYPES, f"{q.describe()} has no C type to pack"


def test_pointers_to_pointers_arrays_and_macro_types():
    p = {q.name: q for q in signature.parse(SPELLINGS, "spelled", defines={"WIDTH_T": "short"})}
    assert p["pp"].pointer and p["pp"].ctype == "float*" and p["pp"].dtypes == ("int64", "uint64")
    assert p["arr"].pointer and p["arr"].dtypes == ("float32",)
    assert p["v"].pointer and p["v"].const and p["v"].ctype == "float4"
    assert signature.parse(SPELLINGS, "second::inner::same")[1].ctype == "long"


def test_kernels_of_one_name_in_two_namespaces():
    assert signature.parse(SPELLINGS, "first::same")[0].ctype == "float"
    assert signature.parse(SPELLINGS, "second::inner::same")[0].ctype == "int"
    assert signature.parse(SPELLINGS, "second::same") is None
    with pytest.raises(ValueError, match=r"'same' is ambiguous \(first::same, second::inner::same\)"):
        signature.parse(SPELLINGS, "same")
    assert signature.parse(SPELLINGS + "__global__ void same(double* d) {}", "same")[0].ctype == "double"
