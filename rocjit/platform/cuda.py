"""NVIDIA backend: NVRTC compiles, the driver API (primary contexts, shared with torch) loads and launches.

Compilation needs only the pip wheels (cuda-bindings + nvidia-cuda-nvrtc), no GPU. Launches go through the native
launcher (rocjit/launcher.c, calling ``cuLaunchKernel`` from C) where it could be built, else through cuda-bindings'
compiled ``cuLaunchKernel`` (measured cheaper than the same call through ctypes).
"""
from __future__ import annotations

import ctypes
import functools
import os
import threading

from rocjit.errors import CompileError, LaunchError, PlatformError
from rocjit.platform import Compiled

NAME = "cuda"
_SUCCESS = 0
_KDL_CUDA = 2       # DLPack device type


# ----------------------------------------------------------------------------- driver (ctypes)
class _Driver:
    """The few libcuda entry points rocjit calls, bound once with argtypes."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        P, U, I, S = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_size_t
        sig = {
            "cuInit": (U,), "cuDeviceGetCount": (P,), "cuDeviceGet": (P, I),
            "cuDeviceGetName": (ctypes.c_char_p, I, I), "cuDeviceGetAttribute": (P, I, I),
            "cuDevicePrimaryCtxRetain": (P, I), "cuCtxSetCurrent": (P,), "cuCtxGetCurrent": (P,),
            "cuCtxSynchronize": (), "cuModuleLoadData": (P, ctypes.c_char_p),
            "cuModuleGetFunction": (P, P, ctypes.c_char_p), "cuFuncGetAttribute": (P, I, P),
            "cuFuncSetAttribute": (P, I, I), "cuFuncGetParamInfo": (P, S, P, P),
            "cuLaunchKernel": (P, U, U, U, U, U, U, U, P, P, P),
            "cuMemAlloc_v2": (P, S), "cuMemFree_v2": (P,), "cuMemcpyHtoD_v2": (ctypes.c_uint64, P, S),
            "cuMemcpyDtoH_v2": (P, ctypes.c_uint64, S), "cuPointerGetAttribute": (P, I, ctypes.c_uint64),
            "cuDriverGetVersion": (P,), "cuGetErrorName": (I, P), "cuCtxGetDevice": (P,),
            "cuCtxPushCurrent_v2": (P,), "cuCtxPopCurrent_v2": (P,),
        }
        for name, argtypes in sig.items():
            fn = getattr(self.lib, name)
            fn.argtypes, fn.restype = list(argtypes), I
            setattr(self, name.replace("_v2", ""), fn)

    def check(self, err, what):
        if err != _SUCCESS:
            raise LaunchError(f"{what} failed", error_name(err))


@functools.lru_cache(maxsize=None)
def _drv():
    try:
        d = _Driver()
    except OSError as e:
        raise PlatformError(f"the NVIDIA driver library libcuda.so.1 could not be loaded ({e})") from None
    d.check(d.cuInit(0), "cuInit")
    return d


def error_name(code) -> str:
    try:
        s = ctypes.c_char_p()
        if _drv().cuGetErrorName(int(code), ctypes.byref(s)) == _SUCCESS and s.value:
            return s.value.decode()
    except Exception:
        pass
    return f"CUDA error {int(code)}"


@functools.lru_cache(maxsize=1)
def _probe():
    try:
        d = _drv()
        n = ctypes.c_int()
        d.check(d.cuDeviceGetCount(ctypes.byref(n)), "cuDeviceGetCount")
        return n.value, ""
    except Exception as e:  # no driver, no device: a reason, never a crash
        return 0, str(e)


def is_available() -> bool:
    return _probe()[0] > 0


def unavailable_reason() -> str:
    n, why = _probe()
    return why or ("no NVIDIA GPU visible" if n == 0 else "")


def device_count() -> int:
    return _probe()[0]


def driver_version() -> tuple[int, int]:
    v = ctypes.c_int()
    _drv().check(_drv().cuDriverGetVersion(ctypes.byref(v)), "cuDriverGetVersion")
    return v.value // 1000, (v.value % 1000) // 10


def _attr(dev: int, attr: int) -> int:
    v = ctypes.c_int()
    _drv().check(_drv().cuDeviceGetAttribute(ctypes.byref(v), attr, dev), "cuDeviceGetAttribute")
    return v.value


# CUdevice_attribute values (cuda.h)
_A_MAX_THREADS, _A_WARP, _A_SM_COUNT, _A_CC_MAJOR, _A_CC_MINOR = 1, 10, 16, 75, 76
_A_L2, _A_SMEM_OPTIN, _A_SMEM_PER_SM = 38, 97, 81


@functools.lru_cache(maxsize=None)
def device_name(dev: int) -> str:
    buf = ctypes.create_string_buffer(256)
    _drv().check(_drv().cuDeviceGetName(buf, 256, dev), "cuDeviceGetName")
    return buf.value.decode()


@functools.lru_cache(maxsize=None)
def device_target(dev: int) -> str:
    major, minor = _attr(dev, _A_CC_MAJOR), _attr(dev, _A_CC_MINOR)
    # sm_90a / sm_100a unlock wgmma & co; the arch-specific target runs only on that exact chip, which this is.
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


@functools.lru_cache(maxsize=None)
def device_attributes(dev: int) -> dict:
    return {
        "name": device_name(dev), "target": device_target(dev), "sm_count": _attr(dev, _A_SM_COUNT),
        "warp_size": _attr(dev, _A_WARP), "l2_bytes": _attr(dev, _A_L2),
        "max_threads_per_block": _attr(dev, _A_MAX_THREADS),
        "max_shared_per_block_optin": _attr(dev, _A_SMEM_OPTIN), "shared_per_sm": _attr(dev, _A_SMEM_PER_SM),
    }


# ----------------------------------------------------------------------------- contexts
_primary: dict[int, int] = {}
_tls = threading.local()


def _context(dev: int) -> int:
    ctx = _primary.get(dev)
    if ctx is None:
        h = ctypes.c_void_p()
        _drv().check(_drv().cuDevicePrimaryCtxRetain(ctypes.byref(h), dev), "cuDevicePrimaryCtxRetain")
        ctx = _primary[dev] = h.value
    return ctx


def set_current(dev: int) -> None:
    _drv().check(_drv().cuCtxSetCurrent(_context(dev)), "cuCtxSetCurrent")


def push_current(dev: int) -> bool:
    """Make `dev`'s primary context current for a launch. Returns True when another context was current: the
    caller then calls pop_current() afterwards, so the caller's (and torch's) current device is left as it was."""
    cur, ctx = ctypes.c_void_p(), _context(dev)
    _drv().cuCtxGetCurrent(ctypes.byref(cur))
    if cur.value == ctx:
        return False
    if not cur.value:                 # no context on this thread yet: adopt the primary one, as torch would
        set_current(dev)
        return False
    _drv().check(_drv().cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
    return True


def pop_current() -> None:
    _drv().check(_drv().cuCtxPopCurrent(ctypes.byref(ctypes.c_void_p())), "cuCtxPopCurrent")


# ----------------------------------------------------------------------------- compile (no GPU needed)
@functools.lru_cache(maxsize=1)
def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:
        raise PlatformError("NVRTC needs the cuda extra: pip install 'rocjit[cuda]'") from e
    return nvrtc


@functools.lru_cache(maxsize=1)
def compiler_version() -> str:
    """NVRTC's version, for cache keys. The pip wheel's exact version is read from its metadata (no library load,
    which keeps a cache hit cheap; NVRTC is found in site-packages first); otherwise NVRTC is asked."""
    from importlib import metadata
    for dist in ("nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu12"):
        try:
            return f"nvrtc {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            pass
    err, major, minor = _nvrtc().nvrtcVersion()
    return f"nvrtc {major}.{minor}"


@functools.lru_cache(maxsize=1)
def cuda_include_dirs() -> tuple[str, ...]:
    """CUDA headers for NVRTC (cuda_fp16.h & co): from the pip wheels, else a local toolkit."""
    try:
        from cuda import pathfinder
        d = pathfinder.find_nvidia_header_directory("cudart")
        if d:
            return (d,)
    except Exception:
        pass
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.path.isfile(os.path.join(root, "include", "cuda_fp16.h")):
            return (os.path.join(root, "include"),)
    return ()


def _nvrtc_call(result, what, prog=None, source="", filename="", target=""):
    err, *rest = result
    if int(err) != 0:
        log = _program_log(prog) if prog is not None else ""
        if prog is not None:
            raise CompileError(log or str(err), source, filename, target, compiler_version())
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
    """NVRTC: HIP-flavoured CUDA C++ -> cubin for `target` (sm_XX) or PTX for `compute_XX`."""
    nv = _nvrtc()
    as_ptx = target.startswith("compute_")
    prog = _nvrtc_call(nv.nvrtcCreateProgram(source.encode(), filename.encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        for expr in name_expressions:
            _nvrtc_call(nv.nvrtcAddNameExpression(prog, expr.encode()), "nvrtcAddNameExpression")
        opts = [f"--gpu-architecture={target}", "-std=c++17", "-default-device", "--device-as-default-execution-space"]
        opts += [f"-I{d}" for d in (*include_dirs, *cuda_include_dirs())]
        opts += list(options)
        err, = nv.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        log = _program_log(prog)
        if int(err) != 0:
            raise CompileError(log, source, filename, target, compiler_version())
        lowered = {e: _nvrtc_call(nv.nvrtcGetLoweredName(prog, e.encode()), "nvrtcGetLoweredName").decode()
                   for e in name_expressions}
        if as_ptx:
            n = _nvrtc_call(nv.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
            buf = bytearray(n)
            _nvrtc_call(nv.nvrtcGetPTX(prog, buf), "nvrtcGetPTX")
            return Compiled(bytes(buf), "ptx", target, lowered, log)
        n = _nvrtc_call(nv.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        buf = bytearray(n)
        _nvrtc_call(nv.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
        return Compiled(bytes(buf), "cubin", target, lowered, log)
    finally:
        nv.nvrtcDestroyProgram(prog)


# ----------------------------------------------------------------------------- modules & functions
def load_module(binary: bytes, dev: int) -> int:
    """Load into the current context, which the caller has made dev's primary context (push_current)."""
    mod = ctypes.c_void_p()
    err = _drv().cuModuleLoadData(ctypes.byref(mod), binary)
    if err != _SUCCESS:
        raise LaunchError(f"cuModuleLoadData on device {dev} ({device_name(dev)}) failed", error_name(err))
    return mod.value


def get_function(module: int, mangled: str) -> int:
    fn = ctypes.c_void_p()
    err = _drv().cuModuleGetFunction(ctypes.byref(fn), module, mangled.encode())
    if err != _SUCCESS:
        raise LaunchError(f"kernel symbol {mangled!r} not found in the module", error_name(err))
    return fn.value


_F_MAX_THREADS, _F_SHARED, _F_LOCAL, _F_REGS, _F_MAX_DYN_SHARED = 0, 1, 3, 4, 8


def _func_attr(fn: int, attr: int) -> int:
    v = ctypes.c_int()
    _drv().check(_drv().cuFuncGetAttribute(ctypes.byref(v), attr, fn), "cuFuncGetAttribute")
    return v.value


def function_info(fn: int) -> dict:
    return {"num_regs": _func_attr(fn, _F_REGS), "shared_bytes": _func_attr(fn, _F_SHARED),
            "local_bytes": _func_attr(fn, _F_LOCAL), "max_threads": _func_attr(fn, _F_MAX_THREADS)}


def param_layout(binary, module, fn: int, mangled: str, count: int | None = None):
    """[(offset, size)] per kernel parameter, read from the loaded function (driver >= 12.4). With `count` (the
    source's parameter count) only those are asked for: probing past the end is an API error that
    compute-sanitizer reports."""
    out, off, size = [], ctypes.c_size_t(), ctypes.c_size_t()
    for i in range(4096 if count is None else count):
        err = _drv().cuFuncGetParamInfo(fn, i, ctypes.byref(off), ctypes.byref(size))
        if err != _SUCCESS:
            # CUDA_ERROR_INVALID_VALUE past the last parameter; older drivers lack the call entirely.
            return out if (i > 0 or err == 1) else None
        out.append((off.value, size.value))
    return out


def set_max_dynamic_shared(fn: int, nbytes: int) -> None:
    _drv().check(_drv().cuFuncSetAttribute(fn, _F_MAX_DYN_SHARED, int(nbytes)), "cuFuncSetAttribute(max dynamic shared)")


def launch(fn, grid, block, shared_mem, stream, kernel_params) -> int:
    """Returns the driver's error code; the caller turns a non-zero code into LaunchError."""
    return _drv().cuLaunchKernel(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                 shared_mem, stream, kernel_params, None)


def native_launch():
    """(cuLaunchKernel address, cuCtxGetCurrent address, DLPack device type) for the native launcher."""
    d = _drv()
    return (ctypes.cast(d.cuLaunchKernel, ctypes.c_void_p).value, ctypes.cast(d.cuCtxGetCurrent, ctypes.c_void_p).value,
            _KDL_CUDA)


def context_handle(dev: int) -> int:
    """`dev`'s primary context: the native launcher launches only while it is current."""
    return _context(dev)


def fast_launch():
    """(launch, wrap_function, success) for generated launchers: cuda-bindings' cuLaunchKernel is a compiled call,
    measured cheaper than the same call through ctypes. It takes (function, gx, gy, gz, bx, by, bz, shared_mem,
    stream_int, params_address, 0) and returns a tuple whose first item is `success` on success."""
    from cuda.bindings import driver
    return driver.cuLaunchKernel, driver.CUfunction, driver.CUresult.CUDA_SUCCESS


# ----------------------------------------------------------------------------- memory (staging)
def malloc(nbytes: int, dev: int) -> int:
    p = ctypes.c_uint64()
    _drv().check(_drv().cuMemAlloc(ctypes.byref(p), max(int(nbytes), 1)), "cuMemAlloc")
    return p.value


def free(ptr: int) -> None:
    _drv().cuMemFree(ptr)


def memcpy_htod(dst: int, src_ptr: int, nbytes: int) -> None:
    _drv().check(_drv().cuMemcpyHtoD(dst, src_ptr, nbytes), "cuMemcpyHtoD")


def memcpy_dtoh(dst_ptr: int, src: int, nbytes: int) -> None:
    _drv().check(_drv().cuMemcpyDtoH(dst_ptr, src, nbytes), "cuMemcpyDtoH")


def synchronize(dev: int) -> None:
    pushed = push_current(dev)
    try:
        _drv().check(_drv().cuCtxSynchronize(), "kernel execution (cuCtxSynchronize)")
    finally:
        if pushed:
            pop_current()


_P_MEMORY_TYPE, _P_DEVICE_ORDINAL = 2, 9
_MEMORYTYPE_DEVICE, _MEMORYTYPE_UNIFIED = 2, 4


def pointer_device(ptr: int):
    """Device ordinal if `ptr` is device (or managed) memory, None if it is host memory."""
    v = ctypes.c_uint()
    if _drv().cuPointerGetAttribute(ctypes.byref(v), _P_MEMORY_TYPE, ptr) != _SUCCESS:
        return None
    if v.value not in (_MEMORYTYPE_DEVICE, _MEMORYTYPE_UNIFIED):
        return None
    o = ctypes.c_int()
    _drv().check(_drv().cuPointerGetAttribute(ctypes.byref(o), _P_DEVICE_ORDINAL, ptr), "cuPointerGetAttribute")
    return o.value


def check_last(dev: int) -> None:
    synchronize(dev)
