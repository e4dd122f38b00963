"""The general launch path: every argument checked against its parameter (errors name it), numpy arrays staged
through device buffers, any stream kind, any device. The fast launchers hand it every case they do not take."""
from __future__ import annotations

import contextlib
import ctypes
import os
import sys

from rocjit import arrays, signature
from rocjit.errors import ArgumentError, LaunchError
from rocjit.launch.params import INT_RANGES, ParamSpec, Slot

STATIC_SHARED_LIMIT = 48 * 1024
_FLOAT32_MAX = 3.4028234663852886e38


def dim3(v, what):
    t = (v,) if isinstance(v, int) else tuple(v)
    if not 1 <= len(t) <= 3 or not all(isinstance(x, int) for x in t):
        raise ValueError(f"{what}: expected an int or a tuple of 1-3 ints, got {v!r}")
    if any(x < 1 for x in t):
        raise ValueError(f"{what}: every dimension must be >= 1, got {v!r}")
    return t + (1,) * (3 - len(t))


def debug() -> bool:
    return os.environ.get("ROCJIT_DEBUG", "") not in ("", "0")


class Configured:
    """kernel[grid, block] before the kernel is loaded (or without a generated launcher): calling it launches."""
    __slots__ = ("kernel", "grid", "block", "fast")

    def __init__(self, kernel, grid, block):
        self.kernel, self.grid, self.block, self.fast = kernel, grid, block, None

    def __call__(self, *args, shared_mem=0, stream=None):
        if self.fast is None and self.kernel._fast:
            self.fast = self.kernel._fast(*self.grid, *self.block)
        if self.fast:
            return self.fast(*args, shared_mem=shared_mem, stream=stream)
        return launch(self.kernel, self.grid, self.block, args, shared_mem, stream)


def launch(kernel, g, b, args, shared_mem, stream):
    """Check, stage and launch `kernel` (a rocjit.Kernel) with `args`."""
    plat = kernel.platform()
    params = kernel.params
    if len(args) != len(params):
        names = ", ".join(p.name for p in params)
        raise ArgumentError(f"kernel {kernel.name} takes {len(params)} arguments ({names}), got {len(args)}")
    nthreads = b[0] * b[1] * b[2]
    if nthreads > 1024:
        raise ValueError(f"block {b}: {nthreads} threads per block, at most 1024 are allowed")
    pointers, devices, staged, keep, uses_torch, uses_cupy = {}, set(), [], [], False, False
    for i, (a, p) in enumerate(zip(args, params)):
        if not p.pointer:
            continue
        v, dev, st, info = _pointer_arg(a, p, plat)
        if st is not None:
            staged.append((i, st, p))
        if dev is not None:
            devices.add(dev)
        if info is not None:
            keep.append(info.keepalive)
            uses_torch |= info.framework == "torch"
            uses_cupy |= info.framework == "cupy"
        pointers[i] = v
    if len(devices) > 1:
        raise ArgumentError(f"kernel {kernel.name}: arguments live on different devices {sorted(devices)}; "
                            f"move them to one device")
    dev = devices.pop() if devices else kernel.default_device()
    fn, spec = kernel.loaded(dev)
    values = [pointers[i] if s.pointer else _scalar_arg(a, s) for i, (a, s) in enumerate(zip(args, spec.slots))]
    with device_context(plat, dev):
        _launch_on(kernel, plat, spec, fn, dev, g, b, values, staged, uses_torch, uses_cupy, shared_mem, stream)
    del keep


def _launch_on(kernel, plat, spec: ParamSpec, fn, dev, g, b, values, staged, uses_torch, uses_cupy, shared_mem,
               stream):
    """The launch proper, with dev's context current."""
    if stream is None:
        stream = _torch_stream(dev) if uses_torch else _cupy_stream() if uses_cupy else 0
    else:
        stream = arrays.stream_handle(stream)
    shared_mem = int(shared_mem)
    if shared_mem < 0:
        raise ValueError(f"shared_mem must be >= 0, got {shared_mem}")
    _raise_shared_limit(kernel, plat, fn, dev, shared_mem)
    if staged and _capturing():
        raise ArgumentError(f"kernel {kernel.name}: numpy arguments are copied to and from the device around the "
                            f"launch, which a graph capture cannot record; pass device arrays inside capture")
    buffers = []
    try:
        for i, st, p in staged:
            host = st.array
            nbytes = host.nbytes
            ptr = plat.malloc(nbytes, dev)
            buffers.append(ptr)
            if st.copy_in and nbytes:
                src = host if host.flags.c_contiguous else host.copy(order="C")
                plat.memcpy_htod(ptr, src.ctypes.data, nbytes)
            values[i] = ptr
        storage, params = spec.storage()
        for s, v in zip(storage, values):
            if isinstance(s, ctypes.Array):
                ctypes.memmove(s, v, len(s))
            else:
                s.value = v
        err = plat.launch(fn, g, b, shared_mem, stream, params)
        if err:
            raise LaunchError(f"launch of {kernel.name} (grid {g}, block {b}, shared_mem {shared_mem}) failed",
                              plat.error_name(err))
        if (staged or debug()) and not _capturing():
            plat.check_last(dev)
        for (_, st, p), ptr in zip(staged, buffers):
            if st.copy_out and not p.const and st.array.nbytes:
                _copy_back(plat, st.array, ptr)
    finally:
        for ptr in buffers:
            plat.free(ptr)


def _raise_shared_limit(kernel, plat, fn, dev, shared_mem):
    """Opt the function in to `shared_mem` dynamic bytes where they exceed what it may use without (what is left of
    48 KB beside its static shared memory); more than the device allows per block raises."""
    if shared_mem > kernel.shared_limit.get(dev, STATIC_SHARED_LIMIT):
        optin = plat.device_attributes(dev).get("max_shared_per_block_optin", STATIC_SHARED_LIMIT)
        static = kernel.static_shared.get(dev, 0)
        if shared_mem + static > optin:
            beside = f" beside the kernel's {static} bytes of static shared memory" if static else ""
            raise ValueError(f"shared_mem={shared_mem} bytes{beside} exceeds the device's limit of {optin} bytes "
                             f"per block")
        plat.set_max_dynamic_shared(fn, shared_mem)
        kernel.shared_limit[dev] = shared_mem


# ----------------------------------------------------------------------------- argument checking
def _pointer_arg(a, p: signature.Param, plat):
    """(value, device, staging, info) for a pointer parameter."""
    if a is None:
        return 0, None, None, None
    if isinstance(a, arrays._Staged):
        _check_dtype(arrays.describe(a.array), p)
        return 0, None, a, None
    np = sys.modules.get("numpy")
    if np is not None and isinstance(a, np.ndarray):
        _check_dtype(arrays.describe(a), p)
        stage = arrays.In(a) if (p.const or not a.flags.writeable) else arrays.InOut(a)
        return 0, None, stage, None
    if isinstance(a, int) and not isinstance(a, bool):
        dev = plat.pointer_device(a) if a else None
        if a and dev is None:
            raise ArgumentError(f"{p.describe()}: the integer {a:#x} is not a device pointer (host memory?); "
                                f"pass a GPU array, or a numpy array to have it staged")
        return a, dev, None, None
    info = arrays.describe(a)
    if info is None:
        raise ArgumentError(f"{p.describe()}: expected a GPU array (torch / cupy / DLPack / CUDA array interface), "
                            f"a numpy array, a device pointer or None; got {type(a).__name__}")
    if info.device is None:
        raise ArgumentError(f"{p.describe()}: got a {info.framework} array in host (CPU) memory where the kernel needs "
                            f"GPU memory; move it to the GPU first (e.g. tensor.cuda()), or pass a numpy array to stage it")
    _check_dtype(info, p)
    if not info.contiguous:
        raise ArgumentError(f"{p.describe()}: the array is not contiguous (shape {info.shape}, strides {info.strides}); "
                            f"pass a contiguous copy (e.g. .contiguous()) or its data pointer as an int")
    align = signature.POINTEE_ALIGN.get(p.ctype, 1)
    if align > 1 and info.ptr % align:
        raise ArgumentError(f"{p.describe()}: the data pointer {info.ptr:#x} is not {align}-byte aligned as "
                            f"{p.ctype} requires")
    return info.ptr, info.device, None, info


def _check_dtype(info, p):
    allowed = p.dtypes
    if allowed is not None and info.dtype not in allowed:
        want = allowed[0] if len(allowed) == 1 else " or ".join(allowed)
        raise ArgumentError(f"{p.describe()}: expected element dtype {want}, got {info.dtype}")


def _float(a, p):
    if not isinstance(a, (int, float)) or isinstance(a, bool):
        raise ArgumentError(f"{p.describe()}: expected a float, got {type(a).__name__} {a!r}")
    try:
        return float(a)
    except OverflowError:
        raise ArgumentError(f"{p.describe()}: {a} is too large for a floating-point parameter") from None


def _scalar_arg(a, slot: Slot):
    p = slot.param
    np = sys.modules.get("numpy")
    if np is not None and isinstance(a, np.generic):
        a = a.item()
    if p.ctype in signature.HALF_TYPES | signature.BF16_TYPES:
        import numpy
        value = _float(a, p)
        if p.ctype in signature.HALF_TYPES:
            return numpy.float16(value).tobytes()
        import ml_dtypes
        return numpy.array(value, dtype=ml_dtypes.bfloat16).tobytes()
    if slot.code is None:                # a struct or unresolved template type: raw bytes of the compiled size
        if isinstance(a, ctypes.Structure):
            a = bytes(a)
        if not isinstance(a, (bytes, bytearray)):
            raise ArgumentError(f"{p.describe()}: pass a ctypes.Structure or bytes for this by-value parameter, "
                                f"got {type(a).__name__}")
        if len(a) != slot.size:
            raise ArgumentError(f"{p.describe()}: got {len(a)} bytes, the compiled kernel takes {slot.size}")
        return bytes(a)
    if slot.code in "fd":
        value = _float(a, p)
        if slot.code == "f" and abs(value) > _FLOAT32_MAX and abs(value) != float("inf"):
            raise ArgumentError(f"{p.describe()}: {a!r} is outside float's range (about ±3.4e38)")
        return value
    if slot.code == "?":
        if not isinstance(a, (bool, int)):
            raise ArgumentError(f"{p.describe()}: expected a bool, got {type(a).__name__}")
        return bool(a)
    if isinstance(a, bool) or not isinstance(a, int):
        raise ArgumentError(f"{p.describe()}: expected an int, got {type(a).__name__} {a!r}")
    lo, hi = INT_RANGES[slot.code]
    if not lo <= a <= hi:
        raise ArgumentError(f"{p.describe()}: {a} does not fit in {p.ctype} (range {lo}..{hi})")
    return a


# ----------------------------------------------------------------------------- helpers
@contextlib.contextmanager
def device_context(plat, dev):
    """dev's context for the launch; the caller's current context (torch's current device) is restored after."""
    pushed = plat.push_current(dev)
    try:
        yield
    finally:
        if pushed:
            plat.pop_current()


def _copy_back(plat, host, dev_ptr):
    import numpy as np
    if host.flags.c_contiguous:
        plat.memcpy_dtoh(host.ctypes.data, dev_ptr, host.nbytes)
    else:
        tmp = np.empty(host.shape, host.dtype)
        plat.memcpy_dtoh(tmp.ctypes.data, dev_ptr, tmp.nbytes)
        np.copyto(host, tmp)


def _torch_stream(dev: int) -> int:
    return sys.modules["torch"]._C._cuda_getCurrentRawStream(dev)


def _cupy_stream() -> int:
    cupy = sys.modules.get("cupy")
    return cupy.cuda.get_current_stream().ptr if cupy is not None else 0


def _capturing() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
