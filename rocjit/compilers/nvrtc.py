"""NVRTC (cuda-bindings + the nvidia-cuda-nvrtc wheel): HIP-flavoured CUDA C++ -> cubin, or PTX for compute_XX.

No GPU is needed. The kernels' HIP names reach NVRTC through the small shim headers in kernels_src/cuda_shim.
"""
from __future__ import annotations

import functools
import os

from rocjit import targets
from rocjit.errors import CompileError, PlatformError
from rocjit.platform import Compiled

NAME = "nvrtc"
INSTALL_HINT = "pip install cuda-bindings nvidia-cuda-nvrtc"


@functools.lru_cache(maxsize=1)
def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:
        raise PlatformError(f"compiling for NVIDIA targets needs NVRTC's Python bindings: {INSTALL_HINT}") from e
    try:
        err, *_ = nvrtc.nvrtcVersion()     # the first call loads libnvrtc
    except Exception as e:   # cuda.pathfinder's not-found error, or an OSError from the loader
        raise PlatformError(f"the NVRTC library (libnvrtc) could not be loaded ({type(e).__name__}: {e}); "
                            f"install it with: {INSTALL_HINT}") from None
    if int(err) != 0:
        raise PlatformError(f"NVRTC does not work here: nvrtcVersion returned {err}")
    return nvrtc


@functools.lru_cache(maxsize=1)
def version() -> str:
    """NVRTC's version, for cache keys. The pip wheel's exact version is read from its metadata (no library load,
    which keeps a cache hit cheap; NVRTC is found in site-packages first); otherwise NVRTC is asked."""
    from importlib import metadata
    for dist in ("nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu12"):
        try:
            return f"nvrtc {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            pass
    _, major, minor = _nvrtc().nvrtcVersion()
    return f"nvrtc {major}.{minor}"


@functools.lru_cache(maxsize=1)
def cuda_include_dirs() -> tuple[str, ...]:
    """CUDA headers for NVRTC (cuda_fp16.h & co): from the pip wheels, else a local toolkit."""
    try:
        from cuda import pathfinder
        d = pathfinder.find_nvidia_header_directory("cudart")
        if d:
            return (d,)
    except Exception:   # no pathfinder, or no header wheel: look for a toolkit instead
        pass
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.path.isfile(os.path.join(root, "include", "cuda_fp16.h")):
            return (os.path.join(root, "include"),)
    return ()


def shim_dirs() -> list[str]:
    """The HIP names (hip/hip_runtime.h, hip/hip_fp16.h, ...) as CUDA headers."""
    from rocjit.compiler import kernels_src_dir
    return [str(kernels_src_dir() / "cuda_shim")]


def _check(result, what):
    err, *rest = result
    if int(err) != 0:
        raise PlatformError(f"{what} failed: {err}")
    return rest[0] if len(rest) == 1 else rest


def _program_log(prog) -> str:
    nv = _nvrtc()
    _, n = nv.nvrtcGetProgramLogSize(prog)
    buf = bytearray(n)
    nv.nvrtcGetProgramLog(prog, buf)
    return bytes(buf).rstrip(b"\x00 ").decode(errors="replace")


def compile(source: str, *, target: str, options=(), include_dirs=(), name_expressions=(),
            filename: str = "kernel.hip") -> Compiled:
    """source -> cubin for `target` (sm_XX) or PTX for `compute_XX`."""
    nv = _nvrtc()
    as_ptx = targets.is_ptx(target)
    prog = _check(nv.nvrtcCreateProgram(source.encode(), filename.encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        for expr in name_expressions:
            _check(nv.nvrtcAddNameExpression(prog, expr.encode()), "nvrtcAddNameExpression")
        opts = [f"--gpu-architecture={target}", "-std=c++17", "-default-device", "--device-as-default-execution-space"]
        opts += [f"-I{d}" for d in (*include_dirs, *cuda_include_dirs())]
        opts += list(options)
        err, = nv.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        log = _program_log(prog)
        if int(err) != 0:
            raise CompileError(log, source, filename, target, version())
        lowered = {e: _check(nv.nvrtcGetLoweredName(prog, e.encode()), "nvrtcGetLoweredName").decode()
                   for e in name_expressions}
        size_call, get_call, fmt = ((nv.nvrtcGetPTXSize, nv.nvrtcGetPTX, "ptx") if as_ptx else
                                    (nv.nvrtcGetCUBINSize, nv.nvrtcGetCUBIN, "cubin"))
        buf = bytearray(_check(size_call(prog), size_call.__name__))
        _check(get_call(prog, buf), get_call.__name__)
        return Compiled(bytes(buf), fmt, target, lowered, log)
    finally:
        nv.nvrtcDestroyProgram(prog)
