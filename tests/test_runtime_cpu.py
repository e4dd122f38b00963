"""Argument packing, checking and numpy staging through a host-memory stand-in for the GPU."""
import ctypes

import numpy as np
import pytest

import rocjit
import importlib

from rocjit import arrays, platform
from tests.fakeplatform import FakePlatform, param

AXPY = r"""
#include <hip/hip_runtime.h>
__global__ void axpy(float a, const float* __restrict__ x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
"""


def _emulate_axpy(params):
    a = param(params, 0, ctypes.c_float)
    x, y = param(params, 1, ctypes.c_void_p), param(params, 2, ctypes.c_void_p)
    n = param(params, 3, ctypes.c_int32)
    xs = np.ctypeslib.as_array((ctypes.c_float * n).from_address(x))
    ys = np.ctypeslib.as_array((ctypes.c_float * n).from_address(y))
    ys[:] = a * xs + ys
    return 0


@pytest.fixture
def fake(monkeypatch):
    fp = FakePlatform(_emulate_axpy)
    monkeypatch.setattr(platform, "_selected", fp)
    return fp


def test_numpy_staging_roundtrip(fake):
    k = rocjit.kernel(AXPY)
    rng = np.random.default_rng(0)
    n = 1000
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    x0, ref = x.copy(), np.float32(2.5) * x + y
    k[4, 256](2.5, x, y, n)
    np.testing.assert_allclose(y, ref, rtol=1e-6)
    np.testing.assert_array_equal(x, x0)                 # const pointee: never copied back
    assert fake.mangled == "_Z4axpyfPKfPfi"              # lowered through NVRTC's name expression
    assert len(fake.freed) == 2                          # staging buffers released


def test_in_out_wrappers_and_readonly(fake):
    k = rocjit.kernel(AXPY)
    n = 64
    x = np.arange(n, dtype=np.float32)
    y = np.ones(n, np.float32)
    k[1, 64](1.0, x, rocjit.In(y), n)
    np.testing.assert_array_equal(y, 1)                  # In: not copied back
    ro = np.ones(n, np.float32)
    ro.flags.writeable = False
    k[1, 64](1.0, x, ro, n)
    np.testing.assert_array_equal(ro, 1)                 # read-only: not copied back
    strided = np.full((n, 2), 7.0, np.float32)
    k[1, 64](1.0, x, rocjit.InOut(strided[:, 1]), n)     # non-contiguous numpy is staged through a copy
    np.testing.assert_array_equal(strided[:, 1], x + 7)
    np.testing.assert_array_equal(strided[:, 0], 7)


def test_scalars_typed_by_signature(fake):
    seen = {}

    def emulate(params):
        seen["a"] = param(params, 0, ctypes.c_float)
        seen["n"] = param(params, 3, ctypes.c_int32)
        return 0

    fake.emulate = emulate
    k = rocjit.kernel(AXPY)
    x = np.zeros(4, np.float32)
    k[1, 1](np.float64(0.5), x, x, np.int64(3))
    assert seen == {"a": 0.5, "n": 3}
    k[1, 1](2, x, x, 4)                                  # an int for a float parameter is converted
    assert seen == {"a": 2.0, "n": 4}


@pytest.mark.parametrize("args,match", [
    ((1.0, "x", "y"), r"takes 4 arguments \(a, x, y, n\), got 3"),
    ((1.0, np.zeros(4, np.float64), np.zeros(4, np.float32), 4), r"'x'.*expected element dtype float32, got float64"),
    ((1.0, np.zeros(4, np.float32), np.zeros(4, np.int32), 4), r"'y'.*expected element dtype float32, got int32"),
    ((1.0, np.zeros(4, np.float32), np.zeros(4, np.float32), 4.0), r"'n'.*expected an int, got float"),
    ((1.0, np.zeros(4, np.float32), np.zeros(4, np.float32), 2 ** 31), r"'n'.*does not fit in int"),
    (("1", np.zeros(4, np.float32), np.zeros(4, np.float32), 4), r"'a'.*expected a float, got str"),
    ((1.0, [1.0], np.zeros(4, np.float32), 4), r"'x'.*expected a GPU array.*got list"),
    ((1.0, 12345, np.zeros(4, np.float32), 4), r"'x'.*not a device pointer"),
])
def test_argument_errors_name_the_parameter(fake, args, match):
    k = rocjit.kernel(AXPY)
    with pytest.raises(rocjit.ArgumentError, match=match):
        k[1, 32](*args)
    assert fake.launches == []                           # nothing was launched


def test_cpu_torch_tensor_is_rejected(fake):
    torch = pytest.importorskip("torch")
    k = rocjit.kernel(AXPY)
    x = torch.zeros(4)
    with pytest.raises(rocjit.ArgumentError, match=r"'x'.*host \(CPU\) memory"):
        k[1, 32](1.0, x, x, 4)


def test_launch_configuration_errors(fake):
    k = rocjit.kernel(AXPY)
    x = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="at most 1024"):
        k[1, (32, 64)](1.0, x, x, 4)
    with pytest.raises(ValueError, match=">= 1"):
        k[0, 32](1.0, x, x, 4)
    with pytest.raises(ValueError, match="exceeds the device's limit"):
        k[1, 32](1.0, x, x, 4, shared_mem=10 ** 6)
    k[1, 32](1.0, x, x, 4, shared_mem=100_000)           # above 48 KB: the function attribute is raised
    assert fake.max_shared == 100_000


def test_static_shared_memory_counts_toward_the_opt_in(fake):
    """Static plus dynamic shared memory above 48 KB needs the function's opt-in attribute: a kernel with 24 KB of
    static shared memory launched with 32 KB of dynamic has it set first (without, the driver refuses the launch)."""
    fake.function_info = lambda fn: {"num_regs": 0, "shared_bytes": 24 * 1024, "local_bytes": 0, "max_threads": 1024}
    fake.max_shared = None
    k = rocjit.kernel(AXPY)
    x = np.zeros(4, np.float32)
    k[1, 32](1.0, x, x, 4, shared_mem=24 * 1024)        # 48 KB in all: no attribute
    assert fake.max_shared is None
    k[1, 32](1.0, x, x, 4, shared_mem=32 * 1024)
    assert fake.max_shared == 32 * 1024
    optin = fake.device_attributes(0)["max_shared_per_block_optin"]
    with pytest.raises(ValueError, match="beside the kernel's 24576 bytes of static shared memory"):
        k[1, 32](1.0, x, x, 4, shared_mem=optin - 24 * 1024 + 1)


def test_launch_error_carries_vendor_name(fake):
    fake.emulate = lambda params: 700
    k = rocjit.kernel(AXPY)
    x = np.zeros(4, np.float32)
    with pytest.raises(rocjit.LaunchError, match="FAKE_ERROR_700") as ei:
        k[1, 32](1.0, x, x, 4)
    assert ei.value.error_name == "FAKE_ERROR_700"
    assert len(fake.freed) == 2                          # staging buffers released on failure too


def test_layout_disagreeing_with_source_is_reported(fake):
    """The parser does not evaluate #if: the compiled kernel's own parameter records overrule it, before a launch."""
    src = ("#ifdef WIDE\n__global__ void k(double a, float* x, int n) {}\n"
           "#else\n__global__ void k(float a, float* x) {}\n#endif\n")
    x = np.zeros(4, np.float32)
    with pytest.raises(rocjit.RocjitError, match="declares 3 parameters but the compiled kernel has 2"):
        rocjit.kernel(src)[1, 32](1.0, x, 4)
    assert fake.loaded == [] and fake.launches == []
    with pytest.raises(rocjit.RocjitError, match=r"parameter 'a' \(double a\) is 4 bytes in the compiled kernel, 8"):
        rocjit.kernel(src.replace("int n", "int n, int m").replace("float* x)", "float* x, int n, int m)"))[1, 32](
            1.0, x, 4, 5)
    assert fake.loaded == [] and fake.launches == []


def test_kernel_name_required_when_ambiguous():
    src = AXPY + "\n__global__ void other(int* p) {}\n"
    with pytest.raises(ValueError, match="defines 2 __global__ kernels"):
        rocjit.kernel(src)
    with pytest.raises(ValueError, match="no __global__ kernel named 'nope'"):
        rocjit.kernel(src, "nope")


# ----------------------------------------------------------------------------- array protocols
class _DLPackOnly:
    def __init__(self, t):
        self.t = t

    def __dlpack__(self, stream=None):
        return self.t.__dlpack__()

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


def test_dlpack_of_cpu_torch():
    torch = pytest.importorskip("torch")
    t = torch.arange(24, dtype=torch.bfloat16).reshape(4, 6)[:, 1:5]
    info = arrays.describe(_DLPackOnly(t))
    assert (info.dtype, info.shape, info.strides, info.device) == ("bfloat16", (4, 4), (6, 1), None)
    assert info.ptr == t.data_ptr() and not info.contiguous
    info = arrays.describe(_DLPackOnly(torch.zeros(3, 5, dtype=torch.float16)))
    assert info.dtype == "float16" and info.contiguous


def test_numpy_and_torch_descriptions():
    torch = pytest.importorskip("torch")
    import ml_dtypes
    a = np.zeros((3, 4), ml_dtypes.float8_e4m3fn)
    info = arrays.describe(a)
    assert (info.dtype, info.shape, info.device, info.framework) == ("float8_e4m3fn", (3, 4), None, "numpy")
    info = arrays.describe(torch.zeros(2, 3, dtype=torch.float8_e4m3fnuz).t())
    assert (info.dtype, info.shape, info.strides, info.contiguous) == ("float8_e4m3fnuz", (3, 2), (1, 3), False)
    assert arrays.describe(3.0) is None


def test_cuda_array_interface(monkeypatch):
    class FakeDevArray:
        __cuda_array_interface__ = {"data": (0x7000, False), "typestr": "<f2", "shape": (8, 3),
                                    "strides": None, "version": 3}

    class Plat:
        @staticmethod
        def pointer_device(ptr):
            return 1

    monkeypatch.setattr(platform, "_selected", Plat)
    info = arrays.describe(FakeDevArray())
    assert (info.ptr, info.dtype, info.shape, info.device, info.contiguous) == (0x7000, "float16", (8, 3), 1, True)


def test_stream_handles():
    class CS:
        def __cuda_stream__(self):
            return (0, 0xABC)

    class TorchLike:
        cuda_stream = 0x123

    assert arrays.stream_handle(None) == 0
    assert arrays.stream_handle(77) == 77
    assert arrays.stream_handle(CS()) == 0xABC
    assert arrays.stream_handle(TorchLike()) == 0x123
    with pytest.raises(TypeError, match="stream: expected"):
        arrays.stream_handle("s")


def test_staging_wrappers_need_numpy():
    with pytest.raises(TypeError, match="wraps a numpy array"):
        rocjit.In([1, 2])


def test_ptx_version_lowering():
    from rocjit.platform import cuda
    ptx = "//\n.version 9.2\n.target sm_90a\n"
    assert ".version 9.0\n" in cuda.lower_ptx_version(ptx, (13, 0))
    assert ".version 8.5\n" in cuda.lower_ptx_version(ptx, (12, 6))


def test_driver_rejecting_new_nvrtc_code_falls_back_to_ptx(fake, monkeypatch):
    """A driver older than NVRTC rejects the cubin: rocjit warns and loads PTX lowered to the driver's ISA."""
    from rocjit.compilers import nvrtc
    from rocjit.platform import cuda
    kmod = importlib.import_module("rocjit.kernel")
    loaded = []

    def load_binary(binary, dev):
        if binary[:4] == b"\x7fELF":
            raise rocjit.LaunchError("cuModuleLoadData failed", "CUDA_ERROR_UNSUPPORTED_PTX_VERSION")
        loaded.append(binary)
        return 1

    monkeypatch.setattr(cuda, "_load_binary", load_binary)
    monkeypatch.setattr(cuda, "driver_version", lambda: (13, 0))
    monkeypatch.setattr(nvrtc, "version", lambda: "nvrtc 13.5")
    fake.load = cuda.load          # the CUDA platform's own loader, over the stubbed driver calls
    monkeypatch.setattr(kmod, "_modules", {})
    k = rocjit.kernel(AXPY.replace("axpy", "axpy_fallback"))
    x = np.ones(4, np.float32)
    with pytest.warns(RuntimeWarning, match=r"driver \(CUDA 13.0\) rejected code built by nvrtc 13.5"):
        k[1, 32](1.0, x, x.copy(), 4)
    assert loaded and b".version 9.0" in loaded[0] and b".target sm_90a" in loaded[0]
