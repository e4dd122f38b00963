"""Shared plumbing for rocjit.ops: lazy torch, argument checks, FP8 formats, framework conversion, custom ops.

Every op computes on torch tensors; numpy and cupy inputs are converted at the boundary and the outputs
returned in the caller's framework. Nothing here imports torch until an op is called.
"""
from __future__ import annotations

import functools
import threading

# FP8 E4M3 formats: name -> (largest finite value, kernel tag type, torch dtype name, ml_dtypes name)
FP8_FORMATS = {
    "e4m3fn": (448.0, "rocjit::e4m3fn", "float8_e4m3fn", "float8_e4m3fn"),
    "e4m3fnuz": (240.0, "rocjit::e4m3fnuz", "float8_e4m3fnuz", "float8_e4m3fnuz"),
}
KERNEL_TYPES = {"float16": "__half", "bfloat16": "__hip_bfloat16"}


_torch_mod = None


def torch():
    """The torch module, imported on first use (``import rocjit`` never imports it)."""
    global _torch_mod
    if _torch_mod is None:
        import torch as mod
        _torch_mod = mod
    return _torch_mod


# ----------------------------------------------------------------------------- argument checks
def check_tensor(op: str, name: str, t, *, dtypes=None, dim=None, shape=None, device=None, contiguous=True):
    """Raise a TypeError / ValueError naming the op, the argument and what was expected."""
    tm = torch()
    if not isinstance(t, tm.Tensor):
        raise TypeError(f"{op}: {name} must be a tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        want = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{op}: {name} must have dtype {want}, got {str(t.dtype).replace('torch.', '')}")
    if dim is not None and t.dim() != dim:
        raise ValueError(f"{op}: {name} must be {dim}-D, got shape {tuple(t.shape)}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{op}: {name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{op}: {name} is on {t.device}, expected {device} (all inputs on one device)")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{op}: {name} must be contiguous (shape {tuple(t.shape)}, strides {t.stride()}); "
                         f"pass {name}.contiguous()")
    return t


QUANT_MODES = {None: 0, "static": 1, "per_token": 2}     # the fused kernels' QMODE template argument


def resolve_quant(op: str, scale, quant, device):
    """(scale, quant) of a fused op's FP8 arguments: a Python float scale becomes a one-element float32 tensor on
    `device`; a scale without `quant` means static quantization; contradictory or unknown choices raise."""
    tm = torch()
    if scale is not None and not isinstance(scale, tm.Tensor):
        scale = tm.tensor([float(scale)], dtype=tm.float32, device=device)
    if quant is None and scale is not None:
        quant = "static"
    if quant not in QUANT_MODES:
        raise ValueError(f"{op}: quant must be None, 'static' or 'per_token', got {quant!r}")
    if quant == "static" and scale is None:
        raise ValueError(f"{op}: quant='static' needs scale= (a float32 tensor of one element)")
    if quant == "per_token" and scale is not None:
        raise ValueError(f"{op}: quant='per_token' computes its own scales; do not pass scale=")
    return scale, quant


def custom_op_quant(op: str, scale, quant: str, fmt: str, device):
    """The kernels' quant (None, 'static', 'per_token') of a fused op's torch custom op arguments, whose quant is a
    string ('none' for None): raises where the public function would have refused the combination."""
    q = None if quant == "none" else quant
    if resolve_quant(op, scale, q, device)[1] != q or fmt not in FP8_FORMATS:
        raise ValueError(f"{op}: quant {quant!r} with scale {scale!r} / fp8 format {fmt!r} is not a valid combination")
    return q


def check_scale(op: str, scale, device) -> None:
    """A static FP8 scale: one float32 element on the op's device."""
    check_tensor(op, "scale", scale, dtypes=(torch().float32,), device=device)
    if scale.numel() != 1:
        raise ValueError(f"{op}: scale must hold one element, got shape {tuple(scale.shape)}")


def half_dtypes():
    tm = torch()
    return (tm.float16, tm.bfloat16)


def kernel_type(dtype) -> str:
    """The HIP type name of a torch dtype, for template name expressions."""
    return KERNEL_TYPES[str(dtype).replace("torch.", "")]


def aligned(*tensors, to: int = 16) -> bool:
    return all(t.data_ptr() % to == 0 for t in tensors)


def cbool(v: bool) -> str:
    return "true" if v else "false"


# ----------------------------------------------------------------------------- FP8 formats
_native: dict[int, str] = {}


def native_fp8(device_index: int = 0) -> str:
    """The device's own FP8 format: e4m3fnuz on gfx942 (MI300), e4m3fn on NVIDIA and gfx950."""
    fmt = _native.get(device_index)
    if fmt is None:
        from rocjit import platform
        plat = platform.get()
        gfx942 = plat.NAME == "hip" and plat.device_target(device_index).split(":")[0] in ("gfx940", "gfx941", "gfx942")
        fmt = _native[device_index] = "e4m3fnuz" if gfx942 else "e4m3fn"
    return fmt


def fp8_format(fmt, device) -> str:
    """Validate an explicit format or pick the device's native one."""
    if fmt is None:
        index = (device.index or 0) if device is not None else 0
        if compiling() and index not in _native:
            # traced code cannot query the driver: CUDA builds of torch mean NVIDIA (e4m3fn)
            return "e4m3fn" if torch().version.hip is None else native_fp8(index)
        return native_fp8(index)
    if fmt not in FP8_FORMATS:
        raise ValueError(f"fp8 format must be one of {sorted(FP8_FORMATS)}, got {fmt!r}")
    return fmt


def fp8_max(fmt: str) -> float:
    return FP8_FORMATS[fmt][0]


def fp8_tag(fmt: str) -> str:
    return FP8_FORMATS[fmt][1]


def fp8_torch_dtype(fmt: str):
    return getattr(torch(), FP8_FORMATS[fmt][2])


def fp8_numpy_dtype(fmt: str):
    import ml_dtypes
    return getattr(ml_dtypes, FP8_FORMATS[fmt][3])


def fp8_reference(x, fmt: str):
    """Reference quantizer: float values (any precision) -> fp8 codes as uint8, round-to-nearest-even,
    saturating to +-max (inf included), NaN kept. ml_dtypes rounds exactly; it maps overflow to NaN, so
    values are clamped first."""
    import numpy as np
    x = np.asarray(x, dtype=np.float64)
    m = fp8_max(fmt)
    clamped = np.where(np.isnan(x), x, np.clip(x, -m, m))
    return clamped.astype(fp8_numpy_dtype(fmt)).view(np.uint8)


def fp8_decode(codes, fmt: str):
    """fp8 codes (uint8) -> float64 values."""
    import numpy as np
    return np.asarray(codes, dtype=np.uint8).view(fp8_numpy_dtype(fmt)).astype(np.float64)


# ----------------------------------------------------------------------------- frameworks
def torch_or_none(a, name: str, op: str):
    """to_torch's tensor for an optional argument (None stays None)."""
    return None if a is None else to_torch(a, name, op)[0]


def to_torch(a, name: str, op: str):
    """(torch tensor on a GPU, framework name) for torch / cupy (zero-copy) / numpy (copied to the GPU)."""
    tm = torch()
    if isinstance(a, tm.Tensor):
        return a, "torch"
    mod = type(a).__module__.split(".")[0]
    if mod == "numpy":
        import numpy as np
        arr = np.ascontiguousarray(a)
        if arr.dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz"):
            t = tm.from_numpy(arr.view(np.uint16 if arr.dtype.itemsize == 2 else np.uint8))
            t = t.view(getattr(tm, arr.dtype.name))
        else:
            t = tm.from_numpy(arr)
        return t.cuda(), "numpy"
    if mod == "cupy" or hasattr(a, "__dlpack__"):
        return tm.from_dlpack(a), "cupy" if mod == "cupy" else "dlpack"
    raise TypeError(f"{op}: {name} must be a torch / cupy / numpy array, got {type(a).__name__}")


def from_torch(t, framework: str):
    """A result in the caller's framework."""
    if t is None or framework in ("torch", "dlpack"):
        return t
    if framework == "cupy":
        import cupy
        return cupy.from_dlpack(t)
    host = t.detach().cpu()
    name = str(host.dtype).replace("torch.", "")
    if name in ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz"):
        import ml_dtypes
        raw = host.view(torch().uint16 if host.element_size() == 2 else torch().uint8).numpy()
        return raw.view(getattr(ml_dtypes, name))
    return host.numpy()


def copy_back(dest, y, framework: str):
    """out= given as a numpy array gets the result copied in (cupy / DLPack outs were written in place)."""
    if framework == "numpy":
        import numpy as np
        np.copyto(dest, from_torch(y, "numpy"))
    return dest


def check_float(op: str, name: str, v) -> float:
    """A Python / numpy real number as a float, or a TypeError naming the argument."""
    import numbers
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{op}: {name} must be a float, got {type(v).__name__} {v!r}")
    return float(v)


def into_out(y, out):
    """A result computed by a torch.compile'd op, written into out= when one was given (the copy is traced)."""
    if out is None:
        return y
    out.copy_(y)
    return out


def to_caller(y, out, framework: str):
    """What the caller gets back: its own out= outside torch (a numpy out gets the values copied in), else y in the
    caller's framework."""
    return copy_back(out, y, framework) if out is not None and framework != "torch" else convert_outputs(y, framework)


def convert_outputs(result, framework: str):
    if framework == "torch":
        return result
    if isinstance(result, tuple):
        return tuple(from_torch(r, framework) for r in result)
    return from_torch(result, framework)


@functools.lru_cache(maxsize=None)
def device_info(device_index: int) -> dict:
    """sm / CU count, wave size and thread-block-cluster support (NVIDIA sm_90+) of a device, read once."""
    from rocjit import platform, targets
    plat = platform.get()
    attrs = plat.device_attributes(device_index)
    target = str(attrs.get("target") or "")
    sm = targets.nvidia_arch(target) if target.startswith("sm_") else 0
    return {"sms": int(attrs.get("sm_count") or attrs.get("cu_count") or 100), "wave": int(attrs.get("warp_size", 32)),
            "clusters": plat.NAME == "cuda" and sm >= 90}


@functools.lru_cache(maxsize=None)
def dummy_f32(device_index: int):
    """A 1-element float32 tensor passed for unused pointer parameters (keeps the launch on the fast path), made
    once per device beside any capture under way (persistent_zeros: no fill in a graph, no graph-pool memory)."""
    tm = torch()
    return persistent_zeros(1, tm.float32, tm.device("cuda", device_index))


@functools.lru_cache(maxsize=None)
def dummy_i64(device_index: int):
    """A 1-element int64 tensor for unused int64 pointer parameters, made as dummy_f32."""
    tm = torch()
    return persistent_zeros(1, tm.int64, tm.device("cuda", device_index))


def persistent_zeros(n: int, dtype, device):
    """Zeroed memory that lives as long as the process, made on a thread of its own and a side stream, and finished
    when this returns. Its own thread: allocations of the calling thread may be routed into a CUDA-graph pool
    (torch.compile's cudagraph trees do that), which must not keep memory of ours. A side stream in relaxed capture
    mode: while a stream is being captured (by this thread or another), the fill and the wait for it stay out of
    the graph. A fill captured into the graph instead would run on every replay (2 - 3 us of a decode step per
    launch that takes stream-K tickets), from memory of the graph's pool."""
    from rocjit.platform import cuda
    tm = torch()
    box = []

    def alloc():
        try:
            with cuda.relaxed_capture_mode():
                side = tm.cuda.Stream(device)
                with tm.cuda.stream(side):
                    t = tm.zeros(n, dtype=dtype, device=device)
                side.synchronize()
            box.append(t)
        except BaseException as e:       # passed on to the caller
            box.append(e)
    th = threading.Thread(target=alloc, name="rocjit-alloc")
    th.start()
    th.join()
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


# ----------------------------------------------------------------------------- torch custom ops
_registered: dict[str, object] = {}


def custom_op(name: str, build, *, mutates_args=(), flexible_layout: bool = False):
    """torch.ops.rocjit.<name>, registered on first use: `build()` returns (impl, fake), `impl` running the
    kernels and `fake` giving output metadata. Every later call, eager or while torch.compile traces, is this
    one dict lookup. flexible_layout: the op takes its tensors in any strides it checks (torch's
    Tag.flexible_layout), so inductor may hand it one buffer that several calls share (a mask or rotary table
    every layer reads) instead of a copy in eager strides for each call."""
    op = _registered.get(name)
    if op is None:
        impl, fake = build()
        tags = (torch().Tag.flexible_layout,) if flexible_layout else ()
        op = torch().library.custom_op(f"rocjit::{name}", mutates_args=tuple(mutates_args), tags=tags)(impl)
        op.register_fake(fake)
        _registered[name] = op
    return op


def compiling() -> bool:
    """True while torch.compile / dynamo traces (then ops dispatch through torch.ops.rocjit.*)."""
    return _torch_mod is not None and _torch_mod.compiler.is_compiling()


@functools.lru_cache(maxsize=None)
def module(filename: str, defines: tuple = ()):
    """The library's kernel source as a rocjit.Module (one per file and tuple of (name, value) defines)."""
    from rocjit.kernel import Module
    return Module(filename, defines=dict(defines))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


MAX_CLUSTER = 8  # blocks per cluster that every sm_90 GPU accepts without a non-portable opt-in


def split_config(chunks: int, rows: int, sms: int, wave: int) -> tuple[int, int, int] | None:
    """(blocks per row, threads per block, chunks per thread) to split each of a few long rows across a cluster,
    or None when one block per row is the better launch.

    Measured on an H100 (graph replays): one SM moves about 100 GB/s, so a 16K fp16 row (144 KB of traffic)
    costs ~1.4 µs on one SM, but the cluster launch and barrier cost about as much: at 1-8 rows of 16K the
    split ran within +-0.15 µs of one block per row, and slower for shorter or more rows."""
    if chunks < 2048 or rows > 8:
        return None
    split = MAX_CLUSTER
    per_slice = ceil_div(chunks, split)
    threads = min(1024, max(wave, next_pow2(per_slice)))
    return split, threads, ceil_div(per_slice, threads)


def tile_config(chunks: int, rows: int, sms: int, wave: int, *, target: int | None = None,
                per_thread: int = 1) -> tuple[int, int, int]:
    """(threads per block, chunks per thread, tiles per row) for element-wise rows of `chunks` chunks: a row
    is cut into the fewest tiles of at most `target` chunks, and the block is sized to the tile (whole waves),
    so little of the last tile idles. Small batches take smaller tiles, spreading a row over more SMs."""
    if target is None:
        target = 128 if rows < sms else 512
    tiles = ceil_div(chunks, target)
    threads = ceil_div(ceil_div(chunks, tiles * per_thread), wave) * wave
    return min(threads, 1024), per_thread, ceil_div(chunks, min(threads, 1024) * per_thread)


def row_config(chunks: int, rows: int, sms: int, wave: int, *, reduce: bool) -> tuple[int, int, int, int]:
    """(threads per row group, block, chunks per thread, tiles per row) for a row of `chunks` 8-element chunks.

    Rows that need a reduction stay whole in registers (tiles per row = 1): many threads per row when rows
    are few (latency), more chunks per thread when rows are many (fewer, fuller blocks). Element-wise work
    splits a row into tiles of at most 256 threads x 2 chunks. Small rows share a block."""
    if reduce:
        per_thread = 2 if rows < 2 * sms else 4
        threads = min(1024, next_pow2(ceil_div(chunks, per_thread)))
        per_thread = ceil_div(chunks, threads)
        if per_thread > 16:
            raise ValueError(f"rows of {chunks * 8} elements are too long to keep in registers (max {1024 * 16 * 8})")
        tiles = 1
    else:
        per_thread = 2 if chunks >= 512 and rows >= sms else 1
        threads = min(256 if rows >= sms else 128, next_pow2(ceil_div(chunks, per_thread)))
        tiles = ceil_div(chunks, threads * per_thread)
    block = threads if threads > wave else max(threads, 256)
    return threads, block, per_thread, tiles
