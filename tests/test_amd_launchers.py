"""AMD gets the generated Python launcher and the native one: hip.py's own fast_launch / native_launch hooks over
a stub HIP runtime (hipModuleLaunchKernel takes cuLaunchKernel's arguments), a kernel compiled for gfx90a whose
parameter layout comes from its amdhsa metadata, and CPU tensors standing in for GPU ones."""
import ctypes
import importlib
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import rocjit  # noqa: E402
from rocjit import native, platform  # noqa: E402
from rocjit.errors import ArgumentError  # noqa: E402
from rocjit.platform import hip  # noqa: E402
from tests.fakeplatform import FakePlatform  # noqa: E402
from tests.test_fast_launcher import SRC, FakeTensor  # noqa: E402
from tests.test_native_launcher import FIELDS, KDL_CPU, Driver  # noqa: E402


# hipModuleLaunchKernel as hip.py binds it from libamdhip64: void* for the function, parameters and extra
HIP_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, *[ctypes.c_void_p] * 3)


class StubRuntime:
    """What hip.py reads from libamdhip64: the launch and current-context entry points, here the stub driver's."""

    def __init__(self, drv):
        self.hipModuleLaunchKernel = HIP_LAUNCH(ctypes.cast(drv._launch, ctypes.c_void_p).value)
        self.hipCtxGetCurrent = drv._getctx


class HipStandIn(FakePlatform):
    """The CPU stand-in with the AMD vendor file's launch hooks and function handles."""
    NAME = "hip"
    DLPACK_DEVICE_TYPE = KDL_CPU        # CPU tensors play ROCm ones (hip.DLPACK_DEVICE_TYPE is kDLROCM, 10)

    def __init__(self, with_native):
        super().__init__(lambda params: 0)
        self.with_native = with_native

    def device_target(self, dev):
        return "gfx90a"

    def get_function(self, module, mangled):
        self.mangled = mangled
        return hip.Function(handle=None, ptr=0xF0, name=mangled)

    def function_handle(self, fn):
        return hip.function_handle(fn)

    def fast_launch(self):
        return hip.fast_launch()

    def native_launch(self, pdl=False):
        return hip.native_launch(pdl) if self.with_native else None


@pytest.fixture
def amd(monkeypatch):
    if not hip.hiprtc_usable():
        if os.environ.get("ROCJIT_REQUIRE_AMD") == "1":
            pytest.fail(f"ROCJIT_REQUIRE_AMD=1 but hipRTC is not usable: {hip.hiprtc_status()[1]}")
        pytest.skip(f"hipRTC is not usable: {hip.hiprtc_status()[1]}")
    monkeypatch.delenv("ROCJIT_AMD_COMPILER", raising=False)
    drv = Driver(FIELDS[:6])
    runtime = StubRuntime(drv)
    monkeypatch.setattr(hip, "_runtime_lib", lambda: runtime)
    monkeypatch.setattr(importlib.import_module("rocjit.kernel"), "_modules", {})     # load afresh on the stand-in
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: 0x5000 + dev, raising=False)

    def make(with_native):
        plat = HipStandIn(with_native)
        monkeypatch.setattr(platform, "_selected", plat)
        k = rocjit.kernel(SRC)
        k[1, 32](1.0, np.ones(4, np.float32), np.zeros(16, np.float32), 4, 0, True)   # loads it
        assert plat.launches and plat.loaded[0].target == "gfx90a"
        return k
    return make, drv


def test_the_generated_launcher_calls_hip_module_launch_kernel(amd):
    make, drv = amd
    k = make(with_native=False)
    assert callable(k._fast) and k._native is None, "AMD kernels must get the generated launcher"
    assert k._fast_spec_of().from_binary           # offsets and sizes from the code object's .args
    k._fast.__globals__["Tensor"] = FakeTensor
    k[(3, 2), 64](2.5, FakeTensor(0x1000), FakeTensor(0x2000), 7, 2**64 - 1, True)
    k[5, 32](3, FakeTensor(0x1000), FakeTensor(0x2000), -1, 0, False, shared_mem=1024, stream=77)
    assert drv.calls == [
        (0xF0, (3, 2, 1), (64, 1, 1), 0, 0x5000, (2.5, 0x1000, 0x2000, 7, 2**64 - 1, True), None),
        (0xF0, (5, 1, 1), (32, 1, 1), 1024, 77, (3.0, 0x1000, 0x2000, -1, 0, False), None)]


def test_a_failed_hip_launch_goes_to_the_general_path(amd):
    make, drv = amd
    k = make(with_native=False)
    general = []
    k._fast.__globals__["Tensor"] = FakeTensor
    k._fast.__globals__["general"] = lambda *a: general.append(a)
    drv.result = 1          # hipErrorInvalidValue: an int, not cuda-bindings' result tuple
    k[1, 32](2.5, FakeTensor(0x1000), FakeTensor(0x2000), 7, 0, True)
    assert len(drv.calls) == 1 and len(general) == 1


def test_the_native_launcher_launches_amd_kernels(amd):
    make, drv = amd
    if native.module() is None:
        pytest.skip(f"the native launcher could not be built here: {native.status()}")
    k = make(with_native=True)
    assert k._native is not None, "AMD kernels must get the native launcher"
    x, y = torch.randn(64), torch.randn(256)[4:]
    launcher = k[(3, 2), 64]
    launcher(2.5, x, y, 7, 5, False, stream=9)
    assert type(launcher).__name__ == "Launcher" and launcher.native_calls == 1
    assert drv.calls == [(0xF0, (3, 2, 1), (64, 1, 1), 0, 9, (2.5, x.data_ptr(), y.data_ptr(), 7, 5, False), None)]
    with pytest.raises(ArgumentError, match=r"parameter 'x'"):
        launcher(2.5, x.half(), y, 7, 5, False)
    drv.ctx = 0xC1      # another device's context is current: the native launcher steps aside for the Python path
    with pytest.raises(ArgumentError, match=r"parameter 'x'.*host \(CPU\) memory"):   # which knows they are CPU
        launcher(2.5, x, y, 7, 5, False, stream=9)
    assert launcher.native_calls == 1 and len(drv.calls) == 1


def test_hip_hooks_name_the_runtime_entry_points(amd):
    _, drv = amd
    launch, get_ctx = hip.native_launch()
    assert launch == ctypes.cast(drv._launch, ctypes.c_void_p).value
    assert get_ctx == ctypes.cast(drv._getctx, ctypes.c_void_p).value
    fast = hip.fast_launch()
    assert fast.call is hip._runtime_lib().hipModuleLaunchKernel and fast.success == 0 and fast.returns_tuple is False
    assert fast.wrap_function(hip.Function(None, 0xABC, "k")) == 0xABC
