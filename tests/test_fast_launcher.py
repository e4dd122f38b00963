"""The generated per-signature launcher, on a CPU: what it packs and passes to the driver call, and every case it
must hand to the general path (which checks the argument and names it in the error) instead of launching."""
import ctypes
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import rocjit  # noqa: E402
from rocjit import platform  # noqa: E402
from rocjit.platform import FastLaunch  # noqa: E402
from tests.fakeplatform import FakePlatform  # noqa: E402

SRC = r"""
#include <hip/hip_runtime.h>
__global__ void k(float a, const float* x, float4* y, int n, unsigned long long big, bool flag) {}
"""
OK = object()


class FakeTensor:
    """What the generated code reads from a torch tensor."""

    def __init__(self, ptr, dtype=torch.float32, cuda=True, contiguous=True, dev=0):
        self.ptr, self.dtype, self.is_cuda, self.contig, self.dev = ptr, dtype, cuda, contiguous, dev

    def data_ptr(self):
        return self.ptr

    def is_contiguous(self):
        return self.contig

    def get_device(self):
        return self.dev if self.is_cuda else -1


class FastFake(FakePlatform):
    def __init__(self, ndev):
        super().__init__(lambda params: 0)
        self.ndev, self.driver_calls, self.pushed, self.result = ndev, [], [], OK

    def device_count(self):
        return self.ndev

    def fast_launch(self):
        def launch(fn, gx, gy, gz, bx, by, bz, shared, stream, paddr, extra):
            p = (ctypes.c_void_p * 6).from_address(paddr)
            vals = tuple(t.from_address(p[i]).value for i, t in enumerate(
                (ctypes.c_float, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int32, ctypes.c_uint64, ctypes.c_bool)))
            self.driver_calls.append((fn, (gx, gy, gz), (bx, by, bz), shared, stream, vals))
            return (self.result,)
        return FastLaunch(launch, lambda f: ("wrapped", f), OK, True)

    def push_current(self, dev):
        self.pushed.append(dev)
        return True

    def pop_current(self):
        self.pushed.append("pop")


def _setup(monkeypatch, ndev):
    fp = FastFake(ndev)
    monkeypatch.setattr(platform, "_selected", fp)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: 0x5000 + dev, raising=False)
    k = rocjit.kernel(SRC)
    k[1, 32](1.0, np.ones(4, np.float32), np.zeros(16, np.float32), 4, 0, True)   # loads it: the launcher is built
    assert len(fp.launches) == 1
    fp.pushed.clear()
    for d in range(1, ndev):                        # what a launch on another device would have loaded
        k._fns[d] = 10 + d
        k.shared_limit[d] = 48 * 1024
        k._fast_fns[d] = ("wrapped", 10 + d)
    assert callable(k._fast), "the fast launcher was not generated"
    general_calls = []
    k._fast.__globals__["Tensor"] = FakeTensor
    k._fast.__globals__["general"] = lambda g, b, args, shared, stream: general_calls.append((g, b, args, shared,
                                                                                             stream))
    return k, fp, general_calls


def _args(**over):
    a = dict(a=2.5, x=FakeTensor(0x1000), y=FakeTensor(0x2000), n=7, big=2**64 - 1, flag=True)
    a.update(over)
    return list(a.values())


@pytest.mark.parametrize("ndev", [1, 2])
def test_fast_path_packs_and_launches(monkeypatch, ndev):
    k, fp, general = _setup(monkeypatch, ndev)
    k[(3, 2), 64](*_args())
    k[5, (8, 4, 2)](*_args(a=3), shared_mem=1024, stream=77)
    assert general == []
    assert fp.driver_calls == [
        (("wrapped", 2), (3, 2, 1), (64, 1, 1), 0, 0x5000, (2.5, 0x1000, 0x2000, 7, 2**64 - 1, True)),
        (("wrapped", 2), (5, 1, 1), (8, 4, 2), 1024, 77, (3.0, 0x1000, 0x2000, 7, 2**64 - 1, True))]
    assert fp.pushed == ([0, "pop"] * 2 if ndev > 1 else [])
    assert k[(3, 2), 64] is k[(3, 2), 64]           # one launcher per configuration, handed out from a dict


def test_tensors_on_another_device_launch_there(monkeypatch):
    k, fp, general = _setup(monkeypatch, 2)
    k[1, 32](*_args(x=FakeTensor(0x1000, dev=1), y=FakeTensor(0x2000, dev=1)))
    assert general == [] and fp.pushed == [1, "pop"]
    assert fp.driver_calls[0][0] == ("wrapped", 11) and fp.driver_calls[0][4] == 0x5001
    k[1, 32](*_args(x=FakeTensor(0x1000, dev=1), y=FakeTensor(0x2000, dev=0)))     # mixed: the general path errors
    assert len(general) == 1 and len(fp.driver_calls) == 1


@pytest.mark.parametrize("case", [
    "dtype", "cpu", "noncontig", "misaligned_vector", "int_range", "uint_negative", "bool_for_int", "str_for_float",
    "int_for_bool", "too_few", "too_many", "numpy", "negative_shared", "float_shared", "shared_above_limit",
    "driver_error", "other_thread"])
def test_everything_else_goes_to_the_general_path(monkeypatch, case):
    k, fp, general = _setup(monkeypatch, 1)
    args, kw = _args(), {}
    if case == "dtype":
        args = _args(x=FakeTensor(0x1000, dtype=torch.float16))
    elif case == "cpu":
        args = _args(y=FakeTensor(0x2000, cuda=False))
    elif case == "noncontig":
        args = _args(x=FakeTensor(0x1000, contiguous=False))
    elif case == "misaligned_vector":       # float4* needs 16 bytes; a float32 tensor is only 4-aligned
        args = _args(y=FakeTensor(0x2004))
    elif case == "int_range":
        args = _args(n=2**31)
    elif case == "uint_negative":
        args = _args(big=-1)
    elif case == "bool_for_int":
        args = _args(n=True)
    elif case == "str_for_float":
        args = _args(a="2.5")
    elif case == "int_for_bool":
        args = _args(flag=1)
    elif case == "too_few":
        args = _args()[:-1]
    elif case == "too_many":
        args = _args() + [0]
    elif case == "numpy":
        args = _args(x=np.ones(4, np.float32))
    elif case == "negative_shared":
        kw = {"shared_mem": -1}
    elif case == "float_shared":
        kw = {"shared_mem": 1024.0}
    elif case == "shared_above_limit":
        kw = {"shared_mem": 64 * 1024}
    elif case == "driver_error":
        fp.result = "error"
    launcher = k[2, 32]
    if case == "other_thread":      # the shared parameter block belongs to the thread that made the kernel
        t = threading.Thread(target=launcher, args=args)
        t.start()
        t.join()
    else:
        launcher(*args, **kw)
    assert len(general) == 1, "the general path was not taken"
    g, b, passed, shared, stream = general[0]
    assert (g, b) == ((2, 1, 1), (32, 1, 1))
    assert list(passed) == args, "the general path must see exactly the caller's arguments"
    assert shared == kw.get("shared_mem", 0) and stream is None
    assert len(fp.driver_calls) == (1 if case == "driver_error" else 0)


def test_configured_before_load_uses_the_launcher_once_built(monkeypatch):
    fp = FastFake(1)
    monkeypatch.setattr(platform, "_selected", fp)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: 0x5000 + dev, raising=False)
    k = rocjit.kernel(SRC)
    held = k[4, 64]                      # taken before the first launch loads the kernel
    held(1.0, np.ones(4, np.float32), np.zeros(16, np.float32), 4, 0, True)
    k._fast.__globals__["Tensor"] = FakeTensor
    held(*_args())
    assert fp.driver_calls and fp.driver_calls[0][1:3] == ((4, 1, 1), (64, 1, 1))
