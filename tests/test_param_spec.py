"""One argument contract: the parameter layout each compiler recorded in its code object (cubin .nv.info,
amdhsa .args), read offline, checked against the parsed signature, and used by every launch path."""
import ctypes
import os
import struct

import numpy as np
import pytest

import rocjit
from rocjit import codeobject, compilers, platform, signature, toolchain
from rocjit.errors import ArgumentError, RocjitError
from rocjit.launch.params import ParamSpec
from rocjit.platform import hip
from tests.fakeplatform import FakePlatform, param

MIXED = r"""
struct Pair { double a; char b; };
struct alignas(16) Five { float v[5]; };
extern "C" __global__ void mixed(char c, float* p, short s, Pair st, double d, Five f, bool b, long long q) {}
"""
MIXED_LAYOUT = [(0, 1), (8, 8), (16, 2), (24, 16), (40, 8), (48, 32), (80, 1), (88, 8)]


def _amd_compiler(name):
    if name == "hiprtc" and not hip.hiprtc_usable() or name == "clang" and toolchain.find() is None:
        if os.environ.get("ROCJIT_REQUIRE_AMD") == "1":
            pytest.fail(f"ROCJIT_REQUIRE_AMD=1 but {name} is not usable")
        pytest.skip(f"{name} is not usable here")
    return compilers._module(name)


def _nvrtc():
    try:
        from rocjit.compilers import nvrtc
        nvrtc._nvrtc()
        return nvrtc
    except Exception as e:
        pytest.skip(f"NVRTC is not usable here: {e}")


def test_cubin_parameter_records_read_offline():
    co = _nvrtc().compile(MIXED, target="sm_90a", filename="mixed.cu")
    assert codeobject.param_layout(co.binary, "mixed") == MIXED_LAYOUT
    assert codeobject.param_layout(co.binary, "not_there") is None
    assert codeobject.param_layout(b"//\n.version 8.0\n", "mixed") is None       # PTX says nothing


@pytest.mark.parametrize("compiler,target", [("hiprtc", "gfx90a"), ("clang", "gfx942"), ("clang", "gfx950")])
def test_amd_kernel_argument_metadata_read_offline(compiler, target, monkeypatch):
    monkeypatch.setenv("ROCJIT_AMD_COMPILER", compiler)
    comp = _amd_compiler(compiler)
    co = comp.compile(MIXED, target=target, filename="mixed.hip", include_dirs=comp.shim_dirs())
    assert codeobject.param_layout(co.binary, "mixed") == MIXED_LAYOUT


def test_parsed_and_compiled_layouts_agree_and_pack_alike():
    params = signature.parse(MIXED, "mixed")
    spec = ParamSpec.build("mixed", params, MIXED_LAYOUT)
    assert spec.block_size == 96 and [s.code for s in spec.slots] == ["b", "P", "h", None, "d", None, "?", "q"]
    assert spec.python_packable              # by-value structs: packed as bytes of their size, by the generated
    native = spec.native_params(lambda name: 1)     # launcher and by the native one
    assert [d[:3] for d in native if d[0] == "s"] == [("s", 24, 16), ("s", 48, 32)]
    fmt = spec.struct_format()
    assert struct.calcsize(fmt) == spec.block_size == 96 and "16s" in fmt and "32s" in fmt
    block = struct.pack(fmt, 1, 2, 3, b"P" * 16, 4.0, b"F" * 32, True, 5)
    assert block[24:40] == b"P" * 16 and block[48:80] == b"F" * 32 and block[88:96] == (5).to_bytes(8, "little")
    halves = ParamSpec.build("h", signature.parse("__global__ void h(__half x, float* p) {}", "h"), [(0, 2), (8, 8)])
    assert not halves.python_packable and halves.struct_format() is None    # a half is converted: general path
    assert halves.native_params(lambda name: 1) is None
    plain = ParamSpec.build("k", signature.parse("__global__ void k(char c, float* p, short s, double d) {}", "k"),
                            [(0, 1), (8, 8), (16, 2), (24, 8)])
    fmt = plain.struct_format()
    assert struct.calcsize(fmt) == plain.block_size == 32
    block = struct.pack(fmt, -3, 0x1234, 7, 2.5)
    assert block[0:1] == b"\xfd" and block[8:16] == (0x1234).to_bytes(8, "little") and block[24:32] == \
        struct.pack("d", 2.5)


def test_disagreements_are_errors_before_any_launch():
    params = signature.parse(MIXED, "mixed")
    with pytest.raises(RocjitError, match="declares 8 parameters but the compiled kernel has 7"):
        ParamSpec.build("mixed", params, MIXED_LAYOUT[:-1])
    with pytest.raises(RocjitError, match=r"parameter 'd' \(double d\) is 4 bytes in the compiled kernel, 8"):
        ParamSpec.build("mixed", params, MIXED_LAYOUT[:4] + [(40, 4)] + MIXED_LAYOUT[5:])
    with pytest.raises(RocjitError, match=r"parameter 'p' \(float\* p\) is 4 bytes"):
        ParamSpec.build("mixed", params, [(0, 1), (4, 4)] + MIXED_LAYOUT[2:])
    with pytest.raises(RocjitError, match="cannot tell the size of parameter 'st'"):
        ParamSpec.build("mixed", params, None)          # PTX: no records, and a struct's size is unknown
    natural = ParamSpec.build("k", signature.parse("__global__ void k(char c, double d, int n) {}", "k"), None)
    assert [(s.offset, s.size) for s in natural.slots] == [(0, 1), (8, 8), (16, 4)]


# ----------------------------------------------------------------------------- through a launch (CPU stand-in)
BY_VALUE = r"""
struct Pair { double a; char b; };
__global__ void byvalue(Pair p, float f, double d, float** table, long int n) {}
"""


@pytest.fixture
def seen(monkeypatch):
    got = []

    def emulate(params):
        got.append((bytes((ctypes.c_char * 16).from_address(params[0])), param(params, 1, ctypes.c_float),
                    param(params, 2, ctypes.c_double), param(params, 3, ctypes.c_void_p), param(params, 4, ctypes.c_int64)))
        return 0
    monkeypatch.setattr(platform, "_selected", FakePlatform(emulate))
    _nvrtc()
    return got


class Pair(ctypes.Structure):
    _fields_ = [("a", ctypes.c_double), ("b", ctypes.c_char)]


def test_struct_bytes_must_have_the_compiled_size(seen):
    k = rocjit.kernel(BY_VALUE)
    table = np.zeros(2, np.int64)
    k[1, 1](Pair(1.5, b"x"), 2.0, 3.0, table, -7)
    assert seen[0][0] == bytes(Pair(1.5, b"x")) and seen[0][1:3] == (2.0, 3.0) and seen[0][4] == -7
    for wrong in (b"\0" * 8, b"\0" * 24):
        with pytest.raises(ArgumentError, match=rf"parameter 'p' \(Pair p\): got {len(wrong)} bytes, the compiled "
                                                r"kernel takes 16"):
            k[1, 1](wrong, 2.0, 3.0, table, 0)
    assert len(seen) == 1


def test_float_arguments_out_of_range_name_the_parameter(seen):
    k = rocjit.kernel(BY_VALUE)
    table = np.zeros(2, np.int64)
    with pytest.raises(ArgumentError, match=r"parameter 'd' \(double d\): 1000000000\d* is too large"):
        k[1, 1](bytes(16), 2.0, 10**400, table, 0)
    with pytest.raises(ArgumentError, match=r"parameter 'f' \(float f\): 1e\+39 is outside float's range"):
        k[1, 1](bytes(16), 1e39, 0.0, table, 0)
    k[1, 1](bytes(16), float("inf"), 0.0, table, 0)          # an infinity is a float value, not an overflow
    assert len(seen) == 1 and seen[0][1] == float("inf")


def test_pointer_to_pointers_takes_an_array_of_addresses(seen):
    k = rocjit.kernel(BY_VALUE)
    with pytest.raises(ArgumentError, match=r"parameter 'table' \(float\*\* table\): expected element dtype int64 or "
                                            r"uint64, got float32"):
        k[1, 1](bytes(16), 1.0, 0.0, np.zeros(2, np.float32), 0)
    k[1, 1](bytes(16), 1.0, 0.0, np.zeros(2, np.uint64), 0)
    assert len(seen) == 1


def test_pointers_to_16_bit_floats_are_pointers():
    """A `const __half*` is a pointer slot (8 bytes holding an address), never raw bytes copied from it: the general
    path would otherwise read the device address as host memory."""
    from rocjit import signature
    from rocjit.launch.params import ParamSpec
    src = "__global__ void k(const __half* x, __hip_bfloat16* y, __half h, int n) {}"
    spec = ParamSpec.build("k", signature.parse(src, "k"), [(0, 8), (8, 8), (16, 2), (20, 4)])
    codes = [s.code for s in spec.slots]
    assert codes[:2] == ["P", "P"] and codes[2] is None and codes[3] == "i"
    assert spec.slots[0].ctype is ctypes.c_void_p and spec.slots[1].ctype is ctypes.c_void_p
