"""No target name, and no header a user includes, can take the process down: targets are checked before any
vendor library sees them, hipRTC 5.x only gets the targets it builds, and hipRTC's own half / bf16 types do not
collide with the system's headers."""
import os
import subprocess
import sys
import textwrap

import pytest

import rocjit
from rocjit import compilers, targets, toolchain
from rocjit.compilers import hiprtc
from rocjit.errors import CompileError, PlatformError
from rocjit.platform import hip

SAXPY = 'extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {}\n'
README_SCALE = r"""
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
template <typename T, int VEC>
__global__ void scale(const T* x, T* y, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = (T)((float)x[i] * s);
}
"""


def _require_hiprtc():
    usable, detail = hip.hiprtc_status()
    if not usable:
        if os.environ.get("ROCJIT_REQUIRE_AMD") == "1":
            pytest.fail(f"ROCJIT_REQUIRE_AMD=1 but hipRTC is not usable: {detail}")
        pytest.skip(f"hipRTC is not usable: {detail}")


def _child(code: str, **env):
    """Run `code` in a fresh interpreter: an abort inside a vendor library shows as a signal, not a lost test run."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})


@pytest.mark.parametrize("bad", ["foo", "sm_9", "gfx", "gfx90a:xnack-", "", None, 90])
def test_malformed_targets_are_refused_by_name(bad):
    with pytest.raises(ValueError, match="neither an NVIDIA sm_XX / compute_XX nor an AMD gfxNNN target"):
        rocjit.compile(SAXPY, target=bad)


def test_targets_belong_to_one_vendor():
    assert [targets.vendor(t) for t in ("sm_90a", "sm_100f", "compute_90", "gfx90a", "gfx1100")] == \
        ["cuda", "cuda", "cuda", "hip", "hip"]
    assert targets.is_ptx("compute_90a") and not targets.is_ptx("sm_90a")


def test_unknown_gfx_target_is_a_compile_error_listing_the_known_ones():
    """gfx9999 used to abort the interpreter inside hipRTC 5.2 (munmap_chunk(): invalid pointer)."""
    r = _child("""
        import rocjit
        try:
            rocjit.compile('extern "C" __global__ void k(float* x) {}', target="gfx9999")
        except rocjit.CompileError as e:
            print("CompileError:", e)
        """, ROCJIT_AMD_COMPILER="")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "'gfx9999' is not an AMD GPU target rocjit knows" in r.stdout and "gfx942" in r.stdout


@pytest.mark.parametrize("target", ["gfx1100", "gfx940"])
def test_targets_hiprtc_5_cannot_build_never_reach_it(target):
    _require_hiprtc()
    if hiprtc.version_tuple() >= (6, 0):
        pytest.skip("this hipRTC is not ROCm 5.x")
    assert not hiprtc.supports(target, hiprtc.version_tuple())
    # the default picks clang (installed or not: a missing toolchain is an error that says how to install it)
    assert compilers.amd_compiler_name(target) == "clang"
    r = _child(f"""
        import rocjit
        from rocjit.compilers import hiprtc
        for forced in ("hiprtc", None):
            try:
                if forced:
                    import os; os.environ["ROCJIT_AMD_COMPILER"] = forced
                    rocjit.compile('extern "C" __global__ void k(float* x) {{}}', target="{target}")
                else:       # the compiler module itself refuses too, whoever calls it
                    hiprtc.compile('extern "C" __global__ void k(float* x) {{}}', target="{target}")
            except rocjit.CompileError as e:
                print("CompileError:", str(e).splitlines()[2])
        """, ROCJIT_AMD_COMPILER="")
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [line for line in r.stdout.splitlines() if line.startswith("CompileError")]
    assert len(lines) == 2 and all(f"cannot build {target}" in line and "gfx90a" in line for line in lines), r.stdout


@pytest.mark.parametrize("header", ["hip/hip_fp16.h", "hip/hip_bf16.h"])
def test_user_code_including_hip_half_headers_compiles_for_gfx90a(header, monkeypatch):
    """The README's scale<__half, 8> failed under hipRTC 5.2 with "redefinition of '__half_raw'"."""
    _require_hiprtc()
    monkeypatch.delenv("ROCJIT_AMD_COMPILER", raising=False)
    assert compilers.amd_compiler_name("gfx90a") == "hiprtc"
    src = README_SCALE.replace("hip/hip_fp16.h", header)
    if header.endswith("bf16.h"):       # the conversions ROCm 5's stand-in and ROCm 6's header both have
        src += ("__global__ void scale_bf16(const __hip_bfloat16* x, __hip_bfloat16* y, float s) {\n"
                "    y[threadIdx.x] = __float2bfloat16(__bfloat162float(x[threadIdx.x]) * s);\n}\n")
    co = rocjit.compile(src, target="gfx90a", name_expressions=["scale<__half, 8>"])
    assert co.format == "hsaco" and co.lowered["scale<__half, 8>"].startswith("_Z5scaleI6__half")


def test_bf16_stand_in_converts_like_the_real_header():
    """kernels_src/hiprtc_shim/hip/hip_bf16.h is compiled for hipRTC 5.x; its rounding must be round-to-nearest-
    even with NaN kept, as ROCm's header does it: the same bit arithmetic, checked here in numpy."""
    import numpy as np
    ml_dtypes = pytest.importorskip("ml_dtypes")
    shim = (rocjit.kernels_src_dir() / "hiprtc_shim" / "hip" / "hip_bf16.h").read_text()
    assert "u + 0x7fffu + ((u >> 16) & 1u)" in shim and "(u | 0x00400000u)" in shim
    f = np.array([1.0, 1.00390625, 1.01171875, -3.3e38, np.inf, np.nan, 1e-40], np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = np.where((u & 0x7FFFFFFF) > 0x7F800000, u | 0x00400000, u + 0x7FFF + ((u >> 16) & 1))
    ours = (rounded >> 16).astype(np.uint16)
    ref = f.astype(ml_dtypes.bfloat16).view(np.uint16)
    assert (ours[~np.isnan(f)] == ref[~np.isnan(f)]).all() and np.isnan(ours.view(ml_dtypes.bfloat16)[5])


def test_missing_libnvrtc_is_a_rocjit_error(monkeypatch):
    cuda_bindings = pytest.importorskip("cuda.bindings")
    from rocjit.compilers import nvrtc

    class NotFound(RuntimeError):       # what cuda.pathfinder raises when no libnvrtc is installed
        pass

    class NoLibrary:
        def nvrtcVersion(self):
            raise NotFound("Failure finding libnvrtc.so")

    monkeypatch.setattr(cuda_bindings, "nvrtc", NoLibrary(), raising=False)
    nvrtc._nvrtc.cache_clear()
    try:
        with pytest.raises(PlatformError, match=r"libnvrtc\) could not be loaded \(NotFound: .*pip install"):
            nvrtc.compile(SAXPY, target="sm_90a")
    finally:
        nvrtc._nvrtc.cache_clear()


def test_toolchain_status_uses_the_same_policy():
    status = toolchain.status()
    assert set(status["targets"]) == {"gfx90a", "gfx942", "gfx950"}


def test_wave_sizes():
    assert [targets.wave_size(t) for t in ("sm_90a", "gfx803", "gfx90a", "gfx942", "gfx950")] == [32, 64, 64, 64, 64]
    assert [targets.wave_size(t) for t in ("gfx1030", "gfx1100", "gfx1201")] == [32, 32, 32]


def test_rdna_targets_compile_with_the_offline_clang():
    """gfx10+ compiles wave32: the HIP headers refuse an RDNA target told it is wave64."""
    if toolchain.find() is None:
        if os.environ.get("ROCJIT_REQUIRE_AMD") == "1":
            pytest.fail("ROCJIT_REQUIRE_AMD=1 but the offline AMD toolchain is not installed")
        pytest.skip("the offline AMD toolchain is not installed")
    src = ("#include <hip/hip_runtime.h>\n"
           "__global__ void k(int* x) { if (threadIdx.x == 0) x[0] = warpSize; }\n")
    co = rocjit.compile(src, target="gfx1100")
    assert co.target == "gfx1100" and co.binary[:4] == b"\x7fELF"
