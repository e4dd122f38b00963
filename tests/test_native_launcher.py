"""The native launcher (rocjit/launcher.c), built here with the machine's C compiler and run on a CPU: the driver's
launch function is a ctypes callback that decodes the parameter block, and CPU torch tensors stand in for GPU
ones (the launcher is told their DLPack device type). What it launches must be exactly what the Python launcher
would; everything else must reach its fallback untouched."""
import ctypes
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import rocjit  # noqa: E402
from rocjit import native, platform  # noqa: E402
from rocjit.errors import ArgumentError  # noqa: E402
from tests.test_fast_launcher import FastFake  # noqa: E402

KDL_CPU, KDL_CUDA = 1, 2
LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                          ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)
GETCTX = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p))
# kernel(float a, const float* x, float4* y, int n, unsigned long long big, bool flag, double d, signed char c)
FIELDS = [("f", 0, ctypes.c_float), ("P", 8, ctypes.c_uint64), ("P", 16, ctypes.c_uint64), ("i", 24, ctypes.c_int32),
          ("Q", 32, ctypes.c_uint64), ("?", 40, ctypes.c_bool), ("d", 48, ctypes.c_double), ("b", 56, ctypes.c_int8)]


@pytest.fixture(scope="module")
def mod():
    m = native.module()        # with ROCJIT_REQUIRE_NATIVE=1 (CI) a failed build raises here
    if m is None:
        pytest.skip(f"the native launcher could not be built here: {native.status()}")
    return m


class Driver:
    """The launch function and context getter the launcher calls, recording what they were given."""

    def __init__(self, fields=FIELDS):
        self.fields, self.calls, self.result, self.ctx = fields, [], 0, 0xC0
        self._launch, self._getctx = LAUNCH(self.launch), GETCTX(self.getctx)
        self.launch_addr = ctypes.cast(self._launch, ctypes.c_void_p).value
        self.ctx_addr = ctypes.cast(self._getctx, ctypes.c_void_p).value

    def launch(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        vals = tuple(t.from_address(params[i]).value for i, (_, _, t) in enumerate(self.fields))
        self.calls.append((fn, (gx, gy, gz), (bx, by, bz), shared, stream or 0, vals, extra))
        return self.result

    def getctx(self, out):
        out[0] = self.ctx
        return 0


def _spec(mod, drv, *, device_type=KDL_CPU, x_dtypes=(torch.float32,), y_dtypes=(torch.float32,), ctx=True,
          loaded=True):
    f32 = lambda ds: tuple(native.torch_dtype_code(d) for d in ds)   # noqa: E731
    params = [("f", 0, 1, ()), ("P", 8, 4, f32(x_dtypes)), ("P", 16, 16, f32(y_dtypes)), ("i", 24, 1, ()),
              ("Q", 32, 1, ()), ("?", 40, 1, ()), ("d", 48, 1, ()), ("b", 56, 1, ())]
    limits = {0: 48 * 1024}
    spec = mod.Spec(params, 57, device_type, torch.Tensor.__dlpack_c_exchange_api__,
                    (torch.Tensor, torch.nn.Parameter), limits, drv.launch_addr, drv.ctx_addr if ctx else None)
    if loaded:
        assert spec.set_function(0, 0xF0, 0xC0 if ctx else None)
    return spec, limits


def _tensors():
    x = torch.randn(64)
    y = torch.randn(256)[4:]          # 16-byte aligned view (storage offset 16 bytes)
    return x, y


def _args(x_, y_, **over):
    a = dict(a=2.5, x=x_, y=y_, n=7, big=2**64 - 1, flag=True, d=-0.125, c=-5)
    a.update(over)
    return list(a.values())


class Fallback:
    def __init__(self):
        self.calls = []

    def __call__(self, *args, **kw):
        self.calls.append((args, kw))
        return "fallback"


def test_launches_with_the_packed_block(mod):
    drv, fb = Driver(), Fallback()
    spec, _ = _spec(mod, drv)
    x, y = _tensors()
    L = mod.Launcher(spec, (3, 2, 1), (64, 1, 1), fb)
    assert L(*_args(x, y)) is None
    assert L(*_args(x, y, a=3, n=-2**31, c=127, flag=False), shared_mem=1024, stream=77) is None
    assert fb.calls == []
    assert drv.calls == [
        (0xF0, (3, 2, 1), (64, 1, 1), 0, 0, (2.5, x.data_ptr(), y.data_ptr(), 7, 2**64 - 1, True, -0.125, -5), None),
        (0xF0, (3, 2, 1), (64, 1, 1), 1024, 77, (3.0, x.data_ptr(), y.data_ptr(), -2**31, 2**64 - 1, False, -0.125,
                                                 127), None)]
    assert L.native_calls == 2 and L.fallback is fb


def test_none_is_a_null_pointer(mod):
    """None for a pointer parameter launches natively with a null pointer, as the general path passes it; the
    device comes from the tensors that are given (with none at all, the fallback decides)."""
    drv, fb = Driver(), Fallback()
    spec, _ = _spec(mod, drv)
    x, y = _tensors()
    L = mod.Launcher(spec, (1, 1, 1), (32, 1, 1), fb)
    L(*_args(None, y))
    assert fb.calls == [] and drv.calls[0][5][1:3] == (0, y.data_ptr())


def test_accepts_parameters_size_one_strides_and_empty_tensors(mod):
    drv, fb = Driver(), Fallback()
    spec, _ = _spec(mod, drv, x_dtypes=(torch.float16, torch.float32))
    L = mod.Launcher(spec, (1, 1, 1), (32, 1, 1), fb)
    x = torch.nn.Parameter(torch.randn(8, 1, 4, dtype=torch.float16))       # requires grad: still launchable
    y = torch.randn(4, 1).t()          # (1, 4) with strides (1, 1): contiguous as torch counts it
    assert y.is_contiguous() and y.data_ptr() % 16 == 0
    L(*_args(x, y))
    L(*_args(torch.empty(0), torch.empty(0, 3)[:, 1:]))     # empty: contiguous whatever the strides
    assert fb.calls == [] and len(drv.calls) == 2
    assert drv.calls[0][5][1:3] == (x.data_ptr(), y.data_ptr())


@pytest.mark.parametrize("case", [
    "dtype", "device_type", "noncontig", "transposed", "misaligned_vector", "int_range", "uint_negative", "uint_range",
    "schar_range", "bool_for_int", "float_for_int", "str_for_float", "int_for_bool", "float_range", "numpy",
    "only_none_pointers", "subclass", "complex_any", "too_few", "too_many", "unknown_keyword", "negative_shared",
    "float_shared", "bool_shared", "shared_above_limit", "stream_object", "negative_stream", "no_function",
    "other_context", "driver_error", "big_int_for_float"])
def test_everything_else_goes_to_the_fallback_untouched(mod, case):
    drv, fb = Driver(), Fallback()
    spec, _ = _spec(mod, drv, device_type=KDL_CUDA if case == "device_type" else KDL_CPU,
                    y_dtypes=() if case == "complex_any" else (torch.float32,), loaded=case != "no_function")
    x, y = _tensors()
    args, kw = _args(x, y), {}

    class Sub(torch.Tensor):
        pass
    over = {
        "dtype": dict(x=x.double()), "noncontig": dict(x=x[::2]), "transposed": dict(x=torch.randn(4, 4).t()),
        "misaligned_vector": dict(y=y[1:]), "int_range": dict(n=2**31), "uint_negative": dict(big=-1),
        "uint_range": dict(big=2**64), "schar_range": dict(c=128), "bool_for_int": dict(n=True),
        "float_for_int": dict(n=7.0), "str_for_float": dict(a="2.5"), "int_for_bool": dict(flag=1),
        "float_range": dict(a=1e39), "numpy": dict(x=np.ones(4, np.float32)), "only_none_pointers": dict(x=None, y=None),
        "subclass": dict(x=x.as_subclass(Sub)), "complex_any": dict(y=torch.randn(8, dtype=torch.complex64)),
        "big_int_for_float": dict(d=10**400),
    }.get(case)
    if over:
        args = _args(x, y, **over)
    elif case == "too_few":
        args = args[:-1]
    elif case == "too_many":
        args = args + [0]
    elif case == "unknown_keyword":
        kw = {"sharedmem": 0}
    elif case == "negative_shared":
        kw = {"shared_mem": -1}
    elif case == "float_shared":
        kw = {"shared_mem": 1024.0}
    elif case == "bool_shared":
        kw = {"shared_mem": True}
    elif case == "shared_above_limit":
        kw = {"shared_mem": 48 * 1024 + 1}
    elif case == "stream_object":
        kw = {"stream": object()}
    elif case == "negative_stream":
        kw = {"stream": -1}
    elif case == "other_context":
        drv.ctx = 0xC1
    elif case == "driver_error":
        drv.result = 700
    L = mod.Launcher(spec, (2, 1, 1), (32, 1, 1), fb)
    assert L(*args, **kw) == "fallback"
    assert len(fb.calls) == 1, "the fallback was not taken"
    passed, passed_kw = fb.calls[0]
    assert list(passed) == args and all(p is a for p, a in zip(passed, args)), "the fallback must get the same objects"
    assert passed_kw == kw
    assert len(drv.calls) == (1 if case == "driver_error" else 0) and L.native_calls == 0


def test_shared_memory_follows_the_raised_limit(mod):
    drv, fb = Driver(), Fallback()
    spec, limits = _spec(mod, drv)
    L = mod.Launcher(spec, (1, 1, 1), (32, 1, 1), fb)
    x, y = _tensors()
    L(*_args(x, y), shared_mem=100 * 1024)
    limits[0] = 100 * 1024             # what the general path records once it raised the function's limit
    L(*_args(x, y), shared_mem=100 * 1024)
    assert len(fb.calls) == 1 and [c[3] for c in drv.calls] == [100 * 1024]


def test_any_thread_launches_and_the_fallback_errors_propagate(mod):
    drv = Driver()
    spec, _ = _spec(mod, drv)
    x, y = _tensors()

    def boom(*a, **k):
        raise ArgumentError("from the fallback")
    L = mod.Launcher(spec, (1, 1, 1), (32, 1, 1), boom)
    threads = [threading.Thread(target=lambda: [L(*_args(x, y, n=i)) for i in range(200)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert L.native_calls == 800 and sorted(c[5][3] for c in drv.calls) == sorted(list(range(200)) * 4)
    with pytest.raises(ArgumentError, match="from the fallback"):
        L(*_args(x, y, n=2**40))


def test_bad_descriptions_are_refused(mod):
    drv = Driver()
    api = torch.Tensor.__dlpack_c_exchange_api__
    for params, size in ([("x", 0, 1, ())], 4), ([("P", 0, 3, ())], 8), ([("P", -8, 8, ())], 8), ([], 5000), \
            ([("i", 0, 1, ())] * 300, 1200):
        with pytest.raises(ValueError):
            mod.Spec(params, size, KDL_CPU, api, (torch.Tensor,), {}, drv.launch_addr, None)


# ----------------------------------------------------------------------------- through rocjit.kernel
SRC = r"""
#include <hip/hip_runtime.h>
__global__ void k(float a, const float* x, float4* y, int n, unsigned long long big, bool flag) {}
"""


class NativeFake(FastFake):
    """The fast-launcher test platform with the native hook: CPU tensors play GPU ones (DLPack device type CPU)."""
    DLPACK_DEVICE_TYPE = KDL_CPU

    def __init__(self, drv):
        super().__init__(1)
        self.drv = drv

    def native_launch(self, pdl=False):
        return self.drv.launch_addr, self.drv.ctx_addr


def test_kernels_launch_natively_and_errors_still_name_the_parameter(mod, monkeypatch):
    drv = Driver(FIELDS[:6])
    fp = NativeFake(drv)
    monkeypatch.setattr(platform, "_selected", fp)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: 0x5000 + dev, raising=False)
    k = rocjit.kernel(SRC)
    k[1, 32](1.0, np.ones(4, np.float32), np.zeros(16, np.float32), 4, 0, True)   # loads it: launchers are built
    assert k._native is not None, native.status()
    x, y = _tensors()
    launcher = k[(3, 2), 64]
    launcher(2.5, x, y, 7, 5, False, stream=9)
    assert type(launcher).__name__ == "Launcher" and launcher.native_calls == 1
    assert drv.calls == [(2, (3, 2, 1), (64, 1, 1), 0, 9, (2.5, x.data_ptr(), y.data_ptr(), 7, 5, False), None)]
    with pytest.raises(ArgumentError, match=r"parameter 'x'"):       # via the Python launcher's general path
        launcher(2.5, x.half(), y, 7, 5, False)
    assert launcher.native_calls == 1 and len(drv.calls) == 1


def _probe(tmp_path, **env):
    code = "from rocjit import native\nm = native.module()\nprint(m is not None, '|', native.status())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "ROCJIT_CACHE_DIR": str(tmp_path), "ROCJIT_REQUIRE_NATIVE": "0", **env})
    return r


def test_turned_off_or_unbuildable_means_the_python_launcher(mod, tmp_path):
    off = _probe(tmp_path, ROCJIT_NATIVE_LAUNCH="0")
    assert off.stdout.startswith("False | off (ROCJIT_NATIVE_LAUNCH=0)"), off.stdout + off.stderr
    broken = _probe(tmp_path, CC="false")            # a compiler that fails: a reason, no exception
    assert broken.stdout.startswith("False | unavailable: false -O2"), broken.stdout + broken.stderr
    required = _probe(tmp_path, CC="false", ROCJIT_REQUIRE_NATIVE="1")
    assert required.returncode != 0 and "NativeBuildError" in required.stderr
    built = _probe(tmp_path)
    assert built.stdout.startswith("True | ready ("), built.stdout + built.stderr
    assert list((tmp_path / "native").glob("rocjit_launch_*"))


# kernel(const float* x, <a 16-byte struct> m, int n): a by-value struct (a TMA tensor map is 128 bytes) as bytes
STRUCT_FIELDS = [("P", 0, ctypes.c_uint64), ("s", 16, ctypes.c_char * 16), ("i", 32, ctypes.c_int32)]


class StructDriver(Driver):
    def launch(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        vals = tuple(t.from_address(params[i]).raw if code == "s" else t.from_address(params[i]).value
                     for i, (code, _, t) in enumerate(self.fields))
        self.calls.append((fn, (gx, gy, gz), (bx, by, bz), shared, stream or 0, vals, extra))
        return self.result


def _struct_spec(mod, drv):
    f32 = (native.torch_dtype_code(torch.float32),)
    spec = mod.Spec([("P", 0, 4, f32), ("s", 16, 16, ()), ("i", 32, 1, ())], 36, KDL_CPU,
                    torch.Tensor.__dlpack_c_exchange_api__, (torch.Tensor, torch.nn.Parameter), {0: 0},
                    drv.launch_addr, drv.ctx_addr)
    assert spec.set_function(0, 0xF0, 0xC0)
    return spec


def test_by_value_structs_are_copied_from_bytes_of_their_exact_size(mod):
    drv, fb = StructDriver(STRUCT_FIELDS), Fallback()
    launcher = mod.Launcher(_struct_spec(mod, drv), (1, 1, 1), (32, 1, 1), fb)
    x = torch.randn(8)
    m = bytes(range(16))
    launcher(x, m, 3)
    assert drv.calls == [(0xF0, (1, 1, 1), (32, 1, 1), 0, 0, (x.data_ptr(), m, 3), None)] and fb.calls == []
    for bad in (m[:15], m + b"\0", bytearray(m), 7, None):      # any other size or type: the Python launcher's case
        assert launcher(x, bad, 3) == "fallback"
    assert len(drv.calls) == 1 and len(fb.calls) == 5


@pytest.mark.parametrize("params", [[("s", 30, 16, ())], [("i", 34, 1, ())], [("s", 0, 0, ())], [("x", 0, 1, ())]])
def test_descriptions_beyond_the_block_are_refused(mod, params):
    drv = StructDriver(STRUCT_FIELDS)
    with pytest.raises(ValueError, match="bad description"):
        mod.Spec(params, 36, KDL_CPU, torch.Tensor.__dlpack_c_exchange_api__, (torch.Tensor,), {0: 0},
                 drv.launch_addr, drv.ctx_addr)
