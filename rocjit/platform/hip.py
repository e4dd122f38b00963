"""AMD backend: hip-python loads modules and launches them; hipRTC / clang compile (rocjit.compilers).

hip-python is imported on first use. ``hipModuleLaunchKernel`` takes ``cuLaunchKernel``'s arguments, so the
generated Python launcher and the native one work here as they do on NVIDIA.
"""
from __future__ import annotations

import ctypes
import functools
import os
import threading
from dataclasses import dataclass

from rocjit.errors import LaunchError, PlatformError
from rocjit.platform import FastLaunch

NAME = "hip"
DLPACK_DEVICE_TYPE = 10     # kDLROCM: what torch on ROCm reports for its GPUs


# ----------------------------------------------------------------------------------------
# Locating the HIP libraries. hip-python dlopens the unversioned libamdhip64.so / libhiprtc.so;
# distributions ship versioned sonames only (and ROCm 5.x keeps hipRTC inside libamdhip64),
# so the resolver is taught those names before the first binding call.

_LIB_MAJORS = (7, 6, 5)


def _can_dlopen(name: str) -> bool:
    try:
        ctypes.CDLL(name)
        return True
    except OSError:
        return False


def _has_symbol(name: str, symbol: str) -> bool:
    try:
        return hasattr(ctypes.CDLL(name), symbol)
    except OSError:
        return False


def _fallback_library(shortname: str) -> str | None:
    """A loadable versioned soname for 'amdhip64' or 'hiprtc', or None."""
    if shortname == "amdhip64":
        for major in _LIB_MAJORS:
            if _can_dlopen(f"libamdhip64.so.{major}"):
                return f"libamdhip64.so.{major}"
    if shortname == "hiprtc":
        for major in _LIB_MAJORS:
            if _can_dlopen(f"libhiprtc.so.{major}"):
                return f"libhiprtc.so.{major}"
        # ROCm 5.x: hipRTC is exported by the HIP runtime library itself.
        for major in _LIB_MAJORS:
            if _has_symbol(f"libamdhip64.so.{major}", "hiprtcCreateProgram"):
                return f"libamdhip64.so.{major}"
    return None


_loader_patched = False


def _teach_loader():
    """Make hip-python resolve libraries through `library_path` (idempotent)."""
    global _loader_patched
    if _loader_patched:
        return
    try:
        from rocm.bindings.util import paths
    except ImportError:   # an older hip-python: it relies on the system loader only
        _loader_patched = True
        return
    original = paths.get_library_path

    def resolve(shortname, *args, **kwargs):
        if shortname in ("amdhip64", "hiprtc") and not args and not kwargs:
            return os.fsencode(library_path(shortname))
        return original(shortname, *args, **kwargs)

    # library_path asks the original resolver first, so keep a handle on it.
    paths._rocjit_original_get_library_path = original
    paths.get_library_path = resolve
    _loader_patched = True


def bindings():
    """(hip, hiprtc) modules of hip-python, with the library resolver prepared."""
    _teach_loader()
    try:
        from hip import hip, hiprtc
    except ImportError as e:
        raise PlatformError(f"hip-python is not installed ({e}); install it with: pip install hip-python") from e
    return hip, hiprtc


@functools.lru_cache(maxsize=None)
def library_path(shortname: str) -> str:
    """The path or soname to dlopen for 'amdhip64' / 'hiprtc': hip-python's own answer
    when it is loadable, else a versioned soname the system loader finds."""
    try:
        from rocm.bindings.util import paths
        resolver = getattr(paths, "_rocjit_original_get_library_path", paths.get_library_path)
        found = os.fsdecode(resolver(shortname))
    except ImportError:
        found = f"lib{shortname}.so"
    if os.path.isabs(found) or _can_dlopen(found):
        return found
    return _fallback_library(shortname) or found


def check(result, what: str):
    """Unpack a hip-python result tuple `(err, values...)`, raising on an error code."""
    if isinstance(result, tuple):
        err, values = result[0], result[1:]
    else:
        err, values = result, ()
    if int(err) != 0:
        raise LaunchError(f"{what} failed", error_name(err))
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def error_name(code) -> str:
    name = getattr(code, "name", None)
    if name:
        return name
    try:
        hip, _ = bindings()
        return hip.hipError_t(int(code)).name
    except Exception:
        return f"hipError {int(code)}"


# ----------------------------------------------------------------------------------------
# Availability

@functools.lru_cache(maxsize=None)
def _probe() -> tuple[bool, str]:
    try:
        hip, _ = bindings()
    except PlatformError as e:
        return False, str(e)
    try:
        result = hip.hipGetDeviceCount()
    except RuntimeError as e:   # the runtime library could not be dlopened
        return False, f"the HIP runtime library is not loadable ({e})"
    err, count = result[0], result[1]
    if int(err) != 0:
        return False, f"no AMD GPU visible (hipGetDeviceCount: {getattr(err, 'name', err)})"
    if count == 0:
        return False, "no AMD GPU visible (hipGetDeviceCount returned 0)"
    return True, ""


def is_available() -> bool:
    return _probe()[0]


def unavailable_reason() -> str:
    ok, reason = _probe()
    return "" if ok else reason


@functools.lru_cache(maxsize=None)
def hiprtc_status() -> tuple[bool, str]:
    """(usable, detail): can hipRTC compile here (no GPU needed)?"""
    try:
        _, hiprtc = bindings()
    except PlatformError as e:
        return False, str(e)
    try:
        result = hiprtc.hiprtcVersion()
    except RuntimeError as e:
        return False, f"libhiprtc is not loadable ({e}); on Debian 12: apt-get install libamdhip64-5 libamd-comgr2 rocm-device-libs libhiprtc-builtins5"
    if int(result[0]) != 0:
        return False, f"hiprtcVersion failed: {result[0]}"
    return True, library_path("hiprtc")


def hiprtc_usable() -> bool:
    return hiprtc_status()[0]


# ----------------------------------------------------------------------------------------
# Devices, modules and launches (hip-python; needs ROCm and an AMD GPU)

def _require():
    if not is_available():
        raise PlatformError(f"no usable AMD GPU: {unavailable_reason()}")
    return bindings()[0]


def device_count() -> int:
    if not is_available():
        return 0
    hip = bindings()[0]
    return check(hip.hipGetDeviceCount(), "hipGetDeviceCount")


@functools.lru_cache(maxsize=None)
def _properties(dev: int):
    hip = _require()
    return check(hip.hipGetDeviceProperties(dev), "hipGetDeviceProperties")


def _text(value) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).split(b"\0", 1)[0].decode(errors="replace")
    return str(value)


def device_name(dev: int) -> str:
    return _text(_properties(dev).name)


def device_target(dev: int) -> str:
    """'gfx942' from gcnArchName 'gfx942:sramecc+:xnack-' (feature flags dropped)."""
    return _text(_properties(dev).gcnArchName).split(":", 1)[0]


@functools.lru_cache(maxsize=None)
def device_attributes(dev: int) -> dict:
    hip = _require()
    attr = hip.hipDeviceAttribute_t

    def get(name):
        return check(hip.hipDeviceGetAttribute(getattr(attr, name), dev), name)

    cus = get("hipDeviceAttributeMultiprocessorCount")
    return {
        "name": device_name(dev),
        "target": device_target(dev),
        "sm_count": cus,
        "cu_count": cus,
        "warp_size": get("hipDeviceAttributeWarpSize"),
        "l2_bytes": get("hipDeviceAttributeL2CacheSize"),
        "max_shared_per_block": get("hipDeviceAttributeMaxSharedMemoryPerBlock"),
        "max_shared_per_block_optin": get("hipDeviceAttributeSharedMemPerBlockOptin") or
                                      get("hipDeviceAttributeMaxSharedMemoryPerBlock"),
        "max_threads_per_block": get("hipDeviceAttributeMaxThreadsPerBlock"),
    }


def set_current(dev: int):
    hip = _require()
    check(hip.hipSetDevice(dev), f"hipSetDevice({dev})")


_previous = threading.local()


def push_current(dev: int) -> bool:
    """Make `dev` current for a launch; True when the caller's device must be restored with pop_current()."""
    hip = _require()
    prev = int(check(hip.hipGetDevice(), "hipGetDevice"))
    if prev == dev:
        return False
    _previous.__dict__.setdefault("stack", []).append(prev)
    set_current(dev)
    return True


def pop_current() -> None:
    set_current(_previous.stack.pop())


def load(code, dev: int, recompile):
    """hipModuleLoadData on device `dev` (the caller made it current with push_current)."""
    hip = _require()
    return check(hip.hipModuleLoadData(code.binary), "hipModuleLoadData")


@dataclass
class Function:
    """A kernel handle: hip-python's object plus its raw address for the ctypes launch path."""
    handle: object
    ptr: int
    name: str


def get_function(module, mangled: str) -> Function:
    hip = _require()
    handle = check(hip.hipModuleGetFunction(module, mangled.encode()), f"hipModuleGetFunction({mangled!r})")
    return Function(handle, int(handle), mangled)


def function_handle(fn: Function) -> int:
    return fn.ptr


def function_info(fn: Function) -> dict:
    hip = _require()
    a = hip.hipFunction_attribute

    def get(name):
        return check(hip.hipFuncGetAttribute(getattr(a, name), fn.handle), name)

    return {
        "num_regs": get("HIP_FUNC_ATTRIBUTE_NUM_REGS"),
        "shared_bytes": get("HIP_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES"),
        "local_bytes": get("HIP_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES"),
        "max_threads": get("HIP_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK"),
    }


def set_max_dynamic_shared(fn: Function, nbytes: int):
    """AMD launches may use the device's whole LDS without opting in; the attribute is set where
    the runtime supports it for module functions, and a request above the LDS size is an error."""
    hip = _require()
    dev = check(hip.hipGetDevice(), "hipGetDevice")
    limit = device_attributes(dev)["max_shared_per_block_optin"]
    if nbytes > limit:
        raise LaunchError(f"dynamic shared memory of {nbytes} bytes requested for {fn.name}, "
                          f"the device allows at most {limit} bytes per workgroup")
    try:
        hip.hipFuncSetAttribute(fn.handle, hip.hipFuncAttribute.hipFuncAttributeMaxDynamicSharedMemorySize, nbytes)
    except Exception:   # module functions are not registered with the runtime API on every ROCm
        pass


@functools.lru_cache(maxsize=None)
def _runtime_lib():
    """The same HIP runtime hip-python uses, for the launch calls made through ctypes and from C."""
    lib = ctypes.CDLL(library_path("amdhip64"))
    f = lib.hipModuleLaunchKernel
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    for name in ("hipCtxGetCurrent", "hipDevicePrimaryCtxRetain"):
        getattr(lib, name).restype = ctypes.c_int
    return lib


def fast_launch() -> FastLaunch:
    """hipModuleLaunchKernel through ctypes, which returns the hipError_t as an int."""
    return FastLaunch(_runtime_lib().hipModuleLaunchKernel, function_handle, 0, False)


def native_launch(pdl: bool = False) -> tuple[int, int]:
    """(hipModuleLaunchKernel address, hipCtxGetCurrent address) for the native launcher. `pdl` is ignored: HIP
    has no programmatic dependent launch (the kernels' grid-dependency calls compile to nothing on AMD)."""
    lib = _runtime_lib()
    return (ctypes.cast(lib.hipModuleLaunchKernel, ctypes.c_void_p).value,
            ctypes.cast(lib.hipCtxGetCurrent, ctypes.c_void_p).value)


@functools.lru_cache(maxsize=None)
def context_handle(dev: int) -> int:
    """`dev`'s primary context: what hipCtxGetCurrent reports while `dev` is the current device."""
    ctx = ctypes.c_void_p()
    err = _runtime_lib().hipDevicePrimaryCtxRetain(ctypes.byref(ctx), int(dev))
    if err:
        raise LaunchError(f"hipDevicePrimaryCtxRetain({dev}) failed", error_name(err))
    return ctx.value


def _dims(d) -> tuple[int, int, int]:
    if isinstance(d, int):
        return (d, 1, 1)
    d = tuple(int(x) for x in d)
    return d + (1,) * (3 - len(d))


def launch(fn: Function, grid, block, shared_mem, stream, kernel_params) -> int:
    """hipModuleLaunchKernel with `kernel_params` (ctypes array of void*, one per parameter).
    Returns HIP's error code (0 on success); the caller raises LaunchError with error_name(code)."""
    gx, gy, gz = _dims(grid)
    bx, by, bz = _dims(block)
    return _runtime_lib().hipModuleLaunchKernel(fn.ptr, gx, gy, gz, bx, by, bz, int(shared_mem),
                                                int(stream or 0), ctypes.addressof(kernel_params), None)


def malloc(nbytes: int, dev: int) -> int:
    hip = _require()
    return int(check(hip.hipMalloc(max(int(nbytes), 1)), "hipMalloc"))


def free(ptr: int):
    hip = _require()
    check(hip.hipFree(ptr), "hipFree")


def memcpy_htod(dst: int, src_ptr: int, nbytes: int):
    hip = _require()
    check(hip.hipMemcpyHtoD(dst, src_ptr, nbytes), "hipMemcpyHtoD")


def memcpy_dtoh(dst_ptr: int, src: int, nbytes: int):
    hip = _require()
    check(hip.hipMemcpyDtoH(dst_ptr, src, nbytes), "hipMemcpyDtoH")


def synchronize(dev: int):
    hip = _require()
    set_current(dev)
    check(hip.hipDeviceSynchronize(), "hipDeviceSynchronize")


def check_last(dev: int):
    hip = _require()
    set_current(dev)
    err = hip.hipGetLastError()
    err = err[0] if isinstance(err, tuple) else err
    if int(err) != 0:
        raise LaunchError("a kernel launch failed", error_name(err))


def pointer_device(ptr: int) -> int | None:
    """Device ordinal owning `ptr`, or None for host memory (unregistered or pinned)."""
    hip = _require()
    result = hip.hipPointerGetAttributes(ptr)
    if int(result[0]) != 0:   # unregistered host memory is reported as an invalid value
        hip.hipGetLastError()  # clear the sticky error the failed query leaves behind
        return None
    attrs = result[1]
    kind = int(getattr(attrs, "type", getattr(attrs, "memoryType", -1)))
    if kind in (int(hip.hipMemoryType.hipMemoryTypeDevice), int(hip.hipMemoryType.hipMemoryTypeManaged)):
        return int(attrs.device)
    return None
