"""repr() of a code object is one short line: target, format, size, kernels, key — never the binary."""
import os

import pytest

import rocjit
from rocjit.platform import Compiled

SRC = r"""
#include <hip/hip_runtime.h>
__global__ void axpy(float a, const float* x, float* y, int n) {}
extern "C" __global__ void plain(float* x) {}
"""


def test_repr_is_short_and_names_what_matters():
    co = Compiled(bytes(range(256)) * 4000, "cubin", "sm_90a", lowered={"scale<float, 4>": "_Z5scaleIfLi4EEvPT_"},
                  key="ab" * 32)
    assert repr(co) == "<CodeObject sm_90a cubin, 1024000 bytes, kernels [scale<float, 4>], key abababababababab>"
    many = Compiled(b"", "hsaco", "gfx942", lowered={f"k{i}": f"k{i}" for i in range(9)})
    assert repr(many) == ("<CodeObject gfx942 hsaco, 0 bytes, kernels [k0, k1, k2, k3, k4, k5, ... (9 kernels)], "
                          "key none>")


def test_repr_of_a_damaged_binary_does_not_raise():
    assert "kernels []" in repr(Compiled(b"\x7fELF\x02\x01" + b"\xff" * 80, "hsaco", "gfx90a"))
    assert "kernels []" in repr(Compiled(b"not an elf", "cubin", "sm_90a"))


@pytest.mark.parametrize("target", ["sm_90a", "gfx90a"])
def test_repr_lists_kernels_read_from_the_binary(target, fresh_cache):
    try:
        co = rocjit.compile(SRC, target=target)
    except rocjit.PlatformError as e:
        if os.environ.get("ROCJIT_REQUIRE_AMD") == "1" or target.startswith("sm_"):
            raise
        pytest.skip(f"no compiler for {target}: {e}")
    text = repr(co)
    assert len(text) < 200 and text.startswith(f"<CodeObject {target} ")
    assert sorted(co.kernel_names()) == ["_Z4axpyfPKfPfi", "plain"]
    assert f"{len(co.binary)} bytes" in text and co.key[:16] in text
    named = rocjit.compile(SRC, target=target, name_expressions=["axpy"])
    assert "kernels [axpy]" in repr(named)
