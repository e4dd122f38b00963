"""The argument contract on a real GPU: the offline parameter records agree with what the driver reports, and
by-value structs, 16-bit floats and pointer arrays packed by the ParamSpec reach the kernel intact."""
import ctypes

import numpy as np
import pytest

import rocjit
from rocjit import codeobject, platform

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU visible to torch", allow_module_level=True)

MIXED = r"""
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
struct Pair { double a; char b; };
struct alignas(16) Five { float v[5]; };
__global__ void mixed(char c, float* out, short s, Pair st, double d, Five f, bool b, long long q, __half h,
                      float** table) {
    out[0] = c; out[1] = s; out[2] = (float)st.a; out[3] = st.b; out[4] = (float)d;
    for (int i = 0; i < 5; ++i) out[5 + i] = f.v[i];
    out[10] = b; out[11] = (float)q; out[12] = __half2float(h); out[13] = table[1][0];
}
"""


class Pair(ctypes.Structure):
    _fields_ = [("a", ctypes.c_double), ("b", ctypes.c_char)]


class Five(ctypes.Structure):
    _fields_ = [("v", ctypes.c_float * 5), ("_pad", ctypes.c_float * 3)]


def test_offline_layout_matches_the_driver():
    k = rocjit.kernel(MIXED)
    out = torch.zeros(16, device="cuda")
    k[1, 1](1, out, 2, bytes(Pair(3.0, b"\x04")), 5.0, bytes(Five((ctypes.c_float * 5)(6, 7, 8, 9, 10))), True,
            11, 12.0, torch.tensor([out.data_ptr(), out.data_ptr() + 4], device="cuda", dtype=torch.int64))
    torch.cuda.synchronize()
    assert out[:13].tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 11, 12]
    assert out[13].item() == 2          # table[1] points at out[1]
    plat = platform.get()
    if plat.NAME != "cuda":
        return
    co = k.code_object
    fn, spec = k.loaded(0)
    offline = codeobject.param_layout(co.binary, k.mangled_name)
    driver, off, size = [], ctypes.c_size_t(), ctypes.c_size_t()
    get_info = getattr(plat._drv().lib, "cuFuncGetParamInfo", None)     # CUDA >= 12.4 drivers only
    if get_info is None:
        pytest.skip("this driver has no cuFuncGetParamInfo to compare with")
    get_info.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p]
    for i in range(len(offline)):
        assert get_info(fn, i, ctypes.byref(off), ctypes.byref(size)) == 0
        driver.append((off.value, size.value))
    assert offline == driver == [(s.offset, s.size) for s in spec.slots]


def test_struct_bytes_of_the_wrong_size_are_refused_on_the_gpu():
    k = rocjit.kernel(MIXED)
    out = torch.zeros(16, device="cuda")
    table = torch.zeros(2, device="cuda", dtype=torch.int64)
    with pytest.raises(rocjit.ArgumentError, match=r"parameter 'st' \(Pair st\): got 8 bytes"):
        k[1, 1](1, out, 2, b"\0" * 8, 5.0, bytes(32), True, 11, 12.0, table)


def test_amd_context_handle_is_what_the_native_launcher_compares():
    plat = platform.get()
    if plat.NAME != "hip":
        pytest.skip("AMD only")
    from rocjit.platform import hip
    lib = hip._runtime_lib()
    for dev in range(plat.device_count()):
        hip.set_current(dev)
        cur = ctypes.c_void_p()
        assert lib.hipCtxGetCurrent(ctypes.byref(cur)) == 0
        assert cur.value == hip.context_handle(dev)
    x = torch.ones(64, device="cuda")
    k = rocjit.kernel("__global__ void twice(float* x) { x[threadIdx.x] *= 2; }")
    launch = k[1, 64]
    launch(x)
    launch(x)
    torch.cuda.synchronize()
    assert x.eq(4).all() and getattr(launch, "native_calls", 1) >= 1


MAP = r"""
#include <hip/hip_runtime.h>
struct alignas(64) Map { unsigned char b[128]; };
__global__ void by_value_map(float* out, Map m, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = m.b[i];
}
"""


def test_by_value_structs_take_the_fast_launchers():
    """A kernel with a by-value struct (a TMA tensor map, say) launches through the native launcher (the generated
    Python one where no native module could be built), its bytes packed at the struct's offset; bytes of another
    size still go the general path and its named error."""
    from rocjit import native
    from rocjit.launch import general
    if general.debug():
        pytest.skip("debug mode launches everything through the general path")
    k = rocjit.kernel(MAP)
    out = torch.full((130,), -1.0, device="cuda")
    k.loaded(0)                     # the launchers are built when the kernel is loaded
    launch = k[1, 128]
    mod = native.module()
    if mod is not None:
        assert isinstance(launch, mod.Launcher), f"not the native launcher: {launch!r}"
    else:
        assert getattr(launch, "__name__", "") == "launch_kernel", f"not the generated launcher: {launch!r}"
    launch(out, bytes(range(7, 135)), 128)
    torch.cuda.synchronize()
    assert out[:128].tolist() == list(range(7, 135)) and out[128:].tolist() == [-1.0, -1.0]
    if mod is not None:
        assert launch.native_calls == 1
    for wrong in (bytes(127), bytes(129), bytearray(range(128))[:64]):
        with pytest.raises(rocjit.ArgumentError, match=r"parameter 'm' \(Map m\): got \d+ bytes, the compiled "
                                                       r"kernel takes 128"):
            launch(out, wrong, 128)
