"""The hot path: a Python launcher generated per kernel signature (torch tensors + Python scalars, no loops), and
rocjit's native launcher (rocjit/launcher.c) in front of it where it could be built. Both pack arguments by the
kernel's ParamSpec and hand every case they do not take, untouched, to the general path."""
from __future__ import annotations

import ctypes
import functools
import struct
import sys
import threading

from rocjit import arrays, signature
from rocjit.launch import general
from rocjit.launch.params import ParamSpec


class _Missing:
    def __repr__(self):
        return "<missing argument>"


MISSING = _Missing()


def _given(named: tuple, rest: tuple) -> tuple:
    """The arguments a generated launcher was actually called with."""
    return tuple(a for a in named if a is not MISSING) + rest


class FastPath:
    """A kernel's generated launcher factory ``make(gx, gy, gz, bx, by, bz)`` and the per-device functions it
    launches; ``add_device`` makes a newly loaded device launchable by both launchers."""

    def __init__(self, make, fns: dict, wrap, native_spec, source: str):
        self.make, self.fns, self.wrap, self.native_spec, self.source = make, fns, wrap, native_spec, source

    def add_device(self, plat, dev: int, fn) -> None:
        self.fns[dev] = self.wrap(fn)
        if self.native_spec is not None:
            self.native_spec.set_function(dev, plat.function_handle(fn), plat.context_handle(dev))


def build(kernel, plat, spec: ParamSpec, target: str) -> FastPath | None:
    """The fast path of a loaded kernel, or None where the general path must do every launch: no torch, debug
    mode, no fast launch binding, a parameter it cannot pack, or no tensor parameter to tell the device. `target`:
    the spec's target (whether the native launcher sets the programmatic-launch attribute)."""
    torch = sys.modules.get("torch")
    if torch is None or general.debug() or not hasattr(torch._C, "_cuda_getCurrentRawStream"):
        return None
    try:
        binding = plat.fast_launch()
    except ImportError:
        return None
    fmt = spec.struct_format()              # None where the generated launcher cannot pack a parameter
    tensors = [f"a{i}" for i, s in enumerate(spec.slots) if s.pointer]
    if binding is None or fmt is None or not tensors:
        return None
    packer = struct.Struct(fmt)
    block = ctypes.create_string_buffer(max(1, spec.block_size))
    params = (ctypes.c_void_p * max(1, len(spec.slots)))(*[ctypes.addressof(block) + s.offset for s in spec.slots])
    fns = {dev: binding.wrap_function(fn) for dev, fn in kernel._fns.items()}
    multi = plat.device_count() > 1
    if not multi and 0 not in fns:
        return None
    env = {"Tensor": torch.Tensor, "get_ident": threading.get_ident, "owner": kernel._owner, "M": MISSING,
           "fns": fns, "fn": fns.get(0), "limits": kernel.shared_limit,
           "raw_stream": torch._C._cuda_getCurrentRawStream, "launch": binding.call, "OK": binding.success,
           "paddr": ctypes.addressof(params), "general": functools.partial(general.launch, kernel), "given": _given,
           "stream_handle": arrays.stream_handle, "pack": packer.pack_into, "block": block, "params": params,
           "pack_errors": (struct.error, OverflowError), "push": plat.push_current, "pop": plat.pop_current}
    source = _generate(spec, tensors, multi, binding.returns_tuple, env, torch)
    exec(compile(source, f"<rocjit launcher {kernel.name}>", "exec"), env)
    py_make = env["make"]
    native_spec = _native_spec(kernel, plat, spec, torch, kernel.programmatic_launch(target))
    if native_spec is None:
        make = py_make
    else:   # the native launcher takes the common case and hands the rest to the generated one
        from rocjit import native
        native_launcher = native.module().Launcher

        def make(g0, g1, g2, b0, b1, b2):
            return native_launcher(native_spec, (g0, g1, g2), (b0, b1, b2), py_make(g0, g1, g2, b0, b1, b2))
    return FastPath(make, fns, binding.wrap_function, native_spec, source)


def _generate(spec: ParamSpec, tensors, multi: bool, returns_tuple: bool, env: dict, torch) -> str:
    """Source of ``make``: one positional parameter per kernel argument, the configuration in closure cells, so
    that a launch is one Python call with no argument tuple to unpack."""
    conds, values, names, aligned = [], [], [], {}
    for i, s in enumerate(spec.slots):
        a, p = f"a{i}", s.param
        names.append(a)
        if s.pointer:
            conds.append(f"type({a}) is Tensor")
            if p.dtypes is not None:
                tds = tuple(getattr(torch, d) for d in p.dtypes if hasattr(torch, d))
                env[f"D{i}"] = tds[0] if len(tds) == 1 and len(p.dtypes) == 1 else tds
                conds.append(f"{a}.dtype is D{i}" if len(p.dtypes) == 1 else f"{a}.dtype in D{i}")
            if signature.POINTEE_ALIGN.get(p.ctype, 1) > 1:
                aligned.setdefault(signature.POINTEE_ALIGN[p.ctype], []).append(f"p{i}")
            values.append(f"p{i}")
            continue
        if s.code is None:                        # a by-value struct: bytes of its exact size
            conds.append(f"type({a}) is bytes and len({a}) == {s.size}")
        elif s.code in "fd":
            conds.append(f"(type({a}) is float or type({a}) is int)")
        elif s.code == "?":
            conds.append(f"type({a}) is bool")
        else:
            conds.append(f"type({a}) is int")     # its range: struct.pack_into checks it
        values.append(a)
    if multi:   # the tensors' device decides; its context is pushed around the launch
        device_ok = " and ".join(["(fn := fns.get(dev)) is not None"] +
                                 [f"{t}.get_device() == dev" for t in tensors[1:]])
        get_dev, dev = f"dev = {tensors[0]}.get_device()", "dev"
    else:       # one visible GPU: a GPU tensor is on device 0
        device_ok = " and ".join(f"{t}.is_cuda" for t in tensors)
        get_dev, dev = None, "0"
    contiguous = " and ".join(f"{t}.is_contiguous()" for t in tensors)
    # vector pointees (float4*, __half2*, ...) need more alignment than a tensor of their element type has
    misaligned = " | ".join(f"(({' | '.join(ps)}) & {a - 1})" for a, ps in sorted(aligned.items())) or "0"
    call = "launch(fn, g0, g1, g2, b0, b1, b2, shared_mem, st, paddr, 0)"
    call += "[0] is OK" if returns_tuple else " == OK"
    if multi:
        do_launch = ["pushed = push(dev)", f"done = {call}", "if pushed:", "    pop()", "if done:", "    return"]
    else:
        do_launch = [f"if {call}:", "    return"]
    sig = ", ".join(f"{n}=M" for n in names)
    fallback = f"general((g0, g1, g2), (b0, b1, b2), given(({', '.join(names)},), rest), shared_mem, stream)"
    lines = [
        f"if {' and '.join(conds)} and not rest and get_ident() == owner:",
        *([f"    {get_dev}"] if get_dev else []),
        f"    if {device_ok} and {contiguous} and type(shared_mem) is int "
        f"and (not shared_mem or 0 < shared_mem <= limits[{dev}]):",
        *[f"        p{i} = a{i}.data_ptr()" for i, s in enumerate(spec.slots) if s.pointer],
        f"        if not ({misaligned}):",
        f"            try:",
        f"                pack(block, 0, {', '.join(values)})",
        f"            except pack_errors:      # a scalar out of its C type's range: the general path says so",
        f"                return {fallback}",
        f"            if stream is None:",
        f"                st = raw_stream({dev})",
        f"            elif type(stream) is int:",
        f"                st = stream",
        f"            else:",
        f"                st = stream_handle(stream)",
        *[f"            {line}" for line in do_launch],
        f"return {fallback}",
    ]
    return (f"def make(g0, g1, g2, b0, b1, b2):\n"
            f"    def launch_kernel({sig}, *rest, shared_mem=0, stream=None):\n" +
            "".join(f"        {line}\n" for line in lines) +
            f"    return launch_kernel\n")


def _native_spec(kernel, plat, spec: ParamSpec, torch, pdl: bool):
    """The native launcher's description of this kernel, or None where it is unavailable: no C compiler, a
    framework without the DLPack C exchange API, a platform without a native launch here."""
    api = getattr(torch.Tensor, "__dlpack_c_exchange_api__", None)   # torch >= 2.10 publishes it
    hook = plat.native_launch(pdl=pdl)
    if hook is None or api is None:
        return None
    from rocjit import native
    mod = native.module()
    if mod is None:
        return None

    def dtype_code(name):
        dtype = getattr(torch, name, None)
        return None if dtype is None else native.torch_dtype_code(dtype)
    described = spec.native_params(dtype_code)
    if described is None:
        return None
    launch, get_ctx = hook
    try:
        native_spec = mod.Spec(described, spec.block_size, plat.DLPACK_DEVICE_TYPE, api,
                               (torch.Tensor, torch.nn.Parameter), kernel.shared_limit, launch, get_ctx)
    except ValueError:      # more parameters or a larger block than the launcher takes
        return None
    for dev, fn in kernel._fns.items():
        native_spec.set_function(dev, plat.function_handle(fn), plat.context_handle(dev))
    return native_spec
