"""Arrays from any framework -> (pointer, dtype, shape, strides, device), and host staging for numpy.

Sources understood: torch tensors, objects with ``__cuda_array_interface__`` (CuPy, Numba, ...), objects with
``__dlpack__`` (JAX, ...), and numpy arrays (copied to the device and back: ``In`` / ``Out`` / ``InOut``).
"""
from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass

# ----------------------------------------------------------------------------- dtypes
_TYPESTR = {"f2": "float16", "f4": "float32", "f8": "float64", "i1": "int8", "i2": "int16", "i4": "int32",
            "i8": "int64", "u1": "uint8", "u2": "uint16", "u4": "uint32", "u8": "uint64", "b1": "bool"}
# DLPack (code, bits) -> dtype name (DLPack 1.1 numbering for the FP8 codes)
_DLPACK = {(0, 8): "int8", (0, 16): "int16", (0, 32): "int32", (0, 64): "int64", (1, 8): "uint8", (1, 16): "uint16",
           (1, 32): "uint32", (1, 64): "uint64", (2, 16): "float16", (2, 32): "float32", (2, 64): "float64",
           (4, 16): "bfloat16", (6, 8): "bool", (10, 8): "float8_e4m3fn", (11, 8): "float8_e4m3fnuz",
           (12, 8): "float8_e5m2", (13, 8): "float8_e5m2fnuz"}
_KDL_CPU, _KDL_CUDA, _KDL_CUDA_HOST, _KDL_ROCM, _KDL_ROCM_HOST, _KDL_CUDA_MANAGED = 1, 2, 3, 10, 11, 13
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "int16": 2, "int32": 4, "int64": 8,
            "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1, "float8_e4m3fn": 1, "float8_e4m3fnuz": 1,
            "float8_e5m2": 1, "float8_e5m2fnuz": 1}


def torch_dtype_name(dt) -> str:
    return str(dt).rsplit(".", 1)[-1]


# ----------------------------------------------------------------------------- staging wrappers
class _Staged:
    copy_in = copy_out = True

    def __init__(self, array):
        import numpy as np
        if not isinstance(array, np.ndarray):
            raise TypeError(f"{type(self).__name__}() wraps a numpy array, got {type(array).__name__}")
        self.array = array


class In(_Staged):
    """A numpy array copied to the device before the launch and not copied back."""
    copy_out = False


class Out(_Staged):
    """A numpy array the kernel writes: device buffer allocated, copied back after the launch, not copied in."""
    copy_in = False


class InOut(_Staged):
    """A numpy array copied in before and back after the launch (the default for writable numpy arrays)."""


# ----------------------------------------------------------------------------- descriptions
@dataclass
class ArrayInfo:
    ptr: int
    dtype: str
    shape: tuple
    strides: tuple | None      # in elements; None = C-contiguous
    device: int | None         # GPU ordinal, None = host memory
    framework: str             # "torch" | "cupy" | "cai" | "dlpack" | "numpy"
    keepalive: object = None   # a DLPack capsule that must outlive the launch

    @property
    def contiguous(self) -> bool:
        if self.strides is None:
            return True
        expect = 1
        for n, s in zip(reversed(self.shape), reversed(self.strides)):
            if n != 1 and s != expect:
                return False
            expect *= n
        return True


def _torch_info(t) -> ArrayInfo:
    dev = t.get_device()
    return ArrayInfo(t.data_ptr(), torch_dtype_name(t.dtype), tuple(t.shape), tuple(t.stride()),
                     dev if dev >= 0 else None, "torch")


def _cai_info(obj) -> ArrayInfo:
    cai = obj.__cuda_array_interface__
    ptr, _readonly = cai["data"]
    typestr = cai["typestr"]
    dtype = _TYPESTR.get(typestr[1:])
    if dtype is None:
        raise TypeError(f"__cuda_array_interface__ typestr {typestr!r} is not a supported element type")
    shape = tuple(cai["shape"])
    strides = cai.get("strides")
    if strides is not None:
        item = ITEMSIZE[dtype]
        strides = tuple(s // item for s in strides)
    from rocjit import platform
    dev = platform.get().pointer_device(ptr) if ptr else 0
    fw = "cupy" if type(obj).__module__.startswith("cupy") else "cai"
    return ArrayInfo(ptr or 0, dtype, shape, strides, dev if dev is not None else 0, fw)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_capsule_ptr = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_ptr.restype, _capsule_ptr.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


def _dlpack_info(obj) -> ArrayInfo:
    """Read a (legacy, unversioned) DLPack capsule; the capsule is kept alive until after the launch."""
    capsule = obj.__dlpack__()
    t = _DLTensor.from_address(_capsule_ptr(capsule, b"dltensor"))   # DLTensor is DLManagedTensor's first member
    dtype = _DLPACK.get((t.dtype.code, t.dtype.bits))
    if dtype is None or t.dtype.lanes != 1:
        raise TypeError(f"DLPack dtype (code={t.dtype.code}, bits={t.dtype.bits}, lanes={t.dtype.lanes}) is not supported")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else None
    kind = t.device.device_type
    dev = t.device.device_id if kind in (_KDL_CUDA, _KDL_ROCM, _KDL_CUDA_MANAGED) else None
    return ArrayInfo((t.data or 0) + t.byte_offset, dtype, shape, strides, dev, "dlpack", capsule)


def _numpy_info(a) -> ArrayInfo:
    name = a.dtype.name
    if name not in ITEMSIZE:
        raise TypeError(f"numpy dtype {a.dtype} is not supported")
    return ArrayInfo(a.ctypes.data, name, a.shape, tuple(s // a.itemsize for s in a.strides), None, "numpy")


def is_torch_tensor(obj) -> bool:
    t = sys.modules.get("torch")
    return t is not None and isinstance(obj, t.Tensor)


def describe(obj) -> ArrayInfo | None:
    """ArrayInfo for an array-like object, or None if `obj` is not an array."""
    if is_torch_tensor(obj):
        return _torch_info(obj)
    if hasattr(obj, "__cuda_array_interface__"):
        return _cai_info(obj)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        return _numpy_info(obj)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _dlpack_info(obj)
    return None


# ----------------------------------------------------------------------------- streams
def stream_handle(stream) -> int:
    """A raw stream handle from an int, a torch / cupy stream, or any object with __cuda_stream__."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "__cuda_stream__"):
        v = stream.__cuda_stream__()
        return int(v[1] if isinstance(v, tuple) else v)
    for attr in ("cuda_stream", "ptr", "handle"):       # torch, cupy, cuda.core
        h = getattr(stream, attr, None)
        if isinstance(h, int):
            return h
    raise TypeError(f"stream: expected an int handle, a torch / cupy stream or an object with __cuda_stream__, "
                    f"got {type(stream).__name__}")
