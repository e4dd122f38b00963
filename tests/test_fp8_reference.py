"""The reference FP8 quantizer (ml_dtypes after clamping) against exact rational rounding, and the device
header's software conversion (kernels_src/rocjit/fp8.h, built for the host with g++) against the reference."""
import ctypes
import shutil
import subprocess
from fractions import Fraction

import numpy as np
import pytest

from rocjit.ops import _common as C

FORMATS = {"e4m3fn": dict(bias=7, max=448.0), "e4m3fnuz": dict(bias=8, max=240.0)}


def exact_fp8(x: float, fmt: str) -> int:
    """Round-to-nearest-even by enumerating every finite code (slow, exact)."""
    if np.isnan(x):
        return 0x80 if fmt == "e4m3fnuz" else 0x7F
    m = FORMATS[fmt]["max"]
    x = max(-m, min(m, x))
    best, best_err = None, None
    for code in range(256):
        v = C.fp8_decode(np.array([code], np.uint8), fmt)[0]
        if np.isnan(v):
            continue
        err = abs(Fraction(x) - Fraction(v))
        if best is None or err < best_err or (err == best_err and (code & 1) == 0 and (best & 1) == 1):
            best, best_err = code, err
    if best & 0x7F == 0:  # zero keeps the input's sign in fn, never negative in fnuz
        best = 0x80 if (fmt == "e4m3fn" and np.signbit(x)) else 0x00
    return best


def tricky_values(fmt):
    m = FORMATS[fmt]["max"]
    codes = np.arange(256, dtype=np.uint8)
    vals = C.fp8_decode(codes, fmt)
    vals = vals[np.isfinite(vals)]
    vals = np.unique(vals)
    mids = (vals[1:] + vals[:-1]) / 2  # exact ties
    eps = np.abs(mids) * 2.0 ** -20 + 2.0 ** -30
    out = np.concatenate([vals, mids, mids + eps, mids - eps, [m * 1.03, m * 1.07, m + 1, -m * 1.1, 1e30, -1e30,
                                                              np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 2.0 ** -11]])
    return out


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_reference_matches_exact_rounding(fmt):
    xs = tricky_values(fmt).astype(np.float32)
    ref = C.fp8_reference(xs, fmt)
    exact = np.array([exact_fp8(float(v), fmt) for v in xs], np.uint8)
    assert np.array_equal(ref, exact), [(float(v), r, e) for v, r, e in zip(xs, ref, exact) if r != e][:10]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_reference_special_values(fmt):
    m = FORMATS[fmt]["max"]
    ref = C.fp8_reference(np.array([np.nan, np.inf, -np.inf, 1e6, -1e6, m, -0.0]), fmt)
    nan = 0x80 if fmt == "e4m3fnuz" else 0x7F
    maxc = 0x7F if fmt == "e4m3fnuz" else 0x7E
    assert ref[0] & (0xFF if fmt == "e4m3fnuz" else 0x7F) == nan
    assert list(ref[1:6]) == [maxc, maxc | 0x80, maxc, maxc | 0x80, maxc]
    assert ref[6] == (0x00 if fmt == "e4m3fnuz" else 0x80)


_FAKE_RUNTIME = r"""
#pragma once
#include <cmath>
#include <cstring>
#define __device__
#define __forceinline__ inline
#define __CUDACC_RTC__ 1
static inline unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
"""
_DRIVER = r"""
#include "rocjit/fp8.h"
extern "C" void convert(const float* in, unsigned char* fn, unsigned char* fnuz, float* dfn, float* dfnuz, long n) {
  for (long i = 0; i < n; ++i) {
    fn[i] = rocjit::float_to_fp8<rocjit::e4m3fn>(in[i]);
    fnuz[i] = rocjit::float_to_fp8<rocjit::e4m3fnuz>(in[i]);
    dfn[i] = rocjit::fp8_to_float<rocjit::e4m3fn>(fn[i]);
    dfnuz[i] = rocjit::fp8_to_float<rocjit::e4m3fnuz>(fnuz[i]);
  }
}
"""


@pytest.fixture(scope="module")
def header_lib(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    d = tmp_path_factory.mktemp("fp8h")
    (d / "hip").mkdir()
    (d / "hip" / "hip_runtime.h").write_text(_FAKE_RUNTIME)
    (d / "drv.cpp").write_text(_DRIVER)
    from rocjit.compiler import kernels_src_dir
    subprocess.run([cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-I", str(d), "-I", str(kernels_src_dir()),
                    str(d / "drv.cpp"), "-o", str(d / "drv.so")], check=True)
    lib = ctypes.CDLL(str(d / "drv.so"))
    return lib


def _inputs():
    rng = np.random.default_rng(0)
    parts = [tricky_values("e4m3fn"), tricky_values("e4m3fnuz"),
             rng.standard_normal(200_000) * 100, rng.standard_normal(100_000) * 1e-2,
             rng.uniform(-600, 600, 100_000), rng.standard_normal(50_000) * 1e-3,
             np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0])]
    x = np.concatenate(parts).astype(np.float32)
    bits = rng.integers(0, 2 ** 32, 300_000, dtype=np.uint64).astype(np.uint32)  # arbitrary float bit patterns
    return np.concatenate([x, bits.view(np.float32)])


def test_header_software_path_matches_reference(header_lib):
    x = _inputs()
    n = x.size
    fn, fnuz = np.empty(n, np.uint8), np.empty(n, np.uint8)
    dfn, dfnuz = np.empty(n, np.float32), np.empty(n, np.float32)
    p = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    header_lib.convert(p(x), p(fn), p(fnuz), p(dfn), p(dfnuz), ctypes.c_long(n))
    for fmt, got, dec in (("e4m3fn", fn, dfn), ("e4m3fnuz", fnuz, dfnuz)):
        ref = C.fp8_reference(x, fmt)
        nan = np.isnan(x)
        bad = (got != ref) & ~nan
        assert not bad.any(), (fmt, x[bad][:5], got[bad][:5], ref[bad][:5])
        assert np.isnan(C.fp8_decode(got[nan], fmt)).all()
        # decoding: every code back to its exact value
        want = C.fp8_decode(got, fmt).astype(np.float32)
        assert np.array_equal(np.isnan(dec), np.isnan(want))
        ok = ~np.isnan(want)
        assert np.array_equal(dec[ok], want[ok])
