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
