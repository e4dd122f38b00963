"""Module / Kernel: compile on first use per device, pack arguments by the kernel's signature, launch.

Two launch paths share one contract. The fast path (generated per kernel, like a hand-written launcher) takes
contiguous torch tensors and Python scalars and goes straight to the vendor's launch call; anything else — numpy
staging, DLPack / CUDA-array-interface objects, explicit streams of other kinds, and every error — goes through
the general path, which checks each argument and names the parameter in its message.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import struct
import sys
import threading
import warnings

from rocjit import arrays, compiler, signature
from rocjit.errors import ArgumentError, LaunchError, RocjitError

_STATIC_SHARED_LIMIT = 48 * 1024
_INT_RANGES = {ctypes.c_int8: (-2**7, 2**7 - 1), ctypes.c_uint8: (0, 2**8 - 1), ctypes.c_int16: (-2**15, 2**15 - 1),
               ctypes.c_uint16: (0, 2**16 - 1), ctypes.c_int32: (-2**31, 2**31 - 1), ctypes.c_uint32: (0, 2**32 - 1),
               ctypes.c_int64: (-2**63, 2**63 - 1), ctypes.c_uint64: (0, 2**64 - 1)}


_STRUCT_CODES = {ctypes.c_int8: "b", ctypes.c_uint8: "B", ctypes.c_int16: "h", ctypes.c_uint16: "H",
                 ctypes.c_int32: "i", ctypes.c_uint32: "I", ctypes.c_int64: "q", ctypes.c_uint64: "Q",
                 ctypes.c_float: "f", ctypes.c_double: "d", ctypes.c_bool: "?"}


def _struct_offsets(fmt: str) -> list[int]:
    """Offset of each field of a native-aligned struct format (the kernel's parameter block layout)."""
    offs = []
    for i in range(1, len(fmt)):
        offs.append(struct.calcsize(fmt[:i + 1]) - struct.calcsize(fmt[i]))
    return offs


def _dim3(v, what):
    t = (v,) if isinstance(v, int) else tuple(v)
    if not 1 <= len(t) <= 3 or not all(isinstance(x, int) for x in t):
        raise ValueError(f"{what}: expected an int or a tuple of 1-3 ints, got {v!r}")
    if any(x < 1 for x in t):
        raise ValueError(f"{what}: every dimension must be >= 1, got {v!r}")
    return t + (1,) * (3 - len(t))


def _debug() -> bool:
    return os.environ.get("ROCJIT_DEBUG", "") not in ("", "0")


class Module:
    """A HIP source (string or file) whose kernels compile on first use; ``mod["name<args>"]`` gives a Kernel."""

    def __init__(self, source_or_path, *, defines=None, options=None, include_dirs=()):
        self.source, self.filename, self.source_dir = compiler.read_source(source_or_path)
        self.defines, self.options, self.include_dirs = dict(defines or {}), list(options or ()), tuple(include_dirs)
        self._kernels: dict[str, Kernel] = {}

    def __getitem__(self, name_expression: str) -> "Kernel":
        k = self._kernels.get(name_expression)
        if k is None:
            k = self._kernels[name_expression] = Kernel(self, name_expression)
        return k

    def compile(self, target: str, name_expressions=()):
        """Compile for a named target without a GPU (used by ``check`` and tests)."""
        return compiler.compile_text(self.source, target, filename=self.filename, source_dir=self.source_dir,
                                     defines=self.defines, options=self.options,
                                     name_expressions=name_expressions, include_dirs=self.include_dirs)

    def kernel_names(self):
        return [k for k, _, _ in signature.find_kernel(self.source, None)]


def kernel(source_or_path, name: str | None = None, *, defines=None, options=None, include_dirs=()) -> "Kernel":
    """One kernel from a source: `name` may be a template name expression; omitted, the source's only kernel."""
    mod = Module(source_or_path, defines=defines, options=options, include_dirs=include_dirs)
    if name is None:
        names = mod.kernel_names()
        if len(names) != 1:
            raise ValueError(f"the source defines {len(names)} __global__ kernels ({', '.join(names) or 'none'}); "
                             f"pass name=... to choose one")
        name = names[0]
    return mod[name]


class Kernel:
    def __init__(self, module: Module, name_expression: str):
        self.module, self.name = module, name_expression
        self.params = signature.parse(module.source, name_expression)
        if self.params is None:
            raise ValueError(f"no __global__ kernel named {name_expression.split('<')[0]!r} in {module.filename}")
        self._plat = None
        self._code = {}                 # target -> CodeObject
        self._fns: dict[int, int] = {}  # device -> function handle
        self._shared_limit: dict[int, int] = {}
        self._configured = {}
        self._fast = None
        self._native = None
        self._owner = threading.get_ident()

    # ------------------------------------------------------------------ compile / load
    def compile(self, target: str):
        co = self._code.get(target)
        if co is None:
            co = self._code[target] = self.module.compile(target, (self.name,))
        return co

    @property
    def code_object(self):
        """The code object for the current platform's device 0 target (compiled if needed)."""
        from rocjit import platform
        return self.compile(platform.get().device_target(self._default_device()))

    @property
    def mangled_name(self) -> str:
        return self.code_object.lowered.get(self.name, self.name)

    def _load(self, dev: int) -> int:
        from rocjit import platform
        plat = self._plat = self._plat or platform.get()
        co = self.compile(plat.device_target(dev))
        mangled = co.lowered.get(self.name, self.name)
        with _device_context(plat, dev):
            mod = _load_module(plat, co, dev, self)
            fn = plat.get_function(mod, mangled)
            self._check_layout(plat.param_layout(co.binary, mod, fn, mangled, count=len(self.params)))
        self._fns[dev] = fn
        self._shared_limit[dev] = _STATIC_SHARED_LIMIT
        if self._fast is None:
            self._build_fast_path()
        elif self._fast:
            self._fast_fns[dev] = self._wrap_fn(fn)
            if self._native is not None:
                self._native.set_function(dev, fn, plat.context_handle(dev))
        return fn

    def _check_layout(self, layout):
        self._layout = layout
        if layout is None:
            return
        if len(layout) != len(self.params):
            raise RocjitError(f"kernel {self.name}: the source declares {len(self.params)} parameters but the compiled "
                              f"kernel has {len(layout)}")
        for p, (_, size) in zip(self.params, layout):
            want = 8 if p.pointer else ctypes.sizeof(signature.SCALAR_CTYPES.get(p.ctype, ctypes.c_char * size))
            if want != size:
                raise RocjitError(f"kernel {self.name}: {p.describe()} is {size} bytes in the compiled kernel, "
                                  f"{want} by its declared type")

    def _slots(self):
        """ctypes storage for each parameter and the void* array the driver reads them through."""
        slots = []
        for i, p in enumerate(self.params):
            if p.pointer:
                slots.append(ctypes.c_void_p())
            else:
                ct = signature.SCALAR_CTYPES.get(p.ctype)
                if ct is None:
                    size = self._layout[i][1] if self._layout else 0
                    if not size:
                        raise RocjitError(f"kernel {self.name}: cannot tell the size of {p.describe()}")
                    ct = ctypes.c_char * size
                slots.append(ct())
        arr = (ctypes.c_void_p * max(1, len(slots)))(*[ctypes.addressof(s) for s in slots])
        return slots, arr

    # ------------------------------------------------------------------ launch syntax
    def __getitem__(self, cfg):
        try:
            return self._configured[cfg]
        except (KeyError, TypeError):   # TypeError: an unhashable grid such as a list
            pass
        if not (isinstance(cfg, tuple) and len(cfg) == 2):
            raise TypeError("launch with kernel[grid, block](*args): grid and block are ints or tuples")
        g, b = _dim3(cfg[0], "grid"), _dim3(cfg[1], "block")
        launcher = self._fast(*g, *b) if self._fast else _Configured(self, g, b)
        if len(self._configured) < 256:
            try:
                self._configured[cfg] = launcher
            except TypeError:
                pass
        return launcher

    def __call__(self, *args, grid, block, shared_mem: int = 0, stream=None):
        return self[grid, block](*args, shared_mem=shared_mem, stream=stream)

    # ------------------------------------------------------------------ general path
    def _launch_general(self, g, b, args, shared_mem, stream):
        from rocjit import platform
        plat = self._plat = self._plat or platform.get()
        if len(args) != len(self.params):
            names = ", ".join(p.name for p in self.params)
            raise ArgumentError(f"kernel {self.name} takes {len(self.params)} arguments ({names}), got {len(args)}")
        nthreads = b[0] * b[1] * b[2]
        if nthreads > 1024:
            raise ValueError(f"block {b}: {nthreads} threads per block, at most 1024 are allowed")
        values, devices, staged, keep, uses_torch, uses_cupy = [], set(), [], [], False, False
        for a, p in zip(args, self.params):
            if p.pointer:
                v, dev, st, info = _pointer_arg(a, p, plat)
                if st is not None:
                    staged.append((len(values), st, p))
                if dev is not None:
                    devices.add(dev)
                if info is not None:
                    keep.append(info.keepalive)
                    uses_torch |= info.framework == "torch"
                    uses_cupy |= info.framework == "cupy"
                values.append(v)
            else:
                values.append(_scalar_arg(a, p))
        if len(devices) > 1:
            raise ArgumentError(f"kernel {self.name}: arguments live on different devices {sorted(devices)}; "
                                f"move them to one device")
        dev = devices.pop() if devices else self._default_device()
        fn = self._fns.get(dev) or self._load(dev)
        with _device_context(plat, dev):
            self._launch_on(plat, fn, dev, g, b, values, staged, uses_torch, uses_cupy, shared_mem, stream)
        del keep

    def _launch_on(self, plat, fn, dev, g, b, values, staged, uses_torch, uses_cupy, shared_mem, stream):
        """The launch proper, with dev's context current."""
        if stream is None:
            stream = _torch_stream(dev) if uses_torch else _cupy_stream() if uses_cupy else 0
        else:
            stream = arrays.stream_handle(stream)
        shared_mem = int(shared_mem)
        if shared_mem < 0:
            raise ValueError(f"shared_mem must be >= 0, got {shared_mem}")
        self._raise_shared_limit(plat, fn, dev, shared_mem)
        if staged and _capturing():
            raise ArgumentError(f"kernel {self.name}: numpy arguments are copied to and from the device around the "
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
            slots, params = self._slots()
            for s, v in zip(slots, values):
                if isinstance(s, ctypes.Array):
                    ctypes.memmove(s, v, len(s))
                else:
                    s.value = v
            err = plat.launch(fn, g, b, shared_mem, stream, params)
            if err:
                raise LaunchError(f"launch of {self.name} (grid {g}, block {b}, shared_mem {shared_mem}) failed",
                                  plat.error_name(err))
            if staged or _debug():
                if not _capturing():
                    plat.check_last(dev)
            for (_, st, p), ptr in zip(staged, buffers):
                if st.copy_out and not p.const and st.array.nbytes:
                    _copy_back(plat, st.array, ptr)
        finally:
            for ptr in buffers:
                plat.free(ptr)

    def _raise_shared_limit(self, plat, fn, dev, shared_mem):
        if shared_mem > self._shared_limit.get(dev, _STATIC_SHARED_LIMIT):
            optin = plat.device_attributes(dev).get("max_shared_per_block_optin", _STATIC_SHARED_LIMIT)
            if shared_mem > optin:
                raise ValueError(f"shared_mem={shared_mem} bytes exceeds the device's limit of {optin} bytes per block")
            plat.set_max_dynamic_shared(fn, shared_mem)
            self._shared_limit[dev] = shared_mem

    def _default_device(self) -> int:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            return torch.cuda.current_device()
        return 0

    # ------------------------------------------------------------------ fast path
    def _build_fast_path(self):
        """Generate launchers specialised to this signature (torch tensors + Python scalars, no loops).

        The generated ``make(gx, gy, gz, bx, by, bz)`` returns one launcher per launch configuration, with the
        configuration in closure cells and one positional parameter per kernel argument: ``kernel[grid, block]``
        hands it out from a dict, so a launch is one Python call with no argument tuple to unpack."""
        torch = sys.modules.get("torch")
        plat = self._plat
        fast = getattr(plat, "fast_launch", None)
        if torch is None or _debug() or fast is None or not hasattr(torch._C, "_cuda_getCurrentRawStream"):
            self._fast = False
            return
        try:
            launch, wrap_fn, ok = fast()
        except ImportError:
            self._fast = False
            return
        fmt, values, conds, names = self._fast_block_format()
        tensors = [f"a{i}" for i, p in enumerate(self.params) if p.pointer]
        if fmt is None or not tensors:     # no tensor tells the device: the general path picks it
            self._fast = False
            return
        packer = struct.Struct(fmt)
        block = ctypes.create_string_buffer(max(1, packer.size))
        offsets = _struct_offsets(fmt)
        params = (ctypes.c_void_p * max(1, len(offsets)))(*[ctypes.addressof(block) + o for o in offsets])
        self._fast_block, self._fast_params = block, params     # keep the memory alive
        wrapped = {dev: wrap_fn(fn) for dev, fn in self._fns.items()}
        self._fast_fns, self._wrap_fn = wrapped, wrap_fn
        multi = plat.device_count() > 1
        if not multi and 0 not in wrapped:
            self._fast = False
            return
        env = {"Tensor": torch.Tensor, "get_ident": threading.get_ident, "owner": self._owner, "M": _MISSING,
               "fns": wrapped, "fn": wrapped.get(0), "limits": self._shared_limit,
               "raw_stream": torch._C._cuda_getCurrentRawStream, "launch": launch, "OK": ok,
               "paddr": ctypes.addressof(params), "general": self._launch_general, "given": _given,
               "stream_handle": arrays.stream_handle, "pack": packer.pack_into, "block": block,
               "pack_errors": (struct.error, OverflowError),
               "push": getattr(plat, "push_current", None), "pop": getattr(plat, "pop_current", None)}
        aligned = {}
        for i, p in enumerate(self.params):
            if p.pointer and p.dtypes is not None:
                tds = tuple(getattr(torch, d) for d in p.dtypes if hasattr(torch, d))
                env[f"D{i}"] = tds[0] if len(tds) == 1 and len(p.dtypes) == 1 else tds
            if p.pointer and signature.POINTEE_ALIGN.get(p.ctype, 1) > 1:
                aligned.setdefault(signature.POINTEE_ALIGN[p.ctype], []).append(f"p{i}")
        if multi:   # the tensors' device decides; its context is pushed around the launch
            device_ok = " and ".join(["(fn := fns.get(dev)) is not None"] +
                                     [f"{t}.get_device() == dev" for t in tensors[1:]])
            get_dev, dev = f"dev = {tensors[0]}.get_device()", "dev"
        else:       # one visible GPU: a CUDA tensor is on device 0
            device_ok = " and ".join(f"{t}.is_cuda" for t in tensors)
            get_dev, dev = None, "0"
        contiguous = " and ".join(f"{t}.is_contiguous()" for t in tensors)
        # vector pointees (float4*, __half2*, ...) need more alignment than a tensor of their element type has
        misaligned = " | ".join(f"(({' | '.join(ps)}) & {a - 1})" for a, ps in sorted(aligned.items())) or "0"
        call = f"launch(fn, g0, g1, g2, b0, b1, b2, shared_mem, st, paddr, 0)[0] is OK"
        if multi:
            do_launch = ["pushed = push(dev)", f"done = {call}", "if pushed:", "    pop()", "if done:", "    return"]
        else:
            do_launch = [f"if {call}:", "    return"]
        sig = ", ".join(f"{n}=M" for n in names)
        lines = [
            f"if {' and '.join(conds)} and not rest and get_ident() == owner:",
            *([f"    {get_dev}"] if get_dev else []),
            f"    if {device_ok} and {contiguous} and type(shared_mem) is int "
            f"and (not shared_mem or 0 < shared_mem <= limits[{dev}]):",
            *[f"        p{i} = a{i}.data_ptr()" for i, p in enumerate(self.params) if p.pointer],
            f"        if not ({misaligned}):",
            f"            try:",
            f"                pack(block, 0, {', '.join(values)})",
            f"            except pack_errors:      # a scalar out of its C type's range: the general path says so",
            f"                return general((g0, g1, g2), (b0, b1, b2), given(({', '.join(names)},), rest), "
            f"shared_mem, stream)",
            f"            if stream is None:",
            f"                st = raw_stream({dev})",
            f"            elif type(stream) is int:",
            f"                st = stream",
            f"            else:",
            f"                st = stream_handle(stream)",
            *[f"            {line}" for line in do_launch],
            f"return general((g0, g1, g2), (b0, b1, b2), given(({', '.join(names)},), rest), shared_mem, stream)",
        ]
        src = (f"def make(g0, g1, g2, b0, b1, b2):\n"
               f"    def launch_kernel({sig}, *rest, shared_mem=0, stream=None):\n" +
               "".join(f"        {line}\n" for line in lines) +
               f"    return launch_kernel\n")
        self._fast_source = src
        exec(compile(src, f"<rocjit launcher {self.name}>", "exec"), env)
        py_make = env["make"]
        self._native = spec = self._native_spec(torch, plat, fmt)
        if spec is None:
            self._fast = py_make
        else:   # the native launcher takes the common case and hands the rest to the generated one
            from rocjit import native
            native_launcher = native.module().Launcher

            def make(g0, g1, g2, b0, b1, b2):
                return native_launcher(spec, (g0, g1, g2), (b0, b1, b2), py_make(g0, g1, g2, b0, b1, b2))
            self._fast = make
        self._configured.clear()   # later kernel[grid, block] lookups hand out generated launchers

    def _native_spec(self, torch, plat, fmt):
        """The native launcher's description of this kernel (rocjit/launcher.c), or None where it is unavailable:
        no C compiler, a framework without the DLPack C exchange API, a platform without the hook."""
        hook = getattr(plat, "native_launch", None)
        api = getattr(torch.Tensor, "__dlpack_c_exchange_api__", None)
        if hook is None or api is None:
            return None
        from rocjit import native
        mod = native.module()
        if mod is None:
            return None
        offsets, params = _struct_offsets(fmt), []
        for i, p in enumerate(self.params):
            if not p.pointer:
                params.append((fmt[i + 1], offsets[i], 1, ()))
                continue
            dtypes = () if p.dtypes is None else tuple(
                native.torch_dtype_code(getattr(torch, d)) for d in p.dtypes if hasattr(torch, d))
            if p.dtypes is not None and not dtypes:
                return None
            params.append(("P", offsets[i], signature.POINTEE_ALIGN.get(p.ctype, 1), dtypes))
        launch, get_ctx, device_type = hook()
        try:
            spec = mod.Spec(params, struct.calcsize(fmt), device_type, api, (torch.Tensor, torch.nn.Parameter),
                            self._shared_limit, launch, get_ctx)
        except ValueError:      # more parameters or a larger block than the launcher takes
            return None
        for dev, fn in self._fns.items():
            spec.set_function(dev, fn, plat.context_handle(dev))
        return spec

    def _fast_block_format(self):
        """struct format of the parameter block, the value expression and guard of each parameter, arg names."""
        fmt, values, conds, names = "@", [], [], []
        for i, p in enumerate(self.params):
            a = f"a{i}"
            names.append(a)
            if p.pointer:
                conds.append(f"type({a}) is Tensor")
                if p.dtypes is not None:
                    conds.append(f"{a}.dtype is D{i}" if len(p.dtypes) == 1 else f"{a}.dtype in D{i}")
                fmt += "P"
                values.append(f"p{i}")
                continue
            ct = signature.SCALAR_CTYPES.get(p.ctype)
            code = _STRUCT_CODES.get(ct)
            if code is None or p.ctype in signature.HALF_TYPES | signature.BF16_TYPES:
                return None, None, None, None       # by-value structs and 16-bit floats: general path
            if code in "fd":
                conds.append(f"(type({a}) is float or type({a}) is int)")
            elif code == "?":
                conds.append(f"type({a}) is bool")
            else:
                conds.append(f"type({a}) is int")     # its range: struct.pack_into checks it
            fmt += code
            values.append(a)
        return fmt, values, conds, names

    def __repr__(self):
        return f"<rocjit.Kernel {self.name} from {self.module.filename}>"


class _Configured:
    """kernel[grid, block] before the kernel is loaded (or without a generated launcher): calling it launches."""
    __slots__ = ("kernel", "grid", "block", "fast")

    def __init__(self, kernel, grid, block):
        self.kernel, self.grid, self.block, self.fast = kernel, grid, block, None

    def __call__(self, *args, shared_mem=0, stream=None):
        if self.fast is None and self.kernel._fast:
            self.fast = self.kernel._fast(*self.grid, *self.block)
        if self.fast:
            return self.fast(*args, shared_mem=shared_mem, stream=stream)
        return self.kernel._launch_general(self.grid, self.block, args, shared_mem, stream)


class _Missing:
    def __repr__(self):
        return "<missing argument>"


_MISSING = _Missing()


def _given(named: tuple, rest: tuple) -> tuple:
    """The arguments a generated launcher was actually called with."""
    return tuple(a for a in named if a is not _MISSING) + rest


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


def _scalar_arg(a, p: signature.Param):
    np = sys.modules.get("numpy")
    if np is not None and isinstance(a, np.generic):
        a = a.item()
    ct = signature.SCALAR_CTYPES.get(p.ctype)
    if ct is None:                       # a struct or unresolved template type: raw bytes of the right size
        if isinstance(a, (bytes, bytearray)):
            return bytes(a)
        if isinstance(a, ctypes.Structure):
            return bytes(a)
        raise ArgumentError(f"{p.describe()}: pass a ctypes.Structure or bytes for this by-value parameter, "
                            f"got {type(a).__name__}")
    if p.ctype in signature.HALF_TYPES | signature.BF16_TYPES:
        if not isinstance(a, (int, float)) or isinstance(a, bool):
            raise ArgumentError(f"{p.describe()}: expected a float, got {type(a).__name__}")
        import numpy
        if p.ctype in signature.HALF_TYPES:
            return int(numpy.float16(a).view(numpy.uint16))
        import ml_dtypes
        return int(numpy.array(a, dtype=ml_dtypes.bfloat16).view(numpy.uint16))
    if ct in (ctypes.c_float, ctypes.c_double):
        if not isinstance(a, (int, float)) or isinstance(a, bool):
            raise ArgumentError(f"{p.describe()}: expected a float, got {type(a).__name__} {a!r}")
        return float(a)
    if ct is ctypes.c_bool:
        if not isinstance(a, (bool, int)):
            raise ArgumentError(f"{p.describe()}: expected a bool, got {type(a).__name__}")
        return bool(a)
    if isinstance(a, bool) or not isinstance(a, int):
        raise ArgumentError(f"{p.describe()}: expected an int, got {type(a).__name__} {a!r}")
    lo, hi = _INT_RANGES[ct]
    if not lo <= a <= hi:
        raise ArgumentError(f"{p.describe()}: {a} does not fit in {p.ctype} (range {lo}..{hi})")
    return a


# ----------------------------------------------------------------------------- helpers
@contextlib.contextmanager
def _device_context(plat, dev):
    """dev's context for the launch; the caller's current context (torch's current device) is restored after."""
    push = getattr(plat, "push_current", None)
    if push is None:
        plat.set_current(dev)
        yield
        return
    pushed = push(dev)
    try:
        yield
    finally:
        if pushed:
            plat.pop_current()


_modules: dict[tuple[str, int], int] = {}
_modules_lock = threading.Lock()


def _load_module(plat, co, dev, kernel):
    """Loaded modules are cached per (code object, device)."""
    key = (co.key, dev)
    with _modules_lock:
        mod = _modules.get(key)
        if mod is None:
            mod = _modules[key] = _load_with_fallback(plat, co, dev, kernel)
    return mod


_DRIVER_TOO_OLD = {"CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "CUDA_ERROR_NO_BINARY_FOR_GPU", "CUDA_ERROR_INVALID_IMAGE",
                   "CUDA_ERROR_INVALID_PTX", "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY"}


def _load_with_fallback(plat, co, dev, kernel):
    """Load the cubin; if the driver rejects code from a newer NVRTC, retry with PTX lowered to the driver's ISA."""
    try:
        return plat.load_module(co.binary, dev)
    except LaunchError as e:
        if plat.NAME != "cuda" or e.error_name not in _DRIVER_TOO_OLD:
            raise
        drv = plat.driver_version()
        warnings.warn(f"rocjit: the driver (CUDA {drv[0]}.{drv[1]}) rejected code built by {plat.compiler_version()} "
                      f"({e.error_name}); retrying with PTX for the driver's version", RuntimeWarning, stacklevel=4)
        ptx_target = "compute_" + co.target[3:]
        ptx = kernel.compile(ptx_target)
        text = _lower_ptx_version(ptx.binary.decode(), drv)
        try:
            return plat.load_module(text.encode() + b"\0", dev)
        except LaunchError as e2:
            raise LaunchError(f"the driver (CUDA {drv[0]}.{drv[1]}) cannot load code from {plat.compiler_version()}, "
                              f"even as PTX; install an nvidia-cuda-nvrtc wheel no newer than the driver "
                              f"(pip install 'nvidia-cuda-nvrtc<={drv[0]}.{drv[1]}') or update the driver",
                              e2.error_name) from None


# CUDA release -> the PTX ISA version its driver JIT accepts
_PTX_ISA = {(12, 0): "8.0", (12, 1): "8.1", (12, 2): "8.2", (12, 3): "8.3", (12, 4): "8.4", (12, 5): "8.5",
            (12, 6): "8.5", (12, 8): "8.7", (12, 9): "8.8", (13, 0): "9.0", (13, 1): "9.1", (13, 2): "9.2"}


def _lower_ptx_version(ptx: str, drv) -> str:
    import re
    isa = _PTX_ISA.get(tuple(drv))
    return re.sub(r"^\.version\s+\d+\.\d+", f".version {isa}", ptx, count=1, flags=re.M) if isa else ptx


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
