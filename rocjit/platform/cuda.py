"""NVIDIA backend: the driver API (primary contexts, shared with torch) loads and launches; NVRTC compiles
(rocjit.compilers.nvrtc). Launches go through the native launcher (rocjit/launcher.c, calling ``cuLaunchKernel``
from C) where it could be built, else through cuda-bindings' compiled ``cuLaunchKernel``.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import re
import threading
import warnings

from rocjit import targets
from rocjit.errors import LaunchError, PlatformError
from rocjit.platform import FastLaunch

NAME = "cuda"
DLPACK_DEVICE_TYPE = 2      # kDLCUDA
_SUCCESS = 0


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
            "cuFuncSetAttribute": (P, I, I),
            "cuLaunchKernel": (P, U, U, U, U, U, U, U, P, P, P),
            "cuMemAlloc_v2": (P, S), "cuMemFree_v2": (P,), "cuMemcpyHtoD_v2": (ctypes.c_uint64, P, S),
            "cuMemcpyDtoH_v2": (P, ctypes.c_uint64, S), "cuPointerGetAttribute": (P, I, ctypes.c_uint64),
            "cuDriverGetVersion": (P,), "cuGetErrorName": (I, P), "cuCtxGetDevice": (P,),
            "cuCtxPushCurrent_v2": (P,), "cuCtxPopCurrent_v2": (P,), "cuThreadExchangeStreamCaptureMode": (P,),
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


# ----------------------------------------------------------------------------- modules & functions
def _load_binary(binary: bytes, dev: int) -> int:
    """Load into the current context, which the caller has made dev's primary context (push_current)."""
    mod = ctypes.c_void_p()
    err = _drv().cuModuleLoadData(ctypes.byref(mod), binary)
    if err != _SUCCESS:
        raise LaunchError(f"cuModuleLoadData on device {dev} ({device_name(dev)}) failed", error_name(err))
    return mod.value


_DRIVER_TOO_OLD = {"CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "CUDA_ERROR_NO_BINARY_FOR_GPU", "CUDA_ERROR_INVALID_IMAGE",
                   "CUDA_ERROR_INVALID_PTX", "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY"}
# CUDA release -> the PTX ISA version its driver JIT accepts
_PTX_ISA = {(12, 0): "8.0", (12, 1): "8.1", (12, 2): "8.2", (12, 3): "8.3", (12, 4): "8.4", (12, 5): "8.5",
            (12, 6): "8.5", (12, 8): "8.7", (12, 9): "8.8", (13, 0): "9.0", (13, 1): "9.1", (13, 2): "9.2"}


def lower_ptx_version(ptx: str, drv) -> str:
    isa = _PTX_ISA.get(tuple(drv))
    return re.sub(r"^\.version\s+\d+\.\d+", f".version {isa}", ptx, count=1, flags=re.M) if isa else ptx


def load(code, dev: int, recompile) -> int:
    """Load the cubin; if the driver rejects code from a newer NVRTC, retry with PTX lowered to the driver's ISA."""
    try:
        return _load_binary(code.binary, dev)
    except LaunchError as e:
        if e.error_name not in _DRIVER_TOO_OLD or targets.is_ptx(code.target):
            raise
        from rocjit.compilers import nvrtc
        drv, built_by = driver_version(), nvrtc.version()
        warnings.warn(f"rocjit: the driver (CUDA {drv[0]}.{drv[1]}) rejected code built by {built_by} "
                      f"({e.error_name}); retrying with PTX for the driver's version", RuntimeWarning, stacklevel=5)
        ptx = recompile("compute_" + code.target[3:])
        try:
            return _load_binary(lower_ptx_version(ptx.binary.decode(), drv).encode() + b"\0", dev)
        except LaunchError as e2:
            raise LaunchError(f"the driver (CUDA {drv[0]}.{drv[1]}) cannot load code from {built_by}, even as PTX; "
                              f"install an nvidia-cuda-nvrtc wheel no newer than the driver "
                              f"(pip install 'nvidia-cuda-nvrtc<={drv[0]}.{drv[1]}') or update the driver",
                              e2.error_name) from None


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


def function_handle(fn: int) -> int:
    return fn


def set_max_dynamic_shared(fn: int, nbytes: int) -> None:
    _drv().check(_drv().cuFuncSetAttribute(fn, _F_MAX_DYN_SHARED, int(nbytes)), "cuFuncSetAttribute(max dynamic shared)")


def launch(fn, grid, block, shared_mem, stream, kernel_params) -> int:
    """Returns the driver's error code; the caller turns a non-zero code into LaunchError."""
    return _drv().cuLaunchKernel(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                 shared_mem, stream, kernel_params, None)


def native_launch(pdl: bool = False) -> tuple[int, int]:
    """(launch function address, cuCtxGetCurrent address) for the native launcher: cuLaunchKernel, or with `pdl`
    the native module's cuLaunchKernelEx call that sets the programmatic stream serialization attribute (the
    caller asks for it only for kernels that wait for the grid ahead of them, on sm_90+)."""
    d = _drv()
    ctx = ctypes.cast(d.cuCtxGetCurrent, ctypes.c_void_p).value
    ex = getattr(d.lib, "cuLaunchKernelEx", None) if pdl else None
    if ex is not None:
        from rocjit import native
        mod = native.module()
        if mod is not None:
            return mod.pdl_launch(ctypes.cast(ex, ctypes.c_void_p).value), ctx
    return ctypes.cast(d.cuLaunchKernel, ctypes.c_void_p).value, ctx


def context_handle(dev: int) -> int:
    """`dev`'s primary context: the native launcher launches only while it is current."""
    return _context(dev)


def fast_launch() -> FastLaunch:
    """cuda-bindings' cuLaunchKernel: a compiled call, measured cheaper than the same call through ctypes."""
    from cuda.bindings import driver
    return FastLaunch(driver.cuLaunchKernel, driver.CUfunction, driver.CUresult.CUDA_SUCCESS, True)


# ----------------------------------------------------------------------------- tensor maps (TMA, sm_90+)
_TMAP_UINT8, _TMAP_SWIZZLE_128B, _TMAP_L2_256B = 0, 3, 3


@functools.lru_cache(maxsize=1)
def _tensor_map_encoder():
    """libcuda's cuTensorMapEncodeTiled, bound once (absent before CUDA 12 drivers: not in _Driver's list)."""
    fn = getattr(_drv().lib, "cuTensorMapEncodeTiled", None)
    if fn is None:
        raise PlatformError("this NVIDIA driver has no cuTensorMapEncodeTiled (tensor maps need a CUDA 12 driver)")
    P = ctypes.c_void_p
    fn.argtypes = [P, ctypes.c_int, ctypes.c_uint, P, P, P, P, P, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                   ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


@functools.lru_cache(maxsize=4096)
def tensor_map_2d(address: int, inner: int, rows: int, row_stride: int, box_inner: int, box_rows: int) -> bytes:
    """The CUtensorMap (128 bytes, for a kernel's by-value tensor-map parameter) of a byte matrix at `address`:
    `rows` rows of `inner` bytes, `row_stride` bytes apart (a multiple of 16; address 16-byte aligned), copied in
    boxes of box_rows x box_inner bytes, 128B-swizzled, zeros read outside the matrix. A map only describes
    memory, so one encoded for an address serves every later tensor with the same address and shape."""
    fn, P = _tensor_map_encoder(), ctypes.c_void_p
    buf = ctypes.create_string_buffer(128 + 64)                  # CUtensorMap is 64-byte aligned
    at = (ctypes.addressof(buf) + 63) & ~63
    err = fn(at, _TMAP_UINT8, 2, P(address), (ctypes.c_uint64 * 2)(inner, rows), (ctypes.c_uint64 * 1)(row_stride),
             (ctypes.c_uint32 * 2)(box_inner, box_rows), (ctypes.c_uint32 * 2)(1, 1), 0, _TMAP_SWIZZLE_128B,
             _TMAP_L2_256B, 0)
    _drv().check(err, f"cuTensorMapEncodeTiled({rows} x {inner} bytes, row stride {row_stride}, box {box_rows} x "
                 f"{box_inner})")
    return ctypes.string_at(at, 128)


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


_CAPTURE_MODE_RELAXED = 2


@contextlib.contextmanager
def relaxed_capture_mode():
    """Within it, this thread may make the calls that stream capture forbids by default (allocate memory, wait for a
    stream that is not being captured) while one of its streams is being captured; the thread's previous mode is
    restored on exit. Nothing done here becomes part of the graph (torch's allocator does the same around
    cudaMalloc)."""
    d = _drv()
    mode = ctypes.c_int(_CAPTURE_MODE_RELAXED)
    d.check(d.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode)), "cuThreadExchangeStreamCaptureMode")
    try:
        yield
    finally:
        d.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))


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
